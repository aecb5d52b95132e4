//! Allocation queues inside the server: the [`kestrel_alloc::Allocator`] decides, this module
//! tells it what the scheduler sees (ready work, its workers' free slots and idleness) and
//! carries out what it asks for with a backend: worker processes on this machine (`local`),
//! or Slurm and PBS through their commands, run off the engine's thread (`batch`). Queues and
//! allocations are kept in the journal file (`store`): an allocation is written before its
//! submit command runs, and a restarted server adopts what its allocations became.

mod batch;
mod local;
mod store;

use crate::outbox::ConnId;
use kestrel_alloc::backend::BatchState;
use kestrel_alloc::{
    Acquire, Action, AllocId, AllocState, Allocation, Allocator, Demand, Ending, Paused, QueueId,
    QueueParams, WorkerId,
};
use kestrel_core::Scheduler;
use kestrel_proto::messages::{
    AllocLogView, AllocQueueSpec, AllocQueueView, AllocView, Answer, LogFile, Refusal,
};
use rustc_hash::FxHashMap;
use std::path::PathBuf;

/// How often the allocator decides (in microseconds of the server's clock).
const TICK_US: u64 = 1_000_000;

/// Queries in a row that must miss an allocation before it counts as ended, if none of its
/// workers ever connected: a job the batch system has just taken may not be listed yet. One
/// whose workers came was listed for sure, and one miss ends it.
const MISSES_TO_END: u8 = 2;

/// When the batch system is asked about an allocation again (a big cluster's controller is
/// shared by everyone, and its users' tools are asked to poll it sparingly; the workers tell
/// the rest): one waiting for nodes a little after its submission, unless its workers have
/// connected by then, and then less and less often; one whose workers are all connected never
/// (they are the proof that it runs, and the batch system's kill of it ends their
/// connections); one whose workers have left (released, done, killed) a few seconds later,
/// to see it end: long enough for its pilot to have exited, and for allocations released
/// together to be asked about in one query.
const FIRST_QUERY_US: u64 = 5_000_000;
const MAX_PENDING_QUERY_US: u64 = 60_000_000;
const LEFT_QUERY_US: u64 = 5_000_000;
/// Not asked (see [`FIRST_QUERY_US`]).
const NOT_ASKED: u64 = u64::MAX;

/// Busy CPU-microseconds an allocation gathers before they are journaled again (they are at
/// every other change, and at the server's stop).
const BUSY_SAVE_US: u64 = 60_000_000;

/// Characters of the server's id in its batch job names.
const TAG_CHARS: usize = 4;

/// Searches by name for an allocation whose submission never answered, before giving up.
const FIND_TRIES: u8 = 3;

/// How long a drained allocation, whose workers have left, may take to end by itself (its
/// pilot exits with its workers) before it is canceled.
const DRAINED_END_US: u64 = 15_000_000;

/// Failures in a row after which a queue pauses itself.
const MAX_FAILURES: u32 = 3;

/// What a drained worker is told when its allocation is released.
pub const RELEASED: &str = "its allocation was released";

/// Where a queue's allocations come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Local,
    Batch(batch::System),
}

/// A queue as the server keeps it beside the allocator's state.
struct Side {
    spec: AllocQueueSpec,
    backend: Backend,
}

/// A Slurm or PBS queue waiting for its dry run before it is added.
struct Check {
    spec: AllocQueueSpec,
    system: batch::System,
    params: QueueParams,
    asker: (ConnId, u64),
}

/// The server's allocation queues and the processes and workers they brought.
pub struct Provision {
    allocator: Allocator,
    sides: FxHashMap<QueueId, Side>,
    local: local::Local,
    batch: batch::Runner,
    /// Workers that came from an allocation: (queue, allocation).
    origin: FxHashMap<WorkerId, (QueueId, AllocId)>,
    /// Since when each worker of a queue has run nothing.
    idle_since: FxHashMap<WorkerId, u64>,
    /// Queues being checked by a dry run, by check number.
    checking: FxHashMap<u32, Check>,
    next_check: u32,
    /// Allocations the last queries did not list, and how many times in a row.
    missed: FxHashMap<AllocId, u8>,
    /// When each allocation with a batch id is next asked about, and the last interval.
    next_query: FxHashMap<AllocId, (u64, u64)>,
    /// Searches by name that failed, by allocation.
    find_tries: FxHashMap<AllocId, u8>,
    /// Drained allocations left to end by themselves, canceled if still live by then.
    cancel_at: FxHashMap<AllocId, u64>,
    last_tick_us: u64,
    /// Where queues and allocations are kept (none without a journal).
    store: Option<store::Store>,
    /// What the store holds of each allocation, to write only what changed.
    kept: FxHashMap<AllocId, Allocation>,
    /// What the store holds of each queue's pause, and of the next ids.
    kept_paused: FxHashMap<QueueId, Option<Paused>>,
    kept_ids: (QueueId, AllocId),
    /// Names this server's batch jobs (from its id), so that they are found again by name.
    tag: String,
    /// Where each allocation's files are: `alloc/A/`.
    dir: PathBuf,
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
    /// A test allocation checks it first; the answer comes with a later tick.
    Checking,
}

/// What a worker that names an allocation is to do.
pub enum Joined {
    /// Work: its allocation is live.
    Work,
    /// Leave at once, for this reason: its allocation is being released or is over.
    Leave(String),
    /// No queue of this server made that allocation.
    Unknown,
}

impl Provision {
    /// No queues yet; `access` is the access file local workers connect with; `server_id`
    /// names the batch jobs.
    pub fn new(access: PathBuf, dir: PathBuf, server_id: &str) -> Provision {
        Provision {
            allocator: Allocator::new(),
            sides: FxHashMap::default(),
            local: local::Local::new(access.clone(), dir.join("alloc")),
            batch: batch::Runner::new(access, dir.join("alloc")),
            origin: FxHashMap::default(),
            idle_since: FxHashMap::default(),
            checking: FxHashMap::default(),
            next_check: 1,
            missed: FxHashMap::default(),
            next_query: FxHashMap::default(),
            cancel_at: FxHashMap::default(),
            find_tries: FxHashMap::default(),
            last_tick_us: 0,
            store: None,
            kept: FxHashMap::default(),
            kept_paused: FxHashMap::default(),
            kept_ids: (1, 1),
            tag: server_id.chars().take(TAG_CHARS).collect(),
            dir: dir.join("alloc"),
        }
    }

