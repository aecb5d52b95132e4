//! A worker's identity (issue 29, defect 7): a worker that comes back after a lost connection
//! or a server restart keeps its id, and a replayed task end names the worker that ran it.

mod common;

use common::{array, spec};
use kestrel_core::harness::Harness;
use kestrel_core::*;

fn offer(host: &str) -> WorkerOffer {
    WorkerOffer {
        hostname: host.into(),
        resources: Resources {
            cpus: 2,
            ..Resources::NONE
        },
        prefetch: 0,
        named: Vec::new(),
        stages_files: true,
        runs_functions: false,
    }
}

fn success(job: JobId, index: TaskIndex) -> Finished {
    Finished {
        job,
        index,
        started_us: 1,
        finished_us: 2,
        end: RunEnd::Success,
    }
}

fn rejoin(s: &mut Scheduler, now: u64, host: &str, previous: WorkerId, same: bool) -> WorkerId {
    let ev = Event::WorkerRejoined {
        offer: offer(host),
        previous,
        same_start: same,
    };
    match s.handle(now, ev) {
        Ok(Reply::Joined(id)) => id,
        other => panic!("a rejoining worker answered {other:?}"),
    }
}

fn resume(
    s: &mut Scheduler,
    now: u64,
    worker: WorkerId,
    running: Vec<(JobId, TaskIndex)>,
    finished: Vec<Finished>,
) -> Resumed {
    let ev = Event::WorkerResumed {
        worker,
        previous: Some(worker),
        running,
        finished,
    };
    match s.handle(now, ev) {
        Ok(Reply::Resumed(r)) => r,
        other => panic!("a resumed worker answered {other:?}"),
    }
}

fn join(s: &mut Scheduler, now: u64, host: &str) -> WorkerId {
    match s.handle(now, Event::WorkerJoined { offer: offer(host) }) {
        Ok(Reply::Joined(id)) => id,
        other => panic!("a joining worker answered {other:?}"),
    }
}

#[test]
fn a_lost_worker_that_comes_back_gets_its_id_its_tasks_and_its_counts() {
    let config = Config {
        heartbeat_timeout_us: 5_000_000,
        ..Config::default()
    };
    let mut h = Harness::new(Scheduler::new(config), 100, 600_000_000);
    let a = h.add_worker(2, 0);
    let b = h.add_worker(2, 0);
    let job = h.submit(spec("a"), array(4));
    h.run_until(h.now_us + 1_000);
    let on_a: Vec<TaskIndex> = (0..4)
        .filter(|&i| h.sched.job(job).unwrap().record(i).worker == a)
        .collect();
    assert_eq!(on_a.len(), 2, "each worker took two tasks");
    h.freeze_worker(a);
    h.tick(6_000_000);
    assert!(h.sched.worker(a).is_none(), "lost by its heartbeat");
    let gone = h.sched.departed(a).expect("kept as departed");
    assert_eq!(gone.offer.hostname, "sim");
    // B leaves too, so that neither id is the newest: A's comes back all the same.
    h.sched
        .handle(h.now_us, Event::WorkerLost { worker: b })
        .unwrap();
    let now = h.now_us;
    let back = rejoin(&mut h.sched, now, "sim", a, false);
    assert_eq!(back, a, "the worker keeps its id");
    assert!(
        h.sched.departed(a).is_none(),
        "connected again, not departed"
    );
    // It still runs one task and ran the other meanwhile.
    let r = resume(
        &mut h.sched,
        now,
        a,
        vec![(job, on_a[0])],
        vec![success(job, on_a[1])],
    );
    assert_eq!((r.taken, r.recorded, r.ignored), (1, 1, 0));
    let j = h.sched.job(job).unwrap();
    assert_eq!(j.record(on_a[0]).worker, a);
    assert_eq!(j.record(on_a[0]).state, TaskState::Running);
    assert_eq!(j.record(on_a[1]).worker, a);
    assert_eq!(h.sched.worker(a).unwrap().tasks_finished, 1);
    // A worker new to the server never takes a departed worker's id.
    let c = join(&mut h.sched, now, "new");
    assert!(c > b, "new id {c}");
}

