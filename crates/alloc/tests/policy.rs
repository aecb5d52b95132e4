//! Every provisioning decision in virtual time: the allocator is fed demand, batch-system
//! answers and worker arrivals, and what it asks for is checked.

use kestrel_alloc::*;

const S: Micros = 1_000_000;

fn params(acquire: Acquire, nodes: u32) -> QueueParams {
    QueueParams {
        nodes,
        acquire,
        backlog: 8,
        ..QueueParams::new(3600 * S, 4)
    }
}

/// `tasks` one-slot tasks waiting, no free slot.
fn waiting(tasks: u64) -> Demand {
    Demand {
        queued_tasks: tasks,
        queued_slots: tasks,
        ..Demand::default()
    }
}

fn submits(actions: &[Action]) -> Vec<(AllocId, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Submit { alloc, nodes, .. } => Some((*alloc, *nodes)),
            _ => None,
        })
        .collect()
}

#[test]
fn request_sizes_follow_the_acquisition_policy_and_never_exceed_the_need() {
    let sizes = |a: Acquire, need: u64| (0..5).map(|i| a.nodes(i, need)).collect::<Vec<_>>();
    assert_eq!(sizes(Acquire::One, 100), vec![1, 1, 1, 1, 1]);
    assert_eq!(sizes(Acquire::Additive, 100), vec![1, 2, 3, 4, 5]);
    assert_eq!(sizes(Acquire::Exponential, 100), vec![1, 2, 4, 8, 16]);
    assert_eq!(sizes(Acquire::All, 100), vec![100; 5]);
    assert_eq!(sizes(Acquire::Exponential, 3), vec![1, 2, 3, 3, 3]);
    assert_eq!(Acquire::parse("additive"), Some(Acquire::Additive));
    assert_eq!(Acquire::parse("some"), None);
}

#[test]
fn one_submission_a_tick_sized_by_the_policy_and_capped_by_nodes() {
    let mut al = Allocator::new();
    let q = al.add_queue(params(Acquire::Exponential, 3)).unwrap();
    // 40 slots of work: 10 nodes of 4 slots.
    let mut sizes = Vec::new();
    for t in 0..6 {
        let acts = al.tick(t * S, |_| waiting(40));
        let s = submits(&acts);
        assert!(s.len() <= 1, "one submission a tick: {acts:?}");
        for (alloc, nodes) in s {
            al.queue_mut(q)
                .unwrap()
                .submitted(alloc, format!("b{alloc}"));
            sizes.push(nodes);
        }
    }
    // 1, 2, then the 4 the policy wants is capped at 3 nodes; 1 + 2 + 3 + 3 = 9, then 1.
    assert_eq!(sizes, vec![1, 2, 3, 3, 1]);
    let pending: u32 = al.queue(q).unwrap().live().map(|a| a.nodes).sum();
    assert_eq!(pending, 10, "exactly the nodes the work needs");
}

#[test]
fn a_queue_grows_from_zero_to_four_nodes_under_a_backlog_and_waits_for_its_allocations() {
    let mut al = Allocator::new();
    let p = QueueParams {
        acquire: Acquire::One,
        backlog: 1,
        max_workers: Some(4),
        ..params(Acquire::One, 1)
    };
    let q = al.add_queue(p).unwrap();
    let mut workers = 0;
    for t in 0..20 {
        let now = t * S;
        let free = 0;
        let acts = al.tick(now, |_| Demand {
            queued_tasks: 1000,
            queued_slots: 1000,
            free_slots: free,
            idle: vec![],
            covered_elsewhere: 0,
        });
        let queue = al.queue_mut(q).unwrap();
        let pending = queue.live().filter(|a| a.state.is_pending()).count();
        assert!(pending <= 1, "backlog 1: {pending} pending at tick {t}");
        for (alloc, _) in submits(&acts) {
            queue.submitted(alloc, format!("b{alloc}"));
        }
        // Each allocation starts two ticks after it was submitted, with its worker.
        let starting: Vec<AllocId> = queue
            .live()
            .filter(|a| a.state == AllocState::Queued && now >= a.submitted_us + 2 * S)
            .map(|a| a.id)
            .collect();
        for alloc in starting {
            workers += 1;
            queue.worker_joined(now, alloc, workers);
        }
    }
    let queue = al.queue(q).unwrap();
    assert_eq!(queue.live().count(), 4, "max_workers 4");
    assert!(queue.live().all(|a| a.state == AllocState::Running));
}

