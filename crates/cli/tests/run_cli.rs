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

/// A PATH on which tasks find the `kestrel` under test.
fn path_with_kestrel() -> String {
    let bin_dir = Path::new(BIN).parent().unwrap().display().to_string();
    format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default())
}

/// Defect 5: tasks under `kestrel run` that submit jobs with streamed output: the run prints
/// their output too (after its own jobs', each job in task order) before its server goes.
#[test]
fn run_prints_the_streamed_output_of_the_jobs_its_tasks_submitted() {
    let dir = tempfile::tempdir().unwrap();
    let mut k = kestrel();
    k.current_dir(dir.path())
        .env("PATH", path_with_kestrel())
        .args([
            "run",
            "--stdout",
            "stream",
            "--",
            "sh",
            "-c",
            // `{{task}}` is the child's placeholder, `{task}` the parent's.
            "echo parent; kestrel submit --array 1-3 --stdout stream --stderr stream -- sh -c 'echo child {{task}} of {task}; echo child-err >&2'",
        ]);
    let out = run_bounded(k, COMMAND_LIMIT);
    out.ok();
    assert_eq!(
        out.stdout, "parent\nchild 1 of 0\nchild 2 of 0\nchild 3 of 0\n",
        "{out:#?}"
    );
    assert_eq!(out.stderr.matches("child-err\n").count(), 3, "{out:#?}");
}

/// The failed-tasks hint (`kestrel ... task list J --state failed`) that `out` printed, as
/// arguments.
fn hinted_command(out: &Out) -> Vec<String> {
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("more failed tasks (`kestrel "))
        .unwrap_or_else(|| panic!("no hint: {out:#?}"));
    let cmd = line.split('`').nth(1).unwrap();
    let words = shlex_split(cmd);
    assert_eq!(words[0], "kestrel", "{line}");
    words[1..].to_vec()
}

/// Splits a command line as the shell would (the test's paths need no more than this).
fn shlex_split(cmd: &str) -> Vec<String> {
    cmd.split_whitespace().map(String::from).collect()
}

/// Defect 6: after `kestrel run --server-dir DIR`, its failures stay readable: the hint it
/// prints works as printed (it used to answer "no access file"), and so do other client
/// commands on DIR, which read the record and refuse to change it. The next run replaces the
/// record; a server's journal is never taken for one.
#[test]
fn a_runs_record_answers_client_commands_after_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let srv = dir.path().join("srv");
    let srv_arg = srv.to_str().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "--server-dir",
            srv_arg,
            "run",
            "--array",
            "1-12",
            "--stderr",
            "stream",
            "--",
            "sh",
            "-c",
            "echo oops {task} >&2; exit 3",
        ],
    );
    assert_eq!(out.code(), Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("job 1 task 1: exit code 3 | oops 1"),
        "{out:#?}"
    );
    assert!(
        out.stderr.contains("job 1: ... and 2 more failed tasks"),
        "{out:#?}"
    );
    assert!(
        !srv.join("access.json").exists(),
        "the run's server is gone"
    );
    let hint = hinted_command(&out);
    assert_eq!(
        hint,
        [
            "--server-dir",
            srv_arg,
            "task",
            "list",
            "1",
            "--state",
            "failed"
        ]
    );
    let args: Vec<&str> = hint.iter().map(String::as_str).collect();
    let listed = run_in(dir.path(), &args);
    let rows = listed.ok().stdout.lines().skip(1).count();
    assert_eq!(rows, 12, "{listed:#?}");
    let k = |args: &[&str]| client(&srv, dir.path(), args);
    let info = k(&["task", "info", "1", "12", "--output", "json"])
        .ok()
        .json();
    assert_eq!(info["exit_code"], 3, "{info:#}");
    assert_eq!(
        k(&["job", "cat", "1", "--stderr", "--tasks", "2"])
            .ok()
            .stdout,
        "oops 2\n"
    );
    assert_eq!(k(&["job", "state", "1"]).ok().stdout, "1 failed\n");
    // A record does not change.
    let retry = k(&["job", "retry", "1"]);
    let err = retry.one_line_error();
    assert!(
        err.contains("record of a `kestrel run` that has ended"),
        "{err}"
    );
    assert_eq!(retry.code(), Some(2));
    k(&["submit", "--", "true"]).one_line_error();

    // The next run in the same directory replaces the record.
    let again = run_in(
        dir.path(),
        &[
            "--server-dir",
            srv_arg,
            "run",
            "--array",
            "1-2",
            "--",
            "true",
        ],
    );
    again.ok();
    let jobs = k(&["job", "list", "--output", "json"]).ok().json();
    let jobs = jobs["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "only the second run's job: {jobs:#?}");
    assert_eq!(jobs[0]["name"], "true");
    assert_eq!(jobs[0]["state"], "finished");
}

