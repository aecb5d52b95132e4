//! The input side of `kestrel submit`: what a user types becomes the jobs they meant, or a
//! one-line refusal before anything is sent. `{line}` in every path, overlapping array ranges,
//! mistyped placeholders, `--each -`, `--parsable`, `--key`, `--env-all`, and tasks too large
//! for a message.

mod common;

use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;

/// `kestrel submit ARGS...` in the cluster's work directory, with `stdin` as standard input
/// and `env` added to its environment.
fn submit_with(c: &Cluster, stdin: Option<&Path>, env: &[(&str, &str)], args: &[&str]) -> Out {
    let mut cmd = kestrel();
    cmd.arg("--server-dir")
        .arg(&c.server_dir)
        .arg("submit")
        .args(args)
        .current_dir(&c.work)
        .envs(env.iter().copied());
    if let Some(path) = stdin {
        cmd.stdin(fs::File::open(path).expect("stdin file"));
    }
    run_bounded(cmd, COMMAND_LIMIT)
}

fn jobs(c: &Cluster) -> Value {
    c.run(&["job", "list", "--output", "json"]).ok().json()["jobs"].clone()
}

#[test]
fn each_line_goes_into_every_path_and_env_value() {
    let c = Cluster::with_workers(&[2]);
    fs::write(c.work.join("files.txt"), "a.txt\nb.txt\n\nc d.txt\n").unwrap();
    for f in ["a.txt", "b.txt", "c d.txt"] {
        fs::write(c.work.join(f), format!("content of {f}\n")).unwrap();
    }
    fs::create_dir_all(c.work.join("sums")).unwrap();
    let out = c.run(&[
        "submit",
        "--each",
        "files.txt",
        "--stdout",
        "sums/{line}.sha",
        "--stderr",
        "errs/{line}.err",
        "--env",
        "INPUT={line}",
        "--wait",
        "--",
        "sh",
        "-c",
        "cat \"$INPUT\"; echo {task} >&2",
    ]);
    out.ok();
    // One file per line, not one file named `{line}.sha` for all of them.
    for (task, f) in ["a.txt", "b.txt", "c d.txt"].iter().enumerate() {
        assert_eq!(
            c.read(&format!("sums/{f}.sha")),
            Some(format!("content of {f}\n")),
            "{out:#?}"
        );
        assert_eq!(c.read(&format!("errs/{f}.err")), Some(format!("{task}\n")));
    }
    assert_eq!(c.read("sums/{line}.sha"), None);
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!((&info["tasks"], &info["ids"]), (&json!(3), &Value::Null));
}

#[test]
fn overlapping_array_ranges_run_each_id_once() {
    let c = Cluster::with_workers(&[2]);
    let out = c.run(&[
        "submit",
        "--array",
        "1-5,3-7",
        "--stdout",
        "none",
        "--wait",
        "--output",
        "json",
        "--",
        "sh",
        "-c",
        "echo {task} >> ran.txt",
    ]);
    let doc = out.ok().json();
    assert_eq!(doc["tasks"], 7, "{out:#?}");
    assert_eq!(doc["counts"]["finished"], 7);
    let mut ran: Vec<u32> = c
        .read("ran.txt")
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    ran.sort_unstable();
    assert_eq!(ran, (1..=7).collect::<Vec<_>>());
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!((&info["tasks"], &info["ids"]), (&json!(7), &json!("1-7")));
}

#[test]
fn a_mistyped_or_misplaced_placeholder_is_refused_at_submit() {
    let c = Cluster::with_workers(&[1]);
    let out = c.run(&["submit", "--array", "1-3", "--", "echo", "{tsk}"]);
    assert_eq!(
        out.one_line_error(),
        "error: unknown placeholder {tsk} in the command (did you mean {task}?); placeholders are {job}, {task} and, with --each, {line} (and {line:N}, its Nth field from 1; {line:q} and {line:N:q} quoted for a shell)"
    );
    let out = c.run(&["submit", "--stdout", "out/{line}.txt", "--", "true"]);
    assert_eq!(
        out.one_line_error(),
        "error: placeholder {line} in --stdout works only with --each; placeholders are {job}, {task} and, with --each, {line} (and {line:N}, its Nth field from 1; {line:q} and {line:N:q} quoted for a shell)"
    );
    // A job file names the job.
    fs::write(
        c.work.join("jobs.toml"),
        "[[job]]\narray = \"1-2\"\ncommand = \"true\"\n\n[[job]]\narray = \"1-2\"\ncommand = \"echo {TASK}\"\n",
    )
    .unwrap();
    let err = c
        .run(&["submit", "--file", "jobs.toml"])
        .one_line_error()
        .to_string();
    assert!(
        err.contains("jobs.toml, job #2") && err.contains("{TASK}"),
        "{err}"
    );
    assert_eq!(jobs(&c), json!([]), "nothing was submitted");
    // Shell and awk text in braces is not a placeholder.
    let out = c.run(&[
        "submit",
        "--stdout",
        "awk.txt",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo ${HOME:+home} | awk '{print $1}'",
    ]);
    out.ok();
    assert_eq!(c.read("awk.txt").as_deref(), Some("home\n"));
}

