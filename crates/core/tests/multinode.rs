//! Multi-node tasks (`--nodes N`, issue 29): a task takes N whole workers of one group, nothing
//! else runs on them meanwhile, workers are held for it as they drain without starving
//! single-node work, and a lost node of its set sends it back to the queue.

mod common;

use common::{array, spec};
use kestrel_core::harness::{Harness, SimRun};
use kestrel_core::*;

const SECOND: u64 = 1_000_000;

/// A job whose tasks take `nodes` workers each.
fn nodes_job(nodes: u32) -> JobSpec {
    let mut s = spec("mpi");
    s.nodes = nodes;
    s
}

/// A harness whose job `long_job`'s tasks run `long` and every other task `short`.
fn harness(long_job: JobId, long: u64, short: u64) -> Harness {
    Harness::with_model(Scheduler::new(Config::default()), 100, move |job, _, _| {
        SimRun {
            duration_us: if job == long_job { long } else { short },
            succeed: true,
        }
    })
}

/// The workers a multi-node task was handed with, from the commands.
fn nodes_given(h: &Harness, job: JobId, index: TaskIndex) -> Vec<Vec<WorkerId>> {
    h.commands
        .iter()
        .filter_map(|c| match c {
            Command::AssignNodes {
                job: j,
                index: i,
                nodes,
                ..
            } if (*j, *i) == (job, index) => Some(nodes.clone()),
            _ => None,
        })
        .collect()
}

/// Runs that started on `worker` from `from_us` to `to_us` (both excluded), other than `key`.
fn others_on(
    h: &Harness,
    worker: WorkerId,
    from_us: u64,
    to_us: u64,
    key: (JobId, TaskIndex),
) -> Vec<(JobId, TaskIndex)> {
    h.starts
        .iter()
        .filter(|(t, w, k)| *w == worker && *t > from_us && *t < to_us && *k != key)
        .map(|(_, _, k)| *k)
        .collect()
}

