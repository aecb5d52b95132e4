//! Events on jobs: submission, extension, cancel, retry, the end of a job, forgetting it.

use super::worker::holder;
use super::{Job, SchedError, Scheduler};
use crate::outcome::{Command, Record};
use crate::queue::Span;
use crate::spec::{JobId, JobSpec, SpecError, TaskIndex, TaskSet, TaskState};

/// Whether a task shown in `state` is put back by a retry (of failed tasks only, or of
/// failed and canceled ones).
pub(in crate::sched) fn retried(state: TaskState, failed_only: bool) -> bool {
    match state {
        TaskState::Failed => true,
        TaskState::Canceled => !failed_only,
        _ => false,
    }
}

impl Scheduler {
    /// A client submits a job (see [`super::Event::Submit`]).
    pub(crate) fn submit(
        &mut self,
        now_us: u64,
        spec: JobSpec,
        tasks: TaskSet,
        open: bool,
        key: Option<String>,
    ) -> Result<JobId, SchedError> {
        if open && matches!(&tasks, TaskSet::Array(_)) {
            // Nothing can be added to an array: open, it would never end.
            return Err(SchedError::NotAList(self.next_job));
        }
        if open && spec.task_ids.is_some() {
            // Its ids must match its tasks one for one from the start.
            return Err(SpecError::TaskIds(
                "a job whose tasks have ids of their own must come in one piece (its command lines add up to more than 4 MiB): split it into smaller jobs".into(),
            )
            .into());
        }
        if open && matches!(&tasks, TaskSet::List(_) | TaskSet::Lines(_)) && tasks.is_empty() {
            spec.validate_spec()?;
        } else {
            spec.validate(&tasks)?;
        }
        let need = self.need_of(&spec)?;
        let id = self.next_job;
        let job = Job::new(id, spec, need, tasks, now_us, open);
        let priority = job.spec.priority;
        // In place first, so that its files are numbered as for any job; taken out again if
        // the graph refuses it, before anything else saw it.
        self.jobs.insert(id, job);
        self.admit_files(id);
        if let Err(e) = self.link_or_hold(id) {
            self.jobs.remove(&id);
            self.windowed_jobs.remove(&id);
            return Err(e);
        }
        self.next_job += 1;
        self.note_nodes(id);
        for span in self.ready_spans(id) {
            self.ready.push_new(priority, span);
        }
        self.live_jobs.insert(id);
        self.records.push(Record::Submitted { job: id, key });
        Ok(id)
    }

    /// Appends tasks to an open job (see [`super::Event::Extend`]).
    pub(crate) fn extend_with(
        &mut self,
        now_us: u64,
        job: JobId,
        at: u32,
        more: TaskSet,
        close: bool,
    ) -> Result<(), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        if let TaskSet::Array(_) = j.tasks {
            return Err(SchedError::NotAList(job));
        }
        if std::mem::discriminant(&j.tasks) != std::mem::discriminant(&more) {
            return Err(SchedError::ExtendKind {
                job,
                holds: j.tasks.kind(),
                given: more.kind(),
            });
        }
        let len = j.tasks.len();
        if at > len {
            return Err(SchedError::ExtendGap { job, len, at });
        }
        let already = ((len - at) as usize).min(more.len() as usize);
        if !j.open {
            // A repeat of pieces the job took before it closed changes nothing.
            return if already == more.len() as usize {
                Ok(())
            } else {
                Err(SchedError::JobClosed(job))
            };
        }
        let start = len;
        if let Some(i) = more.first_empty(already) {
            return Err(SpecError::EmptyTask(start + (i - already) as u32).into());
        }
        j.tasks.append(more, already);
        let end = j.tasks.len();
        j.table.extend_to(end);
        let numbered = j.inputs_per_task() > 0;
        if j.canceled {
            j.counts.canceled += end - start;
        } else if j.held {
            // Stored ready, counted waiting (see `Job::held`).
            j.counts.waiting += end - start;
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
        let release = close && j.held && !j.canceled;
        if numbered {
            self.number_inputs(job, start);
        }
        if release {
            if let Err(e) = self.release_held(job) {
                // Refused as a whole job would have been at submission: withdrawn, so
                // nothing of it runs and no id names half of it.
                self.cancel_job(now_us, job)?;
                self.forget_job(job)?;
                return Err(e);
            }
            let priority = self.jobs.get(&job).map_or(0, |j| j.spec.priority);
            for span in self.ready_spans(job) {
                self.ready.push_new(priority, span);
            }
        }
        if end > start || close {
            self.records.push(Record::Extended {
                job,
                from: start,
                close,
            });
        }
        self.check_job_done(now_us, job);
        Ok(())
    }

