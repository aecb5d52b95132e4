//! A workflow's graph as data (`kestrel job graph`): its jobs, and the edges between their
//! tasks through files, `after` and parent tasks.

use super::TaskKey;
use crate::files::FileId;
use crate::sched::Scheduler;
use crate::spec::{JobId, TaskIndex};
use rustc_hash::FxHashMap;

/// The jobs of one workflow and what joins them, derived from the jobs' files and specs (so
/// it is whole after the workflow has ended and its intermediates are deleted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkflowGraph {
    /// The workflow's jobs, in id order.
    pub jobs: Vec<JobId>,
    /// Writer task → reader task, through a file (named as in caches, `KEY/name`).
    pub files: Vec<(TaskKey, TaskKey, FileId)>,
    /// A job waits for all of another (`after = [JOB]`): (the other, the job).
    pub after_jobs: Vec<(JobId, JobId)>,
    /// A job waits for some tasks of another (`after = ["JOB:TASKS"]`): (task, the job).
    pub after_tasks: Vec<(TaskKey, JobId)>,
    /// A task submitted a job: (the task, the job).
    pub parents: Vec<(TaskKey, JobId)>,
    /// A task waits for another by its `deps`: (the other, the task).
    pub deps: Vec<(TaskKey, TaskKey)>,
}

impl Scheduler {
    /// The workflow `job` belongs to (a job in no graph is a workflow of its own).
    pub fn workflow_graph(&self, job: JobId) -> Option<WorkflowGraph> {
        self.jobs.get(&job)?;
        let root = self.graph.root(job);
        let mut g = WorkflowGraph {
            jobs: self
                .jobs
                .keys()
                .copied()
                .filter(|&j| self.graph.root(j) == root)
                .collect(),
            ..WorkflowGraph::default()
        };
        g.jobs.sort_unstable();
        let mut writer: FxHashMap<FileId, TaskKey> = FxHashMap::default();
        for &id in &g.jobs {
            let j = &self.jobs[&id];
            let per = j.spec.template.files.outputs.len().max(1);
            for (i, &f) in j.outputs.iter().enumerate() {
                writer.insert(f, (id, (i / per) as TaskIndex));
            }
        }
        for &id in &g.jobs {
            let j = &self.jobs[&id];
            if j.inputs_per_task() > 0 && !writer.is_empty() {
                for index in 0..j.len() {
                    for f in j.inputs_of(index) {
                        if let Some(&w) = writer.get(f) {
                            g.files.push((w, (id, index), *f));
                        }
                    }
                }
            }
            for a in &j.spec.after {
                let Some(dep) = self.jobs.get(&a.job) else {
                    continue;
                };
                match &a.tasks {
                    None => g.after_jobs.push((a.job, id)),
                    Some(ids) => {
                        for k in 0..ids.len() {
                            if let Some(index) = ids.id_at(k).and_then(|t| dep.index_of(t)) {
                                g.after_tasks.push(((a.job, index), id));
                            }
                        }
                    }
                }
            }
            if let Some(p) = j.parent {
                g.parents.push((p, id));
            }
            for d in &j.spec.deps {
                let Some(index) = j.index_of(d.task) else {
                    continue;
                };
                for r in &d.on {
                    let on = r.job.unwrap_or(id);
                    if let Some(k) = self.jobs.get(&on).and_then(|o| o.index_of(r.task)) {
                        g.deps.push(((on, k), (id, index)));
                    }
                }
            }
        }
        Some(g)
    }
}