#[test]
fn free_slots_of_running_workers_are_counted_before_asking() {
    let mut al = Allocator::new();
    al.add_queue(params(Acquire::All, 4)).unwrap();
    let acts = al.tick(0, |_| Demand {
        queued_tasks: 8,
        queued_slots: 8,
        free_slots: 8,
        idle: vec![],
        covered_elsewhere: 0,
    });
    assert!(acts.is_empty(), "{acts:?}");
    let acts = al.tick(S, |_| Demand {
        queued_tasks: 9,
        queued_slots: 9,
        free_slots: 8,
        idle: vec![],
        covered_elsewhere: 0,
    });
    assert_eq!(submits(&acts), vec![(1, 1)], "one slot short: one node");
}

/// A queue with one running allocation of `nodes` nodes whose workers are 1..=nodes.
fn running(nodes: u32, p: QueueParams) -> (Allocator, QueueId, AllocId) {
    let mut al = Allocator::new();
    let q = al.add_queue(QueueParams { nodes, ..p }).unwrap();
    let acts = al.tick(0, |_| waiting(u64::from(nodes) * 4));
    let [(alloc, n)] = submits(&acts)[..] else {
        panic!("{acts:?}");
    };
    assert_eq!(n, nodes);
    let queue = al.queue_mut(q).unwrap();
    queue.submitted(alloc, "b1".into());
    for w in 1..=nodes {
        assert!(queue.worker_joined(S, alloc, w));
    }
    (al, q, alloc)
}

#[test]
fn an_allocation_is_released_whole_once_all_its_workers_have_idled_long_enough() {
    let p = QueueParams {
        idle_timeout_us: Some(60 * S),
        ..params(Acquire::All, 2)
    };
    let (mut al, q, alloc) = running(2, p);
    // Worker 1 idle for long, worker 2 still busy: nothing leaves.
    let one_idle = Demand {
        idle: vec![(1, 10 * S)],
        ..Demand::default()
    };
    assert!(al.tick(100 * S, |_| one_idle.clone()).is_empty());
    // Both idle, but worker 2 only for 59 s.
    let both = |since2| Demand {
        idle: vec![(1, 10 * S), (2, since2)],
        ..Demand::default()
    };
    assert!(al.tick(110 * S, |_| both(51 * S)).is_empty());
    let acts = al.tick(111 * S, |_| both(51 * S));
    assert_eq!(
        acts,
        vec![Action::Drain {
            queue: q,
            alloc,
            workers: vec![1, 2]
        }]
    );
    // Not again while they leave; canceled once both have left.
    let queue = al.queue_mut(q).unwrap();
    queue.worker_left(alloc, 1);
    assert!(al.tick(112 * S, |_| both(51 * S)).is_empty());
    al.queue_mut(q).unwrap().worker_left(alloc, 2);
    let acts = al.tick(113 * S, |_| Demand::default());
    assert_eq!(acts, vec![Action::Cancel { queue: q, alloc }]);
    let queue = al.queue_mut(q).unwrap();
    queue.ended(114 * S, alloc, None);
    assert_eq!(
        queue.allocations[&alloc].state,
        AllocState::Ended(Ending::Finished)
    );
    assert_eq!(queue.live().count(), 0);
}