    /// Keeps queues in the journal file `path` from now on, after taking back those an
    /// earlier run of the server kept there (`server_id`: the journal's): allocations that
    /// were live are adopted, looked for by name if their batch id was never learned, or
    /// found ended. Returns a line for the log, if anything was restored.
    pub fn restore(
        &mut self,
        path: &std::path::Path,
        server_id: &str,
        now: u64,
    ) -> Result<Option<String>, String> {
        self.tag = server_id.chars().take(TAG_CHARS).collect();
        let store = store::Store::open(path)?;
        let saved = store.load()?;
        self.allocator.skip_ids(saved.next_ids.0, saved.next_ids.1);
        self.kept_ids = saved.next_ids;
        let (mut queues, mut live) = (0, 0);
        for sq in saved.queues {
            let (params, backend) = match queue_params(&sq.spec) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(
                        queue = sq.id,
                        "an allocation queue kept in the journal is not taken back: {e}"
                    );
                    continue;
                }
            };
            for a in &sq.allocations {
                self.kept.insert(
                    a.id,
                    Allocation {
                        workers: Vec::new(),
                        ..a.clone()
                    },
                );
            }
            self.kept_paused.insert(sq.id, sq.paused.clone());
            let alive: Vec<Allocation> = sq
                .allocations
                .iter()
                .filter(|a| !a.state.is_ended())
                .cloned()
                .collect();
            self.allocator
                .restore_queue(now, sq.id, params, sq.paused, sq.allocations)
                .map_err(|e| format!("allocation queue {}: {e}", sq.id))?;
            self.sides.insert(
                sq.id,
                Side {
                    spec: sq.spec,
                    backend,
                },
            );
            queues += 1;
            live += alive.len();
            for a in alive {
                self.adopt(now, sq.id, backend, a);
            }
        }
        self.store = Some(store);
        if let Err(e) = self.save() {
            tracing::error!("cannot keep the allocation queues in the journal: {e}");
        }
        Ok((queues > 0).then(|| {
            format!("{queues} allocation queue(s) taken back from the journal, with {live} allocation(s) that had not ended")
        }))
    }

    /// An allocation that had not ended when the server stopped: what became of it is asked
    /// of the batch system, or of its processes.
    fn adopt(&mut self, now: u64, queue: QueueId, backend: Backend, a: Allocation) {
        let Some(q) = self.allocator.queue_mut(queue) else {
            return;
        };
        match (backend, a.batch_id) {
            (Backend::Batch(system), None) => {
                let name = self.job_name(a.id);
                tracing::info!(queue, alloc = a.id, "looking for batch job {name}: the server stopped before its submission answered");
                self.batch.find(system, (queue, a.id), name);
            }
            (Backend::Batch(system), Some(id)) => {
                if a.state == AllocState::Canceling {
                    self.batch.cancel(system, vec![id]);
                }
            }
            (Backend::Local, Some(id)) => {
                if !self.local.adopt(a.id, &id) {
                    q.ended(now, a.id, None);
                }
            }
            (Backend::Local, None) => q.ended(
                now,
                a.id,
                Some("the server stopped before starting it".into()),
            ),
        }
    }

    /// The batch job name of allocation `alloc`: short enough for PBS (15 characters, up to
    /// allocation 99,999,999), and unique to this server's journal.
    fn job_name(&self, alloc: AllocId) -> String {
        format!("k{}-a{alloc}", self.tag)
    }

    /// Writes what changed since the last save: allocations, queues' pauses, the next ids.
    fn save(&mut self) -> Result<(), String> {
        self.save_with(BUSY_SAVE_US)
    }

    /// [`Self::save`], writing busy time that changed by `busy_step` or more.
    fn save_with(&mut self, busy_step: u64) -> Result<(), String> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        let mut rows = Vec::new();
        for q in self.allocator.queues() {
            for a in q.allocations.values() {
                let same = self.kept.get(&a.id).is_some_and(|k| {
                    k.state == a.state
                        && k.batch_id == a.batch_id
                        && k.started_us == a.started_us
                        && k.ended_us == a.ended_us
                        && k.workers_seen == a.workers_seen
                        // Busy time is kept now and then, not at every task end.
                        && a.busy_cpu_us.abs_diff(k.busy_cpu_us) < busy_step
                });
                if !same {
                    rows.push((q.id, a));
                }
            }
        }
        let ids = self.allocator.next_ids();
        if !rows.is_empty() || ids != self.kept_ids {
            store.put_allocations(&rows, ids)?;
            for (_, a) in rows {
                self.kept.insert(
                    a.id,
                    Allocation {
                        workers: Vec::new(),
                        ..a.clone()
                    },
                );
            }
            self.kept_ids = ids;
        }
        for q in self.allocator.queues() {
            if self.kept_paused.get(&q.id) != Some(&q.paused) {
                if let Some(side) = self.sides.get(&q.id) {
                    store.put_queue(q.id, &side.spec, q.paused.as_ref())?;
                    self.kept_paused.insert(q.id, q.paused.clone());
                }
            }
        }
        Ok(())
    }

    /// `kestrel alloc add` (request `asker`): checks the spec and adds the queue. A Slurm or
    /// PBS queue with a dry run is added only once the batch system has accepted a test
    /// allocation (Slurm's `--test-only`; a held PBS job, then canceled) ([`Added::Checking`];
    /// the answer goes out from a later tick).
    pub fn add(&mut self, spec: AllocQueueSpec, asker: (ConnId, u64)) -> Result<Added, String> {
        let spec = divide_the_machine(spec);
        let (params, backend) = queue_params(&spec)?;
        if let (Backend::Batch(system), true) = (backend, spec.dry_run) {
            let check = self.next_check;
            self.next_check += 1;
            self.batch.dry_run(system, check, &spec);
            self.checking.insert(
                check,
                Check {
                    spec,
                    system,
                    params,
                    asker,
                },
            );
            // Its answer is looked for at the next tick.
            self.last_tick_us = 0;
            return Ok(Added::Checking);
        }
        Ok(Added::Now(self.take_queue(params, spec, backend)?))
    }

    fn take_queue(
        &mut self,
        params: QueueParams,
        spec: AllocQueueSpec,
        backend: Backend,
    ) -> Result<QueueId, String> {
        let id = self
            .allocator
            .add_queue(params)
            .map_err(|e| e.to_string())?;
        if let Some(store) = &self.store {
            if let Err(e) = store.put_queue(id, &spec, None) {
                let _ = self.allocator.remove_queue(id, true);
                return Err(format!(
                    "the queue was not added: the journal cannot keep it: {e}"
                ));
            }
            self.kept_paused.insert(id, None);
        }
        tracing::info!(queue = id, backend = %spec.backend, "allocation queue added");
        self.sides.insert(id, Side { spec, backend });
        Ok(id)
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
        self.save().map_err(|e| {
            format!("the journal cannot keep this: {e}; it holds until the server restarts")
        })
    }

    /// `kestrel alloc remove`: its live allocations are canceled (with `force`). One still
    /// being submitted is canceled when its batch id comes back.
    pub fn remove(&mut self, queue: QueueId, force: bool) -> Result<(), String> {
        let Some(q) = self.allocator.queue(queue) else {
            return Err(no_queue(queue));
        };
        // Taken before the queue goes: what its cancels need.
        let live: Vec<(AllocId, Option<String>)> =
            q.live().map(|a| (a.id, a.batch_id.clone())).collect();
        if self.allocator.remove_queue(queue, force).is_none() {
            return Err(format!(
                "queue {queue} has allocations that have not ended; `kestrel alloc remove {queue} --force` cancels them"
            ));
        }
        if let Some(side) = self.sides.remove(&queue) {
            for (alloc, batch_id) in live {
                self.kept.remove(&alloc);
                self.cancel_with(side.backend, alloc, batch_id);
            }
        }
        self.kept_paused.remove(&queue);
        if let Some(store) = self.store.as_mut() {
            if let Err(e) = store.remove_queue(queue) {
                tracing::error!(queue, "the journal cannot forget the removed queue: {e}");
            }
        }
        Ok(())
    }

    /// A worker registered saying it runs in allocation `alloc`.
    pub fn worker_joined(&mut self, now: u64, worker: WorkerId, alloc: AllocId) -> Joined {
        let Some(q) = self.queue_of(alloc) else {
            return Joined::Unknown;
        };
        let Some(queue) = self.allocator.queue_mut(q) else {
            return Joined::Unknown;
        };
        if queue.worker_joined(now, alloc, worker) {
            self.origin.insert(worker, (q, alloc));
            let whole = queue
                .allocations
                .get(&alloc)
                .is_some_and(|a| a.workers.len() >= a.nodes as usize);
            if whole {
                // Its workers say it runs: the batch system need not be asked.
                if let Some(e) = self.next_query.get_mut(&alloc) {
                    e.0 = NOT_ASKED;
                }
            }
            Joined::Work
        } else {
            Joined::Leave(format!(
                "its allocation {alloc} is being released or is over"
            ))
        }
    }

    /// The queue and allocation worker `worker` came from, if one of this server's.
    pub fn origin_of(&self, worker: WorkerId) -> Option<(QueueId, AllocId)> {
        self.origin.get(&worker).copied()
    }

    /// Worker `worker` ran tasks for `cpu_us` CPU-microseconds (counted for its allocation).
    pub fn task_ran(&mut self, worker: WorkerId, cpu_us: u64) {
        if let Some(&(q, alloc)) = self.origin.get(&worker) {
            if let Some(queue) = self.allocator.queue_mut(q) {
                queue.task_ran(alloc, cpu_us);
            }
        }
    }

    /// Whether an allocation queue is active (not paused): it may bring workers bigger than
    /// those connected now.
    pub fn has_active_queue(&self) -> bool {
        self.allocator.queues().any(|q| q.paused.is_none())
    }

    /// What the allocation queues are doing about work that has no worker: said instead of
    /// "start a worker" while a queue is active; `None` without queues.
    pub fn awaited(&self, core: &Scheduler) -> Option<String> {
        let mut pending = 0;
        let mut paused = Vec::new();
        let mut queues = 0;
        let mut fitting = 0;
        for q in self.allocator.queues() {
            queues += 1;
            if core.ready_demand_within(q.params.time_limit_us).1 > 0 {
                fitting += 1;
            }
            pending += q.live().filter(|a| a.state.is_pending()).count();
            if let Some(p) = &q.paused {
                paused.push(match p {
                    Paused::ByUser => {
                        format!("queue {} is paused (`kestrel alloc resume {}`)", q.id, q.id)
                    }
                    Paused::Failing(why) => format!("queue {} paused itself: {why}", q.id),
                });
            }
        }
        if queues == 0 {
            return None;
        }
        if paused.len() == queues {
            return Some(format!("no worker is connected, and {}", paused.join("; ")));
        }
        if fitting == 0 && pending == 0 {
            return Some("no worker is connected, and no allocation queue's --time-limit fits the waiting tasks (their --timeout plus a 30 s margin): add a queue with a longer one".to_string());
        }
        Some(if pending > 0 {
            format!("no worker is connected yet: {pending} allocation(s) are on their way (`kestrel alloc list`)")
        } else {
            "no worker is connected yet: the allocation queues ask for some at their next tick (`kestrel alloc list`)".to_string()
        })
    }

    /// A worker is gone (at `now`).
    pub fn worker_left(&mut self, now: u64, worker: WorkerId) {
        self.idle_since.remove(&worker);
        if let Some((q, alloc)) = self.origin.remove(&worker) {
            if let Some(queue) = self.allocator.queue_mut(q) {
                queue.worker_left(alloc, worker);
                let gone = queue
                    .allocations
                    .get(&alloc)
                    .is_some_and(|a| a.workers.is_empty() && a.batch_id.is_some());
                if gone
                    && matches!(
                        self.sides.get(&q).map(|s| s.backend),
                        Some(Backend::Batch(_))
                    )
                {
                    // Its pilot may be ending: see it end soon.
                    self.query_soon(now, alloc);
                }
            }
        }
    }

    /// Once a second: what the backends saw, then the allocator's decisions, carried out.
    pub fn tick(&mut self, now: u64, core: &Scheduler) -> Sends {
        let mut sends = Sends::default();
        if now.saturating_sub(self.last_tick_us) < TICK_US {
            return sends;
        }
        self.last_tick_us = now;
        self.apply_answers(now, &mut sends.replies);
        for (alloc, failed) in self.local.reap() {
            if let Some(q) = self.queue_of(alloc) {
                if let Some(queue) = self.allocator.queue_mut(q) {
                    queue.ended(now, alloc, failed);
                }
            }
        }
        if self.sides.is_empty() {
            return sends;
        }
        self.query_batch(now);
        self.cancel_overdue(now);
        self.note_idleness(now, core);
        // Each queue's workers, in one walk.
        let mut mine: FxHashMap<QueueId, (u64, Vec<(WorkerId, u64)>)> = FxHashMap::default();
        for (&w, &(q, _)) in &self.origin {
            let entry = mine.entry(q).or_default();
            if let Some(worker) = core.worker(w) {
                // A node of a multi-node task (or one held for it) has no slot free.
                if worker.before_end_margin(now)
                    && worker.quarantined.is_none()
                    && worker.node_of.is_none()
                {
                    let cpus = worker.offer.resources.cpus;
                    entry.0 += u64::from(cpus.saturating_sub(worker.used.cpus));
                }
            }
            if let Some(&since) = self.idle_since.get(&w) {
                entry.1.push((w, since));
            }
        }
        // Tasks workers have taken beyond their slots wait there for one: work a new worker
        // gets by stealing, so it counts (without it, a stage whose tasks all fit in the
        // prefetch windows of the workers up ran in rounds and asked for nothing).
        let on_workers: u64 = core
            .workers()
            .map(|w| u64::from(w.used.cpus.saturating_sub(w.offer.resources.cpus)))
            .sum();
        let mut actions = self.allocator.tick(now, |q| {
            // Only tasks that could end within this queue's allocations.
            let (tasks, slots) = core.ready_demand_within(q.params.time_limit_us);
            let (queued_tasks, queued_slots) = (tasks + on_workers, slots + on_workers);
            let (free_slots, mut idle) = mine.remove(&q.id).unwrap_or_default();
            idle.sort_unstable();
            Demand {
                queued_tasks,
                queued_slots,
                free_slots,
                idle,
                // The allocator's, from the other queues.
                covered_elsewhere: 0,
            }
        });
        // New allocations are journaled before they are submitted; one that cannot be is not.
        if let Err(e) = self.save() {
            tracing::error!("cannot journal the allocations: {e}");
            actions.retain(|a| match *a {
                Action::Submit { queue, alloc, .. } => {
                    if let Some(q) = self.allocator.queue_mut(queue) {
                        q.submit_failed(
                            now,
                            alloc,
                            format!("the journal cannot keep it, so it was not submitted: {e}"),
                        );
                    }
                    false
                }
                _ => true,
            });
        }
        for a in actions {
            match a {
                Action::Submit {
                    queue,
                    alloc,
                    nodes,
                } => self.submit(now, queue, alloc, nodes),
                Action::Cancel { queue, alloc } => {
                    let a = self
                        .allocator
                        .queue(queue)
                        .and_then(|q| q.allocations.get(&alloc));
                    let batch_id = a.and_then(|a| a.batch_id.clone());
                    let drained = a.is_some_and(|a| a.workers_seen > 0);
                    match self.sides.get(&queue).map(|s| s.backend) {
                        // Its workers have left, so its pilot ends by itself: asked about
                        // soon, and canceled only if it has not ended by then.
                        Some(Backend::Batch(_)) if drained => {
                            self.cancel_at.insert(alloc, now + DRAINED_END_US);
                            self.query_soon(now, alloc);
                        }
                        Some(backend) => self.cancel_with(backend, alloc, batch_id),
                        None => {}
                    }
                }
                Action::Drain { alloc, workers, .. } => {
                    tracing::info!(alloc, workers = workers.len(), "allocation released");
                    let why = || RELEASED.to_string();
                    sends.drains.extend(workers.into_iter().map(|w| (w, why())));
                }
            }
        }
        if let Err(e) = self.save() {
            tracing::error!("cannot journal the allocations: {e}");
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
                batch::Answer::DryRun { check, result } => self.checked(check, result, replies),
                batch::Answer::Submitted {
                    queue,
                    alloc,
                    system,
                    result,
                } => self.submitted(now, (queue, alloc), system, result),
                batch::Answer::Queried {
                    queue,
                    asked,
                    result,
                } => self.queried(now, queue, &asked, result),
                batch::Answer::Found {
                    queue,
                    alloc,
                    system,
                    name,
                    result,
                } => self.found(now, (queue, alloc), system, name, result),
            }
        }
    }

    fn checked(
        &mut self,
        check: u32,
        result: Result<(), batch::CheckFailed>,
        replies: &mut Replies,
    ) {
        let Some(c) = self.checking.remove(&check) else {
            return;
        };
        let (conn, id) = c.asker;
        let answer = match result {
            Ok(()) => self
                .take_queue(c.params, c.spec, Backend::Batch(c.system))
                .map(|queue| Answer::AllocAdded { queue })
                .map_err(Refusal::from),
            Err(batch::CheckFailed::Refused(e)) => {
                tracing::info!("allocation queue refused by its dry run: {e}");
                Err(Refusal::from(format!(
                    "the queue was not added: its test allocation was refused: {e}; fix the batch arguments (after --), or add the queue with --no-dry-run"
                )))
            }
            Err(batch::CheckFailed::NotAsked(e)) => {
                tracing::info!("allocation queue not checked by its dry run: {e}");
                Err(Refusal::from(format!(
                    "the queue was not added: the batch system could not check its test allocation: {e}"
                )))
            }
        };
        replies.push((conn, id, answer));
    }

    fn submitted(
        &mut self,
        now: u64,
        (queue, alloc): (QueueId, AllocId),
        system: batch::System,
        result: Result<String, String>,
    ) {
        // Live: its workers may have connected already, before this answer was read.
        let live = self.allocator.queue_mut(queue).filter(|q| {
            q.allocations
                .get(&alloc)
                .is_some_and(|a| !a.state.is_ended())
        });
        match (result, live) {
            (Ok(id), Some(q)) => {
                tracing::info!(queue, alloc, batch_id = %id, "allocation submitted");
                let a = q.allocations.get(&alloc);
                let canceling = a.is_some_and(|a| a.state == AllocState::Canceling);
                // Its workers may all have connected before this answer was read.
                let whole = a.is_some_and(|a| a.workers.len() >= a.nodes as usize);
                let first = if whole {
                    NOT_ASKED
                } else {
                    now + FIRST_QUERY_US
                };
                self.next_query.insert(alloc, (first, FIRST_QUERY_US));
                q.submitted(alloc, id.clone());
                if canceling {
                    self.batch.cancel(system, vec![id]);
                }
            }
            (Err(e), Some(q)) => {
                let submitting = q
                    .allocations
                    .get(&alloc)
                    .is_some_and(|a| a.state == AllocState::Submitting);
                if submitting {
                    tracing::warn!(queue, alloc, "allocation not submitted: {e}");
                    q.submit_failed(now, alloc, e);
                } else {
                    // Its workers came anyway (a submit command that timed out after taking it).
                    tracing::warn!(
                        queue,
                        alloc,
                        "the submit command failed, but the allocation runs: {e}"
                    );
                }
            }
            // Its queue was removed while the submission was under way: nobody would own it.
            (Ok(id), None) => {
                tracing::info!(alloc, batch_id = %id, "canceling an allocation whose queue was removed");
                self.batch.cancel(system, vec![id]);
            }
            (Err(_), None) => {}
        }
    }

    /// What the search by name for an allocation whose submission never answered found.
    fn found(
        &mut self,
        now: u64,
        (queue, alloc): (QueueId, AllocId),
        system: batch::System,
        name: String,
        result: Result<Option<String>, String>,
    ) {
        let live = self.allocator.queue_mut(queue).filter(|q| {
            q.allocations
                .get(&alloc)
                .is_some_and(|a| a.state == AllocState::Submitting)
        });
        match (result, live) {
            (Ok(Some(id)), Some(q)) => {
                tracing::info!(queue, alloc, batch_id = %id, "allocation found again by its job name");
                self.find_tries.remove(&alloc);
                q.submitted(alloc, id);
            }
            // Its queue was removed (or it was canceled) meanwhile: nobody would own it.
            (Ok(Some(id)), None) => {
                tracing::info!(alloc, batch_id = %id, "canceling a job found by name that no queue owns any more");
                self.batch.cancel(system, vec![id]);
            }
            (Ok(None), Some(q)) => {
                tracing::info!(queue, alloc, "batch job {name} was never submitted");
                self.find_tries.remove(&alloc);
                q.ended(
                    now,
                    alloc,
                    Some(format!(
                        "the server stopped while submitting it, and the batch system has no job {name}"
                    )),
                );
            }
            (Err(e), Some(q)) => {
                let tries = self.find_tries.entry(alloc).or_default();
                *tries += 1;
                if *tries < FIND_TRIES {
                    tracing::warn!(
                        queue,
                        alloc,
                        "cannot look for batch job {name} (asking again): {e}"
                    );
                    self.batch.find(system, (queue, alloc), name);
                } else {
                    tracing::warn!(queue, alloc, "cannot look for batch job {name}: {e}");
                    self.find_tries.remove(&alloc);
                    q.ended(now, alloc, Some(format!("the server stopped while submitting it, and looking for its job failed ({e}): if job {name} is in the batch queue, cancel it by hand")));
                }
            }
            (_, None) => {}
        }
    }

    fn queried(
        &mut self,
        now: u64,
        queue: QueueId,
        asked: &[String],
        result: Result<Vec<(String, BatchState)>, String>,
    ) {
        let Some(q) = self.allocator.queue_mut(queue) else {
            return;
        };
        let rows = match result {
            Ok(rows) => rows,
            Err(e) => {
                // Changes nothing: asked again, a little later each time it fails.
                tracing::warn!(queue, "querying the allocations failed: {e}");
                q.last_error = Some(format!("querying the allocations failed: {e}"));
                let ids: Vec<AllocId> = q
                    .live()
                    .filter(|a| a.batch_id.as_ref().is_some_and(|id| asked.contains(id)))
                    .map(|a| a.id)
                    .collect();
                for a in ids {
                    let last = self.next_query.get(&a).map_or(0, |&(_, i)| i);
                    let wait = last
                        .saturating_mul(2)
                        .clamp(LEFT_QUERY_US, MAX_PENDING_QUERY_US);
                    self.next_query.insert(a, (now + wait, wait));
                }
                return;
            }
        };
        // By the id's first part: PBS may list `123.server` for `123`.
        let base = |id: &str| id.split('.').next().unwrap_or(id).to_string();
        let states: FxHashMap<String, BatchState> =
            rows.into_iter().map(|(id, s)| (base(&id), s)).collect();
        let live: Vec<(AllocId, String)> = q
            .live()
            .filter_map(|a| Some((a.id, a.batch_id.clone()?)))
            .filter(|(_, id)| asked.contains(id))
            .collect();
        let dir = &self.dir;
        for &(alloc, ref id) in &live {
            let state = states.get(&base(id)).cloned();
            let misses_to_end = match q.allocations.get(&alloc) {
                Some(a) if a.workers_seen > 0 => 1,
                _ => MISSES_TO_END,
            };
            // Ended with none of its workers come: what its pilot wrote last says why.
            let never_came = q
                .allocations
                .get(&alloc)
                .is_some_and(|a| a.workers_seen == 0 && a.state != AllocState::Canceling);
            let why = |said: &str| {
                let words = last_words(&dir.join(alloc.to_string()))
                    .map(|w| format!("; its pilot's output ends: {w:?}"))
                    .unwrap_or_default();
                format!("{said}{words}; see `kestrel alloc log {queue} {alloc}`")
            };
            if state.is_some() {
                self.missed.remove(&alloc);
            }
            match state {
                Some(BatchState::Queued) => {}
                Some(BatchState::Running) => q.started(now, alloc),
                Some(BatchState::Finished) if never_came => {
                    q.ended(now, alloc, Some(why(NO_WORKER)));
                }
                Some(BatchState::Finished) => q.ended(now, alloc, None),
                Some(BatchState::Failed(said)) if never_came => {
                    q.ended(now, alloc, Some(why(&said)))
                }
                Some(BatchState::Failed(said)) => q.ended(now, alloc, Some(said)),
                None => {
                    let n = self.missed.entry(alloc).or_default();
                    *n += 1;
                    if *n >= misses_to_end {
                        self.missed.remove(&alloc);
                        q.ended(now, alloc, never_came.then(|| why(NO_WORKER)));
                    }
                }
            }
        }
        let asked_about: Vec<Allocation> = live
            .iter()
            .filter_map(|(a, _)| q.allocations.get(a).cloned())
            .collect();
        for a in asked_about {
            if a.state.is_ended() {
                self.next_query.remove(&a.id);
                self.cancel_at.remove(&a.id);
                self.missed.remove(&a.id);
            } else {
                self.reschedule(now, &a);
            }
        }
    }

    /// One query per batch queue for all its allocations that have a batch id, once one of
    /// them is due (see [`FIRST_QUERY_US`]).
    fn query_batch(&mut self, now: u64) {
        for q in self.allocator.queues() {
            let Some(Backend::Batch(system)) = self.sides.get(&q.id).map(|s| s.backend) else {
                continue;
            };
            let live: Vec<(AllocId, String)> = q
                .live()
                .filter_map(|a| Some((a.id, a.batch_id.clone()?)))
                .collect();
            let due = live
                .iter()
                .any(|(a, _)| self.next_query.get(a).is_none_or(|&(at, _)| at <= now));
            if due
                && self.batch.query(
                    system,
                    q.id,
                    live.iter().map(|(_, id)| id.clone()).collect(),
                )
            {
                // Asked: the next time is set when the answer comes; meanwhile not due.
                for (a, _) in &live {
                    let e = self.next_query.entry(*a).or_insert((0, 0));
                    e.0 = u64::MAX;
                }
            }
        }
    }

    /// Allocation `alloc` is to be asked about at the next tick but one.
    fn query_soon(&mut self, now: u64, alloc: AllocId) {
        let e = self.next_query.entry(alloc).or_insert((0, 0));
        e.0 = e.0.min(now + LEFT_QUERY_US);
        e.1 = LEFT_QUERY_US;
    }

    /// When to ask about `a` again, after an answer at `now` that left it `a.state`.
    fn reschedule(&mut self, now: u64, a: &Allocation) {
        let last = self.next_query.get(&a.id).map_or(0, |&(_, i)| i);
        let slower = |from: u64| last.saturating_mul(2).clamp(from, MAX_PENDING_QUERY_US);
        let interval = match a.state {
            AllocState::Queued | AllocState::Submitting => slower(FIRST_QUERY_US),
            // Given its nodes, its workers not yet connected.
            _ if a.workers_seen == 0 && !self.missed.contains_key(&a.id) => slower(FIRST_QUERY_US),
            // Its workers gone: soon, then less often if it lingers.
            _ if self.missed.contains_key(&a.id) || a.workers.is_empty() => slower(LEFT_QUERY_US),
            // Some of its workers are connected: they say it runs.
            _ => NOT_ASKED,
        };
        self.next_query
            .insert(a.id, (now.saturating_add(interval), interval));
    }

    /// Drained allocations that did not end by themselves in time are canceled.
    fn cancel_overdue(&mut self, now: u64) {
        let overdue: Vec<AllocId> = self
            .cancel_at
            .iter()
            .filter(|&(_, &at)| at <= now)
            .map(|(&a, _)| a)
            .collect();
        for alloc in overdue {
            self.cancel_at.remove(&alloc);
            let Some(q) = self.queue_of(alloc) else {
                continue;
            };
            let Some(a) = self
                .allocator
                .queue(q)
                .and_then(|x| x.allocations.get(&alloc))
            else {
                continue;
            };
            if a.state.is_ended() {
                continue;
            }
            let batch_id = a.batch_id.clone();
            if let Some(backend) = self.sides.get(&q).map(|s| s.backend) {
                tracing::info!(
                    alloc,
                    "a drained allocation did not end by itself: canceling it"
                );
                self.cancel_with(backend, alloc, batch_id);
            }
        }
    }

    fn cancel_with(&mut self, backend: Backend, alloc: AllocId, batch_id: Option<String>) {
        match backend {
            Backend::Local => self.local.cancel(alloc),
            Backend::Batch(system) => self.batch.cancel(system, batch_id.into_iter().collect()),
        }
    }

    fn submit(&mut self, now: u64, queue: QueueId, alloc: AllocId, nodes: u32) {
        let Some(side) = self.sides.get(&queue) else {
            return;
        };
        let spec = &side.spec;
        if let Backend::Batch(system) = side.backend {
            self.batch
                .submit(system, (queue, alloc, nodes), self.job_name(alloc), spec);
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
                let spec = self.sides.get(&q.id)?.spec.clone();
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
                            started_ms: a.started_us.map(|t| t / 1000),
                            held_cpu_ms: a.held_cpu_us(q.params.slots_per_node, now) / 1000,
                            busy_cpu_ms: a.busy_cpu_us / 1000,
                        })
                        .collect(),
                })
            })
            .collect()
    }

    /// `kestrel alloc log`: the files of queue `queue`'s allocations (or of `alloc` only),
    /// the last `lines` lines of each.
    pub fn logs(
        &self,
        queue: QueueId,
        alloc: Option<AllocId>,
        lines: u32,
    ) -> Result<Vec<AllocLogView>, String> {
        let q = self.allocator.queue(queue).ok_or_else(|| no_queue(queue))?;
        let backend = self.sides.get(&queue).map(|s| s.backend);
        if let Some(a) = alloc.filter(|a| !q.allocations.contains_key(a)) {
            return Err(format!(
                "queue {queue} has no allocation {a}; `kestrel alloc info {queue}` lists them"
            ));
        }
        let lines = lines.min(MAX_LOG_LINES) as usize;
        // Without one named, the newest ones (each file's tail is up to 64 KiB).
        let skip = match alloc {
            Some(_) => 0,
            None => q.allocations.len().saturating_sub(MAX_LOG_ALLOCS),
        };
        Ok(q.allocations
            .values()
            .skip(skip)
            .filter(|a| alloc.is_none_or(|x| x == a.id))
            .map(|a| {
                let dir = self.dir.join(a.id.to_string());
                let names: Vec<String> = match backend {
                    Some(Backend::Local) => {
                        (0..a.nodes).map(|n| format!("worker-{n}.log")).collect()
                    }
                    _ => ["pilot.sh", "stdout", "stderr"].map(String::from).to_vec(),
                };
                AllocLogView {
                    alloc: a.id,
                    batch_id: a.batch_id.clone(),
                    state: a.state.word().to_string(),
                    files: names.iter().map(|n| tail(&dir.join(n), lines)).collect(),
                }
            })
            .collect())
    }

    /// The server stops: the local workers (also told by the server) are stopped and reaped,
    /// and batch allocations still waiting for nodes are canceled (they would start to find no
    /// server), so none is left behind. Running ones end as their workers, told to stop, leave.
    pub fn shut_down(&mut self) {
        self.local.stop_all();
        let mut waiting: Vec<(batch::System, QueueId, AllocId, String)> = Vec::new();
        for q in self.allocator.queues() {
            let Some(Backend::Batch(system)) = self.sides.get(&q.id).map(|s| s.backend) else {
                continue;
            };
            waiting.extend(
                q.live()
                    .filter(|a| a.state == AllocState::Queued)
                    .filter_map(|a| Some((system, q.id, a.id, a.batch_id.clone()?))),
            );
        }
        // Journaled as canceling first: a restarted server then sees them end as canceled,
        // not as allocations that failed to bring a worker.
        for (_, queue, alloc, _) in &waiting {
            if let Some(q) = self.allocator.queue_mut(*queue) {
                q.cancel(*alloc);
            }
        }
        if let Err(e) = self.save_with(1) {
            tracing::error!("cannot journal the allocations: {e}");
        }
        for system in [
            batch::System::Slurm,
            batch::System::Pbs(kestrel_alloc::backend::pbs::Flavor::Pro),
            batch::System::Pbs(kestrel_alloc::backend::pbs::Flavor::Torque),
        ] {
            let ids: Vec<&str> = waiting
                .iter()
                .filter(|w| w.0 == system)
                .map(|w| w.3.as_str())
                .collect();
            if ids.is_empty() {
                continue;
            }
            tracing::info!(
                ?ids,
                "canceling allocations still waiting for nodes: the server stops"
            );
            if let Err(e) = batch::cancel_now(system, &ids) {
                tracing::warn!("{e}; cancel batch jobs {} by hand", ids.join(" "));
            }
        }
    }
}

