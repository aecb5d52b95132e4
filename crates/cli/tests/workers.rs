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
    // ... and its runs are counted from the journal, not from zero.
    let list = c.run(&["worker", "list", "--output", "json"]).ok().json();
    assert_eq!(list["workers"][0]["finished"], 2, "{list}");
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

/// A task that runs until the file `go` appears in the work directory.
const UNTIL_GO: &str = "while [ ! -f go ]; do sleep 0.05; done";

/// Waits until task `task` of `job` is in `state`.
fn task_in(c: &Cluster, job: &str, task: u64, state: &str) {
    poll_every(
        &format!("task {task} of job {job} to be {state}"),
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || {
            task_rows(c, job)
                .iter()
                .any(|t| t["id"] == task && t["state"] == state)
                .then_some(())
        },
    );
}

/// Asserts that `task` (a row of `task list --output json`) is back in the queue without
/// having spent a retry or counted a crash.
#[track_caller]
fn back_in_queue_unspent(task: &Value) {
    let got = (
        task["state"].as_str(),
        task["failures"].as_u64(),
        task["lost"].as_u64(),
    );
    assert_eq!(got, (Some("queued"), Some(0), Some(0)), "{task}");
}

/// Waits until the tasks of `job` are in `states`, in task order.
fn states_become(c: &Cluster, job: &str, states: &[&str]) {
    poll_every(
        &format!("the tasks of job {job} to be {states:?}"),
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || {
            let now: Vec<Value> = task_rows(c, job)
                .iter()
                .map(|t| t["state"].clone())
                .collect();
            (now == states).then_some(())
        },
    );
}

/// The worker `id` as `worker info --output json` shows it.
fn info(c: &Cluster, id: u64) -> Value {
    c.run(&["worker", "info", &id.to_string(), "--output", "json"])
        .ok()
        .json()
}

