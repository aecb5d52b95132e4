//! Retrying a job looks at its dependencies anew (issue 29, defect 4).
//!
//! A task put back by `job retry` waits again for what it depends on that has not finished:
//! its job's `after` jobs and tasks, the writers of the files it reads, and the tasks its
//! `deps` name (a job file's task dependencies). When one of those
//! has failed for good (or was canceled), the task could never run, and the retry is refused
//! with the job to retry first: Slurm keeps such a job pending as *DependencyNeverSatisfied*,
//! which leaves a job that never runs; a refusal says at once what to do. Retrying the failed
//! job then brings back the tasks its failure canceled downstream ([`Scheduler::revive`]):
//! they wait for its retry and run when it finishes, as if it had not failed.
//!
//! Like the rest of the graph, all of it follows from the journaled retries, so a replay
//! rebuilds it.

use super::{TaskKey, Waiter};
use crate::files::FileId;
use crate::queue::Span;
use crate::sched::jobs::retried;
use crate::sched::{SchedError, Scheduler};
use crate::spec::{JobId, Keep, TaskIndex, TaskState};
use rustc_hash::FxHashSet;

/// What a job's `after` leaves its tasks waiting for.
#[derive(Default)]
pub(in crate::sched) struct Gate {
    jobs: Vec<JobId>,
    tasks: Vec<TaskKey>,
}

impl Gate {
    /// Whether it waits for nothing.
    pub(in crate::sched) fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.tasks.is_empty()
    }
}

/// A dependency that can never be met now, said for people, with the job to retry for it.
pub(in crate::sched) struct Never {
    why: String,
    job: JobId,
    /// Whether that job was canceled (its retry then needs `--all`).
    canceled: bool,
}

impl Never {
    /// The refusal of a retry of `job` for it.
    pub(in crate::sched) fn refusal(self, job: JobId) -> SchedError {
        SchedError::DependencyNeverMet {
            job,
            why: self.why,
            retry: self.job,
            all: self.canceled,
        }
    }
}

/// How many jobs canceled in turn [`Scheduler::to_retry_first`] follows up a chain.
const MAX_CHAIN: usize = 64;

impl Scheduler {
    /// The job to retry for `never` to be met: its job, or, when that job's tasks were
    /// themselves canceled for a dependency of theirs, the job at the start of the chain (the
    /// one whose retry brings the others back).
    pub(in crate::sched) fn to_retry_first(&self, mut never: Never) -> Never {
        for _ in 0..MAX_CHAIN {
            let Some(up) = self.never_met(never.job) else {
                break;
            };
            never.job = up.job;
            never.canceled = up.canceled;
        }
        never
    }

    /// Why the tasks of `job` canceled for a dependency cannot come back now: the first
    /// dependency of theirs that failed for good (`None` when none is left, or the job was
    /// canceled itself).
    pub(in crate::sched) fn never_met(&self, job: JobId) -> Option<Never> {
        let j = self.jobs.get(&job)?;
        if j.canceled_by_deps == 0 || j.canceled {
            return None;
        }
        if let Err(never) = self.gate_now(job) {
            return Some(never);
        }
        let nothing_comes = |_: TaskKey| false;
        j.touched()
            .filter(|&(i, r)| r.state == TaskState::Canceled && j.canceled_for_deps(i))
            .find_map(|(i, _)| self.reads_now(job, i, &nothing_comes).err())
    }

    /// Why the tasks of ended job `job` were canceled for a dependency and what brings them
    /// back, said for people (`job info`, `job retry`); `None` if none was.
    pub fn canceled_because(&self, job: JobId) -> Option<String> {
        let never = self.to_retry_first(self.never_met(job)?);
        Some(format!(
            "{}; `kestrel job retry {}{}` brings them back, to run after it",
            never.why,
            never.job,
            if never.canceled { " --all" } else { "" }
        ))
    }

    /// What job `job`'s `after` waits for now, or the dependency that can never be met.
    pub(in crate::sched) fn gate_now(&self, job: JobId) -> Result<Gate, Never> {
        let mut gate = Gate::default();
        let Some(j) = self.jobs.get(&job) else {
            return Ok(gate);
        };
        for a in &j.spec.after {
            // A job forgotten since has ended, and was waited for when it did.
            let Some(dep) = self.jobs.get(&a.job) else {
                continue;
            };
            let never = |why: String| Never {
                why,
                job: a.job,
                canceled: dep.canceled,
            };
            match &a.tasks {
                None if dep.finished_us.is_none() => gate.jobs.push(a.job),
                None if dep.counts.finished == dep.len() => {}
                None => {
                    return Err(never(format!(
                        "it runs after job {}, which ended with {} failed and {} canceled tasks",
                        a.job, dep.counts.failed, dep.counts.canceled
                    )))
                }
                Some(ids) => {
                    for k in 0..ids.len() {
                        let Some(index) = ids.id_at(k).and_then(|t| dep.index_of(t)) else {
                            continue;
                        };
                        match dep.record(index).state {
                            TaskState::Finished => {}
                            s if s.is_terminal() => {
                                return Err(never(format!(
                                    "it runs after task {}, which has {s}",
                                    self.task_name((a.job, index))
                                )))
                            }
                            _ => gate.tasks.push((a.job, index)),
                        }
                    }
                }
            }
        }
        Ok(gate)
    }

