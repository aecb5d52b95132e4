//! Data diffusion with real workers: tasks that read logical files from a store directory,
//! staged through the workers' caches, and write outputs that reach the store.

mod common;

use common::*;
use std::fs;

fn main() -> std::process::ExitCode {
    trials::run(
        file!(),
        trials![
            inputs_come_through_the_caches_and_outputs_reach_the_store,
            a_missing_input_or_output_fails_its_task_by_name,
            inputs_come_from_a_peer_that_caches_them_not_from_the_store,
            a_peer_serving_a_corrupt_file_is_skipped_for_the_store,
            a_peer_that_stalls_is_given_up_on_and_the_store_serves,
            tasks_wait_for_a_store_that_is_down_and_say_so,
            a_holder_killed_leaves_its_files_to_the_store_without_a_hang,
            a_cache_smaller_than_the_inputs_evicts_under_each_policy,
            pairs_of_inputs_come_from_the_fields_of_each_line,
            a_full_cache_disk_evicts_or_streams_and_no_task_fails,
        ],
    )
}

/// A store directory holding `raw/1.dat` … `raw/N.dat`, each holding its own name
/// (`file N`, 7 bytes for N < 10), and its path.
fn store_of(n: u32) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("a store directory");
    fs::create_dir_all(dir.path().join("raw")).unwrap();
    for i in 1..=n {
        let file = dir.path().join(format!("raw/{i}.dat"));
        fs::write(file, format!("file {i}\n")).unwrap();
    }
    let store = dir.path().display().to_string();
    (dir, store)
}

/// A cluster whose server uses a store holding `raw/1.dat` … `raw/4.dat` (each holding its
/// own name) and `policy`, with two workers of 2 slots with caches of 1 MB.
fn cluster(policy: &str) -> (Cluster, String, tempfile::TempDir) {
    let (dir, store) = store_of(4);
    let mut c = Cluster::with_server_args(&["--store", &store, "--policy", policy]);
    for i in 0..2 {
        let cache = c.root().join(format!("cache-{i}")).display().to_string();
        c.add_worker_with(2, &["--cache-dir", &cache, "--cache-size", "1M"]);
    }
    c.wait_workers(2);
    (c, store, dir)
}

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

