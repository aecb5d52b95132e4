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
//! [`FirstAvailable`] is the default: workers in turn, each filled from the front of the
//! queue. The other four of Falkon's policies (dissertation §6.2.3) place tasks that read
//! files: [`FirstCacheAvailable`] places them as first-available does and tells workers where
//! peers cache the inputs; [`MaxCacheHit`], [`MaxComputeUtil`] and [`GoodCacheCompute`] are
//! data-aware ([`DispatchPolicy::data_aware`]): their jobs' tasks go through the scheduling
//! window ([`crate::window`]), where each decision asks [`DispatchPolicy::accepts`] whether a
//! worker may take a task given how much of its data the worker holds. Tasks without inputs
//! are placed first-available whatever the policy, at first-available's cost.

use crate::files::Hits;
use crate::spec::{JobId, PolicyName, TaskIndex, WorkerId};
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

    /// Which of Falkon's policies this is.
    fn name(&self) -> PolicyName {
        PolicyName::FirstAvailable
    }

    /// Whether tasks that read files are placed by where their inputs are cached, through
    /// the scheduling window ([`crate::window`]); if not, they go by spans like any other.
    fn data_aware(&self) -> bool {
        self.name().data_aware()
    }

    /// Whether workers are told which peers cache a task's inputs.
    fn hints(&self) -> bool {
        self.name() != PolicyName::FirstAvailable
    }

    /// Whether a worker with room may take a task of which it holds `here` of the input data,
    /// when `best()` is the most any worker that could run it holds and `util` is the share
    /// of the cluster's cpus busy. Asked by data-aware placement only.
    fn accepts(&self, here: Hits, best: &dyn Fn() -> Hits, util: f64) -> bool {
        let _ = (here, best, util);
        true
    }
}

/// The policy named `name`, with good-cache-compute's utilisation threshold in thousandths,
/// looking past at most `window` spans that fit no worker.
pub fn by_name(
    name: PolicyName,
    util_threshold_permille: u16,
    window: usize,
) -> Box<dyn DispatchPolicy> {
    let fa = FirstAvailable::new(window);
    match name {
        PolicyName::FirstAvailable => Box::new(fa),
        PolicyName::FirstCacheAvailable => Box::new(FirstCacheAvailable(fa)),
        PolicyName::MaxCacheHit => Box::new(MaxCacheHit(fa)),
        PolicyName::MaxComputeUtil => Box::new(MaxComputeUtil(fa)),
        PolicyName::GoodCacheCompute => Box::new(GoodCacheCompute {
            order: fa,
            threshold: f64::from(util_threshold_permille.min(1000)) / 1000.0,
        }),
    }
}

/// Good-cache-compute's threshold unless told otherwise: 0.9, as in the dissertation's
/// workloads.
pub const DEFAULT_UTIL_THRESHOLD_PERMILLE: u16 = 900;

/// Workers, spans and stealing as first-available does: the part of the data policies that is
/// not about data.
macro_rules! first_available_order {
    ($field:tt) => {
        fn order_workers(&mut self, workers: &mut [WorkerId]) {
            self.$field.order_workers(workers)
        }
        fn window(&self) -> usize {
            self.$field.window()
        }
        fn take(&mut self, offer: &Offer) -> u32 {
            self.$field.take(offer)
        }
    };
}

/// First-cache-available: first-available's placement, with workers told where peers cache
/// the inputs (the dissertation names it without defining it; this is the reading of §6.4.3).
#[derive(Clone, Debug)]
pub struct FirstCacheAvailable(pub FirstAvailable);

impl DispatchPolicy for FirstCacheAvailable {
    first_available_order!(0);
    fn name(&self) -> PolicyName {
        PolicyName::FirstCacheAvailable
    }
}

/// Max-cache-hit: "dispatch each task to the executor with the largest amount of data needed
/// by that task. If that executor is busy, task dispatch is delayed until the executor becomes
/// available." A task nobody holds anything of goes to any worker.
#[derive(Clone, Debug)]
pub struct MaxCacheHit(pub FirstAvailable);

impl DispatchPolicy for MaxCacheHit {
    first_available_order!(0);
    fn name(&self) -> PolicyName {
        PolicyName::MaxCacheHit
    }
    fn steals(&self) -> bool {
        false
    }
    fn accepts(&self, here: Hits, best: &dyn Fn() -> Hits, _util: f64) -> bool {
        here >= best()
    }
}

/// Max-compute-util: "sends a task to an available executor, preferring executors with the
/// most needed data locally." No task waits while a worker has room.
#[derive(Clone, Debug)]
pub struct MaxComputeUtil(pub FirstAvailable);

impl DispatchPolicy for MaxComputeUtil {
    first_available_order!(0);
    fn name(&self) -> PolicyName {
        PolicyName::MaxComputeUtil
    }
}

/// Good-cache-compute: max-cache-hit while the share of busy cpus is at or above `threshold`,
/// max-compute-util below it.
#[derive(Clone, Debug)]
pub struct GoodCacheCompute {
    /// Workers and spans as first-available.
    pub order: FirstAvailable,
    /// The share of busy cpus from which tasks wait for their data's holder.
    pub threshold: f64,
}

impl DispatchPolicy for GoodCacheCompute {
    first_available_order!(order);
    fn name(&self) -> PolicyName {
        PolicyName::GoodCacheCompute
    }
    fn steals(&self) -> bool {
        false
    }
    fn accepts(&self, here: Hits, best: &dyn Fn() -> Hits, util: f64) -> bool {
        util < self.threshold || here >= best()
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
    fn the_data_policies_accept_as_the_dissertation_defines_them() {
        let none = Hits::default();
        let some = Hits {
            bytes: 10,
            files: 1,
        };
        let more = Hits {
            bytes: 30,
            files: 2,
        };
        let p = |n| by_name(n, 900, 8);
        // Max-cache-hit: only the best holder, or anyone when nobody holds anything.
        let mch = p(PolicyName::MaxCacheHit);
        assert!(mch.accepts(more, &|| more, 0.0));
        assert!(!mch.accepts(some, &|| more, 0.0));
        assert!(mch.accepts(none, &|| none, 1.0));
        assert!(!mch.accepts(none, &|| some, 0.0));
        // Max-compute-util: anyone with room.
        let mcu = p(PolicyName::MaxComputeUtil);
        assert!(mcu.accepts(none, &|| more, 1.0));
        // Good-cache-compute: max-compute-util below the threshold, max-cache-hit at it.
        let gcc = p(PolicyName::GoodCacheCompute);
        assert!(gcc.accepts(none, &|| more, 0.89));
        assert!(!gcc.accepts(none, &|| more, 0.9));
        assert!(gcc.accepts(more, &|| more, 0.95));
        // Which place by data, which tell where data is, which steal.
        let kinds: Vec<_> = PolicyName::ALL
            .into_iter()
            .map(|n| {
                let b = p(n);
                assert_eq!(b.name(), n);
                (b.data_aware(), b.hints(), b.steals())
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                (false, false, true),
                (false, true, true),
                (true, true, false),
                (true, true, true),
                (true, true, false)
            ]
        );
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