/// A run killed where it stands (`kill -9`, its node gone) leaves its access file behind; its
/// record is read all the same (its server is gone: nobody holds the directory's lock), with
/// what it had finished before it died.
#[test]
fn a_killed_runs_record_is_read_too() {
    let dir = tempfile::tempdir().unwrap();
    let srv = dir.path().join("srv");
    let srv_arg = srv.to_str().unwrap();
    let mut run = Child::start(
        dir.path(),
        &[
            "--server-dir",
            srv_arg,
            "run",
            "--array",
            "1-3",
            "--",
            "sh",
            "-c",
            "if [ {task} -lt 3 ]; then exit 0; fi; sleep 600",
        ],
        &[],
    );
    let k = |args: &[&str]| client(&srv, dir.path(), args);
    poll("two tasks to finish", COMMAND_LIMIT, || {
        let info = k(&["job", "info", "1", "--output", "json"]);
        (info.code() == Some(0) && info.json()["counts"]["finished"] == 2).then_some(())
    });
    // Task ends are committed a few milliseconds after they are reported; a submission's
    // reply waits for its commit, which takes the ends before it along.
    k(&["submit", "--", "true"]).ok();
    signal(run.child.id(), libc::SIGKILL);
    let _ = run.child.wait();
    assert!(srv.join("access.json").exists(), "a killed run leaves it");
    let info = k(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!(info["counts"]["finished"], 2, "{info:#}");
    let retry = k(&["job", "retry", "1"]);
    let err = retry.one_line_error();
    assert!(
        err.contains("record of a `kestrel run` that has ended"),
        "{err}"
    );
}

/// A server's journal is not a run's record: a run there is refused, and nothing is lost.
#[test]
fn a_run_refuses_a_servers_directory() {
    let mut c = Cluster::with_workers(&[1]);
    c.run(&["submit", "--wait", "--", "true"]).ok();
    c.run(&["server", "stop"]).ok();
    c.wait_server_exit(COMMAND_LIMIT);
    let out = c.run(&["run", "--", "true"]);
    let err = out.one_line_error();
    assert!(
        err.contains("holds the journal of a `kestrel server`"),
        "{err}"
    );
    // Not read as a record either: there is no server to ask.
    assert_eq!(c.run(&["job", "list"]).code(), Some(4));
    c.start_server();
    let state = c.run(&["job", "state", "1"]);
    assert_eq!(state.ok().stdout, "1 finished\n");
}

/// Defect 6 without a record: the run lists every failure itself (nothing could answer a
/// hint afterwards), and `--output json` lists them with their exit code, reason and stderr.
#[test]
fn a_run_without_a_record_lists_every_failure() {
    let dir = tempfile::tempdir().unwrap();
    let failing = [
        "--array",
        "1-12",
        "--",
        "sh",
        "-c",
        "echo oops {task} >&2; exit 3",
    ];
    let mut args = vec!["run"];
    args.extend_from_slice(&failing);
    let out = run_in(dir.path(), &args);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    for t in 1..=12 {
        let line = format!("job 1 task {t}: exit code 3 | oops {t}\n");
        assert!(out.stderr.contains(&line), "{line} in {out:#?}");
    }
    assert!(
        !out.stderr.contains("task list 1"),
        "no hint that cannot work: {out:#?}"
    );

    let mut args = vec!["run", "--output", "json"];
    args.extend_from_slice(&failing);
    let out = run_in(dir.path(), &args);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let v = out.json();
    let failed = v["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 12, "{v:#}");
    assert_eq!(failed[4]["id"], 5);
    assert_eq!(failed[4]["job"], 2);
    assert_eq!(failed[4]["exit_code"], 3);
    assert_eq!(failed[4]["reason"], "exit code 3");
    assert_eq!(failed[4]["stderr_tail"], "oops 5\n");
    assert_eq!(v["record"], serde_json::Value::Null);
}

/// Rough edge: a run whose submission is refused at once says why in one line; its local
/// worker, stopped before it reached the server, is not reported (it raced the refusal).
#[test]
fn a_refused_submission_in_run_says_only_why() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..5 {
        let out = run_in(dir.path(), &["run", "--input", "no-store", "--", "true"]);
        let err = out.one_line_error();
        assert!(err.contains("names a store"), "{err}");
    }
}

/// Sends `sig` to `pid`.
fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain syscall on a child this test started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// A `kestrel` child started in `cwd` with `args` and `envs`, its output in files; and
/// [`Out`] once it exits (within the command limit).
struct Child {
    child: std::process::Child,
    dir: tempfile::TempDir,
    what: String,
}

impl Child {
    fn start(cwd: &Path, args: &[&str], envs: &[(&str, &Path)]) -> Child {
        let dir = tempfile::tempdir().unwrap();
        let mut k = kestrel();
        k.current_dir(cwd)
            .args(args)
            .stdout(fs::File::create(dir.path().join("out")).unwrap())
            .stderr(fs::File::create(dir.path().join("err")).unwrap());
        for (k2, v) in envs {
            k.env(k2, v);
        }
        let what = format!("{k:?}");
        Child {
            child: k.spawn().unwrap(),
            dir,
            what,
        }
    }

    fn wait(mut self) -> Out {
        let status = poll("the command to exit", COMMAND_LIMIT, || {
            self.child.try_wait().unwrap()
        });
        let read = |f: &str| fs::read_to_string(self.dir.path().join(f)).unwrap();
        Out {
            what: self.what.clone(),
            status,
            stdout: read("out"),
            stderr: read("err"),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The state of job `job` on `c`'s server.
fn state(c: &Cluster, job: &str) -> String {
    c.run(&["job", "state", job]).stdout.trim().to_string()
}

/// Rough edge: Ctrl-C (or SIGTERM) on a wait ends the wait, not the job: the command says so
/// and how to wait for it again or cancel it, and exits as a shell expects (130, 143). The
/// commands it names work as printed.
#[test]
fn an_interrupted_wait_says_the_job_goes_on_and_how_to_follow_it() {
    let c = Cluster::with_workers(&[1]);
    let srv = c.server_dir.display().to_string();
    let cases = [
        (
            vec!["submit", "--wait", "--", "sleep", "30"],
            libc::SIGINT,
            130,
            "interrupted",
        ),
        (vec!["job", "wait", "1"], libc::SIGTERM, 143, "terminated"),
    ];
    for (args, sig, code, said) in cases {
        let mut all = vec!["--server-dir", srv.as_str()];
        all.extend_from_slice(&args);
        let child = Child::start(&c.work, &all, &[]);
        poll("job 1 to run", COMMAND_LIMIT, || {
            (state(&c, "1") == "1 running").then_some(())
        });
        // The wait has begun once it prints progress (every 5 s without a terminal).
        let err = child.dir.path().join("err");
        poll("the wait's progress line", COMMAND_LIMIT, || {
            let said = fs::read_to_string(&err).unwrap_or_default();
            said.contains("0/1 tasks done").then_some(())
        });
        signal(child.child.id(), sig);
        let out = child.wait();
        assert_eq!(out.code(), Some(code), "{out:#?}");
        let expected = format!(
            "{said}: job 1 goes on without this command; `kestrel --server-dir {srv} job wait 1` waits for it again, `kestrel --server-dir {srv} job cancel 1` cancels it"
        );
        assert!(out.stderr.contains(&expected), "{expected}\nin {out:#?}");
        assert_eq!(state(&c, "1"), "1 running", "the job went on");
    }
    let cancel = ["--server-dir", srv.as_str(), "job", "cancel", "1"];
    run_in(&c.work, &cancel).ok();
    assert_eq!(state(&c, "1"), "1 canceled");
}

/// Rough edge: Ctrl-C on `kestrel run --alloc` stops it and leaves nothing behind: no worker
/// cache (`kestrel-cache-*`), no temporary server directory, no task.
#[test]
fn an_interrupted_run_with_an_allocation_queue_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let child = Child::start(
        dir.path(),
        &[
            "run",
            "--alloc",
            "local --time-limit 10m --max-workers 2 --worker-args '--slots 1'",
            "--array",
            "1-2",
            "--",
            "sh",
            "-c",
            "echo $$ > pid-{task}; exec sleep 60",
        ],
        &[("TMPDIR", tmp.path())],
    );
    let pids: Vec<i32> = (1..=2)
        .map(|t| {
            poll("the tasks to start", COMMAND_LIMIT, || {
                read_pid(&dir.path().join(format!("pid-{t}")))
            })
        })
        .collect();
    let caches = fs::read_dir(tmp.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("kestrel-cache-")
        })
        .count();
    assert_eq!(caches, 2, "each worker has its scratch cache meanwhile");
    signal(child.child.id(), libc::SIGINT);
    let out = child.wait();
    assert_eq!(out.code(), Some(130), "{out:#?}");
    assert!(
        out.stderr.contains("interrupted: stopping the run"),
        "{out:#?}"
    );
    for pid in pids {
        poll("the task to be gone", COMMAND_LIMIT, || {
            (!alive(pid)).then_some(())
        });
    }
    let left: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind in TMPDIR: {left:?}");
}