/// Issue 29: HyperQueue's placeholders were taken literally (`out/%{TASK_ID}.txt`, one file
/// for every task); they are refused, naming Kestrel's.
#[test]
fn hyperqueue_placeholders_are_refused_naming_kestrel_s() {
    let c = Cluster::with_workers(&[1]);
    let out = c.run(&[
        "submit",
        "--array",
        "1-3",
        "--stdout",
        "out/%{TASK_ID}.txt",
        "--",
        "true",
    ]);
    assert_eq!(
        out.one_line_error(),
        "error: %{TASK_ID} in --stdout is HyperQueue's syntax; Kestrel's is {task}"
    );
    let out = c.run(&["submit", "--", "sh", "-c", "echo %{JOB_ID} $HQ_TASK_ID"]);
    assert_eq!(
        out.one_line_error(),
        "error: %{JOB_ID} in the command is HyperQueue's syntax; Kestrel's is {job}"
    );
    let out = c.run(&["submit", "--cwd", "%{SUBMIT_DIR}/x", "--", "true"]);
    assert!(
        out.one_line_error().contains("write a relative path"),
        "{out:#?}"
    );
    assert_eq!(jobs(&c), json!([]), "nothing was submitted");
}

/// Issue 29: `{line}` in `sh -c` broke on a file name with spaces; `{line:q}` is the line as
/// one shell word. A line without the field a `{line:N}` names is refused at submission,
/// instead of running with an empty argument.
#[test]
fn a_quoted_line_is_one_shell_word_and_a_missing_field_is_refused() {
    let c = Cluster::with_workers(&[2]);
    let names = ["my data.txt", "it's $HOME.txt", "plain.txt"];
    for n in names {
        fs::write(c.work.join(n), format!("in {n}\n")).unwrap();
    }
    fs::write(c.work.join("files.txt"), names.join("\n")).unwrap();
    submit_with(
        &c,
        None,
        &[],
        &[
            "--each",
            "files.txt",
            "--stdout",
            "{task}.out",
            "--wait",
            "--",
            "sh",
            "-c",
            "cat {line:q} && echo {line:1:q}",
        ],
    )
    .ok();
    for (task, n) in names.iter().enumerate() {
        let first = n.split_whitespace().next().unwrap();
        assert_eq!(
            c.read(&format!("{task}.out")).as_deref(),
            Some(format!("in {n}\n{first}\n").as_str())
        );
    }
    fs::write(c.work.join("pairs.txt"), "a.fits b.fits\n\nc.fits\n").unwrap();
    let out = c.run(&[
        "submit",
        "--each",
        "pairs.txt",
        "--",
        "cmp",
        "{line:1}",
        "{line:2}",
    ]);
    assert_eq!(
        out.one_line_error(),
        "error: --each file pairs.txt: line 3 (\"c.fits\") has 1 field but {line:2} needs 2; give every line at least 2 whitespace-separated fields, or remove that line"
    );
    assert_eq!(
        jobs(&c).as_array().map(Vec::len),
        Some(1),
        "only the first job"
    );
}

#[test]
fn each_dash_reads_the_lines_from_stdin() {
    let c = Cluster::with_workers(&[2]);
    let input = c.root().join("stdin.txt");
    fs::write(&input, "one\ntwo\n").unwrap();
    let out = submit_with(
        &c,
        Some(&input),
        &[],
        &[
            "--each",
            "-",
            "--stdout",
            "{line}.out",
            "--wait",
            "--",
            "echo",
            "got",
            "{line}",
        ],
    );
    out.ok();
    assert_eq!(c.read("one.out").as_deref(), Some("got one\n"));
    assert_eq!(c.read("two.out").as_deref(), Some("got two\n"));
}

#[test]
fn parsable_prints_only_the_job_ids() {
    let c = Cluster::with_workers(&[1]);
    let out = c.run(&["submit", "--parsable", "--", "true"]);
    assert_eq!(out.ok().stdout, "1\n", "{out:#?}");
    fs::write(
        c.work.join("two.toml"),
        "[[job]]\ncommand = \"true\"\n\n[[job]]\narray = \"1-2\"\ncommand = \"true\"\n",
    )
    .unwrap();
    let out = c.run(&["submit", "--parsable", "--file", "two.toml", "--wait"]);
    assert_eq!(out.ok().stdout, "2\n3\n", "{out:#?}");
}

