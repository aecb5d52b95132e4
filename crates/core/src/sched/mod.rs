//! The scheduler: jobs, workers, the ready queue and every task transition.
//!
//! A driver (the server, the simulator, a test) hands each [`Event`] to [`Scheduler::handle`]
//! with the current time, journals what [`Scheduler::take_records`] gives after it, and after a
//! batch of events hands [`Event::Schedule`] and carries out [`Scheduler::take_commands`].
//! Nothing here blocks, allocates per queued task, or reads a clock.
//!
//! The state lives in [`Scheduler`] (this file); each child module holds one kind of event or
//! one policy, as `impl Scheduler` blocks over that state: `event` takes the events apart,
//! `jobs`, `workers`, `resume` and `ends` apply them, `failure` decides retries and
//! quarantine, `dispatch` hands out tasks, `stall` explains a job that does not move, and
//! `restore` rebuilds the state from a journal.

mod audit;
mod config;
mod diffusion;
mod dispatch;
mod ends;
mod event;
mod failure;
mod graph;
mod job;
mod jobs;
mod multinode;
pub mod restore;
mod resume;
mod stall;
mod values;
mod worker;
mod workers;

pub use config::Config;
pub use event::{Event, Reply};
pub use graph::{WorkflowGraph, DROP_GRACE_US};
pub use job::{Counts, Job, Timing};
pub use resume::Resumed;
pub use stall::Stall;
pub use worker::{Departed, Worker, WorkerOffer, END_MARGIN_US, MAX_DEPARTED};

use crate::files::FileIndex;
use crate::outcome::{Command, Record};
use crate::policy::{DispatchPolicy, FirstAvailable};
use crate::queue::ReadyQueue;
use crate::spec::{
    JobId, JobSpec, Resources, SpecError, TaskIndex, TaskState, WorkerId, MAX_NAMED,
};
use crate::window::{Seq, Window};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};

/// Why an event was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchedError {
    /// No job has this id.
    #[error("job {0} does not exist; `kestrel job list` shows the jobs")]
    NoSuchJob(JobId),
    /// The job takes no more tasks.
    #[error("job {0} is closed; no tasks can be added")]
    JobClosed(JobId),
    /// Only list jobs take more tasks.
    #[error("job {0} is an array; only list jobs take more tasks")]
    NotAList(JobId),
    /// More tasks were given at an index other than the job's end.
    #[error("job {job} holds {len} tasks, so more can start at index {len}, not {at}")]
    ExtendGap {
        /// The job.
        job: JobId,
        /// How many tasks it holds.
        len: u32,
        /// The index the added tasks claimed.
        at: u32,
    },
    /// The added tasks are not of the job's kind.
    #[error("job {job} is {holds}; it cannot take {given}")]
    ExtendKind {
        /// The job.
        job: JobId,
        /// What the job holds.
        holds: &'static str,
        /// What was given.
        given: &'static str,
    },
    /// No worker has this id.
    #[error("worker {0} is not connected; `kestrel worker list` shows the workers")]
    NoSuchWorker(WorkerId),
    /// A canceled job cannot be retried without `--all`.
    #[error("job {0} was canceled; `kestrel job retry {0} --all` runs its failed and canceled tasks again")]
    RetryCanceled(JobId),
    /// A retried task depends on a job or task that failed for good (or was canceled): it
    /// could never run (Slurm's DependencyNeverSatisfied). Retrying that job first brings the
    /// tasks its failure canceled back.
    #[error("job {job} cannot be retried now: {why}. Retry job {retry} first (`kestrel job retry {retry}{}`): the tasks of job {job} canceled because of it come back with it, wait for it and run when it finishes", if *all { " --all" } else { "" })]
    DependencyNeverMet {
        /// The job whose retry was refused.
        job: JobId,
        /// What it depends on that failed, said for people.
        why: String,
        /// The job to retry first.
        retry: JobId,
        /// Whether that job was canceled (its retry needs `--all`).
        all: bool,
    },
    /// A job canceled while it was being sent in pieces holds only part of its tasks.
    #[error("job {0} was canceled while its tasks were still being sent in pieces, so it holds only part of them; submit it again")]
    RetryIncomplete(JobId),
    /// Single tasks of a job still being sent in pieces cannot be canceled yet.
    #[error("job {0} is still being sent in pieces, and its tasks wait for the last one: cancel the whole job, or its tasks once the last piece is in")]
    CancelIncomplete(JobId),
    /// More names of resources than the scheduler tells apart.
    #[error("resource '{name}' would be the server's {max}th name of a resource, past the most it tells apart ({known}); use one of those names", max = MAX_NAMED + 1)]
    TooManyNames {
        /// The new name.
        name: String,
        /// The names the server already tells apart.
        known: String,
    },
    /// The job's place in a task graph was refused (two writers of a file, a cycle, an
    /// `after` that can never be met); the message names the tasks and files.
    #[error("{0}")]
    Graph(String),
    /// The job's specification was refused.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// Only an ended job can be forgotten.
    #[error("job {job} has not ended ({left} of its tasks not done yet); wait for it (`kestrel job wait {job}`) or cancel it (`kestrel job cancel {job}`) first")]
    NotEnded {
        /// The job.
        job: JobId,
        /// How many of its tasks have not ended.
        left: u32,
    },
}

