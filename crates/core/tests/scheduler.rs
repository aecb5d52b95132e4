//! The scheduler driven through the virtual-time harness: assignment, credits, retries,
//! worker loss, cancel, priorities and stale reports.

mod common;

use common::{array, spec, Events};
use kestrel_core::harness::{Harness, SimRun};
use kestrel_core::*;

fn finished(h: &Harness, job: JobId) -> Counts {
    h.sched.job(job).unwrap().counts
}

#[test]
fn every_task_runs_once_and_the_job_ends() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 10_000);
    let a = h.add_worker(2, 2);
    let b = h.add_worker(2, 2);
    let job = h.submit(spec("sweep"), array(1000));
    h.run_until_idle();
    let c = finished(&h, job);
    assert_eq!(c.finished, 1000);
    assert_eq!(c.total(), 1000);
    assert!(h.sched.job(job).unwrap().finished_us.is_some());
    assert!(h.commands.contains(&Command::JobDone { job }));
    for i in 0..1000 {
        assert_eq!(h.attempts(job, i), 1, "task index {i}");
    }
    // Both workers share the work about evenly.
    let (ra, rb) = (h.worker_runs(a), h.worker_runs(b));
    assert_eq!(ra + rb, 1000);
    assert!(ra.abs_diff(rb) <= 10, "{ra} vs {rb}");
    // The template is sent once per worker, before its first assignment.
    let defines = h
        .commands
        .iter()
        .filter(|c| matches!(c, Command::DefineJob { .. }))
        .count();
    assert_eq!(defines, 2);
}

#[test]
fn credits_bound_what_a_worker_holds_and_runs() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 1_000, 5_000);
    let w = h.add_worker(3, 2);
    h.submit(spec("a"), array(200));
    h.run_until_idle();
    let (held, running) = h.worker_peaks(w);
    assert_eq!(running, 3, "all slots busy at some point, never more");
    // Known to take 5 ms, the job's tasks go deeper than the worker's own prefetch of 2:
    // 100 ms of run time a slot is 20 each, 60 in all (under the 32 a cpu of a short job).
    assert_eq!(held, 3 + 60, "slots + prefetch outstanding, never more");
}

#[test]
fn prefetch_keeps_slots_busy_across_the_round_trip() {
    // Tasks of 1 ms, 1 ms one-way latency: without prefetch each slot idles 2 ms per task.
    let run = |prefetch| {
        let mut h = Harness::new(Scheduler::new(Config::default()), 1_000, 1_000);
        h.add_worker(2, prefetch);
        let job = h.submit(spec("a"), array(1000));
        h.run_until_idle();
        let j = h.sched.job(job).unwrap();
        j.finished_us.unwrap() - j.submitted_us
    };
    let without = run(0);
    let with = run(8);
    assert!(
        without > 1000 * 3 * 1_000 / 2 - 10_000,
        "without prefetch {without} us"
    );
    assert!(with < 1000 * 1_000 / 2 + 10_000, "with prefetch {with} us");
}

#[test]
fn failed_tasks_retry_up_to_their_count_then_fail_with_the_reason() {
    // Index 3 always fails; index 5 fails on its first attempt only.
    let mut h = Harness::with_model(
        Scheduler::new(Config::default()),
        10,
        move |_, i, attempt| SimRun {
            duration_us: 100,
            succeed: !(i == 3 || (i == 5 && attempt == 1)),
        },
    );
    h.add_worker(1, 1);
    let mut s = spec("flaky");
    s.retries = 2;
    let job = h.submit(s, array(10));
    h.run_until_idle();
    let j = h.sched.job(job).unwrap();
    assert_eq!(j.counts.finished, 9);
    assert_eq!(j.counts.failed, 1);
    assert_eq!(h.attempts(job, 3), 3, "1 run + 2 retries");
    assert_eq!(h.attempts(job, 5), 2);
    assert_eq!(j.record(3).state, TaskState::Failed);
    assert_eq!(j.failure(3).unwrap().reason, "exit code 1");
    assert!(j.finished_us.is_some());
}

