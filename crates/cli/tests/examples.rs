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

#[test]
fn sim_prints_each_runs_figures_and_refuses_a_bad_scenario_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.toml");
    fs::write(
        &scenario,
        r#"
[cluster]
nodes = 8
cpus = 2
[workload]
tasks = 400
compute = "2s"
[[runs]]
name = "eight"
[[runs]]
name = "four"
cluster.nodes = 4
"#,
    )
    .unwrap();
    let mut cmd = kestrel();
    cmd.args(["sim", "--output", "json"]).arg(&scenario);
    let doc = run_bounded(cmd, COMMAND_LIMIT).ok().json();
    let runs = doc["runs"].as_array().expect("runs");
    let names: Vec<_> = runs.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["eight", "four"]);
    // 400 two-second tasks on 16 and on 8 cpus: 25 and 50 waves.
    assert_eq!(runs[0]["makespan_s"].as_f64(), Some(50.0));
    assert_eq!(runs[1]["makespan_s"].as_f64(), Some(100.0));
    assert_eq!(runs[1]["finished"].as_u64(), Some(400));

    let mut cmd = kestrel();
    cmd.args(["sim", "--run", "four"]).arg(&scenario);
    let out = run_bounded(cmd, COMMAND_LIMIT);
    let table = &out.ok().stdout;
    assert!(
        table.contains("four") && !table.contains("eight"),
        "{table}"
    );

    fs::write(
        &scenario,
        "[cluster]\nnodes = 1\nnodse = 3\n[workload]\ntasks = 1\ncompute = \"1s\"\n",
    )
    .unwrap();
    let mut cmd = kestrel();
    cmd.arg("sim").arg(&scenario);
    let out = run_bounded(cmd, COMMAND_LIMIT);
    assert_eq!(out.status.code(), Some(2), "{out:#?}");
    assert!(
        out.stderr.contains("nodse") && out.stderr.contains("`nodes`"),
        "{out:#?}"
    );
}
