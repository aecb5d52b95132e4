//! Failure policy with a real server and workers on loopback: job retry, retry backoff,
//! quarantine and resume, and a worker cut off (SIGSTOP) past the heartbeat timeout whose late
//! results must not be recorded twice.

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

fn counts(c: &Cluster, job: &str) -> Value {
    c.run(&["job", "info", job, "--output", "json"]).ok().json()["counts"].clone()
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2) on a child process this test started.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

#[test]
fn job_retry_resubmits_the_failed_tasks() {
    let c = Cluster::with_workers(&[2]);
    c.run(&["submit", "--array", "1-3", "--", "sh", "-c", "test -e go"])
        .ok();
    let wait = c.run(&["job", "wait", "1", "--quiet"]);
    assert_eq!(wait.code(), Some(1), "{wait:#?}");
    assert_eq!(counts(&c, "1")["failed"], 3);

    std::fs::write(c.path("go"), "").unwrap();
    let out = c.run(&["job", "retry", "1"]);
    assert_eq!(out.ok().stdout.trim(), "job 1: resubmitted 3 failed tasks");
    c.run(&["job", "wait", "1", "--quiet"]).ok();
    let n = counts(&c, "1");
    assert_eq!(
        (n["finished"].as_u64(), n["failed"].as_u64()),
        (Some(3), Some(0))
    );
    // Nothing left to retry; an unknown job is a one-line error.
    let again = c.run(&["job", "retry", "1", "--failed"]);
    assert_eq!(again.ok().stdout.trim(), "job 1: no failed tasks to retry");
    let bad = c.run(&["job", "retry", "9"]);
    assert!(bad
        .failed()
        .one_line_error()
        .contains("job 9 does not exist"));
}

#[test]
fn job_retry_all_runs_the_rest_of_a_canceled_job() {
    let c = Cluster::with_workers(&[1]);
    c.run(&[
        "submit",
        "--array",
        "1-20",
        "--",
        "sh",
        "-c",
        "echo {task} > t{task}; sleep 0.2",
    ])
    .ok();
    poll("a task to run", COMMAND_LIMIT, || c.read("t1"));
    c.run(&["job", "cancel", "1"]).ok();
    c.run(&["job", "wait", "1", "--quiet"]);
    let refused = c.run(&["job", "retry", "1"]);
    assert!(
        refused.failed().one_line_error().contains("--all"),
        "{refused:#?}"
    );
    let out = c
        .run(&["job", "retry", "1", "--all", "--output", "json"])
        .ok()
        .json();
    assert!(out["retried_canceled"].as_u64().unwrap() >= 18, "{out}");
    c.run(&["job", "wait", "1", "--quiet"]).ok();
    assert_eq!(counts(&c, "1")["finished"], 20);
    assert!((1..=20).all(|i| c.read(&format!("t{i}")).is_some()));
}

#[test]
fn a_task_that_always_fails_exhausts_its_retries_with_backoff() {
    let c = Cluster::with_workers(&[1]);
    let start = Instant::now();
    c.run(&[
        "submit",
        "--retries",
        "2",
        "--",
        "sh",
        "-c",
        "echo run >> runs; exit 4",
    ])
    .ok();
    let wait = c.run(&["job", "wait", "1", "--quiet"]);
    let took = start.elapsed();
    assert_eq!(wait.code(), Some(1));
    // Backoff of 0.5 s then 1 s between the three runs.
    assert!(took >= Duration::from_millis(1_500), "took {took:?}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert_eq!(c.read("runs").as_deref(), Some("run\nrun\nrun\n"));
    let rows = task_rows(&c, "1");
    assert_eq!(rows[0]["failures"], 3);
    assert_eq!(rows[0]["reason"], "exit code 4");
}

#[test]
fn a_worker_whose_tasks_fail_is_quarantined_until_resumed() {
    let c = Cluster::with_workers(&[1, 1]);
    // Tasks fail on worker 1 only (a broken node); worker 2 runs them fine.
    c.run(&[
        "submit",
        "--array",
        "1-200",
        "--",
        "sh",
        "-c",
        "test \"$KESTREL_WORKER_ID\" != 1",
    ])
    .ok();
    c.run(&["job", "wait", "1", "--quiet"]);
    let n = counts(&c, "1");
    // Judged once worker 2 has run as many of the job's tasks: at least 10 fail, and then no
    // more than were on worker 1 already (how many depends on the two workers' speeds).
    let failed = n["failed"].as_u64().unwrap();
    assert!((10..200).contains(&failed), "{n}");
    assert_eq!(n["finished"].as_u64().unwrap() + failed, 200);

    let list = c.run(&["worker", "list", "--output", "json"]).ok().json();
    let w1 = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == 1)
        .expect("worker 1")
        .clone();
    let why = w1["quarantine_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("tasks of job 1 failed, against 0 of")
            && why.ends_with("on the other workers"),
        "{w1}"
    );
    let table = c.run(&["worker", "list"]).ok().stdout.clone();
    assert!(table.contains("quarantined"), "{table}");
    assert!(c.server_log().contains("worker quarantined"));

    // Quarantined: a new job runs on worker 2 only.
    c.run(&["submit", "--array", "1-20", "--wait", "--", "true"])
        .ok();
    let rows = task_rows(&c, "2");
    assert!(rows.iter().all(|r| r["worker"] == 2), "{rows:#?}");

    let out = c.run(&["worker", "resume", "1"]);
    assert_eq!(
        out.ok().stdout.trim(),
        "worker 1: quarantine lifted; it gets tasks again"
    );
    let list = c.run(&["worker", "list", "--output", "json"]).ok().json();
    assert!(list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["state"] == "active" && w["quarantine_reason"].is_null()));
    // Resumed: it gets tasks again.
    c.run(&["submit", "--array", "1-40", "--wait", "--", "sleep", "0.05"])
        .ok();
    let rows = task_rows(&c, "3");
    assert!(rows.iter().any(|r| r["worker"] == 1), "{rows:#?}");
    let bad = c.run(&["worker", "resume", "7"]);
    assert!(bad
        .failed()
        .one_line_error()
        .contains("worker 7 is not connected"));
}

