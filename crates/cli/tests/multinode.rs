//! Multi-node tasks with real workers (issue 29): `--nodes 2` gives a task two whole workers,
//! tells it their hosts and ids, and runs nothing else on them meanwhile; a task of more nodes
//! than there are workers waits and says why; `kestrel run` refuses one at once.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::time::Duration;

/// The task of two nodes: writes what it was told, says it started, and waits (bounded) for
/// the test's go-ahead, so the test can watch the other workers meanwhile.
const MPI: &str = r#"echo "$KESTREL_NODE_LIST" > nodes.txt
cp "$KESTREL_NODE_FILE" hostfile.txt
echo "$KESTREL_NODE_FILE" > hostfile-path.txt
echo "$KESTREL_NODE_WORKERS" > node-workers.txt
echo "$KESTREL_NUM_NODES $KESTREL_WORKER_ID" > num-root.txt
touch started
i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"#;

#[test]
fn a_two_node_task_sees_two_hosts_and_nothing_else_runs_on_them() {
    let c = Cluster::with_workers(&[1, 1, 1]);
    let job = submit(&c, &["--nodes", "2", "--", "sh", "-c", MPI]);
    poll(
        "the two-node task to start",
        Duration::from_secs(20),
        || c.read("started"),
    );
    let nodes: Vec<u32> = c
        .read("node-workers.txt")
        .unwrap()
        .trim()
        .split(',')
        .map(|w| w.parse().expect("a worker id"))
        .collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert_ne!(nodes[0], nodes[1]);
    let num_root = c.read("num-root.txt").unwrap();
    assert_eq!(
        num_root.trim(),
        format!("2 {}", nodes[0]),
        "runs on the first"
    );
    let hosts = c.read("nodes.txt").unwrap();
    let host = hostname_of(&c, nodes[0]);
    assert_eq!(hostname_of(&c, nodes[1]), host, "one machine here");
    assert_eq!(hosts.trim(), format!("{host},{host}"));
    assert_eq!(c.read("hostfile.txt").unwrap(), format!("{host}\n{host}\n"));
    // Meanwhile, single tasks all go to the third worker.
    let singles = submit(
        &c,
        &[
            "--array",
            "1-6",
            "--",
            "sh",
            "-c",
            "echo $KESTREL_WORKER_ID > single-{task}.txt",
        ],
    );
    c.run(&["job", "wait", &singles]).ok();
    let on: BTreeSet<u32> = (1..=6)
        .map(|t| {
            c.read(&format!("single-{t}.txt"))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(on.len(), 1, "{on:?}");
    assert!(!nodes.contains(on.first().unwrap()), "{on:?} vs {nodes:?}");
    // The job says what it takes, the task which workers it holds; its host file is gone
    // when it ends.
    let info = job_json(&c, &job);
    assert_eq!(info["nodes"], 2);
    let task = c
        .run(&["task", "info", &job, "0", "--output", "json"])
        .ok()
        .json();
    assert_eq!(task["nodes"], serde_json::json!(nodes), "{task}");
    let human = c.run(&["task", "info", &job, "0"]).ok().stdout.clone();
    let named = format!("its nodes: workers {}, {}", nodes[0], nodes[1]);
    assert!(human.contains(&named), "{named} not in\n{human}");
    std::fs::write(c.work.join("go"), "").unwrap();
    c.run(&["job", "wait", &job]).ok();
    let path = c.read("hostfile-path.txt").unwrap();
    assert!(!std::path::Path::new(path.trim()).exists(), "{path}");
    // And the two workers take single tasks again.
    let after = submit(&c, &["--array", "1-30", "--", "true"]);
    c.run(&["job", "wait", &after]).ok();
}

#[test]
fn more_nodes_than_workers_waits_and_says_why() {
    let c = Cluster::with_workers(&[1, 1]);
    let job = submit(&c, &["--nodes", "3", "--", "true"]);
    let info = job_json(&c, &job);
    assert_eq!(
        info["waiting"],
        "each task needs 3 whole workers of one group, and only 2 can take it (workers 1, 2); start more workers (`kestrel worker start`) or cancel the job"
    );
    let human = c.run(&["job", "info", &job]).ok().stdout.clone();
    assert!(
        human.contains("3 whole workers per task, each with at least 1 cpu"),
        "{human}"
    );
}

#[test]
fn run_refuses_more_nodes_than_its_workers_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = kestrel();
    cmd.args(["run", "--workers", "2", "--nodes", "3", "--", "true"])
        .current_dir(dir.path());
    let out = run_bounded(cmd, COMMAND_LIMIT);
    let err = out.one_line_error();
    assert!(
        err.contains(
            "each task takes 3 whole workers (--nodes), but this run has 2; give --workers 3"
        ),
        "{err}"
    );
}

#[test]
fn run_gives_a_task_whole_local_workers() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = kestrel();
    cmd.args([
        "run",
        "--workers",
        "3",
        "--slots",
        "1",
        "--nodes",
        "3",
        "--stdout",
        "out.txt",
        "--",
        "sh",
        "-c",
        "echo $KESTREL_NUM_NODES $KESTREL_NODE_WORKERS; wc -l < $KESTREL_NODE_FILE",
    ])
    .current_dir(dir.path());
    run_bounded(cmd, COMMAND_LIMIT).ok();
    let out = std::fs::read_to_string(dir.path().join("out.txt")).unwrap();
    let mut lines = out.lines();
    let first: Vec<&str> = lines.next().unwrap().split(' ').collect();
    assert_eq!(first[0], "3");
    let ids: BTreeSet<&str> = first[1].split(',').collect();
    assert_eq!(ids.len(), 3, "{out}");
    assert_eq!(lines.next().unwrap().trim(), "3");
}

/// Runs `kestrel submit --parsable ARGS`; returns the job id it printed.
fn submit(c: &Cluster, args: &[&str]) -> String {
    let mut all = vec!["submit", "--parsable"];
    all.extend(args);
    c.run(&all).ok().stdout.trim().to_string()
}

/// `kestrel job info JOB --output json`.
fn job_json(c: &Cluster, job: &str) -> serde_json::Value {
    c.run(&["job", "info", job, "--output", "json"]).ok().json()
}

/// The host name worker `id` registered with.
fn hostname_of(c: &Cluster, id: u32) -> String {
    let list = c.run(&["worker", "list", "--output", "json"]).ok().json();
    list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == id)
        .and_then(|w| w["hostname"].as_str())
        .expect("the worker is listed")
        .to_string()
}

#[test]
fn a_task_spans_workers_of_one_group_only() {
    let mut c = Cluster::new();
    c.add_worker_with(1, &["--group", "rack-a"]);
    c.wait_workers(1);
    c.add_worker_with(1, &["--group", "rack-b"]);
    c.wait_workers(2);
    c.add_worker_with(1, &["--group", "rack-a"]);
    c.wait_workers(3);
    let job = submit(
        &c,
        &[
            "--nodes",
            "2",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo $KESTREL_NODE_WORKERS > set.txt",
        ],
    );
    assert!(!job.is_empty());
    // Workers 1 and 3 are rack-a's; 2 is alone in rack-b.
    assert_eq!(c.read("set.txt").unwrap().trim(), "1,3");
    let three = submit(&c, &["--nodes", "3", "--", "true"]);
    let info = job_json(&c, &three);
    assert_eq!(
        info["waiting"],
        "each task needs 3 whole workers of one group, and the largest group of workers that can (group rack-a) has 2 (workers 1, 3); start more workers (`kestrel worker start`) or cancel the job"
    );
}
