//! Allocation queues inside the server: the [`kestrel_alloc::Allocator`] decides, this module
//! tells it what the scheduler sees (ready work, its workers' free slots and idleness) and
//! carries out what it asks for with a backend: worker processes on this machine (`local`),
//! or Slurm and PBS through their commands, run off the engine's thread (`batch`). Queues are
//! not journaled yet (issue 14).

mod batch;
mod local;

use crate::outbox::ConnId;
use kestrel_alloc::backend::{pbs, BatchState};
use kestrel_alloc::{
    Acquire, Action, AllocId, AllocState, Allocator, Demand, Ending, Paused, QueueId, QueueParams,
    WorkerId,
};
use kestrel_core::Scheduler;
use kestrel_proto::messages::{AllocQueueSpec, AllocQueueView, AllocView, Answer, Refusal};
use rustc_hash::FxHashMap;
use std::path::PathBuf;

/// How often the allocator decides (in microseconds of the server's clock).
const TICK_US: u64 = 1_000_000;

/// What a drained worker is told when its allocation is released.
pub const RELEASED: &str = "its allocation was released";

/// The server's allocation queues and the processes and workers they brought.
pub struct Provision {
    allocator: Allocator,
    specs: FxHashMap<QueueId, AllocQueueSpec>,
    local: local::Local,
    batch: batch::Runner,
    /// Workers that came from an allocation: (queue, allocation).
    origin: FxHashMap<WorkerId, (QueueId, AllocId)>,
    /// Since when each worker of a queue has run nothing.
    idle_since: FxHashMap<WorkerId, u64>,
    /// Queues waiting for their dry run, with the `alloc add` request to answer.
    checking: FxHashMap<QueueId, (ConnId, u64)>,
    last_tick_us: u64,
}

/// What a tick asks the engine to send.
#[derive(Default)]
pub struct Sends {
    /// Workers to tell to leave (all of an allocation's at once), with why.
    pub drains: Vec<(WorkerId, String)>,
    /// Answers to `alloc add` that waited for the dry run: (connection, request, answer).
    pub replies: Replies,
}

/// Answers to send: (connection, request, answer).
pub type Replies = Vec<(ConnId, u64, Result<Answer, Refusal>)>;

/// How `alloc add` went.
pub enum Added {
    /// The queue is taken.
    Now(QueueId),
    /// A held test allocation checks it first; the answer comes with a later tick.
    Checking,
}

impl Provision {
    /// No queues yet; `access` is the access file local workers connect with.
    pub fn new(access: PathBuf, dir: PathBuf) -> Provision {
        Provision {
            allocator: Allocator::new(),
            specs: FxHashMap::default(),
            local: local::Local::new(access.clone(), dir.join("alloc")),
            batch: batch::Runner::new(access, dir.join("alloc")),
            origin: FxHashMap::default(),
            idle_since: FxHashMap::default(),
            checking: FxHashMap::default(),
            last_tick_us: 0,
        }
    }

    /// `kestrel alloc add` (request `asker`): checks the spec and adds the queue; a batch
    /// queue with a dry run is paused until its held test allocation was taken and canceled.
    pub fn add(&mut self, spec: AllocQueueSpec, asker: (ConnId, u64)) -> Result<Added, String> {
        if spec.backend != "local" && batch::System::named(&spec.backend).is_none() {
            return Err(format!(
                "no backend {:?}: local, slurm, pbs or torque",
                spec.backend
            ));
        }
        let acquire = Acquire::parse(&spec.acquire).ok_or_else(|| {
            format!(
                "--acquire {:?} is not one of one, additive, exponential, all",
                spec.acquire
            )
        })?;
        let params = QueueParams {
            nodes: spec.nodes,
            slots_per_node: spec.slots_per_node,
            time_limit_us: spec.time_limit_ms.saturating_mul(1000),
            max_allocs: spec.max_allocs,
            max_workers: spec.max_workers,
            backlog: spec.backlog,
            idle_timeout_us: spec.idle_timeout_ms.map(|ms| ms.saturating_mul(1000)),
            release_below: None,
            acquire,
            max_failures: QueueParams::new(0, 1).max_failures,
        };
        let id = self
            .allocator
            .add_queue(params)
            .map_err(|e| e.to_string())?;
        let system = batch::System::named(&spec.backend).filter(|_| spec.dry_run);
        if let Some(system) = system {
            if let Some(q) = self.allocator.queue_mut(id) {
                q.paused = Some(Paused::Failing(
                    "being checked with a held test allocation".into(),
                ));
            }
            self.batch.dry_run(system, id, &spec);
            self.checking.insert(id, asker);
            self.specs.insert(id, spec);
            // Its answer is looked for at the next tick.
            self.last_tick_us = 0;
            return Ok(Added::Checking);
        }
        tracing::info!(queue = id, backend = %spec.backend, "allocation queue added");
        self.specs.insert(id, spec);
        Ok(Added::Now(id))
    }