#[test]
fn a_lost_worker_gives_its_tasks_back_without_spending_retries() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 50_000);
    let a = h.add_worker(2, 2);
    let job = h.submit(spec("a"), array(20));
    h.run_until(h.now_us + 10_000);
    assert_eq!(h.sched.worker(a).unwrap().outstanding(), 4);
    h.kill_worker(a);
    assert_eq!(finished(&h, job).ready, 20);
    let b = h.add_worker(2, 2);
    h.run_until_idle();
    let j = h.sched.job(job).unwrap();
    assert_eq!(j.counts.finished, 20);
    assert_eq!(h.worker_runs(b), 20);
    // Tasks 0 and 1 ran on the lost worker; 2 and 3 only waited there for a slot, so they
    // count no crash and no attempt.
    let lost: Vec<_> = (0..4).map(|i| j.record(i).lost).collect();
    assert_eq!(lost, vec![1, 1, 0, 0]);
    let runs: Vec<_> = (0..5).map(|i| j.record(i).runs).collect();
    assert_eq!(runs, vec![2, 2, 1, 1, 1]);
    assert!((0..20).all(|i| j.record(i).failures == 0));
}

#[test]
fn requeued_tasks_go_ahead_of_new_work() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 50_000);
    let a = h.add_worker(1, 0);
    let job = h.submit(spec("a"), array(5));
    h.run_until(h.now_us + 1_000);
    h.kill_worker(a);
    let b = h.add_worker(1, 0);
    h.run_until(h.now_us + 1_000);
    // The first task handed to the new worker is the one lost with the old.
    let first_to_b = h.commands.iter().find_map(|c| match c {
        Command::Assign { worker, runs } if *worker == b => Some(runs[0]),
        _ => None,
    });
    assert_eq!(
        first_to_b,
        Some(IndexRun {
            job,
            first: 0,
            count: 1
        })
    );
}

#[test]
fn a_silent_worker_is_lost_after_the_heartbeat_timeout() {
    let config = Config {
        heartbeat_timeout_us: 5_000_000,
        ..Config::default()
    };
    let mut h = Harness::new(Scheduler::new(config), 100, 60_000_000);
    let a = h.add_worker(1, 0);
    let job = h.submit(spec("a"), array(2));
    h.run_until(h.now_us + 1_000);
    h.freeze_worker(a);
    h.tick(4_000_000);
    assert!(h.sched.worker(a).is_some(), "not yet past the timeout");
    h.tick(2_000_000);
    assert!(h.sched.worker(a).is_none());
    assert!(h
        .commands
        .iter()
        .any(|c| matches!(c, Command::Disconnect { worker, .. } if *worker == a)));
    h.add_worker(1, 0);
    h.run_until_idle();
    assert_eq!(finished(&h, job).finished, 2);
}

#[test]
fn a_late_report_from_a_lost_worker_is_not_recorded_twice() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 1_000);
    let a = h.add_worker(1, 0);
    let job = h.submit(spec("a"), array(1));
    h.run_until(h.now_us + 150);
    h.sched.worker_lost(h.now_us, a);
    let b = h.add_worker(1, 0);
    h.run_until_idle();
    assert_eq!(finished(&h, job).finished, 1);
    let late = Finished {
        job,
        index: 0,
        started_us: 1,
        finished_us: 2,
        end: RunEnd::Success,
    };
    assert_eq!(
        h.sched.task_finished(h.now_us, a, late.clone()),
        Accepted::Ignored
    );
    assert_eq!(
        h.sched.task_finished(h.now_us, b, late),
        Accepted::Ignored,
        "duplicate"
    );
    assert_eq!(finished(&h, job).finished, 1);
}

