//! The scheduler: jobs, workers, the ready queue and every task transition.
//!
//! A driver (the server, the simulator, a test) calls the event methods with the current time,
//! then [`Scheduler::schedule`], then drains [`Scheduler::take_commands`] and carries them out.
//! Nothing here blocks, allocates per queued task, or reads a clock.

use crate::ledger::Ledger;
use crate::outcome::{Command, Failure, Finished, IndexRun, Record, RunEnd};
use crate::queue::{ReadyQueue, Span};
use crate::spec::{JobId, JobSpec, Resources, SpecError, TaskIndex, TaskSet, TaskState, WorkerId};
use crate::table::{TaskRecord, TaskTable};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Tunables of the scheduler.
#[derive(Clone, Debug)]
pub struct Config {
    /// A worker silent for longer than this is lost.
    pub heartbeat_timeout_us: u64,
    /// How many queue entries that fit no worker one assignment pass may look past.
    pub max_queue_skips: usize,
    /// Wait before a failed task runs again; doubles with each failure of that task.
    pub retry_backoff_us: u64,
    /// The longest wait before a retry.
    pub retry_backoff_max_us: u64,
    /// A task that was on this many lost workers is failed: it probably kills its worker.
    pub max_crashes: u8,
    /// A worker whose tasks fail this many times within `quarantine_window_us`, while other
    /// workers succeed, gets no new tasks (0 turns quarantine off).
    pub quarantine_failures: u32,
    pub quarantine_window_us: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_timeout_us: 30_000_000,
            max_queue_skips: 64,
            retry_backoff_us: 500_000,
            retry_backoff_max_us: 60_000_000,
            max_crashes: 5,
            quarantine_failures: 10,
            quarantine_window_us: 60_000_000,
        }
    }
}

/// What a worker offers when it joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerOffer {
    pub hostname: String,
    /// Slots (cpus) and gpus it runs tasks on.
    pub resources: Resources,
    /// Extra cpus' worth of tasks it accepts ahead of free slots, so no slot waits a round trip.
    pub prefetch: u32,
}

/// Per-state task counts of a job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub ready: u32,
    pub assigned: u32,
    pub running: u32,
    pub finished: u32,
    pub failed: u32,
    pub canceled: u32,
}

impl Counts {
    fn slot(&mut self, state: TaskState) -> &mut u32 {
        match state {
            TaskState::Ready => &mut self.ready,
            TaskState::Assigned => &mut self.assigned,
            TaskState::Running => &mut self.running,
            TaskState::Finished => &mut self.finished,
            TaskState::Failed => &mut self.failed,
            TaskState::Canceled => &mut self.canceled,
        }
    }

    fn moved(&mut self, from: TaskState, to: TaskState) {
        *self.slot(from) -= 1;
        *self.slot(to) += 1;
    }

    /// Tasks that reached a terminal state.
    pub fn done(&self) -> u32 {
        self.finished + self.failed + self.canceled
    }

    pub fn total(&self) -> u32 {
        self.done() + self.ready + self.assigned + self.running
    }
}

/// A job as the scheduler holds it.
#[derive(Debug)]
pub struct Job {
    pub id: JobId,
    pub spec: JobSpec,
    pub tasks: TaskSet,
    pub submitted_us: u64,
    /// Set when the last task reached a terminal state (and the job is closed).
    pub finished_us: Option<u64>,
    /// More tasks may still be appended.
    pub open: bool,
    pub canceled: bool,
    pub counts: Counts,
    table: TaskTable,
    failures: FxHashMap<TaskIndex, Failure>,
}

impl Job {
    /// A job as submitted: every task ready.
    fn new(id: JobId, spec: JobSpec, tasks: TaskSet, submitted_us: u64, open: bool) -> Job {
        let n = tasks.len();
        Job {
            id,
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
            failures: FxHashMap::default(),
        }
    }

