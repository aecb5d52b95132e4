//! Tasks that fail, retry, time out or get canceled, and workers that die, with a real server
//! and real workers on loopback.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The rows of `kestrel task list JOB [--status S] --output json`.
fn task_rows(c: &Cluster, job: &str, status: Option<&str>) -> Vec<Value> {
    let mut args = vec!["task", "list", job, "--output", "json"];
    if let Some(s) = status {
        args.extend_from_slice(&["--status", s]);
    }
    let page = c.run(&args).ok().json();
    assert_eq!(page["next_offset"], Value::Null, "one page holds them all");
    page["tasks"].as_array().expect("tasks").clone()
}

fn job_state(c: &Cluster, job: &str) -> Value {
    c.run(&["job", "info", job, "--output", "json"]).ok().json()
}

#[test]
fn failed_tasks_show_exit_code_reason_and_stderr() {
    let c = Cluster::with_workers(&[2]);
    let out = c.run(&[
        "submit",
        "--array",
        "1-3",
        "--",
        "sh",
        "-c",
        "if [ {task} -eq 2 ]; then exit 0; fi; echo boom from {task} >&2; exit 3",
    ]);
    out.ok();
    let wait = c.run(&["job", "wait", "1", "--quiet"]);
    assert_eq!(wait.code(), Some(1), "{wait:#?}");
    assert!(wait.stderr.contains("1 finished, 2 failed"), "{wait:#?}");

    let failed = task_rows(&c, "1", Some("failed"));
    let ids: Vec<&Value> = failed.iter().map(|r| &r["id"]).collect();
    assert_eq!(ids, [1, 3], "{failed:#?}");
    for r in &failed {
        let id = &r["id"];
        assert_eq!(r["state"], "failed");
        assert_eq!(r["exit_code"], 3);
        assert_eq!(r["failures"], 1);
        assert_eq!(r["lost"], 0);
        assert_eq!(r["reason"], "exit code 3");
        assert_eq!(r["stderr_tail"], format!("boom from {id}\n"));
    }
    let all = task_rows(&c, "1", None);
    assert_eq!(all.len(), 3);
    assert_eq!(all[1]["state"], "finished");
    assert_eq!(all[1]["exit_code"], 0, "a finished task exited 0");
    assert_eq!(job_state(&c, "1")["state"], "failed");
}

#[test]
fn retries_run_a_failing_task_again() {
    let c = Cluster::with_workers(&[1]);
    // Fails on runs 1 and 2, succeeds on run 3.
    let script = "n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; \
                  echo run $n >&2; [ $n -ge 3 ]";
    let out = c.run(&[
        "submit",
        "--retries",
        "2",
        "--wait",
        "--",
        "sh",
        "-c",
        script,
    ]);
    out.ok();
    assert!(out.stderr.contains("1 finished"), "{out:#?}");
    assert_eq!(c.read("count").as_deref(), Some("3\n"));
    let rows = task_rows(&c, "1", None);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["state"], "finished");
    assert_eq!(rows[0]["failures"], 2, "{rows:#?}");
    assert_eq!(rows[0]["lost"], 0);
    assert_eq!(job_state(&c, "1")["state"], "finished");

    // Without enough retries the last failure sticks.
    let out = c.run(&[
        "submit",
        "--retries",
        "1",
        "--wait",
        "--",
        "sh",
        "-c",
        "exit 5",
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let rows = task_rows(&c, "2", None);
    assert_eq!(rows[0]["state"], "failed");
    assert_eq!(rows[0]["failures"], 2, "first run and one retry: {rows:#?}");
    assert_eq!(rows[0]["exit_code"], 5);
}

#[test]
fn a_task_running_again_after_a_failure_shows_no_exit_code_yet() {
    let c = Cluster::with_workers(&[1]);
    // The first run fails with 7; the retry runs on until the job is canceled.
    let script = "if [ -e failed-once ]; then exec sleep 60; fi; touch failed-once; exit 7";
    c.run(&["submit", "--retries", "1", "--", "sh", "-c", script])
        .ok();
    let row = poll_every(
        "the retry to start",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            let rows = task_rows(&c, "1", None);
            (rows[0]["state"] == "running" && rows[0]["attempts"] == 2).then(|| rows[0].clone())
        },
    );
    assert_eq!(row["failures"], 1, "{row:#?}");
    assert_eq!(
        row["exit_code"],
        Value::Null,
        "the 7 was the first run's: {row:#?}"
    );
    let info = c
        .run(&["task", "info", "1", "0", "--output", "json"])
        .ok()
        .json();
    assert_eq!(info["exit_code"], Value::Null, "{info:#?}");
    assert_eq!(info["signal"], Value::Null, "{info:#?}");
    let human = c.run(&["task", "info", "1", "0"]).ok().stdout.clone();
    assert!(!human.contains("ended with  exit code 7"), "{human}");
    assert!(
        human.contains("earlier run  failed: exit code 7"),
        "{human}"
    );
    c.run(&["job", "cancel", "1"]).ok();
}

