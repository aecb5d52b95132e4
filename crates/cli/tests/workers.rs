//! Workers as their user sees them (issue 29): a task names the worker that ran it after a
//! server restart, a worker keeps its id when it reconnects, `worker list --all` shows those
//! that left and why, `worker info` shows one in full, `worker stop` drains or stops one,
//! and SIGTERM drains a worker.

mod common;

use common::*;
use serde_json::Value;
use std::time::Duration;

/// The id of the connected worker that offers the named resource `tag` (each worker of a
/// test gets a tag of its own: all run on one host).
fn id_of(c: &Cluster, tag: &str) -> Option<u64> {
    let list = c.run(&["worker", "list", "--output", "json"]).ok().json();
    list["workers"]
        .as_array()?
        .iter()
        .find(|w| w["resources"][tag].is_number())
        .and_then(|w| w["id"].as_u64())
}

/// The worker of each task of `job`, as `task list --output json` names it.
fn task_workers(c: &Cluster, job: &str) -> Vec<Value> {
    task_rows(c, job)
        .iter()
        .map(|t| t["worker"].clone())
        .collect()
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Issue 29, defect 7: after a server restart every task showed worker 0, and a worker that
/// came back (to a restarted server, or after its connection was cut) got a new id, so two
/// reconnecting workers could swap theirs.
#[test]
fn tasks_name_their_worker_and_workers_keep_their_ids_across_restarts_and_reconnections() {
    let mut c = Cluster::with_server_args(&["--heartbeat", "300ms"]);
    let a = c.add_worker_with(1, &["--resource", "tag_a=1"]);
    c.wait_workers(1);
    c.add_worker_with(1, &["--resource", "tag_b=1"]);
    c.wait_workers(2);
    let (id_a, id_b) = (id_of(&c, "tag_a").unwrap(), id_of(&c, "tag_b").unwrap());
    assert_eq!((id_a, id_b), (1, 2));
    // Each worker runs the task that names it.
    c.run(&[
        "submit",
        "--array",
        "1-2",
        "--resource",
        "tag_a=1",
        "--",
        "true",
    ])
    .ok();
    c.run(&[
        "submit",
        "--array",
        "1-2",
        "--resource",
        "tag_b=1",
        "--",
        "true",
    ])
    .ok();
    c.run(&["job", "wait", "1", "2", "--quiet"]).ok();
    let before = (task_workers(&c, "1"), task_workers(&c, "2"));
    assert_eq!(before.0, vec![Value::from(id_a); 2]);
    assert_eq!(before.1, vec![Value::from(id_b); 2]);

    // Worker A goes away for good; the server restarts from its journal.
    c.kill_worker(a);
    c.kill_server();
    c.start_server();
    assert_eq!(
        (task_workers(&c, "1"), task_workers(&c, "2")),
        before,
        "after the restart each task still names the worker that ran it"
    );
    let info = c
        .run(&["task", "info", "2", "1", "--output", "json"])
        .ok()
        .json();
    assert_eq!(info["worker"], id_b, "{info}");
    // B reconnects alone: it is still worker 2 (it took id 1, A's, before).
    poll_every(
        "worker B to reconnect",
        STARTUP,
        Duration::from_millis(50),
        || id_of(&c, "tag_b"),
    );
    assert_eq!(id_of(&c, "tag_b"), Some(id_b));
    // A new worker gets an id neither had.
    c.add_worker_with(1, &["--resource", "tag_c=1"]);
    let id_c = poll_every("worker C", STARTUP, Duration::from_millis(50), || {
        id_of(&c, "tag_c")
    });
    assert_eq!(id_c, 3);

    // B is cut off past the heartbeat timeout, then comes back to the same server.
    let b = 1;
    signal(c.worker_pid(b), libc::SIGSTOP);
    c.wait_workers(1);
    signal(c.worker_pid(b), libc::SIGCONT);
    c.wait_workers(2);
    assert_eq!(id_of(&c, "tag_b"), Some(id_b), "B keeps its id");
    assert_eq!(id_of(&c, "tag_c"), Some(id_c));
    c.assert_serves();
}