/// What a worker event did, for the driver's logs and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// The report was taken.
    Recorded,
    /// The report was stale (the task was re-queued or finished elsewhere) and was ignored.
    Ignored,
}

/// The scheduler state machine.
#[derive(Debug)]
pub struct Scheduler {
    config: Config,
    jobs: BTreeMap<JobId, Job>,
    workers: BTreeMap<WorkerId, Worker>,
    /// The workers a pass looks at: all but those a pass found with no room for a one-cpu
    /// task at their deepest prefetch. A worker comes back when it frees something (a task
    /// of it ends, fails or is taken back) or is quarantined, so that a pass after one end
    /// on a thousand busy workers looks at one of them.
    open: BTreeSet<WorkerId>,
    /// Workers that can hold tasks waiting for a slot (a prefetch window), and workers whose
    /// allocation's end is known: the only ones work stealing and draining look at, so that
    /// a pass costs nothing per worker (at 40,000 workers it did). A worker gets no waiting
    /// task without a prefetch window (its credit is its cpus), so none is missed.
    prefetching: BTreeSet<WorkerId>,
    ending: BTreeSet<WorkerId>,
    ready: ReadyQueue,
    commands: Vec<Command>,
    /// State changes the driver must journal (see [`Record`]).
    records: Vec<Record>,
    next_job: JobId,
    next_worker: WorkerId,
    /// Jobs with tasks not yet terminal (for quick "is anything left" answers).
    live_jobs: FxHashSet<JobId>,
    /// Where ready tasks go (see [`crate::policy`]).
    policy: Box<dyn DispatchPolicy>,
    /// Failed tasks waiting out their retry backoff: (due time, job, index).
    delayed: BTreeSet<(u64, JobId, TaskIndex)>,
    /// The due time of each delayed task, to find it in `delayed`.
    delayed_at: FxHashMap<(JobId, TaskIndex), u64>,
    /// When the first retry that the last pass kept away from the worker it failed on may go
    /// there after all (see [`Config::retry_elsewhere_us`]).
    kept_until: Option<u64>,
    /// Why each worker that left while quarantined was quarantined: a worker that comes back
    /// naming its old id (after a lost connection) stays quarantined.
    quarantined_gone: FxHashMap<WorkerId, String>,
    /// Workers that left, the newest [`MAX_DEPARTED`] by id (ids only grow, so the oldest go
    /// first): shown by `worker list --all`, and taken up again by a worker that comes back
    /// under its id.
    departed: BTreeMap<WorkerId, Departed>,
    /// The runs each worker the journal names finished and failed, replayed at a restart:
    /// taken up by the worker when it comes back under its id.
    restored_runs: FxHashMap<WorkerId, (u64, u64)>,
    /// A registration its own worker replaced by registering again before the loss of its
    /// connection was noticed: kept from [`Event::WorkerRejoined`] until the
    /// [`Event::WorkerResumed`] that follows says which of its tasks the worker still runs.
    superseded: Option<Worker>,
    /// Names of named resources, numbered by position (see [`Resources::named`]).
    names: Vec<String>,
    /// Which workers' caches hold which files (data diffusion).
    files: FileIndex,
    /// Ready tasks of jobs placed by where their data is (see the `diffusion` module).
    window: Window,
    /// Live jobs whose tasks go through the window.
    windowed_jobs: FxHashSet<JobId>,
    /// Buffers kept across data-aware decisions, so that one allocates nothing.
    hit_buf: Vec<(Seq, crate::files::Hits)>,
    cand_buf: Vec<(WorkerId, crate::files::Hits)>,
    /// Dependencies between tasks and the intermediate files they pass (see `graph`).
    graph: graph::Graph,
    /// Multi-node tasks: their queue, the workers they run on or are held for (see
    /// `multinode`).
    nodes: multinode::Nodes,
    /// Python values kept in the caches (see `values`).
    values: values::ValueStats,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler::new(Config::default())
    }
}

