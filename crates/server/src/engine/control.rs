//! Workers under the user's control: stopping them (`kestrel worker stop`, a worker's own
//! SIGTERM, released allocations), the record of those that left, and the answers that show
//! one worker or every worker, departed ones included.

use super::route::WorkerConn;
use super::Engine;
use crate::views;
use kestrel_core::{Event, WorkerId};
use kestrel_proto::messages::{
    DepartedWorker, Refusal, StopResult, ToWorker, WorkerDetail, WorkerListing, WorkerRow,
};

impl Engine {
    /// Records that worker `worker` left (its connection `c` is dropped for good) and why;
    /// its allocation learns it too. The scheduler is told apart (before or after: the row
    /// comes from the worker, or from what the scheduler keeps of it once it is gone).
    pub(super) fn depart(&mut self, now: u64, worker: WorkerId, c: WorkerConn, reason: String) {
        let alloc = self.provision.origin_of(worker);
        self.provision.worker_left(now, worker);
        let row = self.row_of(worker, Some(&c), alloc);
        if let Some(worker) = row {
            self.departures.left(DepartedWorker {
                worker,
                left_us: now,
                reason,
            });
        }
        self.leaving.remove(&worker);
    }

    /// Worker `worker` as a row of `worker list`, connected (through `c`) or departed.
    fn row_of(
        &self,
        worker: WorkerId,
        c: Option<&WorkerConn>,
        alloc: Option<(u32, u32)>,
    ) -> Option<WorkerRow> {
        let address = c.map(|c| c.peer.to_string()).unwrap_or_default();
        let exec = c.map(|c| c.exec.clone()).unwrap_or_default();
        let cache = c
            .and_then(|c| c.cache_capacity)
            .map(|capacity| (self.core.files().cached_bytes(worker), capacity));
        if let Some(w) = self.core.worker(worker) {
            return Some(views::worker_row(w, address, exec, cache, alloc));
        }
        let d = self.core.departed(worker)?;
        Some(views::departed_row(worker, d, address, exec, cache, alloc))
    }

    /// The connected workers, in id order.
    pub(super) fn worker_rows(&self) -> Vec<WorkerRow> {
        self.core
            .workers()
            .filter_map(|w| {
                let c = self.conns.workers.get(&w.id);
                self.row_of(w.id, c, self.provision.origin_of(w.id))
            })
            .collect()
    }

    /// The connected workers and, with `departed`, those that left lately.
    pub(super) fn worker_listing(&self, departed: bool) -> WorkerListing {
        let mut stopping: Vec<(WorkerId, String)> = self
            .leaving
            .iter()
            .map(|(&w, why)| (w, why.clone()))
            .collect();
        stopping.sort_unstable();
        WorkerListing {
            workers: self.worker_rows(),
            stopping,
            departed: if departed {
                self.departures.all()
            } else {
                Vec::new()
            },
        }
    }

    /// Worker `worker` in full, connected or departed.
    pub(super) fn worker_detail(&self, worker: WorkerId) -> Result<WorkerDetail, Refusal> {
        if let Some(w) = self.core.worker(worker) {
            let c = self.conns.workers.get(&worker);
            let row = self
                .row_of(worker, c, self.provision.origin_of(worker))
                .ok_or_else(|| no_such_worker(worker))?;
            return Ok(WorkerDetail {
                worker: row,
                tasks: views::held_tasks(&self.core, worker),
                stopping: self.leaving.get(&worker).cloned(),
                // A stopping worker's end is the stop, not its allocation's.
                ends_at_us: w.ends_at_us.filter(|_| !self.leaving.contains_key(&worker)),
                left: None,
            });
        }
        let d = self
            .departures
            .get(worker)
            .ok_or_else(|| no_such_worker(worker))?;
        Ok(WorkerDetail {
            worker: d.worker.clone(),
            tasks: Vec::new(),
            stopping: None,
            ends_at_us: None,
            left: Some((d.left_us, d.reason.clone())),
        })
    }