/// Issue 29: `job cancel` counted the tasks waiting in a worker's prefetch window (sent ahead,
/// not started) as running.
#[test]
fn cancel_counts_prefetched_tasks_as_not_started() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 1_000_000);
    let w = h.add_worker(1, 2);
    let job = h.submit(spec("a"), array(10));
    h.run_until(h.now_us + 1_000);
    assert_eq!(
        h.sched.worker(w).unwrap().outstanding(),
        3,
        "one runs, two wait there"
    );
    assert_eq!(h.cancel(job), (9, 1));
    h.run_until_idle();
    assert_eq!(h.sched.job(job).unwrap().counts.canceled, 10);
}

#[test]
fn cancel_ends_queued_tasks_at_once_and_running_ones_through_their_worker() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 1_000_000);
    let w = h.add_worker(2, 0);
    let job = h.submit(spec("a"), array(100));
    h.run_until(h.now_us + 1_000);
    let (queued, running) = h.cancel(job);
    assert_eq!((queued, running), (98, 2));
    assert!(h.commands.iter().any(
        |c| matches!(c, Command::Cancel { worker, tasks } if *worker == w && tasks.len() == 2)
    ));
    h.run_until_idle();
    let j = h.sched.job(job).unwrap();
    assert_eq!(j.counts.canceled, 100);
    assert!(j.is_done());
    assert_eq!(j.record(50).state, TaskState::Canceled);
    assert_eq!(h.sched.queued(), 0);
    // A second job still runs on the freed worker.
    let next = h.submit(spec("b"), array(3));
    h.run_until_idle();
    assert_eq!(finished(&h, next).finished, 3);
}

#[test]
fn higher_priority_jobs_run_first() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 10, 100);
    let low = h.submit(spec("low"), array(50));
    let mut s = spec("high");
    s.priority = 10;
    let high = h.submit(s, array(50));
    h.add_worker(1, 0);
    h.run_until_idle();
    let last_high = h.sched.job(high).unwrap().finished_us.unwrap();
    let first_low = (0..50)
        .map(|i| h.sched.job(low).unwrap().record(i).started_us)
        .min()
        .unwrap();
    assert!(
        last_high <= first_low,
        "high ended {last_high}, low began {first_low}"
    );
}

#[test]
fn tasks_wait_for_a_worker_with_enough_resources() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 10, 100);
    let mut big = spec("big");
    big.resources = Resources {
        cpus: 4,
        gpus: 0,
        ..Resources::NONE
    };
    let big_job = h.submit(big, array(3));
    let small_job = h.submit(spec("small"), array(3));
    h.add_worker(2, 0);
    h.run_until_idle();
    assert_eq!(
        finished(&h, small_job).finished,
        3,
        "small tasks pass the big ones"
    );
    assert_eq!(finished(&h, big_job).ready, 3, "no worker fits them yet");
    let w = h.add_worker(4, 0);
    h.run_until_idle();
    assert_eq!(finished(&h, big_job).finished, 3);
    assert_eq!(h.worker_peaks(w).1, 1, "a 4-cpu task fills a 4-slot worker");
}

#[test]
fn a_queued_array_costs_no_per_task_memory() {
    let mut s = Scheduler::new(Config::default());
    let job = s.submit(1, spec("huge"), array(10_000_000), false).unwrap();
    assert_eq!(s.queued(), 10_000_000);
    let j = s.job(job).unwrap();
    assert_eq!(j.counts.ready, 10_000_000);
    assert_eq!(j.touched().count(), 0);
}

