//! Where tasks go: free slots everywhere before prefetch windows, prefetch depth that follows
//! the tasks' run time, work stealing of prefetch windows, and the timing figures that come
//! out of it (issue 10, defects 3 and 8).

mod common;

use common::{array, spec, Events};
use kestrel_core::harness::Harness;
use kestrel_core::*;

const LONG: u64 = 40_000_000;

/// When the last task of a job ended.
fn makespan(h: &Harness, job: JobId) -> u64 {
    let j = h.sched.job(job).unwrap();
    assert!(j.is_done());
    j.finished_us.unwrap() - j.submitted_us
}

#[test]
fn four_long_tasks_on_two_idle_workers_run_two_and_two() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, LONG);
    let a = h.add_worker(2, 2);
    let b = h.add_worker(2, 2);
    let job = h.submit(spec("long"), array(4));
    h.run_until(h.now_us + 1_000);
    assert_eq!((h.running_on(a), h.running_on(b)), (2, 2));
    h.run_until_idle();
    assert!(
        makespan(&h, job) < LONG + LONG / 10,
        "{}",
        makespan(&h, job)
    );
}

/// The reported case: the busy worker had taken all four (two prefetched) before the other one
/// joined. The idle worker takes the waiting two back instead of idling for a whole task.
#[test]
fn an_idle_worker_steals_the_tasks_waiting_on_a_busy_one() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, LONG);
    let a = h.add_worker(2, 2);
    let job = h.submit(spec("long"), array(4));
    h.run_until(h.now_us + 1_000);
    assert_eq!(h.sched.worker(a).unwrap().outstanding(), 4);
    let b = h.add_worker(2, 2);
    h.run_until(h.now_us + 1_000);
    assert_eq!((h.running_on(a), h.running_on(b)), (2, 2));
    assert_eq!(h.revoked, 2);
    h.run_until_idle();
    assert!(
        makespan(&h, job) < LONG + LONG / 10,
        "{}",
        makespan(&h, job)
    );
    // Taken back before they started: no attempt, no crash.
    let j = h.sched.job(job).unwrap();
    assert!((0..4).all(|i| j.record(i).runs == 1 && j.record(i).lost == 0));
    assert_eq!(h.worker_runs(a) + h.worker_runs(b), 4);
}

/// Short tasks get a deep prefetch and are never stolen: they start sooner than a round
/// trip would take them elsewhere.
#[test]
fn short_tasks_keep_their_prefetch_and_are_not_stolen() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 1_000);
    let a = h.add_worker(2, 2);
    let job = h.submit(spec("short"), array(1_000));
    h.run_until(h.now_us + 50_000);
    let b = h.add_worker(2, 2);
    h.run_until_idle();
    assert!(h.sched.job(job).unwrap().is_done());
    // Known to be short (a millisecond), the job goes past the workers' own prefetch of 2,
    // to 32 a cpu (100 ms of run time a slot would be 200).
    assert_eq!(
        h.worker_peaks(a).0,
        2 + 64,
        "slots plus a short job's prefetch"
    );
    assert_eq!(
        h.worker_peaks(b).0,
        2 + 64,
        "slots plus a short job's prefetch"
    );
    assert_eq!(h.revoked, 0);
    assert!(h
        .commands
        .iter()
        .all(|c| !matches!(c, Command::Revoke { .. })));
}

/// Once a job's tasks are known to run long, a worker holds no more of them than its slots:
/// the next ones wait in the server's queue, where any worker that frees up can take them.
#[test]
fn long_tasks_are_not_prefetched_once_their_length_is_known() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 2_000_000);
    let a = h.add_worker(2, 2);
    let job = h.submit(spec("long"), array(20));
    h.run_until(h.now_us + 1_000);
    // Nothing is known yet: slots and prefetch are filled.
    assert_eq!(h.sched.worker(a).unwrap().outstanding(), 4);
    // After the first runs end, the prefetched ones start and no new ones are queued here.
    h.run_until(h.now_us + 2_500_000);
    assert!(h.sched.job(job).unwrap().mean_run_us.is_some());
    assert_eq!(h.sched.worker(a).unwrap().outstanding(), 2);
    h.run_until_idle();
    assert!(h.sched.job(job).unwrap().is_done());
}

/// Defect 8: "dispatch overhead" is the time from assignment to start less the wait for a slot
/// on the worker, which is a figure of its own.
#[test]
fn the_wait_for_a_slot_is_not_dispatch_overhead() {
    let latency = 100;
    let run = 10_000;
    let mut h = Harness::new(Scheduler::new(Config::default()), latency, run);
    h.add_worker(1, 1);
    let job = h.submit(spec("short"), array(20));
    h.run_until_idle();
    let t = h.sched.job(job).unwrap().timing();
    assert_eq!(t.tasks, 20);
    // One task waited at most one run for its slot each time.
    assert!(t.waited_us > 10 * run, "{t:?}");
    // Left over: the one-way latency of each assignment, and nothing of the wait.
    assert!(t.dispatch_us <= 20 * latency, "{t:?}");
}

/// A task put back in the queue (retry) shows no stale end time while it runs again.
#[test]
fn a_task_running_again_after_a_retry_has_no_end_time() {
    let mut h = kestrel_core::harness::Harness::with_model(
        Scheduler::new(Config::default()),
        10,
        |_, _, attempt| kestrel_core::harness::SimRun {
            duration_us: if attempt == 1 { 1_000 } else { 1_000_000 },
            succeed: attempt > 1,
        },
    );
    h.add_worker(1, 0);
    let job = h.submit(spec("a"), array(1));
    h.run_until(h.now_us + 10_000);
    assert_eq!(h.sched.job(job).unwrap().counts.failed, 1);
    h.sched.retry_job(job, true).unwrap();
    h.pump();
    h.run_until(h.now_us + 10_000);
    let r = h.sched.job(job).unwrap().record(0);
    assert_eq!(r.state, TaskState::Running);
    assert!(r.started_us > 0);
    assert_eq!(r.finished_us, 0, "{r:?}");
    assert_eq!(r.runs, 2);
}
