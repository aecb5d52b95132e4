//! The normal flow with a real server and real workers on loopback: submit in every shape,
//! where output goes, what the inspection commands report, `kestrel run`, `server stop`.

mod common;

use common::*;
use serde_json::{json, Value};
use std::fs;
use std::time::Duration;

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{v} is not an unsigned integer"))
}

#[test]
fn array_job_runs_on_all_workers_and_is_reported() {
    let c = Cluster::with_workers(&[2, 1]);
    let work = c.work.display().to_string();
    let out = c.run(&[
        "submit",
        "--array",
        "1-20",
        "--cwd",
        &work,
        "--wait",
        "--",
        "sh",
        "-c",
        "echo $KESTREL_TASK_ID $KESTREL_JOB_ID {task} > out-{task}.txt",
    ]);
    out.ok();
    assert!(out.stderr.contains("20 finished"), "{out:#?}");
    assert!(
        out.stderr.contains("submitted job 1 with 20 tasks"),
        "{out:#?}"
    );
    for t in 1..=20 {
        assert_eq!(
            c.read(&format!("out-{t}.txt")),
            Some(format!("{t} 1 {t}\n")),
            "output of task {t}"
        );
    }

    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    let jobs = jobs["jobs"].as_array().expect("array");
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    let j = &jobs[0];
    assert_eq!(j["id"], 1);
    assert_eq!(j["name"], "sh");
    assert_eq!(j["state"], "finished");
    assert_eq!(
        j["counts"],
        json!({"queued": 0, "waiting": 0, "assigned": 0, "running": 0, "finished": 20, "failed": 0, "canceled": 0, "total": 20})
    );
    assert!(u(&j["finished_us"]) >= u(&j["submitted_us"]));

    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!(info["state"], "finished");
    assert_eq!(info["counts"]["finished"], 20);
    assert_eq!(info["tasks"], 20);
    assert_eq!(info["ids"], "1-20");
    assert_eq!(info["directory"], work.as_str());
    assert_eq!((&info["cpus"], &info["gpus"]), (&json!(1), &json!(0)));
    let timing = &info["timing"];
    assert_eq!(timing["tasks_timed"], 20);
    assert!(u(&timing["mean_run_us"]) > 0, "{timing}");
    u(&timing["mean_queue_us"]);
    u(&timing["mean_dispatch_us"]);
    assert!(u(&timing["span_us"]) > 0, "{timing}");

    let workers = c.run(&["worker", "list", "--output", "json"]).ok().json();
    let workers = workers["workers"].as_array().expect("array");
    let mut slots: Vec<u64> = workers.iter().map(|w| u(&w["slots"])).collect();
    slots.sort_unstable();
    assert_eq!(slots, vec![1, 2], "{workers:#?}");
    let mut finished = 0;
    for w in workers {
        assert_eq!(w["exec"], "process");
        assert_eq!(w["gpus"], 0);
        assert_eq!(w["tasks"], 0, "no task left outstanding: {w}");
        assert_eq!(w["failed"], 0);
        assert!(
            u(&w["finished"]) > 0,
            "both workers got tasks: {workers:#?}"
        );
        assert!(w["address"].as_str().unwrap().starts_with("127.0.0.1:"));
        finished += u(&w["finished"]);
    }
    assert_eq!(finished, 20);

    let server = c.run(&["server", "info", "--output", "json"]).ok().json();
    assert_eq!(server["address"], format!("127.0.0.1:{}", c.port()));
    assert_eq!(server["protocol"], kestrel_proto::PROTOCOL_VERSION);
    assert_eq!(u(&server["pid"]), u64::from(c.server_pid()));
    assert_eq!(server["directory"], c.server_dir.display().to_string());
    assert_eq!(server["workers"], 2);
    assert_eq!(server["jobs"], 1);
    assert_eq!(server["live_jobs"], 0);
    assert_eq!(server["queued"], 0);
}

