//! The scheduler: jobs, workers, the ready queue and every task transition.
//!
//! A driver (the server, the simulator, a test) calls the event methods with the current time,
//! then [`Scheduler::schedule`], then drains [`Scheduler::take_commands`] and carries them out.
//! Nothing here blocks, allocates per queued task, or reads a clock.

use crate::outcome::{Command, Failure, Finished, IndexRun, RunEnd};
use crate::queue::{ReadyQueue, Span};
use crate::spec::{JobId, JobSpec, Resources, SpecError, TaskIndex, TaskSet, TaskState, WorkerId};
use crate::table::{TaskRecord, TaskTable};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;

/// Tunables of the scheduler.
#[derive(Clone, Debug)]
pub struct Config {
    /// A worker silent for longer than this is lost.
    pub heartbeat_timeout_us: u64,
    /// How many queue entries that fit no worker one assignment pass may look past.
    pub max_queue_skips: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_timeout_us: 30_000_000,
            max_queue_skips: 64,
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
    /// Tasks assigned to it and not yet finished.
    outstanding: FxHashSet<(JobId, TaskIndex)>,
    /// Jobs whose template it has been sent.
    known_jobs: FxHashSet<JobId>,
    pub tasks_finished: u64,
    pub tasks_failed: u64,
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
        self.outstanding.len()
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
    #[error(transparent)]
    Spec(#[from] SpecError),
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
    next_job: JobId,
    next_worker: WorkerId,
    /// Jobs with tasks not yet terminal (for quick "is anything left" answers).
    live_jobs: FxHashSet<JobId>,
    /// Worker to start the next assignment pass from, so no worker is always served last.
    rotate: WorkerId,
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
        if !(open && matches!(&tasks, TaskSet::List(l) if l.is_empty())) {
            spec.validate(&tasks)?;
        } else if spec.resources.cpus == 0 {
            return Err(SpecError::NoCpus.into());
        }
        let id = self.next_job;
        self.next_job += 1;
        let n = tasks.len();
        let job = Job {
            id,
            table: TaskTable::new(n),
            counts: Counts {
                ready: n,
                ..Default::default()
            },
            spec,
            tasks,
            submitted_us: now_us,
            finished_us: None,
            open,
            canceled: false,
            failures: FxHashMap::default(),
        };
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
    pub fn extend(
        &mut self,
        now_us: u64,
        job: JobId,
        argvs: Vec<Vec<String>>,
        close: bool,
    ) -> Result<(), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        if !j.open {
            return Err(SchedError::JobClosed(job));
        }
        let TaskSet::List(list) = &mut j.tasks else {
            return Err(SchedError::NotAList(job));
        };
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
                outstanding: FxHashSet::default(),
                known_jobs: FxHashSet::default(),
                tasks_finished: 0,
                tasks_failed: 0,
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
    /// work, without spending their retries.
    pub fn worker_lost(&mut self, now_us: u64, worker: WorkerId) {
        let Some(w) = self.workers.remove(&worker) else {
            return;
        };
        let mut tasks: Vec<_> = w.outstanding.into_iter().collect();
        tasks.sort_unstable();
        for (job, index) in tasks {
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            let rec = j.table.get(index);
            if rec.state.is_terminal() {
                continue;
            }
            if j.canceled {
                j.set_state(index, TaskState::Canceled);
                self.check_job_done(now_us, job);
                continue;
            }
            let rec = j.set_state(index, TaskState::Ready);
            rec.lost = rec.lost.saturating_add(1);
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
    /// completion is recorded once.
    pub fn task_finished(&mut self, now_us: u64, worker: WorkerId, f: Finished) -> Accepted {
        let Some(j) = self.jobs.get_mut(&f.job) else {
            return Accepted::Ignored;
        };
        if f.index >= j.len() {
            return Accepted::Ignored;
        }
        let rec = j.table.get(f.index);
        let ours =
            rec.worker == worker && matches!(rec.state, TaskState::Assigned | TaskState::Running);
        let Some(w) = self.workers.get_mut(&worker) else {
            return Accepted::Ignored;
        };
        if !ours || !w.outstanding.remove(&(f.job, f.index)) {
            return Accepted::Ignored;
        }
        let need = j.spec.resources;
        w.used.cpus -= need.cpus;
        w.used.gpus -= need.gpus;
        let retries = j.spec.retries;
        let priority = j.spec.priority;
        let canceled = j.canceled;
        match f.end {
            RunEnd::Success => {
                w.tasks_finished += 1;
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
                let rec = j.set_state(f.index, TaskState::Failed);
                rec.started_us = f.started_us;
                rec.finished_us = f.finished_us;
                rec.failures = rec.failures.saturating_add(1);
                let again = !canceled && (rec.failures as u32) <= retries;
                j.failures.insert(f.index, failure);
                if again {
                    j.set_state(f.index, TaskState::Ready);
                    let span = Span {
                        job: f.job,
                        next: f.index,
                        end: f.index + 1,
                    };
                    self.ready.push_requeued(priority, span);
                }
            }
        }
        self.check_job_done(now_us, f.job);
        Accepted::Recorded
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
        let mut running = 0;
        for w in self.workers.values() {
            let tasks: Vec<_> = w
                .outstanding
                .iter()
                .filter(|(jb, _)| *jb == job)
                .copied()
                .collect();
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

    /// Time passes: workers silent past the heartbeat timeout are lost.
    pub fn tick(&mut self, now_us: u64) {
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
            for index in span.next..span.next + n {
                let rec = j.set_state(index, TaskState::Assigned);
                rec.assigned_us = now_us;
                rec.worker = id;
                w.outstanding.insert((span.job, index));
            }
            w.used.cpus += need.cpus * n;
            w.used.gpus += need.gpus * n;
            if w.known_jobs.insert(span.job) {
                defines.push(span.job);
            }
            match runs.last_mut() {
                Some(r) if r.job == span.job && r.first + r.count == span.next => r.count += n,
                _ => runs.push(IndexRun {
                    job: span.job,
                    first: span.next,
                    count: n,
                }),
            }
            Some(n)
        });
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

    // ----- output ---------------------------------------------------------------------------

    /// Commands produced since the last call, in the order they must be carried out.
    pub fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.commands)
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

    /// Tasks waiting for a worker.
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
