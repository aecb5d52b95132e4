//! A job as the scheduler holds it: its tasks' records, counts and timing.

use super::{Worker, WorkerOffer};
use crate::files::{FileId, Transfers};
use crate::outcome::Failure;
use crate::policy::DispatchPolicy;
use crate::quarantine::JobOutcomes;
use crate::spec::{JobId, JobSpec, Resources, TaskIndex, TaskSet, TaskState, WorkerId};
use crate::table::{TaskRecord, TaskTable};
use rustc_hash::FxHashMap;

/// How deep, in tasks per cpu, a worker's queue may go for a job known to be short (see
/// [`Job::prefetch_for`]): past a few dozen, a deeper queue batches no better.
pub(super) const SHORT_PREFETCH_PER_CPU: u32 = 32;

/// Per-state task counts of a job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Queued, or waiting out a retry backoff.
    pub ready: u32,
    /// Waiting for the tasks they depend on.
    pub waiting: u32,
    /// Sent to a worker, not known to have started.
    pub assigned: u32,
    /// Started on a worker.
    pub running: u32,
    /// Ended in success.
    pub finished: u32,
    /// Failed for good (no retry left).
    pub failed: u32,
    /// Canceled.
    pub canceled: u32,
}

impl Counts {
    pub(super) fn slot(&mut self, state: TaskState) -> &mut u32 {
        match state {
            TaskState::Ready => &mut self.ready,
            TaskState::Assigned => &mut self.assigned,
            TaskState::Running => &mut self.running,
            TaskState::Finished => &mut self.finished,
            TaskState::Failed => &mut self.failed,
            TaskState::Canceled => &mut self.canceled,
            TaskState::Waiting => &mut self.waiting,
        }
    }

    pub(super) fn moved(&mut self, from: TaskState, to: TaskState) {
        *self.slot(from) -= 1;
        *self.slot(to) += 1;
    }

    /// Tasks that reached a terminal state (a `u64`: counts summed over jobs may pass `u32`).
    pub fn done(&self) -> u64 {
        u64::from(self.finished) + u64::from(self.failed) + u64::from(self.canceled)
    }

    /// Every task counted.
    pub fn total(&self) -> u64 {
        self.done()
            + u64::from(self.ready)
            + u64::from(self.waiting)
            + u64::from(self.assigned)
            + u64::from(self.running)
    }

    /// Adds `other`'s counts, state by state (a client's sum over the jobs it waits for),
    /// saturating rather than wrapping.
    pub fn add(&mut self, other: &Counts) {
        self.ready = self.ready.saturating_add(other.ready);
        self.waiting = self.waiting.saturating_add(other.waiting);
        self.assigned = self.assigned.saturating_add(other.assigned);
        self.running = self.running.saturating_add(other.running);
        self.finished = self.finished.saturating_add(other.finished);
        self.failed = self.failed.saturating_add(other.failed);
        self.canceled = self.canceled.saturating_add(other.canceled);
    }
}

