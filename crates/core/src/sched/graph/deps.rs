//! Dependencies of single tasks (a job file's `deps = [...]`, as HyperQueue's job files have):
//! a task waits for tasks of its own job, or of jobs submitted before it, beside the writers
//! of its inputs and its job's `after`.
//!
//! Each is one more producer the waiting task counts down ([`Waiter::Task`]), released and
//! canceled as file dependencies are; a submission is refused, naming the task ids, when a
//! task depends on itself, on a task its job or the other job does not have, on one that has
//! failed or been canceled already, or when its job's tasks wait for each other in a cycle.

use super::{Links, TaskKey};
use crate::files::FileId;
use crate::sched::{Job, SchedError, Scheduler};
use crate::spec::{JobId, TaskIndex, TaskState};

/// Why one task of a job waits for another of the same job (an edge of the cycle check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Why {
    /// It reads this file the other writes.
    File(FileId),
    /// Its `deps` name the other.
    Dep,
}

impl Scheduler {
    /// Works out what the `deps` of job `id` (just inserted) wait for: waits on tasks of the
    /// same job go to `inner` (for the cycle check, then to `links`), those on other jobs'
    /// unfinished tasks to `links`. Refuses what can never be met, naming the tasks.
    pub(super) fn plan_task_deps(
        &self,
        j: &Job,
        links: &mut Links,
        inner: &mut Vec<(TaskIndex, TaskIndex, Why)>,
    ) -> Result<(), SchedError> {
        let err = |s: String| Err(SchedError::Graph(s));
        for d in &j.spec.deps {
            let Some(index) = j.index_of(d.task) else {
                return err(format!(
                    "deps of task {}: the job has no task {}",
                    d.task, d.task
                ));
            };
            for r in &d.on {
                match r.job {
                    None => {
                        if r.task == d.task {
                            return err(format!("task {} depends on itself", d.task));
                        }
                        let Some(on) = j.index_of(r.task) else {
                            return err(format!(
                                "task {} depends on task {}, which the job does not have",
                                d.task, r.task
                            ));
                        };
                        inner.push((index, on, Why::Dep));
                    }
                    Some(other) => {
                        let key = self.dep_on_other(j, d.task, other, r.task)?;
                        if let Some(key) = key {
                            links.joined.push(other);
                            links.task_waits.push((index, key));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Task `task` of job `j` depends on task `on` of job `other`: the task to wait for, or
    /// `None` if it has finished already.
    fn dep_on_other(
        &self,
        j: &Job,
        task: u32,
        other: JobId,
        on: u32,
    ) -> Result<Option<TaskKey>, SchedError> {
        let err = |s: String| Err(SchedError::Graph(s));
        let Some(dep) = self.jobs.get(&other).filter(|_| other != j.id) else {
            return err(format!(
                "task {task} depends on task {other}:{on}, but job {other} does not exist; `kestrel job list` shows the jobs"
            ));
        };
        let Some(index) = dep.index_of(on) else {
            return err(format!(
                "task {task} depends on task {other}:{on}, but job {other} has no task {on}"
            ));
        };
        match dep.record(index).state {
            TaskState::Finished => Ok(None),
            s if s.is_terminal() => err(format!(
                "task {task} depends on task {other}:{on}, which has {s}, so it could never start; `kestrel job retry {other}` first"
            )),
            _ => Ok(Some((other, index))),
        }
    }

    /// The text of one edge of a cycle of job `j`'s tasks: `task 3 waits for task 1` or
    /// `task 3 reads F written by task 1`.
    pub(super) fn edge_text(
        &self,
        j: &Job,
        reader: TaskIndex,
        writer: TaskIndex,
        why: Why,
    ) -> String {
        match why {
            Why::File(file) => format!(
                "task {} reads {} written by task {}",
                self.task_name_of(j, reader),
                self.file_name(file),
                self.task_name_of(j, writer)
            ),
            Why::Dep => format!(
                "task {} depends on task {}",
                self.task_name_of(j, reader),
                self.task_name_of(j, writer)
            ),
        }
    }
}

impl Scheduler {
    /// The tasks that `on` (a task's `deps`, in job `job`) names and that the server still
    /// holds, with their states: a producer forgotten since had finished, and was waited for
    /// when it did.
    pub(in crate::sched) fn producers<'a>(
        &'a self,
        job: JobId,
        on: &'a [crate::spec::TaskRef],
    ) -> impl Iterator<Item = (TaskKey, TaskState)> + 'a {
        on.iter().filter_map(move |r| {
            let on = r.job.unwrap_or(job);
            let pj = self.jobs.get(&on)?;
            let p = pj.index_of(r.task)?;
            Some(((on, p), pj.record(p).state))
        })
    }

    /// Job `job` was retried: its tasks queued again whose `deps` have not all finished (a
    /// producer that failed is retried with them, or still ended badly elsewhere) wait for
    /// them again, as at submission, instead of running before them.
    pub(in crate::sched) fn rewait_task_deps(&mut self, now_us: u64, job: JobId) {
        let Some(j) = self.jobs.get(&job).filter(|j| !j.spec.deps.is_empty()) else {
            return;
        };
        // (waiting index, producer) for each dependency a queued task has not seen finish.
        let mut waits: Vec<(TaskIndex, TaskKey)> = Vec::new();
        let mut lost: Vec<(TaskIndex, TaskKey)> = Vec::new();
        for d in &j.spec.deps {
            let Some(index) = j.index_of(d.task) else {
                continue;
            };
            // Waiting ones too: a task put back waiting for its inputs or its job's `after`
            // must wait for its `deps` as well (one wait per producer, registered once).
            if !matches!(
                j.table.get(index).state,
                TaskState::Ready | TaskState::Waiting
            ) {
                continue;
            }
            for (by, state) in self.producers(job, &d.on) {
                match state {
                    TaskState::Finished => {}
                    s if s.is_terminal() => lost.push((index, by)),
                    _ => waits.push((index, by)),
                }
            }
        }
        for &(index, by) in &waits {
            let w = self.graph.waiters.entry(by).or_default();
            if w.iter().any(|x| x.waiting_task() == Some((job, index))) {
                continue;
            }
            w.push(super::Waiter::Task((job, index)));
            if let Some(pj) = self.jobs.get_mut(&by.0) {
                pj.feeds = true;
            }
            let Some(j) = self.jobs.get_mut(&job) else {
                return;
            };
            *j.unmet.entry(index).or_default() += 1;
            if j.table.get(index).state == TaskState::Ready {
                // Its queue entry is passed over when reached (it no longer reads ready).
                j.set_state(index, TaskState::Waiting);
            }
        }
        // A producer that ended badly and was not retried: its dependents cannot run.
        for (index, by) in lost {
            let Some(j) = self.jobs.get_mut(&job) else {
                return;
            };
            if j.table.get(index).state == TaskState::Ready {
                j.set_state(index, TaskState::Waiting);
            }
            let producer = self.task_name(by);
            let verb = match self.jobs.get(&by.0).map(|o| o.record(by.1).state) {
                Some(TaskState::Failed) => "failed",
                _ => "was canceled",
            };
            if self.cancel_waiting(
                now_us,
                (job, index),
                format!("deps: task {producer} {verb}"),
            ) {
                self.graph_cascade(now_us, vec![(job, index)]);
            }
        }
    }
}
