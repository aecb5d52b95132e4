//! Task graphs with real workers: dependencies inferred from files, intermediate data kept in
//! the workers' caches and deleted when the workflow ends, a failed writer canceling its
//! readers, jobs submitted from inside a task, and graph mistakes refused at submission.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::time::Duration;

/// A store of [`raw_store`], a server using it, and two workers
/// of 2 slots with 1 MB caches serving peers.
fn cluster() -> (Cluster, String, tempfile::TempDir) {
    let (store, dir) = raw_store();
    let mut c = Cluster::with_server_args(&["--store", &store, "--policy", "gcc"]);
    for i in 0..2 {
        let cache = c.root().join(format!("cache-{i}")).display().to_string();
        c.add_worker_with(2, &["--cache-dir", &cache, "--cache-size", "1M"]);
    }
    c.wait_workers(2);
    (c, store, dir)
}

/// A store directory holding `raw/1.dat` … `raw/4.dat` (`file N`).
fn raw_store() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a store directory");
    fs::create_dir_all(dir.path().join("raw")).unwrap();
    for i in 1..=4 {
        fs::write(
            dir.path().join(format!("raw/{i}.dat")),
            format!("file {i}\n"),
        )
        .unwrap();
    }
    (dir.path().display().to_string(), dir)
}

/// The names of the files under `sub` (e.g. `mid`) in the workers' caches.
fn cached(c: &Cluster, sub: &str) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..2 {
        let files = c.root().join(format!("cache-{i}/files"));
        for key in fs::read_dir(&files).into_iter().flatten().flatten() {
            for f in fs::read_dir(key.path().join(sub))
                .into_iter()
                .flatten()
                .flatten()
            {
                names.push(f.file_name().into_string().unwrap());
            }
        }
    }
    names.sort();
    names
}

/// Two stages in one job file: `upper` writes mid/N.txt, which `mark` reads.
const STAGES: &str = r#"
[[job]]
name = "upper"
array = "1-4"
inputs = ["raw/{task}.dat"]
outputs = ["mid/{task}.txt"]
command = "sh -c 'mkdir -p mid && tr a-z A-Z < {input:raw/{task}.dat} > mid/{task}.txt'"

[[job]]
name = "mark"
array = "1-4"
inputs = ["mid/{task}.txt"]
outputs = ["out/{task}.txt"]
command = "sh -c 'mkdir -p out && sed s/$/!/ {input:mid/{task}.txt} > out/{task}.txt'"
"#;

#[test]
fn stages_pass_intermediate_files_through_the_caches_not_the_store() {
    let (c, store, _dir) = cluster();
    fs::write(c.work.join("stages.toml"), STAGES).unwrap();
    c.run(&["submit", "--file", "stages.toml", "--wait"]).ok();
    for i in 1..=4 {
        let out = fs::read_to_string(format!("{store}/out/{i}.txt")).unwrap();
        assert_eq!(out, format!("FILE {i}!\n"), "output {i}");
    }
    // The intermediate files never reached the store ...
    assert!(
        !Path::new(&format!("{store}/mid")).exists(),
        "mid/ in the store"
    );
    // ... and once the workflow ended they were deleted from the caches too.
    poll(
        "the intermediate files to leave the caches",
        Duration::from_secs(10),
        || cached(&c, "mid").is_empty().then_some(()),
    );
    // ... and the workers have said so.
    caches_reported(&c);
    // The job file made them local; the final outputs persist.
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!(info["outputs"][0], "local:mid/{task}.txt", "{info}");
    let table = c.run(&["job", "info", "1"]).ok().stdout.clone();
    assert!(table.contains("local:mid/{task}.txt"), "{table}");
    let info = c.run(&["job", "info", "2", "--output", "json"]).ok().json();
    assert_eq!(info["outputs"][0], "out/{task}.txt", "{info}");
    assert_eq!(info["counts"]["finished"], 4, "{info}");
    let server = c.run(&["server", "info", "--output", "json"]).ok().json();
    assert_eq!(server["intermediate_files_deleted"], 4, "{server}");
}