    pub fn len(&self) -> u32 {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Whether every task is terminal and no more can come.
    pub fn is_done(&self) -> bool {
        !self.open && self.counts.done() == self.len()
    }

    /// The record of a task (untouched tasks of a canceled job read as canceled).
    pub fn record(&self, index: TaskIndex) -> TaskRecord {
        let mut r = self.table.get(index);
        if self.canceled && r.state == TaskState::Ready {
            r.state = TaskState::Canceled;
        }
        r
    }

    /// The last failure of a task that ran and failed.
    pub fn failure(&self, index: TaskIndex) -> Option<&Failure> {
        self.failures.get(&index)
    }

    /// The user-visible id of a task.
    pub fn task_id(&self, index: TaskIndex) -> u32 {
        match &self.tasks {
            TaskSet::Array(r) => r.id_at(index).unwrap_or(index),
            TaskSet::List(_) => index,
        }
    }

    /// The index of the task with a user-visible id.
    pub fn index_of(&self, id: u32) -> Option<TaskIndex> {
        match &self.tasks {
            TaskSet::Array(r) => r.index_of(id),
            TaskSet::List(l) => (id < l.len() as u32).then_some(id),
        }
    }

    /// The argv of one task of a list job (`None` for arrays: the template's argv applies).
    pub fn task_argv(&self, index: TaskIndex) -> Option<&[String]> {
        match &self.tasks {
            TaskSet::List(l) => l.get(index as usize).map(Vec::as_slice),
            TaskSet::Array(_) => None,
        }
    }

    /// Timing statistics over the tasks that finished successfully.
    pub fn timing(&self) -> Timing {
        let mut t = Timing::default();
        for (_, r) in self.table.touched() {
            if r.state != TaskState::Finished || r.assigned_us == 0 {
                continue;
            }
            t.tasks += 1;
            t.queue_us += r.assigned_us.saturating_sub(self.submitted_us);
            t.dispatch_us += r.started_us.saturating_sub(r.assigned_us);
            t.run_us += r.finished_us.saturating_sub(r.started_us);
            t.first_start_us = Some(
                t.first_start_us
                    .map_or(r.started_us, |s| s.min(r.started_us)),
            );
            t.last_finish_us = t.last_finish_us.max(r.finished_us);
        }
        t
    }

    /// Records of touched tasks, in index order (untouched tasks are ready or canceled).
    pub fn touched(&self) -> impl Iterator<Item = (TaskIndex, TaskRecord)> + '_ {
        self.table.touched().map(|(i, r)| (i, *r))
    }

    /// Whether the task is assigned or running on `worker`.
    fn held_by(&self, index: TaskIndex, worker: WorkerId) -> bool {
        index < self.len() && {
            let r = self.table.get(index);
            r.worker == worker && matches!(r.state, TaskState::Assigned | TaskState::Running)
        }
    }

    fn set_state(&mut self, index: TaskIndex, to: TaskState) -> &mut TaskRecord {
        let rec = self.table.get_mut(index);
        self.counts.moved(rec.state, to);
        rec.state = to;
        rec
    }
}

/// Sums of the per-task intervals of a job's successful tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    pub tasks: u64,
    /// Submission to assignment.
    pub queue_us: u64,
    /// Assignment to process start: network, prefetch wait and spawn.
    pub dispatch_us: u64,
    /// Process start to exit.
    pub run_us: u64,
    pub first_start_us: Option<u64>,
    pub last_finish_us: u64,
}

/// A worker as the scheduler holds it.
#[derive(Debug)]
pub struct Worker {
    pub id: WorkerId,
    pub offer: WorkerOffer,
    pub joined_us: u64,
    pub last_seen_us: u64,
    /// Resources held by tasks assigned to it and not yet finished (prefetched ones included).
    pub used: Resources,
    /// How many tasks it holds: assigned to it and not yet finished.
    held: u32,
    /// Where to find the tasks it holds (see [`holds`]).
    ledger: Ledger,
    /// Jobs whose template it has been sent.
    known_jobs: FxHashSet<JobId>,
    pub tasks_finished: u64,
    pub tasks_failed: u64,
    /// Why it gets no new tasks, if quarantined (see [`Scheduler::resume_worker`]).
    pub quarantined: Option<String>,
    /// When its recent task failures happened (within the quarantine window).
    recent_failures: VecDeque<u64>,
    /// When a task last succeeded on it.
    last_success_us: Option<u64>,
    /// Tasks it reported running when it resumed that were already assigned to another worker:
    /// the first successful result of either run is kept.
    duplicates: FxHashSet<(JobId, TaskIndex)>,
}

impl Worker {
    /// How many cpus' and gpus' worth of tasks it takes at most.
    fn capacity(&self) -> Resources {
        let r = self.offer.resources;
        let gpu_prefetch = if self.offer.prefetch > 0 { r.gpus } else { 0 };
        Resources {
            cpus: r.cpus + self.offer.prefetch,
            gpus: r.gpus + gpu_prefetch,
        }
    }

    /// Takes a task (resumed or moved over from a previous registration) with what it holds;
    /// the caller makes the task's record name this worker.
    fn hold(&mut self, job: JobId, index: TaskIndex, need: Resources) {
        self.ledger.push(job, index);
        self.held += 1;
        self.used.cpus += need.cpus;
        self.used.gpus += need.gpus;
        self.known_jobs.insert(job);
    }

    /// Gives back what a task it holds held; the caller has checked with [`Job::held_by`]
    /// that it holds the task, and then moves the task's record on. Returns whether its ledger
    /// is now due for [`Scheduler::prune_ledger`].
    #[must_use]
    fn release(&mut self, need: Resources) -> bool {
        self.held -= 1;
        self.used.cpus -= need.cpus;
        self.used.gpus -= need.gpus;
        self.ledger.needs_pruning(self.held)
    }

