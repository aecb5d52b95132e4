//! Memory and named countable resources (issue 10, "Resources"): tasks go only where what they
//! hold fits, and a job no worker can ever take says what is missing.

mod common;

use common::{spec, Events};
use kestrel_core::*;

fn worker(cpus: u32, mem: u64, named: &[(&str, u32)]) -> WorkerOffer {
    WorkerOffer {
        hostname: "w".into(),
        resources: Resources {
            cpus,
            mem,
            ..Resources::NONE
        },
        prefetch: 0,
        named: named.iter().map(|(n, a)| (n.to_string(), *a)).collect(),
        stages_files: true,
        runs_functions: false,
    }
}

const GIB: u64 = 1 << 30;

/// Tasks handed out in one scheduling pass, per worker.
fn assigned(s: &mut Scheduler) -> Vec<(WorkerId, u32)> {
    s.schedule(0);
    s.take_commands()
        .into_iter()
        .filter_map(|c| match c {
            Command::Assign { worker, runs } => Some((worker, runs.iter().map(|r| r.count).sum())),
            _ => None,
        })
        .collect()
}

#[test]
fn memory_bounds_how_many_tasks_a_worker_takes() {
    let mut s = Scheduler::new(Config::default());
    let w = s.worker_joined(0, worker(8, 10 * GIB, &[]));
    let mut big = spec("big");
    big.resources.mem = 3 * GIB;
    s.submit(0, big, TaskSet::Array(IdRanges::span(1, 10)), false)
        .unwrap();
    // 8 slots, but 10 GiB hold three tasks of 3 GiB.
    assert_eq!(assigned(&mut s), vec![(w, 3)]);
}

#[test]
fn named_resources_send_tasks_only_where_they_are() {
    let mut s = Scheduler::new(Config::default());
    let plain = s.worker_joined(0, worker(4, GIB, &[]));
    let licensed = s.worker_joined(0, worker(4, GIB, &[("licenses", 2)]));
    let mut lic = spec("lic");
    lic.named = vec![("licenses".into(), 1)];
    s.submit(0, lic, TaskSet::Array(IdRanges::span(1, 10)), false)
        .unwrap();
    let got = assigned(&mut s);
    assert_eq!(got, vec![(licensed, 2)], "two licenses, one per task");
    let _ = plain;
}

#[test]
fn a_job_needing_what_no_worker_has_says_what() {
    let mut s = Scheduler::new(Config::default());
    s.worker_joined(0, worker(4, 2 * GIB, &[("licenses", 1)]));
    let mut lic = spec("lic");
    lic.named = vec![("scratch".into(), 1)];
    let j = s
        .submit(0, lic, TaskSet::Array(IdRanges::span(1, 2)), false)
        .unwrap();
    assert_eq!(
        s.stall(j).unwrap().to_string(),
        "each task needs 1 scratch, which no worker offers; start a worker with `kestrel worker start --resource scratch=N` or cancel the job"
    );
    let mut mem = spec("mem");
    mem.resources.mem = 3 * GIB;
    let j = s
        .submit(0, mem, TaskSet::Array(IdRanges::span(1, 2)), false)
        .unwrap();
    assert_eq!(
        s.stall(j).unwrap().to_string(),
        "each task needs 3.0 GiB of memory, the largest worker has 2.0 GiB of memory; start a bigger worker or cancel the job"
    );
    // Each on some worker, but never all on one.
    s.worker_joined(0, worker(4, 4 * GIB, &[]));
    let mut both = spec("both");
    both.resources.mem = 3 * GIB;
    both.named = vec![("licenses".into(), 1)];
    let j = s
        .submit(0, both, TaskSet::Array(IdRanges::span(1, 2)), false)
        .unwrap();
    assert_eq!(
        s.stall(j).unwrap().to_string(),
        "each task needs 1 cpu and 3.0 GiB of memory and 1 licenses, and no worker has all of it; start a bigger worker or cancel the job"
    );
}

#[test]
fn a_server_tells_apart_a_bounded_number_of_names() {
    let mut s = Scheduler::new(Config::default());
    let mut many = spec("many");
    many.named = (0..MAX_NAMED).map(|i| (format!("r{i}"), 1)).collect();
    s.submit(0, many, TaskSet::Array(IdRanges::span(1, 1)), false)
        .unwrap();
    let mut one_more = spec("one more");
    one_more.named = vec![("extra".into(), 1)];
    let e = s
        .submit(0, one_more, TaskSet::Array(IdRanges::span(1, 1)), false)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("resource 'extra' would be the server's 9th name"),
        "{e}"
    );
}