#[test]
fn open_list_jobs_take_more_tasks_until_closed() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 10, 100);
    h.add_worker(1, 1);
    let list = TaskSet::List(vec![vec!["echo".into(), "a".into()]]);
    let job = h.sched.submit(h.now_us, spec("l"), list, true).unwrap();
    h.pump();
    h.run_until_idle();
    assert!(!h.sched.job(job).unwrap().is_done(), "open job is not done");
    h.sched
        .extend(
            h.now_us,
            job,
            1,
            vec![vec!["echo".into(), "b".into()]],
            true,
        )
        .unwrap();
    h.pump();
    h.run_until_idle();
    let j = h.sched.job(job).unwrap();
    assert_eq!(j.counts.finished, 2);
    assert!(j.is_done());
    assert_eq!(j.task_argv(1).unwrap()[1], "b");
    assert_eq!(
        h.sched.extend(
            h.now_us,
            job,
            2,
            vec![vec!["echo".into(), "c".into()]],
            true
        ),
        Err(SchedError::JobClosed(job))
    );
    // The same piece sent again (a client retrying after a lost reply) changes nothing.
    h.sched
        .extend(
            h.now_us,
            job,
            1,
            vec![vec!["echo".into(), "b".into()]],
            true,
        )
        .unwrap();
    assert_eq!(h.sched.job(job).unwrap().len(), 2);
}

#[test]
fn a_resent_piece_of_an_open_job_adds_only_what_is_new() {
    let mut s = Scheduler::new(Config::default());
    let argv = |x: &str| vec!["echo".to_string(), x.to_string()];
    let list = TaskSet::List(vec![argv("a"), argv("b")]);
    let job = s.submit(0, spec("l"), list, true).unwrap();
    s.extend(0, job, 2, vec![argv("c"), argv("d")], false)
        .unwrap();
    // Resent with an overlap: only "e" is new.
    s.extend(0, job, 3, vec![argv("d"), argv("e")], false)
        .unwrap();
    assert_eq!(s.job(job).unwrap().len(), 5);
    assert_eq!(s.job(job).unwrap().task_argv(4).unwrap()[1], "e");
    assert_eq!(
        s.extend(0, job, 7, vec![argv("h")], true),
        Err(SchedError::ExtendGap { job, len: 5, at: 7 })
    );
    s.extend(0, job, 5, vec![], true).unwrap();
    assert!(!s.job(job).unwrap().open);
}

#[test]
fn invalid_submissions_are_refused() {
    let mut s = Scheduler::new(Config::default());
    let mut bad = spec("x");
    bad.resources.cpus = 0;
    assert!(matches!(
        s.submit(1, bad, array(1), false),
        Err(SchedError::Spec(SpecError::NoCpus))
    ));
    let mut nocmd = spec("x");
    nocmd.template.argv.clear();
    assert!(matches!(
        s.submit(1, nocmd, array(1), false),
        Err(SchedError::Spec(SpecError::NoCommand))
    ));
    let empty = TaskSet::List(vec![vec![]]);
    assert!(matches!(
        s.submit(1, spec("x"), empty, false),
        Err(SchedError::Spec(SpecError::EmptyTask(0)))
    ));
    let mut forever = spec("x");
    forever.retries = 300;
    let err = s.submit(1, forever, array(1), false).unwrap_err();
    assert_eq!(err, SchedError::Spec(SpecError::TooManyRetries(300)));
    assert!(err.to_string().contains("at most 254"), "{err}");
    assert_eq!(s.jobs().count(), 0);
}

#[test]
fn an_open_list_job_starting_empty_is_held_to_the_same_spec_limits() {
    let mut s = Scheduler::new(Config::default());
    let mut forever = spec("x");
    forever.retries = 300;
    assert_eq!(
        s.submit(1, forever, TaskSet::List(vec![]), true),
        Err(SchedError::Spec(SpecError::TooManyRetries(300)))
    );
    let mut nocpu = spec("x");
    nocpu.resources.cpus = 0;
    assert_eq!(
        s.submit(1, nocpu, TaskSet::List(vec![]), true),
        Err(SchedError::Spec(SpecError::NoCpus))
    );
    assert!(s.submit(1, spec("x"), TaskSet::List(vec![]), true).is_ok());
}

