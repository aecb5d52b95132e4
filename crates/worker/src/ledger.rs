//! The worker's account of its tasks: templates, the local queue and free resources, the tasks
//! running, and the starts and ends not reported yet. The session reads and reports it; an
//! executor takes startable tasks from it and records what it did with each.
//!
//! It outlives a dropped connection (it is most of [`crate::state::Carry`]), so that the next
//! registration hands the running tasks and their results over instead of the server running
//! them again.

use crate::exec::CancelHandle;
use crate::files::SharedFiles;
use crate::local::{Held, Identity, Local, LocalTask};
use crate::WorkerConfig;
use kestrel_core::{Failure, Finished, JobId, RunEnd, TaskIndex};
use kestrel_proto::messages::{CacheChange, Started, TaskOutput};
use rustc_hash::FxHashMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// A task: its job and its index in the job.
pub(crate) type Key = (JobId, TaskIndex);

/// A task an executor started on its own, in the place of an ended run of its job.
pub(crate) struct Follower {
    pub(crate) key: Key,
    pub(crate) cancel: CancelHandle,
    /// When its assignment arrived: the wait for a slot ends with the run it follows.
    pub(crate) arrived_us: u64,
}

/// A task an executor started and has not reported ended.
pub(crate) struct Running {
    /// The executor that started it ends it (as canceled) when this is canceled.
    pub(crate) cancel: CancelHandle,
    /// What it holds, kept here because its job's definition may be forgotten first.
    pub(crate) held: Held,
    /// How long it waited here for a slot.
    pub(crate) waited_us: u64,
}

/// The worker's tasks, as the session and its executor keep them.
pub(crate) struct Ledger {
    /// Values for placeholders and the task environment (set on registration).
    pub(crate) me: Identity,
    pub(crate) local: Local,
    pub(crate) running: FxHashMap<Key, Running>,
    /// Starts for the next update (a connection's own: cleared when the next one starts).
    pub(crate) started: Vec<Started>,
    /// Ends for the next update, or for the next registration's resume report.
    pub(crate) finished: Vec<Finished>,
    /// Streamed output of `finished`, in its order (see `crate::outputs`).
    pub(crate) outputs: Vec<TaskOutput>,
    /// Summed waits for a slot of successful tasks, per job, not reported yet.
    pub(crate) waited: Vec<(JobId, u64)>,
    /// The worker's file cache, if it has one.
    pub(crate) files: Option<SharedFiles>,
}

impl Ledger {
    /// An empty account for a worker configured as `config`.
    pub(crate) fn new(config: &WorkerConfig) -> Ledger {
        Ledger {
            me: Identity {
                worker: 0,
                server: String::new(),
                server_dir: config.server_dir.clone(),
                values_tag: String::new(),
            },
            local: config.local(),
            running: FxHashMap::default(),
            started: Vec::new(),
            finished: Vec::new(),
            outputs: Vec::new(),
            waited: Vec::new(),
            files: None,
        }
    }

    /// What the cache gained and lost since the last update (nothing without a cache).
    pub(crate) fn take_cache_change(&mut self) -> CacheChange {
        self.files
            .as_ref()
            .map(|f| f.take_change())
            .unwrap_or_default()
    }

    /// Records a task an executor started at `at_us`.
    pub(crate) fn start_running(&mut self, key: Key, run: Running, at_us: u64) {
        self.running.insert(key, run);
        self.started.push(Started {
            job: key.0,
            index: key.1,
            at_us,
        });
    }

    /// Records a task that succeeded the moment it started, at `at_us`, and frees what it held.
    #[inline]
    pub(crate) fn succeeded_at_once(&mut self, task: &LocalTask, held: Held, at_us: u64) {
        self.local.release(held);
        self.note_wait(task.job, at_us.saturating_sub(task.arrived_us));
        self.finished.push(Finished::at_once(
            task.job,
            task.index,
            at_us,
            RunEnd::Success,
        ));
    }

    /// Lets a queued task whose inputs are here start before a head whose inputs are still
    /// being fetched ahead ([`Local::prefer_staged`]). Called before each start by the
    /// executors that run tasks with files.
    #[inline]
    pub(crate) fn prefer_staged(&mut self, for_slot: bool) -> bool {
        let Some(files) = &self.files else {
            return false;
        };
        // The prefetcher's lock is taken only if the head reads files, and once for the scan.
        let mut view = None;
        self.local.prefer_staged(for_slot, |key| {
            view.get_or_insert_with(|| files.prefetch_view()).ended(key)
        })
    }

    /// Reports a task failed whose launch could not be built.
    pub(crate) fn cannot_launch(&mut self, task: &LocalTask, now: u64, reason: String) {
        if let Some(files) = &self.files {
            files.forget_prefetched(&[(task.job, task.index)]);
        }
        let failed = RunEnd::Failed(Box::new(Failure::because(reason)));
        self.finished
            .push(Finished::at_once(task.job, task.index, now, failed));
    }

    /// Adds a successful task's wait for a slot to its job's sum for the next update.
    #[inline]
    pub(crate) fn note_wait(&mut self, job: JobId, waited_us: u64) {
        match self.waited.last_mut() {
            Some((j, sum)) if *j == job => *sum += waited_us,
            _ => match self.waited.iter_mut().find(|(j, _)| *j == job) {
                Some((_, sum)) => *sum += waited_us,
                None => self.waited.push((job, waited_us)),
            },
        }
    }

    /// How many running tasks are of `job`: each can be followed by one decked task.
    pub(crate) fn running_of(&self, job: JobId) -> usize {
        self.running.keys().filter(|(j, _)| *j == job).count()
    }

    /// Records the task an executor went straight on to after a run that ended at
    /// `finished_us` as running, with `held`, what the ended run held (same job, same needs).
    /// Returns its key, or `held` back when the executor went on to nothing.
    pub(crate) fn hand_on(
        &mut self,
        next: Option<Follower>,
        finished_us: u64,
        held: Held,
    ) -> Result<Key, Held> {
        let Some(f) = next else {
            return Err(held);
        };
        let waited_us = finished_us.saturating_sub(f.arrived_us);
        self.running.insert(
            f.key,
            Running {
                cancel: f.cancel,
                held,
                waited_us,
            },
        );
        Ok(f.key)
    }
}

/// Microseconds since the Unix epoch, as reports carry them.
pub(crate) fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Now, in microseconds since the Unix epoch.
pub(crate) fn now_us() -> u64 {
    micros(SystemTime::now())
}