/// A job as the scheduler holds it.
#[derive(Debug)]
pub struct Job {
    /// The job's id.
    pub id: JobId,
    /// What its tasks run and hold.
    pub spec: JobSpec,
    /// What each task holds: the spec's resources with its named ones numbered.
    pub need: Resources,
    /// Its tasks, as submitted and extended.
    pub tasks: TaskSet,
    /// When it was submitted.
    pub submitted_us: u64,
    /// Set when the last task reached a terminal state (and the job is closed).
    pub finished_us: Option<u64>,
    /// More tasks may still be appended.
    pub open: bool,
    /// Whether it was canceled.
    pub canceled: bool,
    /// How many of its tasks are in each state.
    pub counts: Counts,
    /// Run time of its tasks, a moving average over ended runs (`None` before the first):
    /// prefetch depth and work stealing follow it.
    pub mean_run_us: Option<u64>,
    /// Time its successful tasks waited on their workers for a free slot, summed.
    pub waited_us: u64,
    /// How its recent runs ended, on all workers (what quarantine compares a worker with).
    pub(super) outcomes: JobOutcomes,
    pub(super) table: TaskTable,
    pub(super) failures: FxHashMap<TaskIndex, Failure>,
    /// Tasks whose last run failed (for a reason not their own), with the worker it failed on
    /// and when: their retries go elsewhere, and what becomes of them there is evidence about
    /// that worker (see [`crate::quarantine`]). Dropped when the task succeeds.
    pub(super) failed_on: FxHashMap<TaskIndex, (WorkerId, u64)>,
    /// Each task's inputs, numbered by the file index: as many per task as the template
    /// names, in index order (see [`Job::inputs_of`]).
    pub(super) inputs: Vec<FileId>,
    /// Whether its tasks go through the scheduling window (they read files and its policy
    /// places by data).
    pub(super) windowed: bool,
    /// Its own policy, when it names one; else the scheduler's places it.
    pub(super) policy: Option<Box<dyn DispatchPolicy>>,
    /// Where its tasks' inputs came from, as workers reported.
    pub transfers: Transfers,
    /// The same per task, for the tasks that staged any (jobs without files keep none).
    pub(super) task_transfers: FxHashMap<TaskIndex, Transfers>,
    /// Each task's outputs, numbered like `inputs` (only for jobs in a graph).
    pub(super) outputs: Vec<FileId>,
    /// Each output pattern's mode as resolved at submission (empty outside a graph).
    pub(super) keep: Vec<crate::spec::Keep>,
    /// The running task that submitted it, by index.
    pub parent: Option<(JobId, TaskIndex)>,
    /// Jobs its tasks submitted that have not ended: it is not done before they are.
    pub live_children: u32,
    /// Its tasks canceled because what they depended on failed (see
    /// [`Job::canceled_for_deps`]): they come back when that is retried.
    pub(super) canceled_by_deps: u32,
    /// Its `after` dependencies not yet finished: while any is, all its tasks wait.
    pub(super) gate: u32,
    /// Waiting tasks and how many producers each still waits for.
    pub(super) unmet: FxHashMap<TaskIndex, u32>,
    /// Whether anything may wait on its tasks (the graph looks at their ends).
    pub(super) feeds: bool,
    /// A job of a graph submitted in pieces: all its tasks wait until the last piece, since
    /// only then are its dependencies known (a task may read a file a later piece writes).
    /// They stay stored ready and untouched (no record is written for a million held tasks),
    /// are counted waiting, and read as waiting ([`Job::record`]); none is queued.
    pub(super) held: bool,
    /// Results of its tasks kept in caches as values (see [`crate::values`]): deleted from
    /// them when the job is forgotten.
    pub(super) values: Vec<FileId>,
}

impl Job {
    /// A job as submitted: every task ready.
    pub(super) fn new(
        id: JobId,
        spec: JobSpec,
        need: Resources,
        tasks: TaskSet,
        submitted_us: u64,
        open: bool,
    ) -> Job {
        let n = tasks.len();
        Job {
            id,
            need,
            table: TaskTable::new(n),
            counts: Counts {
                ready: n,
                ..Default::default()
            },
            spec,
            tasks,
            submitted_us,
            finished_us: None,
            open,
            canceled: false,
            mean_run_us: None,
            waited_us: 0,
            outcomes: JobOutcomes::default(),
            failures: FxHashMap::default(),
            failed_on: FxHashMap::default(),
            inputs: Vec::new(),
            windowed: false,
            policy: None,
            transfers: Transfers::default(),
            task_transfers: FxHashMap::default(),
            outputs: Vec::new(),
            keep: Vec::new(),
            parent: None,
            live_children: 0,
            canceled_by_deps: 0,
            gate: 0,
            unmet: FxHashMap::default(),
            feeds: false,
            held: false,
            values: Vec::new(),
        }
    }

    /// Whether its tasks wait for the rest of the job, which is being submitted in pieces:
    /// it takes part in a task graph, linked once its last piece is in.
    pub fn held(&self) -> bool {
        self.held
    }

    /// How many tasks the job holds.
    pub fn len(&self) -> u32 {
        self.table.len()
    }

    /// Whether the job holds no task.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Whether every task is terminal, no more can come, and the jobs its tasks submitted
    /// have ended.
    pub fn is_done(&self) -> bool {
        !self.open && self.counts.done() == u64::from(self.len()) && self.live_children == 0
    }

