//! The staging step between "assigned" and "launch": whatever must be on this worker before a
//! task may queue for a slot.
//!
//! The session hands every assigned run of tasks to [`Staging::stage`] before it queues the
//! run, so its executor never sees a task that staging has not passed. Today tasks read
//! nothing that Kestrel moves, and every run is ready at once: `stage` is an inlined function
//! that looks at nothing, with no allocation, clock read or await, once per run (not per task).
//!
//! Input files go here (data diffusion, peer transfers): `stage` will look each of a run's
//! inputs up in the worker's cache and start the fetches of those missing, and answer that the
//! run (or the part of it whose inputs are missing) waits. It then waits beside the queue,
//! holding no slot, until its fetches end, which the session's select loop hears of as it
//! hears of ended runs; revokes, cancels and a dropped connection take such tasks back like
//! queued ones. The prefetch window gives fetches the time a task spends queued.

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
