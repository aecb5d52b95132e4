//! A deterministic driver of the scheduler in virtual time, for tests and what-if runs.
//!
//! Simulated workers receive assignments after a network latency, run tasks on their slots for
//! a duration chosen by the test, and report back after the same latency. Everything happens in
//! the order of a virtual clock, so a run is the same every time.

use crate::files::{CacheDelta, FileId};
use crate::outcome::{Command, Failure, Finished, RunEnd, Started};
use crate::sched::{Event, Reply, Scheduler, WorkerOffer};
use crate::spec::{JobId, JobSpec, Resources, TaskIndex, TaskSet, WorkerId};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

/// How a simulated run of a task behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimRun {
    /// How long the run takes on the worker.
    pub duration_us: u64,
    /// Whether the task succeeds.
    pub succeed: bool,
}

type RunModel = Box<dyn FnMut(WorkerId, JobId, TaskIndex, u32) -> SimRun>;

/// Data diffusion for the simulated workers: each keeps an LRU cache of input files, and a
/// task's run first stages its inputs, from the worker's own cache, a peer's (peers serve in
/// parallel) or the shared store (reads queue for it, one at a time: a store that saturates,
/// as GPFS did in the dissertation's runs). Workers report what their caches gained and lost
/// with their task reports.
#[derive(Clone, Copy, Debug)]
pub struct SimData {
    /// Files each worker's cache holds.
    pub cache_files: usize,
    /// Bytes of every file, as reported to the index.
    pub file_bytes: u64,
    /// Time to read an input from the worker's own cache.
    pub local_us: u64,
    /// Time to fetch an input from a peer that caches it (told by the assignment's hints;
    /// policies without hints read from the store).
    pub peer_us: u64,
    /// Time the store takes per file; reads queue for it.
    pub store_us: u64,
}

/// Where the simulated workers' inputs came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataStats {
    /// Inputs found in the worker's own cache.
    pub local: u64,
    /// Inputs fetched from a peer's cache.
    pub peer: u64,
    /// Inputs read from the shared store.
    pub store: u64,
    /// Cpu-microseconds of slots spent staging inputs rather than computing.
    pub staging_us: u64,
}

impl DataStats {
    /// The share of inputs found in some cache (own or a peer's).
    pub fn hit_ratio(&self) -> f64 {
        let all = self.local + self.peer + self.store;
        if all == 0 {
            0.0
        } else {
            (self.local + self.peer) as f64 / all as f64
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Commands reach a worker.
    Deliver(WorkerId, Vec<(JobId, TaskIndex)>),
    CancelAt(WorkerId, Vec<(JobId, TaskIndex)>),
    /// A request to give back waiting tasks reaches a worker.
    RevokeAt(WorkerId, Vec<(JobId, TaskIndex)>),
    /// A worker's answer to it reaches the server.
    Revoked(WorkerId, Vec<(JobId, TaskIndex)>),
    /// A task's run ends on a worker (started at, waited for a slot, success).
    RunEnds(WorkerId, JobId, TaskIndex, u64, u64, bool),
    /// A report reaches the server, with the run's wait for a slot.
    Report(WorkerId, FinishedOrd, u64),
}

/// `Finished` with an ordering, so events can sit in a heap.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FinishedOrd(Finished);
impl PartialOrd for FinishedOrd {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for FinishedOrd {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0.job, self.0.index).cmp(&(other.0.job, other.0.index))
    }
}

#[derive(Debug, Default)]
struct SimWorker {
    slots: u32,
    free: u32,
    /// Tasks waiting for a slot, with when they arrived.
    waiting: VecDeque<((JobId, TaskIndex), u64)>,
    running: BTreeMap<(JobId, TaskIndex), u64>,
    alive: bool,
    /// Highest number of tasks held at once (running + waiting), to check credits.
    max_held: usize,
    max_running: usize,
    runs: u64,
    /// Its cache, least recently used first (with [`SimData`]).
    cache: VecDeque<FileId>,
    /// What its cache gained and lost since its last report.
    delta: CacheDelta,
}

/// The scheduler plus simulated workers and network.
pub struct Harness {
    /// The scheduler under test.
    pub sched: Scheduler,
    /// The virtual clock, in microseconds.
    pub now_us: u64,
    latency_us: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    workers: BTreeMap<WorkerId, SimWorker>,
    attempts: BTreeMap<(JobId, TaskIndex), u32>,
    model: RunModel,
    /// Every command the scheduler issued, in order.
    pub commands: Vec<Command>,
    /// Tasks workers gave back when asked (work stealing).
    pub revoked: u64,
    data: Option<SimData>,
    /// When the store is next free to serve a read.
    store_free_us: u64,
    /// Where inputs came from (with [`Self::with_data`]).
    pub data_stats: DataStats,
    /// Every run started, in order: when, on which worker, which task.
    pub starts: Vec<(u64, WorkerId, (JobId, TaskIndex))>,
}

impl Harness {
    /// A harness whose tasks all succeed after `duration_us`, with one-way latency `latency_us`.
    pub fn new(sched: Scheduler, latency_us: u64, duration_us: u64) -> Harness {
        Self::with_model(sched, latency_us, move |_, _, _| SimRun {
            duration_us,
            succeed: true,
        })
    }