impl Scheduler {
    /// A scheduler with no jobs and no workers, dispatching with [`FirstAvailable`].
    pub fn new(config: Config) -> Scheduler {
        Scheduler {
            next_job: config.first_job.max(1),
            policy: Box::new(FirstAvailable::new(config.max_queue_skips)),
            config,
            jobs: BTreeMap::new(),
            workers: BTreeMap::new(),
            open: BTreeSet::new(),
            prefetching: BTreeSet::new(),
            ending: BTreeSet::new(),
            ready: ReadyQueue::default(),
            commands: Vec::new(),
            records: Vec::new(),
            next_worker: 1,
            live_jobs: FxHashSet::default(),
            delayed: BTreeSet::new(),
            delayed_at: FxHashMap::default(),
            kept_until: None,
            quarantined_gone: FxHashMap::default(),
            departed: BTreeMap::new(),
            restored_runs: FxHashMap::default(),
            superseded: None,
            names: Vec::new(),
            files: FileIndex::new(),
            window: Window::new(),
            windowed_jobs: FxHashSet::default(),
            hit_buf: Vec::new(),
            cand_buf: Vec::new(),
            graph: graph::Graph::default(),
            values: values::ValueStats::default(),
            nodes: multinode::Nodes::default(),
        }
    }

    /// Dispatches with `policy` from now on: the order workers are served in, and the
    /// placement of tasks of jobs that name no policy of their own.
    pub fn set_dispatch_policy(&mut self, policy: Box<dyn DispatchPolicy>) {
        self.policy = policy;
        self.remark_windowed();
    }

    /// The tunables it runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What each task of a job with `spec` holds, its named resources numbered.
    fn need_of(&mut self, spec: &JobSpec) -> Result<Resources, SchedError> {
        let mut need = spec.resources;
        need.named = self.number(&spec.named)?;
        Ok(need)
    }

    /// The amounts of `named` by this scheduler's numbering of names; a new name takes the
    /// next number, up to [`MAX_NAMED`] names in all.
    fn number(&mut self, named: &[(String, u32)]) -> Result<[u32; MAX_NAMED], SchedError> {
        let mut out = [0u32; MAX_NAMED];
        for (name, amount) in named {
            let i = match self.names.iter().position(|n| n == name) {
                Some(i) => i,
                None if self.names.len() < MAX_NAMED => {
                    self.names.push(name.clone());
                    self.names.len() - 1
                }
                None => {
                    return Err(SchedError::TooManyNames {
                        name: name.clone(),
                        known: self.names.join(", "),
                    })
                }
            };
            out[i] = out[i].saturating_add(*amount);
        }
        Ok(out)
    }

