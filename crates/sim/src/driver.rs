//! The virtual-time driver: Kestrel's scheduler (the same `kestrel_core::Scheduler` the
//! server's engine steps) fed the events of simulated nodes, a simulated network and store,
//! in the order of a virtual clock.
//!
//! Like the server's engine, the driver hands the scheduler every event that happened at one
//! instant, then asks it for a scheduling pass and carries its commands out: assignments reach
//! nodes after the network's latency (and the dispatcher's per-task cost), nodes stage inputs
//! through the store, peers or their caches, compute, and report back after the latency.
//! Nothing else decides where tasks go.

use crate::model::{arrival_times, Draws};
use crate::report::{DataReport, RunReport, Sample};
use crate::scenario::{Length, Setup};
use crate::units::Bandwidth;
use kestrel_core::files::{CacheDelta, FileId};
use kestrel_core::{
    Command, Config, Event, Failure, Finished, IdRanges, JobId, JobSpec, LineList, Reply,
    Resources, RunEnd, Scheduler, Started, TaskIndex, TaskSet, WorkerId, WorkerOffer,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::time::Instant;

type Task = (JobId, TaskIndex);

/// Something that will happen at a simulated instant.
enum Ev {
    /// Tasks `first..first + count` of the workload arrive.
    Arrive { first: u32, count: u32 },
    /// An assignment reaches a node.
    Deliver {
        node: usize,
        epoch: u32,
        tasks: Vec<Task>,
    },
    /// A request to give back waiting tasks reaches a node.
    Revoke {
        node: usize,
        epoch: u32,
        tasks: Vec<Task>,
    },
    /// A node's answer to it reaches the server.
    Revoked {
        node: usize,
        epoch: u32,
        tasks: Vec<Task>,
    },
    /// A run ends on a node.
    RunEnds {
        node: usize,
        epoch: u32,
        task: Task,
        started_us: u64,
        cpus: u32,
    },
    /// A node's report of a run's end (and of its cache's changes) reaches the server.
    Report {
        node: usize,
        epoch: u32,
        end: Box<Finished>,
        delta: CacheDelta,
    },
    /// The lowest-numbered `count` live nodes die.
    Kill { count: u32 },
    /// A killed node comes back, empty.
    Return { node: usize },
}

struct Queued {
    at: u64,
    seq: u64,
    ev: Ev,
}
impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// A node's LRU cache of input files, each usable from the instant its copy completes.
#[derive(Default)]
struct Cache {
    capacity: u64,
    used: u64,
    /// File → (usable from, last use stamp, size).
    files: HashMap<FileId, (u64, u64, u64)>,
    /// Last use stamp → file: the front is evicted first.
    order: BTreeMap<u64, FileId>,
    stamp: u64,
}

impl Cache {
    fn ready_at(&self, f: FileId) -> Option<u64> {
        self.files.get(&f).map(|(ready, _, _)| *ready)
    }

    /// Marks `f` used now (adding it, usable from `ready`, if absent); evicts what no longer
    /// fits, noting it in `delta`.
    fn touch(&mut self, f: FileId, size: u64, ready: u64, delta: &mut CacheDelta) {
        if self.capacity == 0 {
            return;
        }
        self.stamp += 1;
        if let Some((_, stamp, _)) = self.files.get_mut(&f) {
            self.order.remove(stamp);
            *stamp = self.stamp;
            self.order.insert(self.stamp, f);
            return;
        }
        while self.used + size > self.capacity {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, _, old_size)) = self.files.remove(&old) {
                self.used -= old_size;
            }
            delta.note_evicted(old);
        }
        self.files.insert(f, (ready, self.stamp, size));
        self.order.insert(self.stamp, f);
        self.used += size;
        delta.note_added(f, size);
    }

    fn clear(&mut self) {
        self.files.clear();
        self.order.clear();
        self.used = 0;
    }
}

/// A simulated node: one worker.
struct Node {
    worker: Option<WorkerId>,
    /// Bumped when the node dies: what was under way there is dropped when it comes due.
    epoch: u32,
    free_cpus: u32,
    waiting: VecDeque<Task>,
    running: HashMap<Task, u32>,
    cache: Cache,
    /// What its cache gained and lost since its last report.
    delta: CacheDelta,
    /// When its disk and its link are next free.
    disk_free: u64,
    link_free: u64,
}