    /// A harness whose runs are decided by `model(job, index, attempt)`.
    pub fn with_model(
        sched: Scheduler,
        latency_us: u64,
        mut model: impl FnMut(JobId, TaskIndex, u32) -> SimRun + 'static,
    ) -> Harness {
        Self::with_worker_model(sched, latency_us, move |_, j, i, a| model(j, i, a))
    }

    /// A harness whose runs are decided by `model(worker, job, index, attempt)` (to simulate a
    /// broken node).
    pub fn with_worker_model(
        sched: Scheduler,
        latency_us: u64,
        model: impl FnMut(WorkerId, JobId, TaskIndex, u32) -> SimRun + 'static,
    ) -> Harness {
        Harness {
            sched,
            now_us: 1_000_000,
            latency_us,
            seq: 0,
            events: BinaryHeap::new(),
            workers: BTreeMap::new(),
            attempts: BTreeMap::new(),
            model: Box::new(model),
            commands: Vec::new(),
            revoked: 0,
            data: None,
            store_free_us: 0,
            data_stats: DataStats::default(),
            starts: Vec::new(),
        }
    }

    /// Simulates caches and a shared store as `data` says (see [`SimData`]).
    pub fn with_data(mut self, data: SimData) -> Harness {
        self.data = Some(data);
        self
    }