#[test]
fn timeout_kills_a_long_task_quickly() {
    let c = Cluster::with_workers(&[1]);
    let started = Instant::now();
    let out = c.run(&[
        "submit",
        "--timeout",
        "300ms",
        "--wait",
        "--",
        "sleep",
        "30",
    ]);
    let took = started.elapsed();
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let rows = task_rows(&c, "1", Some("failed"));
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let reason = rows[0]["reason"].as_str().expect("a reason");
    assert!(reason.contains("timed out"), "{reason}");
    assert_eq!(rows[0]["exit_code"], Value::Null);
    let run_us = rows[0]["finished_us"].as_u64().unwrap() - rows[0]["started_us"].as_u64().unwrap();
    assert!(
        (250_000..10_000_000).contains(&run_us),
        "ran {run_us} µs for a 300 ms timeout"
    );
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!(info["timeout_us"], 300_000);
}

#[test]
fn cancel_stops_running_and_queued_tasks() {
    let c = Cluster::with_workers(&[1, 1]);
    c.run(&[
        "submit",
        "--array",
        "1-10",
        "--stdout",
        "none",
        "--",
        "sh",
        "-c",
        "echo $$ > pid-{task}; exec sleep 30",
    ])
    .ok();
    // One task runs on each worker; wait until both have started and written their pids.
    let running = poll_every(
        "two running tasks",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let rows = task_rows(&c, "1", Some("running"));
            (rows.len() == 2).then_some(rows)
        },
    );
    let pids: Vec<i32> = running
        .iter()
        .map(|r| {
            let file = c.work.join(format!("pid-{}", r["id"]));
            poll("a running task's pid file", Duration::from_secs(10), || {
                read_pid(&file)
            })
        })
        .collect();
    for &pid in &pids {
        assert!(alive(pid), "task process {pid} runs before the cancel");
    }

    let out = c.run(&["job", "cancel", "1", "--output", "json"]);
    let result = out.ok().json();
    // Queued tasks canceled at once (with those waiting in a worker's prefetch window: not
    // started, they are not "running", as 13d342e said), running ones to stop.
    let job = &result["jobs"][0];
    assert_eq!(
        (&job["id"], &job["error"]),
        (&json!(1), &Value::Null),
        "{out:#?}"
    );
    let u = |k: &str| job[k].as_u64().unwrap_or_else(|| panic!("{k} in {job}"));
    let (queued, running) = (u("queued_canceled"), u("running_stopping"));
    assert_eq!((queued, running), (8, 2), "{out:#?}");
    let wait = c.run(&["job", "wait", "1", "--quiet"]);
    assert_eq!(wait.code(), Some(1), "{wait:#?}");
    assert!(wait.stderr.contains("10 canceled"), "{wait:#?}");

    let rows = task_rows(&c, "1", None);
    assert_eq!(rows.len(), 10);
    assert!(rows.iter().all(|r| r["state"] == "canceled"), "{rows:#?}");
    assert_eq!(job_state(&c, "1")["state"], "canceled");
    // The running sleeps were killed (and reaped by the worker); queued tasks never started.
    for &pid in &pids {
        poll(
            "a canceled task's process to go",
            Duration::from_secs(5),
            || (!alive(pid)).then_some(()),
        );
    }
    let started = (1..=10)
        .filter(|t| c.work.join(format!("pid-{t}")).exists())
        .count();
    assert_eq!(started, 2, "only the two running tasks ever started");
    // The workers are still there and take new work.
    assert_eq!(c.wait_workers(2).len(), 2);
    c.assert_serves();
}

