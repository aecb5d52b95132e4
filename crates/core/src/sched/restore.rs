//! Rebuilding a scheduler from a journal after a crash.
//!
//! The server journals the accepted inputs of the scheduler (submissions, extensions, cancels
//! and task reports). Replaying them here gives back the jobs with their ids and every recorded
//! task end; tasks that were assigned or running when the server died are simply ready again
//! (at-least-once). Replay happens before any worker joins, so no assignment exists: reports are
//! applied without a worker, and the ready queue is rebuilt once at the end
//! ([`Scheduler::restore_done`]) instead of being edited per task.

use super::{Job, Scheduler};
use crate::outcome::{Failure, Finished, RunEnd};
use crate::queue::{ReadyQueue, Span};
use crate::spec::{JobId, JobSpec, TaskIndex, TaskSet, TaskState, WorkerId};

/// Why a journal entry could not be replayed (the journal does not match this scheduler).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RestoreError {
    /// The journal submits one job id twice.
    #[error("job {0} appears twice in the journal")]
    DuplicateJob(JobId),
    /// A job's resources were refused.
    #[error("job {job}: {err}")]
    Resources {
        /// The job.
        job: JobId,
        /// Why its resources were refused.
        err: super::SchedError,
    },
}

impl Scheduler {
    /// Recreates a job exactly as it was submitted, with its original id and submission time.
    /// Later ids continue after the highest restored one.
    pub fn restore_submit(
        &mut self,
        job: JobId,
        submitted_us: u64,
        spec: JobSpec,
        tasks: TaskSet,
        open: bool,
    ) -> Result<(), RestoreError> {
        if self.jobs.contains_key(&job) {
            return Err(RestoreError::DuplicateJob(job));
        }
        let need = self
            .need_of(&spec)
            .map_err(|err| RestoreError::Resources { job, err })?;
        self.next_job = self.next_job.max(job.saturating_add(1));
        self.jobs
            .insert(job, Job::new(job, spec, need, tasks, submitted_us, open));
        self.live_jobs.insert(job);
        self.admit_files(job);
        self.note_nodes(job);
        // Accepted once, so it links again as it did; a journal that no longer does (a job it
        // depended on was forgotten since) leaves the job outside the graph, not unrestored.
        let _ = self.link_or_hold(job);
        Ok(())
    }

    /// [`Self::restore_task_end_by`] for an end whose worker the journal does not name (one
    /// written before it did): the task's worker reads as 0, unknown.
    pub fn restore_task_end(&mut self, f: Finished, assigned_us: u64) {
        self.restore_task_end_by(f, assigned_us, 0);
    }

    /// Job ids below `next` were given out before a restart (to jobs forgotten since, or whose
    /// submission never reached the journal): new jobs get ids from `next` on.
    pub fn reserve_job_ids(&mut self, next: JobId) {
        self.next_job = self.next_job.max(next);
    }

    /// Ids below `next` were given out before a restart: new workers get ids from `next` on,
    /// and a worker that comes back names its own ([`super::Event::WorkerRejoined`]).
    pub fn reserve_worker_ids(&mut self, next: WorkerId) {
        self.next_worker = self.next_worker.max(next);
    }