#[test]
fn a_released_allocation_whose_workers_left_does_not_hold_back_the_next_one() {
    let p = QueueParams {
        idle_timeout_us: Some(10 * S),
        max_workers: Some(2),
        ..params(Acquire::All, 2)
    };
    let (mut al, q, alloc) = running(2, p);
    let idle = Demand {
        idle: vec![(1, S), (2, S)],
        ..Demand::default()
    };
    assert!(matches!(
        al.tick(20 * S, |_| idle.clone())[..],
        [Action::Drain { .. }]
    ));
    let queue = al.queue_mut(q).unwrap();
    queue.worker_left(alloc, 1);
    queue.worker_left(alloc, 2);
    assert_eq!(
        al.tick(21 * S, |_| Demand::default()),
        vec![Action::Cancel { queue: q, alloc }]
    );
    // Work comes back before the batch system has said that the allocation ended: its nodes
    // are free (its pilot exits with its workers), so a new one is asked for at once.
    let acts = al.tick(22 * S, |_| waiting(8));
    assert_eq!(submits(&acts), vec![(alloc + 1, 2)], "{acts:?}");
}

#[test]
fn workers_slow_to_start_are_waited_for_and_an_allocation_none_of_whose_came_fails() {
    let mut al = Allocator::new();
    let q = al.add_queue(params(Acquire::All, 2)).unwrap();
    let acts = al.tick(0, |_| waiting(8));
    assert_eq!(submits(&acts), vec![(1, 2)]);
    let queue = al.queue_mut(q).unwrap();
    queue.submitted(1, "b1".into());
    // The batch system says it runs; one of its two workers connects, the other is slow.
    queue.started(10 * S, 1);
    assert!(queue.worker_joined(12 * S, 1, 1));
    // The connected worker's 4 slots take half the work; the other half waits for the slow
    // worker's node, which is coming: nothing more is asked.
    let half = Demand {
        free_slots: 4,
        ..waiting(8)
    };
    for t in 13..60 {
        assert!(
            submits(&al.tick(t * S, |_| half.clone())).is_empty(),
            "tick {t}"
        );
    }
    // Past the start limit it no longer counts, and a node is asked for.
    let late = 10 * S + WORKER_START_LIMIT_US;
    assert_eq!(submits(&al.tick(late, |_| half.clone())), vec![(2, 1)]);
    // An allocation that runs and none of whose workers ever connects is canceled, failed.
    let queue = al.queue_mut(q).unwrap();
    queue.submitted(2, "b2".into());
    queue.started(late + S, 2);
    let mut t = late + 2 * S;
    while t < late + S + WORKER_START_LIMIT_US {
        let acts = al.tick(t, |_| waiting(8));
        assert!(
            !acts.contains(&Action::Cancel { queue: q, alloc: 2 }),
            "{acts:?}"
        );
        t += 10 * S;
    }
    let acts = al.tick(late + S + WORKER_START_LIMIT_US, |_| waiting(8));
    assert!(
        acts.contains(&Action::Cancel { queue: q, alloc: 2 }),
        "{acts:?}"
    );
    let queue = al.queue_mut(q).unwrap();
    let err = queue.last_error.clone().unwrap_or_default();
    assert!(err.contains("none of its workers connected"), "{err}");
    assert!(err.contains("kestrel alloc log 1 2"), "{err}");
    queue.ended(late + 400 * S, 2, None);
    assert!(
        matches!(&queue.allocations[&2].state, AllocState::Ended(Ending::Failed(w)) if w.contains("none of its workers")),
        "{:?}",
        queue.allocations[&2].state
    );
}

#[test]
fn without_an_idle_timeout_idle_workers_stay() {
    let p = QueueParams {
        idle_timeout_us: None,
        ..params(Acquire::All, 1)
    };
    let (mut al, _, _) = running(1, p);
    let idle = Demand {
        idle: vec![(1, 0)],
        ..Demand::default()
    };
    assert!(al.tick(100_000 * S, |_| idle.clone()).is_empty());
}