fn a_missing_input_or_output_fails_its_task_by_name() {
    let (c, store, _dir) = cluster("first-available");
    // A file the store does not have (and no task writes) is refused at submission.
    let out = c.run(&["submit", "--input", "raw/nope.dat", "--", "true"]);
    assert_eq!(
        out.failed().one_line_error(),
        format!("error: submission refused: task 0 reads raw/nope.dat, which no task writes and the store {store} does not have; check the name, or submit the job that writes it first")
    );
    // One that goes away before its task runs (job 1 removes it, a second after this submit)
    // fails that task.
    let gone = format!("{store}/raw/4.dat");
    let rm = format!("sleep 1; rm {gone}");
    c.run(&["submit", "--", "sh", "-c", &rm]).ok();
    let out = c.run(&[
        "submit",
        "--after",
        "1",
        "--input",
        "raw/4.dat",
        "--retries",
        "3",
        "--wait",
        "--",
        "true",
    ]);
    let err = format!("{}{}", out.failed().stdout, out.stderr);
    assert!(
        err.contains(&format!("input raw/4.dat not found in {store}")),
        "{err}"
    );
    // Not retried: running it again would not make the file appear.
    let tasks = task_rows(&c, "2");
    assert_eq!(
        (tasks[0]["attempts"].as_u64(), tasks[0]["failures"].as_u64()),
        (Some(1), Some(1)),
        "{}",
        tasks[0]
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

/// A store of `raw/1.dat` … `raw/N.dat` and a server using it, with worker 0 offering
/// resource `a` and worker 1 resource `b` (so that a job can be sent to one of them), both
/// with caches served to peers; picks.txt lists the N files.
fn two_sided_cluster(n: u32) -> (Cluster, String, tempfile::TempDir) {
    let (dir, store) = store_of(n);
    let mut c = Cluster::with_server_args(&["--store", &store]);
    for side in ["a", "b"] {
        let cache = c.root().join(format!("cache-{side}")).display().to_string();
        let resource = format!("{side}=2");
        c.add_worker_with(
            2,
            &[
                "--cache-dir",
                &cache,
                "--cache-size",
                "1M",
                "--resource",
                &resource,
            ],
        );
    }
    c.wait_workers(2);
    let picks: String = (1..=n).map(|i| format!("{i}\n")).collect();
    fs::write(c.work.join("picks.txt"), picks).unwrap();
    (c, store, dir)
}

/// Runs every line of picks.txt on the side offering `resource`, each task copying its input
/// to out/JOB-TASK.txt in the store; returns the job's transfers.
fn read_on(c: &Cluster, resource: &str) -> serde_json::Value {
    let out = c.run(&[
        "submit",
        "--each",
        "picks.txt",
        "--resource",
        resource,
        "--input",
        "raw/{line}.dat",
        "--output-file",
        "out/{job}-{task}.txt",
        "--output",
        "json",
        "--",
        "sh",
        "-c",
        "mkdir -p out && cat {input:0} > out/{job}-{task}.txt",
    ]);
    let job = out.ok().json()["jobs"][0].as_u64().expect("a job id");
    c.run(&["job", "wait", &job.to_string()]).ok();
    let info = c.run(&["job", "info", &job.to_string(), "--output", "json"]);
    info.ok().json()["transfers"].clone()
}

/// The outputs of job `job`'s `n` tasks, as the store holds them.
fn outputs_of(store: &str, job: u64, n: u32) -> Vec<String> {
    (0..n)
        .map(|t| fs::read_to_string(format!("{store}/out/{job}-{t}.txt")).unwrap_or_default())
        .collect()
}

fn want_outputs(n: u32) -> Vec<String> {
    (1..=n).map(|i| format!("file {i}\n")).collect()
}

fn inputs_come_from_a_peer_that_caches_them_not_from_the_store() {
    let (c, store, _dir) = two_sided_cluster(4);
    let first = read_on(&c, "a=1");
    assert_eq!(first["store_reads"], 4, "{first}");
    // The same files on the other worker: each fetched from the first worker's cache.
    let second = read_on(&c, "b=1");
    assert_eq!(
        (second["peer_hits"].as_u64(), second["store_reads"].as_u64()),
        (Some(4), Some(0)),
        "{second}"
    );
    assert_eq!(second["peer_bytes"], 28, "{second}");
    assert_eq!(outputs_of(&store, 2, 4), want_outputs(4));
    // Task by task, too.
    for task in task_rows(&c, "2") {
        let t = &task["transfers"];
        assert_eq!(
            (t["peer_hits"].as_u64(), t["peer_bytes"].as_u64()),
            (Some(1), Some(7)),
            "{task}"
        );
    }
    let workers = c.run(&["worker", "list", "--output", "json"]).ok().json();
    for w in workers["workers"].as_array().expect("workers") {
        // Its four inputs and the four outputs its tasks wrote, 7 bytes each.
        assert_eq!(w["cache_used"], 56, "{w}");
    }
}

fn a_peer_serving_a_corrupt_file_is_skipped_for_the_store() {
    let (c, store, _dir) = two_sided_cluster(4);
    read_on(&c, "a=1");
    // Worker a's copy of raw/2.dat is overwritten (same size, other bytes), made writable
    // first as it is read-only.
    let cached: Vec<_> = fs::read_dir(c.root().join("cache-a/files"))
        .unwrap()
        .map(|k| k.unwrap().path().join("raw/2.dat"))
        .filter(|p| p.is_file())
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&cached[0], fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&cached[0], "file X\n").unwrap();
    let second = read_on(&c, "b=1");
    assert_eq!(
        (second["peer_hits"].as_u64(), second["store_reads"].as_u64()),
        (Some(3), Some(1)),
        "{second}"
    );
    assert_eq!(
        outputs_of(&store, 2, 4),
        want_outputs(4),
        "no task read the bad copy"
    );
    // Worker a finds its copy changed and serves it no more (a copy that rotted unseen, its
    // stamp unchanged, is refused by b on its digest: see peer.rs's tests).
    assert!(
        c.worker_log()
            .contains("a cached file changed since it came in"),
        "the worker says why it did not serve the file"
    );
}

fn a_peer_that_stalls_is_given_up_on_and_the_store_serves() {
    let (mut c, store, _dir) = two_sided_cluster(12);
    read_on(&c, "a=1");
    // Worker a freezes: alive to the kernel (connections are accepted), answering nothing.
    let a = c.worker_pid(0) as i32;
    unsafe { libc::kill(a, libc::SIGSTOP) };
    let second = read_on(&c, "b=1");
    unsafe { libc::kill(a, libc::SIGCONT) };
    assert_eq!(second["store_reads"], 12, "{second}");
    assert_eq!(outputs_of(&store, 2, 12), want_outputs(12));
    // Once found unreachable it is skipped: the twelve inputs cost one wait per fetch under
    // way when it froze (two slots and two prefetch threads at most), not one per input.
    let log = c.worker_log();
    let waits = log.matches("peer unreachable").count();
    assert!((1..=4).contains(&waits), "{waits} waits: {log}");
    c.kill_worker(0);
}

/// Serves `body` at every path on `listener` over plain HTTP/1.1, one request per connection,
/// until the test ends.
fn serve_http(listener: std::net::TcpListener, body: &'static str) {
    use std::io::{BufRead, BufReader, Write};
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

fn tasks_wait_for_a_store_that_is_down_and_say_so() {
    // A port where nothing listens yet: the store is down.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/");
    let mut c = Cluster::with_server_args(&["--store", &url, "--heartbeat", "500ms"]);
    let cache = c.root().join("cache").display().to_string();
    c.add_worker_with(1, &["--cache-dir", &cache]);
    c.wait_workers(1);
    c.run(&[
        "submit",
        "--input",
        "raw/1.dat",
        "--",
        "sh",
        "-c",
        "cat {input:0}",
    ])
    .ok();
    let waiting = poll("job info to say the tasks wait", COMMAND_LIMIT, || {
        let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
        info["waiting"].as_str().map(str::to_string)
    });
    assert!(
        waiting.contains("tasks wait for the store") && waiting.contains("raw/1.dat"),
        "{waiting}"
    );
    // The store comes back: the task reads it and succeeds, and the job stops saying so.
    serve_http(
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap(),
        "file 1\n",
    );
    c.run(&["job", "wait", "1"]).ok();
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert!(info["waiting"].is_null(), "{info}");
    assert_eq!(info["transfers"]["store_reads"], 1, "{info}");
}

fn a_holder_killed_leaves_its_files_to_the_store_without_a_hang() {
    let (mut c, store, _dir) = two_sided_cluster(4);
    read_on(&c, "a=1");
    // Worker a dies (SIGKILL): the server drops it and its cache from the index.
    c.kill_worker(0);
    c.wait_workers(1);
    let second = read_on(&c, "b=1");
    assert_eq!(
        (second["store_reads"].as_u64(), second["peer_hits"].as_u64()),
        (Some(4), Some(0)),
        "{second}"
    );
    assert_eq!(outputs_of(&store, 2, 4), want_outputs(4));
}

fn a_cache_smaller_than_the_inputs_evicts_under_each_policy() {
    for policy in ["lru", "fifo", "lfu", "random"] {
        let (_dir, store) = store_of(6);
        let mut c = Cluster::with_server_args(&["--store", &store]);
        let cache = c.root().join("cache").display().to_string();
        // Room for two of the six 7-byte files.
        c.add_worker_with(
            1,
            &[
                "--cache-dir",
                &cache,
                "--cache-size",
                "14",
                "--cache-policy",
                policy,
            ],
        );
        c.wait_workers(1);
        fs::write(c.work.join("picks.txt"), "1\n2\n3\n4\n5\n6\n1\n2\n").unwrap();
        let out = c.run(&[
            "submit",
            "--each",
            "picks.txt",
            "--input",
            "raw/{line}.dat",
            "--wait",
            "--",
            "sh",
            "-c",
            "grep -q 'file {line}' {input:0}",
        ]);
        out.ok();
        let workers = c.run(&["worker", "list", "--output", "json"]).ok().json();
        let used = workers["workers"][0]["cache_used"].as_u64();
        assert!(used.is_some_and(|u| u <= 14), "{policy}: {workers}");
        let on_disk = walk_files(&c.root().join("cache/files"));
        assert!(
            on_disk <= 2,
            "{policy}: {on_disk} files left in the cache directory"
        );
    }
}

/// How many regular files are under `dir`.
fn walk_files(dir: &std::path::Path) -> usize {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk_files(&p)
            } else {
                usize::from(p.is_file())
            }
        })
        .sum()
}

