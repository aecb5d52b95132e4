//! Failure policy: retry backoff, giving up, quarantine of faulty workers and its lifting.

use super::{SchedError, Scheduler};
use crate::outcome::{Command, Failure, Record};
use crate::quarantine::{self, JobTally};
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
        self.config.backoff_us(failures)
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

    /// When the driver should hand [`super::Event::Tick`] or [`super::Event::Schedule`] next
    /// for time-driven work (a retry backoff ending, a retry that kept away from the worker it
    /// failed on ceasing to), if any; heartbeat checks are on top of this.
    pub fn next_wakeup(&self) -> Option<u64> {
        let due = self.delayed.first().map(|(due, _, _)| *due);
        match (due, self.kept_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// After a task of `job` failed on `worker`, whose runs of the job are tallied as `mine`:
    /// quarantines the worker if it is faulty (see [`crate::quarantine`]), unless no other
    /// worker able to run the job would be left.
    pub(super) fn judge_worker(&mut self, worker: WorkerId, job: JobId, mine: JobTally) {
        let k = self.config.quarantine_failures;
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let others = j.outcomes.counts().without(mine.first);
        let Some(evidence) = quarantine::judge(&mine, others, k) else {
            // Failing most of its tasks, it waits for the others' evidence; or it no longer.
            let suspect = &mut self.jobs.get_mut(&job).expect("looked up").outcomes.suspect;
            if quarantine::suspicious(mine.first, k) {
                *suspect = Some(worker);
            } else if *suspect == Some(worker) {
                *suspect = None;
            }
            return;
        };
        let need = j.need;
        let mut others_can_run = false;
        let mut already = false;
        for o in self.workers.values() {
            already |= o.id == worker && o.quarantined.is_some();
            others_can_run |= o.id != worker && o.quarantined.is_none() && o.can_ever_run(need);
        }
        if already || others_can_run {
            // Judged: nothing more to wait for.
            if let Some(j) = self.jobs.get_mut(&job) {
                j.outcomes.suspect = j.outcomes.suspect.filter(|&s| s != worker);
            }
        }
        if already || !others_can_run {
            return;
        }
        let reason = evidence.reason(job);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.quarantined = Some(reason.clone());
            // A pass counts a quarantined worker's cpus out of the busy share.
            self.open.insert(worker);
        }
        self.commands.push(Command::Quarantined { worker, reason });
    }

    /// Judges a suspect of `job` again (after a success on another worker).
    pub(super) fn judge_again(&mut self, suspect: WorkerId, job: JobId) {
        let tally = self.workers.get(&suspect).and_then(|w| w.tally.of(job));
        match tally {
            Some(mine) => self.judge_worker(suspect, job, mine),
            // Gone, or its counts faded away: nothing to hold against it.
            None => {
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.outcomes.suspect = None;
                }
            }
        }
    }

    /// A task of `job` that failed on worker `on` at `failed_at_us` ran again on another
    /// worker and ended `ok` or not: evidence about `on` (see [`crate::quarantine`]), which
    /// is judged again after a success.
    pub(super) fn seen_elsewhere(&mut self, on: WorkerId, job: JobId, failed_at_us: u64, ok: bool) {
        if self.config.quarantine_failures == 0 {
            return;
        }
        let Some(w) = self.workers.get_mut(&on) else {
            return;
        };
        let tally = w.tally.elsewhere(job, failed_at_us, ok);
        if let Some(mine) = tally.filter(|_| ok) {
            self.judge_worker(on, job, mine);
        }
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
