//! Provisioning as a pure state machine (DESIGN.md "Provisioning"; Falkon §5.2).
//!
//! An [`Allocator`] holds allocation queues. Each tick it is given, per queue, the work that
//! waits for that queue's workers ([`Demand`]) and the time, and it answers with [`Action`]s:
//! submit an allocation of n nodes, cancel an allocation, drain an allocation's workers. What
//! the batch system and the workers do comes back as events (`submitted`, `started`, `ended`,
//! `worker_joined`, ...). Nothing here runs a command, reads a clock or touches a socket, so
//! every decision is a unit test in virtual time, and a simulator can drive it.
//!
//! The policies:
//! - acquisition ([`Acquire`]): the i-th request since work started to wait asks for 1, i,
//!   2^(i-1) or all the nodes the work needs, never more than the queue's `--nodes`;
//! - at most one submission per queue per tick, at most `backlog` allocations waiting in the
//!   batch queue, and `max_allocs`/`max_workers` bounds;
//! - distributed release: an allocation whose workers have all been idle for the idle timeout
//!   is drained whole, never worker by worker; centralized release: while fewer than q tasks
//!   wait, one allocation a tick is drained;
//! - allocations still in the batch queue are canceled once the work has been gone for
//!   [`WORK_GONE_GRACE_US`];
//! - failed submissions (and allocations that end before any worker of theirs connects) back
//!   off exponentially and, after `max_failures` in a row, pause the queue with the reason.
//!
//! [`backend`] holds what Slurm and PBS are told and answer, as text (pilot scripts, command
//! lines, parsers): running the commands is the server's.

mod allocation;
pub mod backend;
mod params;
mod queue;

pub use allocation::{AllocId, AllocState, Allocation, Ending, WorkerId, WORKER_START_LIMIT_US};
pub use params::{local_slots, Acquire, Micros, ParamsError, QueueParams};
pub use queue::{
    Action, Demand, Paused, Queue, QueueId, FIRST_BACKOFF_US, MAX_BACKOFF_US, WORK_GONE_GRACE_US,
};

use std::collections::BTreeMap;

/// The queues of one server.
#[derive(Clone, Debug, Default)]
pub struct Allocator {
    queues: BTreeMap<QueueId, Queue>,
    next_queue: QueueId,
    next_alloc: AllocId,
}

impl Allocator {
    /// No queues.
    pub fn new() -> Allocator {
        Allocator {
            queues: BTreeMap::new(),
            next_queue: 1,
            next_alloc: 1,
        }
    }

    /// Adds a queue; its id.
    pub fn add_queue(&mut self, params: QueueParams) -> Result<QueueId, ParamsError> {
        params.check()?;
        let id = self.next_queue;
        self.next_queue += 1;
        self.queues.insert(id, Queue::new(id, params));
        Ok(id)
    }

    /// Puts back queue `id` as an earlier run of the server left it (kept in its journal) at
    /// `now`: its allocations as they were, with none of their workers connected yet (those
    /// that still run connect again, and have as long as a new allocation's to do so). Ids
    /// given out later stay above every id restored.
    pub fn restore_queue(
        &mut self,
        now: Micros,
        id: QueueId,
        params: QueueParams,
        paused: Option<Paused>,
        allocations: Vec<Allocation>,
    ) -> Result<(), ParamsError> {
        params.check()?;
        let mut q = Queue::new(id, params);
        q.paused = paused;
        for mut a in allocations {
            a.workers.clear();
            a.restored_us = now;
            self.next_alloc = self.next_alloc.max(a.id.saturating_add(1));
            q.allocations.insert(a.id, a);
        }
        self.next_queue = self.next_queue.max(id.saturating_add(1));
        self.queues.insert(id, q);
        Ok(())
    }

    /// The ids the next queue and the next allocation will get: kept with the queues, so that
    /// a restarted server never gives out an id twice (a batch job is found by its name).
    pub fn next_ids(&self) -> (QueueId, AllocId) {
        (self.next_queue, self.next_alloc)
    }

    /// Ids below these are not given out again (see [`Allocator::next_ids`]).
    pub fn skip_ids(&mut self, next_queue: QueueId, next_alloc: AllocId) {
        self.next_queue = self.next_queue.max(next_queue);
        self.next_alloc = self.next_alloc.max(next_alloc);
    }

    /// The queue `id`.
    pub fn queue(&self, id: QueueId) -> Option<&Queue> {
        self.queues.get(&id)
    }

    /// The queue `id`, to tell it what happened.
    pub fn queue_mut(&mut self, id: QueueId) -> Option<&mut Queue> {
        self.queues.get_mut(&id)
    }

    /// Every queue, by id.
    pub fn queues(&self) -> impl Iterator<Item = &Queue> {
        self.queues.values()
    }

    /// Removes queue `id` if none of its allocations is live, or (`force`) whatever they are;
    /// returns the cancels of its live allocations, or `None` if it had some and not `force`.
    pub fn remove_queue(&mut self, id: QueueId, force: bool) -> Option<Vec<Action>> {
        let q = self.queues.get(&id)?;
        let live: Vec<AllocId> = q.live().map(|a| a.id).collect();
        if !live.is_empty() && !force {
            return None;
        }
        self.queues.remove(&id);
        Some(
            live.into_iter()
                .map(|alloc| Action::Cancel { queue: id, alloc })
                .collect(),
        )
    }

    /// One tick of every queue at `now`; `demand` says what waits for each queue's workers.
    ///
    /// Several queues share the waiting work: each asks only for what the *other* queues do
    /// not cover with their free slots and the allocations they wait for (those decided earlier
    /// in this tick included), a queue's cover counting no more than the work it can take
    /// itself (its time limit may leave tasks out). So two queues never both ask for the same
    /// tasks, a queue does not ask again for what another's allocation will bring, and a later
    /// queue brings what an earlier one cannot (its limits reached, its backlog full). Queues
    /// decide in order of id.
    pub fn tick(&mut self, now: Micros, mut demand: impl FnMut(&Queue) -> Demand) -> Vec<Action> {
        let demands: Vec<Demand> = self.queues.values().map(&mut demand).collect();
        let cover = |q: &Queue, d: &Demand| {
            d.free_slots
                .saturating_add(q.pending_slots(now))
                .min(d.queued_slots)
        };
        let mut covers: Vec<u64> = self
            .queues
            .values()
            .zip(&demands)
            .map(|(q, d)| cover(q, d))
            .collect();
        let mut out = Vec::new();
        for (i, (q, mut d)) in self.queues.values_mut().zip(demands).enumerate() {
            let others: u64 = covers
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, c)| c)
                .sum();
            d.covered_elsewhere = others;
            out.extend(q.tick(now, &d, &mut self.next_alloc));
            covers[i] = cover(q, &d);
        }
        out
    }
}