#[test]
fn worker_stop_drains_or_stops_at_once_and_list_all_and_info_say_why() {
    let mut c = Cluster::new();
    let a = c.add_worker_with(1, &["--resource", "tag_a=1"]);
    c.wait_workers(1);
    let b = c.add_worker_with(1, &["--resource", "tag_b=1"]);
    c.wait_workers(2);
    let (id_a, id_b) = (id_of(&c, "tag_a").unwrap(), id_of(&c, "tag_b").unwrap());
    c.run(&[
        "submit",
        "--resource",
        "tag_a=1",
        "--",
        "sh",
        "-c",
        UNTIL_GO,
    ])
    .ok();
    c.run(&["submit", "--resource", "tag_b=1", "--", "sleep", "300"])
        .ok();
    task_in(&c, "1", 0, "running");
    task_in(&c, "2", 0, "running");
    let held = info(&c, id_a);
    assert_eq!(held["held"][0]["job"], 1, "{held}");
    assert_eq!(held["held"][0]["state"], "running", "{held}");
    assert_eq!(held["tasks"], 1, "{held}");

    // A drains: it finishes its task, then exits.
    let out = c
        .run(&["worker", "stop", &id_a.to_string()])
        .ok()
        .stdout
        .clone();
    assert!(
        out.contains(&format!("worker {id_a}: stopping")) && out.contains("finishes the 1 task"),
        "{out}"
    );
    let list = c.run(&["worker", "list", "--output", "json"]).ok().json();
    let row = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == id_a)
        .cloned()
        .unwrap();
    assert_eq!(row["state"], "stopping", "{row}");
    assert!(c.worker_running(a), "it finishes its task first");
    std::fs::write(c.path("go"), "").unwrap();
    assert!(c.wait_worker_exit(a, COMMAND_LIMIT).success());
    assert!(
        c.worker_log()
            .contains("worker stopped: stopped by `kestrel worker stop`"),
        "{}",
        c.worker_log()
    );

    // B stops at once: its task goes back to the queue without spending a retry.
    let out = c
        .run(&["worker", "stop", &id_b.to_string(), "--now"])
        .ok()
        .stdout
        .clone();
    assert!(
        out.contains(&format!(
            "worker {id_b}: stopped; its task goes back to the queue"
        )),
        "{out}"
    );
    assert!(c.wait_worker_exit(b, COMMAND_LIMIT).success());
    back_in_queue_unspent(&task_rows(&c, "2")[0]);

    // Both are listed as departed, with why; `worker info` shows one that left.
    let all = c
        .run(&["worker", "list", "--all", "--output", "json"])
        .ok()
        .json();
    assert_eq!(all["workers"], serde_json::json!([]), "{all}");
    let departed = all["departed"].as_array().expect("departed workers");
    let why: Vec<(u64, &str)> = departed
        .iter()
        .map(|d| (d["id"].as_u64().unwrap(), d["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        why,
        vec![
            (
                id_a,
                "stopped by `kestrel worker stop`, once its tasks were done"
            ),
            (
                id_b,
                "stopped at once by `kestrel worker stop --now`; its tasks went back to the queue"
            ),
        ]
    );
    assert_eq!(departed[0]["finished"], 1);
    assert_eq!(departed[0]["state"], "left");
    let gone = info(&c, id_b);
    assert_eq!(gone["state"], "left", "{gone}");
    assert!(gone["left_us"].as_u64().is_some(), "{gone}");
    let table = c.run(&["worker", "list", "--all"]).ok().stdout.clone();
    assert!(table.contains("left lately"), "{table}");

    // A worker the server does not know: exit status 3, said on stderr.
    let out = c.run(&["worker", "stop", "99"]);
    assert_eq!(out.code(), Some(3), "{out:#?}");
    assert!(
        out.stderr.contains("worker 99 is not connected"),
        "{out:#?}"
    );
    assert_eq!(c.run(&["worker", "info", "99"]).code(), Some(3));

    // --all stops every connected worker.
    let d = c.add_worker(1);
    c.wait_workers(1);
    c.run(&["worker", "stop", "--all"]).ok();
    assert!(c.wait_worker_exit(d, COMMAND_LIMIT).success());
}

/// A worker told to drain (SIGTERM) while its server is gone, with nothing to hand over,
/// leaves at once instead of trying to reach the server for --reconnect-for (found by the
/// A/B benchmark: workers left behind by a stopped server held its teardown for minutes).
#[test]
fn a_draining_worker_without_a_server_or_tasks_leaves_at_once() {
    let mut c = Cluster::new();
    let a = c.add_worker_with(1, &["--reconnect-for", "10m"]);
    c.wait_workers(1);
    c.kill_server();
    poll_every(
        "the worker to notice the server is gone",
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || {
            c.worker_log()
                .contains("connection to the server lost")
                .then_some(())
        },
    );
    signal(c.worker_pid(a), libc::SIGTERM);
    assert!(c.wait_worker_exit(a, COMMAND_LIMIT).success());
    let log = c.worker_log();
    assert!(
        log.contains("worker stopped: the worker got SIGTERM"),
        "{log}"
    );
}

/// A 1-slot worker (its index returned) running the first task of job 1 while the second
/// waits there for the slot, both until `go` appears.
fn one_running_one_waiting() -> (Cluster, usize) {
    let mut c = Cluster::new();
    let a = c.add_worker_with(1, &["--prefetch", "1"]);
    c.wait_workers(1);
    c.run(&["submit", "--array", "1-2", "--", "sh", "-c", UNTIL_GO])
        .ok();
    states_become(&c, "1", &["running", "assigned"]);
    (c, a)
}

/// `worker stop` counts what the worker goes on to run: a task waiting there for the slot goes
/// back to the queue (the trial of issue 29 was promised both were finished).
#[test]
fn worker_stop_counts_the_tasks_it_finishes_not_those_sent_back() {
    let (mut c, a) = one_running_one_waiting();
    let out = c.run(&["worker", "stop", "1"]).ok().stdout.clone();
    assert!(
        out.contains("finishes the 1 task it runs (those waiting there for a slot go back"),
        "{out}"
    );
    states_become(&c, "1", &["running", "queued"]);
    std::fs::write(c.path("go"), "").unwrap();
    assert!(c.wait_worker_exit(a, COMMAND_LIMIT).success());
}

#[test]
fn sigterm_drains_a_worker_and_a_second_signal_stops_it_at_once() {
    let (mut c, a) = one_running_one_waiting();
    signal(c.worker_pid(a), libc::SIGTERM);
    // The waiting one goes back to the queue; the running one runs on.
    states_become(&c, "1", &["running", "queued"]);
    let w = info(&c, 1);
    assert_eq!(w["state"], "stopping", "{w}");
    assert_eq!(w["stopping_reason"], "the worker got SIGTERM", "{w}");
    assert!(c.worker_running(a));
    std::fs::write(c.path("go"), "").unwrap();
    assert!(c.wait_worker_exit(a, COMMAND_LIMIT).success());
    let log = c.worker_log();
    assert!(
        log.contains("worker got SIGTERM: it takes no new task"),
        "{log}"
    );
    assert!(
        log.contains("worker stopped: the worker got SIGTERM"),
        "{log}"
    );
    assert_eq!(task_rows(&c, "1")[0]["state"], "finished");

    // A second signal stops a draining worker at once; its task is not counted lost.
    std::fs::remove_file(c.path("go")).unwrap();
    let b = c.add_worker(1);
    task_in(&c, "1", 2, "running");
    signal(c.worker_pid(b), libc::SIGTERM);
    poll_every(
        "the worker to say it drains",
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || {
            c.worker_log()
                .matches("worker got SIGTERM")
                .nth(1)
                .map(|_| ())
        },
    );
    signal(c.worker_pid(b), libc::SIGINT);
    assert!(c.wait_worker_exit(b, COMMAND_LIMIT).success());
    back_in_queue_unspent(&task_rows(&c, "1")[1]);
    let all = c
        .run(&["worker", "list", "--all", "--output", "json"])
        .ok()
        .json();
    let reasons: Vec<&str> = all["departed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["reason"].as_str())
        .collect();
    assert_eq!(
        reasons,
        vec![
            "the worker got SIGTERM, once its tasks were done",
            "the worker got SIGINT and stopped at once; its tasks went back to the queue",
        ]
    );
}

/// A batch system that ends an allocation (Slurm at its time limit, `scancel`) sends SIGTERM to
/// every process of it at once: the worker and its tasks. The tasks killed so are not their
/// own failures: the worker stops at once and they go back to the queue without spending a
/// retry, whichever of the two signals it hears of first (found by the Slurm test of an
/// allocation killed at its time limit once SIGTERM drained workers: the task failed).
#[test]
fn tasks_killed_by_the_signal_that_drains_their_worker_go_back_to_the_queue() {
    let mut c = Cluster::new();
    let a = c.add_worker(1);
    c.wait_workers(1);
    c.run(&[
        "submit",
        "--",
        "sh",
        "-c",
        "test -f go && exit 0; echo $$ > task.pid; exec sleep 600",
    ])
    .ok();
    task_in(&c, "1", 0, "running");
    let pid: i32 = poll("the task to write its pid", COMMAND_LIMIT, || {
        c.read("task.pid").and_then(|p| p.trim().parse().ok())
    });
    // The task's process group first: its end may reach the worker before its own signal.
    // SAFETY: kill(2) of the process group of a task this test started.
    unsafe { libc::kill(-pid, libc::SIGTERM) };
    signal(c.worker_pid(a), libc::SIGTERM);
    assert!(c.wait_worker_exit(a, COMMAND_LIMIT).success());
    back_in_queue_unspent(&task_rows(&c, "1")[0]);
    let log = c.worker_log();
    assert!(log.contains("its tasks were killed by signal 15"), "{log}");
    // It runs again on the next worker.
    std::fs::write(c.path("go"), "").unwrap();
    c.add_worker(1);
    c.run(&["job", "wait", "1"]).ok();
    assert_eq!(task_rows(&c, "1")[0]["state"], "finished");
}

/// `run --alloc "local --max-workers 2"` gave each worker every core: 4 tasks ran at once on 2
/// cores. A local queue's workers share the machine.
#[test]
fn a_local_queue_divides_the_machine_among_its_workers() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let each = (cpus / 2).max(1);
    let c = Cluster::new();
    c.run(&[
        "alloc",
        "add",
        "local",
        "--time-limit",
        "10m",
        "--max-workers",
        "2",
    ])
    .ok();
    let args = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    let args = &args["queues"][0]["worker_args"];
    assert_eq!(
        args,
        &serde_json::json!(["--slots", each.to_string()]),
        "{args}"
    );
    c.run(&[
        "submit",
        "--array",
        &format!("1-{}", 2 * cpus),
        "--",
        "sh",
        "-c",
        UNTIL_GO,
    ])
    .ok();
    let ws = poll_every(
        "the queue's workers",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let list = c.run(&["worker", "list", "--output", "json"]).ok().json();
            let ws = list["workers"].as_array()?.clone();
            (ws.len() == 2).then_some(ws)
        },
    );
    for w in &ws {
        assert_eq!(w["slots"], each, "{w}");
    }
    // No more tasks run at once than the machine has cores (at least one per worker).
    let running = task_rows(&c, "1")
        .iter()
        .filter(|t| t["state"] == "running")
        .count() as u64;
    assert!(running <= 2 * each, "{running} running on {cpus} cores");
    std::fs::write(c.path("go"), "").unwrap();
    c.run(&["job", "wait", "1", "--quiet"]).ok();
}

