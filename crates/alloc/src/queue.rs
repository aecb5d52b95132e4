//! One allocation queue: its allocations, and the decisions of each tick.

use crate::allocation::{AllocId, AllocState, Allocation, Ending, WorkerId, WORKER_START_LIMIT_US};
use crate::params::{Micros, QueueParams};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A queue's number, unique in the server.
pub type QueueId = u32;

/// Work gone for this long cancels the allocations still waiting in the batch queue: a moment
/// between two stages of a workflow must not cancel what the next stage needs.
pub const WORK_GONE_GRACE_US: Micros = 5_000_000;

/// The first wait after a failed submission; it doubles with each failure in a row.
pub const FIRST_BACKOFF_US: Micros = 5_000_000;

/// The longest wait between failed submissions.
pub const MAX_BACKOFF_US: Micros = 300_000_000;

/// What waits for this queue's workers, as the server sees it at a tick.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// Tasks ready and not given to any worker that a worker of this queue could run.
    pub queued_tasks: u64,
    /// The slots those tasks hold.
    pub queued_slots: u64,
    /// Free slots of this queue's workers that take tasks (not draining).
    pub free_slots: u64,
    /// This queue's workers that run nothing, with since when.
    pub idle: Vec<(WorkerId, Micros)>,
    /// Slots of that work that other queues' free slots and waiting allocations will take
    /// (set by [`crate::Allocator::tick`]): not asked for again here.
    pub covered_elsewhere: u64,
}

/// What the allocator asks the backend or the server to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Journal allocation `alloc`, then submit it to the batch system with `nodes` nodes.
    Submit {
        queue: QueueId,
        alloc: AllocId,
        nodes: u32,
    },
    /// Cancel the batch job of `alloc`.
    Cancel { queue: QueueId, alloc: AllocId },
    /// Tell `workers`, all of `alloc`'s, to finish what they run and leave, together.
    Drain {
        queue: QueueId,
        alloc: AllocId,
        workers: Vec<WorkerId>,
    },
}

/// Why a queue makes no allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Paused {
    /// `kestrel alloc pause`.
    ByUser,
    /// It paused itself: why, for `alloc list`.
    Failing(String),
}

/// A queue's state.
#[derive(Clone, Debug)]
pub struct Queue {
    pub id: QueueId,
    pub params: QueueParams,
    pub allocations: BTreeMap<AllocId, Allocation>,
    pub paused: Option<Paused>,
    /// Requests made since work started to wait (the acquisition policy's `i`).
    round: u32,
    /// Failures in a row (submissions, or allocations that never brought a worker).
    failures: u32,
    /// No submission before this, after a failure.
    retry_at: Micros,
    /// Since when no work has waited.
    no_work_since: Option<Micros>,
    /// The last failure's message.
    pub last_error: Option<String>,
}

impl Queue {
    /// A new queue; nothing is asked before its first tick.
    pub fn new(id: QueueId, params: QueueParams) -> Queue {
        Queue {
            id,
            params,
            allocations: BTreeMap::new(),
            paused: None,
            round: 0,
            failures: 0,
            retry_at: 0,
            no_work_since: None,
            last_error: None,
        }
    }

    /// Allocations that have not ended.
    pub fn live(&self) -> impl Iterator<Item = &Allocation> {
        self.allocations.values().filter(|a| !a.state.is_ended())
    }

    /// Slots the workers still to come will bring at `now` (see [`Allocation::nodes_to_come`]).
    pub fn pending_slots(&self, now: Micros) -> u64 {
        self.live()
            .map(|a| u64::from(a.nodes_to_come(now)) * u64::from(self.params.slots_per_node))
            .sum()
    }

    /// The submit command answered with the batch system's id.
    pub fn submitted(&mut self, alloc: AllocId, batch_id: String) {
        if let Some(a) = self.allocations.get_mut(&alloc) {
            a.batch_id = Some(batch_id);
            if a.state == AllocState::Submitting {
                a.state = AllocState::Queued;
            }
        }
    }