/// One simulated run.
pub struct Driver<'a> {
    setup: &'a Setup,
    sched: Scheduler,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<Queued>>,
    nodes: Vec<Node>,
    by_worker: HashMap<WorkerId, usize>,
    draws: Draws,
    arrivals: Vec<u64>,
    /// Every job submitted, with the workload's index of its first task.
    jobs: HashMap<JobId, u32>,
    jobs_done: usize,
    /// When the last job ended.
    last_end: u64,
    arrived: u32,
    /// When the dispatcher is next free to send (with a per-task dispatch cost).
    dispatcher_free: u64,
    /// When each of the store's I/O servers is next free.
    store_free: BinaryHeap<Reverse<u64>>,
    data: DataReport,
    busy_cpus: u64,
    busy_cpu_us: u128,
    busy_since: u64,
    finished: u64,
    runs_lost: u64,
    runs_failed: u64,
    nodes_killed: u32,
    processed: u64,
    dispatched_by_second: HashMap<u64, u64>,
    timeline: Vec<Sample>,
    next_sample: u64,
    /// `data` at the last sample, for the timeline's rates.
    last_data: DataReport,
    /// Reused for each task's inputs.
    inputs: Vec<FileId>,
    seed: u64,
}

impl<'a> Driver<'a> {
    /// A run of `setup` with `seed`.
    pub fn new(setup: &'a Setup, seed: u64) -> Result<Driver<'a>, String> {
        let config = Config {
            window: setup.scheduler.window,
            util_threshold_permille: (setup.scheduler.threshold * 1000.0).round() as u16,
            ..Config::default()
        };
        let mut d = Driver {
            setup,
            sched: Scheduler::new(config),
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            nodes: Vec::new(),
            by_worker: HashMap::new(),
            draws: Draws::new(seed, &setup.workload.compute)?,
            arrivals: arrival_times(&setup.workload.arrival, setup.workload.tasks),
            jobs: HashMap::new(),
            jobs_done: 0,
            last_end: 0,
            arrived: 0,
            dispatcher_free: 0,
            store_free: (0..setup.store.servers).map(|_| Reverse(0)).collect(),
            data: DataReport::default(),
            busy_cpus: 0,
            busy_cpu_us: 0,
            busy_since: 0,
            finished: 0,
            runs_lost: 0,
            runs_failed: 0,
            nodes_killed: 0,
            processed: 0,
            dispatched_by_second: HashMap::new(),
            timeline: Vec::new(),
            next_sample: 0,
            last_data: DataReport::default(),
            inputs: Vec::new(),
            seed,
        };
        for _ in 0..setup.cluster.nodes {
            d.add_node();
        }
        // Arrivals of one submission interval come as one job at its end (at their instant,
        // if they all come at once or the interval is 0).
        let every = setup.workload.submit_every.0;
        let mut i = 0;
        while i < d.arrivals.len() {
            let first = d.arrivals[i];
            let due = if every == 0 || first == 0 {
                first
            } else {
                first.div_ceil(every) * every
            };
            let mut j = i;
            while j < d.arrivals.len() && d.arrivals[j] <= due {
                j += 1;
            }
            d.at(
                due,
                Ev::Arrive {
                    first: i as u32,
                    count: (j - i) as u32,
                },
            );
            i = j;
        }
        for kill in &setup.failures.kill {
            d.at(kill.at.0, Ev::Kill { count: kill.nodes });
        }
        Ok(d)
    }

    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse(Queued {
            at,
            seq: self.seq,
            ev,
        }));
    }

    /// Hands the scheduler one event; the driver makes only events it accepts, so a refusal
    /// is a bug of the driver or of the scheduler, reported as the run's error.
    fn event(&mut self, ev: Event) -> Result<Reply, String> {
        self.sched
            .handle(self.now, ev)
            .map_err(|e| format!("the scheduler refused an event of the simulation: {e}"))
    }

    fn add_node(&mut self) -> usize {
        let c = &self.setup.cluster;
        self.nodes.push(Node {
            worker: None,
            epoch: 0,
            free_cpus: c.cpus,
            waiting: VecDeque::new(),
            running: HashMap::new(),
            cache: Cache {
                capacity: c.cache.0,
                ..Cache::default()
            },
            delta: CacheDelta::default(),
            disk_free: 0,
            link_free: 0,
        });
        self.nodes.len() - 1
    }

    fn join(&mut self, node: usize) -> Result<(), String> {
        let c = &self.setup.cluster;
        let offer = WorkerOffer {
            hostname: format!("node{node}"),
            resources: Resources {
                cpus: c.cpus,
                ..Resources::NONE
            },
            prefetch: c.prefetch,
            named: Vec::new(),
            stages_files: true,
            runs_functions: false,
        };
        let Reply::Joined(id) = self.event(Event::WorkerJoined { offer })? else {
            return Err("the scheduler answered a joining worker without an id".into());
        };
        self.nodes[node].worker = Some(id);
        self.by_worker.insert(id, node);
        Ok(())
    }

    /// The job's spec: a command of lines naming the files a task reads, or an array.
    fn spec(&self) -> JobSpec {
        let w = &self.setup.workload;
        let mut spec = JobSpec::command("sim", vec!["task".into(), "{line}".into()]);
        spec.resources.cpus = w.cpus;
        spec.retries = w.retries;
        if w.files > 0 {
            spec.template.files.inputs = if w.inputs == 1 {
                vec!["data/{line}".into()]
            } else {
                (1..=w.inputs)
                    .map(|k| format!("data/{{line:{k}}}"))
                    .collect()
            };
            spec.placement.policy = Some(self.setup.scheduler.policy);
            spec.placement.util_threshold_permille =
                Some((self.setup.scheduler.threshold * 1000.0).round() as u16);
        } else {
            spec.template.argv = vec!["task".into(), "{task}".into()];
        }
        spec
    }

    /// Tasks `first..first + count`: lines of file names, or array ids.
    fn tasks(&mut self, first: u32, count: u32) -> TaskSet {
        let w = &self.setup.workload;
        if w.files == 0 {
            return TaskSet::Array(IdRanges::span(first, first + count - 1));
        }
        let (files, inputs) = (w.files, w.inputs);
        let mut lines = LineList::new();
        let mut line = String::new();
        let mut picked = Vec::with_capacity(inputs as usize);
        for _ in 0..count {
            line.clear();
            picked.clear();
            while picked.len() < inputs as usize {
                let f = self.draws.file(files);
                if !picked.contains(&f) {
                    picked.push(f);
                }
            }
            for (k, f) in picked.iter().enumerate() {
                let sep = if k > 0 { " " } else { "" };
                let _ = write!(line, "{sep}f{f}");
            }
            lines.push(&line);
        }
        TaskSet::Lines(lines)
    }

    /// Tasks arriving together come as one job, as a client submits what it has: a job whose
    /// tasks read files, submitted in pieces, would wait for its last piece (see
    /// `Scheduler::holds_until_closed`).
    fn arrive(&mut self, first: u32, count: u32) -> Result<(), String> {
        let tasks = self.tasks(first, count);
        self.arrived = first + count;
        let submit = Event::Submit {
            spec: Box::new(self.spec()),
            tasks,
            open: false,
            key: None,
        };
        let Reply::Submitted(job) = self.event(submit)? else {
            return Err("the scheduler answered a submission without a job".into());
        };
        self.jobs.insert(job, first);
        Ok(())
    }

    /// Runs a scheduling pass and turns its commands into future events.
    fn pump(&mut self) -> Result<(), String> {
        self.event(Event::Schedule)?;
        self.sched.take_records();
        let latency = self.setup.cluster.latency.0;
        let cost = self.setup.scheduler.dispatch_cost.0;
        for cmd in self.sched.take_commands() {
            match cmd {
                Command::Assign { worker, runs } => {
                    let Some(&node) = self.by_worker.get(&worker) else {
                        continue;
                    };
                    let tasks: Vec<Task> = runs
                        .iter()
                        .flat_map(|r| (r.first..r.first + r.count).map(move |i| (r.job, i)))
                        .collect();
                    let sent = self.now.max(self.dispatcher_free) + cost * tasks.len() as u64;
                    self.dispatcher_free = sent;
                    *self
                        .dispatched_by_second
                        .entry(sent / 1_000_000)
                        .or_default() += tasks.len() as u64;
                    let epoch = self.nodes[node].epoch;
                    self.at(sent + latency, Ev::Deliver { node, epoch, tasks });
                }
                Command::Revoke { worker, tasks } => {
                    if let Some(&node) = self.by_worker.get(&worker) {
                        let epoch = self.nodes[node].epoch;
                        self.at(self.now + latency, Ev::Revoke { node, epoch, tasks });
                    }
                }
                Command::JobDone { .. } => {
                    self.jobs_done += 1;
                    self.last_end = self.now;
                }
                Command::Disconnect { worker, .. } => {
                    if let Some(&node) = self.by_worker.get(&worker) {
                        self.kill_node(node)?;
                    }
                }
                // Multi-node tasks, cancels and workflow files do not occur in a scenario.
                Command::AssignNodes { .. }
                | Command::Cancel { .. }
                | Command::DefineJob { .. }
                | Command::ForgetJob { .. }
                | Command::DropFiles { .. }
                | Command::Replicate { .. }
                | Command::Quarantined { .. } => {}
            }
        }
        Ok(())
    }

    fn handle(&mut self, ev: Ev) -> Result<(), String> {
        self.processed += 1;
        let latency = self.setup.cluster.latency.0;
        match ev {
            Ev::Arrive { first, count } => self.arrive(first, count)?,
            Ev::Deliver { node, epoch, tasks } => {
                if self.nodes[node].epoch == epoch && self.nodes[node].worker.is_some() {
                    self.nodes[node].waiting.extend(tasks);
                    self.start_tasks(node)?;
                }
            }
            Ev::Revoke { node, epoch, tasks } => {
                let n = &mut self.nodes[node];
                if n.epoch == epoch && n.worker.is_some() {
                    let mut given = Vec::new();
                    n.waiting.retain(|t| {
                        let asked = tasks.contains(t);
                        if asked {
                            given.push(*t);
                        }
                        !asked
                    });
                    self.at(
                        self.now + latency,
                        Ev::Revoked {
                            node,
                            epoch,
                            tasks: given,
                        },
                    );
                }
            }
            Ev::Revoked { node, epoch, tasks } => {
                if let (true, Some(worker)) =
                    (self.nodes[node].epoch == epoch, self.nodes[node].worker)
                {
                    self.event(Event::WorkerSeen { worker })?;
                    self.event(Event::TasksRevoked { worker, tasks })?;
                }
            }
            Ev::RunEnds {
                node,
                epoch,
                task,
                started_us,
                cpus,
            } => {
                if self.nodes[node].epoch != epoch
                    || self.nodes[node].running.remove(&task).is_none()
                {
                    return Ok(());
                }
                self.set_busy(-(i64::from(cpus)));
                self.nodes[node].free_cpus += cpus;
                let failed = self.draws.chance(self.setup.failures.task);
                let end = if failed {
                    self.runs_failed += 1;
                    RunEnd::Failed(Box::new(Failure {
                        exit_code: Some(1),
                        signal: None,
                        reason: "exit code 1 (a simulated failure)".into(),
                        stderr_tail: String::new(),
                        permanent: false,
                    }))
                } else {
                    RunEnd::Success
                };
                let end = Box::new(Finished {
                    job: task.0,
                    index: task.1,
                    started_us,
                    finished_us: self.now,
                    end,
                });
                let delta = std::mem::take(&mut self.nodes[node].delta);
                self.at(
                    self.now + latency,
                    Ev::Report {
                        node,
                        epoch,
                        end,
                        delta,
                    },
                );
                self.start_tasks(node)?;
            }
            Ev::Report {
                node,
                epoch,
                end,
                delta,
            } => {
                let Some(worker) = self.nodes[node]
                    .worker
                    .filter(|_| self.nodes[node].epoch == epoch)
                else {
                    return Ok(());
                };
                self.event(Event::WorkerSeen { worker })?;
                if !delta.is_empty() {
                    let files = self.sched.files();
                    let name = |f: FileId| files.name(f).unwrap_or_default().to_string();
                    let added = delta.added.iter().map(|&(f, n)| (name(f), n)).collect();
                    let evicted = delta.evicted.iter().map(|&f| name(f)).collect();
                    self.event(Event::CacheChanged {
                        worker,
                        added,
                        evicted,
                    })?;
                }
                if end.end == RunEnd::Success {
                    self.finished += 1;
                }
                self.event(Event::TasksEnded {
                    worker,
                    ends: vec![*end],
                })?;
            }
            Ev::Kill { count } => {
                let live: Vec<usize> = (0..self.nodes.len())
                    .filter(|&n| self.nodes[n].worker.is_some())
                    .take(count as usize)
                    .collect();
                for node in live {
                    self.kill_node(node)?;
                }
            }
            Ev::Return { node } => {
                self.nodes[node].epoch += 1;
                self.join(node)?;
            }
        }
        Ok(())
    }

    /// The node dies: what ran or waited there is lost, its cache with it; the server learns
    /// at once (its connection drops).
    fn kill_node(&mut self, node: usize) -> Result<(), String> {
        let Some(worker) = self.nodes[node].worker.take() else {
            return Ok(());
        };
        self.nodes_killed += 1;
        let n = &mut self.nodes[node];
        n.epoch += 1;
        let lost_cpus: u32 = n.running.values().sum();
        self.runs_lost += n.running.len() as u64;
        n.running.clear();
        n.waiting.clear();
        n.cache.clear();
        n.delta = CacheDelta::default();
        n.free_cpus = self.setup.cluster.cpus;
        self.set_busy(-i64::from(lost_cpus));
        self.by_worker.remove(&worker);
        self.event(Event::WorkerLost { worker })?;
        if let Some(after) = self.setup.failures.return_after {
            self.at(self.now + after.0, Ev::Return { node });
        }
        Ok(())
    }

    fn set_busy(&mut self, change: i64) {
        self.busy_cpu_us += u128::from(self.busy_cpus) * u128::from(self.now - self.busy_since);
        self.busy_since = self.now;
        self.busy_cpus = self.busy_cpus.saturating_add_signed(change);
    }

    /// Starts what waits on `node` while it has free cpus.
    fn start_tasks(&mut self, node: usize) -> Result<(), String> {
        let cpus = self.setup.workload.cpus;
        let Some(worker) = self.nodes[node].worker else {
            return Ok(());
        };
        while self.nodes[node].free_cpus >= cpus {
            let Some(task) = self.nodes[node].waiting.pop_front() else {
                break;
            };
            self.nodes[node].free_cpus -= cpus;
            self.nodes[node].running.insert(task, cpus);
            self.set_busy(i64::from(cpus));
            self.event(Event::TasksStarted {
                worker,
                started: vec![Started {
                    job: task.0,
                    index: task.1,
                    at_us: self.now,
                }],
            })?;
            let staged = self.stage(node, task, self.now + self.setup.cluster.task_overhead.0);
            let index = self.jobs.get(&task.0).copied().unwrap_or(0) + task.1;
            let ends = staged + self.draws.compute_us(index);
            let epoch = self.nodes[node].epoch;
            self.at(
                ends,
                Ev::RunEnds {
                    node,
                    epoch,
                    task,
                    started_us: self.now,
                    cpus,
                },
            );
        }
        Ok(())
    }

    /// Stages the task's inputs on `node` from `start`, one after another, from its cache, a
    /// peer's or the store; returns when the last is there.
    fn stage(&mut self, node: usize, task: Task, start: u64) -> u64 {
        let mut t = start;
        let w = &self.setup.workload;
        if w.files == 0 {
            return t;
        }
        let size = w.file_size.0;
        let (link, disk) = (self.setup.cluster.link, self.setup.cluster.disk);
        let mut inputs = std::mem::take(&mut self.inputs);
        inputs.clear();
        if let Some(j) = self.sched.job(task.0) {
            inputs.extend_from_slice(j.inputs_of(task.1));
        }
        for &f in &inputs {
            if let Some(ready) = self.nodes[node].cache.ready_at(f) {
                let start = t.max(ready).max(self.nodes[node].disk_free);
                t = start + disk.map_or(0, |d| d.time_us(size));
                self.nodes[node].disk_free = t;
                self.data.local_hits += 1;
                self.data.local_bytes += size;
            } else if let Some(peer) = self.peer_holding(node, f, t) {
                // The peer's link serves its copies one after another; this node's link caps
                // the copy's speed.
                let start = t.max(self.nodes[peer].link_free);
                t = start + link.map_or(0, |l| l.time_us(size));
                self.nodes[peer].link_free = t;
                self.data.peer_hits += 1;
                self.data.peer_bytes += size;
            } else {
                let Reverse(free) = self.store_free.pop().unwrap_or(Reverse(0));
                let per_server = self
                    .setup
                    .store
                    .bandwidth
                    .map(|b| Bandwidth(b.0 / f64::from(self.setup.store.servers)));
                let took = per_server
                    .map_or(0, |b| b.time_us(size))
                    .max(link.map_or(0, |l| l.time_us(size)));
                let start = t.max(free);
                t = start + took + self.setup.store.latency.0;
                self.store_free.push(Reverse(start + took));
                self.data.store_reads += 1;
                self.data.store_bytes += size;
            }
            let n = &mut self.nodes[node];
            n.cache.touch(f, size, t, &mut n.delta);
        }
        self.inputs = inputs;
        t
    }

    /// A live node other than `node` whose cache holds `f` by `t`, as the scheduler's index
    /// knows it (a hint: a node that evicted it since is not asked). The server names such
    /// peers with every assignment, whatever the policy (`engine/route.rs`), and so does this.
    fn peer_holding(&self, node: usize, f: FileId, t: u64) -> Option<usize> {
        self.sched
            .files()
            .holders(f)
            .iter()
            .filter_map(|w| self.by_worker.get(w).copied())
            .find(|&p| p != node && self.nodes[p].cache.ready_at(f).is_some_and(|r| r <= t))
    }

    fn workload_ended(&self) -> bool {
        self.arrived == self.setup.workload.tasks && self.jobs_done == self.jobs.len()
    }

    /// Tasks finished and failed, over every job.
    fn ended(&self) -> (u32, u32) {
        self.jobs
            .keys()
            .filter_map(|&j| self.sched.job(j))
            .fold((0, 0), |(f, x), j| {
                (f + j.counts.finished, x + j.counts.failed)
            })
    }

    /// Samples the cluster at every interval boundary up to `until`.
    fn sample_until(&mut self, until: u64) {
        while self.next_sample <= until {
            let dt = self.setup.sample.secs();
            let d = |a: u64, b: u64| (a - b) as f64 / dt;
            let (now, last) = (&self.data, &self.last_data);
            let inputs = now.inputs() - last.inputs();
            let cpus = self.nodes.iter().filter(|n| n.worker.is_some()).count() as u64
                * u64::from(self.setup.cluster.cpus);
            self.timeline.push(Sample {
                t_s: self.next_sample as f64 / 1e6,
                queued: self.sched.queued(),
                busy_cpus: self.busy_cpus,
                cpus,
                finished: self.finished,
                store_bytes_per_s: d(now.store_bytes, last.store_bytes),
                staged_bytes_per_s: d(now.staged_bytes(), last.staged_bytes()),
                hit_ratio: (inputs > 0).then(|| (now.hits() - last.hits()) as f64 / inputs as f64),
            });
            self.last_data = self.data.clone();
            self.next_sample += self.setup.sample.0;
        }
    }

    /// Runs to the end of the workload, or to the time bound, or until nothing can happen.
    pub fn run(mut self) -> Result<RunReport, String> {
        let wall = Instant::now();
        let limit = self.setup.time_limit.0;
        for node in 0..self.nodes.len() {
            self.join(node)?;
        }
        let mut stopped = None;
        loop {
            if self.workload_ended() {
                break;
            }
            let next_event = self.events.peek().map(|Reverse(q)| q.at);
            let wakeup = self.sched.next_wakeup();
            let next = match (next_event, wakeup) {
                (Some(e), Some(w)) => e.min(w.max(self.now)),
                (e, w) => match e.or(w.map(|w| w.max(self.now))) {
                    Some(t) => t,
                    None => {
                        stopped = Some(self.stuck());
                        break;
                    }
                },
            };
            if next > limit {
                self.sample_until(limit);
                self.now = limit;
                stopped = Some(format!(
                    "stopped at the time bound ({}): {}",
                    self.setup.time_limit,
                    self.left()
                ));
                break;
            }
            self.sample_until(next);
            self.now = next;
            // Every event of this instant, then one scheduling pass, as the engine batches.
            while let Some(Reverse(q)) = self.events.peek() {
                if q.at != self.now {
                    break;
                }
                let Some(Reverse(q)) = self.events.pop() else {
                    break;
                };
                self.handle(q.ev)?;
            }
            self.pump()?;
        }
        self.set_busy(0);
        let makespan_us = if stopped.is_none() {
            self.last_end
        } else {
            self.now
        };
        self.sample_until(makespan_us);
        Ok(self.report(makespan_us, stopped, wall.elapsed().as_secs_f64()))
    }

    /// What is left undone, for a run that stopped.
    fn left(&self) -> String {
        let total = self.setup.workload.tasks;
        let (finished, failed) = self.ended();
        let mut s = format!(
            "{finished} of {total} tasks finished, {failed} failed, {} not arrived",
            total - self.arrived
        );
        // Why the oldest job that has not ended does not move, as `job info` says it.
        let stuck = self
            .jobs
            .keys()
            .filter(|&&j| self.sched.job(j).is_some_and(|j| j.finished_us.is_none()))
            .min()
            .and_then(|&j| self.sched.stall(j));
        if let Some(stall) = stuck {
            s.push_str(&format!("; {stall}"));
            if matches!(stall, kestrel_core::Stall::TooBig { .. }) {
                s.push_str(" (in the scenario: more cluster.cpus, or fewer workload.cpus)");
            }
        }
        s
    }

    /// Why a run that still has work has nothing left to happen.
    fn stuck(&self) -> String {
        format!(
            "stopped at {:.1} s: nothing more can happen: {}",
            self.now as f64 / 1e6,
            self.left()
        )
    }

    fn report(self, makespan_us: u64, stopped: Option<String>, wall_s: f64) -> RunReport {
        let setup = self.setup;
        let w = &setup.workload;
        let cpus_total = u64::from(setup.cluster.nodes) * u64::from(setup.cluster.cpus);
        let mean_compute_us = match &w.compute {
            Length::Fixed(s) => s.0 as f64,
            Length::Gamma { mean, .. } | Length::Normal { mean, .. } => mean.0 as f64,
            Length::Trace { run_us, .. } => run_us.iter().sum::<u64>() as f64 / run_us.len() as f64,
        };
        let last_arrival = self.arrivals.last().copied().unwrap_or(0) as f64;
        let all_compute = mean_compute_us * f64::from(w.tasks) * f64::from(w.cpus);
        let ideal_us = (last_arrival + mean_compute_us).max(all_compute / cpus_total.max(1) as f64);
        let makespan = makespan_us.max(1) as f64;
        let (finished, failed) = self.ended();
        let inputs = self.data.local_hits + self.data.peer_hits + self.data.store_reads;
        let mut data = self.data.clone();
        data.hit_ratio =
            (inputs > 0).then(|| (data.local_hits + data.peer_hits) as f64 / inputs as f64);
        RunReport {
            name: setup.name.clone(),
            seed: self.seed,
            tasks: w.tasks,
            finished,
            failed,
            makespan_s: makespan_us as f64 / 1e6,
            ideal_s: ideal_us / 1e6,
            efficiency: (ideal_us >= 1e3 && stopped.is_none()).then(|| ideal_us / makespan),
            cpu_utilisation: self.busy_cpu_us as f64 / (cpus_total.max(1) as f64 * makespan),
            nodes: setup.cluster.nodes,
            cpus_per_node: setup.cluster.cpus,
            data,
            nodes_killed: self.nodes_killed,
            runs_lost: self.runs_lost,
            runs_failed: self.runs_failed,
            peak_dispatch_per_s: self
                .dispatched_by_second
                .values()
                .copied()
                .max()
                .unwrap_or(0),
            events: self.processed,
            wall_s,
            events_per_s: self.processed as f64 / wall_s.max(1e-9),
            stopped,
            timeline: self.timeline,
        }
    }
}
