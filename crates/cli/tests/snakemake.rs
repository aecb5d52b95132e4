//! Snakemake drives Kestrel as a cluster (issue 29): its cluster-generic executor appends the
//! job script to the submit command, `kestrel submit --parsable JOBSCRIPT`, and reads the job
//! id from stdout. Needs snakemake and its cluster-generic executor plugin (pinned in
//! `tests/snakemake/requirements.txt`); without them the test shows as ignored, saying why.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The snakemake to run: `KESTREL_TEST_SNAKEMAKE`, else `snakemake` on the PATH; `None` (with
/// why) if it or the cluster-generic plugin is missing.
fn snakemake() -> Result<String, String> {
    let exe = std::env::var("KESTREL_TEST_SNAKEMAKE").unwrap_or_else(|_| "snakemake".into());
    let help = Command::new(&exe)
        .arg("--help")
        .output()
        .map_err(|e| format!("{exe} cannot run ({e})"))?;
    let help = String::from_utf8_lossy(&help.stdout);
    if !help.contains("cluster-generic-submit-cmd") {
        return Err(format!(
            "{exe} has no cluster-generic executor (snakemake-executor-plugin-cluster-generic)"
        ));
    }
    Ok(exe)
}

/// Runs snakemake in `c`'s work directory (a copy of `tests/snakemake/Snakefile`), with
/// `kestrel` on the PATH and `c`'s server as the tasks' and commands' server.
fn run_workflow(c: &Cluster, exe: &str, extra: &[&str]) -> Out {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snakemake/Snakefile");
    std::fs::copy(&here, c.work.join("Snakefile")).unwrap();
    let bin_dir = Path::new(BIN).parent().unwrap().display().to_string();
    let path = format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(exe);
    cmd.args([
        "--executor",
        "cluster-generic",
        // No `--` and no wrapper: the job script is appended as the program.
        "--cluster-generic-submit-cmd",
        "kestrel submit --parsable",
        "--jobs",
        "3",
        "--seconds-between-status-checks",
        "1",
    ])
    .args(extra)
    .current_dir(&c.work)
    .env("PATH", path)
    .env("KESTREL_SERVER_DIR", &c.server_dir)
    .env_remove("RUST_LOG");
    run_bounded(cmd, Duration::from_secs(240))
}

/// The states of every job the server holds, oldest first.
fn job_states(c: &Cluster) -> Vec<String> {
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["state"].as_str().unwrap().to_string())
        .collect()
}

fn main() -> std::process::ExitCode {
    trials::run(
        file!(),
        trials![a_snakemake_workflow_runs_with_kestrel_submit_as_its_cluster],
    )
}

fn a_snakemake_workflow_runs_with_kestrel_submit_as_its_cluster() {
    let exe = trials::need(snakemake().map_err(|why| {
        format!("{why}; pip install -r crates/cli/tests/snakemake/requirements.txt")
    }));
    // As the issue gives it: the submit command alone (the jobs' ends are seen in files).
    let c = Cluster::with_workers(&[2]);
    let out = run_workflow(&c, &exe, &[]);
    out.ok();
    assert_eq!(
        c.read("out/sum.txt").as_deref(),
        Some("0\n1\n2\n"),
        "{out:#?}"
    );
    assert_eq!(
        job_states(&c),
        ["finished"; 4],
        "every step ran as a Kestrel job"
    );

    // With Kestrel's status and cancel commands, a failed step fails the workflow.
    let c = Cluster::with_workers(&[2]);
    let out = run_workflow(
        &c,
        &exe,
        &[
            "--cluster-generic-status-cmd",
            "kestrel job state --snakemake",
            "--cluster-generic-cancel-cmd",
            "kestrel job cancel",
            "--config",
            "fail=1",
        ],
    );
    out.failed();
    assert_eq!(c.read("out/sum.txt"), None, "{out:#?}");
    let states = job_states(&c);
    assert_eq!(states.len(), 3, "the join never ran: {states:?}");
    assert_eq!(
        states.iter().filter(|s| *s == "failed").count(),
        1,
        "{states:?}"
    );
}