#[test]
fn a_reconnection_before_the_loss_is_noticed_keeps_the_id_and_the_tasks_it_names() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 600_000_000);
    let a = h.add_worker(3, 0);
    let job = h.submit(spec("a"), array(3));
    h.run_until(h.now_us + 1_000);
    let now = h.now_us;
    // The old registration is still held: the server has not noticed its connection died.
    assert!(h.sched.worker(a).is_some());
    let back = rejoin(&mut h.sched, now, "sim", a, true);
    assert_eq!(back, a);
    // Task 2 was only queued on the worker and dropped with the connection.
    let r = resume(&mut h.sched, now, a, vec![(job, 0)], vec![success(job, 1)]);
    assert_eq!((r.taken, r.recorded, r.ignored), (1, 1, 0));
    let j = h.sched.job(job).unwrap();
    assert_eq!(j.record(0).worker, a);
    assert_eq!(j.record(0).state, TaskState::Running);
    assert_eq!(j.record(2).state, TaskState::Ready);
    assert_eq!(j.record(2).lost, 0, "not a crash");
    assert_eq!(h.sched.worker(a).unwrap().outstanding(), 1);
    assert_eq!(h.sched.workers().count(), 1, "one registration");
    assert!(h.sched.departed(a).is_none());
}

#[test]
fn an_id_held_by_another_start_or_never_given_out_is_not_taken() {
    let mut s = Scheduler::new(Config::default());
    let a = join(&mut s, 0, "a");
    // Named with another start's epoch while a registration holds it: a new id.
    let other = rejoin(&mut s, 1, "b", a, false);
    assert_ne!(other, a);
    assert!(s.worker(a).is_some(), "the live registration stays");
    // An id this scheduler never gave out, nor reserved: a new id, and 0 is no id.
    let c = rejoin(&mut s, 2, "c", 77, false);
    assert_eq!(c, other + 1);
    let d = rejoin(&mut s, 3, "d", 0, false);
    assert_eq!(d, c + 1);
}

#[test]
fn a_replayed_end_names_its_worker_and_restarted_ids_continue_after_the_journal() {
    let mut s = Scheduler::new(Config::default());
    s.restore_submit(1, 0, spec("a"), array(2), false).unwrap();
    s.restore_task_end_by(success(1, 0), 1, 5);
    // A journal written before ends named their worker.
    s.restore_task_end(success(1, 1), 1);
    s.restore_done();
    let j = s.job(1).unwrap();
    assert_eq!((j.record(0).worker, j.record(1).worker), (5, 0));
    // Worker 5 ran a task before the restart: its id is not given to a new worker, and it
    // takes it back when it reconnects.
    let fresh = join(&mut s, 10, "new");
    assert_eq!(fresh, 6);
    assert_eq!(rejoin(&mut s, 11, "old", 5, false), 5);
    // Ids reserved beyond the ends (workers that ran nothing) are skipped too.
    s.reserve_worker_ids(40);
    assert_eq!(join(&mut s, 12, "newer"), 40);
    assert_eq!(rejoin(&mut s, 13, "idle", 30, false), 30);
}

#[test]
fn departed_workers_are_kept_up_to_a_bound_newest_first() {
    let mut s = Scheduler::new(Config::default());
    let n = MAX_DEPARTED as u32 + 5;
    for i in 0..n {
        let id = join(&mut s, u64::from(i), "w");
        s.handle(u64::from(i), Event::WorkerLost { worker: id })
            .unwrap();
    }
    assert!(s.departed(1).is_none(), "the oldest were dropped");
    assert!(s.departed(6).is_some());
    let last = s.departed(n).expect("the newest is kept");
    assert_eq!(
        (last.joined_us, last.left_us),
        (u64::from(n - 1), u64::from(n - 1))
    );
}

#[test]
fn a_dismissed_workers_tasks_go_back_without_a_crash_or_a_retry() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 600_000_000);
    let a = h.add_worker(2, 0);
    let mut sp = spec("a");
    sp.retries = 0;
    let job = h.submit(sp, array(2));
    h.run_until(h.now_us + 1_000);
    let now = h.now_us;
    h.sched
        .handle(now, Event::WorkerDismissed { worker: a })
        .unwrap();
    let j = h.sched.job(job).unwrap();
    assert_eq!(j.counts.ready, 2);
    assert_eq!((j.record(0).lost, j.record(0).failures), (0, 0));
    assert!(h.sched.departed(a).is_some());
    assert_eq!(
        h.sched.handle(now, Event::WorkerDismissed { worker: a }),
        Err(SchedError::NoSuchWorker(a))
    );
    let b = h.add_worker(2, 0);
    h.run_until_idle();
    assert!(h.sched.job(job).unwrap().is_done());
    assert_eq!(h.worker_runs(b), 2);
}