fn assert_sound(h: &Harness) {
    let bad = h.sched.audit();
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn a_task_of_two_nodes_takes_two_whole_workers_and_nothing_else_runs_there() {
    // Job 1: the two-node task (10 s); job 2: 60 one-cpu tasks of 1 s.
    let mut h = harness(1, 10 * SECOND, SECOND);
    let ws: Vec<_> = (0..3).map(|_| h.add_worker(2, 2)).collect();
    let mpi = h.submit(nodes_job(2), array(1));
    let singles = h.submit(spec("single"), array(60));
    let given = nodes_given(&h, mpi, 0);
    assert_eq!(given.len(), 1, "handed once: {given:?}");
    let set = given[0].clone();
    assert_eq!(set.len(), 2);
    let root = set[0];
    assert!(ws.contains(&set[0]) && ws.contains(&set[1]) && set[0] != set[1]);
    h.run_until(h.now_us + 5 * SECOND);
    let (start, on, _) = *h.starts.iter().find(|s| s.2 == (mpi, 0)).unwrap();
    assert_eq!(on, root, "it runs on the first worker of its set");
    assert_eq!(h.sched.nodes_of((mpi, 0)), Some(&set[..]));
    for &w in &set {
        assert_eq!(h.sched.worker(w).unwrap().outstanding(), 1, "worker {w}");
    }
    h.run_until_idle();
    let end = h.sched.job(mpi).unwrap().finished_us.unwrap();
    for &w in &set {
        assert_eq!(others_on(&h, w, start, end, (mpi, 0)), vec![], "worker {w}");
    }
    // Single-node work went on on the third worker meanwhile, and everywhere after.
    let third = *ws.iter().find(|w| !set.contains(w)).unwrap();
    assert!(others_on(&h, third, start, end, (mpi, 0)).len() >= 10);
    assert!(h.sched.job(singles).unwrap().is_done());
    assert!(h.starts.iter().any(|(t, w, _)| *w == set[1] && *t > end));
    assert_eq!(h.sched.nodes_of((mpi, 0)), None);
    assert_sound(&h);
}

#[test]
fn workers_drain_for_a_waiting_multinode_task_and_the_others_keep_single_work() {
    // Job 1: 3 s tasks on every slot; job 2 (submitted after): two nodes; job 3: more singles.
    let mut h = Harness::with_model(Scheduler::new(Config::default()), 100, |job, _, _| SimRun {
        duration_us: if job == 2 { 2 * SECOND } else { 3 * SECOND },
        succeed: true,
    });
    let ws: Vec<_> = (0..3).map(|_| h.add_worker(1, 1)).collect();
    let first = h.submit(spec("busy"), array(6));
    h.run_until(h.now_us + SECOND);
    let mpi = h.submit(nodes_job(2), array(1));
    let later = h.submit(spec("later"), array(30));
    // Nothing is free: two workers are held for it and give back what waits there.
    let (key, held) = h.sched.nodes_holding().expect("workers held for the task");
    assert_eq!((key, held.len()), ((mpi, 0), 2));
    let held = held.to_vec();
    assert!(h
        .commands
        .iter()
        .any(|c| matches!(c, Command::Revoke { worker, .. } if held.contains(worker))));
    let asked = h.now_us;
    h.run_until_idle();
    let (start, root, _) = *h.starts.iter().find(|s| s.2 == (mpi, 0)).unwrap();
    assert!(held.contains(&root));
    // It started as soon as the tasks running on the held workers ended (3 s after they began).
    assert!(
        start < asked + 3 * SECOND,
        "started {} s late",
        (start - asked) / SECOND
    );
    for &w in &held {
        assert_eq!(
            others_on(&h, w, asked, start + 2 * SECOND, (mpi, 0)),
            vec![],
            "worker {w} took work while held"
        );
    }
    // The third worker was not held: single-node work went on there.
    let third = *ws.iter().find(|w| !held.contains(w)).unwrap();
    assert!(!others_on(&h, third, asked, start, (mpi, 0)).is_empty());
    for job in [first, mpi, later] {
        assert!(h.sched.job(job).unwrap().is_done());
        assert_eq!(
            h.sched.job(job).unwrap().counts.finished,
            h.sched.job(job).unwrap().len()
        );
    }
    assert_sound(&h);
}

#[test]
fn higher_priority_single_work_goes_first_then_the_multinode_task_runs() {
    let mut h = harness(0, 0, SECOND);
    let a = h.add_worker(1, 0);
    let _b = h.add_worker(1, 0);
    let mut urgent = spec("urgent");
    urgent.priority = 5;
    let urgent = h.submit(urgent, array(10));
    let mpi = h.submit(nodes_job(2), array(1));
    // Work of a higher priority waits: nothing is held for the lower one.
    assert_eq!(h.sched.nodes_holding(), None);
    assert_eq!(h.sched.worker(a).unwrap().outstanding(), 1);
    h.run_until_idle();
    let urgent_end = h.sched.job(urgent).unwrap().finished_us.unwrap();
    let (start, _, _) = *h.starts.iter().find(|s| s.2 == (mpi, 0)).unwrap();
    assert!(
        start >= urgent_end - SECOND,
        "it ran before the urgent work"
    );
    assert!(h.sched.job(mpi).unwrap().is_done());
    assert_sound(&h);
}

#[test]
fn more_nodes_than_workers_waits_and_says_why_until_enough_join() {
    let mut h = harness(0, 0, SECOND);
    h.add_worker(2, 0);
    h.add_worker(2, 0);
    let mpi = h.submit(nodes_job(3), array(1));
    assert!(nodes_given(&h, mpi, 0).is_empty());
    assert_eq!(
        h.sched.nodes_holding(),
        None,
        "nothing held for the impossible"
    );
    let why = h.sched.stall(mpi).expect("a stall").to_string();
    assert_eq!(
        why,
        "each task needs 3 whole workers of one group, and only 2 can take it (workers 1, 2); start more workers (`kestrel worker start`) or cancel the job"
    );
    // Single-node work is not held up by it.
    let singles = h.submit(spec("single"), array(4));
    h.run_until(h.now_us + 3 * SECOND);
    assert!(h.sched.job(singles).unwrap().is_done());
    h.add_worker(1, 0);
    assert_eq!(h.sched.stall(mpi), None);
    h.run_until_idle();
    assert_eq!(nodes_given(&h, mpi, 0), vec![vec![1, 2, 3]]);
    assert!(h.sched.job(mpi).unwrap().is_done());
    assert_sound(&h);
}

#[test]
fn a_set_is_taken_from_one_group_and_others_backfill_the_rest() {
    let mut h = harness(0, 0, 2 * SECOND);
    let a1 = h.add_worker_in("a", 1, 0);
    let a2 = h.add_worker_in("a", 1, 0);
    let b1 = h.add_worker_in("b", 1, 0);
    let b2 = h.add_worker_in("b", 1, 0);
    let b3 = h.add_worker_in("b", 1, 0);
    // Four nodes: no group has them.
    let big = h.submit(nodes_job(4), array(1));
    let why = h.sched.stall(big).unwrap().to_string();
    assert!(
        why.contains("the largest group of workers that can (group b) has 3 (workers 3, 4, 5)"),
        "{why}"
    );
    // Three nodes fit group b only; two fit a (the smaller group that has them).
    let three = h.submit(nodes_job(3), array(1));
    let two = h.submit(nodes_job(2), array(1));
    assert_eq!(nodes_given(&h, three, 0), vec![vec![b1, b2, b3]]);
    assert_eq!(nodes_given(&h, two, 0), vec![vec![a1, a2]]);
    h.run_until_idle();
    assert!(h.sched.job(three).unwrap().is_done() && h.sched.job(two).unwrap().is_done());
    assert_sound(&h);
}

#[test]
fn a_task_behind_one_that_waits_starts_on_workers_not_held_for_it() {
    // Job 1 keeps a1 busy for 10 s.
    let mut h = harness(1, 10 * SECOND, SECOND);
    let a1 = h.add_worker_in("a", 1, 0);
    let a2 = h.add_worker_in("a", 1, 0);
    let b1 = h.add_worker_in("b", 1, 0);
    let busy = h.submit(spec("busy"), array(1));
    h.run_until(h.now_us + SECOND);
    let first = h.submit(nodes_job(2), array(1));
    let behind = h.submit(nodes_job(1), array(1));
    // The first waits in group a (a1 drains, a2 is held); the one behind takes b1 now.
    let (key, held) = h.sched.nodes_holding().unwrap();
    assert_eq!((key, held.to_vec()), ((first, 0), vec![a2, a1]));
    assert_eq!(nodes_given(&h, behind, 0), vec![vec![b1]]);
    h.run_until_idle();
    assert_eq!(nodes_given(&h, first, 0), vec![vec![a2, a1]]);
    assert!(h.sched.job(busy).unwrap().is_done() && h.sched.job(first).unwrap().is_done());
    assert_sound(&h);
}

#[test]
fn a_lost_node_sends_the_task_back_and_frees_the_rest() {
    let mut h = harness(1, 10 * SECOND, SECOND);
    let ws: Vec<_> = (0..3).map(|_| h.add_worker(1, 0)).collect();
    let mpi = h.submit(nodes_job(2), array(1));
    let set = nodes_given(&h, mpi, 0)[0].clone();
    h.run_until(h.now_us + SECOND);
    // The second node dies: the root is told to stop the run.
    h.kill_worker(set[1]);
    assert!(h.commands.iter().any(|c| matches!(
        c,
        Command::Cancel { worker, tasks } if *worker == set[0] && tasks == &vec![(mpi, 0)]
    )));
    h.run_until(h.now_us + SECOND);
    // Its end counted as the loss: back in the queue with a crash, on two live workers again.
    let j = h.sched.job(mpi).unwrap();
    assert_eq!(j.record(0).lost, 1);
    assert_eq!(j.record(0).failures, 0);
    let again = nodes_given(&h, mpi, 0);
    assert_eq!(again.len(), 2, "{again:?}");
    assert!(!again[1].contains(&set[1]));
    assert!(again[1].iter().all(|w| ws.contains(w)));
    h.run_until_idle();
    assert_eq!(h.sched.job(mpi).unwrap().counts.finished, 1);
    assert_sound(&h);
}

#[test]
fn a_lost_root_sends_the_task_back_and_its_nodes_are_freed() {
    let mut h = harness(1, 10 * SECOND, SECOND);
    for _ in 0..3 {
        h.add_worker(1, 0);
    }
    let mpi = h.submit(nodes_job(2), array(1));
    let set = nodes_given(&h, mpi, 0)[0].clone();
    h.run_until(h.now_us + SECOND);
    h.kill_worker(set[0]);
    let j = h.sched.job(mpi).unwrap();
    assert_eq!(j.record(0).lost, 1);
    // The other node is free again, and the task runs on it and the third worker.
    let again = nodes_given(&h, mpi, 0);
    assert_eq!(again.len(), 2, "{again:?}");
    assert!(again[1].contains(&set[1]));
    h.run_until_idle();
    assert!(h.sched.job(mpi).unwrap().is_done());
    assert_sound(&h);
}

#[test]
fn canceling_a_running_multinode_task_frees_its_workers() {
    let mut h = harness(1, 10 * SECOND, SECOND);
    h.add_worker(1, 0);
    h.add_worker(1, 0);
    let mpi = h.submit(nodes_job(2), array(1));
    h.run_until(h.now_us + SECOND);
    assert_eq!(h.cancel(mpi), (0, 1));
    h.run_until(h.now_us + SECOND);
    assert_eq!(h.sched.job(mpi).unwrap().counts.canceled, 1);
    assert_eq!(h.sched.nodes_of((mpi, 0)), None);
    let singles = h.submit(spec("single"), array(2));
    h.run_until(h.now_us + 100_000);
    assert_eq!(
        h.sched
            .workers()
            .map(|w| w.outstanding())
            .collect::<Vec<_>>(),
        vec![1, 1]
    );
    h.run_until_idle();
    assert!(h.sched.job(singles).unwrap().is_done());
    assert_sound(&h);
}

#[test]
fn an_array_of_multinode_tasks_runs_them_a_set_at_a_time() {
    let mut h = harness(0, 0, SECOND);
    for _ in 0..4 {
        h.add_worker(2, 2);
    }
    let mpi = h.submit(nodes_job(3), array(5));
    h.run_until_idle();
    let j = h.sched.job(mpi).unwrap();
    assert_eq!(j.counts.finished, 5);
    // One set of three at a time on four workers: five rounds of a second.
    let span = j.finished_us.unwrap() - j.submitted_us;
    assert!(span >= 5 * SECOND, "{span}");
    assert_sound(&h);
}

#[test]
fn a_retried_multinode_job_runs_again() {
    let mut h = Harness::with_model(Scheduler::new(Config::default()), 100, |_, _, attempt| {
        SimRun {
            duration_us: SECOND,
            succeed: attempt > 1,
        }
    });
    h.add_worker(1, 0);
    h.add_worker(1, 0);
    let mpi = h.submit(nodes_job(2), array(1));
    h.run_until_idle();
    assert_eq!(h.sched.job(mpi).unwrap().counts.failed, 1);
    h.sched
        .handle(
            h.now_us,
            Event::Retry {
                job: mpi,
                failed_only: true,
            },
        )
        .unwrap();
    h.pump();
    h.run_until_idle();
    assert_eq!(h.sched.job(mpi).unwrap().counts.finished, 1);
    assert_eq!(nodes_given(&h, mpi, 0).len(), 2);
    assert_sound(&h);
}

/// A worker of one slot that may be a node, joined to `s` directly.
fn node(s: &mut Scheduler) -> WorkerId {
    let w = common::staging_worker(s, 1);
    s.handle(
        0,
        Event::WorkerNodes {
            worker: w,
            group: String::new(),
        },
    )
    .unwrap();
    w
}

/// The workers assigned something by the commands `s` gives after a pass.
fn assigned_to(s: &mut Scheduler, now: u64) -> Vec<WorkerId> {
    s.handle(now, Event::Schedule).unwrap();
    let mut ws: Vec<WorkerId> = s
        .take_commands()
        .into_iter()
        .filter_map(|c| match c {
            Command::Assign { worker, .. } | Command::AssignNodes { worker, .. } => Some(worker),
            _ => None,
        })
        .collect();
    ws.sort_unstable();
    ws.dedup();
    ws
}

#[test]
fn a_node_or_root_that_reconnects_keeps_its_place_in_the_set() {
    use common::Events;
    let mut s = Scheduler::new(Config::default());
    let (a, b) = (node(&mut s), node(&mut s));
    let mpi = s.submit(0, nodes_job(2), array(1), false).unwrap();
    assert_eq!(assigned_to(&mut s, 1), vec![a]);
    let started = vec![Started {
        job: mpi,
        index: 0,
        at_us: 2,
    }];
    s.handle(2, Event::TasksStarted { worker: a, started })
        .unwrap();
    // The second node's connection drops and it registers again as c.
    let c = node(&mut s);
    s.worker_resumed(3, c, Some(b), vec![], vec![]);
    assert_eq!(s.nodes_of((mpi, 0)), Some(&[a, c][..]));
    // Single-node work does not go to it meanwhile.
    let singles = s.submit(4, spec("single"), array(4), false).unwrap();
    assert_eq!(assigned_to(&mut s, 5), Vec::<WorkerId>::new());
    // The root comes back as d with the task still running: it stays the set's root.
    let d = node(&mut s);
    let r = s.worker_resumed(6, d, Some(a), vec![(mpi, 0)], vec![]);
    assert_eq!(r.taken, 1);
    assert_eq!(assigned_to(&mut s, 7), Vec::<WorkerId>::new());
    assert_eq!(s.nodes_of((mpi, 0)), Some(&[d, c][..]));
    // Its end frees both for the single tasks.
    let ends = vec![Finished::at_once(mpi, 0, 8, RunEnd::Success)];
    s.handle(8, Event::TasksEnded { worker: d, ends }).unwrap();
    assert_eq!(assigned_to(&mut s, 9), vec![c, d]);
    assert_eq!(s.job(singles).unwrap().counts.assigned, 2);
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}