#[test]
fn an_undeliverable_task_fails_for_good_without_blaming_its_worker() {
    let mut s = Scheduler::new(Config::default());
    let mut sp = spec("x");
    sp.retries = 3;
    let job = s.submit(0, sp, array(2), false).unwrap();
    let w = s.worker_joined(
        0,
        WorkerOffer {
            hostname: "h".into(),
            resources: Resources {
                cpus: 2,
                gpus: 0,
                ..Resources::NONE
            },
            prefetch: 0,
            named: Vec::new(),
            stages_files: true,
            runs_functions: false,
        },
    );
    s.schedule(0);
    s.take_commands();
    assert_eq!(s.take_records(), vec![Record::Submitted { job, key: None }]);
    let failure = Failure {
        exit_code: None,
        signal: None,
        reason: "its command line is 17 MiB".into(),
        stderr_tail: String::new(),
        permanent: false,
    };
    s.task_undeliverable(5, w, job, 0, failure.clone());
    let j = s.job(job).unwrap();
    let state = j.record(0).state;
    assert_eq!(state, TaskState::Failed, "no retries spent on it");
    assert_eq!(j.failure(0), Some(&failure));
    assert_eq!(s.take_records(), vec![Record::GaveUp { job, index: 0 }]);
    let worker = s.worker(w).unwrap();
    assert_eq!((worker.tasks_failed, worker.used.cpus), (0, 1));
    assert!(worker.quarantined.is_none());
    // Reported again (or for a task it does not hold): ignored.
    s.task_undeliverable(6, w, job, 0, failure);
    assert!(s.take_records().is_empty());
}

#[test]
fn a_permanent_failure_spends_no_retries_and_blames_no_worker() {
    let mut s = Scheduler::new(Config::default());
    let mut sp = spec("x");
    sp.retries = 3;
    let job = s.submit(0, sp, array(1), false).unwrap();
    let offer = WorkerOffer {
        hostname: "h".into(),
        resources: Resources {
            cpus: 1,
            gpus: 0,
            ..Resources::NONE
        },
        prefetch: 0,
        named: Vec::new(),
        stages_files: true,
        runs_functions: false,
    };
    let w = s.worker_joined(0, offer);
    s.schedule(0);
    s.take_commands();
    let missing = Failure {
        permanent: true,
        ..Failure::because("input raw/7 not found in /store (not retried)")
    };
    let end = Finished {
        job,
        index: 0,
        started_us: 1,
        finished_us: 2,
        end: RunEnd::Failed(Box::new(missing.clone())),
    };
    s.handle(
        3,
        Event::TasksEnded {
            worker: w,
            ends: vec![end],
        },
    )
    .unwrap();
    let j = s.job(job).unwrap();
    assert_eq!(j.record(0).state, TaskState::Failed, "not queued again");
    assert_eq!(j.failure(0), Some(&missing));
    assert!(j.is_done());
    assert!(s.worker(w).unwrap().quarantined.is_none());
}

