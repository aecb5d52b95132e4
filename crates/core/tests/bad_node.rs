//! The classic bad node (issue 29, defect 1): a worker whose tasks all fail at once, beside a
//! healthy one. It must be quarantined however few tasks the healthy one ran, and the tasks
//! it failed must be run again elsewhere; while a task that fails wherever it runs, or a job
//! that fails everywhere, never quarantines anyone.

mod common;

use common::{array, spec};
use kestrel_core::harness::{Harness, SimData, SimRun};
use kestrel_core::*;
use std::cell::RefCell;
use std::rc::Rc;

/// Every run: (worker, job, index, attempt).
type Runs = Rc<RefCell<Vec<(WorkerId, JobId, TaskIndex, u32)>>>;

/// A harness whose runs `model(worker, index, attempt)` decides, keeping a log of them.
fn logged(
    config: Config,
    mut model: impl FnMut(WorkerId, TaskIndex, u32) -> SimRun + 'static,
) -> (Harness, Runs) {
    let runs: Runs = Rc::default();
    let log = runs.clone();
    let h = Harness::with_worker_model(Scheduler::new(config), 100, move |w, j, i, a| {
        log.borrow_mut().push((w, j, i, a));
        model(w, i, a)
    });
    (h, runs)
}

/// Worker 1 fails every task in a millisecond; the others succeed in 100 ms.
fn bad_node(w: WorkerId, _: TaskIndex, _: u32) -> SimRun {
    if w == 1 {
        SimRun {
            duration_us: 1_000,
            succeed: false,
        }
    } else {
        SimRun {
            duration_us: 100_000,
            succeed: true,
        }
    }
}

fn retrying(n: u8) -> JobSpec {
    let mut s = spec("sweep");
    s.retries = n.into();
    s
}

/// As reported: `submit --retries 3 --array 1-200` beside a node whose tasks fail at once
/// ended 28 finished, 172 failed, and the bad node stayed active. The healthy worker never ran
/// as many of the job's tasks as the bad one failed, which the old rule waited for.
#[test]
fn a_node_failing_every_task_at_once_is_quarantined_and_every_task_finishes() {
    let (mut h, runs) = logged(Config::default(), bad_node);
    let bad = h.add_worker(1, 1);
    let good = h.add_worker(1, 1);
    let job = h.submit(retrying(3), array(200));
    h.run_until_idle();
    let j = h.sched.job(job).unwrap();
    assert_eq!(
        (j.counts.finished, j.counts.failed),
        (200, 0),
        "every task finishes"
    );
    // Judged at the healthy worker's second success (its first leaves one chance in 198):
    // by then the bad node, a hundred times faster, had failed nearly every task once.
    let why = h.sched.worker(bad).unwrap().quarantined.clone();
    assert_eq!(
        why.as_deref(),
        Some("198 of its last 198 tasks of job 1 failed, against 0 of 2 on the other workers")
    );
    assert!(h.sched.worker(good).unwrap().quarantined.is_none());
    // No task ran twice there: their retries went to the healthy worker.
    let runs = runs.borrow();
    assert!(runs.iter().filter(|r| r.0 == bad).all(|r| r.3 == 1));
    assert_eq!(runs.iter().filter(|r| r.0 == good).count(), 200);
}

/// The healthy worker comes only after the bad node failed every task once: it runs no first
/// run of a task at all, only retries. The bad node is judged by those tasks: it failed 200
/// in a row, and they succeed elsewhere.
#[test]
fn a_node_whose_failed_tasks_succeed_elsewhere_is_quarantined_however_few_the_others_ran() {
    let (mut h, runs) = logged(Config::default(), bad_node);
    let bad = h.add_worker(1, 1);
    let job = h.submit(retrying(3), array(200));
    // Alone, it is the last worker able to run the job: not quarantined, it fails them all.
    h.run_until(h.now_us + 300_000);
    assert_eq!(h.sched.job(job).unwrap().counts.ready, 200);
    assert!(h.sched.worker(bad).unwrap().quarantined.is_none());
    let good = h.add_worker(1, 1);
    h.run_until_idle();
    let j = h.sched.job(job).unwrap();
    assert_eq!((j.counts.finished, j.counts.failed), (200, 0));
    let why = h.sched.worker(bad).unwrap().quarantined.clone();
    assert_eq!(
        why.as_deref(),
        Some(
            "its last 200 runs of job 1 failed, and 10 of those tasks then succeeded on other \
             workers (0 failed there too)"
        )
    );
    // Its failures' retries all went to the healthy worker.
    let again_on_bad = runs
        .borrow()
        .iter()
        .filter(|r| r.0 == bad && r.3 > 1)
        .count();
    assert_eq!(again_on_bad, 0);
    assert!(h.sched.worker(good).unwrap().quarantined.is_none());
}

