//! The engine: one task that owns the scheduler and applies events to it in batches.
//!
//! Connections send [`Inbound`] events over one channel. The engine takes everything waiting
//! (up to a bound), applies it, runs one scheduling pass and sends the commands, so under load
//! many completions share one pass and one frame per worker.
//!
//! - `batch`: the loop that ties the others together: a batch of events in, the journal
//!   commit of its inputs, one scheduling pass, the commands out, the commit that releases
//!   the replies.
//! - `workers`: what workers say (joining, reports, leaving) as scheduler events.
//! - `control`: stopping workers, the record of those that left (`departures`), and the
//!   views of one worker or all.
//! - `answer`: client requests and queries, answered from the scheduler through `views`.
//! - `durable`: what goes into the journal and when; replies that promise durability wait
//!   for the commit that makes them true.
//! - `route`: the connections, and the scheduler's commands turned into frames for them.
//! - `watch`: clients' watches of jobs (protocol 13): each task end pushed to its watchers
//!   after the commit that makes it durable.
//! - `pythons`: whether a function job fits the Python of some connected worker, checked at
//!   submission.
//! - `values`: clients' requests about values (protocol 14): where they are cached, where to
//!   put one, and those dropped.
//!
//! The engine touches no socket and reads no clock of its own: events come in as [`Inbound`],
//! everything goes out through each connection's [`Outbox`] (a channel of encoded frames),
//! and time comes from a function. A test builds outboxes from plain channels, steps the
//! engine with [`Engine::apply`] and [`Engine::settle`] at the times it chooses, and decodes
//! what each connection was sent (see `tests.rs`).

mod answer;
mod batch;
mod control;
mod departures;
mod durable;
mod inputs;
mod pythons;
mod route;
#[cfg(test)]
mod tests;
mod values;
mod watch;
mod workers;

use crate::config::ServerConfig;
use crate::journal::{Journal, JournalError, Restored};
use crate::now_us;
use crate::outbox::{ConnId, Outbox};
use crate::outputs::OutputLog;
use crate::traffic::TrafficCounters;
use answer::Waiter;
use durable::Durability;
use kestrel_core::{Config, Event, JobId, Reply, Scheduler, WorkerId};
use kestrel_proto::messages::{FromWorker, Registration, Request, ServerInfo};
use kestrel_proto::Access;
use route::Conns;
use rustc_hash::FxHashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Events from connections to the engine.
pub enum Inbound {
    /// A worker registered; `reply` gets its id.
    WorkerJoin {
        registration: Registration,
        peer: SocketAddr,
        outbox: Outbox,
        reply: oneshot::Sender<WorkerId>,
    },
    /// A registered worker's message.
    FromWorker { worker: WorkerId, msg: FromWorker },
    /// A worker's connection `conn` ended (its worker may have registered again since, under
    /// the same id, on another connection).
    WorkerGone {
        worker: WorkerId,
        conn: ConnId,
        reason: String,
    },
    /// A client connected.
    ClientJoin { outbox: Outbox },
    /// A client's request (boxed: a submission's spec is far bigger than the other events,
    /// and one allocation per request is nothing beside its decoding).
    Client { conn: ConnId, request: Box<Request> },
    /// A client's connection ended.
    ClientGone { conn: ConnId },
    /// Stop the server.
    Stop,
}

/// The scheduler and everything the server keeps around it.
pub struct Engine {
    core: Scheduler,
    /// The connections of registered workers and of clients.
    conns: Conns,
    /// Clients waiting for jobs to end.
    waiters: Vec<Waiter>,
    /// Clients' watches of jobs, pushed each task end.
    watch: watch::Watches,
    info: ServerInfo,
    heartbeat_ms: u64,
    stopping: bool,
    /// Worker reports that did not match a current assignment (late or duplicate).
    ignored_reports: u64,
    /// Identifies this server to reconnecting workers: they hand over their tasks and results
    /// only to the server they were registered with (kept in the journal across restarts).
    server_id: String,
    /// Random per start; a resuming worker's previous id counts only if it names this epoch.
    epoch: u64,
    /// The journal and the entries and replies waiting for its next commit.
    durable: Durability,
    /// Submission key -> job, so a retried submit finds its job.
    keys: FxHashMap<String, JobId>,
    /// Streamed output of tasks (`--stdout stream`); a forgotten job's goes with it.
    outputs: OutputLog,
    /// Microseconds since the epoch; [`now_us`] but in tests.
    clock: fn() -> u64,
    /// The store of jobs' files for jobs that name none.
    store: Option<String>,
    /// Jobs whose tasks wait for a failing store, with the latest reason a worker gave and
    /// when (see [`Engine::store_waiting`]).
    store_trouble: FxHashMap<JobId, (String, u64)>,
    /// Allocation queues and the workers they brought.
    provision: crate::provision::Provision,
    /// Workers that still run tasks and are to leave, with why (a released allocation,
    /// `kestrel worker stop`, SIGTERM): they take no new task and are told to leave once they
    /// run nothing.
    leaving: FxHashMap<WorkerId, String>,
    /// Workers that left lately, with when and why (`worker list --all`).
    departures: departures::Departures,
    /// Rows of pages answered in this pass (see [`batch::PASS_ROWS`]).
    pass_rows: usize,
    /// Clients' events left for the next pass once this one answered its share of pages.
    postponed: Vec<Inbound>,
    /// Bytes through the connections, counted by them (`server info`).
    traffic: Arc<TrafficCounters>,
    /// Which of the fitting workers the next value placed goes to (see `values`).
    next_place: usize,
}