/// A worker that took 60,000 tasks through a window of 128, finishing them out of order and
/// holding on to some for the whole run, so its record of what it holds is pruned many times.
/// Returns the scheduler, the job, the worker and the tasks it still holds.
fn worker_with_long_held_tasks() -> (Scheduler, JobId, WorkerId, Vec<(JobId, TaskIndex)>) {
    let mut s = Scheduler::new(Config::default());
    let job = s.submit(0, spec("many"), array(60_000), false).unwrap();
    let offer = WorkerOffer {
        hostname: "h".into(),
        resources: Resources {
            cpus: 64,
            gpus: 0,
            ..Resources::NONE
        },
        prefetch: 64,
        named: Vec::new(),
        stages_files: true,
        runs_functions: false,
    };
    let w = s.worker_joined(0, offer);
    let mut kept = std::collections::BTreeSet::new();
    for now in 1.. {
        s.schedule(now);
        let mut handed: Vec<TaskIndex> = s
            .take_commands()
            .into_iter()
            .flat_map(|c| match c {
                Command::Assign { runs, .. } => runs
                    .into_iter()
                    .flat_map(|r| r.first..r.first + r.count)
                    .collect(),
                _ => Vec::new(),
            })
            .collect();
        if handed.is_empty() {
            break;
        }
        handed.reverse();
        for index in handed {
            if index % 1000 == 7 && kept.len() < 40 {
                kept.insert((job, index));
                continue;
            }
            let f = Finished {
                job,
                index,
                started_us: now,
                finished_us: now,
                end: RunEnd::Success,
            };
            assert_eq!(s.task_finished(now, w, f), Accepted::Recorded);
        }
    }
    assert_eq!(s.job(job).unwrap().counts.finished, 60_000 - 40);
    assert_eq!(s.worker(w).unwrap().outstanding(), 40);
    (s, job, w, kept.into_iter().collect())
}

#[test]
fn a_worker_lost_after_many_tasks_gives_back_exactly_the_tasks_it_held() {
    let (mut s, job, w, kept) = worker_with_long_held_tasks();
    s.worker_lost(1_000_000, w);
    let lost: Vec<_> = s
        .take_records()
        .into_iter()
        .flat_map(|r| match r {
            Record::Lost { tasks } => tasks,
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(lost, kept);
    assert_eq!(s.job(job).unwrap().counts.ready, 40);
}

#[test]
fn cancel_after_many_tasks_reaches_exactly_the_tasks_a_worker_holds() {
    let (mut s, job, w, kept) = worker_with_long_held_tasks();
    // Held, never reported started: they wait on the worker, counted with the queued.
    assert_eq!(s.cancel_job(1_000_000, job), Ok((40, 0)));
    let canceled: Vec<_> = s
        .take_commands()
        .into_iter()
        .flat_map(|c| match c {
            Command::Cancel { worker, tasks } if worker == w => tasks,
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(canceled, kept);
}

/// Forgetting: refused while a job has work left; afterwards the job is gone without
/// disturbing ids, the queue or other jobs.
#[test]
fn only_an_ended_job_is_forgotten_and_its_id_is_not_reused() {
    let mut h = Harness::new(Scheduler::new(Config::default()), 100, 10_000);
    let done = h.submit(spec("t"), array(10));
    h.add_worker(2, 2);
    h.run_until_idle();
    assert!(h.sched.job(done).unwrap().is_done());
    // A job nobody runs yet is refused, saying how many tasks are left and what to do.
    let waiting = h.submit(spec("t"), array(5));
    let canceled = h.submit(spec("t"), array(1_000_000));
    let e = h.sched.forget_job(waiting).unwrap_err();
    assert_eq!(
        e,
        SchedError::NotEnded {
            job: waiting,
            left: 5
        }
    );
    assert!(e.to_string().contains("kestrel job cancel"), "{e}");

    h.sched.forget_job(done).unwrap();
    assert!(h.sched.job(done).is_none());
    assert_eq!(
        h.sched.forget_job(done),
        Err(SchedError::NoSuchJob(done)),
        "forgetting twice"
    );
    // A canceled job has ended too; its queue entries go with it.
    h.cancel(canceled);
    h.sched.forget_job(canceled).unwrap();
    let waiting_ready = h.sched.job(waiting).unwrap().counts.ready;
    assert_eq!(
        h.sched.queued(),
        u64::from(waiting_ready),
        "only the waiting job's tasks are queued"
    );
    assert_eq!(h.sched.live_jobs(), 1);
    let next = h.submit(spec("t"), array(1));
    assert!(next > canceled, "ids are never reused: {next}");
    h.run_until_idle();
    assert!(h.sched.job(waiting).unwrap().is_done());
    assert!(h.sched.job(next).unwrap().is_done());
}
