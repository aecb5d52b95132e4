//! The journal: a server killed with SIGKILL and started again on the same directory keeps what
//! it had acknowledged; the directory lock, a damaged journal, a full journal and repeated
//! submission keys.

mod common;

use common::*;
use kestrel_proto::messages::{Answer, Ask};
use kestrel_proto::{Access, Client};
use serde_json::Value;
use std::process::{Child, Stdio};
use std::time::Duration;

/// A job's task rows, without the worker ids (those are not kept across a restart).
fn tasks(c: &Cluster, job: &str) -> Vec<Value> {
    let mut rows = c
        .run(&["task", "list", job, "--limit", "100", "--output", "json"])
        .ok()
        .json()["tasks"]
        .as_array()
        .expect("tasks")
        .clone();
    for r in &mut rows {
        r.as_object_mut().expect("row").remove("worker");
    }
    rows
}

fn jobs(c: &Cluster) -> Vec<Value> {
    c.run(&["job", "list", "--output", "json"]).ok().json()["jobs"]
        .as_array()
        .expect("job list")
        .clone()
}

/// A client command left running in the background (killed if the test fails).
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_server_restarts_with_its_results_and_reruns_the_rest() {
    let mut c = Cluster::with_workers(&[2]);
    // Job 1 finishes before the crash.
    c.run(&[
        "submit",
        "--wait",
        "--array",
        "1-3",
        "--",
        "sh",
        "-c",
        "echo {task} > done-{task}",
    ])
    .ok();
    let before = tasks(&c, "1");
    // Job 2's two tasks are running when the server dies; they block until `go` exists.
    let blocked = "echo $$ > pid-{task}; echo run >> runs-{task}; \
                   while [ ! -f go ]; do sleep 0.05; done";
    // Submitted by a client that waits for it and must ride through the crash; once the tasks
    // run, that client is past its submission and waiting on its connection.
    let mut wait = kestrel();
    wait.arg("--server-dir")
        .arg(&c.server_dir)
        .args([
            "submit",
            "--wait",
            "--reconnect-for",
            "60s",
            "--array",
            "1-2",
        ])
        .args(["--", "sh", "-c", blocked])
        .current_dir(&c.work)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut waiter = Background(wait.spawn().expect("start submit --wait"));
    for t in 1..=2 {
        let pid = poll("job 2's tasks to start", STARTUP, || {
            read_pid(&c.work.join(format!("pid-{t}")))
        });
        c.adopt_group(pid);
    }
    let old_access = c.access();
    let old_file = c.root().join("old-access.json");
    std::fs::copy(c.server_dir.join("access.json"), &old_file).unwrap();

    c.kill_server();
    c.kill_worker(0);
    std::fs::write(c.work.join("go"), "").unwrap();
    c.start_server();

    // Same secret and port: the old access file still works.
    assert_eq!(c.access()["secret"], old_access["secret"]);
    assert_eq!(c.access()["port"], old_access["port"]);
    let out = run_bounded(
        {
            let mut k = kestrel();
            k.arg("--access")
                .arg(&old_file)
                .args(["job", "list", "--output", "json"]);
            k
        },
        COMMAND_LIMIT,
    );
    assert_eq!(out.ok().json()["jobs"].as_array().map(Vec::len), Some(2));

    // Finished tasks kept their results and timings; the running ones are queued again.
    assert_eq!(tasks(&c, "1"), before);
    let js = jobs(&c);
    assert_eq!(js[0]["state"], "finished", "{js:?}");
    assert_eq!(js[1]["counts"]["queued"], 2, "{js:?}");

    c.add_worker(2);
    let status = poll(
        "the waiting client to finish",
        Duration::from_secs(60),
        || waiter.0.try_wait().unwrap(),
    );
    let mut err = String::new();
    std::io::Read::read_to_string(waiter.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "job wait failed: {err}");
    assert!(err.contains("reconnect"), "{err}");
    // Each interrupted task ran again (at-least-once) and is recorded finished once.
    for t in 1..=2 {
        assert_eq!(c.read(&format!("runs-{t}")).unwrap().lines().count(), 2);
    }
    let js = jobs(&c);
    assert_eq!(js[1]["counts"]["finished"], 2, "{js:?}");
    // Job ids continue after the restored ones.
    let out = c.run(&["submit", "--output", "json", "--", "true"]);
    assert_eq!(out.ok().json()["jobs"][0], 3);
    let info = c.run(&["server", "info", "--output", "json"]).ok().json();
    assert!(info["journal"]["rows"].as_u64().unwrap() >= 5, "{info}");
    assert!(info["journal"]["path"]
        .as_str()
        .unwrap()
        .ends_with("journal.sqlite"));
}

