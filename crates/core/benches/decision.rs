//! The cost of a dispatch decision in core, per policy: the budget is 20 µs per
//! assignment at W = 3,200, 1,000 workers, 100,000 files and tasks with 1 to 5 inputs
//! (Falkon's was 2,100 µs; it made 1,322 decisions/s with max-cache-hit).
//!
//! The steady state is measured, which is the costly one: every slot busy, then over and over
//! one task ends on a worker chosen at random and a scheduling pass refills that worker, so
//! each pass makes one decision with a full window. The time is that of both events (the end
//! and the pass), divided by the tasks the passes assigned: an upper bound of the decision.
//!
//! Run: `cargo bench -p kestrel-core --bench decision`.

use criterion::{criterion_group, criterion_main, Criterion};
use kestrel_core::*;
use std::time::{Duration, Instant};

const WORKERS: u32 = 1_000;
const FILES_PER_DIR: u32 = 20_000;
const DIRS: u32 = 5;
const CACHED_PER_WORKER: u32 = 200;
const TASKS_PER_JOB: u32 = 40_000;

/// A fixed generator, so every run measures the same state.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n)) as u32
    }
}

struct Bench {
    sched: Scheduler,
    /// Tasks each worker holds, as assigned.
    held: Vec<Vec<(JobId, TaskIndex)>>,
    rng: Rng,
}

impl Bench {
    /// 1,000 workers of 2 slots each caching 200 of 100,000 files, and five jobs of at least
    /// 40,000 tasks (and `tasks` in all) reading 1 to 5 files each, placed by `policy`; every
    /// slot filled.
    fn new(policy: PolicyName, tasks: u64) -> Bench {
        let per_job = (tasks / u64::from(DIRS) + 1).max(u64::from(TASKS_PER_JOB)) as u32;
        let config = Config {
            window: Some(3_200),
            ..Config::default()
        };
        let mut sched = Scheduler::new(config);
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for w in 0..WORKERS {
            let offer = WorkerOffer {
                hostname: format!("w{w}"),
                resources: Resources {
                    cpus: 2,
                    ..Resources::NONE
                },
                prefetch: 0,
                named: Vec::new(),
                stages_files: true,
                runs_functions: false,
            };
            let Ok(Reply::Joined(id)) = sched.handle(0, Event::WorkerJoined { offer }) else {
                panic!("a worker joins");
            };
            let added = (0..CACHED_PER_WORKER)
                .map(|_| {
                    let (d, f) = (rng.below(DIRS) + 1, rng.below(FILES_PER_DIR));
                    (format!("d{d}/f{f}"), 1_000_000)
                })
                .collect();
            sched
                .handle(
                    0,
                    Event::CacheChanged {
                        worker: id,
                        added,
                        evicted: Vec::new(),
                    },
                )
                .expect("a cache report");
        }
        for k in 1..=DIRS {
            let mut spec = JobSpec::command(format!("k{k}"), vec!["x".into(), "{line}".into()]);
            spec.template.files.inputs = (1..=k).map(|d| format!("d{d}/{{line}}")).collect();
            spec.placement.policy = Some(policy);
            let lines: Vec<String> = (0..per_job)
                .map(|_| format!("f{}", rng.below(FILES_PER_DIR)))
                .collect();
            let tasks = TaskSet::Lines(lines.iter().map(String::as_str).collect());
            let submit = Event::Submit {
                spec: Box::new(spec),
                tasks,
                open: false,
                key: None,
            };
            sched.handle(0, submit).expect("a submission");
        }
        let mut b = Bench {
            sched,
            held: vec![Vec::new(); WORKERS as usize + 1],
            rng,
        };
        b.schedule(1);
        b
    }

    /// A pass; returns how many tasks it assigned.
    fn schedule(&mut self, now: u64) -> usize {
        self.sched.handle(now, Event::Schedule).expect("a pass");
        self.sched.take_records();
        let mut n = 0;
        for c in self.sched.take_commands() {
            if let Command::Assign { worker, runs } = c {
                for r in runs {
                    n += r.count as usize;
                    let held = &mut self.held[worker as usize];
                    held.extend((r.first..r.first + r.count).map(|i| (r.job, i)));
                }
            }
        }
        n
    }

    /// `batch` tasks end on random busy workers (one update each), then a pass. Returns the
    /// tasks assigned.
    fn step(&mut self, now: u64, batch: usize) -> usize {
        for _ in 0..batch {
            self.end_one(now);
        }
        self.schedule(now)
    }

    fn end_one(&mut self, now: u64) {
        if self.held.iter().all(Vec::is_empty) {
            return;
        }
        let w = loop {
            let w = self.rng.below(WORKERS) + 1;
            if !self.held[w as usize].is_empty() {
                break w;
            }
        };
        let held = &mut self.held[w as usize];
        let i = self.rng.below(held.len() as u32) as usize;
        let (job, index) = held.swap_remove(i);
        let end = Finished {
            job,
            index,
            started_us: now,
            finished_us: now,
            end: RunEnd::Success,
        };
        self.sched
            .handle(
                now,
                Event::TasksEnded {
                    worker: w,
                    ends: vec![end],
                },
            )
            .expect("an end");
    }
}

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    group.measurement_time(Duration::from_secs(4));
    group.sample_size(20);
    let policies = [
        PolicyName::FirstAvailable,
        PolicyName::MaxCacheHit,
        PolicyName::MaxComputeUtil,
        PolicyName::GoodCacheCompute,
    ];
    // One end per pass is the worst case (a pass and its window walk for one freed worker); a
    // server gathers the ends of a moment into one pass, at 1,000 busy workers a hundred or
    // more.
    for (policy, batch) in policies.into_iter().flat_map(|p| [(p, 1), (p, 100)]) {
        let mut b = Bench::new(policy, 0);
        let mut now = 2;
        let name = format!("{}/ends-per-pass-{batch}", policy.name());
        group.bench_function(name, |bench| {
            bench.iter_custom(|iters| {
                // Enough queued tasks for the whole sample (setting up is not timed).
                let wanted = iters.saturating_mul(batch as u64) + 10_000;
                if b.sched.queued() < wanted {
                    b = Bench::new(policy, wanted);
                }
                let mut assigned = 0usize;
                let start = Instant::now();
                for _ in 0..iters {
                    now += 1;
                    assigned += b.step(now, batch);
                }
                let took = start.elapsed();
                // Per assignment: a pass that assigned nothing (max-cache-hit waiting for a
                // holder) is a cost with no decision, charged to those that were made.
                took.mul_f64(iters as f64 / assigned.max(1) as f64)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decisions);
criterion_main!(benches);