/// GPUs were not found (`--gpus` defaulted to 0) and `kestrel run` refused tasks that need
/// them. A worker offers the GPUs this machine shows it (here named by the variables a batch
/// system sets), and each task gets its own in the variables of their vendor.
#[test]
fn gpus_found_on_the_machine_are_offered_and_each_task_gets_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut k = kestrel();
    k.env("CUDA_VISIBLE_DEVICES", "5,7")
        .env("ROCR_VISIBLE_DEVICES", "")
        .current_dir(dir.path())
        .args(["run", "--workers", "1", "--slots", "2", "--gpus", "1"])
        .args(["--array", "1-4", "--", "sh", "-c"])
        .arg("echo $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER > gpu-{task}");
    run_bounded(k, COMMAND_LIMIT).ok();
    for i in 1..=4 {
        let got = std::fs::read_to_string(dir.path().join(format!("gpu-{i}"))).unwrap();
        assert!(
            ["5 PCI_BUS_ID\n", "7 PCI_BUS_ID\n"].contains(&got.as_str()),
            "task {i}: {got:?}"
        );
    }
    // Two GPUs for one task's worth: refused at once, saying what the machine has.
    let mut k = kestrel();
    k.env("CUDA_VISIBLE_DEVICES", "5")
        .env("ROCR_VISIBLE_DEVICES", "")
        .current_dir(dir.path())
        .args(["run", "--gpus", "2", "--", "true"]);
    let out = run_bounded(k, COMMAND_LIMIT);
    let err = out.one_line_error();
    assert!(
        err.contains("needs 2 GPU(s)") && err.contains("NVIDIA 5"),
        "{err}"
    );

    // A worker started where ROCm shows two AMD GPUs offers them.
    let mut c = Cluster::new();
    let mut w = kestrel();
    w.env("ROCR_VISIBLE_DEVICES", "0,1")
        .env("CUDA_VISIBLE_DEVICES", "");
    c.add_worker_as(w, 1, &[]);
    let ws = c.wait_workers(1);
    assert_eq!(ws[0]["gpus"], 2, "{ws:?}");
    assert!(
        c.worker_log()
            .contains("found GPUs: AMD 0,1 from ROCR_VISIBLE_DEVICES"),
        "{}",
        c.worker_log()
    );
    c.run(&[
        "submit",
        "--gpus",
        "2",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo $ROCR_VISIBLE_DEVICES $HIP_VISIBLE_DEVICES > amd",
    ])
    .ok();
    assert_eq!(c.read("amd").as_deref(), Some("0,1 0,1\n"));
}
