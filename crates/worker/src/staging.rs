//! The staging step between "assigned" and "launch": whatever must be on this worker before a
//! task may queue for a slot.
//!
//! The session hands every assigned run of tasks to [`Staging::stage`] before it queues the
//! run, so its executor never sees a task that staging has not passed. Today tasks read
//! nothing that Kestrel moves, and every run is ready at once: `stage` is an inlined function
//! that looks at nothing, with no allocation, clock read or await, once per run (not per task).
//!
//! Input files: once a run of a job with files is queued, [`prefetch`] starts fetching its
//! tasks' inputs (`crate::prefetch`), so they come while the task waits in the prefetch
//! window; a slot that frees while the head's fetch is still under way takes a later task
//! whose inputs are here (`Local::prefer_staged`), and waits on the slot only when none is.

use crate::files::WorkerFiles;
use crate::local::Local;
use kestrel_core::IndexRun;
use kestrel_proto::messages::Assigned;

/// Brings assigned tasks' inputs to this worker. It outlives connections (it is part of
/// `WorkerState`), as the fetches and the cache it will keep must.
#[derive(Debug, Default)]
pub(crate) struct Staging {}

/// What staging made of an assigned run of tasks.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Staged {
    /// Everything its tasks need is here: they queue for a slot now.
    Ready,
}

impl Staging {
    /// Stages `run`, just assigned to this worker. Inlined: it runs once per assigned run on
    /// the dispatch path, and does nothing yet.
    #[inline]
    pub(crate) fn stage(&mut self, _run: &Assigned) -> Staged {
        Staged::Ready
    }
}

/// Starts fetching the inputs of `run`'s tasks, just queued in `local`, if their job declares
/// files (see `crate::prefetch`): they come while the slots run earlier tasks. A job without
/// files costs one lookup per run.
pub(crate) fn prefetch(local: &Local, files: &WorkerFiles, run: IndexRun) {
    let has_files = local
        .jobs
        .get(&run.job)
        .is_some_and(|d| !d.template.files.is_empty());
    if !has_files {
        return;
    }
    let indices = run.first..run.first.saturating_add(run.count);
    let queued = local.queue.iter().rev().take(run.count as usize);
    for task in queued.filter(|t| t.job == run.job && indices.contains(&t.index)) {
        if let Some(plan) = local.files_plan(task) {
            files.prefetch((task.job, task.index), plan);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::IndexRun;

    #[test]
    fn every_run_is_ready_at_once_while_tasks_read_no_files() {
        let mut staging = Staging::default();
        let run = Assigned::run(IndexRun {
            job: 1,
            first: 0,
            count: 1_000,
        });
        assert_eq!(staging.stage(&run), Staged::Ready);
    }
}