fn pairs_of_inputs_come_from_the_fields_of_each_line() {
    let (c, store, _dir) = cluster("good-cache-compute");
    // All-Pairs over three files: each line names the two inputs of its task.
    fs::write(c.work.join("pairs.txt"), "1 2\n1 3\n2 3\n").unwrap();
    let out = c.run(&[
        "submit",
        "--each",
        "pairs.txt",
        "--input",
        "raw/{line:1}.dat",
        "--input",
        "raw/{line:2}.dat",
        "--output-file",
        "pairs/{line:1}-{line:2}.txt",
        "--wait",
        "--",
        "sh",
        "-c",
        "mkdir -p pairs && cat {input:0} {input:1} > pairs/{line:1}-{line:2}.txt",
    ]);
    out.ok();
    for (a, b) in [(1, 2), (1, 3), (2, 3)] {
        let got = fs::read_to_string(format!("{store}/pairs/{a}-{b}.txt")).unwrap_or_default();
        assert_eq!(got, format!("file {a}\nfile {b}\n"));
    }
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    let t = &info["transfers"];
    let staged = ["local_hits", "peer_hits", "store_reads"]
        .iter()
        .map(|k| t[k].as_u64().unwrap_or(0))
        .sum::<u64>();
    assert_eq!(staged, 6, "two inputs for each of three tasks: {t}");
}