/// HTCondor and Slurm requeue a failed job away from the node it failed on: so does a retry.
#[test]
fn a_failed_task_is_retried_on_another_worker() {
    // Every task fails on its first run, wherever it runs, and succeeds on its second.
    let (mut h, runs) = logged(Config::default(), |_, _, attempt| SimRun {
        duration_us: 1_000,
        succeed: attempt > 1,
    });
    h.add_worker(1, 1);
    h.add_worker(1, 1);
    let job = h.submit(retrying(1), array(40));
    h.run_until_idle();
    assert_eq!(h.sched.job(job).unwrap().counts.finished, 40);
    let runs = runs.borrow();
    for i in 0..40 {
        let on: Vec<WorkerId> = runs.iter().filter(|r| r.2 == i).map(|r| r.0).collect();
        assert_eq!(on.len(), 2, "task {i}: {on:?}");
        assert_ne!(on[0], on[1], "task {i} was retried where it failed");
    }
    // Both fail every first run and succeed every retry: neither is to blame.
    assert!(h.sched.workers().all(|w| w.quarantined.is_none()));
}

/// Tasks placed by their data (from the window of a data-aware policy) are retried elsewhere
/// too, whatever the policy.
#[test]
fn a_failed_task_placed_by_its_data_is_retried_on_another_worker() {
    for policy in [
        PolicyName::MaxComputeUtil,
        PolicyName::GoodCacheCompute,
        PolicyName::MaxCacheHit,
    ] {
        let (h, runs) = logged(Config::default(), |_, _, attempt| SimRun {
            duration_us: 1_000,
            succeed: attempt > 1,
        });
        let mut h = h.with_data(SimData {
            cache_files: 100,
            file_bytes: 1_000,
            local_us: 10,
            peer_us: 100,
            store_us: 1_000,
        });
        h.add_worker(1, 1);
        h.add_worker(1, 1);
        let mut s = retrying(1);
        s.template.files.inputs = vec!["data/{line}".into()];
        s.placement.policy = Some(policy);
        let lines: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
        let job = h.submit(
            s,
            TaskSet::Lines(lines.iter().map(String::as_str).collect()),
        );
        h.run_until_idle();
        assert_eq!(h.sched.job(job).unwrap().counts.finished, 20, "{policy:?}");
        let runs = runs.borrow();
        for i in 0..20 {
            let on: Vec<WorkerId> = runs.iter().filter(|r| r.2 == i).map(|r| r.0).collect();
            assert_eq!(on.len(), 2, "{policy:?}, task {i}: {on:?}");
            assert_ne!(
                on[0], on[1],
                "{policy:?}: task {i} was retried where it failed"
            );
        }
    }
}

