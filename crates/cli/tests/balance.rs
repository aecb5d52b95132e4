//! Where tasks run, with a real server and workers on loopback: a worker keeps the tasks that
//! wait behind its running ones ready to start the moment a slot frees, yet a worker that
//! joins later takes them (issue 10, defect 3), and canceling them means they never start.

mod common;

use common::*;
use serde_json::Value;
use std::fs;

/// A task that appends its id to `ran` and then waits for the file `release` (at most a
/// minute, so a failed test leaves nothing behind).
const HELD_TASK: &str =
    "echo {task} >> ran; for i in $(seq 600); do [ -e release ] && exit 0; sleep 0.1; done; exit 1";

fn rows_in(c: &Cluster, state: &str) -> Vec<Value> {
    task_rows(c, "1")
        .into_iter()
        .filter(|r| r["state"] == state)
        .collect()
}

/// Ids of the tasks that started, from the `ran` file.
fn ran(c: &Cluster) -> Vec<u32> {
    let mut ids: Vec<u32> = c
        .read("ran")
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().expect("task id"))
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn a_worker_that_joins_late_takes_the_tasks_waiting_behind_a_busy_one() {
    let mut c = Cluster::with_workers(&[2]);
    c.run(&["submit", "--array", "1-4", "--", "sh", "-c", HELD_TASK])
        .ok();
    poll("two tasks to run on the first worker", STARTUP, || {
        (rows_in(&c, "running").len() == 2).then_some(())
    });
    c.add_worker(2);
    c.wait_workers(2);
    let rows = poll("all four tasks to run", COMMAND_LIMIT, || {
        let rows = rows_in(&c, "running");
        (rows.len() == 4).then_some(rows)
    });
    let on_second = rows.iter().filter(|r| r["worker"] == 2).count();
    assert_eq!(on_second, 2, "the second worker runs two: {rows:#?}");
    fs::write(c.path("release"), "").unwrap();
    c.run(&["job", "wait", "1", "--quiet"]).ok();
    assert_eq!(ran(&c), vec![1, 2, 3, 4]);
}

#[test]
fn canceled_tasks_waiting_behind_running_ones_never_start() {
    let c = Cluster::with_workers(&[2]);
    c.run(&["submit", "--array", "1-6", "--", "sh", "-c", HELD_TASK])
        .ok();
    poll("two tasks to run", STARTUP, || {
        (rows_in(&c, "running").len() == 2).then_some(())
    });
    c.run(&["job", "cancel", "1"]).ok();
    let wait = c.run(&["job", "wait", "1", "--quiet"]);
    assert_eq!(wait.code(), Some(1), "{wait:#?}");
    assert_eq!(rows_in(&c, "canceled").len(), 6);
    assert_eq!(ran(&c), vec![1, 2], "only the running tasks started");
    // Every slot was given back: a new job runs on both.
    fs::write(c.path("release"), "").unwrap();
    c.run(&["submit", "--array", "1-4", "--wait", "--", "true"])
        .ok();
}
