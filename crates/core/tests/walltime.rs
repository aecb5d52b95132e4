//! Workers whose allocation ends: a task is started only if it can end before then.

mod common;

use common::{array, spec, staging_worker, Events};
use kestrel_core::*;

const S: u64 = 1_000_000;

/// The tasks assigned by one scheduling pass at `now`, as (worker, job, count).
fn assigned(s: &mut Scheduler, now: u64) -> Vec<(WorkerId, JobId, u32)> {
    s.handle(now, Event::Schedule).unwrap();
    s.take_commands()
        .into_iter()
        .flat_map(|c| match c {
            Command::Assign { worker, runs } => runs
                .into_iter()
                .map(|r| (worker, r.job, r.count))
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect()
}

fn timed(name: &str, secs: u64) -> JobSpec {
    let mut sp = spec(name);
    sp.template.timeout_ms = Some(secs * 1000);
    sp
}

#[test]
fn a_task_declared_at_30_s_is_not_started_on_a_worker_with_20_s_left() {
    let mut s = Scheduler::new(Config::default());
    let short = staging_worker(&mut s, 1);
    let long = staging_worker(&mut s, 1);
    let now = 100 * S;
    // `short` ends in 20 s plus the margin, `long` in an hour.
    s.handle(
        0,
        Event::WorkerEnds {
            worker: short,
            at_us: now + 20 * S + END_MARGIN_US,
        },
    )
    .unwrap();
    s.handle(
        0,
        Event::WorkerEnds {
            worker: long,
            at_us: now + 3600 * S,
        },
    )
    .unwrap();
    let job = s.submit(now, timed("thirty", 30), array(2), false).unwrap();
    let got = assigned(&mut s, now);
    assert_eq!(
        got,
        vec![(long, job, 1)],
        "only the worker with time left takes one"
    );
    // A 10 s task fits where 30 s did not.
    let quick = s.submit(now, timed("ten", 10), array(1), false).unwrap();
    assert_eq!(assigned(&mut s, now), vec![(short, quick, 1)]);
}

#[test]
fn a_worker_near_its_end_takes_no_task_that_declares_no_length() {
    let mut s = Scheduler::new(Config::default());
    let w = staging_worker(&mut s, 2);
    s.handle(
        0,
        Event::WorkerEnds {
            worker: w,
            at_us: 100 * S,
        },
    )
    .unwrap();
    let job = s.submit(0, spec("plain"), array(3), false).unwrap();
    // Long before the end it runs them.
    assert_eq!(assigned(&mut s, 0), vec![(w, job, 2)]);
    // Within the margin of its end it drains: the third waits for another worker.
    let ends = vec![Finished::at_once(
        job,
        0,
        100 * S - END_MARGIN_US + 1,
        RunEnd::Success,
    )];
    s.handle(
        100 * S - END_MARGIN_US + 1,
        Event::TasksEnded { worker: w, ends },
    )
    .unwrap();
    assert!(assigned(&mut s, 100 * S - END_MARGIN_US + 1).is_empty());
    let other = staging_worker(&mut s, 1);
    assert_eq!(
        assigned(&mut s, 100 * S - END_MARGIN_US + 2),
        vec![(other, job, 1)]
    );
}

#[test]
fn a_worker_with_no_end_takes_anything() {
    let mut s = Scheduler::new(Config::default());
    let w = staging_worker(&mut s, 1);
    let job = s.submit(0, timed("day", 86_400), array(1), false).unwrap();
    assert_eq!(assigned(&mut s, 0), vec![(w, job, 1)]);
    assert!(s
        .handle(
            0,
            Event::WorkerEnds {
                worker: 99,
                at_us: 0
            }
        )
        .is_err());
}

#[test]
fn a_worker_entering_its_end_margin_gives_back_the_tasks_waiting_there() {
    let mut s = Scheduler::new(Config::default());
    // One slot and one task's prefetch: a second task waits there for the slot.
    let w = s.worker_joined(
        0,
        WorkerOffer {
            hostname: "w".into(),
            resources: Resources {
                cpus: 1,
                ..Resources::NONE
            },
            prefetch: 1,
            named: vec![],
            stages_files: true,
            runs_functions: false,
        },
    );
    s.handle(
        0,
        Event::WorkerEnds {
            worker: w,
            at_us: 100 * S,
        },
    )
    .unwrap();
    let job = s.submit(0, spec("plain"), array(2), false).unwrap();
    assert_eq!(assigned(&mut s, 0), vec![(w, job, 2)]);
    let started = vec![Started {
        job,
        index: 0,
        at_us: S,
    }];
    s.handle(S, Event::TasksStarted { worker: w, started })
        .unwrap();
    let revokes = |s: &mut Scheduler, now: u64| {
        s.handle(now, Event::Schedule).unwrap();
        s.take_commands()
            .into_iter()
            .filter_map(|c| match c {
                Command::Revoke { worker, tasks } => Some((worker, tasks)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    // Before the margin nothing is asked back.
    assert!(revokes(&mut s, 2 * S).is_empty());
    // Within it, the waiting task is; the running one stays to finish.
    let at = 100 * S - END_MARGIN_US + 1;
    assert_eq!(revokes(&mut s, at), vec![(w, vec![(job, 1)])]);
    // Given back, it goes to another worker, counting no attempt.
    s.handle(
        at,
        Event::TasksRevoked {
            worker: w,
            tasks: vec![(job, 1)],
        },
    )
    .unwrap();
    let other = staging_worker(&mut s, 1);
    assert_eq!(assigned(&mut s, at + 1), vec![(other, job, 1)]);
}

#[test]
fn work_packs_onto_the_fewest_allocations_so_the_others_can_idle_out() {
    let mut s = Scheduler::new(Config::default());
    let fixed = staging_worker(&mut s, 2);
    let older = staging_worker(&mut s, 2);
    let newer = staging_worker(&mut s, 2);
    for (worker, hours) in [(older, 1), (newer, 2)] {
        let at_us = hours * 3600 * S;
        s.handle(0, Event::WorkerEnds { worker, at_us }).unwrap();
    }
    // Stage after stage of three tasks: the worker that costs nothing more to keep fills
    // first, then the allocation with the most time left; the older one never gets a task
    // (spread by the policy's rotation, every stage kept every allocation busy).
    let mut now = S;
    for stage in 0..6 {
        let job = s
            .submit(now, spec(&format!("stage-{stage}")), array(3), false)
            .unwrap();
        let mut got = assigned(&mut s, now);
        got.sort_unstable();
        let mut want = vec![(fixed, job, 2), (newer, job, 1)];
        want.sort_unstable();
        assert_eq!(got, want, "stage {stage}");
        now += S;
        for (worker, index) in [(fixed, 0), (fixed, 1), (newer, 2)] {
            let ends = vec![Finished::at_once(job, index, now, RunEnd::Success)];
            s.handle(now, Event::TasksEnded { worker, ends }).unwrap();
        }
    }
    // With more work than the others hold, the older allocation takes its share.
    let job = s.submit(now, spec("wide"), array(6), false).unwrap();
    let mut got = assigned(&mut s, now);
    got.sort_unstable();
    let mut want = vec![(fixed, job, 2), (older, job, 2), (newer, job, 2)];
    want.sort_unstable();
    assert_eq!(got, want);
}
