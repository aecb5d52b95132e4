//! Failure policy: retry backoff, giving up, quarantine of faulty workers and its lifting.

use super::{SchedError, Scheduler};
use crate::outcome::{Command, Failure, Record};
use crate::quarantine::{self, Outcomes};
use crate::queue::Span;
use crate::spec::{JobId, TaskIndex, TaskState, WorkerId};

impl Scheduler {
    /// Fails a task for good, whatever its retries, for a reason the scheduler saw itself (no
    /// worker reported it): recorded so the driver journals it.
    pub(super) fn give_up(&mut self, now_us: u64, job: JobId, index: TaskIndex, failure: Failure) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.set_state(index, TaskState::Failed).finished_us = now_us;
        j.failures.insert(index, failure);
        self.records.push(Record::GaveUp { job, index });
        self.graph_task_lost(now_us, job, index);
        self.check_job_done(now_us, job);
    }

    /// The wait before the retry after a task's `failures`-th failure.
    pub(super) fn backoff_us(&self, failures: u8) -> u64 {
        let base = self.config.retry_backoff_us;
        let shift = u32::from(failures.saturating_sub(1)).min(40);
        base.saturating_mul(1u64 << shift)
            .min(self.config.retry_backoff_max_us)
    }

    /// Moves failed tasks whose retry backoff has passed to the queue.
    pub(crate) fn release_due(&mut self, now_us: u64) {
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
            self.ready
                .push_requeued(j.spec.priority, Span::one(job, index));
        }
    }

    /// When the driver should hand [`super::Event::Tick`] or [`super::Event::Schedule`] next for time-driven
    /// work (a retry backoff ending), if any; heartbeat checks are on top of this.
    pub fn next_wakeup(&self) -> Option<u64> {
        self.delayed.first().map(|(due, _, _)| *due)
    }

    /// After a task of `job` failed on `worker`, whose runs of the job ended as `mine` and on
    /// the other workers as `others`: quarantines the worker if it is faulty (see
    /// [`crate::quarantine`]), unless no other worker able to run the job would be left.
    pub(super) fn note_failure(
        &mut self,
        worker: WorkerId,
        job: JobId,
        mine: Outcomes,
        others: Outcomes,
    ) {
        let k = self.config.quarantine_failures;
        if !quarantine::faulty(mine, others, k) {
            return;
        }
        let Some(need) = self.jobs.get(&job).map(|j| j.need) else {
            return;
        };
        let mut others_can_run = false;
        for o in self.workers.values() {
            if o.id == worker && o.quarantined.is_some() {
                return;
            }
            others_can_run |= o.id != worker && o.quarantined.is_none() && o.can_ever_run(need);
        }
        if !others_can_run {
            return;
        }
        let reason = format!(
            "{} of its last {} tasks of job {job} failed, against {} of {} on the other workers",
            mine.failed,
            u64::from(mine.ok) + u64::from(mine.failed),
            others.failed,
            u64::from(others.ok) + u64::from(others.failed),
        );
        if let Some(w) = self.workers.get_mut(&worker) {
            w.quarantined = Some(reason.clone());
            // A pass counts a quarantined worker's cpus out of the busy share.
            self.open.insert(worker);
        }
        self.commands.push(Command::Quarantined { worker, reason });
    }

    /// Lifts a worker's quarantine: it gets tasks again. A quarantined worker that has left
    /// can be lifted too, so it is not quarantined when it comes back.
    pub(crate) fn resume_worker(&mut self, worker: WorkerId) -> Result<bool, SchedError> {
        if self.quarantined_gone.remove(&worker).is_some() {
            return Ok(true);
        }
        let w = self
            .workers
            .get_mut(&worker)
            .ok_or(SchedError::NoSuchWorker(worker))?;
        w.tally.clear();
        Ok(w.quarantined.take().is_some())
    }
}
