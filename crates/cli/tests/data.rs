//! Data diffusion with real workers: tasks that read logical files from a store directory,
//! staged through the workers' caches, and write outputs that reach the store.

mod common;

use common::*;
use std::fs;

/// A cluster whose server uses a store holding `raw/1.dat` … `raw/4.dat` (each holding its
/// own name) and `policy`, with two workers of 2 slots with caches of 1 MB.
fn cluster(policy: &str) -> (Cluster, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a store directory");
    fs::create_dir_all(dir.path().join("raw")).unwrap();
    for i in 1..=4 {
        let file = dir.path().join(format!("raw/{i}.dat"));
        fs::write(file, format!("file {i}\n")).unwrap();
    }
    let store = dir.path().display().to_string();
    let mut c = Cluster::with_server_args(&["--store", &store, "--policy", policy]);
    for i in 0..2 {
        let cache = c.root().join(format!("cache-{i}")).display().to_string();
        c.add_worker_with(2, &["--cache-dir", &cache, "--cache-size", "1M"]);
    }
    c.wait_workers(2);
    (c, store, dir)
}

#[test]
fn inputs_come_through_the_caches_and_outputs_reach_the_store() {
    let (c, store, _dir) = cluster("good-cache-compute");
    fs::write(c.work.join("picks.txt"), "1\n2\n3\n4\n1\n2\n3\n4\n").unwrap();
    let out = c.run(&[
        "submit",
        "--each",
        "picks.txt",
        "--input",
        "raw/{line}.dat",
        "--output-file",
        "out/{task}.txt",
        "--wait",
        "--",
        "sh",
        "-c",
        "mkdir -p out && cat {input:raw/{line}.dat} > out/{task}.txt && test \"$KESTREL_INPUTS\" = {inputs}",
    ]);
    out.ok();
    for (task, line) in [1, 2, 3, 4, 1, 2, 3, 4].into_iter().enumerate() {
        let written = fs::read_to_string(format!("{store}/out/{task}.txt"))
            .unwrap_or_else(|e| panic!("output of task {task} in the store: {e}"));
        assert_eq!(written, format!("file {line}\n"), "task {task}");
    }
    // Each cached input is the store's file, and each worker's cache holds what it read.
    let mut cached = 0;
    for i in 0..2 {
        // Files sit under a key of their store (`files/KEY/raw/N.dat`).
        let files = c.root().join(format!("cache-{i}/files"));
        let keys = fs::read_dir(&files).into_iter().flatten().flatten();
        for raw in keys.map(|k| k.path().join("raw")) {
            for entry in fs::read_dir(&raw).into_iter().flatten().flatten() {
                let name = entry.file_name().into_string().unwrap();
                let want = fs::read_to_string(format!("{store}/raw/{name}")).unwrap();
                assert_eq!(fs::read_to_string(entry.path()).unwrap(), want);
                cached += 1;
            }
        }
    }
    assert!(
        cached >= 4,
        "every input is in some cache ({cached} copies)"
    );
    // The job says where its inputs came from: each of the 8 staged once, from a cache or
    // the store, and every distinct file read from the store at least once.
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    let t = &info["transfers"];
    let (local, store) = (t["local_hits"].as_u64(), t["store_reads"].as_u64());
    assert_eq!(local.zip(store).map(|(l, s)| l + s), Some(8), "{t}");
    assert!(
        store >= Some(4) && t["store_bytes"].as_u64() >= Some(28),
        "{t}"
    );
    assert_eq!(info["inputs"][0], "raw/{line}.dat");
    let workers = c.run(&["worker", "list", "--output", "json"]).ok().json();
    let workers = workers["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 2);
    for w in workers {
        assert_eq!(w["cache_capacity"], 1 << 20, "{w}");
    }
}

#[test]
fn a_missing_input_or_output_fails_its_task_by_name() {
    let (c, store, _dir) = cluster("first-available");
    let out = c.run(&["submit", "--input", "raw/nope.dat", "--wait", "--", "true"]);
    let err = format!("{}{}", out.failed().stdout, out.stderr);
    assert!(
        err.contains(&format!("input raw/nope.dat not found in {store}")),
        "{err}"
    );
    let out = c.run(&[
        "submit",
        "--output-file",
        "never.txt",
        "--wait",
        "--",
        "true",
    ]);
    let err = format!("{}{}", out.failed().stdout, out.stderr);
    assert!(err.contains("output never.txt was not written"), "{err}");
    // A name that leaves the store is refused before anything is submitted.
    let out = c.run(&["submit", "--input", "../etc/passwd", "--", "true"]);
    assert!(out
        .failed()
        .one_line_error()
        .contains("--input \"../etc/passwd\""));
}
