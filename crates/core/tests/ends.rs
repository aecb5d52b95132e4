//! A worker's update applied at once (`Scheduler::tasks_finished`, the server's path) leaves
//! exactly the state that applying its ends one by one (`Scheduler::task_finished`) leaves:
//! the batch only looks the job and the worker up less often.

mod common;

use common::{array, spec, Events};
use kestrel_core::*;
use proptest::prelude::*;

const TASKS: u32 = 12;

/// Two jobs (the second retries once) assigned to two workers, with quarantine on and a short
/// backoff, so a batch meets every kind of end: successes, failures that retry or not, stale
/// reports and reports from the wrong worker.
fn assigned() -> (Scheduler, [WorkerId; 2], [JobId; 2]) {
    let config = Config {
        quarantine_failures: 2,
        retry_backoff_us: 0,
        ..Config::default()
    };
    let mut s = Scheduler::new(config);
    let offer = || WorkerOffer {
        hostname: "w".into(),
        resources: Resources {
            cpus: 4,
            ..Resources::NONE
        },
        prefetch: 8,
        named: Vec::new(),
        stages_files: true,
        runs_functions: false,
    };
    let a = s.worker_joined(0, offer());
    let b = s.worker_joined(0, offer());
    let j1 = s.submit(0, spec("one"), array(TASKS), false).unwrap();
    let mut retried = spec("two");
    retried.retries = 1;
    let j2 = s.submit(0, retried, array(TASKS), false).unwrap();
    s.schedule(1);
    s.take_commands();
    (s, [a, b], [j1, j2])
}

/// One reported end: which job (the third is unknown to the scheduler) and task (one past
/// the last too), and how it ended (0 success, 1 failure, 2 canceled).
fn end_strategy() -> impl Strategy<Value = (usize, u32, u8)> {
    (0..3usize, 0..TASKS + 1, 0..3u8)
}

fn finished(job: JobId, index: u32, kind: u8, at: u64) -> Finished {
    let end = match kind {
        0 => RunEnd::Success,
        1 => RunEnd::Failed(Box::new(Failure {
            exit_code: Some(3),
            signal: None,
            reason: "exit code 3".into(),
            stderr_tail: String::new(),
            permanent: false,
        })),
        _ => RunEnd::Canceled,
    };
    Finished {
        job,
        index,
        started_us: at,
        finished_us: at + 10 + u64::from(index),
        end,
    }
}

/// The ends the records say were taken, in order (the batch records an update's at once, one
/// by one records each alone), and the other records.
fn taken(records: Vec<Record>) -> (Vec<Finished>, Vec<Record>) {
    let mut ends = Vec::new();
    let mut rest = Vec::new();
    for r in records {
        match r {
            Record::Ended { ends: some } => ends.extend(some),
            other => rest.push(other),
        }
    }
    (ends, rest)
}

/// What the two ways must agree on.
fn state(s: &Scheduler, jobs: [JobId; 2]) -> String {
    let mut out = String::new();
    for id in jobs {
        let j = s.job(id).unwrap();
        out += &format!(
            "job {id}: {:?} done at {:?} mean {:?}\n",
            j.counts, j.finished_us, j.mean_run_us
        );
        for i in 0..j.len() {
            out += &format!("  {i}: {:?} {:?}\n", j.record(i), j.failure(i));
        }
    }
    for w in s.workers() {
        out += &format!(
            "worker {}: {} ok {} failed, holds {}, {:?}, quarantined {:?}\n",
            w.id,
            w.tasks_finished,
            w.tasks_failed,
            w.outstanding(),
            w.used,
            w.quarantined
        );
    }
    out
}

proptest! {
    #[test]
    fn a_batch_of_ends_leaves_what_one_by_one_leaves(
        updates in prop::collection::vec(
            (0..2usize, prop::collection::vec(end_strategy(), 0..16)),
            1..6,
        )
    ) {
        let (mut one, workers, jobs) = assigned();
        let (mut batch, _, _) = assigned();
        let mut at = 100;
        for (w, ends) in updates {
            let worker = workers[w];
            let ends: Vec<Finished> = ends
                .into_iter()
                .map(|(j, index, kind)| {
                    at += 7;
                    finished(jobs.get(j).copied().unwrap_or(999), index, kind, at)
                })
                .collect();
            let mut ignored_one = 0;
            for f in ends.clone() {
                if one.task_finished(at, worker, f) == Accepted::Ignored {
                    ignored_one += 1;
                }
            }
            let ignored_batch = batch.tasks_finished(at, worker, ends);
            prop_assert_eq!(ignored_one, ignored_batch);
            prop_assert_eq!(one.take_commands(), batch.take_commands());
            // The same ends taken, in the same order, and the same other records.
            prop_assert_eq!(taken(one.take_records()), taken(batch.take_records()));
            prop_assert_eq!(state(&one, jobs), state(&batch, jobs));
            // Requeued tasks go out again the same way.
            one.schedule(at);
            batch.schedule(at);
            prop_assert_eq!(one.take_commands(), batch.take_commands());
        }
        // Then every task succeeds wherever it is, until both jobs end.
        for _ in 0..4 {
            for worker in workers {
                at += 7;
                let all: Vec<Finished> = jobs
                    .iter()
                    .flat_map(|&job| (0..TASKS).map(move |i| finished(job, i, 0, at)))
                    .collect();
                for f in all.clone() {
                    one.task_finished(at, worker, f);
                }
                batch.tasks_finished(at, worker, all);
                prop_assert_eq!(one.take_commands(), batch.take_commands());
                prop_assert_eq!(taken(one.take_records()), taken(batch.take_records()));
                prop_assert_eq!(state(&one, jobs), state(&batch, jobs));
                one.schedule(at);
                batch.schedule(at);
                prop_assert_eq!(one.take_commands(), batch.take_commands());
            }
        }
        for job in jobs {
            prop_assert!(batch.job(job).unwrap().is_done(), "{}", state(&batch, jobs));
        }
    }
}