    /// The submit command failed with `error`: counted; after `max_failures` in a row the
    /// queue pauses itself, and until then it waits longer after each.
    pub fn submit_failed(&mut self, now: Micros, alloc: AllocId, error: String) {
        if let Some(a) = self.allocations.get_mut(&alloc) {
            a.state = AllocState::Ended(Ending::SubmitFailed(error.clone()));
            a.ended_us = Some(now);
        }
        self.failed(
            now,
            format!("submitting allocation {alloc} failed: {error}"),
        );
    }

    /// The batch system says `alloc` has its nodes.
    pub fn started(&mut self, now: Micros, alloc: AllocId) {
        if let Some(a) = self.allocations.get_mut(&alloc) {
            if a.state.is_pending() {
                a.state = AllocState::Running;
            }
            a.started_us.get_or_insert(now);
        }
    }

    /// The batch system says `alloc` is over (`failed`: with this reason).
    pub fn ended(&mut self, now: Micros, alloc: AllocId, failed: Option<String>) {
        let Some(a) = self.allocations.get_mut(&alloc) else {
            return;
        };
        if a.state.is_ended() {
            return;
        }
        let canceling = a.state == AllocState::Canceling;
        let never_came = a.workers_seen == 0 && !canceling;
        a.ended_us = Some(now);
        a.workers.clear();
        a.state = AllocState::Ended(match failed {
            // Released after it ran: it did its work.
            _ if canceling && a.workers_seen > 0 => Ending::Finished,
            _ if canceling => match a.cancel_reason.clone() {
                Some(why) => Ending::Failed(why),
                None => Ending::Canceled,
            },
            Some(why) => Ending::Failed(why),
            None if never_came => Ending::Failed("ended before any worker of it connected".into()),
            None => Ending::Finished,
        });
        if never_came {
            let why = match &a.state {
                AllocState::Ended(Ending::Failed(why)) => why.clone(),
                _ => String::new(),
            };
            self.failed(
                now,
                format!("allocation {alloc} ended with no worker: {why}"),
            );
        }
    }

    /// A worker of `alloc` connected: the allocation runs, and the queue works. False (the
    /// worker is to leave) when the allocation is unknown, over, or being released or
    /// canceled: its workers were told to leave already, or the batch system will kill them.
    pub fn worker_joined(&mut self, now: Micros, alloc: AllocId, worker: WorkerId) -> bool {
        let Some(a) = self.allocations.get_mut(&alloc) else {
            return false;
        };
        if a.state.is_ended() || matches!(a.state, AllocState::Draining | AllocState::Canceling) {
            return false;
        }
        if a.state.is_pending() {
            a.state = AllocState::Running;
        }
        a.started_us.get_or_insert(now);
        if !a.workers.contains(&worker) {
            a.workers.push(worker);
            a.workers_seen += 1;
        }
        self.failures = 0;
        true
    }

    /// The server cancels `alloc` itself (it stops): over once the batch system says so, and
    /// not counted as a failure then.
    pub fn cancel(&mut self, alloc: AllocId) {
        if let Some(a) = self.allocations.get_mut(&alloc) {
            if !a.state.is_ended() {
                a.state = AllocState::Canceling;
            }
        }
    }

    /// A worker of `alloc` spent `cpu_us` CPU-microseconds running a task.
    pub fn task_ran(&mut self, alloc: AllocId, cpu_us: Micros) {
        if let Some(a) = self.allocations.get_mut(&alloc) {
            a.busy_cpu_us = a.busy_cpu_us.saturating_add(cpu_us);
        }
    }

    /// A worker of `alloc` left.
    pub fn worker_left(&mut self, alloc: AllocId, worker: WorkerId) {
        if let Some(a) = self.allocations.get_mut(&alloc) {
            a.workers.retain(|&w| w != worker);
        }
    }