/// A task that runs until the test creates the file `go` in the work directory, then writes
/// its id to `out/ID`: the tests below decide when runs end, whatever the machine's speed.
const UNTIL_GO: &str = "while [ ! -e go ]; do sleep 0.02; done; echo {task} >> out/{task}";

#[test]
fn a_cut_off_worker_s_late_results_are_not_recorded_twice() {
    let mut c = Cluster::with_server_args(&["--heartbeat", "200ms", "-v"]);
    let a = c.add_worker(4);
    c.wait_workers(1);
    std::fs::create_dir_all(c.path("out")).unwrap();
    c.run(&["submit", "--array", "1-4", "--", "sh", "-c", UNTIL_GO])
        .ok();
    poll_every(
        "4 running tasks",
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || (counts(&c, "1")["running"] == 4).then_some(()),
    );
    // Cut off: its tasks go on (own process groups), but it cannot report.
    signal(c.worker_pid(a), libc::SIGSTOP);
    c.wait_workers(0);
    let b = c.add_worker(4);
    // Every run, the cut-off worker's and the new one's, may end now.
    std::fs::write(c.path("go"), "").unwrap();
    c.run(&["job", "wait", "1", "--quiet"]).ok();
    let rows = task_rows(&c, "1");
    assert!(
        rows.iter()
            .all(|r| r["lost"] == 1 && r["state"] == "finished"),
        "{rows:#?}"
    );
    // Back: it reconnects and hands over its results, which the finished tasks ignore.
    signal(c.worker_pid(a), libc::SIGCONT);
    poll_every(
        "the worker to resume",
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || c.server_log().contains("worker resumed").then_some(()),
    );
    c.wait_workers(2);
    let n = counts(&c, "1");
    assert_eq!(n["finished"], 4, "{n}");
    assert_eq!(
        ["queued", "assigned", "running", "failed", "canceled"].map(|k| n[k].as_u64()),
        [Some(0); 5]
    );
    // Each task ran twice (at-least-once) and every file is there.
    for i in 1..=4 {
        assert_eq!(c.read(&format!("out/{i}")), Some(format!("{i}\n{i}\n")));
    }
    assert!(c.worker_running(a) && c.worker_running(b));
    c.assert_serves();
}

#[test]
fn a_cut_off_worker_still_running_its_tasks_keeps_the_first_result() {
    let mut c = Cluster::with_server_args(&["--heartbeat", "200ms", "-v"]);
    let a = c.add_worker(4);
    c.wait_workers(1);
    std::fs::create_dir_all(c.path("out")).unwrap();
    c.run(&["submit", "--array", "1-4", "--", "sh", "-c", UNTIL_GO])
        .ok();
    poll_every(
        "4 running tasks",
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || (counts(&c, "1")["running"] == 4).then_some(()),
    );
    signal(c.worker_pid(a), libc::SIGSTOP);
    c.wait_workers(0);
    c.add_worker(4);
    poll_every(
        "the tasks to run again",
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || {
            let rows = task_rows(&c, "1");
            rows.iter()
                .all(|r| r["state"] == "running" && r["worker"] == 2)
                .then_some(())
        },
    );
    // Back while both copies run: the first success of each task is kept, once.
    signal(c.worker_pid(a), libc::SIGCONT);
    poll_every(
        "the worker to resume",
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || c.server_log().contains("worker resumed").then_some(()),
    );
    std::fs::write(c.path("go"), "").unwrap();
    c.run(&["job", "wait", "1", "--quiet"]).ok();
    let n = counts(&c, "1");
    assert_eq!(n["finished"], 4, "{n}");
    assert_eq!(n["failed"], 0, "{n}");
    assert!(c.server_log().contains("worker resumed"));
    for i in 1..=4 {
        let text = c.read(&format!("out/{i}")).expect("task file");
        assert!(text.lines().count() >= 1 && text.lines().all(|l| l == i.to_string()));
    }
    c.assert_serves();
}
