//! The batch loop: everything waiting on the channel (up to [`BATCH`] events) is applied, the
//! batch's inputs are committed, one scheduling pass runs, its commands go out, and the commit
//! that follows releases the replies held for it.

use super::{Engine, Inbound};
use kestrel_core::Event;
use kestrel_proto::messages::ToWorker;
use std::time::Duration;
use tokio::sync::mpsc;

/// How many events one batch applies before the engine schedules and sends.
const BATCH: usize = 4096;
/// How often time-driven work runs (heartbeat checks, wait progress).
const TICK: Duration = Duration::from_millis(100);
/// How long a stopping server waits for its workers to close their connections.
const FAREWELL_WAIT: Duration = Duration::from_secs(2);
/// Rows of pages (tasks, jobs, outputs) one pass answers at most: past them, clients' requests
/// wait for the next pass (in their order), so a client that sends a thousand page requests at
/// once holds neither gigabytes of answers nor the workers' reports behind them.
pub(super) const PASS_ROWS: usize = 40_000;

impl Engine {
    /// Runs until a stop request (or until every sender of `rx` is gone).
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Inbound>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::with_capacity(BATCH);
        let mut last_tick = tokio::time::Instant::now();
        // Woken when the journal's writer carried out a commit (never without a journal).
        let committed = self.durable.wake().unwrap_or_default();
        loop {
            if !self.postponed.is_empty() {
                // Requests left by the last pass go first, with what has come in meanwhile;
                // time-driven work is not held up by them.
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(ev) => batch.push(ev),
                        Err(_) => break,
                    }
                }
                let now = self.now();
                self.apply(now, batch.drain(..));
                if last_tick.elapsed() >= TICK {
                    last_tick = tokio::time::Instant::now();
                    self.tick(now);
                }
                if self.settle() {
                    break;
                }
                // This loop awaits nothing else: the connections that carry the answers out
                // (and bring requests in) run before the next pass.
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                n = rx.recv_many(&mut batch, BATCH) => {
                    if n == 0 {
                        break;
                    }
                    let now = self.now();
                    self.apply(now, batch.drain(..));
                }
                _ = tick.tick() => {
                    last_tick = tokio::time::Instant::now();
                    let now = self.now();
                    self.tick(now);
                }
                () = committed.notified() => self.collect_commits(),
            }
            if self.settle() {
                break;
            }
        }
        self.shut_down();
        self.await_farewells(&mut rx).await;
    }

    /// Waits (at most [`FAREWELL_WAIT`]) for the workers told to stop to close their
    /// connections: the farewell leaves through each connection's writer, and a server that
    /// exited before they all went out left some workers (a dozen of 200) trying to reconnect
    /// to a server that was gone.
    async fn await_farewells(&mut self, rx: &mut mpsc::UnboundedReceiver<Inbound>) {
        let deadline = tokio::time::Instant::now() + FAREWELL_WAIT;
        while !self.conns.workers.is_empty() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Inbound::WorkerGone { worker, conn, .. })) => {
                    if self
                        .conns
                        .workers
                        .get(&worker)
                        .is_some_and(|c| c.outbox.conn == conn)
                    {
                        self.conns.workers.remove(&worker);
                    }
                }
                // Nothing else is served any more.
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// Applies a batch of events at `now`, journaling what each recorded before the next;
    /// clients' events postponed by the last pass come first. Once the pass has answered
    /// [`PASS_ROWS`] rows of pages, clients' events wait for the next (workers' do not).
    pub fn apply(&mut self, now: u64, events: impl IntoIterator<Item = Inbound>) {
        self.pass_rows = 0;
        let earlier = std::mem::take(&mut self.postponed);
        for ev in earlier.into_iter().chain(events) {
            let client = matches!(
                ev,
                Inbound::Client { .. } | Inbound::ClientJoin { .. } | Inbound::ClientGone { .. }
            );
            if client && self.pass_rows >= PASS_ROWS {
                self.postponed.push(ev);
                continue;
            }
            self.handle(now, ev);
            self.journal_records(now);
        }
    }

    /// Time-driven work at `now`: lost workers, retry backoffs, progress of waits.
    pub fn tick(&mut self, now: u64) {
        self.event(now, Event::Tick);
        self.journal_records(now);
        self.send_progress(now);
        self.compact_journal();
        let sends = self.provision.tick(now, &self.core);
        for (worker, reason) in sends.drains {
            // A released allocation's workers finish what they run: as if their allocation
            // ended now, they take no new task, and what waits there for a slot goes back.
            self.event(now, Event::WorkerEnds { worker, at_us: now });
            self.leaving.insert(worker, reason);
        }
        self.send_off_drained();
        for (conn, id, result) in sends.replies {
            self.conns.send_now(conn, id, result);
        }
    }

    /// Ends a batch: commits its inputs, schedules once, sends the commands and commits again
    /// (releasing the replies held for it). Returns whether the engine is to stop.
    pub fn settle(&mut self) -> bool {
        // A job's tasks go out only once its submission is durable: otherwise a crash in
        // the sync could leave workers running tasks of a job id the journal never had.
        if self.durable.pending.has_inputs() {
            self.commit(true);
        }
        let now = self.now();
        self.event(now, Event::Schedule);
        self.route();
        if !self.leaving.is_empty() {
            // A stopping worker whose last task just ended goes now, not at the next tick.
            self.send_off_drained();
        }
        self.commit(self.stopping);
        self.stopping
    }

    /// Tells every worker the server is going away.
    fn shut_down(&mut self) {
        self.provision.shut_down();
        let bye = ToWorker::Shutdown {
            reason: "the server is stopping".into(),
        };
        for w in self.conns.workers.values() {
            w.outbox.send(&bye);
        }
        if self.ignored_reports > 0 {
            tracing::info!(
                "{} late or duplicate task reports were ignored",
                self.ignored_reports
            );
        }
    }

    /// Applies one event from a connection.
    fn handle(&mut self, now: u64, ev: Inbound) {
        match ev {
            Inbound::WorkerJoin {
                registration,
                peer,
                outbox,
                reply,
            } => self.worker_joined(now, registration, peer, outbox, reply),
            Inbound::FromWorker { worker, msg } => self.worker_said(now, worker, msg),
            Inbound::WorkerGone {
                worker,
                conn,
                reason,
            } => self.worker_gone(now, worker, conn, &reason),
            Inbound::ClientJoin { outbox } => {
                self.conns.clients.insert(outbox.conn, outbox);
            }
            Inbound::ClientGone { conn } => self.client_gone(conn),
            Inbound::Client { conn, request } => self.answer(now, conn, *request),
            Inbound::Stop => self.stopping = true,
        }
    }
}