    /// How many tasks needing `need` still fit.
    fn room_for(&self, need: Resources) -> u32 {
        let cap = self.capacity();
        let by_cpu = cap.cpus.saturating_sub(self.used.cpus) / need.cpus.max(1);
        match cap
            .gpus
            .saturating_sub(self.used.gpus)
            .checked_div(need.gpus)
        {
            Some(by_gpu) => by_cpu.min(by_gpu),
            None => by_cpu,
        }
    }

    /// Whether a task needing `need` could ever run here.
    fn can_ever_run(&self, need: Resources) -> bool {
        let r = self.offer.resources;
        need.cpus <= r.cpus && need.gpus <= r.gpus
    }

    /// Tasks assigned to it and not finished.
    pub fn outstanding(&self) -> usize {
        self.held as usize
    }
}

/// The test of whether `worker` holds a task (see [`Job::held_by`]; the records are the
/// truth, a worker's [`Ledger`] says where to look). A ledger lists runs of one job at a
/// time, so the job is looked up once per run, not once per task.
fn holder(
    jobs: &BTreeMap<JobId, Job>,
    worker: WorkerId,
) -> impl FnMut(JobId, TaskIndex) -> bool + '_ {
    let mut last: Option<(JobId, Option<&Job>)> = None;
    move |job, index| {
        let j = match last {
            Some((id, j)) if id == job => j,
            _ => last.insert((job, jobs.get(&job))).1,
        };
        j.is_some_and(|j| j.held_by(index, worker))
    }
}

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
    #[error("worker {0} is not connected; `kestrel worker list` shows the workers")]
    NoSuchWorker(WorkerId),
    #[error("job {0} was canceled; `kestrel job retry {0} --all` runs its failed and canceled tasks again")]
    RetryCanceled(JobId),
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

/// How a resumed worker's task relates to the server's view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claim {
    /// The task is now assigned to the worker.
    Taken,
    /// Another worker has it too.
    Duplicate,
    /// The task already ended, or does not exist.
    Ended,
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
}

/// What [`Scheduler::worker_resumed`] did with a reconnected worker's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resumed {
    /// Running tasks taken back by the worker instead of being run again.
    pub taken: u32,
    /// Running tasks already assigned to another worker: both runs go on, the first success
    /// is kept.
    pub duplicates: u32,
    /// Results recorded.
    pub recorded: u32,
    /// The results recorded, for the driver's journal.
    pub recorded_ends: Vec<Finished>,
    /// Results and running tasks ignored (task already ended, unknown job or task).
    pub ignored: u32,
}

impl Scheduler {
    pub fn new(config: Config) -> Scheduler {
        Scheduler {
            config,
            next_job: 1,
            next_worker: 1,
            ..Default::default()
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    // ----- events ---------------------------------------------------------------------------

    /// A client submits a job. With `open`, more tasks may follow through [`Self::extend`].
    pub fn submit(
        &mut self,
        now_us: u64,
        spec: JobSpec,
        tasks: TaskSet,
        open: bool,
    ) -> Result<JobId, SchedError> {
        if open && matches!(&tasks, TaskSet::List(l) if l.is_empty()) {
            spec.validate_spec()?;
        } else {
            spec.validate(&tasks)?;
        }
        let id = self.next_job;
        self.next_job += 1;
        let job = Job::new(id, spec, tasks, now_us, open);
        let n = job.len();
        self.ready.push_new(
            job.spec.priority,
            Span {
                job: id,
                next: 0,
                end: n,
            },
        );
        self.jobs.insert(id, job);
        self.live_jobs.insert(id);
        Ok(id)
    }

    /// Appends tasks to an open list job; `close` says no more will come.
    ///
    /// `at` is the index the first of `argvs` takes in the job. A client that lost its connection
    /// sends the same pieces again; tasks the job already holds are skipped and a repeated close
    /// is accepted, so a retried submission never adds a task twice.
    pub fn extend(
        &mut self,
        now_us: u64,
        job: JobId,
        at: u32,
        mut argvs: Vec<Vec<String>>,
        close: bool,
    ) -> Result<(), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        let TaskSet::List(list) = &mut j.tasks else {
            return Err(SchedError::NotAList(job));
        };
        let len = list.len() as u32;
        if at > len {
            return Err(SchedError::ExtendGap { job, len, at });
        }
        let already = ((len - at) as usize).min(argvs.len());
        if !j.open {
            // A repeat of pieces the job took before it closed changes nothing.
            return if already == argvs.len() {
                Ok(())
            } else {
                Err(SchedError::JobClosed(job))
            };
        }
        argvs.drain(..already);
        let start = list.len() as u32;
        if let Some(i) = argvs.iter().position(|a| a.is_empty()) {
            return Err(SpecError::EmptyTask(start + i as u32).into());
        }
        list.extend(argvs);
        let end = list.len() as u32;
        j.table.extend_to(end);
        if j.canceled {
            j.counts.canceled += end - start;
        } else {
            j.counts.ready += end - start;
            self.ready.push_new(
                j.spec.priority,
                Span {
                    job,
                    next: start,
                    end,
                },
            );
        }
        if close {
            j.open = false;
            if j.is_empty() && !j.canceled {
                // A list job closed without tasks is a client mistake, but it must still end.
                j.canceled = true;
            }
        }
        self.check_job_done(now_us, job);
        Ok(())
    }

    /// A worker connects. Returns its id.
    pub fn worker_joined(&mut self, now_us: u64, offer: WorkerOffer) -> WorkerId {
        let id = self.next_worker;
        self.next_worker += 1;
        self.workers.insert(
            id,
            Worker {
                id,
                offer,
                joined_us: now_us,
                last_seen_us: now_us,
                used: Resources { cpus: 0, gpus: 0 },
                held: 0,
                ledger: Ledger::default(),
                known_jobs: FxHashSet::default(),
                tasks_finished: 0,
                tasks_failed: 0,
                quarantined: None,
                recent_failures: VecDeque::new(),
                last_success_us: None,
                duplicates: FxHashSet::default(),
            },
        );
        id
    }

    /// Any message from a worker shows it is alive.
    pub fn worker_seen(&mut self, now_us: u64, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.last_seen_us = w.last_seen_us.max(now_us);
        }
    }

