//! Reading tasks' outputs: `kestrel job cat`, `kestrel task output`, and streamed output
//! (`--stdout stream`) kept by the server instead of one file per task.

mod common;

use common::*;

/// `kestrel submit FLAGS -- sh -c SCRIPT`, the flags separated by spaces.
fn submit_sh(c: &Cluster, flags: &str, script: &str) -> Out {
    let mut args = vec!["submit"];
    args.extend(flags.split_whitespace());
    args.extend_from_slice(&["--", "sh", "-c", script]);
    c.run(&args)
}

/// `sh -c SCRIPT` tasks over `ids` whose stdout and stderr are streamed; waits for the job.
fn submit_streamed(c: &Cluster, ids: &str, script: &str) {
    let flags = format!("--array {ids} --stdout stream --stderr stream --wait");
    submit_sh(c, &flags, script).ok();
}

/// The lines `prefix N` for N in `ids`, as one text.
fn lines(prefix: &str, ids: impl IntoIterator<Item = u32>) -> String {
    ids.into_iter().map(|i| format!("{prefix} {i}\n")).collect()
}

#[test]
fn streamed_output_is_printed_in_task_order_and_makes_no_files() {
    let c = Cluster::with_workers(&[2]);
    // Later tasks end first half of the time, so the log's order is not the order of the ends.
    submit_streamed(
        &c,
        "1-40",
        "sleep 0.0$(( (50 - {task}) % 4 )); echo out {task}; echo err {task} >&2",
    );
    let out = c.run(&["job", "cat", "1"]);
    assert_eq!(out.ok().stdout, lines("out", 1..=40));
    assert_eq!(out.stderr, "", "nothing to note");
    let out = c.run(&["job", "cat", "1", "--stderr", "--tasks", "5-7,39"]);
    assert_eq!(out.ok().stdout, lines("err", [5, 6, 7, 39]));
    let out = c.run(&["task", "output", "1", "12", "--stderr"]);
    assert_eq!(out.ok().stdout, "err 12\n");
    // Ids that are not tasks of the job are named, not an error.
    let out = c.run(&["job", "cat", "1", "--tasks", "40-42"]);
    assert_eq!(out.ok().stdout, "out 40\n");
    assert!(out.stderr.contains("job 1 has no tasks 41, 42"), "{out:#?}");
    let made: Vec<_> = std::fs::read_dir(&c.work).unwrap().collect();
    assert!(made.is_empty(), "streamed output made files: {made:?}");
}

#[test]
fn streamed_output_survives_a_killed_server() {
    let mut c = Cluster::with_workers(&[2]);
    submit_streamed(&c, "1-10", "echo kept {task}; echo oops {task} >&2");
    c.kill_server();
    c.start_server();
    assert_eq!(
        c.run(&["job", "cat", "1"]).ok().stdout,
        lines("kept", 1..=10)
    );
    assert_eq!(
        c.run(&["job", "cat", "1", "--stderr", "--tasks", "3"])
            .ok()
            .stdout,
        "oops 3\n"
    );
}

#[test]
fn output_over_the_limit_is_cut_with_a_note() {
    let c = Cluster::with_workers(&[1]);
    submit_sh(
        &c,
        "--array 1-2 --stdout stream:1K --stderr none --wait",
        "head -c 5000 /dev/zero | tr '\\0' x",
    )
    .ok();
    let out = c.run(&["job", "cat", "1"]);
    assert_eq!(out.ok().stdout, "x".repeat(2048));
    assert!(
        out.stderr
            .contains("task 1 of job 1 wrote 5000 bytes to stdout; only the first 1024 were kept"),
        "{out:#?}"
    );
    let out = c.run(&["task", "output", "1", "2"]);
    assert_eq!(out.ok().stdout, "x".repeat(1024));
    assert!(
        out.stderr.contains("task 2 of job 1 wrote 5000 bytes"),
        "{out:#?}"
    );
    // More than a stream may keep is refused at once.
    let err = c
        .run(&["submit", "--stdout", "stream:8M", "--", "true"])
        .one_line_error()
        .to_string();
    assert!(err.contains("at most 4M"), "{err}");
}