#[test]
fn a_directory_held_by_a_live_server_is_refused() {
    let c = Cluster::new();
    let access_before = c.access();
    let mut k = kestrel();
    k.args(["server", "start", "--host", "127.0.0.1", "--port", "0"])
        .arg("--server-dir")
        .arg(&c.server_dir);
    let out = run_bounded(k, COMMAND_LIMIT);
    let err = out.one_line_error();
    assert!(
        err.contains(&format!(
            "in use by a running server (pid {})",
            c.server_pid()
        )),
        "{err}"
    );
    assert!(
        err.contains("server stop` or pick another directory"),
        "{err}"
    );
    // The running server's access file was not touched.
    assert_eq!(c.access(), access_before);
    c.run(&["job", "list"]).ok();
}

#[test]
fn a_damaged_truncated_or_empty_journal_is_refused_with_what_to_do_and_kept_as_it_is() {
    let mut c = Cluster::new();
    c.run(&["submit", "--", "true"]).ok();
    // A clean stop checkpoints the write-ahead log into the file, so the damage below is not
    // covered by SQLite's own recovery.
    c.run(&["server", "stop"]).ok();
    c.wait_server_exit(STARTUP);
    let path = c.server_dir.join("journal.sqlite");
    let good = std::fs::read(&path).unwrap();
    let mut damaged = good.clone();
    damaged[..16].copy_from_slice(b"not a database!!");
    let corrupt = [
        (damaged, "aside to start empty"),
        (good[..1000].to_vec(), "aside to start empty"),
        // A 0-byte journal is not a new one: starting empty on it would hide the loss.
        (
            Vec::new(),
            "holds no Kestrel journal (it is empty, 0 bytes)",
        ),
    ];
    for (bytes, says) in corrupt {
        std::fs::write(&path, &bytes).unwrap();
        let mut k = kestrel();
        k.args(["server", "start", "--host", "127.0.0.1", "--port", "0"])
            .arg("--server-dir")
            .arg(&c.server_dir);
        let out = run_bounded(k, COMMAND_LIMIT);
        let err = out.one_line_error();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(err.contains("aside"), "{err}");
        // Refused without a byte written: what it held can still be looked at or mended.
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "the file was changed");
    }
    // Nothing was lost: the good file put back starts with its job.
    std::fs::write(&path, &good).unwrap();
    c.start_server();
    assert_eq!(jobs(&c).len(), 1);
}

#[test]
fn a_full_journal_says_its_limit_and_what_to_do_and_keeps_serving() {
    let mut c = Cluster::new();
    c.kill_server();
    c.start_server_with(&["--journal-limit", "64K"]);
    // Small work fits.
    c.run(&["submit", "--", "true"]).ok();
    // A list job bigger than the journal's room is refused, not acknowledged.
    let lines: String = (0..20_000).map(|i| format!("input-{i:08}\n")).collect();
    std::fs::write(c.work.join("inputs.txt"), lines).unwrap();
    let out = c.run(&["submit", "--each", "inputs.txt", "--", "echo", "{line}"]);
    let err = out.one_line_error();
    assert!(
        err.contains("reached its limit of 64K set by --journal-limit"),
        "{err}"
    );
    assert!(err.contains("kestrel job forget"), "{err}");
    assert!(!err.contains("database or disk is full"), "{err}");
    // The refused job is not left behind.
    let js = jobs(&c);
    assert_eq!(js.len(), 1, "{js:?}");
    // Work that fits is taken, under an id the refused job did not have.
    let out = c
        .run(&["submit", "--parsable", "--", "true"])
        .ok()
        .stdout
        .clone();
    assert_eq!(out.trim(), "3");
    let info = c.run(&["server", "info"]).ok().stdout.clone();
    assert!(!info.contains("NOT WRITABLE"), "{info}");
}