    /// Applies a recorded task end without a live worker: success finishes the task; a failure
    /// counts one and leaves the task ready again if retries remain, else failed; a cancel
    /// report cancels it. `assigned_us` restores the timing of the run, `worker` the worker
    /// that ran it (`task info` names it after a restart; its id is not given to another).
    /// Reports for unknown jobs or tasks already ended are ignored (so replaying is
    /// idempotent per task end).
    pub fn restore_task_end_by(&mut self, f: Finished, assigned_us: u64, worker: WorkerId) {
        self.reserve_worker_ids(worker.saturating_add(1));
        let Some(j) = self.jobs.get_mut(&f.job) else {
            return;
        };
        if f.index >= j.len() {
            return;
        }
        let rec = j.table.get(f.index);
        if rec.state.is_terminal() {
            return;
        }
        if worker != 0 {
            let runs = self.restored_runs.entry(worker).or_default();
            match f.end {
                RunEnd::Success => runs.0 += 1,
                RunEnd::Failed(_) => runs.1 += 1,
                RunEnd::Canceled => {}
            }
        }
        let canceled = j.canceled;
        let retries = j.spec.retries;
        let to = match &f.end {
            RunEnd::Success => TaskState::Finished,
            RunEnd::Canceled => TaskState::Canceled,
            RunEnd::Failed(failure) => {
                // As when it was taken: a permanent failure is not retried.
                let again = !canceled && !failure.permanent && u32::from(rec.failures) < retries;
                if again {
                    TaskState::Ready
                } else {
                    TaskState::Failed
                }
            }
        };
        // As counted: a ready task of a canceled job counts as canceled.
        let counted_as = j.record(f.index).state;
        j.counts.moved(counted_as, to);
        let r = j.table.get_mut(f.index);
        r.state = to;
        r.assigned_us = assigned_us;
        r.started_us = f.started_us;
        r.finished_us = f.finished_us;
        r.worker = worker;
        if f.end != RunEnd::Canceled {
            r.runs = r.runs.saturating_add(1);
        }
        let mut rescued = false;
        if let RunEnd::Failed(failure) = f.end {
            r.failures = r.failures.saturating_add(1);
            let lost_input = failure.permanent && to == TaskState::Failed;
            j.failures.insert(f.index, *failure.clone());
            // As when it was taken: an input lost with its workers is made again. No worker
            // holds anything during a replay, so a run that failed for want of a copy that
            // existed elsewhere (rare) is rescued here where it was not then.
            rescued = lost_input && self.rescue_reader((f.job, f.index), &failure.reason);
        }
        match to {
            _ if rescued => {}
            TaskState::Finished => self.graph_task_finished(f.job, f.index),
            TaskState::Failed | TaskState::Canceled => {
                self.graph_task_lost(f.finished_us, f.job, f.index)
            }
            _ => {}
        }
        self.check_job_done(f.finished_us, f.job);
    }

    /// Fails a task for good with `failure`, whatever its retries (a task given up after too
    /// many lost workers). Ignored for unknown or already ended tasks.
    pub fn restore_give_up(&mut self, job: JobId, index: TaskIndex, at_us: u64, failure: Failure) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if index >= j.len() || j.table.get(index).state.is_terminal() {
            return;
        }
        let counted_as = j.record(index).state;
        j.counts.moved(counted_as, TaskState::Failed);
        let r = j.table.get_mut(index);
        r.state = TaskState::Failed;
        r.finished_us = at_us;
        j.failures.insert(index, failure);
        self.graph_task_lost(at_us, job, index);
        self.check_job_done(at_us, job);
    }

    /// Counts one more crash, and the run it ended, for each task (its worker was lost while
    /// it ran the task). Ignored for unknown or already ended tasks.
    pub fn restore_lost(&mut self, tasks: &[(JobId, TaskIndex)]) {
        for &(job, index) in tasks {
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            if index >= j.len() || j.table.get(index).state.is_terminal() {
                continue;
            }
            let r = j.table.get_mut(index);
            r.lost = r.lost.saturating_add(1);
            r.runs = r.runs.saturating_add(1);
        }
    }

    /// Ends a replay: rebuilds the ready queue from the task records (tasks that ran before go
    /// ahead of new work, as after any re-queue) and drops the commands replay produced.
    pub fn restore_done(&mut self) {
        self.ready = ReadyQueue::default();
        for j in self.jobs.values() {
            if j.canceled || j.counts.ready == 0 {
                continue;
            }
            let mut fresh = Vec::new();
            let mut again = Vec::new();
            let mut i: TaskIndex = 0;
            while i < j.len() {
                let r = j.table.get(i);
                if r.state != TaskState::Ready {
                    i += 1;
                    continue;
                }
                let ran = r.failures > 0 || r.lost > 0;
                let start = i;
                while i < j.len() {
                    let n = j.table.get(i);
                    if n.state != TaskState::Ready || (n.failures > 0 || n.lost > 0) != ran {
                        break;
                    }
                    i += 1;
                }
                let span = Span {
                    job: j.id,
                    next: start,
                    end: i,
                };
                if ran {
                    again.push(span);
                } else {
                    fresh.push(span);
                }
            }
            for s in again {
                self.ready.push_requeued(j.spec.priority, s);
            }
            for s in fresh {
                self.ready.push_new(j.spec.priority, s);
            }
        }
        self.commands.clear();
        self.records.clear();
    }
}