    /// What worker `id`'s cache holds, least recently used first.
    pub fn cache_of(&self, id: WorkerId) -> Vec<FileId> {
        self.workers
            .get(&id)
            .map(|w| w.cache.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Stages the inputs of task `index` of `job` on worker `w` at `now_us`; returns how long
    /// that takes.
    fn stage(&mut self, w: WorkerId, job: JobId, index: TaskIndex) -> u64 {
        let Some(d) = self.data else {
            return 0;
        };
        let Some(j) = self.sched.job(job) else {
            return 0;
        };
        let inputs = j.inputs_of(index).to_vec();
        let hinted = self.sched.policy_of(j).hints();
        let mut t = self.now_us;
        for f in inputs {
            let local = self.workers[&w].cache.contains(&f);
            let peer = !local
                && hinted
                && self
                    .workers
                    .iter()
                    .any(|(id, o)| *id != w && o.alive && o.cache.contains(&f));
            if local {
                t += d.local_us;
                self.data_stats.local += 1;
            } else if peer {
                t += d.peer_us;
                self.data_stats.peer += 1;
            } else {
                t = t.max(self.store_free_us) + d.store_us;
                self.store_free_us = t;
                self.data_stats.store += 1;
            }
            let sw = self.workers.get_mut(&w).expect("a live worker");
            if let Some(pos) = sw.cache.iter().position(|&c| c == f) {
                sw.cache.remove(pos);
            } else {
                sw.delta.note_added(f, d.file_bytes);
            }
            sw.cache.push_back(f);
            while sw.cache.len() > d.cache_files {
                if let Some(old) = sw.cache.pop_front() {
                    sw.delta.note_evicted(old);
                }
            }
        }
        let took = t - self.now_us;
        self.data_stats.staging_us += took;
        took
    }

    /// Hands the scheduler an event now; the harness only makes valid ones.
    fn event(&mut self, ev: Event) -> Reply {
        match self.sched.handle(self.now_us, ev) {
            Ok(reply) => reply,
            Err(e) => panic!("the harness made an event the scheduler refused: {e}"),
        }
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    /// Runs under way on a worker now.
    pub fn running_on(&self, id: WorkerId) -> usize {
        self.workers[&id].running.len()
    }

    /// Adds a worker with `slots` cpus and a prefetch window of `prefetch`; returns its id.
    /// It may be a node of multi-node tasks, with the other workers of no group.
    pub fn add_worker(&mut self, slots: u32, prefetch: u32) -> WorkerId {
        self.add_worker_in("", slots, prefetch)
    }

    /// [`Self::add_worker`] in worker group `group` (see [`Event::WorkerNodes`]).
    pub fn add_worker_in(&mut self, group: &str, slots: u32, prefetch: u32) -> WorkerId {
        let offer = WorkerOffer {
            hostname: "sim".into(),
            resources: Resources {
                cpus: slots,
                ..Resources::NONE
            },
            prefetch,
            named: Vec::new(),
            stages_files: true,
            runs_functions: false,
        };
        let Reply::Joined(id) = self.event(Event::WorkerJoined { offer }) else {
            unreachable!("a joining worker is answered with its id")
        };
        self.event(Event::WorkerNodes {
            worker: id,
            group: group.into(),
        });
        self.workers.insert(
            id,
            SimWorker {
                slots,
                free: slots,
                alive: true,
                ..Default::default()
            },
        );
        self.pump();
        id
    }

    /// Submits a closed job of `tasks` with `spec`; returns its id.
    pub fn submit(&mut self, spec: JobSpec, tasks: TaskSet) -> JobId {
        let submit = Event::Submit {
            spec: Box::new(spec),
            tasks,
            open: false,
            key: None,
        };
        let Reply::Submitted(id) = self.event(submit) else {
            unreachable!("a submission is answered with its job")
        };
        self.pump();
        id
    }

    /// Cancels a job; returns how many of its tasks were queued and how many running.
    pub fn cancel(&mut self, job: JobId) -> (u32, u32) {
        let Reply::Canceled { queued, running } = self.event(Event::Cancel { job }) else {
            unreachable!("a cancel is answered with its counts")
        };
        self.pump();
        (queued, running)
    }

    /// The worker dies: it stops running and reporting; the server learns at once.
    pub fn kill_worker(&mut self, id: WorkerId) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.alive = false;
        }
        self.event(Event::WorkerLost { worker: id });
        self.pump();
    }

    /// The worker freezes: it stops running and reporting, and the server learns only through
    /// the heartbeat timeout (driven by [`Self::tick`]).
    pub fn freeze_worker(&mut self, id: WorkerId) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.alive = false;
        }
    }

    /// Advances the clock, delivering heartbeats of live workers, and runs the timeout check.
    pub fn tick(&mut self, advance_us: u64) {
        self.run_until(self.now_us + advance_us);
        let alive: Vec<_> = self
            .workers
            .iter()
            .filter(|(_, w)| w.alive)
            .map(|(id, _)| *id)
            .collect();
        for worker in alive {
            self.event(Event::WorkerSeen { worker });
        }
        self.event(Event::Tick);
        self.pump();
    }

    /// Highest number of tasks a worker held at once, and highest number running at once.
    pub fn worker_peaks(&self, id: WorkerId) -> (usize, usize) {
        let w = &self.workers[&id];
        (w.max_held, w.max_running)
    }

    /// Runs started on a worker.
    pub fn worker_runs(&self, id: WorkerId) -> u64 {
        self.workers[&id].runs
    }

