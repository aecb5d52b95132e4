//! Dependencies of single tasks in job files (issue 29): `[[job.task]]` tables with ids and
//! `deps = [...]`, as HyperQueue's job files have, on tasks of the same job and of an earlier
//! job of the file; kept over a server restart, shown by `job graph`; a failed task cancels
//! what depends on it; impossible ones refused at submission, naming the tasks.

mod common;

use common::*;
use serde_json::Value;
use std::time::Duration;

/// Waits (bounded) for the file `go` in the task's directory.
const WAIT_GO: &str = "i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done";

/// The states of `job`'s tasks by id, with their reasons.
fn states(c: &Cluster, job: &str) -> Vec<(u64, String, Option<String>)> {
    task_rows(c, job)
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap(),
                t["state"].as_str().unwrap().to_string(),
                t["reason"].as_str().map(str::to_string),
            )
        })
        .collect()
}

#[test]
fn tasks_wait_for_their_deps_across_jobs_and_over_a_server_restart() {
    let mut c = Cluster::with_workers(&[4]);
    std::fs::write(
        c.work.join("pipe.toml"),
        format!(
            r#"
[defaults]
stdout = "none"

[[job]]
name = "prep"
array = "1-2"
command = ["sh", "-c", "{WAIT_GO}; echo prep {{task}} >> order.txt"]

[[job]]
name = "pipe"
[[job.task]]
id = 5
command = "sh -c 'echo 5 >> order.txt'"
deps = [1, 3]
[[job.task]]
id = 1
command = "sh -c 'echo 1 >> order.txt'"
[[job.task]]
id = 3
command = "sh -c 'echo 3 >> order.txt'"
deps = ["prep:2"]
"#
        ),
    )
    .unwrap();
    let out = c
        .run(&["submit", "--parsable", "--file", "pipe.toml"])
        .ok()
        .stdout
        .clone();
    let ids: Vec<&str> = out.lines().collect();
    let (prep, pipe) = (ids[0], ids[1]);
    poll("task 1 of pipe to run", Duration::from_secs(20), || {
        c.read("order.txt").filter(|o| o == "1\n")
    });
    let waiting = |c: &Cluster| {
        states(c, pipe)
            .into_iter()
            .map(|(id, state, _)| (id, state))
            .collect::<Vec<_>>()
    };
    let expect = vec![
        (1, "finished".to_string()),
        (3, "waiting".to_string()),
        (5, "waiting".to_string()),
    ];
    // Task 1's end reaches the server a moment after its line reaches the file.
    poll(
        "task 1 of pipe to be recorded finished",
        Duration::from_secs(20),
        || Some(()).filter(|_| waiting(&c)[0].1 == "finished"),
    );
    assert_eq!(waiting(&c), expect);
    // The journal keeps them: after a restart 3 and 5 still wait.
    c.kill_server();
    c.start_server();
    assert_eq!(waiting(&c), expect);
    std::fs::write(c.work.join("go"), "").unwrap();
    c.run(&["job", "wait", prep, pipe]).ok();
    let order = c.read("order.txt").unwrap();
    let at = |line: &str| order.lines().position(|l| l == line).unwrap();
    assert!(at("prep 2") < at("3") && at("3") < at("5"), "{order}");
    // `job graph` shows the edges.
    let g = c
        .run(&["job", "graph", pipe, "--output", "json"])
        .ok()
        .json();
    let mut deps: Vec<(Value, Value)> = g["edges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "deps")
        .map(|e| (e["from"].clone(), e["to"].clone()))
        .collect();
    deps.sort_by_key(|(f, t)| format!("{f}{t}"));
    let task =
        |job: &str, id: u32| serde_json::json!({"job": job.parse::<u32>().unwrap(), "task": id});
    let mut want = vec![
        (task(prep, 2), task(pipe, 3)),
        (task(pipe, 1), task(pipe, 5)),
        (task(pipe, 3), task(pipe, 5)),
    ];
    want.sort_by_key(|(f, t)| format!("{f}{t}"));
    assert_eq!(deps, want, "{g}");
}

#[test]
fn a_failed_task_cancels_what_depends_on_it_saying_why() {
    let c = Cluster::with_workers(&[2]);
    std::fs::write(
        c.work.join("chain.toml"),
        r#"
[defaults]
stdout = "none"
stderr = "none"

[[job]]
[[job.task]]
command = "false"
[[job.task]]
command = "true"
deps = [0]
[[job.task]]
command = "true"
deps = [1]
[[job.task]]
command = "true"
"#,
    )
    .unwrap();
    let out = c.run(&["submit", "--parsable", "--file", "chain.toml", "--wait"]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let job = out.stdout.trim();
    let j = job.to_string();
    assert_eq!(
        states(&c, job),
        vec![
            (0, "failed".into(), Some("exit code 1".into())),
            (
                1,
                "canceled".into(),
                Some(format!("deps: task {j}:0 failed"))
            ),
            (
                2,
                "canceled".into(),
                Some(format!("deps: task {j}:1 was canceled"))
            ),
            (3, "finished".into(), None),
        ]
    );
}

#[test]
fn a_cycle_is_refused_at_submission_naming_the_tasks() {
    let c = Cluster::new();
    std::fs::write(
        c.work.join("cycle.toml"),
        "[[job]]\nname = \"loop\"\n[[job.task]]\nid = 1\ncommand = \"true\"\ndeps = [3]\n[[job.task]]\nid = 3\ncommand = \"true\"\ndeps = [1]\n",
    )
    .unwrap();
    let out = c.run(&["submit", "--file", "cycle.toml"]);
    let err = out.one_line_error();
    assert_eq!(out.code(), Some(2));
    assert!(
        err.contains("job file cycle.toml, job #1 (loop): ")
            && err.ends_with(
                "the job's tasks wait for each other in a cycle: task 1 depends on task 3, task 3 depends on task 1"
            ),
        "{err}"
    );
    let list = c.run(&["job", "list", "--output", "json"]).ok().json();
    assert_eq!(list["jobs"].as_array().map(Vec::len), Some(0), "{list}");
}
