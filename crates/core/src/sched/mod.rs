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

mod config;
mod dispatch;
mod ends;
mod event;
mod failure;
mod job;
mod jobs;
pub mod restore;
mod resume;
mod stall;
mod worker;
mod workers;

pub use config::Config;
pub use event::{Event, Reply};
pub use job::{Counts, Job, Timing};
pub use resume::Resumed;
pub use stall::Stall;
pub use worker::{Worker, WorkerOffer};

use crate::outcome::{Command, Record};
use crate::queue::ReadyQueue;
use crate::spec::{JobId, JobSpec, Resources, SpecError, TaskIndex, WorkerId, MAX_NAMED};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};

/// Why an event was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchedError {
    #[error("job {0} does not exist; `kestrel job list` shows the jobs")]
    NoSuchJob(JobId),
    #[error("job {0} is closed; no tasks can be added")]
    JobClosed(JobId),
    #[error("job {0} is an array; only list jobs take more tasks")]
    NotAList(JobId),
    #[error("job {job} holds {len} tasks, so more can start at index {len}, not {at}")]
    ExtendGap { job: JobId, len: u32, at: u32 },
    #[error("job {job} is {holds}; it cannot take {given}")]
    ExtendKind {
        job: JobId,
        holds: &'static str,
        given: &'static str,
    },
    #[error("worker {0} is not connected; `kestrel worker list` shows the workers")]
    NoSuchWorker(WorkerId),
    #[error("job {0} was canceled; `kestrel job retry {0} --all` runs its failed and canceled tasks again")]
    RetryCanceled(JobId),
    #[error("resource '{name}' would be the server's {max}th name of a resource, past the most it tells apart ({known}); use one of those names", max = MAX_NAMED + 1)]
    TooManyNames { name: String, known: String },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("job {job} has not ended ({left} of its tasks not done yet); wait for it (`kestrel job wait {job}`) or cancel it (`kestrel job cancel {job}`) first")]
    NotEnded { job: JobId, left: u32 },
}

/// What a worker event did, for the driver's logs and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    Recorded,
    /// The report was stale (the task was re-queued or finished elsewhere) and was ignored.
    Ignored,
}

/// The scheduler state machine.
#[derive(Debug, Default)]
pub struct Scheduler {
    config: Config,
    jobs: BTreeMap<JobId, Job>,
    workers: BTreeMap<WorkerId, Worker>,
    ready: ReadyQueue,
    commands: Vec<Command>,
    /// State changes the driver must journal (see [`Record`]).
    records: Vec<Record>,
    next_job: JobId,
    next_worker: WorkerId,
    /// Jobs with tasks not yet terminal (for quick "is anything left" answers).
    live_jobs: FxHashSet<JobId>,
    /// Worker to start the next assignment pass from, so no worker is always served last.
    rotate: WorkerId,
    /// Failed tasks waiting out their retry backoff: (due time, job, index).
    delayed: BTreeSet<(u64, JobId, TaskIndex)>,
    /// The due time of each delayed task, to find it in `delayed`.
    delayed_at: FxHashMap<(JobId, TaskIndex), u64>,
    /// Why each worker that left while quarantined was quarantined: a worker that comes back
    /// naming its old id (after a lost connection) stays quarantined.
    quarantined_gone: FxHashMap<WorkerId, String>,
    /// Names of named resources, numbered by position (see [`Resources::named`]).
    names: Vec<String>,
}

impl Scheduler {
    pub fn new(config: Config) -> Scheduler {
        Scheduler {
            next_job: config.first_job.max(1),
            config,
            next_worker: 1,
            ..Default::default()
        }
    }

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

    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    pub fn jobs(&self) -> impl DoubleEndedIterator<Item = &Job> + '_ {
        self.jobs.values()
    }

    pub fn worker(&self, id: WorkerId) -> Option<&Worker> {
        self.workers.get(&id)
    }

    pub fn workers(&self) -> impl Iterator<Item = &Worker> + '_ {
        self.workers.values()
    }

    /// Tasks waiting for a worker. Approximate after a worker resume: a queue entry of a task
    /// the resumed worker took back counts until the entry is reached and skipped. Tasks waiting
    /// out a retry backoff are not counted (see [`Self::next_wakeup`]).
    pub fn queued(&self) -> u64 {
        self.ready.len()
    }

    /// Jobs with tasks not yet terminal.
    pub fn live_jobs(&self) -> usize {
        self.live_jobs.len()
    }
}