    /// Cancels every task of a job that has not ended: queued tasks at once, running ones by
    /// asking their workers. Returns how many tasks had not started (queued here, or waiting
    /// on a worker for a slot) and how many were running.
    pub(crate) fn cancel_job(&mut self, now_us: u64, job: JobId) -> Result<(u32, u32), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        if j.canceled || j.is_done() {
            return Ok((0, 0));
        }
        self.records.push(Record::Canceled { job });
        j.canceled = true;
        j.open = false;
        let queued = j.counts.ready + j.counts.waiting;
        j.counts.canceled += queued;
        j.counts.ready = 0;
        j.counts.waiting = 0;
        j.unmet.clear();
        let feeds = j.feeds;
        self.ready.retain(|s| s.job != job);
        if !self.window.is_empty() {
            self.window.retain(|jb, _| jb != job);
        }
        let delayed_at = &mut self.delayed_at;
        self.delayed.retain(|(_, jb, index)| {
            let keep = *jb != job;
            if !keep {
                delayed_at.remove(&(job, *index));
            }
            keep
        });
        // Tasks sent ahead to a worker's prefetch window have not started: counted queued.
        let (queued, running) = (queued + j.counts.assigned, j.counts.running);
        let jobs = &self.jobs;
        for w in self.workers.values() {
            let holds = holder(jobs, w.id);
            let tasks = w.ledger.held_of(|jb| jb == job, holds);
            if !tasks.is_empty() {
                self.commands.push(Command::Cancel {
                    worker: w.id,
                    tasks,
                });
            }
        }
        if feeds {
            // What waits for its tasks that will now never finish.
            // (Its running tasks' cancels come back as ends, which do the same.)
            let mut gone = self.graph_waited_on(job);
            gone.retain(|&(jb, i)| {
                self.jobs.get(&jb).map(|j| j.record(i).state) == Some(TaskState::Canceled)
            });
            self.graph_cascade(now_us, gone);
        }
        // Tasks requeued for retry were counted as ready: their records say Ready.
        self.check_job_done(now_us, job);
        Ok((queued, running))
    }

    /// Cancels single tasks of a job (see [`super::Event::CancelTasks`]): how many had not
    /// started (queued, waiting, or sent ahead to a worker) and how many were running.
    pub(crate) fn cancel_tasks(
        &mut self,
        now_us: u64,
        job: JobId,
        indices: &[TaskIndex],
    ) -> Result<(u32, u32), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        if j.canceled || j.is_done() {
            return Ok((0, 0));
        }
        if j.held {
            return Err(SchedError::CancelIncomplete(job));
        }
        let mut indices: Vec<TaskIndex> =
            indices.iter().copied().filter(|&i| i < j.len()).collect();
        indices.sort_unstable();
        indices.dedup();
        let (mut queued, mut running) = (0, 0);
        // Ended at once, as a cancel before it started would have ended them on a worker: the
        // journal and the watches take them as such ends.
        let mut ends = Vec::new();
        let mut by_worker: std::collections::BTreeMap<u32, Vec<(JobId, TaskIndex)>> =
            std::collections::BTreeMap::new();
        for index in indices {
            let rec = j.table.get(index);
            match rec.state {
                TaskState::Ready | TaskState::Waiting => {
                    // Its queue or window entry is passed over when reached.
                    j.set_state(index, TaskState::Canceled).finished_us = now_us;
                    j.unmet.remove(&index);
                    ends.push(crate::Finished::at_once(
                        job,
                        index,
                        now_us,
                        crate::RunEnd::Canceled,
                    ));
                    queued += 1;
                }
                TaskState::Assigned | TaskState::Running => {
                    // Its worker ends it and reports it canceled.
                    if rec.state == TaskState::Running {
                        running += 1;
                    } else {
                        queued += 1;
                    }
                    by_worker.entry(rec.worker).or_default().push((job, index));
                }
                _ => {}
            }
        }
        for (worker, tasks) in by_worker {
            self.commands.push(Command::Cancel { worker, tasks });
        }
        if !ends.is_empty() {
            let gone: Vec<_> = ends.iter().map(|f| (f.job, f.index)).collect();
            self.records.push(Record::Ended { ends });
            self.graph_cascade(now_us, gone);
            self.check_job_done(now_us, job);
        }
        Ok((queued, running))
    }

    /// Puts a job's failed tasks (and with `failed_only` false, its canceled ones) back with
    /// fresh retry and crash counts; the job is live again. Each waits again for what it
    /// depends on that has not finished; when that has failed for good the retry is refused
    /// (see the graph's `relink`). The tasks of other jobs that this job's failure canceled
    /// come back too, waiting for it. Returns how many failed and how many canceled tasks
    /// were put back.
    pub(crate) fn retry_job(
        &mut self,
        now_us: u64,
        job: JobId,
        failed_only: bool,
    ) -> Result<(u32, u32), SchedError> {
        let j = self.jobs.get(&job).ok_or(SchedError::NoSuchJob(job))?;
        if j.canceled && failed_only {
            return Err(SchedError::RetryCanceled(job));
        }
        if j.held {
            // Never linked into its graph: its tasks were never ready, and only part came.
            return Err(SchedError::RetryIncomplete(job));
        }
        // Shown states are counted: nothing to put back is nothing to look at.
        if j.counts.failed == 0 && (failed_only || j.counts.canceled == 0) {
            return Ok((0, 0));
        }
        // What the job's `after` waits for now, before anything changes.
        let gate = self
            .gate_now(job)
            .map_err(|n| self.to_retry_first(n).refusal(job))?;
        self.task_deps_met(job, failed_only)
            .map_err(|n| self.to_retry_first(n).refusal(job))?;
        let j = &self.jobs[&job];
        if gate.is_empty() && (j.inputs_per_task() == 0 || !self.graph_has_files()) {
            return Ok(self.retry_unlinked(now_us, job, failed_only));
        }
        // In a graph: each task waits again for the writers of its inputs.
        let chosen: Vec<(TaskIndex, TaskState)> = (0..j.len())
            .filter_map(|index| {
                let shown = j.record(index).state;
                retried(shown, failed_only).then_some((index, shown))
            })
            .collect();
        if chosen.is_empty() {
            return Ok((0, 0));
        }
        let coming = |k: (JobId, TaskIndex)| {
            k.0 == job && chosen.binary_search_by_key(&k.1, |c| c.0).is_ok()
        };
        let reads = chosen
            .iter()
            .map(|&(index, _)| self.reads_now(job, index, &coming))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|n| self.to_retry_first(n).refusal(job))?;
        let j = self.jobs.get_mut(&job).expect("looked up above");
        let (mut failed, mut canceled) = (0u32, 0u32);
        for &(index, shown) in &chosen {
            if shown == TaskState::Failed {
                failed += 1;
            } else {
                canceled += 1;
            }
            Self::fresh_again(j, &mut self.delayed, &mut self.delayed_at, index);
        }
        j.canceled = false;
        let priority = j.spec.priority;
        let indices: Vec<TaskIndex> = chosen.iter().map(|c| c.0).collect();
        self.own_outputs_again(job, &indices);
        for span in self.relink(job, gate, &chosen, reads) {
            self.ready.push_requeued(priority, span);
        }
        self.live_again(job);
        self.records.push(Record::Retried { job, failed_only });
        self.revive(now_us);
        Ok((failed, canceled))
    }

    /// [`Self::retry_job`] of a job that waits for nothing: its tasks go back to the queue as
    /// runs of indices, and tasks never handed out (of a canceled array) are not touched.
    fn retry_unlinked(&mut self, now_us: u64, job: JobId, failed_only: bool) -> (u32, u32) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return (0, 0);
        };
        let mut spans: Vec<Span> = Vec::new();
        let (mut failed, mut canceled) = (0u32, 0u32);
        for index in 0..j.len() {
            let raw = j.table.get(index).state;
            let shown = j.record(index).state;
            if !retried(shown, failed_only) {
                continue;
            }
            if shown == TaskState::Failed {
                failed += 1;
            } else {
                canceled += 1;
            }
            if raw == shown {
                Self::fresh_again(j, &mut self.delayed, &mut self.delayed_at, index);
                j.set_state(index, TaskState::Ready);
            } else {
                // Untouched or re-queued task of a canceled job: counted canceled, stored ready.
                j.counts.moved(TaskState::Canceled, TaskState::Ready);
                if let Some(due) = self.delayed_at.remove(&(job, index)) {
                    self.delayed.remove(&(due, job, index));
                }
            }
            match spans.last_mut() {
                Some(s) if s.end == index => s.end += 1,
                _ => spans.push(Span::one(job, index)),
            }
        }
        if failed + canceled == 0 {
            return (0, 0);
        }
        j.canceled = false;
        let priority = j.spec.priority;
        for span in spans {
            self.ready.push_requeued(priority, span);
        }
        self.live_again(job);
        self.records.push(Record::Retried { job, failed_only });
        self.revive(now_us);
        (failed, canceled)
    }

    /// A task put back by a retry: fresh retry and crash counts, no reason, no backoff.
    fn fresh_again(
        j: &mut Job,
        delayed: &mut std::collections::BTreeSet<(u64, JobId, TaskIndex)>,
        delayed_at: &mut rustc_hash::FxHashMap<(JobId, TaskIndex), u64>,
        index: TaskIndex,
    ) {
        if j.canceled_for_deps(index) {
            j.canceled_by_deps -= 1;
        }
        j.failures.remove(&index);
        let rec = j.table.get_mut(index);
        rec.failures = 0;
        rec.lost = 0;
        // A re-queued task of a canceled job may still wait out its backoff.
        if let Some(due) = delayed_at.remove(&(j.id, index)) {
            delayed.remove(&(due, j.id, index));
        }
    }

    /// A job with tasks put back is live again, in its workflow and for its parent.
    fn live_again(&mut self, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let ended = j.finished_us.take().is_some();
        if j.windowed {
            self.windowed_jobs.insert(job);
        }
        self.live_jobs.insert(job);
        self.note_nodes(job);
        if ended {
            self.graph_rejoin(job);
        }
    }

    /// Ends a job whose tasks are all terminal and that takes no more: its waiters are told
    /// ([`Command::JobDone`]) and the workers that were sent its template may drop it.
    pub(super) fn check_job_done(&mut self, now_us: u64, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.finished_us.is_none() && j.is_done() {
            j.finished_us = Some(now_us);
            self.live_jobs.remove(&job);
            self.windowed_jobs.remove(&job);
            if self.windowed_jobs.is_empty() && !self.window.is_empty() {
                // What is left names tasks that moved on (a resumed worker took them back).
                self.window = crate::window::Window::new();
            }
            self.commands.push(Command::JobDone { job });
            for w in self.workers.values_mut() {
                if w.known_jobs.remove(&job) {
                    self.commands.push(Command::ForgetJob { worker: w.id, job });
                }
            }
            self.graph_job_ended(now_us, job);
        }
    }

    /// Removes a job that has ended, with its task records, so a long-lived server does not
    /// keep every job it ever ran. Its id is not given out again. A job with tasks still queued
    /// or running is refused.
    pub(crate) fn forget_job(&mut self, job: JobId) -> Result<(), SchedError> {
        let j = self.jobs.get(&job).ok_or(SchedError::NoSuchJob(job))?;
        if !j.is_done() {
            // One job's counts never pass its length, a u32.
            let left = j.len() - j.counts.done() as u32;
            return Err(SchedError::NotEnded { job, left });
        }
        self.graph_forget(job);
        self.forget_values(job);
        self.jobs.remove(&job);
        self.live_jobs.remove(&job);
        // An ended job rarely has queue entries left (a task a resumed worker took back keeps
        // its entry until it is reached); without its job they would never be reached.
        if !self.ready.is_empty() {
            self.ready.retain(|s| s.job != job);
        }
        self.records.push(Record::Forgotten { job });
        Ok(())
    }
}