#[test]
fn allocations_still_queued_are_canceled_when_the_work_has_been_gone_a_moment() {
    let mut al = Allocator::new();
    let q = al.add_queue(params(Acquire::One, 1)).unwrap();
    let acts = al.tick(0, |_| waiting(4));
    let [(a1, _)] = submits(&acts)[..] else {
        panic!("{acts:?}")
    };
    al.queue_mut(q).unwrap().submitted(a1, "b1".into());
    // The work goes; a moment later it is back: nothing canceled.
    assert!(al.tick(S, |_| Demand::default()).is_empty());
    assert!(al.tick(2 * S, |_| waiting(4)).is_empty());
    // Gone for good.
    assert!(al.tick(3 * S, |_| Demand::default()).is_empty());
    let acts = al.tick(3 * S + WORK_GONE_GRACE_US, |_| Demand::default());
    assert_eq!(
        acts,
        vec![Action::Cancel {
            queue: q,
            alloc: a1
        }]
    );
    let queue = al.queue_mut(q).unwrap();
    queue.ended(10 * S, a1, None);
    assert_eq!(
        queue.allocations[&a1].state,
        AllocState::Ended(Ending::Canceled)
    );
    assert!(
        queue.paused.is_none(),
        "a canceled allocation is no failure"
    );
}

#[test]
fn failed_submissions_back_off_and_then_pause_the_queue_with_the_reason() {
    let mut al = Allocator::new();
    let q = al.add_queue(params(Acquire::One, 1)).unwrap();
    let mut now = 0;
    let mut tries = Vec::new();
    while now < 200 * S {
        for (alloc, _) in submits(&al.tick(now, |_| waiting(4))) {
            tries.push(now / S);
            let err = "sbatch: error: invalid partition specified: gpu".to_string();
            al.queue_mut(q).unwrap().submit_failed(now, alloc, err);
        }
        now += S;
    }
    // At 0, after 5 s, after 10 s more; then paused: no flood.
    assert_eq!(tries, vec![0, 5, 15]);
    let queue = al.queue(q).unwrap();
    let Some(Paused::Failing(why)) = &queue.paused else {
        panic!("not paused: {:?}", queue.paused);
    };
    assert!(
        why.contains("3 failures in a row") && why.contains("invalid partition"),
        "{why}"
    );
    assert!(why.contains("kestrel alloc resume 1"), "{why}");
    // Resumed, it tries again at once.
    al.queue_mut(q).unwrap().resume();
    assert_eq!(submits(&al.tick(now, |_| waiting(4))).len(), 1);
}

#[test]
fn allocations_that_die_before_a_worker_connects_count_as_failures() {
    let p = QueueParams {
        max_failures: 2,
        ..params(Acquire::One, 1)
    };
    let mut al = Allocator::new();
    let q = al.add_queue(p).unwrap();
    let mut now = 0;
    let mut died = 0;
    while now < 100 * S {
        let acts = al.tick(now, |_| waiting(4));
        let queue = al.queue_mut(q).unwrap();
        for (alloc, _) in submits(&acts) {
            queue.submitted(alloc, format!("b{alloc}"));
            queue.started(now, alloc);
            queue.ended(now + S, alloc, None);
            died += 1;
        }
        now += S;
    }
    assert_eq!(died, 2);
    let queue = al.queue(q).unwrap();
    assert!(
        matches!(&queue.paused, Some(Paused::Failing(w)) if w.contains("ended with no worker")),
        "{:?}",
        queue.paused
    );
    // One whose worker came resets the count.
    let p = QueueParams {
        max_failures: 2,
        ..params(Acquire::One, 1)
    };
    let (mut al, q, alloc) = running(1, p);
    let queue = al.queue_mut(q).unwrap();
    queue.ended(10 * S, alloc, None);
    assert!(queue.paused.is_none());
    assert!(queue.last_error.is_none());
    let _ = al.tick(11 * S, |_| Demand::default());
}