    /// Times a task was started, across all workers.
    pub fn attempts(&self, job: JobId, index: TaskIndex) -> u32 {
        self.attempts.get(&(job, index)).copied().unwrap_or(0)
    }

    /// Processes events until none is left.
    pub fn run_until_idle(&mut self) {
        self.run_until(u64::MAX);
    }

    /// Processes events up to virtual time `t` (inclusive).
    /// Retry backoffs that end on the way are honoured as the server's timer would.
    pub fn run_until(&mut self, t: u64) {
        loop {
            let next_event = self.events.peek().map(|Reverse((when, _, _))| *when);
            let wakeup = self.sched.next_wakeup();
            if let Some(due) = wakeup.filter(|d| *d <= t && next_event.is_none_or(|e| *d < e)) {
                self.now_us = self.now_us.max(due);
                self.pump();
                continue;
            }
            let Some(when) = next_event else {
                break;
            };
            if when > t {
                break;
            }
            let Some(Reverse((when, _, ev))) = self.events.pop() else {
                break;
            };
            self.now_us = when;
            self.handle(ev);
            self.pump();
        }
        if t != u64::MAX {
            self.now_us = self.now_us.max(t);
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver(w, tasks) => {
                let Some(sw) = self.workers.get_mut(&w) else {
                    return;
                };
                if !sw.alive {
                    return;
                }
                let now = self.now_us;
                sw.waiting.extend(tasks.into_iter().map(|t| (t, now)));
                self.start_tasks(w);
            }
            Ev::CancelAt(w, tasks) => {
                let Some(sw) = self.workers.get_mut(&w) else {
                    return;
                };
                if !sw.alive {
                    return;
                }
                let mut ended = Vec::new();
                for t in tasks {
                    if let Some(started) = sw.running.remove(&t) {
                        sw.free += 1;
                        ended.push((t, started));
                    } else if let Some(pos) = sw.waiting.iter().position(|x| x.0 == t) {
                        sw.waiting.remove(pos);
                        ended.push((t, self.now_us));
                    }
                }
                for ((job, index), started_us) in ended {
                    let f = Finished {
                        job,
                        index,
                        started_us,
                        finished_us: self.now_us,
                        end: RunEnd::Canceled,
                    };
                    self.at(
                        self.now_us + self.latency_us,
                        Ev::Report(w, FinishedOrd(f), 0),
                    );
                }
                self.start_tasks(w);
            }
            Ev::RevokeAt(w, tasks) => {
                let Some(sw) = self.workers.get_mut(&w) else {
                    return;
                };
                if !sw.alive {
                    return;
                }
                let mut given = Vec::new();
                sw.waiting.retain(|(t, _)| {
                    let asked = tasks.contains(t);
                    if asked {
                        given.push(*t);
                    }
                    !asked
                });
                self.revoked += given.len() as u64;
                self.at(self.now_us + self.latency_us, Ev::Revoked(w, given));
            }
            Ev::Revoked(w, tasks) => {
                if self.workers.get(&w).is_some_and(|sw| sw.alive) {
                    self.event(Event::WorkerSeen { worker: w });
                    self.event(Event::TasksRevoked { worker: w, tasks });
                }
            }
            Ev::RunEnds(w, job, index, started_us, waited_us, succeed) => {
                let Some(sw) = self.workers.get_mut(&w) else {
                    return;
                };
                if !sw.alive || sw.running.remove(&(job, index)).is_none() {
                    return;
                }
                sw.free += 1;
                let end = if succeed {
                    RunEnd::Success
                } else {
                    RunEnd::Failed(Box::new(Failure {
                        exit_code: Some(1),
                        signal: None,
                        reason: "exit code 1".into(),
                        stderr_tail: String::new(),
                        permanent: false,
                    }))
                };
                let f = Finished {
                    job,
                    index,
                    started_us,
                    finished_us: self.now_us,
                    end,
                };
                self.at(
                    self.now_us + self.latency_us,
                    Ev::Report(w, FinishedOrd(f), waited_us),
                );
                self.start_tasks(w);
            }
            Ev::Report(w, FinishedOrd(f), waited_us) => {
                if self.workers.get(&w).is_some_and(|sw| sw.alive) {
                    self.event(Event::WorkerSeen { worker: w });
                    let delta = self
                        .workers
                        .get_mut(&w)
                        .map(|sw| std::mem::take(&mut sw.delta))
                        .unwrap_or_default();
                    if !delta.is_empty() {
                        let files = self.sched.files();
                        let name = |f: FileId| files.name(f).unwrap_or_default().to_string();
                        let added = delta.added.iter().map(|&(f, n)| (name(f), n)).collect();
                        let evicted = delta.evicted.iter().map(|&f| name(f)).collect();
                        self.event(Event::CacheChanged {
                            worker: w,
                            added,
                            evicted,
                        });
                    }
                    let (job, ok) = (f.job, f.end == RunEnd::Success);
                    let ends = vec![f];
                    self.event(Event::TasksEnded { worker: w, ends });
                    // As a worker does: the sum of its successes' waits, per update.
                    if ok {
                        self.event(Event::SlotWait { job, waited_us });
                    }
                }
            }
        }
    }

