//! Replaying a scheduler's accepted inputs into a fresh one gives back the same jobs: finished
//! tasks keep their results, unfinished ones are ready again, canceled jobs stay canceled.

mod common;

use common::{array, Events};
use kestrel_core::*;

fn spec(name: &str, retries: u32) -> JobSpec {
    JobSpec {
        retries,
        ..common::spec(name)
    }
}

fn failure() -> RunEnd {
    RunEnd::Failed(Box::new(Failure {
        exit_code: Some(3),
        signal: None,
        reason: "exit code 3".into(),
        stderr_tail: "boom".into(),
        permanent: false,
    }))
}

/// What a journal would hold, in order.
// Test data, a few entries: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Entry {
    Submit(JobId, u64, JobSpec, TaskSet),
    Cancel(JobId, u64),
    End(Finished, u64),
}

/// Assigned tasks per command, in order.
fn assigned(s: &mut Scheduler) -> Vec<(JobId, TaskIndex)> {
    s.take_commands()
        .into_iter()
        .flat_map(|c| match c {
            Command::Assign { runs, .. } => runs
                .into_iter()
                .flat_map(|r| (r.first..r.first + r.count).map(move |i| (r.job, i)))
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

fn end(s: &mut Scheduler, log: &mut Vec<Entry>, w: WorkerId, job: JobId, index: u32, e: RunEnd) {
    let f = Finished {
        job,
        index,
        started_us: 1000 + index as u64,
        finished_us: 2000 + index as u64,
        end: e,
    };
    let assigned_us = s.job(job).unwrap().record(index).assigned_us;
    assert_eq!(s.task_finished(3000, w, f.clone()), Accepted::Recorded);
    log.push(Entry::End(f, assigned_us));
}

#[test]
fn replay_restores_results_and_requeues_the_rest() {
    let mut a = Scheduler::new(Config::default());
    let mut log = Vec::new();
    let sweep = a.submit(10, spec("sweep", 1), array(10), false).unwrap();
    log.push(Entry::Submit(sweep, 10, spec("sweep", 1), array(10)));
    let doomed = a.submit(20, spec("doomed", 0), array(4), false).unwrap();
    log.push(Entry::Submit(doomed, 20, spec("doomed", 0), array(4)));
    let w = a.worker_joined(
        100,
        WorkerOffer {
            hostname: "h".into(),
            resources: Resources {
                cpus: 8,
                gpus: 0,
                ..Resources::NONE
            },
            prefetch: 0,
            named: Vec::new(),
            stages_files: true,
            runs_functions: false,
        },
    );
    a.schedule(500);
    assert_eq!(assigned(&mut a).len(), 8);
    // sweep: 0..4 succeed, 4 fails once (a retry remains), 5 fails once; 6 and 7 still run.
    for i in 0..4 {
        end(&mut a, &mut log, w, sweep, i, RunEnd::Success);
    }
    end(&mut a, &mut log, w, sweep, 4, failure());
    // After the retry backoff (0.5 s) the task is queued again.
    a.schedule(600_000);
    let again = assigned(&mut a);
    assert!(again.contains(&(sweep, 4)), "{again:?}");
    end(&mut a, &mut log, w, sweep, 4, failure());
    a.cancel_job(700_000, doomed).unwrap();
    log.push(Entry::Cancel(doomed, 700_000));

    // Replay into a fresh scheduler (no workers: a restart).
    let mut b = Scheduler::new(Config::default());
    for e in log {
        match e {
            Entry::Submit(id, at, spec, tasks) => {
                b.restore_submit(id, at, spec, tasks, false).unwrap()
            }
            Entry::Cancel(id, at) => {
                b.cancel_job(at, id).unwrap();
            }
            Entry::End(f, assigned_us) => b.restore_task_end(f, assigned_us),
        }
    }
    b.restore_done();
    assert!(b.take_commands().is_empty());

    let j = b.job(sweep).unwrap();
    assert_eq!(j.counts.finished, 4);
    assert_eq!(j.counts.failed, 1);
    assert_eq!(j.counts.ready, 5);
    let r = j.record(2);
    assert_eq!(r.state, TaskState::Finished);
    assert_eq!(
        (r.assigned_us, r.started_us, r.finished_us),
        (500, 1002, 2002)
    );
    assert_eq!(j.timing().tasks, 4);
    assert_eq!(j.record(4).state, TaskState::Failed);
    assert_eq!(j.record(4).failures, 2);
    assert_eq!(j.failure(4).unwrap().reason, "exit code 3");
    assert_eq!(j.submitted_us, 10);
    let d = b.job(doomed).unwrap();
    assert!(d.canceled && d.is_done());
    assert_eq!(d.counts.canceled, 4);

    // Ids continue after the highest restored one.
    assert_eq!(b.submit(800, spec("next", 0), array(1), false).unwrap(), 3);
    // A new worker gets exactly the unfinished tasks of the sweep, and the new job's.
    let w2 = b.worker_joined(
        900,
        WorkerOffer {
            hostname: "h2".into(),
            resources: Resources {
                cpus: 64,
                gpus: 0,
                ..Resources::NONE
            },
            prefetch: 0,
            named: Vec::new(),
            stages_files: true,
            runs_functions: false,
        },
    );
    b.schedule(1000);
    let got = assigned(&mut b);
    let want: Vec<(JobId, TaskIndex)> = (5..10).map(|i| (sweep, i)).chain([(3, 0)]).collect();
    assert_eq!(got, want);
    for (job, i) in got {
        let f = Finished {
            job,
            index: i,
            started_us: 1,
            finished_us: 2,
            end: RunEnd::Success,
        };
        assert_eq!(b.task_finished(1100, w2, f), Accepted::Recorded);
    }
    assert!(b.job(sweep).unwrap().is_done());
    assert_eq!(b.job(sweep).unwrap().counts.finished, 9);
}

#[test]
fn a_report_after_cancel_moves_a_task_out_of_canceled() {
    // Running tasks of a canceled job may still end in success; replay keeps counts consistent.
    let mut b = Scheduler::new(Config::default());
    b.restore_submit(7, 0, spec("c", 0), array(3), false)
        .unwrap();
    b.cancel_job(5, 7).unwrap();
    b.restore_task_end(
        Finished {
            job: 7,
            index: 1,
            started_us: 1,
            finished_us: 9,
            end: RunEnd::Success,
        },
        1,
    );
    // A duplicate report for an ended task changes nothing.
    b.restore_task_end(
        Finished {
            job: 7,
            index: 1,
            started_us: 1,
            finished_us: 9,
            end: failure(),
        },
        1,
    );
    b.restore_done();
    let c = b.job(7).unwrap().counts;
    assert_eq!((c.finished, c.canceled, c.ready, c.failed), (1, 2, 0, 0));
    assert_eq!(b.queued(), 0);
    assert_eq!(b.submit(10, spec("n", 0), array(1), false).unwrap(), 8);
}

fn offer(cpus: u32) -> WorkerOffer {
    WorkerOffer {
        hostname: "h".into(),
        resources: Resources {
            cpus,
            gpus: 0,
            ..Resources::NONE
        },
        prefetch: 0,
        named: Vec::new(),
        stages_files: true,
        runs_functions: false,
    }
}

/// The tasks a `Lost` record counted a crash for.
fn lost(s: &mut Scheduler) -> Vec<(JobId, TaskIndex)> {
    s.take_records()
        .into_iter()
        .flat_map(|c| match c {
            Record::Lost { tasks } => tasks,
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn crash_counts_survive_a_replay_and_still_stop_a_worker_killer() {
    let config = Config {
        max_crashes: 3,
        ..Config::default()
    };
    let mut a = Scheduler::new(config.clone());
    let job = a.submit(0, spec("killer", 0), array(2), false).unwrap();
    // Task 0 is on two workers that die; each loss counts a crash and says so.
    let mut counted = Vec::new();
    for t in 0..2 {
        let w = a.worker_joined(t, offer(1));
        a.schedule(t);
        assert_eq!(assigned(&mut a), vec![(job, 0)]);
        a.worker_lost(t, w);
        counted.push(lost(&mut a));
    }
    assert_eq!(counted, vec![vec![(job, 0)], vec![(job, 0)]]);
    assert_eq!(a.job(job).unwrap().record(0).lost, 2);

    // A restart replays the counts: the third loss is the last.
    let mut b = Scheduler::new(config);
    b.restore_submit(job, 0, spec("killer", 0), array(2), false)
        .unwrap();
    for tasks in &counted {
        b.restore_lost(tasks);
    }
    b.restore_done();
    assert_eq!(b.job(job).unwrap().record(0).lost, 2);
    let w = b.worker_joined(10, offer(1));
    b.schedule(10);
    assert_eq!(assigned(&mut b), vec![(job, 0)], "re-run tasks go first");
    b.worker_lost(10, w);
    // Given up, not counted again: the driver journals exactly that.
    assert_eq!(b.take_records(), vec![Record::GaveUp { job, index: 0 }]);
    let j = b.job(job).unwrap();
    assert_eq!(j.record(0).state, TaskState::Failed);
    assert_eq!(
        j.failure(0).map(|f| f.reason.as_str()),
        Some("lost with 3 workers (it may kill its worker)")
    );
}

#[test]
fn single_tasks_canceled_end_at_once_or_on_their_worker_and_replay_so() {
    let mut a = Scheduler::new(Config::default());
    let w = a.worker_joined(
        0,
        WorkerOffer {
            prefetch: 0,
            ..common::offer(false, false)
        },
    );
    let job = a.submit(10, spec("map", 0), array(6), false).unwrap();
    a.take_records();
    a.schedule(20);
    // Two run on the worker's two slots; four are queued.
    assert_eq!(assigned(&mut a), vec![(job, 0), (job, 1)]);
    a.task_started(w, job, 1, 30);
    let reply = a
        .call(
            40,
            Event::CancelTasks {
                job,
                indices: vec![1, 3, 4, 99, 3],
            },
        )
        .unwrap();
    assert_eq!(
        reply,
        Reply::Canceled {
            queued: 2,
            running: 1
        }
    );
    // The queued ones ended now, as canceled ends; the running one is its worker's to end.
    let records = a.take_records();
    let ended: Vec<(TaskIndex, RunEnd)> = records
        .iter()
        .flat_map(|r| match r {
            Record::Ended { ends } => ends.iter().map(|f| (f.index, f.end.clone())).collect(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(ended, vec![(3, RunEnd::Canceled), (4, RunEnd::Canceled)]);
    let cancels: Vec<_> = a
        .take_commands()
        .into_iter()
        .filter_map(|c| match c {
            Command::Cancel { worker, tasks } => Some((worker, tasks)),
            _ => None,
        })
        .collect();
    assert_eq!(cancels, vec![(w, vec![(job, 1)])]);
    // The others run on: the canceled queued ones are passed over.
    a.task_finished(50, w, Finished::at_once(job, 0, 50, RunEnd::Success));
    a.task_finished(50, w, Finished::at_once(job, 1, 50, RunEnd::Canceled));
    a.schedule(60);
    assert_eq!(assigned(&mut a), vec![(job, 2), (job, 5)]);
    a.task_finished(70, w, Finished::at_once(job, 2, 70, RunEnd::Success));
    a.task_finished(70, w, Finished::at_once(job, 5, 70, RunEnd::Success));
    let j = a.job(job).unwrap();
    assert!(j.is_done());
    assert_eq!((j.counts.finished, j.counts.canceled), (3, 3));
    assert!(a.audit().is_empty(), "{:?}", a.audit());

    // A restart replays the canceled ends: the same tasks are canceled, none is queued.
    let mut b = Scheduler::new(Config::default());
    b.restore_submit(job, 10, spec("map", 0), array(6), false)
        .unwrap();
    for (index, end) in ended {
        b.restore_task_end(Finished::at_once(job, index, 40, end), 0);
    }
    b.restore_done();
    let j = b.job(job).unwrap();
    assert_eq!((j.counts.canceled, j.counts.ready), (2, 4));
    assert_eq!(j.record(3).state, TaskState::Canceled);
}
