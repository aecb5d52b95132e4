//! What the scheduler emits for its driver besides assignments: a record of every input it
//! took (and none of a refused or repeated one), and a `ForgetJob` only to the workers that
//! were sent the job's template.

mod common;

use common::{array, spec, staging_worker as worker, Events};
use kestrel_core::*;

fn success(job: JobId, index: TaskIndex) -> Finished {
    Finished {
        job,
        index,
        started_us: 10,
        finished_us: 20,
        end: RunEnd::Success,
    }
}

fn argvs(n: usize) -> Vec<Vec<String>> {
    (0..n).map(|i| vec!["echo".into(), i.to_string()]).collect()
}

#[test]
fn every_accepted_input_is_recorded_once() {
    let mut s = Scheduler::new(Config::default());
    let submit = Event::Submit {
        spec: Box::new(spec("list")),
        tasks: TaskSet::List(vec![]),
        open: true,
        key: Some("k1".into()),
    };
    let Ok(Reply::Submitted(job)) = s.handle(0, submit) else {
        panic!("submission refused")
    };
    assert_eq!(
        s.take_records(),
        vec![Record::Submitted {
            job,
            key: Some("k1".into())
        }]
    );

    s.extend(1, job, 0, argvs(2), false).unwrap();
    assert_eq!(
        s.take_records(),
        vec![Record::Extended {
            job,
            from: 0,
            close: false
        }]
    );
    // The same piece again (a client that reconnected) adds nothing and records nothing.
    s.extend(2, job, 0, argvs(2), false).unwrap();
    assert_eq!(s.take_records(), vec![]);
    // A piece that overlaps records only what it added; a refused one records nothing.
    s.extend(3, job, 1, argvs(3), false).unwrap();
    assert_eq!(
        s.take_records(),
        vec![Record::Extended {
            job,
            from: 2,
            close: false
        }]
    );
    assert!(s.extend(4, job, 9, argvs(1), false).is_err());
    assert_eq!(s.take_records(), vec![]);
    // Closing without new tasks is a change of its own.
    s.extend(5, job, 4, vec![], true).unwrap();
    assert_eq!(
        s.take_records(),
        vec![Record::Extended {
            job,
            from: 4,
            close: true
        }]
    );
    // So is a cancel; a second cancel changes nothing.
    s.cancel_job(6, job).unwrap();
    assert_eq!(s.take_records(), vec![Record::Canceled { job }]);
    s.cancel_job(7, job).unwrap();
    assert_eq!(s.take_records(), vec![]);
    // A retry of the canceled tasks, then a second one with nothing left to retry.
    assert_eq!(s.retry_job(job, false).unwrap(), (0, 4));
    assert_eq!(
        s.take_records(),
        vec![Record::Retried {
            job,
            failed_only: false
        }]
    );
    assert_eq!(s.retry_job(job, false).unwrap(), (0, 0));
    assert_eq!(s.take_records(), vec![]);
}

#[test]
fn ends_waits_and_forgets_are_recorded_in_order() {
    let mut s = Scheduler::new(Config::default());
    let w = worker(&mut s, 4);
    let job = s.submit(0, spec("a"), array(3), false).unwrap();
    s.take_records();
    s.schedule(1);
    s.take_commands();
    // An update with an end for a task the worker does not hold records only the others.
    let ignored = s.tasks_finished(
        2,
        w,
        vec![success(job, 0), success(job, 9), success(job, 1)],
    );
    assert_eq!(ignored, 1);
    s.add_slot_wait(job, 30);
    s.add_slot_wait(777, 30);
    assert_eq!(
        s.take_records(),
        vec![
            Record::Ended {
                ends: vec![success(job, 0), success(job, 1)]
            },
            Record::SlotWait { job, waited_us: 30 },
        ]
    );
    assert!(matches!(
        s.forget_job(job),
        Err(SchedError::NotEnded { left: 1, .. })
    ));
    s.task_finished(3, w, success(job, 2));
    s.take_records();
    s.forget_job(job).unwrap();
    assert_eq!(s.take_records(), vec![Record::Forgotten { job }]);
}

#[test]
fn only_workers_sent_a_template_are_told_to_forget_it() {
    let mut s = Scheduler::new(Config::default());
    let a = worker(&mut s, 1);
    let b = worker(&mut s, 1);
    let job = s.submit(0, spec("one"), array(1), false).unwrap();
    s.schedule(1);
    let defined: Vec<WorkerId> = s
        .take_commands()
        .into_iter()
        .filter_map(|c| match c {
            Command::DefineJob { worker, .. } => Some(worker),
            _ => None,
        })
        .collect();
    assert_eq!(defined.len(), 1, "one task, one worker");
    let holder = defined[0];
    let idle = if holder == a { b } else { a };
    s.task_finished(2, holder, success(job, 0));
    let commands = s.take_commands();
    assert!(commands.contains(&Command::JobDone { job }));
    assert!(commands.contains(&Command::ForgetJob {
        worker: holder,
        job
    }));
    assert!(!commands
        .iter()
        .any(|c| matches!(c, Command::ForgetJob { worker, .. } if *worker == idle)));
}

#[test]
fn a_resumed_worker_forgets_the_templates_of_jobs_that_ended_while_it_was_away() {
    let mut s = Scheduler::new(Config::default());
    let a = worker(&mut s, 2);
    let ended = s.submit(0, spec("ended"), array(1), false).unwrap();
    let live = s.submit(0, spec("live"), array(2), false).unwrap();
    s.schedule(1);
    s.take_commands();
    // The worker's connection drops; its tasks go elsewhere and one job ends meanwhile.
    s.worker_lost(2, a);
    let b = worker(&mut s, 4);
    s.schedule(3);
    s.take_commands();
    s.task_finished(4, b, success(ended, 0));
    s.take_commands();
    // It comes back still running one task of each job: the ended job's template goes at once,
    // the live job's when that job ends.
    let a2 = worker(&mut s, 2);
    s.worker_resumed(5, a2, None, vec![(ended, 0), (live, 0)], vec![]);
    let commands = s.take_commands();
    assert!(commands.contains(&Command::ForgetJob {
        worker: a2,
        job: ended
    }));
    assert!(!commands
        .iter()
        .any(|c| matches!(c, Command::ForgetJob { job, .. } if *job == live)));
    s.task_finished(6, b, success(live, 0));
    s.task_finished(6, b, success(live, 1));
    let commands = s.take_commands();
    assert!(commands.contains(&Command::ForgetJob {
        worker: a2,
        job: live
    }));
}

#[test]
fn records_swapped_into_a_driver_buffer_keep_their_order() {
    let mut s = Scheduler::new(Config::default());
    let a = s.submit(0, spec("a"), array(1), false).unwrap();
    let mut buf = Vec::new();
    s.swap_records(&mut buf);
    assert_eq!(buf, vec![Record::Submitted { job: a, key: None }]);
    // A buffer still holding records gets the new ones after them.
    let b = s.submit(0, spec("b"), array(1), false).unwrap();
    s.swap_records(&mut buf);
    assert_eq!(
        buf,
        vec![
            Record::Submitted { job: a, key: None },
            Record::Submitted { job: b, key: None }
        ]
    );
    buf.clear();
    s.swap_records(&mut buf);
    assert!(buf.is_empty() && s.take_records().is_empty());
}