    fn start_tasks(&mut self, w: WorkerId) {
        let now = self.now_us;
        let mut started = Vec::new();
        {
            let Some(sw) = self.workers.get_mut(&w) else {
                return;
            };
            while sw.free > 0 {
                let Some((t, arrived)) = sw.waiting.pop_front() else {
                    break;
                };
                sw.free -= 1;
                sw.running.insert(t, now);
                sw.runs += 1;
                self.starts.push((now, w, t));
                started.push((t, now - arrived));
            }
            sw.max_held = sw.max_held.max(sw.running.len() + sw.waiting.len());
            sw.max_running = sw.max_running.max(sw.running.len());
            debug_assert!(sw.running.len() <= sw.slots as usize);
        }
        for ((job, index), waited_us) in started {
            let attempt = {
                let a = self.attempts.entry((job, index)).or_insert(0);
                *a += 1;
                *a
            };
            self.event(Event::TasksStarted {
                worker: w,
                started: vec![Started {
                    job,
                    index,
                    at_us: now,
                }],
            });
            let run = (self.model)(w, job, index, attempt);
            let staging = self.stage(w, job, index);
            self.at(
                now + staging + run.duration_us,
                Ev::RunEnds(w, job, index, now, waited_us, run.succeed),
            );
        }
    }

    /// Runs a scheduling pass and turns its commands into future events (call after driving
    /// `sched` directly). Records are dropped: the harness keeps no journal.
    pub fn pump(&mut self) {
        self.event(Event::Schedule);
        self.sched.take_records();
        for cmd in self.sched.take_commands() {
            match &cmd {
                Command::Assign { worker, runs } => {
                    let tasks = runs
                        .iter()
                        .flat_map(|r| (r.first..r.first + r.count).map(move |i| (r.job, i)))
                        .collect();
                    self.at(self.now_us + self.latency_us, Ev::Deliver(*worker, tasks));
                }
                Command::AssignNodes {
                    worker, job, index, ..
                } => {
                    let tasks = vec![(*job, *index)];
                    self.at(self.now_us + self.latency_us, Ev::Deliver(*worker, tasks));
                }
                Command::Cancel { worker, tasks } => {
                    self.at(
                        self.now_us + self.latency_us,
                        Ev::CancelAt(*worker, tasks.clone()),
                    );
                }
                Command::Revoke { worker, tasks } => {
                    self.at(
                        self.now_us + self.latency_us,
                        Ev::RevokeAt(*worker, tasks.clone()),
                    );
                }
                Command::Disconnect { worker, .. } => {
                    if let Some(sw) = self.workers.get_mut(worker) {
                        sw.alive = false;
                    }
                }
                Command::DefineJob { .. }
                | Command::ForgetJob { .. }
                | Command::JobDone { .. }
                | Command::DropFiles { .. }
                | Command::Replicate { .. }
                | Command::Quarantined { .. } => {}
            }
            self.commands.push(cmd);
        }
    }
}