#[test]
fn task_output_reads_files_and_says_when_there_is_nothing_yet() {
    let mut c = Cluster::new();
    // No worker yet: the task has not run.
    submit_sh(
        &c,
        "--array 1-3",
        "echo file {task}; [ {task} -ne 3 ] || echo bad >&2",
    )
    .ok();
    let err = c
        .run(&["task", "output", "1", "2"])
        .one_line_error()
        .to_string();
    assert!(
        err.contains("task 2 of job 1 has not run yet (it is queued)"),
        "{err}"
    );
    let out = c.run(&["job", "cat", "1"]);
    assert_eq!(out.ok().stdout, "");
    assert!(
        out.stderr.contains("3 task(s) of job 1 have not ended yet"),
        "{out:#?}"
    );

    c.add_worker(1);
    c.run(&["job", "wait", "1"]).ok();
    assert_eq!(c.run(&["task", "output", "1", "2"]).ok().stdout, "file 2\n");
    assert_eq!(
        c.run(&["job", "cat", "1"]).ok().stdout,
        lines("file", 1..=3)
    );
    assert_eq!(c.run(&["job", "cat", "1", "--stderr"]).ok().stdout, "bad\n");
    // An output file that is gone because it was empty prints nothing.
    std::fs::remove_file(c.work.join("job-1/1.err")).ok();
    assert_eq!(
        c.run(&["task", "output", "1", "1", "--stderr"]).ok().stdout,
        ""
    );
    // Files on a machine this one does not see are named as such.
    std::fs::remove_dir_all(c.work.join("job-1")).unwrap();
    let err = c
        .run(&["task", "output", "1", "2"])
        .one_line_error()
        .to_string();
    assert!(err.contains("is not on this machine"), "{err}");
    let out = c.run(&["job", "cat", "1"]);
    out.failed();
    assert!(out.stderr.contains("not on this machine"), "{out:#?}");
    // A job that discards its output says so.
    submit_sh(&c, "--stdout none --wait", "true").ok();
    let err = c.run(&["job", "cat", "2"]).one_line_error().to_string();
    assert!(err.contains("discards its tasks' stdout"), "{err}");
    let err = c
        .run(&["task", "output", "1", "7"])
        .one_line_error()
        .to_string();
    assert!(err.contains("job 1 has no task 7"), "{err}");
}

#[test]
fn run_prints_streamed_output_in_task_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = kestrel();
    cmd.args([
        "run",
        "--workers",
        "1",
        "--slots",
        "2",
        "--array",
        "1-25",
        "--stdout",
        "stream",
        "--stderr",
        "none",
        "--",
        "sh",
        "-c",
    ])
    .arg("sleep 0.0$(( (30 - {task}) % 3 )); echo line {task}")
    .current_dir(dir.path());
    let out = run_bounded(cmd, COMMAND_LIMIT);
    out.ok();
    // Stdout carries what the tasks streamed and nothing else; the summary is on stderr.
    assert_eq!(out.stdout, lines("line", 1..=25));
    assert!(
        out.stderr.starts_with("25 tasks on 1 worker x 2 slots"),
        "{out:#?}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no files"
    );
}

#[test]
fn a_log_bigger_than_a_message_travels_and_is_read_in_pages() {
    let c = Cluster::with_workers(&[4]);
    // Five tasks keep 4 MiB each: 20 MiB, more than a frame (16 MiB) both ways.
    submit_sh(
        &c,
        "--array 1-5 --stdout stream:4M --stderr none --wait",
        "head -c 4194304 /dev/zero | tr '\\0' {task}",
    )
    .ok();
    let out = c.run(&["job", "cat", "1"]);
    let expected: String = (1..=5).map(|t| t.to_string().repeat(4 << 20)).collect();
    assert!(
        out.ok().stdout == expected,
        "job cat printed {} bytes",
        out.stdout.len()
    );
}

#[test]
fn outputs_of_tasks_that_end_while_the_server_is_down_are_handed_over() {
    let mut c = Cluster::with_workers(&[2]);
    submit_sh(
        &c,
        "--array 1-2 --stdout stream --stderr none",
        // A second run would say so: the output must be the first run's, handed over.
        "[ -e {task}.ended ] && { echo rerun {task}; exit 0; }; touch {task}.started; \
         while [ ! -e go ]; do sleep 0.01; done; echo done {task}; touch {task}.ended",
    )
    .ok();
    poll("both tasks to start", STARTUP, || {
        (c.work.join("1.started").exists() && c.work.join("2.started").exists()).then_some(())
    });
    c.kill_server();
    std::fs::write(c.work.join("go"), "").unwrap();
    poll("both tasks to end", STARTUP, || {
        (c.work.join("1.ended").exists() && c.work.join("2.ended").exists()).then_some(())
    });
    c.start_server();
    c.run(&["job", "wait", "1"]).ok();
    assert_eq!(
        c.run(&["job", "cat", "1"]).ok().stdout,
        lines("done", 1..=2)
    );
    assert!(c.read("1.started").is_some());
}