#[test]
fn a_forgotten_job_stays_forgotten_after_a_restart_and_its_room_is_given_back() {
    let mut c = Cluster::new();
    // About 12 MB of lines, run by no worker.
    let lines: String = (0..200_000)
        .map(|i| format!("/scratch/survey/field-{i:08}/exposure-calibrated.fits\n"))
        .collect();
    std::fs::write(c.work.join("inputs.txt"), lines).unwrap();
    c.run(&["submit", "--", "true"]).ok();
    c.run(&["submit", "--each", "inputs.txt", "--", "echo", "{line}"])
        .ok();
    c.run(&["job", "cancel", "2"]).ok();
    let size = |c: &Cluster| {
        c.run(&["server", "info", "--output", "json"]).ok().json()["journal"]["bytes"]
            .as_u64()
            .expect("journal bytes")
    };
    let before = size(&c);
    let out = c.run(&["job", "forget", "2"]).ok().stdout.clone();
    assert!(out.contains("forgot job 2"), "{out}");
    // Given back in steps, one per tick of the server (100 ms): a bounded wait.
    let mut after = size(&c);
    for _ in 0..200 {
        if after * 4 < before {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        after = size(&c);
    }
    assert!(after * 4 < before, "{before} bytes before, {after} after");
    c.kill_server();
    c.start_server();
    let js = jobs(&c);
    assert_eq!(js.len(), 1, "job 2 came back: {js:?}");
    let out = c
        .run(&["submit", "--parsable", "--", "true"])
        .ok()
        .stdout
        .clone();
    assert_eq!(out.trim(), "3");
}

/// Sends one request to the server of `c` on a fresh connection and returns the answer.
fn try_ask(c: &Cluster, body: Ask) -> Result<Answer, kestrel_proto::ClientError> {
    let access = Access::read(&c.server_dir.join("access.json")).expect("access file");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut client = Client::connect(&access).await.expect("connects");
        client.call(body).await
    })
}

fn ask(c: &Cluster, body: Ask) -> Answer {
    try_ask(c, body).expect("answered")
}

fn true_spec(name: &str) -> kestrel_core::JobSpec {
    kestrel_core::JobSpec {
        name: name.into(),
        template: kestrel_core::TaskTemplate {
            argv: vec!["true".into()],
            env: vec![],
            cwd: None,
            stdout: kestrel_core::Sink::Null,
            stderr: kestrel_core::Sink::Null,
            timeout_ms: None,
            files: Default::default(),
            kind: Default::default(),
        },
        resources: kestrel_core::Resources::default(),
        priority: 0,
        retries: 0,
        after: vec![],
        parent: None,
        named: vec![],
        placement: Default::default(),
        nodes: 0,
        deps: vec![],
        task_ids: None,
    }
}

/// Submits with an idempotency key; returns the job id the server answered with.
fn submit_keyed(c: &Cluster, key: &str, tasks: kestrel_core::TaskSet, open: bool) -> u32 {
    let body = Ask::Submit {
        spec: true_spec("keyed"),
        tasks,
        open,
        key: Some(key.to_string()),
    };
    match ask(c, body) {
        Answer::Submitted { job, .. } => job,
        other => panic!("unexpected answer {other:?}"),
    }
}