    /// `kestrel alloc pause`.
    pub fn pause(&mut self) {
        self.paused = Some(Paused::ByUser);
    }

    /// `kestrel alloc resume`: failures are forgotten.
    pub fn resume(&mut self) {
        self.paused = None;
        self.failures = 0;
        self.retry_at = 0;
    }

    fn failed(&mut self, now: Micros, error: String) {
        self.failures += 1;
        let shift = (self.failures - 1).min(16);
        let wait = FIRST_BACKOFF_US
            .saturating_mul(1 << shift)
            .min(MAX_BACKOFF_US);
        self.retry_at = now.saturating_add(wait);
        if self.failures >= self.params.max_failures && self.paused.is_none() {
            self.paused = Some(Paused::Failing(format!(
                "{} failures in a row, the last: {error}; fix the cause, then `kestrel alloc resume {}`",
                self.failures, self.id
            )));
        }
        self.last_error = Some(error);
    }

    /// The decisions of one tick at `now`: at most one submission, cancels of allocations the
    /// work no longer needs, and idle allocations released whole. `next_alloc` numbers a new
    /// allocation (and is moved on when one is made).
    pub fn tick(&mut self, now: Micros, demand: &Demand, next_alloc: &mut AllocId) -> Vec<Action> {
        let mut out = Vec::new();
        self.give_up_on_silent(now, &mut out);
        self.release(now, demand, &mut out);
        self.cancel_unneeded(now, demand, &mut out);
        if let Some(a) = self.acquire(now, demand, *next_alloc) {
            *next_alloc += 1;
            out.push(a);
        }
        out
    }

    /// Allocations that run and none of whose workers connected within
    /// [`WORKER_START_LIMIT_US`] are canceled, as failures: their workers cannot start, or
    /// cannot reach the server.
    fn give_up_on_silent(&mut self, now: Micros, out: &mut Vec<Action>) {
        let queue = self.id;
        let mut failed = Vec::new();
        for a in self.allocations.values_mut() {
            if a.state == AllocState::Running && a.workers_seen == 0 && a.past_start_limit(now) {
                let why = format!(
                    "none of its workers connected within {} s of its start: they could not start, or could not reach the server; see `kestrel alloc log {queue} {}`",
                    WORKER_START_LIMIT_US / 1_000_000,
                    a.id
                );
                a.state = AllocState::Canceling;
                a.cancel_reason = Some(why.clone());
                out.push(Action::Cancel { queue, alloc: a.id });
                failed.push(format!("allocation {} canceled: {why}", a.id));
            }
        }
        for why in failed {
            self.failed(now, why);
        }
    }