#[test]
fn a_paused_queue_asks_for_nothing_but_still_cancels_and_releases() {
    let p = QueueParams {
        idle_timeout_us: Some(10 * S),
        ..params(Acquire::One, 1)
    };
    let (mut al, q, alloc) = running(1, p);
    al.queue_mut(q).unwrap().pause();
    assert!(submits(&al.tick(2 * S, |_| waiting(100))).is_empty());
    let idle = Demand {
        idle: vec![(1, 2 * S)],
        ..Demand::default()
    };
    let acts = al.tick(20 * S, |_| idle.clone());
    assert_eq!(
        acts,
        vec![Action::Drain {
            queue: q,
            alloc,
            workers: vec![1]
        }]
    );
}

#[test]
fn limits_on_allocations_and_workers_hold() {
    let mut al = Allocator::new();
    let p = QueueParams {
        max_allocs: Some(2),
        ..params(Acquire::One, 1)
    };
    let q = al.add_queue(p).unwrap();
    for t in 0..10 {
        for (alloc, _) in submits(&al.tick(t * S, |_| waiting(100))) {
            al.queue_mut(q).unwrap().submitted(alloc, String::new());
        }
    }
    assert_eq!(al.queue(q).unwrap().live().count(), 2);
    let mut al = Allocator::new();
    let p = QueueParams {
        max_workers: Some(5),
        ..params(Acquire::All, 4)
    };
    let q = al.add_queue(p).unwrap();
    let mut sizes = Vec::new();
    for t in 0..10 {
        for (alloc, n) in submits(&al.tick(t * S, |_| waiting(100))) {
            al.queue_mut(q).unwrap().submitted(alloc, String::new());
            sizes.push(n);
        }
    }
    assert_eq!(sizes, vec![4, 1], "5 workers at most");
}

