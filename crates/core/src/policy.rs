//! Dispatch policies: where ready tasks go.
//!
//! The scheduler keeps the books (each worker's credit and resources, every task's state, the
//! ready queue); a [`DispatchPolicy`] only makes the choices. In each scheduling pass the
//! scheduler asks the policy in which order to serve the workers, then, worker by worker, walks
//! the ready queue from the front and offers the worker each span of ready tasks of one job
//! that it has room for; the policy says how many of them it takes. Spans it takes none of are
//! left for the next worker; after [`DispatchPolicy::window`] such spans the walk ends, so a
//! pass never costs O(queue).
//!
//! [`FirstAvailable`] is today's policy: workers in turn, each filled from the front of the
//! queue. A data-aware policy (most cache hits) plugs in here: it orders workers and declines
//! spans whose inputs another worker holds, looking down the window for tasks whose inputs
//! this worker holds.

use crate::spec::{JobId, TaskIndex, WorkerId};
use std::fmt;

/// Ready tasks offered to a worker: the next `len` ready tasks of `job`, indices `first..`,
/// of which the worker has room (credit and resources) for `room`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    /// The worker being filled.
    pub worker: WorkerId,
    /// The job whose tasks are offered.
    pub job: JobId,
    /// The first offered task.
    pub first: TaskIndex,
    /// How many tasks the span holds, from `first` on.
    pub len: u32,
    /// How many of them the worker can take now (at least 1).
    pub room: u32,
}

/// The choices of dispatch. Called by the scheduler once per pass and once per span offered,
/// never per task, so a policy object behind a `Box` costs nothing measurable.
pub trait DispatchPolicy: fmt::Debug + Send {
    /// Puts `workers` (every worker, in id order) in the order one pass serves them: the
    /// first gets first pick of the queue.
    fn order_workers(&mut self, workers: &mut [WorkerId]);

    /// How many spans that a worker takes nothing of (it has no room for their shape, or the
    /// policy declined them) one walk of the queue may look past.
    fn window(&self) -> usize;

    /// How many of the offered tasks the worker takes, from the front of the span: 0 leaves
    /// them all for another worker, and more than `offer.room` counts as `offer.room`.
    fn take(&mut self, offer: &Offer) -> u32;

    /// Whether idle workers may ask busy ones for tasks still waiting there for a slot (work
    /// stealing). A policy that keeps tasks where it placed them says no: the tasks taken back
    /// would go to the queue, be declined for the idle worker, and go back where they were,
    /// pass after pass.
    fn steals(&self) -> bool {
        true
    }
}

/// Today's policy: the workers in turn, each pass starting from the next worker id so none is
/// always served last, each filling its room from the front of the queue.
#[derive(Clone, Debug)]
pub struct FirstAvailable {
    window: usize,
    /// The pass starts from the first worker with this id or above (then wraps around).
    rotate: WorkerId,
}

impl FirstAvailable {
    /// Looks past at most `window` spans that fit no worker.
    pub fn new(window: usize) -> FirstAvailable {
        FirstAvailable { window, rotate: 0 }
    }
}

impl DispatchPolicy for FirstAvailable {
    fn order_workers(&mut self, workers: &mut [WorkerId]) {
        let start = workers.partition_point(|&w| w < self.rotate);
        workers.rotate_left(start);
        self.rotate = self.rotate.wrapping_add(1);
    }

    fn window(&self) -> usize {
        self.window
    }

    fn take(&mut self, offer: &Offer) -> u32 {
        offer.room
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_available_takes_all_it_has_room_for() {
        let mut p = FirstAvailable::new(8);
        let offer = Offer {
            worker: 1,
            job: 1,
            first: 0,
            len: 100,
            room: 7,
        };
        assert_eq!(p.take(&offer), 7);
        assert_eq!(p.window(), 8);
    }

    #[test]
    fn first_available_starts_each_pass_from_the_next_worker_id() {
        let mut p = FirstAvailable::new(8);
        let mut firsts = Vec::new();
        for _ in 0..6 {
            let mut w = vec![1, 2, 4];
            p.order_workers(&mut w);
            firsts.push(w[0]);
            let mut sorted = w.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![1, 2, 4], "every worker, once");
        }
        // Passes start at ids 0, 1, 2, 3, 4, 5: the first worker at or above, else the first.
        assert_eq!(firsts, vec![1, 1, 2, 4, 4, 1]);
    }
}