    /// The writers task `index` of `job` waits for now (with the file it reads of each), or
    /// the one that can never write it. A writer for which `coming` says yes is put back in
    /// the same step, and waited for.
    pub(in crate::sched) fn reads_now(
        &self,
        job: JobId,
        index: TaskIndex,
        coming: &dyn Fn(TaskKey) -> bool,
    ) -> Result<Vec<(TaskKey, FileId)>, Never> {
        let mut waits = Vec::new();
        let Some(j) = self.jobs.get(&job) else {
            return Ok(waits);
        };
        if self.graph.produced.is_empty() {
            return Ok(waits);
        }
        for &file in j.inputs_of(index) {
            let Some(&by) = self.graph.produced.get(&file) else {
                continue;
            };
            let Some(w) = self.jobs.get(&by.0) else {
                continue;
            };
            match w.record(by.1).state {
                TaskState::Finished => {}
                s if s.is_terminal() && !coming(by) => {
                    return Err(Never {
                        why: format!(
                            "task {} reads {}, whose writer, task {}, has {s}",
                            self.task_name((job, index)),
                            self.file_name(file),
                            self.task_name(by)
                        ),
                        job: by.0,
                        canceled: w.canceled,
                    })
                }
                _ => waits.push((by, file)),
            }
        }
        Ok(waits)
    }

    /// The producers named by the `deps` of task `index` of `job` (a job file's task
    /// dependencies) that have not finished, or the one that never will. A producer for which
    /// `coming` says yes is put back in the same step, and waited for.
    pub(in crate::sched) fn deps_now(
        &self,
        job: JobId,
        index: TaskIndex,
        coming: &dyn Fn(TaskKey) -> bool,
    ) -> Result<Vec<TaskKey>, Never> {
        let mut waits = Vec::new();
        let Some(j) = self.jobs.get(&job).filter(|j| !j.spec.deps.is_empty()) else {
            return Ok(waits);
        };
        let id = j.task_id(index);
        for d in j.spec.deps.iter().filter(|d| d.task == id) {
            for (by, state) in self.producers(job, &d.on) {
                match state {
                    TaskState::Finished => {}
                    s if s.is_terminal() && !coming(by) => {
                        return Err(Never {
                            why: format!(
                                "task {} depends on task {}, which has {s}",
                                self.task_name((job, index)),
                                self.task_name(by)
                            ),
                            job: by.0,
                            canceled: self.jobs.get(&by.0).is_some_and(|pj| pj.canceled),
                        })
                    }
                    _ => waits.push(by),
                }
            }
        }
        Ok(waits)
    }