#[test]
fn a_repeated_submission_key_gives_the_same_job_even_after_a_crash() {
    let mut c = Cluster::new();
    let array = || kestrel_core::TaskSet::Array(kestrel_core::IdRanges::span(1, 3));
    let first = submit_keyed(&c, "key-a", array(), false);
    assert_eq!(submit_keyed(&c, "key-a", array(), false), first);
    let other = submit_keyed(&c, "key-b", array(), false);
    assert_ne!(other, first);
    c.kill_server();
    c.start_server();
    assert_eq!(submit_keyed(&c, "key-a", array(), false), first);
    assert_eq!(submit_keyed(&c, "key-b", array(), false), other);
    assert_eq!(jobs(&c).len(), 2);
}

#[test]
fn pieces_of_a_list_job_resent_after_a_crash_are_added_once() {
    let mut c = Cluster::new();
    let argv = |x: &str| vec!["echo".to_string(), x.to_string()];
    let head = || kestrel_core::TaskSet::List(vec![argv("a")]);
    let job = submit_keyed(&c, "list-key", head(), true);
    let piece = |close| Ask::Extend {
        job,
        at: 1,
        argvs: vec![argv("b"), argv("c")],
        close,
    };
    assert_eq!(ask(&c, piece(false)), Answer::Extended);
    // The server dies before the client hears about the close; the client starts over.
    c.kill_server();
    c.start_server();
    assert_eq!(submit_keyed(&c, "list-key", head(), true), job);
    assert_eq!(ask(&c, piece(true)), Answer::Extended);
    let js = jobs(&c);
    assert_eq!(js.len(), 1, "{js:?}");
    assert_eq!(js[0]["counts"]["queued"], 3, "{js:?}");
    // Closed now: a repeat is harmless, new tasks are refused.
    assert_eq!(ask(&c, piece(true)), Answer::Extended);
    let more = Ask::Extend {
        job,
        at: 3,
        argvs: vec![argv("d")],
        close: true,
    };
    let err = try_ask(&c, more).expect_err("refused");
    assert!(err.to_string().contains("is closed"), "{err}");
}

#[test]
fn pieces_of_a_job_of_lines_resent_after_a_crash_are_added_once() {
    let mut c = Cluster::new();
    let lines = |l: &[&str]| l.iter().copied().collect::<kestrel_core::LineList>();
    let head = || kestrel_core::TaskSet::Lines(lines(&["a"]));
    let job = submit_keyed(&c, "lines-key", head(), true);
    let piece = |close| Ask::ExtendLines {
        job,
        at: 1,
        lines: lines(&["b", "c"]),
        close,
    };
    assert_eq!(ask(&c, piece(false)), Answer::Extended);
    c.kill_server();
    c.start_server();
    assert_eq!(submit_keyed(&c, "lines-key", head(), true), job);
    assert_eq!(ask(&c, piece(true)), Answer::Extended);
    let js = jobs(&c);
    assert_eq!(js.len(), 1, "{js:?}");
    assert_eq!(js[0]["counts"]["queued"], 3, "{js:?}");
    // Argvs do not go into a job of lines.
    let argvs = Ask::Extend {
        job,
        at: 3,
        argvs: vec![vec!["echo".into()]],
        close: true,
    };
    let err = try_ask(&c, argvs).expect_err("refused");
    assert!(err.to_string().contains("a list of lines"), "{err}");
}

#[test]
fn an_array_with_overlapping_runs_from_the_wire_is_refused() {
    let c = Cluster::new();
    // Runs 1-5 and 3-7, as a client other than kestrel's could send them.
    let runs = vec![
        kestrel_core::IdRun::new(1, 5, 1),
        kestrel_core::IdRun::new(3, 5, 1),
    ];
    let ids = kestrel_core::IdRanges::try_from(runs).unwrap();
    let body = Ask::Submit {
        spec: true_spec("overlap"),
        tasks: kestrel_core::TaskSet::Array(ids),
        open: false,
        key: None,
    };
    let err = try_ask(&c, body).expect_err("refused").to_string();
    assert!(err.contains("sorted and unique"), "{err}");
    assert!(jobs(&c).is_empty());
}