/// A retry waits for another worker only so long: the other worker runs a long task, so after
/// `retry_elsewhere_us` the retry runs where it failed rather than starve.
#[test]
fn a_retry_falls_back_to_the_worker_it_failed_on_when_no_other_takes_it() {
    let config = Config::default();
    let (backoff, elsewhere) = (config.retry_backoff_us, config.retry_elsewhere_us);
    // Job 1 is one long task; job 2's task fails on its first run.
    let runs: Runs = Rc::default();
    let log = runs.clone();
    let mut h = Harness::with_worker_model(Scheduler::new(config), 100, move |w, j, i, a| {
        log.borrow_mut().push((w, j, i, a));
        SimRun {
            duration_us: if j == 1 { 600_000_000 } else { 1_000 },
            succeed: j == 1 || a > 1,
        }
    });
    h.add_worker(1, 0);
    h.add_worker(1, 0);
    let long = h.submit(spec("long"), array(1));
    h.run_until(h.now_us + 10_000);
    let t0 = h.now_us;
    let job = h.submit(retrying(1), array(1));
    h.run_until(t0 + 10_000);
    let busy = h.sched.job(long).unwrap().record(0).worker;
    let failed_on = h.sched.job(job).unwrap().record(0).worker;
    assert_ne!(busy, failed_on);
    assert_eq!(
        h.sched.job(job).unwrap().counts.ready,
        1,
        "failed, to retry"
    );
    h.run_until(t0 + backoff + elsewhere - 10_000);
    assert_eq!(h.attempts(job, 0), 1, "kept for the other worker");
    assert_eq!(h.sched.next_wakeup().map(|t| t > h.now_us), Some(true));
    h.run_until(t0 + backoff + elsewhere + 20_000);
    assert_eq!(h.attempts(job, 0), 2, "taken back where it failed");
    let j = h.sched.job(job).unwrap();
    assert_eq!(j.record(0).state, TaskState::Finished);
    assert_eq!(j.record(0).worker, failed_on);
    assert!(runs
        .borrow()
        .iter()
        .filter(|r| r.1 == job)
        .all(|r| r.0 == failed_on));
}

/// Alone, a worker takes its failed task's retry as soon as it is due.
#[test]
fn a_lone_worker_retries_at_once() {
    let config = Config::default();
    let backoff = config.retry_backoff_us;
    let (mut h, _) = logged(config, |_, _, attempt| SimRun {
        duration_us: 1_000,
        succeed: attempt > 1,
    });
    h.add_worker(1, 0);
    let t0 = h.now_us;
    let job = h.submit(retrying(1), array(1));
    h.run_until_idle();
    let done = h.sched.job(job).unwrap().finished_us.unwrap();
    assert!(done < t0 + backoff + 10_000, "{}", done - t0);
}

/// A task that fails wherever it runs is the task's fault: with retries sent elsewhere, every
/// failing point fails on several workers, and nobody is blamed.
#[test]
fn tasks_that_fail_everywhere_quarantine_no_one_even_with_a_fast_worker() {
    // Worker 1 is fast; every fifth task fails wherever it runs.
    let (mut h, _) = logged(Config::default(), |w, i, _| SimRun {
        duration_us: if w == 1 { 1_000 } else { 50_000 },
        succeed: i % 5 != 0,
    });
    for _ in 0..3 {
        h.add_worker(1, 1);
    }
    let job = h.submit(retrying(3), array(300));
    h.run_until_idle();
    let j = h.sched.job(job).unwrap();
    assert_eq!((j.counts.finished, j.counts.failed), (240, 60));
    assert!(h.sched.workers().all(|w| w.quarantined.is_none()));
}

/// A job that fails everywhere, retried: all its runs fail, nobody is blamed.
#[test]
fn a_job_failing_everywhere_with_retries_quarantines_no_one() {
    let (mut h, _) = logged(Config::default(), |w, _, _| SimRun {
        duration_us: if w == 1 { 1_000 } else { 100_000 },
        succeed: false,
    });
    for _ in 0..3 {
        h.add_worker(1, 1);
    }
    let job = h.submit(retrying(3), array(100));
    h.run_until_idle();
    assert_eq!(h.sched.job(job).unwrap().counts.failed, 100);
    assert!(h.sched.workers().all(|w| w.quarantined.is_none()));
}

/// Flaky tasks (a third of runs fail at random, wherever they run) blame nobody, over many
/// runs: the failures fall evenly, and their retries fail elsewhere as often.
#[test]
fn flaky_tasks_quarantine_no_one() {
    // A fixed pseudo-random draw per run (SplitMix64), so the test is the same every time.
    let draw = |i: TaskIndex, a: u32| {
        let mut z = (u64::from(i) << 32 | u64::from(a)).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % 3 == 0
    };
    let (mut h, _) = logged(Config::default(), move |w, i, a| SimRun {
        duration_us: 1_000 + u64::from(w) * 700,
        succeed: !draw(i, a),
    });
    for _ in 0..3 {
        h.add_worker(1, 1);
    }
    let job = h.submit(retrying(5), array(3_000));
    h.run_until_idle();
    let j = h.sched.job(job).unwrap();
    assert!(j.counts.finished > 2_900, "{:?}", j.counts);
    assert!(h.sched.workers().all(|w| w.quarantined.is_none()));
}