#[test]
fn a_lost_worker_task_runs_again_elsewhere() {
    let mut c = Cluster::with_workers(&[1]);
    // The first run records its pid and sleeps; the second one finishes.
    let script = "if [ -e first-run ]; then echo second run > result; \
                  else touch first-run; echo $$ > pid; exec sleep 30; fi";
    c.run(&["submit", "--stdout", "none", "--", "sh", "-c", script])
        .ok();
    let pid = poll("the first run's pid", Duration::from_secs(10), || {
        read_pid(&c.work.join("pid"))
    });
    // Killed at the end should the worker's reaper fail to.
    c.adopt_group(pid);
    c.kill_worker(0);
    // The dead worker's reaper kills the task, so it does not run on beside its second run.
    poll(
        "the lost worker's task to die",
        Duration::from_secs(5),
        || (!alive(pid)).then_some(()),
    );

    c.add_worker(1);
    let wait = c.run(&["job", "wait", "1", "--quiet"]);
    wait.ok();
    assert!(wait.stderr.contains("1 finished"), "{wait:#?}");
    assert_eq!(c.read("result").as_deref(), Some("second run\n"));
    let rows = task_rows(&c, "1", None);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["state"], "finished");
    assert_eq!(rows[0]["lost"], 1, "{rows:#?}");
    assert_eq!(rows[0]["failures"], 0, "{rows:#?}");
    assert_eq!(rows[0]["worker"], 2, "ran on the second worker");
    let workers = c.wait_workers(1);
    assert_eq!(workers[0]["id"], 2);
    assert_eq!(workers[0]["finished"], 1);
    kill_group(pid);
}