    /// Distributed release (idle timeout), centralized release (few tasks waiting), and the
    /// cancel of a drained allocation once its workers are gone.
    fn release(&mut self, now: Micros, demand: &Demand, out: &mut Vec<Action>) {
        let queue = self.id;
        for a in self.allocations.values_mut() {
            if a.state == AllocState::Draining && a.workers.is_empty() {
                a.state = AllocState::Canceling;
                out.push(Action::Cancel { queue, alloc: a.id });
            }
        }
        let running = || {
            self.allocations
                .values()
                .any(|a| a.state == AllocState::Running)
        };
        if let Some(timeout) = self.params.idle_timeout_us.filter(|_| running()) {
            // Sorted once, so a tick with thousands of workers looks each up in O(log n).
            let mut idle = demand.idle.clone();
            idle.sort_unstable();
            let idle_since = |w: &WorkerId| {
                idle.binary_search_by_key(w, |&(i, _)| i)
                    .ok()
                    .map(|k| idle[k].1)
            };
            for a in self.allocations.values_mut() {
                let idle_long = |w: &WorkerId| {
                    idle_since(w).is_some_and(|since| now.saturating_sub(since) >= timeout)
                };
                if a.state == AllocState::Running
                    && !a.workers.is_empty()
                    && a.workers.iter().all(idle_long)
                {
                    a.state = AllocState::Draining;
                    out.push(Action::Drain {
                        queue,
                        alloc: a.id,
                        workers: a.workers.clone(),
                    });
                }
            }
        }
        let Some(q) = self.params.release_below else {
            return;
        };
        let draining = self
            .allocations
            .values()
            .any(|a| a.state == AllocState::Draining);
        // Not while the waiting work wants more than the free slots: the queue would ask for
        // nodes in the same tick as it gives some back.
        let wants_more =
            demand.queued_slots > demand.free_slots.saturating_add(demand.covered_elsewhere);
        if demand.queued_tasks >= q || draining || wants_more {
            return;
        }
        // The least busy goes first (the fewest of its workers running something: it gives
        // up the least), then the one with the least time left (it would leave soonest).
        let limit = self.params.time_limit_us;
        let idle: std::collections::HashSet<WorkerId> =
            demand.idle.iter().map(|&(w, _)| w).collect();
        let first = self
            .allocations
            .values_mut()
            .filter(|a| a.state == AllocState::Running && !a.workers.is_empty())
            .min_by_key(|a| {
                let busy = a.workers.iter().filter(|w| !idle.contains(w)).count();
                (busy, a.ends_at(limit), a.id)
            });
        if let Some(a) = first {
            a.state = AllocState::Draining;
            out.push(Action::Drain {
                queue,
                alloc: a.id,
                workers: a.workers.clone(),
            });
        }
    }

    /// Allocations still in the batch queue are canceled once the work has been gone a moment.
    fn cancel_unneeded(&mut self, now: Micros, demand: &Demand, out: &mut Vec<Action>) {
        if demand.queued_slots > 0 {
            self.no_work_since = None;
            return;
        }
        let since = *self.no_work_since.get_or_insert(now);
        if now.saturating_sub(since) < WORK_GONE_GRACE_US {
            return;
        }
        let queue = self.id;
        for a in self.allocations.values_mut() {
            // One still being submitted is canceled once it has its batch id.
            if a.state == AllocState::Queued {
                a.state = AllocState::Canceling;
                out.push(Action::Cancel { queue, alloc: a.id });
            }
        }
    }

    /// The one submission of this tick, if the waiting work needs nodes that neither the
    /// workers nor the allocations already waiting will bring.
    fn acquire(&mut self, now: Micros, demand: &Demand, id: AllocId) -> Option<Action> {
        let p = &self.params;
        let want_slots = demand
            .queued_slots
            .saturating_sub(demand.free_slots)
            .saturating_sub(demand.covered_elsewhere);
        let pending: u64 = self.live().map(|a| u64::from(a.nodes_to_come(now))).sum();
        let need = want_slots
            .div_ceil(u64::from(p.slots_per_node))
            .saturating_sub(pending);
        if need == 0 {
            self.round = 0;
            return None;
        }
        if self.paused.is_some() || now < self.retry_at {
            return None;
        }
        let waiting = self.live().filter(|a| a.state.is_pending()).count() as u64;
        let holding = || self.allocations.values().filter(|a| a.holds_nodes());
        let live = holding().count() as u64;
        let live_nodes: u64 = holding().map(|a| u64::from(a.nodes)).sum();
        if waiting >= u64::from(p.backlog) || p.max_allocs.is_some_and(|m| live >= u64::from(m)) {
            return None;
        }
        let room = p
            .max_workers
            .map_or(u64::MAX, |m| u64::from(m).saturating_sub(live_nodes));
        let nodes = p
            .acquire
            .nodes(self.round, need)
            .min(u64::from(p.nodes))
            .min(room);
        if nodes == 0 {
            return None;
        }
        let nodes = nodes as u32;
        self.round = self.round.saturating_add(1);
        self.allocations.insert(id, Allocation::new(id, nodes, now));
        Some(Action::Submit {
            queue: self.id,
            alloc: id,
            nodes,
        })
    }
}
