//! The chaos test (issue 4): a server and 4 workers on loopback run 20,000 short tasks while
//! workers are SIGKILLed and restarted every second and the server is SIGKILLed and restarted
//! twice, when 30% and when 65% of the tasks have finished (milestones, not times: a fast
//! machine does not finish before the second kill). At the end every task must be recorded finished exactly once in the journal, every
//! task's file must exist, and the executions beyond one per task are reported.
//!
//! Set `KESTREL_CHAOS_TIMELINE=FILE` to get the completed-tasks-over-time curve as CSV (the
//! benchmark suite plots it).

mod common;

use common::*;
use kestrel_server::journal::Journal;
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::time::{Duration, Instant};

const TASKS: u32 = 20_000;
const WORKERS: usize = 4;
/// The whole test, chaos included, must end within this.
const LIMIT: Duration = Duration::from_secs(240);
/// When the server is killed: once this many tasks have finished.
const SERVER_KILLS: [u64; 2] = [TASKS as u64 * 3 / 10, TASKS as u64 * 13 / 20];

/// A small deterministic generator (xorshift), so every run kills the same way.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Finished count of job 1 and whether the job has ended, or `None` while the server is down
/// or restarting.
fn finished(c: &Cluster) -> Option<(u64, bool)> {
    let out = c.run(&["job", "info", "1", "--output", "json"]);
    if out.code() != Some(0) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&out.stdout).ok()?;
    let s = &v;
    let fin = s["counts"]["finished"].as_u64()?;
    let ended = ["finished", "failed", "canceled"].contains(&s["state"].as_str()?);
    Some((fin, ended))
}

/// How many failed tasks gave each reason, for a run that ended with failures.
fn failure_reasons(c: &Cluster) -> String {
    let out = c.run(&[
        "task", "list", "1", "--status", "failed", "--output", "json",
    ]);
    let Ok(page) = serde_json::from_str::<serde_json::Value>(&out.stdout) else {
        return format!("(task list failed: {})", out.stderr.trim());
    };
    let mut reasons: std::collections::BTreeMap<String, u32> = Default::default();
    for row in page["tasks"].as_array().into_iter().flatten() {
        *reasons.entry(row["reason"].to_string()).or_default() += 1;
    }
    format!("{reasons:?}")
}

#[test]
fn chaos_kill_workers_and_server_lose_nothing() {
    let mut c = Cluster::new();
    let mut live: Vec<usize> = (0..WORKERS).map(|_| c.add_worker(2)).collect();
    c.wait_workers(WORKERS);

    // One line per task: how long it sleeps, 0-20 ms.
    let mut rng = Rng(0x5eed_cafe_f00d);
    let lines: String = (0..TASKS)
        .map(|_| format!("0.{:03}\n", rng.next() % 21))
        .collect();
    fs::write(c.work.join("sleeps.txt"), lines).unwrap();
    fs::create_dir_all(c.work.join("out")).unwrap();
    c.run(&[
        "submit",
        "--each",
        "sleeps.txt",
        "--stdout",
        "none",
        "--stderr",
        "none",
        "--",
        "sh",
        "-c",
        "echo {task} >> out/{task}; sleep {line}",
    ])
    .ok();

    let start = Instant::now();
    let mut timeline = vec![(0.0, 0u64, "submitted")];
    let mut next_worker_kill = Duration::from_secs(1);
    let mut server_kills = SERVER_KILLS.iter().peekable();
    let (mut worker_kills, mut restarts) = (0, 0);
    // Finished tasks as last seen (the server may be down when asked).
    let mut seen = 0;
    loop {
        let t = start.elapsed();
        assert!(
            t < LIMIT,
            "the run did not finish within {LIMIT:?}: {timeline:?}"
        );
        if let Some((fin, done)) = finished(&c) {
            seen = fin;
            timeline.push((t.as_secs_f64(), fin, ""));
            if done {
                assert_eq!(
                    fin,
                    TASKS as u64,
                    "the job ended with tasks not finished: {}",
                    failure_reasons(&c)
                );
                break;
            }
        }
        if server_kills.peek().is_some_and(|k| seen >= **k) {
            server_kills.next();
            c.kill_server();
            timeline.push((t.as_secs_f64(), timeline.last().unwrap().1, "server killed"));
            c.start_server();
            restarts += 1;
        }
        if t >= next_worker_kill {
            next_worker_kill += Duration::from_secs(1);
            let victim = live.swap_remove((rng.next() % live.len() as u64) as usize);
            c.kill_worker(victim);
            worker_kills += 1;
            live.push(c.add_worker(2));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let elapsed = start.elapsed();
    assert_eq!(
        restarts,
        SERVER_KILLS.len(),
        "the run ended before the server kills"
    );

    // The journal: every task finished exactly once.
    c.run(&["server", "stop"]).ok();
    c.wait_server_exit(Duration::from_secs(30));
    let journal = Journal::open(&c.server_dir, None).expect("journal opens");
    let mut ends: HashMap<u32, u32> = HashMap::new();
    for (job, index) in journal.successes().expect("journal reads") {
        assert_eq!(job, 1);
        *ends.entry(index).or_default() += 1;
    }
    let twice: Vec<_> = ends.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "tasks recorded finished twice: {twice:?}");
    assert_eq!(ends.len(), TASKS as usize, "tasks missing from the journal");

    // Every task's file exists and holds only its own id; count the extra executions.
    let mut runs = 0u64;
    for task in 0..TASKS {
        let text = fs::read_to_string(c.work.join(format!("out/{task}")))
            .unwrap_or_else(|e| panic!("task {task} is recorded finished but has no file: {e}"));
        for line in text.lines() {
            assert_eq!(
                line,
                task.to_string(),
                "task {task}'s file has a foreign line"
            );
            runs += 1;
        }
    }
    let extra = runs - TASKS as u64;
    println!(
        "chaos: {TASKS} tasks in {:.1} s, {worker_kills} worker kills, {restarts} server kills, \
         {extra} executions beyond one per task",
        elapsed.as_secs_f64()
    );
    if let Ok(path) = std::env::var("KESTREL_CHAOS_TIMELINE") {
        let mut f = fs::File::create(&path).expect("timeline file");
        writeln!(f, "seconds,finished,event").unwrap();
        for (t, n, ev) in &timeline {
            writeln!(f, "{t:.2},{n},{ev}").unwrap();
        }
    }
}