    /// Whether the tasks a retry of `job` would put back could run: none of them names in its
    /// `deps` a task that has failed or been canceled for good and is not put back with them.
    pub(in crate::sched) fn task_deps_met(
        &self,
        job: JobId,
        failed_only: bool,
    ) -> Result<(), Never> {
        let Some(j) = self.jobs.get(&job).filter(|j| !j.spec.deps.is_empty()) else {
            return Ok(());
        };
        let back = |index: TaskIndex| retried(j.record(index).state, failed_only);
        let coming = |k: TaskKey| k.0 == job && back(k.1);
        for d in &j.spec.deps {
            match j.index_of(d.task) {
                Some(index) if back(index) => {
                    self.deps_now(job, index, &coming)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Puts `tasks` of `job` back, each with the state it is counted in now (failed or
    /// canceled): waiting for `gate` and for the writers in `reads` (per task, in the order of
    /// `tasks`), ready otherwise. Returns the spans of those ready, for the queue. Waits
    /// already registered (a job canceled while it waited) are not registered twice.
    pub(in crate::sched) fn relink(
        &mut self,
        job: JobId,
        gate: Gate,
        tasks: &[(TaskIndex, TaskState)],
        reads: Vec<Vec<(TaskKey, FileId)>>,
    ) -> Vec<Span> {
        for &dep in &gate.jobs {
            let w = self.graph.job_waiters.entry(dep).or_default();
            if !w.contains(&job) {
                w.push(job);
            }
        }
        for &t in &gate.tasks {
            let w = self.graph.waiters.entry(t).or_default();
            if !w.contains(&Waiter::Gate(job)) {
                w.push(Waiter::Gate(job));
            }
            if let Some(d) = self.jobs.get_mut(&t.0) {
                d.feeds = true;
            }
        }
        let mut unmet: Vec<u32> = Vec::with_capacity(tasks.len());
        for (&(index, _), waits) in tasks.iter().zip(reads) {
            let mut n = 0;
            for (by, file) in waits {
                let w = self.graph.waiters.entry(by).or_default();
                let reader = (job, index);
                // One wait per (reader, writer), however many of its files it reads.
                if !w
                    .iter()
                    .any(|x| matches!(*x, Waiter::Reader(r, _) if r == reader))
                {
                    w.push(Waiter::Reader(reader, file));
                }
                n += 1;
                if let Some(d) = self.jobs.get_mut(&by.0) {
                    d.feeds = true;
                }
            }
            unmet.push(n);
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            return Vec::new();
        };
        j.gate = (gate.jobs.len() + gate.tasks.len()) as u32;
        let mut spans: Vec<Span> = Vec::new();
        for (&(index, counted), n) in tasks.iter().zip(unmet) {
            if n > 0 {
                j.unmet.insert(index, n);
            } else {
                j.unmet.remove(&index);
            }
            let to = if j.gate > 0 || n > 0 {
                TaskState::Waiting
            } else {
                TaskState::Ready
            };
            j.counts.moved(counted, to);
            // A task of a canceled job never handed out is stored ready: left untouched.
            if j.table.get(index).state != to {
                let rec = j.table.get_mut(index);
                rec.state = to;
                rec.finished_us = 0;
            }
            if to == TaskState::Ready {
                match spans.last_mut() {
                    Some(s) if s.end == index => s.end += 1,
                    _ => spans.push(Span::one(job, index)),
                }
            }
        }
        spans
    }

    /// Outputs of `tasks` of `job` that are no longer known as written by anyone (a finished
    /// workflow's local intermediates are forgotten with their copies) are its tasks' again,
    /// for the readers that wait for them.
    pub(in crate::sched) fn own_outputs_again(&mut self, job: JobId, tasks: &[TaskIndex]) {
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let per = j.spec.template.files.outputs.len();
        if per == 0 || j.outputs.is_empty() {
            return;
        }
        let root = self.graph.root(job);
        let mut locals = Vec::new();
        for &index in tasks {
            for p in 0..per {
                let Some(&file) = j.outputs.get(index as usize * per + p) else {
                    continue;
                };
                if let std::collections::hash_map::Entry::Vacant(e) =
                    self.graph.produced.entry(file)
                {
                    e.insert((job, index));
                    if j.keep.get(p) == Some(&Keep::Local) {
                        locals.push(file);
                    }
                }
            }
        }
        if !locals.is_empty() {
            self.graph.locals.entry(root).or_default().extend(locals);
        }
    }

    /// A job was retried: the tasks canceled because it (or what it canceled) failed come
    /// back, waiting for it, unless something else they depend on has failed for good: those
    /// of other jobs, and its own left canceled by a retry of its failed tasks only (a task
    /// whose `deps` name a failed task of its job). Jobs are looked at in id order, so a
    /// dependent's own dependents come back after it. Canceled jobs stay canceled.
    pub(in crate::sched) fn revive(&mut self, now_us: u64) {
        let mut candidates: Vec<JobId> = self
            .jobs
            .values()
            .filter(|d| d.canceled_by_deps > 0 && !d.canceled && !d.held)
            .map(|d| d.id)
            .collect();
        candidates.sort_unstable();
        for d in candidates {
            let Ok(gate) = self.gate_now(d) else {
                continue;
            };
            let Some(dj) = self.jobs.get(&d) else {
                continue;
            };
            let mut back: Vec<TaskIndex> = dj
                .touched()
                .filter(|&(i, r)| r.state == TaskState::Canceled && dj.canceled_for_deps(i))
                .map(|(i, _)| i)
                .collect();
            // Those whose inputs can come; a task of the job that stays canceled may keep
            // another from coming, so until nothing changes.
            let reads = loop {
                let coming: FxHashSet<TaskIndex> = back.iter().copied().collect();
                let is_coming = |k: TaskKey| k.0 == d && coming.contains(&k.1);
                let mut reads = Vec::with_capacity(back.len());
                let mut kept = Vec::with_capacity(back.len());
                for &i in &back {
                    let deps_met = self.deps_now(d, i, &is_coming).is_ok();
                    match self.reads_now(d, i, &is_coming) {
                        Ok(r) if deps_met => {
                            reads.push(r);
                            kept.push(i);
                        }
                        _ => {}
                    }
                }
                if kept.len() == back.len() {
                    break reads;
                }
                back = kept;
            };
            if back.is_empty() {
                continue;
            }
            let Some(dj) = self.jobs.get_mut(&d) else {
                continue;
            };
            for &i in &back {
                dj.failures.remove(&i);
            }
            dj.canceled_by_deps = dj.canceled_by_deps.saturating_sub(back.len() as u32);
            let ended = dj.finished_us.take().is_some();
            let priority = dj.spec.priority;
            let windowed = dj.windowed;
            let back: Vec<_> = back.into_iter().map(|i| (i, TaskState::Canceled)).collect();
            let spans = self.relink(d, gate, &back, reads);
            for span in spans {
                self.ready.push_new(priority, span);
            }
            if windowed {
                self.windowed_jobs.insert(d);
            }
            self.live_jobs.insert(d);
            if ended {
                self.graph_rejoin(d);
            }
            // What their `deps` name and has not finished, they wait for again.
            self.rewait_task_deps(now_us, d);
        }
    }
}