#[test]
fn a_rerun_replaces_the_output_of_the_run_before() {
    let c = Cluster::with_workers(&[1]);
    // First runs print and fail; the retries print only for task 2.
    let script = "if [ ! -e {task}.ran ]; then touch {task}.ran; echo first {task}; exit 1; fi; \
                  [ {task} -eq 2 ] && echo second {task}; exit 0";
    submit_sh(&c, "--array 1-2 --retries 1 --stdout stream --wait", script).ok();
    assert_eq!(c.run(&["job", "cat", "1"]).ok().stdout, "second 2\n");
    // `job retry` of a failed task: its new run's output replaces the failed one's.
    submit_sh(&c, "--array 3 --stdout stream --wait", script).failed();
    assert_eq!(c.run(&["job", "cat", "2"]).ok().stdout, "first 3\n");
    c.run(&["job", "retry", "2"]).ok();
    c.run(&["job", "wait", "2"]).ok();
    assert_eq!(c.run(&["job", "cat", "2"]).ok().stdout, "");
}

#[test]
fn forgetting_a_job_drops_its_output_log() {
    let c = Cluster::with_workers(&[2]);
    submit_streamed(&c, "1-4", "echo kept {task}");
    submit_streamed(&c, "1-2", "echo other {task}");
    let rows = |job: u32| -> i64 {
        let db = rusqlite::Connection::open_with_flags(
            c.server_dir.join("journal.sqlite"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        db.query_row("SELECT count(*) FROM output WHERE job = ?1", [job], |r| {
            r.get(0)
        })
        .unwrap()
    };
    assert_eq!((rows(1), rows(2)), (4, 2));
    c.run(&["job", "forget", "1"]).ok();
    assert_eq!((rows(1), rows(2)), (0, 2));
    assert_eq!(
        c.run(&["job", "cat", "2"]).ok().stdout,
        lines("other", 1..=2)
    );
    c.run(&["job", "cat", "1"]).failed();
}

/// Issue 29, defect 2: tasks sharing one `--stdout` file left only the last task's output.
/// On a server each task adds its output whole when it ends, stdout and stderr as written,
/// after what the file held; `job cat` prints the file once.
#[test]
fn tasks_sharing_a_file_on_a_server_add_their_output_whole() {
    let c = Cluster::with_workers(&[2, 2]);
    std::fs::write(c.work.join("all.txt"), "from before\n").unwrap();
    submit_sh(
        &c,
        "--array 1-20 --stdout all.txt --stderr all.txt --wait",
        // Each task writes twice, with a pause between, while three others run.
        "echo a{task}; sleep 0.0$(({task} % 4)); echo b{task} >&2",
    )
    .ok();
    let text = c.read("all.txt").unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("from before"));
    let rest: Vec<&str> = lines.collect();
    assert_eq!(rest.len(), 40, "{text}");
    let mut tasks: Vec<u32> = rest
        .chunks(2)
        .map(|pair| {
            let t = pair[0].strip_prefix('a').expect("a task's first line");
            assert_eq!(pair[1], format!("b{t}"), "a task's lines apart: {text}");
            t.parse().unwrap()
        })
        .collect();
    tasks.sort_unstable();
    assert_eq!(tasks, (1..=20).collect::<Vec<_>>());
    let out = c.run(&["job", "cat", "1"]);
    assert_eq!(out.ok().stdout, text, "printed once");
    assert!(
        out.stderr.contains("tasks of job 1 share") && out.stderr.contains("printed once"),
        "{out:#?}"
    );
}

/// Issue 29, defect 9: a deleted output file was passed over in silence (status 0). It is
/// named, the other tasks' outputs printed, and the status is 2. A task that wrote nothing
/// has no file either (its worker removed it), and that is not taken for a deleted one: the
/// worker told the server.
#[test]
fn a_deleted_output_file_is_named_and_the_rest_printed() {
    let c = Cluster::with_workers(&[2]);
    submit_sh(
        &c,
        "--array 1-4 --wait",
        "[ {task} -eq 4 ] || echo out {task}; [ {task} -ne 3 ] || echo bad >&2",
    )
    .ok();
    assert!(
        !c.work.join("job-1/4.out").exists(),
        "an empty output is removed"
    );
    std::fs::remove_file(c.work.join("job-1/2.out")).unwrap();
    let out = c.run(&["job", "cat", "1"]);
    assert_eq!(out.code(), Some(2), "{out:#?}");
    assert_eq!(out.stdout, lines("out", [1, 3]));
    let gone = |file: &str, task| {
        format!(
            "error: the {} file of task {task}, {}, is missing: it was deleted or moved since the task wrote it",
            if file.ends_with(".out") { "stdout" } else { "stderr" },
            c.path(file)
        )
    };
    assert_eq!(out.stderr.trim(), gone("job-1/2.out", 2));
    let out = c.run(&["task", "output", "1", "2"]);
    assert_eq!(out.code(), Some(2), "{out:#?}");
    assert_eq!(out.one_line_error(), gone("job-1/2.out", 2));
    assert_eq!(c.run(&["task", "output", "1", "4"]).ok().stdout, "");
    // Stderr: only task 3 wrote any; its file deleted is named too.
    assert_eq!(c.run(&["job", "cat", "1", "--stderr"]).ok().stdout, "bad\n");
    std::fs::remove_file(c.work.join("job-1/3.err")).unwrap();
    let out = c.run(&["job", "cat", "1", "--stderr"]);
    assert_eq!(out.code(), Some(2), "{out:#?}");
    assert_eq!(out.stderr.trim(), gone("job-1/3.err", 3));
}

/// Issue 29: a job whose tasks write nothing where its outputs go left an empty `job-N/`.
#[test]
fn an_ended_job_leaves_no_empty_output_directory() {
    let c = Cluster::with_workers(&[2]);
    submit_sh(&c, "--array 1-3 --stdout none --wait", "true").ok();
    submit_sh(
        &c,
        "--array 1-3 --stdout none --wait",
        "[ {task} -ne 2 ] || echo e >&2",
    )
    .ok();
    poll("job-1/ to go", STARTUP, || {
        (!c.work.join("job-1").exists()).then_some(())
    });
    // A directory with an output in it stays, with that output alone.
    assert_eq!(c.read("job-2/2.err").as_deref(), Some("e\n"));
    let left: Vec<_> = std::fs::read_dir(c.work.join("job-2")).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

/// Issue 29: a new server's job 1 wrote into the `job-1/` of an earlier `kestrel run` there.
/// A server numbers its jobs after the `job-N` directories of the directory it starts in; a
/// job submitted from a directory whose `job-N/` it meets anyway is warned about.
#[test]
fn a_new_server_numbers_its_jobs_after_the_outputs_there() {
    let mut c = Cluster::new();
    c.kill_server();
    std::fs::remove_dir_all(&c.server_dir).unwrap();
    let mut run = kestrel();
    run.args(["run", "--array", "1-2", "--", "echo", "run", "{task}"])
        .current_dir(&c.work);
    run_bounded(run, COMMAND_LIMIT).ok();
    c.start_server();
    c.add_worker(1);
    let out = submit_sh(&c, "--array 1-2 --wait", "echo server {task}");
    assert!(out.ok().stderr.contains("submitted job 2 "), "{out:#?}");
    for t in 1..=2 {
        assert_eq!(
            c.read(&format!("job-1/{t}.out")),
            Some(format!("run {t}\n"))
        );
        assert_eq!(
            c.read(&format!("job-2/{t}.out")),
            Some(format!("server {t}\n"))
        );
    }
    // Elsewhere, an old job-3/ in the way.
    std::fs::create_dir_all(c.work.join("elsewhere/job-3")).unwrap();
    let out = submit_sh(&c, "--cwd elsewhere --wait", "echo new");
    let warning = format!(
        "warning: job-3/ in {} already held files before job 3",
        c.path("elsewhere")
    );
    assert!(out.ok().stderr.contains(&warning), "{out:#?}");
}