/// Past ten failed tasks, `job info` names the rest with a command that reaches the same
/// server (its `--server-dir`), as every hint does.
#[test]
fn the_failed_subtree_points_to_the_rest_on_the_same_server() {
    let mut c = Cluster::new();
    c.add_worker(2);
    c.wait_workers(1);
    // Slow enough that job 1 still runs when job 2 names it (`false` alone ended it first, now
    // and then, and job 2 was refused as one that could never start).
    let first = c.run(&[
        "submit",
        "--array",
        "1-12",
        "--",
        "sh",
        "-c",
        "sleep 0.3; false",
    ]);
    first.ok();
    let second = c.run(&["submit", "--after", "1", "--", "true"]);
    second.ok();
    c.run(&["job", "wait", "2"]).failed();
    // Job 2 may be canceled before the last of job 1's tasks have failed: wait for all of them.
    c.run(&["job", "wait", "1"]).failed();
    let info = c.run(&["job", "info", "1"]).ok().stdout.clone();
    let dir = c.server_dir.display().to_string();
    let rest = format!(
        "... and 2 more failed tasks (`kestrel --server-dir {dir} task list 1 --state failed`)"
    );
    assert!(info.contains(&rest), "{rest} not in\n{info}");
}

#[test]
fn a_failed_writer_cancels_its_reader_with_the_reason() {
    let (c, _store, _dir) = cluster();
    // Task 3 of the first stage fails: its reader never runs.
    let failing = STAGES.replace(
        "command = \"sh -c 'mkdir -p mid",
        "command = \"sh -c 'test {task} != 3 && mkdir -p mid",
    );
    fs::write(c.work.join("stages.toml"), failing).unwrap();
    let out = c.run(&["submit", "--file", "stages.toml", "--wait"]);
    out.failed();
    let rows = task_rows(&c, "2");
    let third = rows.iter().find(|r| r["id"] == 3).expect("task 3 of job 2");
    assert_eq!(third["state"], "canceled", "{third}");
    assert_eq!(
        third["reason"], "input mid/3.txt: producer task 1:3 failed",
        "{third}"
    );
    let info = c.run(&["job", "info", "2", "--output", "json"]).ok().json();
    assert_eq!(info["counts"]["finished"], 3, "{info}");
    assert_eq!(info["counts"]["canceled"], 1, "{info}");
    // It did not do all its work, and none of it failed: canceled (as HyperQueue says), with
    // what brings the canceled task back.
    assert_eq!(info["state"], "canceled", "{info}");
    assert_eq!(
        info["waiting"],
        "task 2:3 reads mid/3.txt, whose writer, task 1:3, has failed; `kestrel job retry 1` brings them back, to run after it",
        "{info}"
    );
    // The writer's job info shows what its failure canceled downstream.
    let writer = c.run(&["job", "info", "1"]).ok().stdout.clone();
    assert!(
        writer.contains("task 3 failed: exit code 1")
            && writer.contains("canceled 2:3: input mid/3.txt: producer task 1:3 failed"),
        "{writer}"
    );
    // The workflow's graph: tasks by state, edges through files.
    let dot = c.run(&["job", "graph", "2"]).ok().stdout.clone();
    for line in [
        "digraph \"workflow of job 2\" {",
        "label=\"job 1 upper: failed, 3/4 finished\";",
        "\"1:3\" [label=\"3\", fillcolor=\"#ffcdd2\", tooltip=\"task 1:3 failed: exit code 1\"];",
        "\"2:3\" [label=\"3\", fillcolor=\"#e0e0e0\"",
        "\"1:2\" -> \"2:2\" [label=\"mid/2.txt\"];",
    ] {
        assert!(dot.contains(line), "{line} not in\n{dot}");
    }
    let by_job = c
        .run(&["job", "graph", "1", "--by-job", "--output", "json"])
        .ok()
        .json();
    assert_eq!(
        by_job["tasks"].as_array().map(Vec::len),
        Some(0),
        "{by_job}"
    );
    let edge = &by_job["edges"][0];
    assert_eq!(
        (
            &edge["from"]["job"],
            &edge["to"]["job"],
            &edge["kind"],
            &edge["file_count"]
        ),
        (&1.into(), &2.into(), &"files".into(), &4.into()),
        "{by_job}"
    );
}

#[test]
fn a_task_submits_jobs_into_its_workflow_and_its_job_waits_for_them() {
    let (c, store, _dir) = cluster();
    // The task submits three more tasks, which run after it has exited; its job is done
    // only once they are.
    // (`$KESTREL_TASK_ID`, not `{task}`: that would be the outer task's, replaced first.)
    let inner = format!(
        "{BIN} submit --array 1-3 -- sh -c 'sleep 0.5; echo $KESTREL_TASK_ID > {store}/child-$KESTREL_TASK_ID'"
    );
    c.run(&["submit", "--wait", "--", "sh", "-c", &inner]).ok();
    for i in 1..=3 {
        let got = fs::read_to_string(format!("{store}/child-{i}"));
        assert_eq!(
            got.ok().as_deref(),
            Some(format!("{i}\n").as_str()),
            "child {i}"
        );
    }
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    let jobs = jobs["jobs"].as_array().expect("jobs").clone();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert!(jobs.iter().all(|j| j["state"] == "finished"), "{jobs:?}");
}

