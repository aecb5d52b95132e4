//! Allocation queues on a real Slurm (the repository's `testsupport/slurm/test-cluster`,
//! started here if need be; each test is reported ignored, with the reason, where it cannot
//! be): the server submits pilot allocations while work waits, their workers run it, and the
//! allocations end once the workers idle.

mod common;
#[path = "../../alloc/tests/support/slurm_cluster.rs"]
mod slurm_cluster;

use common::*;
use serde_json::Value;
use slurm_cluster::{qsub_here, slurm_here, take_cluster, ClusterLock};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// The test cluster has 4 nodes: its tests take turns, so that each finds them free.
static SLURM: Mutex<()> = Mutex::new(());

fn main() -> std::process::ExitCode {
    trials::run(
        file!(),
        trials![
            a_slurm_queue_brings_workers_for_the_work_and_gives_the_allocations_back,
            a_wrong_partition_is_refused_at_alloc_add_with_slurms_message,
            a_queue_grows_to_four_nodes_under_a_backlog_runs_2000_tasks_and_shrinks_to_none,
            a_server_killed_while_allocations_run_adopts_them_after_its_restart,
            an_sbatch_that_starts_failing_mid_run_pauses_the_queue_instead_of_flooding,
            an_allocation_killed_at_its_time_limit_loses_no_task,
            a_two_node_allocation_runs_a_worker_on_each_node_and_both_leave_together,
            a_torque_queue_through_qsub_brings_workers_and_gives_them_back,
            a_stopping_server_cancels_allocations_still_waiting_for_nodes,
            allocations_whose_workers_cannot_start_fail_with_their_pilots_words_and_pause_the_queue,
        ],
    )
}

/// The cluster to oneself (from this binary's other tests, and from other processes); the
/// test is skipped, saying why, where there is no Slurm.
fn take_slurm() -> (std::sync::MutexGuard<'static, ()>, ClusterLock) {
    trials::need(slurm_here());
    let turn = SLURM.lock().unwrap_or_else(|e| e.into_inner());
    (turn, trials::need(take_cluster()))
}

fn in_squeue(batch_id: &str) -> bool {
    let out = Command::new("squeue")
        .args(["-h", "-o", "%i", "-j", batch_id])
        .output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == batch_id)
}