    /// The name numbered `i` (see [`Resources::named`]).
    pub fn resource_name(&self, i: usize) -> Option<&str> {
        self.names.get(i).map(String::as_str)
    }

    /// Commands produced since the last call, in the order they must be carried out.
    pub fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.commands)
    }

    /// State changes to journal, in the order they happened; take them after every event.
    pub fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.records)
    }

    /// [`Self::take_records`] into the driver's buffer `into`, appended after what it holds;
    /// when it is empty the two buffers swap, so a driver that takes records after every
    /// event (a worker's update records its ends) allocates nothing per event.
    pub fn swap_records(&mut self, into: &mut Vec<Record>) {
        if into.is_empty() {
            std::mem::swap(&mut self.records, into);
        } else {
            into.append(&mut self.records);
        }
    }

    /// Whether commands are waiting (lets a driver skip an empty drain).
    pub fn has_commands(&self) -> bool {
        !self.commands.is_empty()
    }

    /// The job with id `id`, if it exists.
    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// Every job, in id order.
    pub fn jobs(&self) -> impl DoubleEndedIterator<Item = &Job> + '_ {
        self.jobs.values()
    }

    /// The worker with id `id`, if it is connected.
    pub fn worker(&self, id: WorkerId) -> Option<&Worker> {
        self.workers.get(&id)
    }

    /// Every connected worker, in id order.
    pub fn workers(&self) -> impl Iterator<Item = &Worker> + '_ {
        self.workers.values()
    }

    /// What is kept of worker `id` if it left (and is among the last [`MAX_DEPARTED`]).
    pub fn departed(&self, id: WorkerId) -> Option<&Departed> {
        self.departed.get(&id)
    }

    /// The tasks worker `id` holds (assigned to it and not ended: running, or waiting there
    /// for a slot), at most `limit` of them, in job and index order; empty for a worker that
    /// is not connected.
    pub fn tasks_of(&self, id: WorkerId, limit: usize) -> Vec<(JobId, TaskIndex, TaskState)> {
        let Some(w) = self.workers.get(&id) else {
            return Vec::new();
        };
        let mut held = w.ledger.held(worker::holder(&self.jobs, id));
        held.truncate(limit);
        held.into_iter()
            .filter_map(|(job, index)| {
                let state = self.jobs.get(&job)?.table.get(index).state;
                Some((job, index, state))
            })
            .collect()
    }

    /// Tasks waiting for a worker. Approximate after a worker resume: a queue entry of a task
    /// the resumed worker took back counts until the entry is reached and skipped. Tasks waiting
    /// out a retry backoff are not counted (see [`Self::next_wakeup`]).
    pub fn queued(&self) -> u64 {
        self.ready.len() + self.window.len() as u64 + self.nodes_queued()
    }

    /// Ready tasks and the cpus they hold, over every live job whose tasks could end within
    /// an allocation of `time_limit_us` (their `--timeout` and the end margin fit in it): the
    /// work an allocation queue provisions for. One look per live job, never per task.
    pub fn ready_demand_within(&self, time_limit_us: u64) -> (u64, u64) {
        let mut tasks = 0u64;
        let mut cpus = 0u64;
        for j in self.live_jobs.iter().filter_map(|id| self.jobs.get(id)) {
            let longest = j.spec.template.timeout_ms.unwrap_or(0).saturating_mul(1000);
            if j.canceled || longest.saturating_add(worker::END_MARGIN_US) > time_limit_us {
                continue;
            }
            // A multi-node task takes that many workers, at least its cpus each.
            let n = u64::from(j.counts.ready) * u64::from(j.spec.nodes.max(1));
            tasks += n;
            cpus += n * u64::from(j.need.cpus.max(1));
        }
        (tasks, cpus)
    }

    /// Jobs with tasks not yet terminal.
    pub fn live_jobs(&self) -> usize {
        self.live_jobs.len()
    }
}