    /// A worker is gone (disconnected or silent). Its tasks go back to the queue, ahead of new
    /// work, without spending their retries; each counts one crash, and a task that was on
    /// [`Config::max_crashes`] lost workers fails (it probably kills its worker).
    pub fn worker_lost(&mut self, now_us: u64, worker: WorkerId) {
        self.drop_worker(now_us, worker, true, &FxHashSet::default());
    }

    /// Removes a worker and re-queues its tasks, except those in `keep` (taken over by its
    /// reconnection); `crashed` says whether the re-queued tasks count a crash.
    fn drop_worker(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        crashed: bool,
        keep: &FxHashSet<(JobId, TaskIndex)>,
    ) {
        let Some(w) = self.workers.remove(&worker) else {
            return;
        };
        if let Some(reason) = w.quarantined {
            self.quarantined_gone.insert(worker, reason);
        }
        let tasks = {
            let mut holds = holder(&self.jobs, worker);
            w.ledger
                .held(|job, index| !keep.contains(&(job, index)) && holds(job, index))
        };
        let max_crashes = self.config.max_crashes.max(1);
        let mut counted = Vec::new();
        for (job, index) in tasks {
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            if j.canceled {
                j.set_state(index, TaskState::Canceled);
                self.check_job_done(now_us, job);
                continue;
            }
            let rec = j.set_state(index, TaskState::Ready);
            if crashed {
                rec.lost = rec.lost.saturating_add(1);
            }
            if rec.lost >= max_crashes {
                let failure = Failure {
                    exit_code: None,
                    signal: None,
                    reason: format!("lost with {} workers (it may kill its worker)", rec.lost),
                    stderr_tail: String::new(),
                };
                self.give_up(now_us, job, index, failure);
                continue;
            }
            if crashed {
                counted.push((job, index));
            }
            self.ready.push_requeued(
                j.spec.priority,
                Span {
                    job,
                    next: index,
                    end: index + 1,
                },
            );
        }
        if !counted.is_empty() {
            self.records.push(Record::Lost { tasks: counted });
        }
    }