#[test]
fn long_command_lines_reach_the_workers_in_several_messages() {
    // 300 lines of 120 KiB (under Linux's 128 KiB limit for one argument): 36 MiB of command
    // lines, more than one message carries both ways. The whole list is in before the worker
    // with 256 slots comes, so it is offered most of it at once.
    let mut c = Cluster::new();
    let line = "x".repeat(120 << 10);
    let lines: String = (0..300).map(|i| format!("{i}{line}\n")).collect();
    fs::write(c.work.join("long.txt"), lines).unwrap();
    let out = c.run(&[
        "submit", "--each", "long.txt", "--output", "json", "--", "true", "{line}",
    ]);
    assert_eq!(out.ok().json()["tasks"], 300, "{out:?}");
    c.add_worker(256);
    let out = c.run(&["job", "wait", "1", "--output", "json"]);
    assert_eq!(out.ok().json()["counts"]["finished"], 300, "{out:?}");
}

#[test]
fn each_lines_and_job_files() {
    let c = Cluster::with_workers(&[2]);
    fs::write(c.work.join("inputs.txt"), "alpha\nbeta\n\ngamma\n").unwrap();
    let out = c.run(&[
        "submit",
        "--each",
        "inputs.txt",
        "--wait",
        "--output",
        "json",
        "--",
        "sh",
        "-c",
        "echo {task}:{line} > each-{line}.txt",
    ]);
    let doc = out.ok().json();
    assert_eq!((&doc["jobs"], &doc["tasks"]), (&json!([1]), &json!(3)));
    assert_eq!(doc["jobs_done"], 1);
    assert_eq!(doc["counts"]["finished"], 3);
    // The empty line makes no task; list tasks are numbered from 0.
    assert_eq!(c.read("each-alpha.txt").as_deref(), Some("0:alpha\n"));
    assert_eq!(c.read("each-beta.txt").as_deref(), Some("1:beta\n"));
    assert_eq!(c.read("each-gamma.txt").as_deref(), Some("2:gamma\n"));
    assert_eq!(c.read("each-.txt"), None);
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!((&info["tasks"], &info["ids"]), (&json!(3), &Value::Null));

    // A job file: [defaults] plus an array job and a list job; relative paths are relative to
    // the file.
    let jobs_dir = c.work.join("jobs");
    fs::create_dir_all(jobs_dir.join("results")).unwrap();
    fs::write(
        jobs_dir.join("sweep.toml"),
        r#"
[defaults]
retries = 1
stdout = "none"
cwd = "results"
env = { GREETING = "hi" }

[[job]]
name = "sweep"
array = "1-4"
command = ["sh", "-c", "echo $GREETING {task} > sweep-{task}.txt"]

[[job]]
name = "post"
tasks = ["sh -c 'echo post a > post-a.txt'", ["sh", "-c", "echo post b {task} > post-b.txt"]]
retries = 0
"#,
    )
    .unwrap();
    let out = c.run(&[
        "submit",
        "--file",
        "jobs/sweep.toml",
        "--wait",
        "--output",
        "json",
    ]);
    let doc = out.ok().json();
    assert_eq!((&doc["jobs"], &doc["tasks"]), (&json!([2, 3]), &json!(6)));
    assert_eq!(doc["jobs_done"], 2);
    assert_eq!(doc["counts"]["finished"], 6);
    let results = jobs_dir.join("results");
    for t in 1..=4 {
        let got = fs::read_to_string(results.join(format!("sweep-{t}.txt"))).ok();
        assert_eq!(got, Some(format!("hi {t}\n")));
    }
    let read = |n: &str| fs::read_to_string(results.join(n)).ok();
    assert_eq!(read("post-a.txt").as_deref(), Some("post a\n"));
    assert_eq!(read("post-b.txt").as_deref(), Some("post b 1\n"));

    let results = fs::canonicalize(&results).unwrap().display().to_string();
    let sweep = c.run(&["job", "info", "2", "--output", "json"]).ok().json();
    assert_eq!(sweep["name"], "sweep");
    assert_eq!(sweep["state"], "finished");
    assert_eq!((&sweep["tasks"], &sweep["ids"]), (&json!(4), &json!("1-4")));
    assert_eq!(sweep["retries"], 1);
    assert_eq!(sweep["stdout"], "none");
    assert_eq!(sweep["directory"], results.as_str());
    assert_eq!(sweep["env"], json!({"GREETING": "hi"}));
    let post = c.run(&["job", "info", "3", "--output", "json"]).ok().json();
    assert_eq!(post["name"], "post");
    assert_eq!(post["tasks"], 2);
    assert_eq!(post["retries"], 0);
    assert_eq!(post["directory"], results.as_str());
}

