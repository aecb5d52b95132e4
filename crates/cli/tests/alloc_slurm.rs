//! Allocation queues on a real Slurm (`../shared/slurm/test-cluster`, started here if need
//! be; skipped, saying why, where it cannot be): the server submits pilot allocations while
//! work waits, their workers run it, and the allocations end once the workers idle.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Whether a Slurm answers here, starting the shared test cluster if need be.
fn slurm_here() -> Result<(), String> {
    let answers = || {
        Command::new("sinfo")
            .arg("-h")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if answers() {
        return Ok(());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/slurm/test-cluster");
    if !script.exists() {
        return Err(format!("no Slurm here and no {}", script.display()));
    }
    let out = Command::new(&script)
        .arg("start")
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() && answers() {
        Ok(())
    } else {
        Err(format!(
            "the test cluster did not start: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn allocations(c: &Cluster) -> Vec<Value> {
    let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    v["queues"][0]["allocations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn in_squeue(batch_id: &str) -> bool {
    let out = Command::new("squeue")
        .args(["-h", "-o", "%i", "-j", batch_id])
        .output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == batch_id)
}

#[test]
fn a_slurm_queue_brings_workers_for_the_work_and_gives_the_allocations_back() {
    if let Err(why) = slurm_here() {
        eprintln!("skipped: {why}");
        return;
    }
    let c = Cluster::new();
    c.run(&[
        "alloc",
        "add",
        "slurm",
        "--time-limit",
        "5m",
        "--max-workers",
        "2",
        "--acquire",
        "one",
        "--idle-timeout",
        "3s",
        "--worker-args",
        "--slots 1",
    ])
    .ok();
    c.run(&["submit", "--array", "1-6", "--", "sleep", "0.5"])
        .ok();
    c.run(&["job", "wait", "1"]).ok();
    let allocs = poll_every(
        "the allocations to end",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || {
            let a = allocations(&c);
            let over = !a.is_empty()
                && a.iter()
                    .all(|x| matches!(x["state"].as_str(), Some("finished" | "canceled")));
            over.then_some(a)
        },
    );
    assert!((1..=2).contains(&allocs.len()), "{allocs:?}");
    for a in &allocs {
        let id = a["batch_id"].as_str().expect("a batch id");
        assert!(!in_squeue(id), "allocation {id} is still in squeue");
    }
    // The pilot and its output are kept with the server.
    let first = allocs[0]["id"].as_u64().expect("id");
    let dir = c.server_dir.join(format!("alloc/{first}"));
    let said = std::fs::read_to_string(dir.join("stdout")).unwrap_or_default();
    assert!(
        said.contains(&format!("kestrel pilot: allocation {first}")),
        "{said}"
    );
}

#[test]
fn a_wrong_partition_is_refused_at_alloc_add_with_slurms_message() {
    if let Err(why) = slurm_here() {
        eprintln!("skipped: {why}");
        return;
    }
    let c = Cluster::new();
    let out = c.run(&[
        "alloc",
        "add",
        "slurm",
        "--time-limit",
        "5m",
        "--",
        "--partition",
        "no-such-partition",
    ]);
    let err = out.failed().stderr.clone();
    assert!(
        err.contains("the queue was not added") && err.contains("invalid partition"),
        "{err}"
    );
    let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    assert_eq!(v["queues"].as_array().map(Vec::len), Some(0));
    // A right one is taken once its held test allocation was taken and canceled.
    c.run(&["alloc", "add", "slurm", "--time-limit", "5m"]).ok();
    let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    assert_eq!(v["queues"][0]["paused"], Value::Null, "{v}");
    assert_eq!(
        v["queues"][0]["allocations"].as_array().map(Vec::len),
        Some(0)
    );
}