    /// The record of a task (untouched tasks of a canceled job read as canceled).
    pub fn record(&self, index: TaskIndex) -> TaskRecord {
        let mut r = self.table.get(index);
        if self.canceled && matches!(r.state, TaskState::Ready | TaskState::Waiting) {
            r.state = TaskState::Canceled;
        } else if self.held && r.state == TaskState::Ready {
            // Stored ready (untouched), counted waiting: see `held`.
            r.state = TaskState::Waiting;
        }
        r
    }

    /// Whether canceled task `index` was canceled because what it depended on failed (or was
    /// canceled): such a cancel keeps its reason, as a failure of the task's own no retry
    /// can help, while a job's cancel keeps none.
    pub fn canceled_for_deps(&self, index: TaskIndex) -> bool {
        !self.canceled
            && self.table.get(index).state == TaskState::Canceled
            && self.failures.get(&index).is_some_and(|f| f.permanent)
    }

    /// The last failure of a task that ran and failed.
    pub fn failure(&self, index: TaskIndex) -> Option<&Failure> {
        self.failures.get(&index)
    }

    /// Where task `index`'s inputs came from, over all its runs.
    pub fn task_transfers(&self, index: TaskIndex) -> Transfers {
        self.task_transfers.get(&index).copied().unwrap_or_default()
    }

    /// The user-visible id of task `index`.
    pub fn task_id(&self, index: TaskIndex) -> u32 {
        match &self.spec.task_ids {
            Some(ids) => ids.id_at(index).unwrap_or(index),
            None => self.tasks.id_at(index),
        }
    }

    /// The index of the task with a user-visible id.
    pub fn index_of(&self, id: u32) -> Option<TaskIndex> {
        if let Some(ids) = &self.spec.task_ids {
            return ids.index_of(id).filter(|&i| i < self.len());
        }
        match &self.tasks {
            TaskSet::Array(r) => r.index_of(id),
            TaskSet::List(_) | TaskSet::Lines(_) => (id < self.tasks.len()).then_some(id),
        }
    }

    /// The argv of one task of a list job (`None` for arrays: the template's argv applies).
    pub fn task_argv(&self, index: TaskIndex) -> Option<&[String]> {
        self.tasks.argv(index)
    }

    /// Timing statistics over the tasks that finished successfully.
    pub fn timing(&self) -> Timing {
        let mut t = Timing {
            waited_us: self.waited_us,
            ..Timing::default()
        };
        let mut assigned_to_start = 0u64;
        for (_, r) in self.table.touched() {
            if r.state != TaskState::Finished || r.assigned_us == 0 {
                continue;
            }
            t.tasks += 1;
            t.queue_us += r.assigned_us.saturating_sub(self.submitted_us);
            assigned_to_start += r.started_us.saturating_sub(r.assigned_us);
            t.run_us += r.finished_us.saturating_sub(r.started_us);
            t.first_start_us = Some(
                t.first_start_us
                    .map_or(r.started_us, |s| s.min(r.started_us)),
            );
            t.last_finish_us = t.last_finish_us.max(r.finished_us);
        }
        // What is left of assignment-to-start once the wait for a slot is taken out.
        t.dispatch_us = assigned_to_start.saturating_sub(t.waited_us);
        t
    }

    /// Counts an ended run's length into the job's moving average.
    pub(super) fn note_run_time(&mut self, run_us: u64) {
        self.mean_run_us = Some(match self.mean_run_us {
            None => run_us,
            // An eighth of the way to each new sample: steady, yet a change shows in a few runs.
            Some(m) => (m as i64 + (run_us as i64 - m as i64) / 8) as u64,
        });
    }

    /// How many cpus' worth of this job's tasks `w` may hold beyond its slots: about
    /// [`Config::prefetch_horizon_us`] of run time per slot. A job whose task length is not
    /// known yet gets the worker's own prefetch; one known to be short may go deeper, up to
    /// [`SHORT_PREFETCH_PER_CPU`] per cpu (unless the worker's is 0), since tasks of tens of microseconds (function
    /// calls) otherwise cost a round trip of messages each and run at half the rate.
    pub(super) fn prefetch_for(&self, w: &Worker, horizon_us: u64) -> u32 {
        match self.mean_run_us {
            None => w.offer.prefetch,
            Some(m) => {
                let cpus = w.offer.resources.cpus;
                let covered = u64::from(cpus) * horizon_us / m.max(1);
                // A worker that asked for none (`--prefetch 0`) gets none.
                let most = match w.offer.prefetch {
                    0 => 0,
                    own => own.max(cpus.saturating_mul(SHORT_PREFETCH_PER_CPU)),
                };
                most.min(covered.min(u64::from(u32::MAX)) as u32)
            }
        }
    }

