//! The examples the README points to do what their comments say.

mod common;

use common::*;
use std::fs;
use std::path::Path;

#[test]
fn the_sweep_example_writes_its_outputs_where_it_says() {
    // A copy, so the repository's examples/ stays clean.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("examples");
    fs::create_dir_all(&copy).unwrap();
    for f in ["sweep.toml", "primes.sh"] {
        fs::copy(examples.join(f), copy.join(f)).unwrap();
    }
    // 203 small CPU-bound tasks: more time than one quick command gets on a busy machine.
    let mut cmd = kestrel();
    cmd.arg("--server-dir")
        .arg(dir.path().join("no-server"))
        .args(["run", "--quiet", "--file", "examples/sweep.toml"])
        .current_dir(dir.path());
    let out = run_bounded(cmd, 4 * COMMAND_LIMIT);
    assert!(out.ok().stderr.contains("203 finished"), "{out:#?}");
    let read = |name: &str| fs::read_to_string(copy.join("out").join(name)).ok();
    assert_eq!(read("greetings-0.txt").as_deref(), Some("hello\n"));
    assert_eq!(read("greetings-1.txt").as_deref(), Some("bonjour\n"));
    assert_eq!(
        read("greetings-2.txt").as_deref(),
        Some("hallo from task 2\n")
    );
    assert_eq!(
        read("primes-7.txt").as_deref(),
        Some("block 7: 210 primes in [14000, 16000)\n")
    );
    assert!(
        !dir.path().join("job-1").exists() && !copy.join("job-1").exists(),
        "nothing outside out/"
    );
}

#[test]
fn the_pipeline_example_runs_its_tasks_after_their_deps() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("examples");
    fs::create_dir_all(&copy).unwrap();
    fs::copy(examples.join("pipeline.toml"), copy.join("pipeline.toml")).unwrap();
    let mut cmd = kestrel();
    cmd.arg("--server-dir")
        .arg(dir.path().join("no-server"))
        .args([
            "run",
            "--quiet",
            "--workers",
            "2",
            "--file",
            "examples/pipeline.toml",
        ])
        .current_dir(dir.path());
    run_bounded(cmd, COMMAND_LIMIT).ok();
    let all = fs::read_to_string(copy.join("out/all.txt")).unwrap();
    assert_eq!(all, "part 1\npart 2\npart 3\n");
}