    /// `kestrel alloc pause|resume`.
    pub fn pause(&mut self, queue: QueueId, paused: bool) -> Result<(), String> {
        let q = self
            .allocator
            .queue_mut(queue)
            .ok_or_else(|| no_queue(queue))?;
        if paused {
            q.pause();
        } else {
            q.resume();
        }
        Ok(())
    }

    /// `kestrel alloc remove`: its live allocations are canceled (with `force`).
    pub fn remove(&mut self, queue: QueueId, force: bool) -> Result<(), String> {
        let Some(q) = self.allocator.queue(queue) else {
            return Err(no_queue(queue));
        };
        let ids: Vec<String> = q.live().filter_map(|a| a.batch_id.clone()).collect();
        let Some(cancels) = self.allocator.remove_queue(queue, force) else {
            return Err(format!(
                "queue {queue} has allocations that have not ended; `kestrel alloc remove {queue} --force` cancels them"
            ));
        };
        let system = self
            .specs
            .get(&queue)
            .and_then(|s| batch::System::named(&s.backend));
        match system {
            Some(system) => self.batch.cancel(system, ids),
            None => {
                for a in cancels {
                    if let Action::Cancel { alloc, .. } = a {
                        self.local.cancel(alloc);
                    }
                }
            }
        }
        self.specs.remove(&queue);
        Ok(())
    }

    /// A worker registered saying it runs in allocation `alloc`: whether the server knows it.
    pub fn worker_joined(&mut self, now: u64, worker: WorkerId, alloc: AllocId) -> bool {
        let queues: Vec<QueueId> = self.allocator.queues().map(|q| q.id).collect();
        for q in queues {
            let Some(queue) = self.allocator.queue_mut(q) else {
                continue;
            };
            if queue.allocations.contains_key(&alloc) {
                let taken = queue.worker_joined(now, alloc, worker);
                if taken {
                    self.origin.insert(worker, (q, alloc));
                }
                return taken;
            }
        }
        false
    }

    /// A worker is gone.
    pub fn worker_left(&mut self, worker: WorkerId) {
        self.idle_since.remove(&worker);
        if let Some((q, alloc)) = self.origin.remove(&worker) {
            if let Some(queue) = self.allocator.queue_mut(q) {
                queue.worker_left(alloc, worker);
            }
        }
    }