/// The allocator's parameters and the backend of a queue as `alloc add` gave it.
/// A `local` queue whose worker arguments name no `--slots` gets its share of this machine's
/// cores for each worker ([`kestrel_alloc::local_slots`]), written into them so that `alloc
/// list` shows it and the workers offer what the queue counts on. (A client's default is its
/// own machine's cores, and the local backend's workers run on the server's.)
/// The `kestrel` command that workers of allocations run: `KESTREL_EXE` when set, else this
/// binary. The Python package runs the command inside an interpreter, whose path would start
/// Python, not Kestrel: its `python -m kestrel` names its own `kestrel` script in `KESTREL_EXE`.
fn kestrel_exe() -> Result<PathBuf, String> {
    if let Some(exe) = std::env::var_os("KESTREL_EXE") {
        let exe = PathBuf::from(exe);
        return if exe.is_file() {
            Ok(exe)
        } else {
            Err(format!(
                "KESTREL_EXE names {}, which is not a file: point it at a kestrel binary or the Python package's `kestrel` script",
                exe.display()
            ))
        };
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the kestrel binary: {e}"))?;
    let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if name.starts_with("python") {
        return Err(format!(
            "this server runs inside {} and knows no kestrel command for workers: set KESTREL_EXE to a kestrel binary or the Python package's `kestrel` script",
            exe.display()
        ));
    }
    Ok(exe)
}

fn divide_the_machine(mut spec: AllocQueueSpec) -> AllocQueueSpec {
    if spec.backend != "local" || names_slots(&spec.worker_args) {
        return spec;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let slots = kestrel_alloc::local_slots(cpus, spec.nodes, spec.max_workers, spec.max_allocs);
    spec.slots_per_node = slots;
    spec.worker_args
        .extend(["--slots".to_string(), slots.to_string()]);
    spec
}

/// Whether worker arguments give `--slots` (`--slots N` or `--slots=N`).
fn names_slots(worker_args: &[String]) -> bool {
    worker_args
        .iter()
        .any(|a| a == "--slots" || a.starts_with("--slots="))
}

fn queue_params(spec: &AllocQueueSpec) -> Result<(QueueParams, Backend), String> {
    let backend = match spec.backend.as_str() {
        "local" => Backend::Local,
        other => Backend::Batch(
            batch::System::named(other)
                .ok_or_else(|| format!("no backend {other:?}: local, slurm, pbs or torque"))?,
        ),
    };
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
        release_below: spec.release_below,
        acquire,
        max_failures: MAX_FAILURES,
    };
    params.check().map_err(|e| e.to_string())?;
    Ok((params, backend))
}

/// Characters of a line `alloc log` shows, and bytes of one file's tail, at most: a reply
/// for many allocations stays well within a message.
const MAX_LINE_CHARS: usize = 2_000;
const MAX_TAIL_BYTES: usize = 64 * 1024;

/// Allocations `alloc log Q` shows without one named: the newest.
const MAX_LOG_ALLOCS: usize = 20;

/// Lines `alloc log` shows of a file, at most.
const MAX_LOG_LINES: u32 = 10_000;

/// The last `lines` lines of `path` (read from its last 1 MiB at most).
fn tail(path: &std::path::Path, lines: usize) -> LogFile {
    use std::io::{Read, Seek, SeekFrom};
    const WINDOW: u64 = 1 << 20;
    let read = || -> std::io::Result<(u64, String)> {
        let mut f = std::fs::File::open(path)?;
        let size = f.metadata()?.len();
        f.seek(SeekFrom::Start(size.saturating_sub(WINDOW)))?;
        let mut bytes = Vec::new();
        f.take(WINDOW).read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        let mut all: Vec<&str> = text.lines().collect();
        if size > WINDOW && all.len() > 1 {
            // The window began mid-line.
            all.remove(0);
        }
        let from = all.len().saturating_sub(lines);
        let mut out = String::new();
        for line in &all[from..] {
            // Long lines are cut, and control characters (a terminal's escapes) shown as '?'.
            let shown: String = line
                .chars()
                .take(MAX_LINE_CHARS)
                .map(|c| if c.is_control() && c != '\t' { '?' } else { c })
                .collect();
            out.push_str(&shown);
            out.push('\n');
            if out.len() > MAX_TAIL_BYTES {
                break;
            }
        }
        out.pop();
        Ok((size, out))
    };
    let (size, tail) = match read() {
        Ok((size, tail)) => (Some(size), tail),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, String::new()),
        Err(e) => (None, format!("(cannot read it: {e})")),
    };
    LogFile {
        path: path.display().to_string(),
        size,
        tail,
    }
}