    /// A worker that lost its connection registered again (new id `worker`) and reports the
    /// tasks it still runs and the results it got while disconnected. `previous` is its id
    /// before, if it was registered with this scheduler (its connection may not have been
    /// noticed dead yet): that registration is dropped without counting crashes.
    ///
    /// - A result of a task not yet ended is recorded, once: a task that already ended ignores
    ///   it. A result of a task now assigned to another worker is recorded too if it is a
    ///   success (the other run is canceled); a failure there is ignored (the other run decides).
    /// - A running task that is ready again (re-queued after the loss) or was assigned to
    ///   `previous` is taken back by `worker` instead of being run again.
    /// - A running task already assigned to another worker keeps both runs; the first
    ///   success to arrive is kept, the other report is ignored.
    pub fn worker_resumed(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        previous: Option<WorkerId>,
        running: Vec<(JobId, TaskIndex)>,
        finished: Vec<Finished>,
    ) -> Resumed {
        let mut out = Resumed::default();
        if !self.workers.contains_key(&worker) {
            out.ignored = (running.len() + finished.len()) as u32;
            return out;
        }
        let named = previous.filter(|p| *p != worker);
        let previous = named.filter(|p| self.workers.contains_key(p));
        if let Some(p) = previous {
            // Tasks it still runs or has results for move over; the rest go back to the queue.
            let keep: FxHashSet<_> = running
                .iter()
                .copied()
                .chain(finished.iter().map(|f| (f.job, f.index)))
                .collect();
            let moved = {
                let mut holds = holder(&self.jobs, p);
                self.workers[&p]
                    .ledger
                    .held(|job, index| keep.contains(&(job, index)) && holds(job, index))
            };
            self.drop_worker(now_us, p, false, &keep);
            for (job, index) in moved {
                // Reassign to the new id so its report matches; state stays as it was.
                let Some(j) = self.jobs.get_mut(&job) else {
                    continue;
                };
                let need = j.spec.resources;
                j.table.get_mut(index).worker = worker;
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.hold(job, index, need);
                }
            }
        }
        // A quarantine outlives the connection (the previous registration was dropped above
        // or when its loss was noticed).
        if let Some(reason) = named.and_then(|p| self.quarantined_gone.remove(&p)) {
            if let Some(w) = self.workers.get_mut(&worker) {
                w.quarantined = Some(reason.clone());
            }
            self.commands.push(Command::Quarantined { worker, reason });
        }
        let mut stale = Vec::new();
        for (job, index) in running {
            match self.claim(now_us, worker, job, index, true) {
                Claim::Taken => out.taken += 1,
                Claim::Duplicate => out.duplicates += 1,
                Claim::Ended => {
                    // Its result is no longer wanted: stop the run and free the slot.
                    out.ignored += 1;
                    stale.push((job, index));
                }
            }
        }
        if !stale.is_empty() {
            self.commands.push(Command::Cancel {
                worker,
                tasks: stale,
            });
        }
        for f in finished {
            if self.claim(now_us, worker, f.job, f.index, false) == Claim::Ended {
                out.ignored += 1;
                continue;
            }
            let kept = f.clone();
            match self.task_finished(now_us, worker, f) {
                Accepted::Recorded => {
                    out.recorded += 1;
                    out.recorded_ends.push(kept);
                }
                Accepted::Ignored => out.ignored += 1,
            }
        }
        out
    }

    /// Makes a task a resumed worker runs (or ran) its own if it is ready again; notes it as a
    /// duplicate run if another worker has it.
    fn claim(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        running: bool,
    ) -> Claim {
        let Some(j) = self.jobs.get_mut(&job) else {
            return Claim::Ended;
        };
        if index >= j.len() {
            return Claim::Ended;
        }
        let rec = j.table.get(index);
        let shown = j.record(index).state;
        if shown.is_terminal() {
            return Claim::Ended;
        }
        if rec.state != TaskState::Ready {
            if rec.worker == worker {
                // Moved over from its previous registration.
                if running && rec.state == TaskState::Assigned {
                    j.set_state(index, TaskState::Running);
                }
                return Claim::Taken;
            }
            let Some(w) = self.workers.get_mut(&worker) else {
                return Claim::Ended;
            };
            w.duplicates.insert((job, index));
            return Claim::Duplicate;
        }
        // Ready: re-queued after the loss. Its queue entry is skipped when reached.
        if let Some(due) = self.delayed_at.remove(&(job, index)) {
            self.delayed.remove(&(due, job, index));
        }
        let Some(w) = self.workers.get_mut(&worker) else {
            return Claim::Ended;
        };
        let need = j.spec.resources;
        let rec = j.set_state(index, TaskState::Running);
        rec.worker = worker;
        rec.assigned_us = now_us;
        rec.started_us = now_us;
        w.hold(job, index, need);
        Claim::Taken
    }

    /// A worker reports that a task's process started.
    pub fn task_started(
        &mut self,
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        at_us: u64,
    ) -> Accepted {
        let Some(j) = self.jobs.get_mut(&job) else {
            return Accepted::Ignored;
        };
        if index >= j.len() {
            return Accepted::Ignored;
        }
        let rec = j.table.get(index);
        if rec.worker != worker || rec.state != TaskState::Assigned {
            return Accepted::Ignored;
        }
        j.set_state(index, TaskState::Running).started_us = at_us;
        Accepted::Recorded
    }

    /// A worker reports that a task's run ended. Reports that do not match the task's current
    /// assignment (late, duplicate, or from a worker it was taken from) are ignored, so each
    /// completion is recorded once. The exception is a success of a duplicate run noted by
    /// [`Self::worker_resumed`]: the first success wins and the other run is canceled.
    pub fn task_finished(&mut self, now_us: u64, worker: WorkerId, f: Finished) -> Accepted {
        let key = (f.job, f.index);
        let Some(j) = self.jobs.get_mut(&f.job) else {
            return Accepted::Ignored;
        };
        if f.index >= j.len() {
            return Accepted::Ignored;
        }
        let rec = j.table.get(f.index);
        let active = matches!(rec.state, TaskState::Assigned | TaskState::Running);
        let ours = rec.worker == worker && active;
        let need = j.spec.resources;
        let Some(w) = self.workers.get_mut(&worker) else {
            return Accepted::Ignored;
        };
        // The worker whose ledger a release made due for pruning.
        let mut prune = None;
        if ours {
            prune = w.release(need).then_some(worker);
        } else {
            let dup = w.duplicates.remove(&key);
            if !(dup && active && f.end == RunEnd::Success) {
                return Accepted::Ignored;
            }
            // The duplicate run finished first: take the task from the other worker.
            let other = rec.worker;
            if let Some(o) = self.workers.get_mut(&other) {
                prune = o.release(need).then_some(other);
                self.commands.push(Command::Cancel {
                    worker: other,
                    tasks: vec![key],
                });
            }
            j.table.get_mut(f.index).worker = worker;
        }
        let Some(w) = self.workers.get_mut(&worker) else {
            return Accepted::Ignored;
        };
        let retries = j.spec.retries;
        let priority = j.spec.priority;
        let canceled = j.canceled;
        let mut failed = false;
        match f.end {
            RunEnd::Success => {
                w.tasks_finished += 1;
                w.last_success_us = Some(now_us);
                let rec = j.set_state(f.index, TaskState::Finished);
                rec.started_us = f.started_us;
                rec.finished_us = f.finished_us;
            }
            RunEnd::Canceled => {
                let rec = j.set_state(f.index, TaskState::Canceled);
                rec.finished_us = f.finished_us;
            }
            RunEnd::Failed(failure) => {
                w.tasks_failed += 1;
                failed = true;
                let rec = j.set_state(f.index, TaskState::Failed);
                rec.started_us = f.started_us;
                rec.finished_us = f.finished_us;
                rec.failures = rec.failures.saturating_add(1);
                let failures = rec.failures;
                let again = !canceled && (failures as u32) <= retries;
                j.failures.insert(f.index, *failure);
                if again {
                    j.set_state(f.index, TaskState::Ready);
                    let delay = self.backoff_us(failures);
                    if delay == 0 {
                        let span = Span {
                            job: f.job,
                            next: f.index,
                            end: f.index + 1,
                        };
                        self.ready.push_requeued(priority, span);
                    } else {
                        let due = now_us + delay;
                        self.delayed.insert((due, f.job, f.index));
                        self.delayed_at.insert(key, due);
                    }
                }
            }
        }
        if failed {
            self.note_failure(now_us, worker);
        }
        if let Some(id) = prune {
            self.prune_ledger(id);
        }
        self.check_job_done(now_us, f.job);
        Accepted::Recorded
    }

    /// Drops ended tasks from a worker's ledger (when a release says it lists far more than
    /// the worker holds).
    fn prune_ledger(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.ledger.prune(holder(&self.jobs, worker));
        }
    }

    /// A task the driver could not hand to its worker at all (its command line alone is bigger
    /// than a message can carry): it can never run, so it fails for good with `failure`,
    /// spending no retries and counting against no worker. Journaled as a give-up.
    pub fn task_undeliverable(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        failure: Failure,
    ) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if !j.held_by(index, worker) {
            return;
        }
        let need = j.spec.resources;
        if let Some(w) = self.workers.get_mut(&worker) {
            if w.release(need) {
                w.ledger.prune(holder(&self.jobs, worker));
            }
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.canceled {
            j.set_state(index, TaskState::Canceled).finished_us = now_us;
            self.check_job_done(now_us, job);
        } else {
            self.give_up(now_us, job, index, failure);
        }
    }

    /// Fails a task for good, whatever its retries, for a reason the scheduler saw itself (no
    /// worker reported it): recorded so the driver journals it.
    fn give_up(&mut self, now_us: u64, job: JobId, index: TaskIndex, failure: Failure) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.set_state(index, TaskState::Failed).finished_us = now_us;
        j.failures.insert(index, failure);
        self.records.push(Record::GaveUp { job, index });
        self.check_job_done(now_us, job);
    }

    /// The wait before the retry after a task's `failures`-th failure.
    fn backoff_us(&self, failures: u8) -> u64 {
        let base = self.config.retry_backoff_us;
        let shift = u32::from(failures.saturating_sub(1)).min(40);
        base.saturating_mul(1u64 << shift)
            .min(self.config.retry_backoff_max_us)
    }

    /// Counts a task failure on a worker and quarantines it when its tasks fail too often
    /// while some other worker has succeeded in the same window (so the tasks are not simply
    /// broken everywhere).
    fn note_failure(&mut self, now_us: u64, worker: WorkerId) {
        let k = self.config.quarantine_failures;
        if k == 0 {
            return;
        }
        let window = self.config.quarantine_window_us;
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        w.recent_failures.push_back(now_us);
        while w
            .recent_failures
            .front()
            .is_some_and(|t| now_us.saturating_sub(*t) > window)
        {
            w.recent_failures.pop_front();
        }
        if w.quarantined.is_some() || (w.recent_failures.len() as u32) < k {
            return;
        }
        let since = w.recent_failures.front().copied().unwrap_or(now_us);
        let others_succeed = self
            .workers
            .values()
            .any(|o| o.id != worker && o.last_success_us.is_some_and(|t| t >= since));
        if !others_succeed {
            return;
        }
        let reason = format!(
            "{} task failures within {} s while other workers succeeded",
            k,
            window / 1_000_000
        );
        if let Some(w) = self.workers.get_mut(&worker) {
            w.quarantined = Some(reason.clone());
            w.recent_failures.clear();
        }
        self.commands.push(Command::Quarantined { worker, reason });
    }

    /// Lifts a worker's quarantine: it gets tasks again. A quarantined worker that has left
    /// can be lifted too, so it is not quarantined when it comes back.
    pub fn resume_worker(&mut self, worker: WorkerId) -> Result<bool, SchedError> {
        if self.quarantined_gone.remove(&worker).is_some() {
            return Ok(true);
        }
        let w = self
            .workers
            .get_mut(&worker)
            .ok_or(SchedError::NoSuchWorker(worker))?;
        w.recent_failures.clear();
        Ok(w.quarantined.take().is_some())
    }

    /// Puts a job's failed tasks (and with `failed_only` false, its canceled ones) back in the
    /// queue with fresh retry and crash counts; the job is live again. Returns how many failed
    /// and how many canceled tasks were resubmitted.
    pub fn retry_job(&mut self, job: JobId, failed_only: bool) -> Result<(u32, u32), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        if j.canceled && failed_only {
            return Err(SchedError::RetryCanceled(job));
        }
        let mut spans: Vec<Span> = Vec::new();
        let (mut failed, mut canceled) = (0u32, 0u32);
        for index in 0..j.len() {
            let raw = j.table.get(index).state;
            let shown = j.record(index).state;
            let take = match shown {
                TaskState::Failed => true,
                TaskState::Canceled => !failed_only,
                _ => false,
            };
            if !take {
                continue;
            }
            if shown == TaskState::Failed {
                failed += 1;
            } else {
                canceled += 1;
            }
            if raw == shown {
                let rec = j.set_state(index, TaskState::Ready);
                rec.failures = 0;
                rec.lost = 0;
                j.failures.remove(&index);
            } else {
                // Untouched or re-queued task of a canceled job: counted canceled, stored ready.
                j.counts.moved(TaskState::Canceled, TaskState::Ready);
                if let Some(due) = self.delayed_at.remove(&(job, index)) {
                    self.delayed.remove(&(due, job, index));
                }
            }
            match spans.last_mut() {
                Some(s) if s.end == index => s.end += 1,
                _ => spans.push(Span {
                    job,
                    next: index,
                    end: index + 1,
                }),
            }
        }
        if failed + canceled == 0 {
            return Ok((0, 0));
        }
        j.canceled = false;
        j.finished_us = None;
        let priority = j.spec.priority;
        for span in spans {
            self.ready.push_requeued(priority, span);
        }
        self.live_jobs.insert(job);
        Ok((failed, canceled))
    }

    /// Moves failed tasks whose retry backoff has passed to the queue.
    pub fn release_due(&mut self, now_us: u64) {
        while let Some(&(due, job, index)) = self.delayed.first() {
            if due > now_us {
                break;
            }
            self.delayed.pop_first();
            self.delayed_at.remove(&(job, index));
            let Some(j) = self.jobs.get(&job) else {
                continue;
            };
            if j.canceled || j.table.get(index).state != TaskState::Ready {
                continue;
            }
            self.ready.push_requeued(
                j.spec.priority,
                Span {
                    job,
                    next: index,
                    end: index + 1,
                },
            );
        }
    }

    /// When the driver should call [`Self::tick`] or [`Self::schedule`] next for time-driven
    /// work (a retry backoff ending), if any; heartbeat checks are on top of this.
    pub fn next_wakeup(&self) -> Option<u64> {
        self.delayed.first().map(|(due, _, _)| *due)
    }

    /// Cancels every task of a job that has not ended: queued tasks at once, running ones by
    /// asking their workers. Returns how many tasks were still queued and how many running.
    pub fn cancel_job(&mut self, now_us: u64, job: JobId) -> Result<(u32, u32), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        if j.canceled || j.is_done() {
            return Ok((0, 0));
        }
        j.canceled = true;
        j.open = false;
        let queued = j.counts.ready;
        j.counts.canceled += queued;
        j.counts.ready = 0;
        self.ready.retain(|s| s.job != job);
        let delayed_at = &mut self.delayed_at;
        self.delayed.retain(|(_, jb, index)| {
            let keep = *jb != job;
            if !keep {
                delayed_at.remove(&(job, *index));
            }
            keep
        });
        let mut running = 0;
        let jobs = &self.jobs;
        for w in self.workers.values() {
            let mut holds = holder(jobs, w.id);
            let tasks = w.ledger.held(|jb, index| jb == job && holds(jb, index));
            if !tasks.is_empty() {
                running += tasks.len() as u32;
                self.commands.push(Command::Cancel {
                    worker: w.id,
                    tasks,
                });
            }
        }
        // Tasks requeued for retry were counted as ready: their records say Ready.
        self.check_job_done(now_us, job);
        Ok((queued, running))
    }

    /// Time passes: workers silent past the heartbeat timeout are lost, and failed tasks whose
    /// retry backoff has passed are queued.
    pub fn tick(&mut self, now_us: u64) {
        self.release_due(now_us);
        let timeout = self.config.heartbeat_timeout_us;
        let silent: Vec<WorkerId> = self
            .workers
            .values()
            .filter(|w| now_us.saturating_sub(w.last_seen_us) > timeout)
            .map(|w| w.id)
            .collect();
        for id in silent {
            self.commands.push(Command::Disconnect {
                worker: id,
                reason: format!(
                    "no message for {} s (heartbeat timeout)",
                    timeout / 1_000_000
                ),
            });
            self.worker_lost(now_us, id);
        }
    }

    /// Hands ready tasks to workers with free credit. Call after a batch of events.
    pub fn schedule(&mut self, now_us: u64) {
        self.release_due(now_us);
        if self.ready.is_empty() || self.workers.is_empty() {
            return;
        }
        let ids: Vec<WorkerId> = self
            .workers
            .range(self.rotate..)
            .chain(self.workers.range(..self.rotate))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if self.ready.is_empty() {
                break;
            }
            self.fill_worker(now_us, id);
        }
        self.rotate = self.rotate.wrapping_add(1);
    }

    fn fill_worker(&mut self, now_us: u64, id: WorkerId) {
        let Some(w) = self.workers.get_mut(&id) else {
            return;
        };
        if w.quarantined.is_some() {
            return;
        }
        let jobs = &mut self.jobs;
        let mut runs: Vec<IndexRun> = Vec::new();
        let mut defines: Vec<JobId> = Vec::new();
        self.ready.take_front(self.config.max_queue_skips, |span| {
            let Some(j) = jobs.get_mut(&span.job) else {
                return Some(0);
            };
            let need = j.spec.resources;
            if !w.can_ever_run(need) {
                return Some(0);
            }
            let room = w.room_for(need);
            if room == 0 {
                // Out of credit for this shape; smaller tasks further down may still fit.
                return if w.room_for(Resources { cpus: 1, gpus: 0 }) == 0 {
                    None
                } else {
                    Some(0)
                };
            }
            let n = room.min(span.len());
            let mut given = 0;
            for index in span.next..span.next + n {
                // A resumed worker may have taken the task back while its entry was queued.
                if j.table.get(index).state != TaskState::Ready {
                    continue;
                }
                let rec = j.set_state(index, TaskState::Assigned);
                rec.assigned_us = now_us;
                rec.worker = id;
                given += 1;
                match runs.last_mut() {
                    Some(r) if r.job == span.job && r.first + r.count == index => r.count += 1,
                    _ => runs.push(IndexRun {
                        job: span.job,
                        first: index,
                        count: 1,
                    }),
                }
            }
            w.held += given;
            w.used.cpus += need.cpus * given;
            w.used.gpus += need.gpus * given;
            if given > 0 && w.known_jobs.insert(span.job) {
                defines.push(span.job);
            }
            Some(n)
        });
        for r in &runs {
            w.ledger.push_run(*r);
        }
        for job in defines {
            self.commands.push(Command::DefineJob { worker: id, job });
        }
        if !runs.is_empty() {
            self.commands.push(Command::Assign { worker: id, runs });
        }
    }

    fn check_job_done(&mut self, now_us: u64, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.finished_us.is_none() && j.is_done() {
            j.finished_us = Some(now_us);
            self.live_jobs.remove(&job);
            for w in self.workers.values_mut() {
                w.known_jobs.remove(&job);
            }
            self.commands.push(Command::JobDone { job });
        }
    }

    /// Removes a job that has ended, with its task records, so a long-lived server does not
    /// keep every job it ever ran. Its id is not given out again. A job with tasks still queued
    /// or running is refused.
    pub fn forget_job(&mut self, job: JobId) -> Result<(), SchedError> {
        let j = self.jobs.get(&job).ok_or(SchedError::NoSuchJob(job))?;
        if !j.is_done() {
            let left = j.len() - j.counts.done();
            return Err(SchedError::NotEnded { job, left });
        }
        self.jobs.remove(&job);
        self.live_jobs.remove(&job);
        // An ended job rarely has queue entries left (a task a resumed worker took back keeps
        // its entry until it is reached); without its job they would never be reached.
        if !self.ready.is_empty() {
            self.ready.retain(|s| s.job != job);
        }
        Ok(())
    }

    // ----- output ---------------------------------------------------------------------------

    /// Commands produced since the last call, in the order they must be carried out.
    pub fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.commands)
    }

    /// State changes to journal, in the order they happened; take them after every event.
    pub fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.records)
    }

    /// Whether commands are waiting (lets a driver skip an empty drain).
    pub fn has_commands(&self) -> bool {
        !self.commands.is_empty()
    }

    // ----- queries --------------------------------------------------------------------------

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

/// Replay of a journal after a crash (a child module so it can reach the private state).
#[path = "restore.rs"]
pub mod restore;