#[test]
fn centralized_release_drains_one_allocation_a_tick_while_little_work_waits() {
    let mut al = Allocator::new();
    let p = QueueParams {
        release_below: Some(2),
        idle_timeout_us: None,
        ..params(Acquire::One, 1)
    };
    let q = al.add_queue(p).unwrap();
    let mut next_worker = 0;
    for t in 0..3 {
        for (alloc, _) in submits(&al.tick(t * S, |_| waiting(100))) {
            let queue = al.queue_mut(q).unwrap();
            queue.submitted(alloc, String::new());
            next_worker += 1;
            queue.worker_joined(t * S, alloc, next_worker);
        }
    }
    assert_eq!(al.queue(q).unwrap().live().count(), 3);
    // One task waits and no slot is free: nothing is given back while more is wanted (it
    // would be asked for again in the same tick).
    let short = Demand {
        free_slots: 0,
        idle: vec![],
        ..waiting(1)
    };
    let acts = al.tick(9 * S, |_| short.clone());
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Drain { .. })),
        "{acts:?}"
    );
    // Worker 2 runs nothing: its allocation gives up the least, so it goes first (before
    // the oldest, which has the least time left).
    let few = Demand {
        queued_tasks: 1,
        queued_slots: 1,
        free_slots: 12,
        idle: vec![(2, 5 * S)],
        covered_elsewhere: 0,
    };
    let acts = al.tick(10 * S, |_| few.clone());
    let drained: Vec<_> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Drain { alloc, workers, .. } => Some((*alloc, workers.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(drained, vec![(2, vec![2])], "{acts:?}");
    // The next one only once the first has gone.
    assert!(al.tick(11 * S, |_| few.clone()).is_empty());
}

#[test]
fn a_queue_with_live_allocations_is_removed_only_with_force() {
    let (mut al, q, alloc) = running(1, params(Acquire::One, 1));
    assert!(al.remove_queue(q, false).is_none());
    assert_eq!(
        al.remove_queue(q, true),
        Some(vec![Action::Cancel { queue: q, alloc }])
    );
    assert!(al.queue(q).is_none());
}

#[test]
fn settings_that_cannot_work_are_refused_with_what_to_change() {
    let mut al = Allocator::new();
    let bad = QueueParams {
        backlog: 0,
        ..params(Acquire::One, 1)
    };
    let err = al.add_queue(bad).unwrap_err();
    assert!(err.to_string().contains("--backlog"), "{err}");
    let short = QueueParams::new(30 * S, 4);
    assert!(al
        .add_queue(short)
        .unwrap_err()
        .to_string()
        .contains("--time-limit"));
    let never = QueueParams {
        release_below: Some(0),
        ..params(Acquire::One, 1)
    };
    let err = al.add_queue(never).unwrap_err();
    assert!(err.to_string().contains("--release-below"), "{err}");
}

#[test]
fn a_worker_that_comes_to_a_released_allocation_is_turned_away() {
    let p = QueueParams {
        idle_timeout_us: Some(10 * S),
        ..params(Acquire::All, 2)
    };
    let mut al = Allocator::new();
    let q = al.add_queue(QueueParams { nodes: 2, ..p }).unwrap();
    let acts = al.tick(0, |_| waiting(8));
    let [(alloc, 2)] = submits(&acts)[..] else {
        panic!("{acts:?}");
    };
    let queue = al.queue_mut(q).unwrap();
    queue.submitted(alloc, "b1".into());
    assert!(queue.worker_joined(S, alloc, 1));
    // Its one worker idles: the allocation is drained before its second worker comes.
    let idle = Demand {
        idle: vec![(1, S)],
        ..Demand::default()
    };
    let drained = al.tick(20 * S, |_| idle.clone());
    assert!(matches!(drained[..], [Action::Drain { .. }]), "{drained:?}");
    assert!(!al.queue_mut(q).unwrap().worker_joined(21 * S, alloc, 2));
}

#[test]
fn a_restored_queue_counts_its_allocations_and_never_reuses_an_id() {
    // Before a restart: a 2-node queue with one allocation queued, one running.
    let mut before = Allocator::new();
    let p = QueueParams {
        backlog: 1,
        max_workers: Some(4),
        ..params(Acquire::All, 2)
    };
    let q = before.add_queue(p.clone()).unwrap();
    for t in 0..2 {
        let acts = before.tick(t * S, |_| waiting(100));
        for (alloc, _) in submits(&acts) {
            before
                .queue_mut(q)
                .unwrap()
                .submitted(alloc, format!("b{alloc}"));
        }
        if t == 0 {
            before.queue_mut(q).unwrap().worker_joined(S / 2, 1, 7);
        }
    }
    let kept: Vec<Allocation> = before
        .queue(q)
        .unwrap()
        .allocations
        .values()
        .cloned()
        .collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    let (next_queue, next_alloc) = before.next_ids();

    let mut after = Allocator::new();
    after.skip_ids(next_queue, next_alloc);
    after.restore_queue(0, q, p, None, kept).unwrap();
    let queue = after.queue(q).unwrap();
    // Workers connect again by themselves: none is counted yet.
    assert!(queue.allocations.values().all(|a| a.workers.is_empty()));
    // Both allocations hold the 4 workers' worth: nothing more is asked.
    let acts = after.tick(3 * S, |_| waiting(100));
    assert_eq!(submits(&acts), vec![], "{acts:?}");
    // Once they have ended (the second with no worker: a failure, backed off), the next
    // allocation gets a new id.
    for alloc in [1, 2] {
        after.queue_mut(q).unwrap().ended(4 * S, alloc, None);
    }
    let acts = after.tick(4 * S + FIRST_BACKOFF_US, |_| waiting(100));
    assert_eq!(submits(&acts).first().map(|s| s.0), Some(next_alloc));
    assert_eq!(
        after.add_queue(params(Acquire::One, 1)).unwrap(),
        next_queue
    );
}

#[test]
fn a_restarted_server_gives_an_allocations_workers_their_time_again() {
    let mut before = Allocator::new();
    let q = before.add_queue(params(Acquire::One, 1)).unwrap();
    let acts = before.tick(0, |_| waiting(4));
    let [(alloc, _)] = submits(&acts)[..] else {
        panic!("{acts:?}");
    };
    let queue = before.queue_mut(q).unwrap();
    queue.submitted(alloc, "b1".into());
    queue.started(S, alloc);
    let kept: Vec<Allocation> = queue.allocations.values().cloned().collect();
    // The server was down for an hour; its worker, still trying, has not connected yet.
    let back = 3600 * S;
    let mut after = Allocator::new();
    after
        .restore_queue(back, q, params(Acquire::One, 1), None, kept)
        .unwrap();
    let cancel = Action::Cancel { queue: q, alloc };
    assert!(!after.tick(back + S, |_| waiting(4)).contains(&cancel));
    let late = back + WORKER_START_LIMIT_US;
    assert!(after.tick(late, |_| waiting(4)).contains(&cancel));
}

#[test]
fn queues_split_the_work_in_order_and_never_ask_twice_for_the_same_tasks() {
    let mut al = Allocator::new();
    let p = QueueParams {
        max_workers: Some(1),
        ..params(Acquire::One, 1)
    };
    let (q1, q2) = (al.add_queue(p.clone()).unwrap(), al.add_queue(p).unwrap());
    // One 4-slot worker's worth of work: the first queue's allocation covers it.
    let acts = al.tick(0, |_| waiting(4));
    let by_queue = |acts: &[Action], q: QueueId| {
        acts.iter()
            .filter(|a| matches!(a, Action::Submit { queue, .. } if *queue == q))
            .count()
    };
    assert_eq!(
        (by_queue(&acts, q1), by_queue(&acts, q2)),
        (1, 0),
        "{acts:?}"
    );
    // Twice that: the first queue is at its limit, the second brings the rest.
    let acts = al.tick(S, |_| waiting(8));
    assert_eq!(
        (by_queue(&acts, q1), by_queue(&acts, q2)),
        (0, 1),
        "{acts:?}"
    );
    // Nothing more is asked while both wait for their nodes.
    let acts = al.tick(2 * S, |_| waiting(8));
    assert!(submits(&acts).is_empty(), "{acts:?}");
}

#[test]
fn idle_slots_of_a_queue_that_cannot_take_the_work_do_not_hold_another_back() {
    let mut al = Allocator::new();
    let (q1, q2) = (
        al.add_queue(params(Acquire::One, 1)).unwrap(),
        al.add_queue(params(Acquire::One, 1)).unwrap(),
    );
    // Queue 1 has 8 idle slots but its time limit leaves the waiting tasks out (it sees
    // none); queue 2 sees them all.
    let acts = al.tick(0, |q| {
        if q.id == q1 {
            Demand {
                free_slots: 8,
                ..Demand::default()
            }
        } else {
            waiting(8)
        }
    });
    let asked: Vec<QueueId> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Submit { queue, .. } => Some(*queue),
            _ => None,
        })
        .collect();
    assert_eq!(asked, vec![q2], "{acts:?}");
}