#[test]
fn a_repeated_key_answers_with_the_first_job() {
    let c = Cluster::with_workers(&[1]);
    let submit = || c.run(&["submit", "--key", "nightly", "--parsable", "--", "true"]);
    let first = submit();
    assert_eq!(first.ok().stdout, "1\n");
    assert!(!first.stderr.contains("already"), "{first:#?}");
    let again = submit();
    assert_eq!(again.ok().stdout, "1\n");
    assert!(
        again
            .stderr
            .contains("job 1 was already submitted with key \"nightly\""),
        "{again:#?}"
    );
    // The jobs of a job file get keys of their own, derived from the one given.
    fs::write(
        c.work.join("two.toml"),
        "[[job]]\ncommand = \"true\"\n\n[[job]]\ncommand = \"true\"\n",
    )
    .unwrap();
    let file = || {
        c.run(&[
            "submit",
            "--key",
            "nightly",
            "--parsable",
            "--file",
            "two.toml",
        ])
    };
    assert_eq!(file().ok().stdout, "2\n3\n");
    assert_eq!(file().ok().stdout, "2\n3\n");
    assert_eq!(jobs(&c).as_array().map(Vec::len), Some(3));
}

#[test]
fn env_all_passes_the_submitters_environment() {
    let c = Cluster::with_workers(&[1]);
    let env = [
        ("KESTREL_IT_FROM_SHELL", "venv-here"),
        ("KESTREL_IT_BOTH", "from-shell"),
        // A task's identity is the worker's to set, whatever the submitter's shell holds.
        ("KESTREL_TASK_ID", "99"),
    ];
    let script = "echo $KESTREL_IT_FROM_SHELL $KESTREL_IT_BOTH $KESTREL_TASK_ID";
    // Each run writes what its task saw into `file`.
    let saw = |options: &[&str], file: &str| {
        let mut args = options.to_vec();
        args.extend_from_slice(&["--array", "4", "--stdout", file, "--wait"]);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        submit_with(&c, None, &env, &args).ok();
        c.read(file).unwrap_or_default()
    };
    let all = saw(
        &["--env-all", "--env", "KESTREL_IT_BOTH=from-flag"],
        "env.txt",
    );
    assert_eq!(all, "venv-here from-flag 4\n");
    // Without it, the worker's environment is the base.
    assert_eq!(saw(&[], "plain.txt"), "4\n");
}

#[test]
fn a_task_too_large_for_a_message_is_refused_before_sending() {
    let c = Cluster::with_workers(&[1]);
    let big = format!("small\n{}\n", "x".repeat(20 << 20));
    fs::write(c.work.join("big.txt"), big).unwrap();
    let out = c.run(&["submit", "--each", "big.txt", "--", "echo", "{line}"]);
    let err = out.one_line_error();
    assert!(
        err.starts_with(
            "error: line 2 of --each file big.txt is 20.0 MiB, more than one task can carry"
        ),
        "{err}"
    );
    assert_eq!(jobs(&c), json!([]), "nothing was submitted");
    c.assert_serves();
}

#[test]
fn bad_input_gets_one_line_saying_what_to_do() {
    // Refused before any server is needed.
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-server");
    fs::write(dir.path().join("empty.txt"), "\n  \n").unwrap();
    fs::create_dir(dir.path().join("inputs")).unwrap();
    fs::write(
        dir.path().join("binary.dat"),
        [0x7f, b'E', b'L', b'F', 0xff, 0xfe, 0],
    )
    .unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--array", "0-10000000000"],
            "task ids must be at most 4294967295",
        ),
        (&["--array", "1-x"], "write e.g. 1-100"),
        (&["--each", "empty.txt"], "no non-empty lines"),
        (
            &["--each", "missing.txt"],
            "does not exist; give a file with one input per line",
        ),
        (&["--each", "inputs"], "is a directory; give a file"),
        (&["--each", "binary.dat"], "is not text"),
        (
            &["--array", "1-2", "--env", "NOEQUALS"],
            "must look like KEY=VALUE",
        ),
        (
            &["--array", "1-2", "--timeout", "soon"],
            "\"soon\" is not a duration; write e.g.",
        ),
        (
            &["--array", "1-2", "--timeout", "-5"],
            "a duration must be positive",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["submit"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "echo", "{task}"]);
        if args[0] == "--each" {
            *all.last_mut().unwrap() = "{line}";
        }
        let out = client(&none, dir.path(), &all);
        let err = out.one_line_error();
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A key names one submission: another command under the same key is refused, not answered
/// with the first job (found in a user's trial, where it printed the new task count).
#[test]
fn a_key_reused_for_another_submission_is_refused() {
    let c = Cluster::new();
    let first = c.run(&[
        "submit",
        "--key",
        "k1",
        "--parsable",
        "--array",
        "1-3",
        "--",
        "true",
    ]);
    assert_eq!(first.ok().stdout, "1\n");
    let again = c.run(&[
        "submit",
        "--key",
        "k1",
        "--parsable",
        "--array",
        "1-3",
        "--",
        "true",
    ]);
    assert_eq!(again.ok().stdout, "1\n");
    let other = c.run(&["submit", "--key", "k1", "--array", "1-5", "--", "false"]);
    let err = other.one_line_error();
    assert!(
        err.contains("key \"k1\" was used for job 1, a different submission"),
        "{err}"
    );
    assert_eq!(other.code(), Some(2));
    assert_eq!(jobs(&c).as_array().map(Vec::len), Some(1));
}
