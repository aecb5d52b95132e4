//! `kestrel run` and the command line as a user of sbatch, HQ or GNU parallel meets them
//! (issue 29): stdout for results only, the program without `--`, the output of child jobs, a
//! run's failures readable after it ended, interrupts that say what goes on.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// `kestrel ARGS` in `cwd`, without a server directory of its own.
#[track_caller]
fn run_in(cwd: &Path, args: &[&str]) -> Out {
    let mut k = kestrel();
    k.current_dir(cwd).args(args);
    run_bounded(k, COMMAND_LIMIT)
}

/// An executable shell script `name` in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// Defect 3: `kestrel run --stdout stream ... > res.txt` leaves the results alone in res.txt;
/// the summary and where the files went are notes, on stderr.
#[test]
fn run_keeps_stdout_for_what_the_tasks_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "run",
            "--array",
            "1-3",
            "--stdout",
            "stream",
            "--",
            "sh",
            "-c",
            "echo hi {task}; echo note {task} >&2",
        ],
    );
    out.ok();
    assert_eq!(out.stdout, "hi 1\nhi 2\nhi 3\n", "{out:#?}");
    assert!(out.stderr.contains("3 tasks on 1 worker"), "{out:#?}");
    assert!(out.stderr.contains("outputs in job-1/"), "{out:#?}");
}

/// Defect 3, the same mistake elsewhere: `job wait` and `submit --wait` print their summary on
/// stderr, so stdout holds only data (`--parsable` ids, JSON documents).
#[test]
fn waits_say_their_summary_on_stderr() {
    let c = Cluster::with_workers(&[1]);
    let submitted = c.run(&["submit", "--wait", "--array", "1-2", "--", "true"]);
    assert_eq!(submitted.ok().stdout, "", "{submitted:#?}");
    assert!(
        submitted.stderr.contains("1 job done: 2 finished"),
        "{submitted:#?}"
    );
    let parsable = c.run(&["submit", "--wait", "--parsable", "--", "true"]);
    assert_eq!(parsable.ok().stdout, "2\n", "{parsable:#?}");
    assert!(parsable.stderr.contains("1 job done"), "{parsable:#?}");
    let waited = c.run(&["job", "wait", "1", "2"]);
    assert_eq!(waited.ok().stdout, "", "{waited:#?}");
    assert!(
        waited.stderr.contains("2 jobs done: 3 finished"),
        "{waited:#?}"
    );
    let json = c.run(&["job", "wait", "1", "--output", "json"]);
    assert_eq!(json.ok().json()["counts"]["finished"], 2, "{json:#?}");
}

/// Rough edge: the program as the first positional argument, as sbatch, qsub and HQ take it;
/// everything from it on is the task's, options included. `--` keeps working.
#[test]
fn the_program_needs_no_double_dash() {
    let dir = tempfile::tempdir().unwrap();
    let show = script(dir.path(), "show.sh", "echo \"args: $*\"");
    let out = run_in(
        dir.path(),
        &[
            "run", "--stdout", "stream", "--stderr", "none", &show, "--seed", "3", "-q",
        ],
    );
    assert_eq!(out.ok().stdout, "args: --seed 3 -q\n", "{out:#?}");

    let c = Cluster::with_workers(&[1]);
    let show = script(&c.work, "show.sh", "echo \"args: $*\"");
    let plain = c.run(&[
        "submit",
        "--parsable",
        "--wait",
        "--stdout",
        "stream",
        &show,
        "--wait",
        "--output",
        "json",
    ]);
    assert_eq!(plain.ok().stdout, "1\n", "{plain:#?}");
    let dashed = c.run(&[
        "submit",
        "--parsable",
        "--wait",
        "--stdout",
        "stream",
        "--",
        &show,
        "--",
        "x",
    ]);
    assert_eq!(dashed.ok().stdout, "2\n", "{dashed:#?}");
    let cat = |job: &str| c.run(&["job", "cat", job]).ok().stdout.clone();
    assert_eq!(cat("1"), "args: --wait --output json\n");
    assert_eq!(cat("2"), "args: -- x\n");
    // A mistyped option before the program is still an error, not a program.
    let typo = c.run(&["submit", "--wiat", &show]);
    assert!(typo.failed().stderr.contains("--wiat"), "{typo:#?}");
}