    /// Stops worker `worker` for `reason`: it takes no new task and what waits there for a
    /// slot goes back to the queue; it finishes what it runs and is then told to leave.
    /// With `now` it is told to leave at once (it kills its tasks), and its tasks go back to
    /// the queue without counting a crash or spending a retry. Returns the tasks it held
    /// (stopped at once) or that it goes on to finish (draining: not those asked back).
    pub(super) fn stop_worker(
        &mut self,
        now: u64,
        worker: WorkerId,
        at_once: bool,
        reason: String,
    ) -> Result<u32, Refusal> {
        let Some(w) = self.core.worker(worker) else {
            return Err(match self.departures.get(worker) {
                Some(d) => format!("worker {worker} has left already: {}", d.reason).into(),
                None => no_such_worker(worker),
            });
        };
        let held = w.outstanding() as u32;
        if at_once {
            tracing::info!(worker, held, "worker stopped at once: {reason}");
            if let Some(c) = self.conns.workers.remove(&worker) {
                c.outbox.send(&ToWorker::Shutdown {
                    reason: reason.clone(),
                });
                // The row is taken while the scheduler still holds the worker.
                self.depart(now, worker, c, reason);
            }
            self.event(now, Event::WorkerDismissed { worker });
            return Ok(held);
        }
        tracing::info!(worker, held, "worker stopping: {reason}");
        // As if its allocation ended now: no new task, and what waits there goes back.
        // What waits there for a slot (its cpus' worth beyond its slots, of tasks not started)
        // is asked back by the scheduling pass: not finished there.
        let mut beyond = w.waiting_cpus();
        let mut waiting = 0u32;
        if beyond > 0 {
            for (job, _, state) in self.core.tasks_of(worker, usize::MAX) {
                let cpus = self.core.job(job).map_or(1, |j| j.need.cpus.max(1));
                if state == kestrel_core::TaskState::Assigned && cpus <= beyond {
                    beyond -= cpus;
                    waiting += 1;
                }
            }
        }
        let finishing = held.saturating_sub(waiting);
        self.event(now, Event::WorkerEnds { worker, at_us: now });
        self.leaving.insert(worker, reason);
        self.send_off_drained();
        Ok(finishing)
    }

    /// `kestrel worker stop`: each of `workers` (every connected one with `all`).
    pub(super) fn stop_workers(
        &mut self,
        now: u64,
        workers: Vec<WorkerId>,
        all: bool,
        at_once: bool,
    ) -> Vec<StopResult> {
        let workers = if all {
            self.core.workers().map(|w| w.id).collect()
        } else {
            workers
        };
        let reason = if at_once {
            "stopped at once by `kestrel worker stop --now`; its tasks went back to the queue"
        } else {
            "stopped by `kestrel worker stop`"
        };
        workers
            .into_iter()
            .map(|worker| StopResult {
                worker,
                result: self.stop_worker(now, worker, at_once, reason.to_string()),
            })
            .collect()
    }

    /// Tells the workers that are to leave and run nothing any more to go (an idle one at
    /// once, with the rest of its allocation); their departure is recorded with the reason
    /// when their connection closes.
    pub(super) fn send_off_drained(&mut self) {
        let core = &self.core;
        let conns = &mut self.conns;
        self.leaving.retain(|&worker, reason| {
            let Some(w) = core.worker(worker) else {
                return false;
            };
            if w.outstanding() > 0 {
                return true;
            }
            if let Some(c) = conns.workers.get_mut(&worker) {
                c.outbox.send(&ToWorker::Shutdown {
                    reason: reason.clone(),
                });
                c.farewell = Some(format!("{reason}, once its tasks were done"));
            }
            false
        });
    }
}

/// The refusal for a worker the server neither has nor remembers.
fn no_such_worker(worker: WorkerId) -> Refusal {
    Refusal::not_found(format!(
        "worker {worker} is not connected and not among those that left lately; `kestrel worker list --all` shows them"
    ))
}
