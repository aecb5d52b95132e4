//! Allocation queues with the `local` backend, end to end: the server starts workers while
//! work waits and lets them go, whole, once they idle.

mod common;

use common::*;
use serde_json::Value;
use std::time::Duration;

fn queues(c: &Cluster) -> Vec<Value> {
    let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    v["queues"].as_array().expect("queues").clone()
}

#[test]
fn a_local_queue_grows_under_a_backlog_runs_the_work_and_shrinks_to_nothing() {
    let c = Cluster::new();
    c.run(&[
        "alloc",
        "add",
        "local",
        "--time-limit",
        "10m",
        "--max-workers",
        "2",
        "--idle-timeout",
        "2s",
        "--acquire",
        "one",
        "--worker-args",
        "--slots 1",
    ])
    .ok();
    c.run(&["submit", "--array", "1-10", "--", "true"]).ok();
    c.run(&["job", "wait", "1"]).ok();
    // Every allocation ends once its worker has idled 2 s; none is left running.
    let allocs = poll("the allocations to end", Duration::from_secs(60), || {
        let q = queues(&c);
        let allocs = q[0]["allocations"].as_array().cloned().unwrap_or_default();
        let ended = !allocs.is_empty() && allocs.iter().all(|a| a["state"] == "finished");
        ended.then_some(allocs)
    });
    assert!(
        (1..=2).contains(&allocs.len()),
        "one worker per allocation, at most 2: {allocs:?}"
    );
    let workers = c.run(&["worker", "list", "--output", "json"]).ok().json();
    assert_eq!(workers["workers"].as_array().map(Vec::len), Some(0));
}

/// The one-line error of a command that must fail.
fn refused(c: &Cluster, args: &[&str]) -> String {
    c.run(args).failed().one_line_error().to_string()
}

#[test]
fn alloc_commands_refuse_what_cannot_work() {
    let c = Cluster::new();
    let err = refused(
        &c,
        &[
            "alloc",
            "add",
            "local",
            "--time-limit",
            "1h",
            "--backlog",
            "0",
        ],
    );
    assert!(err.contains("--backlog must be at least 1"), "{err}");
    let err = refused(&c, &["alloc", "add", "local", "--time-limit", "10s"]);
    assert!(err.contains("--time-limit must be at least 1m"), "{err}");
    let err = refused(&c, &["alloc", "pause", "9"]);
    assert!(err.contains("no allocation queue 9"), "{err}");
    let err = refused(
        &c,
        &[
            "alloc",
            "add",
            "local",
            "--time-limit",
            "1h",
            "--worker-args",
            "\"--slots",
        ],
    );
    assert!(err.contains("unbalanced quotes"), "{err}");
    let out = c.run(&["alloc", "list"]).ok().stdout.clone();
    assert!(out.contains("no allocation queues"), "{out}");
}
