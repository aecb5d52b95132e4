//! Where to find the tasks a worker holds, without a set lookup per finished task.
//!
//! The task records are the truth: a task is held by worker `w` exactly when its record names
//! `w` and is `Assigned` or `Running`. A [`Ledger`] only lists, as runs of indices, every task
//! handed to the worker since it was last pruned, so that the worker's tasks can be found when
//! it is lost or a job is canceled. Finishing a task therefore touches nothing here (the caller
//! lowers a count); the ledger is pruned of ended tasks once it lists far more than the worker
//! holds, which costs O(1) per handed task amortized and walks the records in index order.
//!
//! A per-worker hash set did the same job, but with hundreds of workers each holding thousands
//! of tasks its random lookups missed the cache on every finished task (measured: half of
//! `Scheduler::task_finished`'s time with 200 workers).

use crate::outcome::IndexRun;
use crate::spec::{JobId, TaskIndex};

/// Runs listed beyond twice the held tasks before a prune is worth its walk.
const PRUNE_SLACK: u64 = 4096;

/// Tasks handed to one worker (a superset of those it holds).
#[derive(Debug, Default)]
pub struct Ledger {
    runs: Vec<IndexRun>,
    /// Tasks listed by `runs`, ended ones included.
    listed: u64,
}

impl Ledger {
    /// Notes a task handed to the worker.
    pub fn push(&mut self, job: JobId, index: TaskIndex) {
        self.push_run(IndexRun {
            job,
            first: index,
            count: 1,
        });
    }

    /// Notes a run of tasks handed to the worker; a run that continues the last one joins it.
    pub fn push_run(&mut self, run: IndexRun) {
        self.listed += u64::from(run.count);
        if let Some(r) = self.runs.last_mut() {
            if r.job == run.job && r.first.checked_add(r.count) == Some(run.first) {
                r.count += run.count;
                return;
            }
        }
        self.runs.push(run);
    }

    /// Whether the ledger lists so much more than the `held` tasks that it should be pruned.
    pub fn needs_pruning(&self, held: u32) -> bool {
        self.listed > 2 * u64::from(held) + PRUNE_SLACK
    }

    /// The listed tasks for which `holds` is true, each once, sorted.
    pub fn held(&self, holds: impl FnMut(JobId, TaskIndex) -> bool) -> Vec<(JobId, TaskIndex)> {
        self.held_of(|_| true, holds)
    }

    /// [`Self::held`] for the tasks of jobs for which `of_job` is true; `of_job` is asked once
    /// per listed run, so a ledger of jobs none of which qualify costs no walk of its tasks.
    pub fn held_of(
        &self,
        mut of_job: impl FnMut(JobId) -> bool,
        mut holds: impl FnMut(JobId, TaskIndex) -> bool,
    ) -> Vec<(JobId, TaskIndex)> {
        let mut out: Vec<_> = self
            .runs
            .iter()
            .filter(|r| of_job(r.job))
            .flat_map(|r| (r.first..r.first + r.count).map(move |i| (r.job, i)))
            .filter(|&(job, index)| holds(job, index))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Keeps only the listed tasks for which `holds` is true.
    pub fn prune(&mut self, holds: impl FnMut(JobId, TaskIndex) -> bool) {
        let kept = self.held(holds);
        self.runs.clear();
        self.listed = 0;
        for (job, index) in kept {
            self.push(job, index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_tasks_share_a_run_and_held_filters_and_dedups() {
        let mut l = Ledger::default();
        for i in 0..100 {
            l.push(1, i);
        }
        l.push(2, 7);
        l.push(1, 5); // handed again after a retry
        assert_eq!(l.runs.len(), 3);
        let held = l.held(|job, i| job == 2 || i % 50 == 5);
        assert_eq!(held, vec![(1, 5), (1, 55), (2, 7)]);
    }

    #[test]
    fn held_of_walks_only_the_runs_of_the_jobs_asked_for() {
        let mut l = Ledger::default();
        l.push_run(IndexRun {
            job: 1,
            first: 0,
            count: 1_000,
        });
        l.push(2, 3);
        l.push(2, 4);
        let mut walked = 0;
        let held = l.held_of(
            |job| job == 2,
            |_, _| {
                walked += 1;
                true
            },
        );
        assert_eq!(held, vec![(2, 3), (2, 4)]);
        assert_eq!(walked, 2, "job 1's thousand tasks are not walked");
    }

    #[test]
    fn pruning_keeps_exactly_the_held_tasks() {
        let mut l = Ledger::default();
        for i in 0..10_000 {
            l.push(3, i);
        }
        assert!(l.needs_pruning(100));
        assert!(!l.needs_pruning(5_000));
        l.prune(|_, i| i >= 9_900);
        assert_eq!(l.listed, 100);
        assert_eq!(l.runs.len(), 1);
        assert!(!l.needs_pruning(100));
        assert_eq!(l.held(|_, _| true).len(), 100);
    }
}
