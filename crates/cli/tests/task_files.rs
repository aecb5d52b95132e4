//! The files around a task: its working directory must exist (issue 10, defect 9) and the
//! output files it leaves empty are removed when no other task can be writing them (defect 11).

mod common;

use common::*;
use std::path::Path;

#[test]
fn a_missing_working_directory_fails_the_task_and_is_not_created() {
    let c = Cluster::with_workers(&[1]);
    let missing = c.root().join("no-such-dir");
    let dir = missing.display().to_string();
    let out = c.run(&["submit", "--wait", "--cwd", &dir, "--", "true"]);
    out.failed();
    let rows = task_rows(&c, "1");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0]["reason"],
        format!("working directory '{dir}' does not exist; create it or fix the task's cwd"),
        "{rows:#?}"
    );
    assert!(
        !missing.exists(),
        "the missing working directory was created"
    );
}

#[test]
fn tasks_leave_no_empty_output_files_of_their_own() {
    let c = Cluster::with_workers(&[2]);
    let script = "if [ {task} = 1 ]; then echo out; fi; if [ {task} = 2 ]; then echo err >&2; fi";
    c.run(&[
        "submit", "--wait", "--array", "1-3", "--", "sh", "-c", script,
    ])
    .ok();
    let files = |dir: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(c.work.join(dir))
            .expect("output directory")
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(files("job-1"), ["1.out", "2.err"]);
    assert_eq!(c.read("job-1/1.out").as_deref(), Some("out\n"));
    assert_eq!(c.read("job-1/2.err").as_deref(), Some("err\n"));

    // Paths that other tasks may write (no {job}, or no {task}) are kept even when empty.
    c.run(&[
        "submit",
        "--wait",
        "--array",
        "1-2",
        "--stdout",
        "job-{job}.log",
        "--stderr",
        "errors/{task}.err",
        "--",
        "true",
    ])
    .ok();
    assert_eq!(c.read("job-2.log").as_deref(), Some(""));
    assert_eq!(files("errors"), ["1.err", "2.err"]);
    assert!(!Path::new(&c.path("job-2")).exists());
}