#[test]
fn stdout_and_stderr_files() {
    let c = Cluster::with_workers(&[2]);
    let script = "echo out {task}; echo err {task} >&2";
    let submit = |extra: &[&str]| {
        let mut args = vec!["submit", "--array", "1-3", "--wait"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        c.run(&args).ok();
    };

    // Defaults: job-{job}/{task}.out and .err, relative to the directory the task runs in.
    submit(&[]);
    for t in 1..=3 {
        assert_eq!(
            c.read(&format!("job-1/{t}.out")),
            Some(format!("out {t}\n"))
        );
        assert_eq!(
            c.read(&format!("job-1/{t}.err")),
            Some(format!("err {t}\n"))
        );
    }

    submit(&["--stdout", "none"]);
    for t in 1..=3 {
        assert_eq!(
            c.read(&format!("job-2/{t}.out")),
            None,
            "stdout was discarded"
        );
        assert_eq!(
            c.read(&format!("job-2/{t}.err")),
            Some(format!("err {t}\n"))
        );
    }

    submit(&["--stdout", "custom/{task}.log"]);
    for t in 1..=3 {
        assert_eq!(
            c.read(&format!("custom/{t}.log")),
            Some(format!("out {t}\n"))
        );
        assert_eq!(c.read(&format!("job-3/{t}.out")), None);
        assert_eq!(
            c.read(&format!("job-3/{t}.err")),
            Some(format!("err {t}\n"))
        );
    }

    // With --cwd, the default files go under that directory.
    fs::create_dir_all(c.work.join("elsewhere")).unwrap();
    submit(&["--cwd", "elsewhere", "--stderr", "none"]);
    for t in 1..=3 {
        assert_eq!(
            c.read(&format!("elsewhere/job-4/{t}.out")),
            Some(format!("out {t}\n"))
        );
        assert_eq!(c.read(&format!("elsewhere/job-4/{t}.err")), None);
        assert_eq!(c.read(&format!("job-4/{t}.out")), None);
    }
}

/// `kestrel run` needs no server; it still gets a server dir so nothing reads ~/.kestrel.
fn run_here(args: &[&str]) -> (tempfile::TempDir, Out) {
    let dir = tempfile::tempdir().unwrap();
    let out = client(&dir.path().join("no-server"), dir.path(), args);
    (dir, out)
}

#[test]
fn run_array_of_fifty() {
    let (dir, out) = run_here(&[
        "run",
        "--array",
        "1-50",
        "--stdout",
        "none",
        "--",
        "sh",
        "-c",
        "echo e{task} >&2",
    ]);
    out.ok();
    assert!(out.stderr.contains("50 tasks"), "{out:#?}");
    assert!(out.stderr.contains("50 finished"), "{out:#?}");
    assert!(!out.stderr.contains("failed"), "{out:#?}");
    // stderr still goes to the default files, relative to the current directory.
    for t in 1..=50 {
        let err = std::fs::read_to_string(dir.path().join(format!("job-1/{t}.err")));
        assert_eq!(err.ok(), Some(format!("e{t}\n")), "{t}.err");
        assert!(!dir.path().join(format!("job-1/{t}.out")).exists());
    }
}

#[test]
fn run_of_a_failing_command_fails() {
    let (_dir, out) = run_here(&["run", "--", "false"]);
    out.failed();
    assert!(out.stderr.contains("1 failed"), "{out:#?}");
}

#[test]
fn run_noop_hundred_thousand() {
    let (_dir, out) = run_here(&[
        "run", "--exec", "noop", "--array", "1-100000", "--quiet", "--", "true",
    ]);
    out.ok();
    assert!(out.stderr.contains("100000 finished"), "{out:#?}");
}

#[test]
fn server_stop_ends_server_and_workers() {
    let mut c = Cluster::with_workers(&[1]);
    c.assert_serves();
    let out = c.run(&["server", "stop"]);
    out.ok();
    assert!(out.stderr.contains("stopping"), "{out:#?}");
    let server = c.wait_server_exit(Duration::from_secs(10));
    assert!(server.success(), "server exited with {server}");
    let worker = c.wait_worker_exit(0, Duration::from_secs(10));
    assert!(worker.success(), "worker exited with {worker}");
    assert!(
        !c.server_dir.join("access.json").exists(),
        "the access file is removed"
    );
    let err = c.run(&["job", "list"]).one_line_error().to_string();
    assert!(err.contains("kestrel server start"), "{err}");
}