/// `kestrel` run by `unshare` with a private tmpfs of `size` mounted at `dir` first: a
/// worker whose cache disk is smaller than its `--cache-size`. `None` where this system
/// does not let a process make its own mount namespace.
fn kestrel_on_small_disk(dir: &std::path::Path, size: &str) -> Option<std::process::Command> {
    fs::create_dir_all(dir).unwrap();
    let can = std::process::Command::new("unshare")
        .args(["-rm", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !can {
        return None;
    }
    let mut c = std::process::Command::new("unshare");
    c.args([
        "-rm",
        "sh",
        "-c",
        r#"mount -t tmpfs -o "size=$1" tmpfs "$2" && shift 2 && exec "$@""#,
        "sh",
        size,
    ])
    .arg(dir)
    .arg(BIN)
    .env_remove("KESTREL_SERVER_DIR")
    .env_remove("RUST_LOG")
    .stdin(std::process::Stdio::null());
    Some(c)
}

fn a_full_cache_disk_evicts_or_streams_and_no_task_fails() {
    // Eight files of 16 KiB, and one of 96 KiB, in a store; the worker's cache is a 64 KiB
    // disk while it was told 1 MiB.
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("raw")).unwrap();
    for i in 1..=8u8 {
        fs::write(
            dir.path().join(format!("raw/{i}.dat")),
            vec![b'a' + i; 16 << 10],
        )
        .unwrap();
    }
    fs::write(dir.path().join("raw/big.dat"), vec![b'z'; 96 << 10]).unwrap();
    let store = dir.path().display().to_string();
    let mut c = Cluster::with_server_args(&["--store", &store]);
    let cache = c.root().join("cache");
    let worker = kestrel_on_small_disk(&cache, "64k").unwrap_or_else(|| {
        trials::skip("`unshare -rm` is not permitted here, so no small disk can be made")
    });
    let cache = cache.display().to_string();
    c.add_worker_as(worker, 1, &["--cache-dir", &cache, "--cache-size", "1M"]);
    c.wait_workers(1);
    // A task of five files first: four fill the disk and are pinned, so the fifth, meeting
    // the full disk with nothing to evict, is streamed into the task's directory.
    let five: Vec<String> = (1..=5).map(|i| format!("raw/{i}.dat")).collect();
    let mut submit = vec!["submit", "--retries", "0", "--wait"];
    for f in &five {
        submit.extend(["--input", f]);
    }
    submit.extend([
        "--",
        "sh",
        "-c",
        "test \"$(cat {inputs} | wc -c)\" -eq 81920",
    ]);
    c.run(&submit).ok();
    // Then one file per task: the disk fills up again and files are evicted; the big one,
    // larger than the shrunk cache, is streamed past it.
    fs::write(
        c.work.join("picks.txt"),
        "1 16384\n2 16384\n3 16384\n4 16384\n5 16384\n6 16384\n7 16384\n8 16384\nbig 98304\n",
    )
    .unwrap();
    c.run(&[
        "submit",
        "--each",
        "picks.txt",
        "--retries",
        "0",
        "--input",
        "raw/{line:1}.dat",
        "--wait",
        "--",
        "sh",
        "-c",
        "test \"$(wc -c < {input:0})\" -eq {line:2}",
    ])
    .ok();
    let workers = c.run(&["worker", "list", "--output", "json"]).ok().json();
    let w = &workers["workers"][0];
    let (used, capacity) = (w["cache_used"].as_u64(), w["cache_capacity"].as_u64());
    assert!(
        capacity.is_some_and(|c| c < 64 << 10) && used <= capacity,
        "the cache shrank to what its disk holds: {w}"
    );
}