#[test]
fn a_wait_that_ends_with_failures_says_why() {
    let c = Cluster::with_workers(&[1]);
    // A typo in the program: the wait names the task and the reason, not just a count.
    let out = c.run(&["submit", "--wait", "--", "/bin/ture"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr
            .contains("job 1 task 0: '/bin/ture' does not exist"),
        "{out:#?}"
    );
    let out = c.run(&["job", "wait", "1"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("'/bin/ture' does not exist"),
        "{out:#?}"
    );
}

/// Issue 29, defect 1, as reported: one healthy worker and one whose tasks all fail at once
/// (`BADNODE=1` in its environment). On 13d342e `--retries 3 --array 1-200` ended with most
/// tasks failed and the bad worker active: the healthy one, busy with real work (here its
/// first two tasks take a second), ran too few of the job's tasks before the bad one had
/// failed them all in a few milliseconds each, then got retries, which the old rule did not
/// count (here: 110 finished, 90 failed). Now the bad one is quarantined with a reason, the
/// tasks it failed are retried on the healthy one, and all 200 finish.
#[test]
fn a_bad_node_is_quarantined_and_every_task_of_the_sweep_finishes() {
    let mut c = Cluster::new();
    c.add_worker(1);
    c.wait_workers(1);
    let mut bad = kestrel();
    bad.env("BADNODE", "1");
    c.add_worker_as(bad, 1, &[]);
    c.wait_workers(2);
    let out = c.run(&[
        "submit",
        "--retries",
        "3",
        "--array",
        "1-200",
        "--wait",
        "--",
        "sh",
        "-c",
        "test -z \"$BADNODE\" || exit 127; test {task} -gt 2 || sleep 1",
    ]);
    out.ok();
    let n = &job_state(&c, "1")["counts"];
    assert_eq!(n["finished"], 200, "{n}");
    assert_eq!(n["failed"], 0, "{n}");
    let list = c.run(&["worker", "list", "--output", "json"]).ok().json();
    let workers = list["workers"].as_array().expect("workers").clone();
    let bad = workers
        .iter()
        .find(|w| w["id"] == 2)
        .expect("the bad worker, registered second");
    assert_eq!(bad["state"], "quarantined", "{bad}");
    let why = bad["quarantine_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("tasks of job 1 failed, against 0 of")
            || why.contains("then succeeded on other workers"),
        "{why}"
    );
    assert!(
        bad["finished"] == 0 && bad["failed"].as_u64() > Some(0),
        "{bad}"
    );
    let good = workers
        .iter()
        .find(|w| w["id"] == 1)
        .expect("the healthy worker");
    assert_eq!(good["state"], "active", "{good}");
    assert_eq!(good["finished"], 200, "{good}");
    assert!(c.server_log().contains("worker quarantined"));
}

/// Issue 29, defect 4 and its rough edges: B submitted `--after A` is canceled when A fails
/// (shown `canceled`, saying why); `job retry B` says what would run it; `job retry B --all`
/// is refused while A has failed (on 13d342e it ran B anyway); retrying A brings B back,
/// waiting for A (and `job list` says so), and B runs when A finishes. Both restarts of the
/// server replay it: after the cascade, and between A's retry and its end.
#[test]
fn retrying_a_failed_job_brings_back_its_dependents_and_survives_restarts() {
    let mut c = Cluster::with_workers(&[1]);
    // A waits for B's submission, fails until `ok` exists, then runs until `go` exists.
    let until = |f: &str| format!("while ! test -e {f}; do sleep 0.05; done");
    let a = format!("{}; test -e ok || exit 1; {}", until("b-in"), until("go"));
    c.run(&["submit", "--name", "A", "--", "sh", "-c", &a]).ok();
    c.run(&[
        "submit", "--name", "B", "--after", "1", "--", "touch", "b-ran",
    ])
    .ok();
    std::fs::write(c.work.join("b-in"), "").unwrap();
    let wait = c.run(&["job", "wait", "1", "2", "--quiet"]);
    assert_eq!(wait.code(), Some(1), "{wait:#?}");
    let why = "it runs after job 1, which ended with 1 failed and 0 canceled tasks";
    let b = job_state(&c, "2");
    assert_eq!(b["state"], "canceled", "{b}");
    let waiting = b["waiting"].as_str().unwrap_or_default().to_string();
    assert!(waiting.starts_with(why), "{b}");
    let info = c.run(&["job", "info", "2"]).ok().stdout.clone();
    assert!(info.contains("canceled because"), "{info}");

    let hint = c.run(&["job", "retry", "2"]);
    assert_eq!(
        hint.ok().stdout.trim(),
        format!("job 2: no failed tasks; 1 was canceled because {waiting}")
    );
    let refused = c.run(&["job", "retry", "2", "--all"]);
    assert_eq!(refused.code(), Some(2), "{refused:#?}");
    assert!(
        refused.stderr.contains(&format!(
            "job 2 cannot be retried now: {why}. Retry job 1 first (`kestrel job retry 1`)"
        )),
        "{refused:#?}"
    );

    // A restart replays the cascade: B is still canceled, for the same reason.
    c.kill_server();
    c.start_server();
    assert_eq!(job_state(&c, "2")["waiting"], waiting.as_str());
    std::fs::write(c.work.join("ok"), "").unwrap();
    let retried = c.run(&["job", "retry", "1"]);
    assert_eq!(
        retried.ok().stdout.trim(),
        "job 1: resubmitted 1 failed task"
    );
    let list = c.run(&["job", "list", "--output", "json"]).ok().json();
    let b = &list["jobs"][1];
    assert_eq!(
        (&b["state"], &b["waiting_for"]),
        (&json!("queued"), &json!(["1"])),
        "{list}"
    );
    let table = c.run(&["job", "list"]).ok().stdout.clone();
    assert!(table.contains("1 waiting for 1"), "{table}");
    assert_eq!(
        job_state(&c, "2")["waiting"],
        "its tasks wait for job 1 to finish"
    );

    // Another restart while A's retry runs: the retry and what it brought back replay.
    c.kill_server();
    c.start_server();
    assert_eq!(job_state(&c, "2")["counts"]["waiting"], 1);
    std::fs::write(c.work.join("go"), "").unwrap();
    let wait = c.run(&["job", "wait", "1", "2", "--quiet"]);
    assert_eq!(wait.code(), Some(0), "{wait:#?}");
    assert!(c.work.join("b-ran").exists(), "B ran after A finished");
    assert_eq!(job_state(&c, "2")["state"], "finished");
    assert_eq!(job_state(&c, "2")["waiting"], Value::Null);
}