fn a_slurm_queue_brings_workers_for_the_work_and_gives_the_allocations_back() {
    let _slurm = take_slurm();
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

fn a_wrong_partition_is_refused_at_alloc_add_with_slurms_message() {
    let _slurm = take_slurm();
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
    // A right one is taken once `sbatch --test-only` accepted it; no job was taken for it.
    c.run(&["alloc", "add", "slurm", "--time-limit", "5m"]).ok();
    let listed = Command::new("squeue")
        .args(["-h", "--states=all", "-o", "%o"])
        .output()
        .expect("squeue");
    let scripts = String::from_utf8_lossy(&listed.stdout);
    let dir = c.server_dir.display().to_string();
    assert!(
        !scripts.lines().any(|l| l.starts_with(&dir)),
        "a job of this server is in squeue: {scripts}"
    );
    let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    assert_eq!(v["queues"][0]["paused"], Value::Null, "{v}");
    assert_eq!(
        v["queues"][0]["allocations"].as_array().map(Vec::len),
        Some(0)
    );
}

/// Polls until every allocation of the first queue has ended; returns them.
fn all_ended(c: &Cluster, limit: Duration) -> Vec<Value> {
    poll_every(
        "the allocations to end",
        limit,
        Duration::from_millis(500),
        || {
            let a = allocations(c);
            let over = !a.is_empty()
                && a.iter().all(|x| {
                    matches!(
                        x["state"].as_str(),
                        Some("finished" | "canceled" | "failed" | "not submitted")
                    )
                });
            over.then_some(a)
        },
    )
}

fn assert_none_in_squeue(allocs: &[Value]) {
    for a in allocs {
        if let Some(id) = a["batch_id"].as_str() {
            assert!(!in_squeue(id), "allocation {id} is still in squeue");
        }
    }
}

fn job_counts(c: &Cluster, job: &str) -> Value {
    c.run(&["job", "info", job, "--output", "json"]).ok().json()["counts"].clone()
}

fn a_queue_grows_to_four_nodes_under_a_backlog_runs_2000_tasks_and_shrinks_to_none() {
    let _slurm = take_slurm();
    let c = Cluster::new();
    c.run(&[
        "alloc",
        "add",
        "slurm",
        "--time-limit",
        "5m",
        "--max-workers",
        "4",
        "--backlog",
        "1",
        "--acquire",
        "one",
        "--idle-timeout",
        "3s",
        "--worker-args",
        "--slots 4",
    ])
    .ok();
    // The tasks wait for a file until the fourth node has come, so that a slow machine cannot
    // finish the work on three (each allocation is asked for once the one before has started).
    let go = c.path("go");
    c.run(&[
        "submit",
        "--array",
        "1-2000",
        "--",
        "sh",
        "-c",
        &format!("while [ ! -e {go} ]; do sleep 0.05; done; sleep 0.1"),
    ])
    .ok();
    // Watch the queue grow while the work runs: never more than one allocation waiting.
    let mut peak_workers = 0;
    let mut peak_pending = 0;
    poll_every(
        "the 2,000 tasks",
        Duration::from_secs(240),
        Duration::from_millis(300),
        || {
            let a = allocations(&c);
            let pending = a
                .iter()
                .filter(|x| matches!(x["state"].as_str(), Some("submitting" | "queued")))
                .count();
            let workers: usize = a
                .iter()
                .map(|x| x["workers"].as_array().map_or(0, Vec::len))
                .sum();
            peak_pending = peak_pending.max(pending);
            peak_workers = peak_workers.max(workers);
            if peak_workers == 4 && !std::path::Path::new(&go).exists() {
                std::fs::write(&go, "").expect("the go file");
            }
            (job_counts(&c, "1")["finished"] == 2000).then_some(())
        },
    );
    assert_eq!(peak_workers, 4, "the queue should grow to 4 nodes");
    assert!(peak_pending <= 1, "backlog 1, but {peak_pending} waited");
    // Released once idle: nothing is left in Slurm.
    let allocs = all_ended(&c, Duration::from_secs(120));
    assert!(allocs.len() >= 4, "{allocs:?}");
    assert!(
        allocs.iter().all(|a| a["state"] == "finished"),
        "{allocs:?}"
    );
    assert_none_in_squeue(&allocs);
    let info = c
        .run(&["alloc", "info", "1", "--output", "json"])
        .ok()
        .json();
    let busy: u64 = info["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["busy_cpu_us"].as_u64().unwrap())
        .sum();
    // 2,000 tasks of 0.1 s: at least 200 CPU-seconds busy.
    assert!(busy >= 200_000_000, "busy {busy} us: {info}");
}

fn a_server_killed_while_allocations_run_adopts_them_after_its_restart() {
    let _slurm = take_slurm();
    let mut c = Cluster::new();
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
    // The tasks wait for a file, so that the allocations outlive the server.
    let go = c.path("go");
    c.run(&[
        "submit",
        "--array",
        "1-4",
        "--",
        "sh",
        "-c",
        &format!("while [ ! -e {go} ]; do sleep 0.1; done"),
    ])
    .ok();
    let before = poll_every(
        "two allocations running a worker each",
        Duration::from_secs(120),
        Duration::from_millis(300),
        || {
            let a = allocations(&c);
            let running = a
                .iter()
                .filter(|x| {
                    // Its batch id known too: a pilot's worker may join before sbatch answers.
                    x["state"] == "running"
                        && x["workers"].as_array().map(Vec::len) == Some(1)
                        && x["batch_id"].is_string()
                })
                .count();
            (running == 2).then_some(a)
        },
    );
    c.kill_server();
    c.start_server();
    // The same allocations, their workers back, and none submitted twice.
    poll_every(
        "the workers to come back",
        Duration::from_secs(120),
        Duration::from_millis(300),
        || {
            let a = allocations(&c);
            let back = a.len() == 2
                && a.iter().all(|x| {
                    x["state"] == "running"
                        && x["workers"].as_array().map(Vec::len) == Some(1)
                        && x["batch_id"].is_string()
                });
            back.then_some(())
        },
    );
    let after = allocations(&c);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(b["id"], a["id"]);
        assert_eq!(b["batch_id"], a["batch_id"]);
        assert!(in_squeue(a["batch_id"].as_str().unwrap()));
    }
    std::fs::write(&go, "").unwrap();
    c.run(&["job", "wait", "1"]).ok();
    let allocs = all_ended(&c, Duration::from_secs(120));
    assert_eq!(allocs.len(), 2, "none submitted twice: {allocs:?}");
    assert!(
        allocs.iter().all(|a| a["state"] == "finished"),
        "{allocs:?}"
    );
    assert_none_in_squeue(&allocs);
}

fn an_sbatch_that_starts_failing_mid_run_pauses_the_queue_instead_of_flooding() {
    let _slurm = take_slurm();
    let mut c = Cluster::new();
    // An sbatch that fails while a file exists, and counts its calls.
    let bin = c.root().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let (broken, calls) = (c.path("broken"), c.path("sbatch-calls"));
    let real = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v sbatch"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let wrapper = bin.join("sbatch");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho call >> {calls}\nif [ -e {broken} ]; then echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2; exit 1; fi\nexec {} \"$@\"\n",
            real.trim()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    c.server_env.push(("PATH".into(), path));
    c.kill_server();
    c.start_server();
    c.run(&[
        "alloc",
        "add",
        "slurm",
        "--time-limit",
        "5m",
        "--max-workers",
        "1",
        "--idle-timeout",
        "2s",
        "--worker-args",
        "--slots 2",
    ])
    .ok();
    c.run(&["submit", "--array", "1-4", "--", "true"]).ok();
    c.run(&["job", "wait", "1"]).ok();
    all_ended(&c, Duration::from_secs(120));
    // Now sbatch fails: three tries, further and further apart, then the queue pauses.
    std::fs::write(&broken, "").unwrap();
    let count = || {
        std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let good = count();
    c.run(&["submit", "--array", "1-4", "--", "true"]).ok();
    let paused = poll_every(
        "the queue to pause itself",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || {
            let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
            v["queues"][0]["paused"].as_str().map(str::to_string)
        },
    );
    assert!(paused.contains("3 failures in a row"), "{paused}");
    assert!(paused.contains("Socket timed out"), "{paused}");
    assert!(paused.contains("kestrel alloc resume 1"), "{paused}");
    assert_eq!(count() - good, 3, "three submissions, no flood");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(count() - good, 3, "paused: nothing more is submitted");
    assert_eq!(
        job_counts(&c, "2")["queued"],
        4,
        "the tasks wait, none lost"
    );
    // Mended and resumed, the work runs.
    std::fs::remove_file(&broken).unwrap();
    c.run(&["alloc", "resume", "1"]).ok();
    c.run(&["job", "wait", "2"]).ok();
    let allocs = all_ended(&c, Duration::from_secs(120));
    assert_none_in_squeue(&allocs);
}

fn an_allocation_killed_at_its_time_limit_loses_no_task() {
    let _slurm = take_slurm();
    let c = Cluster::new();
    c.run(&[
        "alloc",
        "add",
        "slurm",
        "--time-limit",
        "1m",
        "--max-workers",
        "1",
        "--idle-timeout",
        "2s",
        "--worker-args",
        "--slots 1",
    ])
    .ok();
    // Its first run outlives the allocation (Slurm kills it at the time limit); the run
    // again, in the next allocation, finds its mark and ends.
    let mark = c.path("mark");
    c.run(&[
        "submit",
        "--",
        "sh",
        "-c",
        &format!("if [ -e {mark} ]; then exit 0; fi; touch {mark}; sleep 150"),
    ])
    .ok();
    poll_every(
        "the job to end",
        Duration::from_secs(300),
        Duration::from_secs(1),
        || {
            let counts = job_counts(&c, "1");
            (counts["finished"] == 1).then_some(())
        },
    );
    let allocs = all_ended(&c, Duration::from_secs(120));
    assert!(allocs.len() >= 2, "a second allocation ran it: {allocs:?}");
    // Run twice: once killed with the allocation Slurm ended, once to its end. The first
    // run's end counts against neither its retries nor its crashes: Slurm's SIGTERM reached
    // the worker too, which stopped at once and gave it back: the batch system ended it, the
    // task did not kill its worker.
    let task = task_rows(&c, "1").remove(0);
    assert_eq!(task["state"], "finished", "{task}");
    assert_eq!(task["attempts"], 2, "{task}");
    assert_eq!(task["lost"], 0, "{task}");
    assert_eq!(task["failures"], 0, "{task}");
    let first = c.run(&["alloc", "log", "1", "1"]).ok().stdout.clone();
    assert!(first.contains("DUE TO TIME LIMIT"), "{first}");
    assert_none_in_squeue(&allocs);
}

fn a_two_node_allocation_runs_a_worker_on_each_node_and_both_leave_together() {
    let _slurm = take_slurm();
    let c = Cluster::new();
    c.run(&[
        "alloc",
        "add",
        "slurm",
        "--time-limit",
        "5m",
        "--nodes",
        "2",
        "--max-workers",
        "2",
        "--acquire",
        "all",
        "--idle-timeout",
        "3s",
        "--worker-args",
        "--slots 1",
    ])
    .ok();
    c.run(&["submit", "--array", "1-8", "--", "sleep", "0.5"])
        .ok();
    let hosts = poll_every(
        "two workers of one allocation",
        Duration::from_secs(120),
        Duration::from_millis(300),
        || {
            let ws = c.run(&["worker", "list", "--output", "json"]).ok().json();
            let ws = ws["workers"].as_array()?.clone();
            let mut hosts: Vec<String> = ws
                .iter()
                .filter(|w| w["alloc"] == 1)
                .map(|w| w["hostname"].as_str().unwrap_or("").to_string())
                .collect();
            hosts.sort();
            (hosts.len() == 2).then_some(hosts)
        },
    );
    // (The test cluster's emulated nodes share this machine's host name.)
    assert_eq!(hosts.len(), 2, "one worker per node: {hosts:?}");
    c.run(&["job", "wait", "1"]).ok();
    // Released whole: the allocation ends with both its workers gone, none before the other.
    let allocs = all_ended(&c, Duration::from_secs(120));
    assert_eq!(allocs.len(), 1, "{allocs:?}");
    assert_eq!(allocs[0]["state"], "finished", "{allocs:?}");
    assert_eq!(allocs[0]["nodes"], 2, "{allocs:?}");
    let ws = c.run(&["worker", "list", "--output", "json"]).ok().json();
    assert_eq!(ws["workers"].as_array().map(Vec::len), Some(0), "{ws}");
    assert_none_in_squeue(&allocs);
}

fn a_torque_queue_through_qsub_brings_workers_and_gives_them_back() {
    let _slurm = take_slurm();
    trials::need(qsub_here());
    let c = Cluster::new();
    // Debian's qsub drives the same Slurm: the PBS backend's submit, query and cancel.
    c.run(&[
        "alloc",
        "add",
        "torque",
        "--time-limit",
        "5m",
        "--max-workers",
        "1",
        "--idle-timeout",
        "2s",
        "--worker-args",
        "--slots 2",
    ])
    .ok();
    c.run(&["submit", "--array", "1-6", "--", "sleep", "0.2"])
        .ok();
    c.run(&["job", "wait", "1"]).ok();
    let allocs = all_ended(&c, Duration::from_secs(120));
    assert!(
        allocs.iter().all(|a| a["state"] == "finished"),
        "{allocs:?}"
    );
    assert_none_in_squeue(&allocs);
    let log = c.run(&["alloc", "log", "1", "1"]).ok().stdout.clone();
    assert!(log.contains("#PBS"), "{log}");
    assert!(log.contains("kestrel pilot: allocation 1"), "{log}");
}

fn a_stopping_server_cancels_allocations_still_waiting_for_nodes() {
    let _slurm = take_slurm();
    let mut c = Cluster::new();
    // Held back by Slurm for an hour: it waits in the queue.
    c.run(&[
        "alloc",
        "add",
        "slurm",
        "--time-limit",
        "5m",
        "--worker-args",
        "--slots 1",
        "--",
        "--begin=now+1hour",
    ])
    .ok();
    c.run(&["submit", "--", "true"]).ok();
    let id = poll_every(
        "an allocation waiting in Slurm",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || {
            let a = allocations(&c);
            let a = a.first()?;
            (a["state"] == "queued").then(|| a["batch_id"].as_str().map(str::to_string))?
        },
    );
    assert!(in_squeue(&id));
    c.run(&["server", "stop"]).ok();
    c.wait_server_exit(Duration::from_secs(30));
    assert!(!in_squeue(&id), "allocation {id} was left in squeue");
}

fn allocations_whose_workers_cannot_start_fail_with_their_pilots_words_and_pause_the_queue() {
    let _slurm = take_slurm();
    let c = Cluster::new();
    // A typo in the workers' arguments: every worker exits at once, on every node.
    c.run(&[
        "alloc",
        "add",
        "slurm",
        "--time-limit",
        "5m",
        "--max-workers",
        "1",
        "--worker-args",
        "--slots 1 --slotz 2",
    ])
    .ok();
    c.run(&["submit", "--array", "1-3", "--", "true"]).ok();
    let paused = poll_every(
        "the queue to pause itself",
        Duration::from_secs(180),
        Duration::from_millis(500),
        || {
            let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
            v["queues"][0]["paused"].as_str().map(str::to_string)
        },
    );
    assert!(paused.contains("3 failures in a row"), "{paused}");
    // Slurm's word for it, then what the worker said, then where to read more.
    assert!(paused.contains("its pilot's output ends"), "{paused}");
    assert!(paused.contains("--slotz"), "{paused}");
    assert!(paused.contains("kestrel alloc log 1 3"), "{paused}");
    let allocs = allocations(&c);
    assert_eq!(allocs.len(), 3, "{allocs:?}");
    for a in &allocs {
        assert_eq!(a["state"], "failed", "{a}");
        let id = a["batch_id"].as_str().expect("a batch id");
        assert!(!in_squeue(id), "allocation {id} is still in squeue");
    }
    assert_eq!(
        job_counts(&c, "1")["queued"],
        3,
        "the tasks wait, none lost"
    );
}
