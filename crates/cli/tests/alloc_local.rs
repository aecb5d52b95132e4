//! Allocation queues with the `local` backend, end to end: the server starts workers while
//! work waits and lets them go, whole, once they idle.

mod common;

use common::*;
use serde_json::Value;
use std::time::Duration;

/// `kestrel alloc add local --time-limit 10m OPTIONS...`, which must succeed.
fn add_local_queue(c: &Cluster, options: &[&str]) {
    let add = ["alloc", "add", "local", "--time-limit", "10m"];
    c.run(&[&add[..], options].concat()).ok();
}

fn queues(c: &Cluster) -> Vec<Value> {
    let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    v["queues"].as_array().expect("queues").clone()
}

#[test]
fn a_local_queue_grows_under_a_backlog_runs_the_work_and_shrinks_to_nothing() {
    let c = Cluster::new();
    add_local_queue(
        &c,
        &[
            "--max-workers",
            "2",
            "--idle-timeout",
            "2s",
            "--acquire",
            "one",
            "--worker-args",
            "--slots 1",
        ],
    );
    c.run(&["submit", "--array", "1-10", "--", "sleep", "0.2"])
        .ok();
    // Each worker says which allocation started it.
    let w = poll("a worker from the queue", Duration::from_secs(60), || {
        let ws = c.run(&["worker", "list", "--output", "json"]).ok().json();
        ws["workers"].as_array()?.first().cloned()
    });
    assert_eq!(w["alloc_queue"], 1, "{w:?}");
    assert!(w["alloc"].as_u64().is_some(), "{w:?}");
    let table = c.run(&["worker", "list"]).ok().stdout.clone();
    assert!(table.contains("(queue 1)"), "{table}");
    c.run(&["job", "wait", "1"]).ok();
    // Every allocation ends once its worker has idled 2 s; none is left running.
    let allocs = poll("the allocations to end", Duration::from_secs(60), || {
        let q = queues(&c);
        let allocs = q[0]["allocations"].as_array().cloned().unwrap_or_default();
        let ended = !allocs.is_empty() && allocs.iter().all(|a| a["state"] == "finished");
        ended.then_some(allocs)
    });
    assert!(
        (1..=2).contains(&allocs.len()),
        "one worker per allocation, at most 2: {allocs:?}"
    );
    let workers = c.run(&["worker", "list", "--output", "json"]).ok().json();
    assert_eq!(workers["workers"].as_array().map(Vec::len), Some(0));
    // The tasks' 2 CPU-seconds are counted busy; the allocations held at least that.
    let info = c
        .run(&["alloc", "info", "1", "--output", "json"])
        .ok()
        .json();
    let sum = |key: &str| -> u64 {
        info["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a[key].as_u64().unwrap())
            .sum()
    };
    let (busy, held) = (sum("busy_cpu_us"), sum("held_cpu_us"));
    assert!(
        (2_000_000..4_000_000).contains(&busy),
        "busy {busy} us: {info}"
    );
    assert!(held >= busy, "held {held} < busy {busy}: {info}");
    let text = c.run(&["alloc", "info", "1"]).ok().stdout.clone();
    assert!(text.contains("running tasks"), "{text}");
    // Each allocation's worker log is kept and shown.
    let logs = c
        .run(&["alloc", "log", "1", "--output", "json"])
        .ok()
        .json();
    let files = &logs["allocations"][0]["files"];
    assert!(
        files[0]["path"].as_str().unwrap().ends_with("worker-0.log"),
        "{logs}"
    );
    assert!(files[0]["size"].as_u64().is_some(), "{logs}");
    let err = c
        .run(&["alloc", "log", "1", "99"])
        .failed()
        .one_line_error()
        .to_string();
    assert!(err.contains("no allocation 99"), "{err}");
}

/// The one-line error of a command that must fail.
fn refused(c: &Cluster, args: &[&str]) -> String {
    c.run(args).failed().one_line_error().to_string()
}

#[test]
fn alloc_commands_refuse_what_cannot_work() {
    let c = Cluster::new();
    let err = refused(
        &c,
        &[
            "alloc",
            "add",
            "local",
            "--time-limit",
            "1h",
            "--backlog",
            "0",
        ],
    );
    assert!(err.contains("--backlog must be at least 1"), "{err}");
    let err = refused(&c, &["alloc", "add", "local", "--time-limit", "10s"]);
    assert!(err.contains("--time-limit must be at least 1m"), "{err}");
    let err = refused(&c, &["alloc", "pause", "9"]);
    assert!(err.contains("no allocation queue 9"), "{err}");
    let err = refused(
        &c,
        &[
            "alloc",
            "add",
            "local",
            "--time-limit",
            "1h",
            "--worker-args",
            "\"--slots",
        ],
    );
    assert!(err.contains("unbalanced quotes"), "{err}");
    let list = c.run(&["alloc", "list"]);
    let list = list.ok();
    assert!(list.stdout.is_empty(), "{list:?}");
    assert!(list.stderr.contains("no allocation queues"), "{list:?}");
}

/// The worker processes of a local allocation, named in its batch id (`local:PID,PID`).
fn local_pids(alloc: &Value) -> Vec<i32> {
    alloc["batch_id"]
        .as_str()
        .and_then(|id| id.strip_prefix("local:"))
        .map(|pids| pids.split(',').filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}

/// SIGKILLs processes when dropped: the workers a killed server started are nobody's children.
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: kill(2) of a pid this test read from the server's own listing.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

#[test]
fn a_killed_server_takes_its_queue_back_and_adopts_the_allocation_that_runs() {
    let mut c = Cluster::new();
    add_local_queue(
        &c,
        &[
            "--max-workers",
            "1",
            "--idle-timeout",
            "2s",
            "--worker-args",
            "--slots 1",
        ],
    );
    // Each task waits for a file, so the work outlives the server.
    let go = c.path("go");
    c.run(&[
        "submit",
        "--array",
        "1-4",
        "--",
        "sh",
        "-c",
        &format!("while [ ! -e {go} ]; do sleep 0.05; done"),
    ])
    .ok();
    let alloc = poll("the allocation's worker", Duration::from_secs(60), || {
        let q = queues(&c);
        let a = q[0]["allocations"][0].clone();
        (a["state"] == "running" && a["workers"].as_array().map(Vec::len) == Some(1)).then_some(a)
    });
    let _reaper = KillOnDrop(local_pids(&alloc));
    assert_eq!(local_pids(&alloc).len(), 1, "{alloc:?}");

    c.kill_server();
    c.start_server();

    // The queue is back, with the same allocation, and its worker connects again.
    let q = queues(&c);
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["max_workers"], 1, "{q:?}");
    poll("the worker to come back", Duration::from_secs(60), || {
        let a = queues(&c)[0]["allocations"].clone();
        (a.as_array().map(Vec::len) == Some(1)
            && a[0]["id"] == alloc["id"]
            && a[0]["state"] == "running"
            && a[0]["workers"].as_array().map(Vec::len) == Some(1))
        .then_some(())
    });
    std::fs::write(&go, "").unwrap();
    c.run(&["job", "wait", "1"]).ok();
    // Released after its idle timeout; no second allocation was ever made.
    let allocs = poll("the allocation to end", Duration::from_secs(60), || {
        let a = queues(&c)[0]["allocations"].clone();
        (a[0]["state"] == "finished").then_some(a)
    });
    assert_eq!(allocs.as_array().map(Vec::len), Some(1), "{allocs:?}");
    let pid = local_pids(&alloc)[0];
    poll(
        "the adopted worker to exit",
        Duration::from_secs(30),
        || (!alive(pid)).then_some(()),
    );
}

#[test]
fn two_queues_do_not_both_ask_for_the_same_work() {
    let c = Cluster::new();
    for _ in 0..2 {
        add_local_queue(
            &c,
            &[
                "--max-workers",
                "1",
                "--idle-timeout",
                "1s",
                "--worker-args",
                "--slots 1",
            ],
        );
    }
    // One task: the first queue's allocation covers it, so the second asks for nothing.
    c.run(&["submit", "--", "sleep", "1"]).ok();
    c.run(&["job", "wait", "1"]).ok();
    let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    let made = |q: usize| v["queues"][q]["allocations"].as_array().map_or(0, Vec::len);
    assert_eq!((made(0), made(1)), (1, 0), "{v}");
    // Once that allocation is given back, two tasks of one slot each: the first queue brings
    // one worker (its limit), the second the other.
    poll(
        "the first allocation to end",
        Duration::from_secs(60),
        || (queues(&c)[0]["allocations"][0]["state"] == "finished").then_some(()),
    );
    c.run(&["submit", "--array", "1-2", "--", "sleep", "1"])
        .ok();
    c.run(&["job", "wait", "2"]).ok();
    let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    let made = |q: usize| v["queues"][q]["allocations"].as_array().map_or(0, Vec::len);
    assert!(made(1) >= 1, "{v}");
    poll("the allocations to end", Duration::from_secs(60), || {
        let q = queues(&c);
        q.iter()
            .flat_map(|q| q["allocations"].as_array().cloned().unwrap_or_default())
            .all(|a| a["state"] == "finished")
            .then_some(())
    });
}

#[test]
fn kestrel_run_grows_its_workers_from_an_allocation_queue_and_refuses_a_wrong_one() {
    let dir = tempfile::tempdir().unwrap();
    let run = |alloc: &str| {
        let mut k = kestrel();
        k.current_dir(dir.path()).args([
            "run", "--quiet", "--alloc", alloc, "--array", "1-6", "--", "sleep", "0.2",
        ]);
        run_bounded(k, Duration::from_secs(120))
    };
    let out =
        run("local --time-limit 10m --max-workers 2 --idle-timeout 2s --worker-args '--slots 1'");
    let said = &out.ok().stderr;
    assert!(said.contains("6 tasks on workers of"), "{said}");
    let out = run("local --time-limt 10m");
    let err = out.failed().one_line_error().to_string();
    assert!(
        err.contains("--time-limt") && err.contains("kestrel alloc add"),
        "{err}"
    );
}

#[test]
fn a_missing_sbatch_is_refused_at_alloc_add_and_pauses_a_queue_added_without_a_check() {
    let mut c = Cluster::new();
    // A server whose PATH has no batch system at all (a machine that is not a login node).
    let empty = c.root().join("empty-bin");
    std::fs::create_dir_all(&empty).unwrap();
    c.server_env
        .push(("PATH".into(), empty.display().to_string()));
    c.kill_server();
    c.start_server();
    let slurm = [
        "alloc",
        "add",
        "slurm",
        "--time-limit",
        "5m",
        "--worker-args",
        "--slots 2",
    ];
    let err = refused(&c, &slurm);
    assert!(
        err.contains("the batch system could not check")
            && err.contains("`sbatch` is not on the server's PATH")
            && err.contains("Slurm login node"),
        "{err}"
    );
    assert!(!err.contains("--no-dry-run"), "not the advice here: {err}");
    assert!(queues(&c).is_empty(), "no queue was added");
    // Added without the check, the queue tries three times, then pauses with the reason;
    // the tasks wait, none lost.
    c.run(&[&slurm[..], &["--no-dry-run"]].concat()).ok();
    c.run(&["submit", "--array", "1-3", "--", "true"]).ok();
    let paused = poll_every(
        "the queue to pause itself",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || queues(&c)[0]["paused"].as_str().map(str::to_string),
    );
    assert!(paused.contains("3 failures in a row"), "{paused}");
    assert!(
        paused.contains("`sbatch` is not on the server's PATH"),
        "{paused}"
    );
    assert!(paused.contains("kestrel alloc resume 1"), "{paused}");
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!(info["counts"]["queued"], 3, "{info}");
    let says = c.run(&["job", "info", "1"]).ok().stdout.clone();
    assert!(says.contains("paused"), "{says}");
}

#[test]
fn job_info_says_which_allocations_run_its_tasks() {
    let c = Cluster::new();
    add_local_queue(&c, &["--max-workers", "1", "--worker-args", "--slots 2"]);
    c.run(&["submit", "--array", "1-2", "--", "sleep", "60"])
        .ok();
    let on = poll("the tasks to run", Duration::from_secs(60), || {
        let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
        let on = info["running_on"].as_array()?.clone();
        (on.len() == 1 && on[0]["tasks"] == 2).then_some(on)
    });
    assert_eq!(
        (&on[0]["alloc"], &on[0]["queue"]),
        (&Value::from(1), &Value::from(1)),
        "{on:?}"
    );
    let text = c.run(&["job", "info", "1"]).ok().stdout.clone();
    assert!(
        text.contains("running on") && text.contains(": 2 tasks (allocation 1 of queue 1)"),
        "{text}"
    );
    c.run(&["job", "cancel", "1"]).ok();
    c.run(&["alloc", "remove", "1", "--force"]).ok();
}

#[test]
fn centralized_release_lets_an_allocation_finish_what_it_runs() {
    let c = Cluster::new();
    add_local_queue(
        &c,
        &[
            "--max-workers",
            "3",
            "--acquire",
            "one",
            "--idle-timeout",
            "never",
            "--release-below",
            "2",
            "--worker-args",
            "--slots 2",
        ],
    );
    c.run(&["submit", "--array", "1-12", "--", "sleep", "2"])
        .ok();
    c.run(&["job", "wait", "1"]).ok();
    // As the work winds down the allocations are given back one at a time, each once its
    // worker has finished what it ran: no task ran twice, and none had to come again.
    let tasks = c
        .run(&["task", "list", "1", "--output", "json"])
        .ok()
        .json();
    let tasks = tasks["tasks"].as_array().expect("tasks").clone();
    assert_eq!(tasks.len(), 12);
    for t in &tasks {
        assert_eq!(
            (&t["state"], &t["attempts"]),
            (&Value::from("finished"), &Value::from(1)),
            "{t}"
        );
    }
    let allocs = poll("the allocations to end", Duration::from_secs(60), || {
        let a = allocations(&c);
        a.iter().all(|a| a["state"] == "finished").then_some(a)
    });
    assert!(
        allocs.len() <= 3,
        "released and asked for again: {allocs:?}"
    );
}

#[test]
fn a_worker_from_an_allocation_no_queue_made_runs_tasks_and_the_server_log_says_so() {
    // Another server's pilot, or one whose queue was removed, reaches this server.
    let mut c = Cluster::new();
    c.add_worker_with(1, &["--alloc", "42"]);
    c.wait_workers(1);
    c.run(&["submit", "--array", "1-3", "--", "true"]).ok();
    c.run(&["job", "wait", "1"]).ok();
    let counts = c.run(&["job", "info", "1", "--output", "json"]).ok().json()["counts"].clone();
    assert_eq!(counts["finished"], 3, "{counts}");
    let log = c.server_log();
    assert!(
        log.contains("allocation 42, which no queue of this server made"),
        "{log}"
    );
    // No queue took it for one of its own.
    assert!(queues(&c).is_empty());
}
