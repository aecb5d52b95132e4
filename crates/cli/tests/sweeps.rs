//! A first real sweep must just work (issue 10): failing points do not hang a run, a job that
//! cannot move says why, `kestrel run` refuses what it can never run, keeps each run's outputs
//! apart, and lets tasks submit tasks.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;

/// `kestrel run` in `cwd`, with no server directory of the caller's.
fn run_in(cwd: &Path, args: &[&str]) -> Out {
    let mut c = kestrel();
    c.args(args).current_dir(cwd);
    run_bounded(c, COMMAND_LIMIT)
}

/// Defect 1, exactly as reported: it stopped at 101/300 with both workers quarantined.
#[test]
fn a_sweep_with_every_fifth_point_failing_ends_with_exactly_those_failed() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "run",
            "--workers",
            "2",
            "--slots",
            "1",
            "--array",
            "1-300",
            "--output",
            "json",
            "--",
            "sh",
            "-c",
            "test $(({task} % 5)) -ne 0",
        ],
    );
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let v = out.json();
    assert_eq!(
        (
            v["counts"]["finished"].as_u64(),
            v["counts"]["failed"].as_u64()
        ),
        (Some(240), Some(60)),
        "{v}"
    );
    assert!(!out.stderr.contains("quarantined"), "{}", out.stderr);
}

/// Defect 7: `run` cannot get a bigger worker, so it refuses at once instead of waiting forever.
#[test]
fn run_refuses_tasks_bigger_than_its_workers() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &["run", "--slots", "2", "--cpus", "4", "--", "echo", "big"],
    );
    let err = out.one_line_error();
    assert!(
        err.contains("each task needs 4 cpus, but each local worker has 2 slots"),
        "{err}"
    );
}

/// Defect 9: a second run in the same directory must not write into the first one's outputs.
#[test]
fn a_second_run_here_keeps_the_first_run_s_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let first = run_in(
        dir.path(),
        &["run", "--array", "1-3", "--", "echo", "first", "{task}"],
    );
    first.ok();
    assert!(first.stderr.contains("outputs in job-1/"), "{first:#?}");
    let second = run_in(
        dir.path(),
        &["run", "--array", "1-3", "--", "echo", "second", "{task}"],
    );
    second.ok();
    assert!(second.stderr.contains("outputs in job-2/"), "{second:#?}");
    for t in 1..=3 {
        let read = |j: u32| std::fs::read_to_string(dir.path().join(format!("job-{j}/{t}.out")));
        assert_eq!(read(1).unwrap(), format!("first {t}\n"));
        assert_eq!(read(2).unwrap(), format!("second {t}\n"));
    }
}