/// Why an allocation none of whose workers came ended, when the batch system says it ended
/// well.
const NO_WORKER: &str = "its pilot ended before any of its workers connected";

/// What an allocation's pilot and workers last said in `dir` (its batch stderr, else its
/// stdout), cut short: for an allocation none of whose workers came, it usually says why (a
/// server they cannot reach, a wrong argument). The last error line that is not the launcher's
/// own (`srun: error: ... Exited with exit code 2` says only that a worker failed), else the
/// last line that is neither the pilot's nor a usage hint.
fn last_words(dir: &std::path::Path) -> Option<String> {
    let launcher = |l: &str| {
        ["srun:", "slurmstepd:", "pbsdsh:", "kestrel pilot:"]
            .iter()
            .any(|p| l.starts_with(p))
    };
    let hint = |l: &str| l.starts_with("For more information") || l.starts_with("Usage:");
    ["stderr", "stdout"].iter().find_map(|file| {
        let t = tail(&dir.join(file), 40);
        t.size?;
        let lines: Vec<&str> = t
            .tail
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let error = lines
            .iter()
            .rev()
            .find(|l| !launcher(l) && l.to_ascii_lowercase().starts_with("error"));
        let last = || lines.iter().rev().find(|l| !launcher(l) && !hint(l));
        error.or_else(last).map(|l| l.chars().take(300).collect())
    })
}