#[test]
fn graph_mistakes_are_refused_naming_tasks_and_files() {
    let (c, store, _dir) = cluster();
    // A file read that nothing writes and the store lacks.
    let typo = STAGES.replace(
        "inputs = [\"mid/{task}.txt\"]",
        "inputs = [\"mdi/{task}.txt\"]",
    );
    fs::write(c.work.join("typo.toml"), typo).unwrap();
    let err = c.run(&["submit", "--file", "typo.toml"]);
    assert!(
        err.failed().stderr.contains(&format!(
            "task 1 reads mdi/1.txt, which no task writes and the store {store} does not have"
        )),
        "{}",
        err.stderr
    );
    // Reading what a later job writes, and two writers of one file.
    let swapped = "[[job]]\narray = \"1-2\"\ninputs = [\"mid/{task}\"]\ncommand = \"true\"\n\n[[job]]\narray = \"1-2\"\noutputs = [\"mid/{task}\"]\ncommand = \"true\"\n";
    fs::write(c.work.join("swapped.toml"), swapped).unwrap();
    let err = c.run(&["submit", "--file", "swapped.toml"]);
    assert!(
        err.failed().stderr.contains(
            "job #1 (true) task 1 reads mid/1, which job #2 (true) writes later in the file"
        ),
        "{}",
        err.stderr
    );
    let err = c.run(&["submit", "--after", "41", "--", "true"]);
    assert!(
        err.failed()
            .one_line_error()
            .contains("--after 41: job 41 does not exist"),
        "{}",
        err.stderr
    );
    for (args, want) in [
        (
            vec!["--replicas", "9", "--output-file", "x/{task}"],
            "--replicas 9: at most 8 copies of an output are kept",
        ),
        (
            vec!["--replicas", "2"],
            "--replicas 2: the job writes no file",
        ),
        (vec!["--after", "prep"], "--after prep: give a job id"),
    ] {
        let mut argv = vec!["submit"];
        argv.extend(args);
        argv.extend(["--", "true"]);
        let err = c.run(&argv);
        assert!(
            err.failed().one_line_error().contains(want),
            "{}",
            err.stderr
        );
    }
    // Nothing of any of them was submitted.
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(0), "{jobs}");
}

/// A gate job (its task waits for the file `go` in the submit directory), `upper` as in
/// [`STAGES`] and `mark` reading upper's files after the gate: upper's files are local, and
/// nothing reads them until the test lets the gate go.
fn gated_stages(c: &Cluster) {
    let go = c.work.join("go").display().to_string();
    let gate = format!(
        "[[job]]\nname = \"gate\"\ncommand = \"sh -c 'while [ ! -e {go} ]; do sleep 0.05; done'\"\n"
    );
    let stages = STAGES.replace(
        "[[job]]\nname = \"mark\"\n",
        "[[job]]\nname = \"mark\"\nafter = [\"gate\"]\n",
    );
    fs::write(c.work.join("stages.toml"), format!("{gate}{stages}")).unwrap();
}

/// A worker of 2 slots on cache directory `cache-{name}`.
fn cached_worker(c: &mut Cluster, name: &str) -> usize {
    let cache = c.root().join(format!("cache-{name}")).display().to_string();
    c.add_worker_with(2, &["--cache-dir", &cache, "--cache-size", "1M"])
}

/// A server on a store of `raw/1.dat` … `raw/4.dat`, one worker (of cache `cache-a`) and the
/// gated stages submitted; upper (job 2) has run. The test writes `go` to let the gate go.
fn gated_cluster() -> (Cluster, String, tempfile::TempDir) {
    let (store, dir) = raw_store();
    let mut c = Cluster::with_server_args(&["--store", &store]);
    cached_worker(&mut c, "a");
    c.wait_workers(1);
    gated_stages(&c);
    c.run(&["submit", "--file", "stages.toml"]).ok();
    c.run(&["job", "wait", "2"]).ok();
    (c, store, dir)
}

fn server_json(c: &Cluster) -> serde_json::Value {
    c.run(&["server", "info", "--output", "json"]).ok().json()
}