impl Engine {
    /// An engine with an empty scheduler and no journal, serving at `access`'s address.
    pub fn new(config: &ServerConfig, access: &Access) -> Engine {
        let heartbeat_ms = config.heartbeat.as_millis().max(1) as u64;
        let defaults = Config::default();
        let mut core = Scheduler::new(Config {
            heartbeat_timeout_us: heartbeat_ms * 4 * 1000,
            quarantine_failures: if config.quarantine {
                defaults.quarantine_failures
            } else {
                0
            },
            first_job: config.first_job,
            window: config.window,
            util_threshold_permille: config.util_threshold_permille,
            store: config.store.clone(),
            ..defaults
        });
        core.set_dispatch_policy(kestrel_core::policy::by_name(
            config.policy,
            config.util_threshold_permille,
            defaults.max_queue_skips,
        ));
        let info = ServerInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: kestrel_proto::PROTOCOL_VERSION,
            address: access.address(),
            dir: config.dir.display().to_string(),
            pid: std::process::id(),
            started_us: now_us(),
            workers: 0,
            jobs: 0,
            live_jobs: 0,
            queued: 0,
            journal: None,
            intermediates_deleted: None,
            intermediates_remade: None,
            traffic: None,
            values_deleted: None,
        };
        let server_id = crate::journal::new_server_id();
        Engine {
            core,
            conns: Conns::default(),
            waiters: Vec::new(),
            watch: watch::Watches::default(),
            info,
            heartbeat_ms,
            stopping: false,
            ignored_reports: 0,
            store_trouble: FxHashMap::default(),
            provision: crate::provision::Provision::new(
                config.dir.join(kestrel_proto::ACCESS_FILE),
                config.dir.clone(),
                &server_id,
            ),
            leaving: FxHashMap::default(),
            departures: departures::Departures::default(),
            pass_rows: 0,
            postponed: Vec::new(),
            traffic: Arc::default(),
            next_place: 0,
            server_id,
            epoch: rand::random(),
            durable: Durability::default(),
            keys: FxHashMap::default(),
            outputs: OutputLog::default(),
            clock: now_us,
            store: config.store.clone(),
        }
    }

    /// What counts the bytes through its connections, for them to count into.
    pub(crate) fn traffic(&self) -> Arc<TrafficCounters> {
        Arc::clone(&self.traffic)
    }

    /// Replays the journal into the (fresh) scheduler and journals from now on.
    pub fn attach_journal(&mut self, journal: Journal) -> Result<Restored, JournalError> {
        let restored = self.replay(&journal)?;
        if let Ok(meta) = journal.meta() {
            if !meta.server_id.is_empty() {
                self.server_id = meta.server_id;
            }
            // Ids of workers that ran nothing the journal names: kept for them too.
            if let Some(next) = meta.next_worker {
                self.core.reserve_worker_ids(next);
            }
            // And ids of jobs whose rows went with them (`job forget`).
            if let Some(next) = meta.next_job {
                self.core.reserve_job_ids(next);
            }
            self.durable.kept_next_job(meta.next_job);
        }
        let now = self.now();
        match self.provision.restore(journal.path(), &self.server_id, now) {
            Ok(Some(line)) => tracing::info!("{line}"),
            Ok(None) => {}
            Err(e) => return Err(journal.damaged(format!("its allocation queues: {e}"))),
        }
        // The writer commits on a connection of its own; this one is kept for reads.
        let writer = journal.reopen().and_then(|w| {
            crate::journal::Writer::start(w, self.info.dir.clone()).map_err(|e| {
                JournalError::Open {
                    path: journal.path().to_path_buf(),
                    err: format!("cannot start the journal's writer thread: {e}"),
                }
            })
        })?;
        self.durable.rows = journal.rows();
        self.durable.writer = Some(writer);
        self.durable.journal = Some(journal);
        Ok(restored)
    }

    /// Replays a finished run's journal to answer questions about it and change nothing: no
    /// allocation queue comes back (it would start workers), nothing is journaled, and requests
    /// that would change something are refused with `why` (see [`crate::record`]).
    pub fn attach_record(
        &mut self,
        journal: Journal,
        why: String,
    ) -> Result<Restored, JournalError> {
        let restored = self.replay(&journal)?;
        self.durable.journal = Some(journal);
        self.durable.read_only = Some(why);
        Ok(restored)
    }

    /// Replays `journal` into the (fresh) scheduler and the output log.
    fn replay(&mut self, journal: &Journal) -> Result<Restored, JournalError> {
        let mut restored = Restored::default();
        self.keys = journal.replay(&mut self.core, &mut restored)?;
        for j in self.core.jobs() {
            self.outputs.note_job(&j.spec);
        }
        Ok(restored)
    }

    /// The time now, in microseconds since the epoch.
    fn now(&self) -> u64 {
        (self.clock)()
    }

    /// Hands the scheduler an event it never refuses (a worker's or time's); a refusal would be
    /// a defect of the scheduler, logged instead of stopping the server.
    fn event(&mut self, now: u64, ev: Event) -> Reply {
        match self.core.handle(now, ev) {
            Ok(reply) => reply,
            Err(e) => {
                tracing::error!("the scheduler refused an event it should take: {e}");
                Reply::Done
            }
        }
    }
}