fn no_queue(queue: QueueId) -> String {
    format!("no allocation queue {queue}; `kestrel alloc list` shows them")
}

#[cfg(test)]
mod tests {
    use super::last_words;

    #[test]
    fn a_pilots_last_words_come_from_stderr_then_from_stdout_past_its_own_lines() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(last_words(dir.path()), None, "nothing written yet");
        let stdout = "kestrel pilot: allocation 3, batch job 41, 1 node(s), ends at 99\nkestrel: command not found\nkestrel pilot: the workers ended with status 127\n";
        std::fs::write(dir.path().join("stdout"), stdout).unwrap();
        std::fs::write(dir.path().join("stderr"), "").unwrap();
        assert_eq!(
            last_words(dir.path()).as_deref(),
            Some("kestrel: command not found")
        );
        // What clap and srun write for a worker given a wrong argument: clap's first line.
        let clap = "error: unexpected argument '--slotz' found\n\n  tip: a similar argument exists: '--slots'\n\nUsage: kestrel worker start --slots <N>\n\nFor more information, try '--help'.\nsrun: error: n1: task 0: Exited with exit code 2\n";
        std::fs::write(dir.path().join("stderr"), clap).unwrap();
        assert_eq!(
            last_words(dir.path()).as_deref(),
            Some("error: unexpected argument '--slotz' found")
        );
        let stderr = "error: cannot reach the server at login1:4000: Connection refused\n\n";
        std::fs::write(dir.path().join("stderr"), stderr).unwrap();
        assert_eq!(
            last_words(dir.path()).as_deref(),
            Some("error: cannot reach the server at login1:4000: Connection refused")
        );
        std::fs::write(dir.path().join("stderr"), "x".repeat(5000)).unwrap();
        assert_eq!(last_words(dir.path()).map(|w| w.len()), Some(300));
    }
}