/// Defect 6: tasks under `kestrel run` find its server (KESTREL_SERVER_DIR, honouring
/// `--server-dir`) and can submit tasks, which the run waits for.
#[test]
fn tasks_under_run_submit_tasks_that_the_run_waits_for() {
    let dir = tempfile::tempdir().unwrap();
    let server_dir = dir.path().join("srv");
    let bin_dir = Path::new(BIN).parent().unwrap().display().to_string();
    let script = format!(
        "echo \"$KESTREL_SERVER_DIR\" > seen-dir; PATH={bin_dir}:$PATH kestrel submit --array 1-4 --stdout child-{{task}}.out -- sh -c 'sleep 0.2; echo child'"
    );
    let out = run_in(
        dir.path(),
        &[
            "--server-dir",
            server_dir.to_str().unwrap(),
            "run",
            "--output",
            "json",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    out.ok();
    let seen = std::fs::read_to_string(dir.path().join("seen-dir")).unwrap();
    assert_eq!(seen.trim(), server_dir.display().to_string());
    let v = out.json();
    // The parent task and the 4 it submitted, all finished before the run ended.
    assert_eq!(v["tasks"].as_u64(), Some(5), "{v}");
    assert_eq!(v["counts"]["finished"].as_u64(), Some(5), "{v}");
    // `{task}` in the parent's command was the parent's id (0): the children share one file,
    // and each added its line to it.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("child-0.out")).unwrap(),
        "child\n".repeat(4)
    );
}

fn job_info(c: &Cluster, job: &str) -> Value {
    c.run(&["job", "info", job, "--output", "json"]).ok().json()
}

/// Defect 7 on a server: the job is kept (a bigger worker may come), the submitter is warned,
/// and `job info` says why it waits.
#[test]
fn a_job_too_big_for_every_worker_is_kept_with_a_warning_and_a_reason() {
    let c = Cluster::with_workers(&[2]);
    let out = c.run(&["submit", "--cpus", "3", "--", "echo", "big"]);
    out.ok();
    assert!(
        out.stderr
            .contains("warning: job 1 cannot run on the workers connected now: each task needs 3 cpus, the largest worker has 2 cpus"),
        "{out:#?}"
    );
    let info = job_info(&c, "1");
    let waiting = info["waiting"].as_str().unwrap_or_default();
    assert!(waiting.starts_with("each task needs 3 cpus"), "{info}");
    // No task has run: no figure, rather than zeros.
    assert!(info["timing"]["mean_run_us"].is_null(), "{info}");
    let table = c.run(&["job", "info", "1"]).ok().stdout.clone();
    assert!(table.contains("waiting"), "{table}");
}

const FAILS_ON_WORKER_1: &str = "test \"$KESTREL_WORKER_ID\" != 1";

/// Defect 1 on a server: when every worker able to run a job is quarantined, `job info` says
/// so and how to lift it; the last healthy worker leaving does not go unexplained.
#[test]
fn a_job_waiting_for_quarantined_workers_says_so() {
    // One at a time, so worker index i has id i + 1.
    let mut c = Cluster::new();
    c.add_worker(1);
    c.wait_workers(1);
    c.add_worker(1);
    c.wait_workers(2);
    // Jobs until worker 1 is judged (how many of its failures that takes depends on how fast
    // worker 2 runs its share on a loaded machine).
    let mut jobs = 0;
    let quarantined = loop {
        c.run(&[
            "submit",
            "--array",
            "1-200",
            "--wait",
            "--",
            "sh",
            "-c",
            FAILS_ON_WORKER_1,
        ]);
        jobs += 1;
        let w = c.run(&["worker", "list", "--output", "json"]).ok().json();
        let q: Vec<Value> = w["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| !w["quarantine_reason"].is_null())
            .map(|w| w["id"].clone())
            .collect();
        if !q.is_empty() || jobs == 5 {
            break q;
        }
    };
    assert_eq!(quarantined, vec![Value::from(1)]);
    // The healthy worker goes away; new work has nowhere to go.
    c.kill_worker(1);
    poll("the lost worker to be dropped", COMMAND_LIMIT, || {
        let w = c.run(&["worker", "list", "--output", "json"]).ok().json();
        (w["workers"].as_array().unwrap().len() == 1).then_some(())
    });
    c.run(&["submit", "--array", "1-5", "--", "true"]).ok();
    let job = (jobs + 1).to_string();
    let info = job_info(&c, &job);
    assert_eq!(
        info["waiting"].as_str(),
        Some("no worker can take these tasks: 1 worker quarantined (1); `kestrel worker resume ID` lifts it"),
        "{info}"
    );
    c.run(&["worker", "resume", "1"]).ok();
    let done = c.run(&["job", "wait", &job, "--quiet"]);
    done.ok();
}

/// `--quarantine off`: a failing node keeps getting work.
#[test]
fn quarantine_can_be_switched_off() {
    let mut c = Cluster::with_server_args(&["--quarantine", "off"]);
    c.add_worker(1);
    c.add_worker(1);
    c.wait_workers(2);
    let out = c.run(&[
        "submit",
        "--array",
        "1-200",
        "--wait",
        "--",
        "sh",
        "-c",
        FAILS_ON_WORKER_1,
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let w = c.run(&["worker", "list", "--output", "json"]).ok().json();
    assert!(
        w["workers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["quarantine_reason"].is_null()),
        "{w}"
    );
}

/// Day-one resources: `--mem` and named resources on tasks and workers.
#[test]
fn tasks_go_where_their_memory_and_named_resources_are() {
    let mut c = Cluster::new();
    c.add_worker_with(2, &["--resource", "licenses=1", "--mem", "1G"]);
    c.wait_workers(1);
    c.add_worker_with(2, &["--mem", "8G"]);
    c.wait_workers(2);
    let out = c.run(&[
        "submit",
        "--array",
        "1-6",
        "--resource",
        "licenses=1",
        "--wait",
        "--",
        "true",
    ]);
    out.ok();
    let page = c
        .run(&["task", "list", "1", "--output", "json"])
        .ok()
        .json();
    let on: Vec<&Value> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["worker"])
        .collect();
    assert!(on.iter().all(|w| **w == 1), "{page}");
    // More memory than any worker has: kept, with a warning saying so.
    let out = c.run(&["submit", "--mem", "16G", "--", "true"]);
    out.ok();
    assert!(
        out.stderr.contains(
            "each task needs 16.0 GiB of memory, the largest worker has 8.0 GiB of memory"
        ),
        "{out:#?}"
    );
    // What a job holds and what workers offer can be seen.
    let info = c.run(&["job", "info", "2", "--output", "json"]).ok().json();
    assert_eq!(info["mem"], 16u64 << 30, "{info}");
    let table = c.run(&["job", "info", "1"]).ok().stdout.clone();
    assert!(table.contains("1 cpu, 1 licenses per task"), "{table}");
    let w = c.run(&["worker", "list", "--output", "json"]).ok().json();
    assert_eq!(w["workers"][0]["resources"]["licenses"], 1, "{w}");
    assert_eq!(w["workers"][0]["mem"], 1u64 << 30, "{w}");
    let table = c.run(&["worker", "list"]).ok().stdout.clone();
    assert!(table.contains("1.0 GiB, licenses=1"), "{table}");
    // A bad resource is refused before anything is sent.
    let bad = c.run(&["submit", "--resource", "licenses", "--", "true"]);
    assert!(
        bad.one_line_error().contains("must look like NAME=N"),
        "{bad:#?}"
    );
}

/// Two runs started together in one directory take different job numbers (found in a user's
/// trial: both wrote into job-1/).
#[test]
fn runs_started_together_here_keep_their_outputs_apart() {
    let dir = tempfile::tempdir().unwrap();
    let start = |tag: &str| {
        let mut c = kestrel();
        c.args(["run", "--array", "1-4", "--", "sh", "-c"])
            .arg(format!("sleep 0.3; echo {tag}{{task}}"))
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        c.spawn().expect("start a run")
    };
    let (mut a, mut b) = (start("A"), start("B"));
    let deadline = std::time::Instant::now() + COMMAND_LIMIT;
    for p in [&mut a, &mut b] {
        loop {
            if let Some(s) = p.try_wait().unwrap() {
                assert!(s.success());
                break;
            }
            assert!(std::time::Instant::now() < deadline, "a run did not end");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let mut seen = Vec::new();
    for job in 1..=2 {
        let read = |t: u32| std::fs::read_to_string(dir.path().join(format!("job-{job}/{t}.out")));
        let first = read(1).unwrap();
        let tag = &first[..1];
        for t in 1..=4 {
            assert_eq!(
                read(t).unwrap(),
                format!("{tag}{t}\n"),
                "job-{job} mixes runs"
            );
        }
        seen.push(tag.to_string());
    }
    seen.sort();
    assert_eq!(seen, ["A", "B"]);
}

/// Streamed stdout still leaves stderr files under job-N: a second run must not reuse job-1.
#[test]
fn a_streamed_run_does_not_write_into_an_earlier_run_s_stderr_files() {
    let dir = tempfile::tempdir().unwrap();
    run_in(
        dir.path(),
        &["run", "--array", "1-2", "--", "sh", "-c", "echo first >&2"],
    )
    .ok();
    let second = run_in(
        dir.path(),
        &[
            "run",
            "--array",
            "1-2",
            "--stdout",
            "stream",
            "--",
            "sh",
            "-c",
            "echo second >&2",
        ],
    );
    second.ok();
    assert!(second.stderr.contains("outputs in job-2/"), "{second:#?}");
    for t in 1..=2 {
        let read = |j: u32| std::fs::read_to_string(dir.path().join(format!("job-{j}/{t}.err")));
        assert_eq!(read(1).unwrap(), "first\n");
        assert_eq!(read(2).unwrap(), "second\n");
    }
}

/// The outputs line names where the files are, and nothing when there are none.
#[test]
fn the_outputs_line_names_the_real_directory_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let out = run_in(
        dir.path(),
        &["run", "--array", "1-2", "--cwd", "sub", "--", "pwd"],
    );
    out.ok();
    assert!(out.stderr.contains("outputs in sub/job-1/"), "{out:#?}");
    let quiet = run_in(dir.path(), &["run", "--array", "1-2", "--", "true"]);
    quiet.ok();
    assert!(!quiet.stderr.contains("outputs in"), "{quiet:#?}");
    assert!(
        !dir.path().join("job-1").exists(),
        "an empty job directory is not left behind"
    );
}

/// Ctrl-C stops a run cleanly: its tasks with it, status 130, no temporary server directory
/// left behind (found in a user's trial).
#[test]
fn an_interrupted_run_stops_its_tasks_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut c = kestrel();
    c.args([
        "run",
        "--array",
        "1-2",
        "--",
        "sh",
        "-c",
        "echo $$ > pid-{task}; sleep 60",
    ])
    .current_dir(dir.path())
    .env("TMPDIR", &tmp)
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    let mut run = c.spawn().unwrap();
    let pids: Vec<i32> = (1..=2)
        .map(|t| {
            let f = dir.path().join(format!("pid-{t}"));
            poll("the task to start", COMMAND_LIMIT, || read_pid(&f))
        })
        .collect();
    // SAFETY: signals our own child.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let status = poll("the run to stop", COMMAND_LIMIT, || run.try_wait().unwrap());
    assert_eq!(status.code(), Some(130));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("interrupted: stopping the run and its tasks"),
        "{err}"
    );
    for pid in pids {
        poll(
            "the task to be gone",
            std::time::Duration::from_secs(5),
            || (!alive(pid)).then_some(()),
        );
    }
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "temporary files left"
    );
}

/// Issue 29, defect 2, as reported: `kestrel run --array 1-5 --stdout all.txt` left "hi 5".
/// A file the tasks share is written afresh in task order (GNU parallel's --keep-order),
/// however the tasks were spread over workers and whenever they ended.
#[test]
fn a_file_the_tasks_share_holds_every_task_s_output_in_task_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("all.txt"), "an earlier run's\n").unwrap();
    let out = run_in(
        dir.path(),
        &[
            "run",
            "--workers",
            "2",
            "--slots",
            "2",
            "--array",
            "1-12",
            "--stdout",
            "all.txt",
            "--stderr",
            "all.txt",
            "--",
            "sh",
            "-c",
            // Later tasks end first; each writes stdout, then stderr after a pause.
            "echo hi {task}; sleep 0.0$((12 - {task})); echo err {task} >&2",
        ],
    );
    out.ok();
    let want: String = (1..=12).map(|t| format!("hi {t}\nerr {t}\n")).collect();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("all.txt")).unwrap(),
        want
    );
    assert!(out.stderr.contains("outputs in all.txt"), "{out:#?}");
    // Grouped by a field of the line, and nothing of the run's own left behind.
    std::fs::write(dir.path().join("pairs.txt"), "x 1\ny 2\nx 3\ny 4\n").unwrap();
    run_in(
        dir.path(),
        &[
            "run",
            "--each",
            "pairs.txt",
            "--stdout",
            "by-{line:1}.txt",
            "--",
            "echo",
            "{line:2}",
        ],
    )
    .ok();
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    assert_eq!(
        (read("by-x.txt"), read("by-y.txt")),
        ("1\n3\n".into(), "2\n4\n".into())
    );
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["all.txt", "by-x.txt", "by-y.txt", "pairs.txt"]);
}

/// A run whose submission is refused leaves a file its tasks would have shared as it was (it
/// was written afresh, empty, from the parts of jobs never submitted).
#[test]
fn a_refused_run_leaves_the_shared_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("all.txt"), "kept\n").unwrap();
    let out = run_in(
        dir.path(),
        &[
            "run", "--array", "1-3", "--after", "99", "--stdout", "all.txt", "--", "echo", "hi",
            "{task}",
        ],
    );
    assert!(
        out.one_line_error().contains("job 99 does not exist"),
        "{out:#?}"
    );
    let all = std::fs::read_to_string(dir.path().join("all.txt")).unwrap();
    assert_eq!(all, "kept\n");
}
