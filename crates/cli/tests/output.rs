//! What the commands print: one JSON vocabulary across every `--output json`, counts in good
//! English, and a progress bar that does not start full.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn main() -> std::process::ExitCode {
    trials::run(
        file!(),
        trials![
            every_command_speaks_one_json_vocabulary,
            counts_of_one_read_as_one,
            the_progress_bar_does_not_start_full,
        ],
    )
}

/// Checks one JSON document against the vocabulary of docs/json.md; `what` names it.
fn check_vocabulary(what: &str, v: &Value) {
    const STATES: [&str; 10] = [
        "queued",
        "waiting",
        "assigned",
        "running",
        "finished",
        "failed",
        "canceled",
        "unknown",
        "active",
        "quarantined",
    ];
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                assert!(
                    !k.is_empty()
                        && k.starts_with(|c: char| c.is_ascii_lowercase())
                        && k.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                    "{what}: key {k:?} is not snake_case"
                );
                if k.ends_with("_us") {
                    assert!(
                        v.is_u64() || v.is_null(),
                        "{what}: {k} = {v} is not whole microseconds"
                    );
                }
                if k == "state" {
                    let s = v.as_str().unwrap_or_default();
                    assert!(STATES.contains(&s), "{what}: state {v}");
                }
                check_vocabulary(what, v);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| check_vocabulary(what, v)),
        Value::String(s) => assert!(
            !["Ready", "Assigned", "Running", "Finished", "Failed", "Canceled", "Null"]
                .contains(&s.as_str()),
            "{what}: {s:?} is a Rust variant name"
        ),
        _ => {}
    }
}

fn every_command_speaks_one_json_vocabulary() {
    let mut c = Cluster::with_workers(&[2]);
    let mut docs: Vec<(String, Value)> = Vec::new();
    let mut json = |c: &Cluster, args: &[&str]| {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let out = c.run(&all);
        assert!(
            matches!(out.code(), Some(0 | 1)),
            "`{}` failed: {out:#?}",
            args.join(" ")
        );
        let v = out.json();
        docs.push((args.join(" "), v.clone()));
        v
    };
    let submitted = json(
        &c,
        &["submit", "--array", "1-3", "--stdout", "none", "--", "true"],
    );
    assert_eq!(submitted["jobs"], serde_json::json!([1]));
    let waited = json(&c, &["submit", "--wait", "--", "false"]);
    assert_eq!(waited["counts"]["failed"], 1, "one document: {waited}");
    json(&c, &["job", "wait", "1"]);
    let info = json(&c, &["job", "info", "1"]);
    assert_eq!(info["state"], "finished");
    assert_eq!(info["stdout"], "none", "a discarded output");
    assert_eq!(info["stderr"], "job-{job}/{task}.err", "an output file");
    assert_eq!(info["counts"]["queued"], 0);
    let tasks = json(&c, &["task", "list", "1"]);
    assert_eq!(
        tasks["tasks"][0]["state"], "finished",
        "the same word as jobs"
    );
    json(&c, &["task", "info", "2", "0"]);
    json(&c, &["job", "list"]);
    json(&c, &["job", "graph", "1"]);
    json(&c, &["job", "state", "1", "2"]);
    json(&c, &["job", "retry", "2"]);
    json(&c, &["job", "wait", "2"]);
    json(&c, &["submit", "--", "sleep", "30"]);
    json(&c, &["job", "cancel", "3"]);
    json(&c, &["job", "forget", "1"]);
    json(&c, &["worker", "list"]);
    json(&c, &["worker", "resume", "1"]);
    json(&c, &["server", "info"]);
    // `run` embeds a server of its own, in a directory of its own.
    let run_args = [
        "--output", "json", "run", "--array", "1-2", "--stdout", "none", "--stderr", "none", "--",
        "true",
    ];
    let ran = c.run_with_dir(&c.root().join("run"), &run_args).ok().json();
    assert_eq!(ran["counts"]["finished"], 2);
    json(&c, &["server", "stop"]);
    c.wait_server_exit(COMMAND_LIMIT);
    docs.push(("run".into(), ran));
    for (what, v) in &docs {
        check_vocabulary(what, v);
    }
}

fn counts_of_one_read_as_one() {
    let c = Cluster::with_workers(&[1]);
    let out = c.run(&["submit", "--array", "0", "--wait", "--", "true"]);
    // The summary is a note, on stderr; stdout has nothing to carry here.
    assert_eq!(out.ok().stdout, "", "{out:#?}");
    assert!(out.stderr.contains("1 job done: 1 finished\n"), "{out:#?}");
    assert!(
        out.stderr.contains("submitted job 1 with 1 task\n"),
        "{out:#?}"
    );
    let info = c.run(&["job", "info", "1"]).ok().stdout.clone();
    assert!(info.contains("1 task (id 0)"), "{info}");
    assert!(info.contains("1 cpu per task"), "{info}");
    c.run(&["submit", "--array", "1-100", "--cpus", "2", "--", "true"])
        .ok();
    let info = c.run(&["job", "info", "2"]).ok().stdout.clone();
    assert!(info.contains("array of 100 tasks, ids 1-100"), "{info}");
    assert!(info.contains("2 cpus per task"), "{info}");
    let dir = tempfile::tempdir().unwrap();
    let run = client(
        &dir.path().join("no-server"),
        dir.path(),
        &["run", "--slots", "1", "--stderr", "none", "--", "true"],
    );
    assert!(
        run.ok()
            .stderr
            .starts_with("1 task on 1 worker x 1 slot: 1 finished in"),
        "{run:#?}"
    );
}

/// Runs `kestrel ARGS` under `script`, which gives it a terminal, and returns what it drew;
/// skips the test where there is no `script`.
fn on_a_terminal(server_dir: &Path, cwd: &Path, args: &str) -> Out {
    if Command::new("script").arg("--version").output().is_err() {
        trials::skip("`script` (util-linux) is not installed");
    }
    let line = format!("{BIN} --server-dir {} {args}", server_dir.display());
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-f", "-c", &line, "/dev/null"])
        .env("TERM", "xterm")
        .env("COLUMNS", "120")
        .current_dir(cwd);
    run_bounded(cmd, COMMAND_LIMIT)
}

fn the_progress_bar_does_not_start_full() {
    let c = Cluster::with_workers(&[2]);
    c.run(&["submit", "--array", "1-2", "--", "sleep", "1"])
        .ok();
    let out = on_a_terminal(&c.server_dir, &c.work, "job wait 1");
    out.ok();
    assert!(
        out.stdout
            .contains("waiting for the server's first progress report"),
        "{out:#?}"
    );
    assert!(
        out.stdout.contains("/2 tasks"),
        "the bar is drawn: {out:#?}"
    );
    assert!(
        !out.stdout.contains("0/0 tasks"),
        "a bar of 0 out of 0 is drawn full: {out:#?}"
    );
}
