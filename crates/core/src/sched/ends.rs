//! Task reports: starts, ends (one or a whole update at a time), slot waits.

use super::worker::holder;
use super::{Accepted, Config, Job, Scheduler, Worker};
use crate::outcome::{Command, Failure, Finished, Record, RunEnd};
use crate::quarantine::JobTally;
use crate::queue::Span;
use crate::spec::{JobId, TaskIndex, TaskState, WorkerId};
use crate::table::TaskRecord;

/// Whom quarantine judges after a run ends.
enum ToJudge {
    /// The worker whose run failed, with its tally of the job.
    This(JobTally),
    /// A suspect of the job (see `JobOutcomes::suspect`), after a success elsewhere.
    Suspect(WorkerId),
}

impl Scheduler {
    /// A worker reports that a task's process started.
    pub(crate) fn task_started(
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
        let cpus = j.need.cpus;
        let rec = j.set_state(index, TaskState::Running);
        rec.started_us = at_us;
        rec.runs = rec.runs.saturating_add(1);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.running_cpus += cpus;
        }
        Accepted::Recorded
    }

    /// A worker reports that a task's run ended. Reports that do not match the task's current
    /// assignment (late, duplicate, or from a worker it was taken from) are ignored, so each
    /// completion is recorded once. The exception is a success of a duplicate run noted by
    /// [`Self::worker_resumed`]: the first success wins and the other run is canceled. A taken
    /// end is recorded ([`Record::Ended`]).
    pub(crate) fn task_finished(&mut self, now_us: u64, worker: WorkerId, f: Finished) -> Accepted {
        if self.broken_run_ended(now_us, worker, &f) {
            return Accepted::Recorded;
        }
        let taken = self.finish_one(now_us, worker, &f);
        if taken == Accepted::Recorded {
            self.records.push(Record::Ended { ends: vec![f] });
        }
        taken
    }

    /// The ends of one worker's update, in order, as [`Self::task_finished`] takes each; those
    /// taken are recorded together, in their order, as one [`Record::Ended`]. Returns how many
    /// were ignored.
    ///
    /// The common end, a success of a task the worker holds, is applied with the job and the
    /// worker looked up once per run of ends of one job, and the job's end checked once per
    /// run: on the per-task path of a noop array these lookups were a third of its cost. The
    /// taken ends stay in the update's own vector (moved forward over ignored ones), so
    /// recording them copies nothing.
    pub(crate) fn tasks_finished(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        mut ends: Vec<Finished>,
    ) -> u32 {
        if self.has_broken_runs() {
            // Ends of multi-node runs a lost node broke count as that loss, not as ends.
            ends.retain(|f| !self.broken_run_ended(now_us, worker, f));
        }
        // `ends[..kept]` are the ends taken so far, in order; `ends[i]` is the next to apply.
        let mut kept = 0;
        let mut i = 0;
        while i < ends.len() {
            let job = ends[i].job;
            let (Some(j), Some(w)) = (self.jobs.get_mut(&job), self.workers.get_mut(&worker))
            else {
                // An unknown job or worker: a late report, ignored as `finish_one` would.
                i += 1;
                continue;
            };
            // Its ends free room (or are ignored, and then it was open already).
            self.open.insert(worker);
            let in_graph = j.feeds;
            let first_taken = kept;
            let mut prune = false;
            // Whether `ends[i]` is an end the fast path does not take, which goes the whole way.
            let mut slow = false;
            // A suspect of the job that successes here are evidence against.
            let mut suspect = None;
            while i < ends.len() && ends[i].job == job {
                let Some((due, s)) = Self::success_of_holder(j, w, &self.config, now_us, &ends[i])
                else {
                    slow = true;
                    break;
                };
                prune |= due;
                suspect = suspect.or(s);
                if kept != i {
                    ends.swap(kept, i);
                }
                kept += 1;
                i += 1;
            }
            if prune {
                self.prune_ledger(worker);
            }
            if let Some(s) = suspect {
                self.judge_again(s, job);
            }
            if in_graph {
                for e in &ends[first_taken..kept] {
                    self.graph_task_finished(job, e.index);
                }
            }
            self.check_job_done(now_us, job);
            if slow {
                if self.finish_one(now_us, worker, &ends[i]) == Accepted::Recorded {
                    if kept != i {
                        ends.swap(kept, i);
                    }
                    kept += 1;
                }
                i += 1;
            }
        }
        let ignored = (ends.len() - kept) as u32;
        ends.truncate(kept);
        if !ends.is_empty() {
            self.records.push(Record::Ended { ends });
        }
        ignored
    }

    /// Records a success of a task `w` holds, with its job and worker at hand; `None` (and
    /// nothing changed) for any other end. Says whether `w`'s ledger is due for pruning, and
    /// which suspect of the job to judge again, if any.
    fn success_of_holder(
        j: &mut Job,
        w: &mut Worker,
        config: &Config,
        now_us: u64,
        f: &Finished,
    ) -> Option<(bool, Option<WorkerId>)> {
        if f.end != RunEnd::Success || f.index >= j.len() {
            return None;
        }
        let TaskRecord {
            worker,
            state,
            runs,
            ..
        } = j.table.get(f.index);
        if worker != w.id || !matches!(state, TaskState::Assigned | TaskState::Running) {
            return None;
        }
        // A task that ran before may have failed on another worker, whose judgement hears of
        // this success: the whole way.
        if runs.saturating_add(u8::from(state == TaskState::Assigned)) > 1 {
            return None;
        }
        let prune = w.release(j.need, state);
        let suspect = Self::note_success(
            j,
            w,
            config,
            now_us,
            f,
            u8::from(state == TaskState::Assigned),
        );
        Some((prune, suspect))
    }

    /// What a success tells: the job's run time, quarantine's counts, the task's record.
    /// Returns a suspect of the job to judge again, if there is one.
    fn note_success(
        j: &mut Job,
        w: &mut Worker,
        config: &Config,
        now_us: u64,
        f: &Finished,
        unreported_run: u8,
    ) -> Option<WorkerId> {
        let suspect = match Self::note_outcome(j, w, config, now_us, f, true, unreported_run) {
            Some(ToJudge::Suspect(s)) => Some(s),
            _ => None,
        };
        w.tasks_finished += 1;
        let rec = j.set_state(f.index, TaskState::Finished);
        rec.started_us = f.started_us;
        rec.finished_us = f.finished_us;
        rec.runs = rec.runs.saturating_add(unreported_run);
        suspect
    }

    /// Counts a run that ended with a success (`ok`) or a failure: the job's mean run time
    /// (of successes) and, once the job has had a failure, what quarantine judges workers by. Says who is to
    /// be judged now, if anyone.
    fn note_outcome(
        j: &mut Job,
        w: &mut Worker,
        config: &Config,
        now_us: u64,
        f: &Finished,
        ok: bool,
        unreported_run: u8,
    ) -> Option<ToJudge> {
        // Only successes say how long the job's tasks take: a node failing them at once
        // would otherwise make them look short, and deepen every worker's prefetch.
        if ok {
            j.note_run_time(f.finished_us.saturating_sub(f.started_us));
        }
        if config.quarantine_failures == 0 || !j.outcomes.counting(ok) {
            return None;
        }
        // Only a task's first run counts in the rates: tasks run again (a retry, `job retry`)
        // are those that failed before, and judging the worker that gets them against the
        // others' first runs would blame it for the tasks. Every run counts in its streak.
        let first_run = j.table.get(f.index).runs.saturating_add(unreported_run) <= 1;
        let window = config.quarantine_window_us;
        let mine = w.tally.record(now_us, window, f.job, ok, first_run);
        if first_run {
            j.outcomes.record(now_us, window, ok);
        }
        if !ok {
            Some(ToJudge::This(mine))
        } else {
            // A success elsewhere is evidence against a suspect.
            let suspect = j.outcomes.suspect.filter(|&s| s != w.id && first_run);
            suspect.map(ToJudge::Suspect)
        }
    }

    /// [`Self::task_finished`] for any end.
    fn finish_one(&mut self, now_us: u64, worker: WorkerId, f: &Finished) -> Accepted {
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
        let need = j.need;
        let Some(w) = self.workers.get_mut(&worker) else {
            return Accepted::Ignored;
        };
        // The worker whose ledger a release made due for pruning.
        let mut prune = None;
        if ours {
            self.open.insert(worker);
            prune = w.release(need, rec.state).then_some(worker);
        } else {
            let dup = w.duplicates.remove(&key);
            if !(dup && active && f.end == RunEnd::Success) {
                return Accepted::Ignored;
            }
            // The duplicate run finished first: take the task from the other worker.
            let other = rec.worker;
            if let Some(o) = self.workers.get_mut(&other) {
                self.open.insert(other);
                prune = o.release(need, rec.state).then_some(other);
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
        // After a failure: this worker's tally of the job, to judge it by.
        let mut judged = None;
        // After a success: a suspect of the job to judge again.
        let mut suspect = None;
        // A task that had failed on another worker ran again here: that worker's failure,
        // when, and whether the task succeeded here.
        let mut seen_again = None;
        // Whether it ran before (a retry, a lost worker's task, `job retry`).
        let again_run = rec
            .runs
            .saturating_add(u8::from(ours && rec.state == TaskState::Assigned))
            > 1;
        // How the task's end bears on what depends on it: finished, or lost for good.
        let mut for_graph = None;
        // Whether it failed for want of an input (which may be an intermediate file lost).
        let mut lost_input = false;
        // A run whose start came with its end (or not at all) is counted now.
        let unreported_run = u8::from(ours && rec.state == TaskState::Assigned);
        match &f.end {
            RunEnd::Success => {
                suspect = Self::note_success(j, w, &self.config, now_us, f, unreported_run);
                if again_run {
                    seen_again = j.failed_on.remove(&f.index).map(|(on, at)| (on, at, true));
                }
                for_graph = Some(true);
            }
            RunEnd::Canceled => {
                let rec = j.set_state(f.index, TaskState::Canceled);
                rec.finished_us = f.finished_us;
                for_graph = Some(false);
            }
            RunEnd::Failed(failure) => {
                let outcome =
                    Self::note_outcome(j, w, &self.config, now_us, f, false, unreported_run);
                if let Some(ToJudge::This(mine)) = outcome {
                    judged = Some(mine);
                }
                w.tasks_failed += 1;
                let rec = j.set_state(f.index, TaskState::Failed);
                rec.started_us = f.started_us;
                rec.finished_us = f.finished_us;
                rec.runs = rec.runs.saturating_add(unreported_run);
                rec.failures = rec.failures.saturating_add(1);
                let failures = rec.failures;
                let again =
                    !j.canceled && !failure.permanent && (failures as u32) <= j.spec.retries;
                if failure.permanent {
                    // The task's own fault (an input that is not there), not the worker's.
                    judged = None;
                } else if let Some((on, at)) = j.failed_on.insert(f.index, (worker, now_us)) {
                    seen_again = Some((on, at, false));
                    if on != worker {
                        // It failed elsewhere before: the task's fault as much as this worker's.
                        let t = w.tally.failed_before_elsewhere(f.job);
                        judged = judged.and(t);
                    }
                }
                j.failures.insert(f.index, (**failure).clone());
                let priority = j.spec.priority;
                if !again {
                    for_graph = Some(false);
                    lost_input = failure.permanent;
                }
                if again {
                    j.set_state(f.index, TaskState::Ready);
                    let delay = self.backoff_us(failures);
                    if delay == 0 {
                        let span = Span::one(f.job, f.index);
                        self.ready.push_requeued(priority, span);
                    } else {
                        let due = now_us + delay;
                        self.delayed.insert((due, f.job, f.index));
                        self.delayed_at.insert(key, due);
                    }
                }
            }
        }
        if let Some((on, at, ok)) = seen_again.filter(|&(on, _, _)| on != worker) {
            self.seen_elsewhere(on, f.job, at, ok);
        }
        if let Some(mine) = judged {
            self.judge_worker(worker, f.job, mine);
        }
        if let Some(s) = suspect {
            self.judge_again(s, f.job);
        }
        if let Some(id) = prune {
            self.prune_ledger(id);
        }
        match (for_graph, &f.end) {
            (Some(true), _) => self.graph_task_finished(f.job, f.index),
            // An input lost with its workers is made again, and the task waits for it.
            (Some(false), RunEnd::Failed(failure))
                if lost_input && self.rescue_reader(key, &failure.reason) => {}
            (Some(false), _) => {
                if lost_input {
                    self.explain_lost_input(f.job, f.index);
                }
                self.graph_task_lost(now_us, f.job, f.index)
            }
            (None, _) => {}
        }
        self.check_job_done(now_us, f.job);
        Accepted::Recorded
    }

    /// A worker reports how long the tasks of `job` whose successes it reports waited there
    /// for a free slot, summed (one number per job and update, not one per task: only the
    /// job's sum is kept, for [`Job::timing`]).
    pub(crate) fn add_slot_wait(&mut self, job: JobId, waited_us: u64) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.waited_us = j.waited_us.saturating_add(waited_us);
            self.records.push(Record::SlotWait { job, waited_us });
        }
    }

    /// Drops ended tasks from a worker's ledger (when a release says it lists far more than
    /// the worker holds).
    pub(super) fn prune_ledger(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.ledger.prune(holder(&self.jobs, worker));
        }
    }

    /// A task the driver could not hand to its worker at all (its command line alone is bigger
    /// than a message can carry): it can never run, so it fails for good with `failure`,
    /// spending no retries and counting against no worker. Journaled as a give-up.
    pub(crate) fn task_undeliverable(
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
        let need = j.need;
        let state = j.table.get(index).state;
        if let Some(w) = self.workers.get_mut(&worker) {
            self.open.insert(worker);
            if w.release(need, state) {
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
}