#[test]
fn a_queue_does_not_ask_again_for_what_another_queues_allocation_will_bring() {
    let mut al = Allocator::new();
    let q1 = al
        .add_queue(QueueParams {
            backlog: 1,
            ..params(Acquire::One, 1)
        })
        .unwrap();
    let q2 = al.add_queue(params(Acquire::One, 1)).unwrap();
    // 8 slots wait (two 4-slot nodes' worth): each queue asks for one node.
    let acts = al.tick(0, |_| waiting(8));
    assert_eq!(submits(&acts).len(), 2, "{acts:?}");
    for (alloc, _) in submits(&acts) {
        for q in [q1, q2] {
            al.queue_mut(q)
                .unwrap()
                .submitted(alloc, format!("b{alloc}"));
        }
    }
    // Queue 1's node comes and takes 4 tasks; queue 2's is still on its way.
    al.queue_mut(q1).unwrap().worker_joined(S, 1, 1);
    for t in 2..10 {
        let acts = al.tick(t * S, |_| waiting(4));
        assert!(submits(&acts).is_empty(), "tick {t}: {acts:?}");
        assert!(
            !acts.iter().any(|a| matches!(a, Action::Cancel { .. })),
            "tick {t}: queue 2's allocation is still needed: {acts:?}"
        );
    }
}