/// What the stages wrote to the store, as `mark` writes it.
fn assert_marked(store: &str) {
    for i in 1..=4 {
        let got = fs::read_to_string(format!("{store}/out/{i}.txt")).unwrap();
        assert_eq!(got, format!("FILE {i}!\n"), "output {i}");
    }
}

#[test]
fn intermediates_lost_with_a_killed_worker_are_made_again_and_the_run_completes() {
    let (mut c, store, _dir) = gated_cluster();
    cached_worker(&mut c, "b");
    c.wait_workers(2);
    // The worker holding every copy of mid/*.txt dies: upper's tasks run again on the other.
    c.kill_worker(0);
    c.wait_workers(1);
    fs::write(c.work.join("go"), "").unwrap();
    c.run(&["job", "wait", "3"]).ok();
    assert_marked(&store);
    assert!(
        !Path::new(&store).join("mid").exists(),
        "mid/ reached the store"
    );
    assert_eq!(server_json(&c)["intermediate_tasks_rerun"], 4);
    let upper = c.run(&["job", "info", "2", "--output", "json"]).ok().json();
    assert_eq!(upper["state"], "finished", "{upper}");
    assert_eq!(upper["counts"]["finished"], 4, "{upper}");
}

#[test]
fn a_worker_restarted_with_its_cache_saves_the_re_runs() {
    let (mut c, store, _dir) = gated_cluster();
    // The only worker dies and comes back on the same cache directory: it announces
    // mid/*.txt as it registers, before anything could run upper's tasks again.
    c.kill_worker(0);
    c.wait_workers(0);
    cached_worker(&mut c, "a");
    c.wait_workers(1);
    fs::write(c.work.join("go"), "").unwrap();
    c.run(&["job", "wait", "3"]).ok();
    assert_marked(&store);
    assert_eq!(server_json(&c)["intermediate_tasks_rerun"], 0);
    for row in task_rows(&c, "2") {
        assert_eq!(row["attempts"], 1, "nothing is recomputed: {row}");
    }
}

#[test]
fn replicas_keep_copies_on_other_workers_so_a_lost_worker_costs_no_re_run() {
    let (store, _dir) = raw_store();
    let mut c = Cluster::with_server_args(&["--store", &store]);
    cached_worker(&mut c, "0");
    cached_worker(&mut c, "1");
    c.wait_workers(2);
    gated_stages(&c);
    let file = fs::read_to_string(c.work.join("stages.toml")).unwrap();
    let file = file.replace("name = \"upper\"\n", "name = \"upper\"\nreplicas = 2\n");
    fs::write(c.work.join("stages.toml"), file).unwrap();
    c.run(&["submit", "--file", "stages.toml"]).ok();
    c.run(&["job", "wait", "2"]).ok();
    // Each of upper's files is in both caches once the copies are made.
    let both: Vec<String> = (1..=4)
        .flat_map(|i| [format!("{i}.txt"), format!("{i}.txt")])
        .collect();
    poll(
        "two copies of each intermediate file",
        COMMAND_LIMIT,
        || (cached(&c, "mid") == both).then_some(()),
    );
    // ... and once the server knows of them.
    caches_reported(&c);
    c.kill_worker(0);
    c.wait_workers(1);
    fs::write(c.work.join("go"), "").unwrap();
    c.run(&["job", "wait", "3"]).ok();
    assert_marked(&store);
    assert_eq!(server_json(&c)["intermediate_tasks_rerun"], 0);
}

/// Waits until the caches the two workers report (`worker list`) are what their directories
/// `cache-0` and `cache-1` hold.
fn caches_reported(c: &Cluster) {
    poll("the caches to be reported", COMMAND_LIMIT, || {
        let list = c.run(&["worker", "list", "--output", "json"]).ok().json();
        let mut reported: Vec<u64> = list["workers"]
            .as_array()?
            .iter()
            .filter_map(|w| w["cache_used"].as_u64())
            .collect();
        let mut on_disk: Vec<u64> = (0..2)
            .map(|i| disk_bytes(&c.root().join(format!("cache-{i}/files"))))
            .collect();
        reported.sort_unstable();
        on_disk.sort_unstable();
        (reported == on_disk).then_some(())
    });
}

/// Bytes of the regular files under `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let meta = e.metadata().unwrap();
        total += if meta.is_dir() {
            disk_bytes(&e.path())
        } else {
            meta.len()
        };
    }
    total
}
