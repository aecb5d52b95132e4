//! Workers that left: a bounded history of when and why, for `worker list --all` and
//! `worker info`.

use kestrel_core::{WorkerId, MAX_DEPARTED};
use kestrel_proto::messages::DepartedWorker;
use std::collections::VecDeque;

/// The last [`MAX_DEPARTED`] departures, the earliest first: a long run of allocations
/// leaves a bounded trace, not one that grows with every worker ever seen.
#[derive(Default)]
pub(super) struct Departures {
    kept: VecDeque<DepartedWorker>,
}

impl Departures {
    /// Records a worker that left.
    pub(super) fn left(&mut self, d: DepartedWorker) {
        self.returned(d.worker.id);
        self.kept.push_back(d);
        while self.kept.len() > MAX_DEPARTED {
            self.kept.pop_front();
        }
    }

    /// Worker `id` is connected again (it came back under its id): it is no longer departed.
    pub(super) fn returned(&mut self, id: WorkerId) {
        // At most MAX_DEPARTED entries, once per registration: no index needed.
        self.kept.retain(|d| d.worker.id != id);
    }

    /// The departure of worker `id`, if it is kept.
    pub(super) fn get(&self, id: WorkerId) -> Option<&DepartedWorker> {
        self.kept.iter().rev().find(|d| d.worker.id == id)
    }

    /// Every kept departure, the earliest first.
    pub(super) fn all(&self) -> Vec<DepartedWorker> {
        self.kept.iter().cloned().collect()
    }
}