    /// Once a second: what the backends saw, then the allocator's decisions, carried out.
    /// Returns the workers to tell to leave.
    pub fn tick(&mut self, now: u64, core: &Scheduler) -> Sends {
        let mut sends = Sends::default();
        if self.specs.is_empty() || now.saturating_sub(self.last_tick_us) < TICK_US {
            return sends;
        }
        self.last_tick_us = now;
        self.apply_answers(now, &mut sends.replies);
        self.query_batch();
        for (alloc, failed) in self.local.reap() {
            if let Some(q) = self.queue_of(alloc) {
                if let Some(queue) = self.allocator.queue_mut(q) {
                    queue.ended(now, alloc, failed);
                }
            }
        }
        self.note_idleness(now, core);
        let (queued_tasks, queued_slots) = core.ready_demand();
        let origin = &self.origin;
        let idle_since = &self.idle_since;
        let actions = self.allocator.tick(now, |q| {
            let mine = origin
                .iter()
                .filter(|(_, &(queue, _))| queue == q.id)
                .map(|(&w, _)| w);
            let mut free = 0u64;
            let mut idle = Vec::new();
            for w in mine {
                if let Some(worker) = core.worker(w) {
                    let fits = worker
                        .ends_at_us
                        .is_none_or(|end| now + kestrel_core::END_MARGIN_US < end);
                    if fits && worker.quarantined.is_none() {
                        let cpus = worker.offer.resources.cpus;
                        free += u64::from(cpus.saturating_sub(worker.used.cpus));
                    }
                }
                if let Some(&since) = idle_since.get(&w) {
                    idle.push((w, since));
                }
            }
            Demand {
                queued_tasks,
                queued_slots,
                free_slots: free,
                idle,
            }
        });
        let drains = &mut sends.drains;
        for a in actions {
            match a {
                Action::Submit {
                    queue,
                    alloc,
                    nodes,
                } => self.submit(now, queue, alloc, nodes),
                Action::Cancel { queue, alloc } => self.cancel(queue, alloc),
                Action::Drain { alloc, workers, .. } => {
                    tracing::info!(alloc, workers = workers.len(), "allocation released");
                    drains.extend(workers.into_iter().map(|w| (w, RELEASED.to_string())));
                }
            }
        }
        sends
    }

    fn queue_of(&self, alloc: AllocId) -> Option<QueueId> {
        self.allocator
            .queues()
            .find(|q| q.allocations.contains_key(&alloc))
            .map(|q| q.id)
    }

    fn note_idleness(&mut self, now: u64, core: &Scheduler) {
        for &w in self.origin.keys() {
            let busy = core.worker(w).is_none_or(|x| x.outstanding() > 0);
            if busy {
                self.idle_since.remove(&w);
            } else {
                self.idle_since.entry(w).or_insert(now);
            }
        }
    }

    /// What the batch systems answered since the last tick, told to the queues.
    fn apply_answers(&mut self, now: u64, replies: &mut Replies) {
        for answer in self.batch.answers() {
            match answer {
                batch::Answer::DryRun { queue, result } => {
                    let Some((conn, id)) = self.checking.remove(&queue) else {
                        continue;
                    };
                    let answer = match result {
                        Ok(()) => {
                            if let Some(q) = self.allocator.queue_mut(queue) {
                                q.resume();
                            }
                            tracing::info!(queue, "allocation queue added after its dry run");
                            Ok(Answer::AllocAdded { queue })
                        }
                        Err(e) => {
                            self.allocator.remove_queue(queue, true);
                            self.specs.remove(&queue);
                            tracing::info!(queue, "allocation queue refused by its dry run: {e}");
                            Err(Refusal::from(format!(
                                "the queue was not added: its held test allocation was refused: {e}; fix the batch arguments (after --), or add the queue with --no-dry-run"
                            )))
                        }
                    };
                    replies.push((conn, id, answer));
                }
                batch::Answer::Submitted {
                    queue,
                    alloc,
                    result,
                } => {
                    let Some(q) = self.allocator.queue_mut(queue) else {
                        continue;
                    };
                    match result {
                        Ok(id) => {
                            tracing::info!(queue, alloc, batch_id = %id, "allocation submitted");
                            q.submitted(alloc, id);
                        }
                        Err(e) => {
                            tracing::warn!(queue, alloc, "allocation not submitted: {e}");
                            q.submit_failed(now, alloc, e);
                        }
                    }
                }
                batch::Answer::Queried {
                    queue,
                    asked,
                    result,
                } => {
                    let Some(q) = self.allocator.queue_mut(queue) else {
                        continue;
                    };
                    let rows = match result {
                        Ok(rows) => rows,
                        Err(e) => {
                            // Changes nothing: asked again at the next tick.
                            tracing::warn!(queue, "querying the allocations failed: {e}");
                            q.last_error = Some(format!("querying the allocations failed: {e}"));
                            continue;
                        }
                    };
                    let live: Vec<(AllocId, String)> = q
                        .live()
                        .filter_map(|a| Some((a.id, a.batch_id.clone()?)))
                        .filter(|(_, id)| asked.contains(id))
                        .collect();
                    for (alloc, id) in live {
                        let state = rows
                            .iter()
                            .find(|(listed, _)| pbs::same_id(&id, listed))
                            .map(|(_, s)| s.clone());
                        match state {
                            Some(BatchState::Queued) => {}
                            Some(BatchState::Running) => q.started(now, alloc),
                            Some(BatchState::Finished) | None => q.ended(now, alloc, None),
                            Some(BatchState::Failed(why)) => q.ended(now, alloc, Some(why)),
                        }
                    }
                }
            }
        }
    }