    /// Whether a waiting task of this job is worth taking back from a busy worker.
    /// (A multi-node task never is: its workers were chosen together.)
    pub(super) fn worth_stealing(&self, min_run_us: u64) -> bool {
        !self.canceled && self.spec.nodes == 0 && self.mean_run_us.is_none_or(|m| m >= min_run_us)
    }

    /// Records of touched tasks, in index order (untouched tasks are ready or canceled).
    pub fn touched(&self) -> impl Iterator<Item = (TaskIndex, TaskRecord)> + '_ {
        self.table.touched().map(|(i, r)| (i, *r))
    }

    /// Until when ready task `index` (whose record is `rec`) keeps away from `worker`: its
    /// last run failed there, and its retry, once due, waits up to `elsewhere_us` for another
    /// worker. `None` when it may go there now. Looked up only for tasks that ran before, so
    /// tasks on their first run pay one test of a byte of a record already read.
    #[inline]
    pub(super) fn kept_from(
        &self,
        index: TaskIndex,
        rec: &TaskRecord,
        worker: WorkerId,
        now_us: u64,
        config: &super::Config,
        elsewhere_us: u64,
    ) -> Option<u64> {
        if rec.runs == 0 || elsewhere_us == 0 || self.failed_on.is_empty() {
            return None;
        }
        let &(on, at) = self.failed_on.get(&index)?;
        let until = at
            .saturating_add(config.backoff_us(rec.failures))
            .saturating_add(elsewhere_us);
        (on == worker && now_us < until).then_some(until)
    }

    /// Whether the task is assigned or running on `worker`.
    pub(super) fn held_by(&self, index: TaskIndex, worker: WorkerId) -> bool {
        index < self.len() && {
            let r = self.table.get(index);
            r.worker == worker && matches!(r.state, TaskState::Assigned | TaskState::Running)
        }
    }

    /// How many inputs each task reads.
    pub(super) fn inputs_per_task(&self) -> usize {
        self.spec.template.files.inputs.len()
    }

    /// Whether its tasks read or write files: only workers with a cache take them.
    pub(super) fn has_files(&self) -> bool {
        !self.spec.template.files.is_empty()
    }

    /// Whether a worker offering `offer` can run its tasks at all, whatever its room: one with
    /// a cache if they declare files, one with Python runners if they call a function.
    pub(super) fn runs_on(&self, offer: &WorkerOffer) -> bool {
        (offer.stages_files || !self.has_files())
            && (offer.runs_functions || !self.spec.template.kind.is_function())
    }

    /// Hands ready task `index` to `worker` at `now_us`: its record says so (the caller
    /// accounts for it on the worker).
    pub(super) fn assign(&mut self, index: TaskIndex, worker: WorkerId, now_us: u64) {
        let rec = self.set_state(index, TaskState::Assigned);
        rec.assigned_us = now_us;
        rec.started_us = 0;
        rec.finished_us = 0;
        rec.worker = worker;
    }

    pub(super) fn set_state(&mut self, index: TaskIndex, to: TaskState) -> &mut TaskRecord {
        let rec = self.table.get_mut(index);
        self.counts.moved(rec.state, to);
        rec.state = to;
        rec
    }
}

/// Sums of the per-task intervals of a job's successful tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    /// How many successful tasks the sums cover.
    pub tasks: u64,
    /// Submission to assignment.
    pub queue_us: u64,
    /// Assignment to process start, less the wait for a free slot on the worker: network,
    /// the worker's handling and the preparation of the launch.
    pub dispatch_us: u64,
    /// Waiting on the worker, assigned ahead (prefetched), for a free slot.
    pub waited_us: u64,
    /// Process start to exit.
    pub run_us: u64,
    /// When the first of its tasks started, if one did.
    pub first_start_us: Option<u64>,
    /// When the last of its tasks ended.
    pub last_finish_us: u64,
}