    /// One query per batch queue for all its allocations that have a batch id.
    fn query_batch(&mut self) {
        for q in self.allocator.queues() {
            let Some(system) = self
                .specs
                .get(&q.id)
                .and_then(|s| batch::System::named(&s.backend))
            else {
                continue;
            };
            let ids: Vec<String> = q.live().filter_map(|a| a.batch_id.clone()).collect();
            self.batch.query(system, q.id, ids);
        }
    }

    fn cancel(&mut self, queue: QueueId, alloc: AllocId) {
        let system = self
            .specs
            .get(&queue)
            .and_then(|s| batch::System::named(&s.backend));
        match system {
            None => self.local.cancel(alloc),
            Some(system) => {
                let id = self
                    .allocator
                    .queue(queue)
                    .and_then(|q| q.allocations.get(&alloc))
                    .and_then(|a| a.batch_id.clone());
                self.batch.cancel(system, id.into_iter().collect());
            }
        }
    }

    fn submit(&mut self, now: u64, queue: QueueId, alloc: AllocId, nodes: u32) {
        let Some(spec) = self.specs.get(&queue) else {
            return;
        };
        if let Some(system) = batch::System::named(&spec.backend) {
            self.batch.submit(system, (queue, alloc, nodes), spec);
            return;
        }
        let ends_at_s = (now + spec.time_limit_ms.saturating_mul(1000)) / 1_000_000;
        let result = self.local.start(alloc, nodes, ends_at_s, &spec.worker_args);
        let Some(q) = self.allocator.queue_mut(queue) else {
            return;
        };
        match result {
            Ok(batch_id) => {
                tracing::info!(queue, alloc, nodes, %batch_id, "allocation started");
                q.submitted(alloc, batch_id);
            }
            Err(e) => {
                tracing::warn!(queue, alloc, "allocation not started: {e}");
                q.submit_failed(now, alloc, e);
            }
        }
    }

    /// `kestrel alloc list`.
    pub fn views(&self, now: u64) -> Vec<AllocQueueView> {
        self.allocator
            .queues()
            .filter_map(|q| {
                let spec = self.specs.get(&q.id)?.clone();
                Some(AllocQueueView {
                    id: q.id,
                    spec,
                    paused: q.paused.as_ref().map(|p| match p {
                        Paused::ByUser => "paused by `kestrel alloc pause`".to_string(),
                        Paused::Failing(why) => why.clone(),
                    }),
                    last_error: q.last_error.clone(),
                    allocations: q
                        .allocations
                        .values()
                        .map(|a| AllocView {
                            id: a.id,
                            batch_id: a.batch_id.clone(),
                            state: a.state.word().to_string(),
                            reason: match &a.state {
                                AllocState::Ended(Ending::Failed(w) | Ending::SubmitFailed(w)) => {
                                    Some(w.clone())
                                }
                                _ => None,
                            },
                            nodes: a.nodes,
                            workers: a.workers.clone(),
                            submitted_ms: a.submitted_us / 1000,
                            queue_wait_ms: a.queue_wait_us(now) / 1000,
                            ended_ms: a.ended_us.map(|t| t / 1000),
                        })
                        .collect(),
                })
            })
            .collect()
    }

    /// The server stops: the local workers are told by the server; their processes are
    /// reaped here so none is left behind.
    pub fn shut_down(&mut self) {
        self.local.stop_all();
    }
}

fn no_queue(queue: QueueId) -> String {
    format!("no allocation queue {queue}; `kestrel alloc list` shows them")
}
