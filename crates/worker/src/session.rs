//! One connection's life: register, receive assignments, stage them and have the executor
//! start them on free slots, report batched starts and ends, answer cancels, send heartbeats.

use crate::exec::{ExitKind, Outcome};
use crate::executor::{next_done, Done, Executor};
use crate::ledger::{micros, now_us, Key, Ledger};
use crate::outputs::{self, OUTPUT_BYTES_PER_MESSAGE};
use crate::staging::{Staged, Staging};
use crate::state::{Carry, WorkerState};
use crate::{Connected, Handover, StopAsk, WorkerConfig, WorkerError};
use kestrel_core::{Failure, Finished, RunEnd, WorkerId};
use kestrel_proto::client::connect_as;
use kestrel_proto::messages::{
    CacheChange, CacheInfo, FromWorker, PythonRunner, Registration, Resume, ToWorker,
};
use kestrel_proto::{
    Access, ClientError, FrameReader, FrameWriter, ProtoError, Role, SPOKEN_VERSIONS,
};
use kestrel_proto::{
    ALLOC_VERSION, FILES_VERSION, FUNCTIONS_VERSION, NODES_VERSION, WORKERS_VERSION,
};
use rustc_hash::FxHashSet;
use std::time::Duration;

/// How a session ended.
pub(crate) enum SessionEnd {
    /// The server told the worker to exit.
    Shutdown(String),
    /// The connection dropped after registering; worth reconnecting.
    Lost(String),
    /// The worker was asked to stop at once ([`StopAsk::Now`], or a drain the server cannot
    /// do): its tasks are killed.
    Stopped(String),
}

/// Resolves with what the worker is asked when that changes (never, for a worker nothing
/// asks, or once the asker is gone).
pub(crate) async fn stop_asked(
    stop: &mut Option<tokio::sync::watch::Receiver<StopAsk>>,
) -> StopAsk {
    if let Some(rx) = stop {
        if rx.changed().await.is_ok() {
            return rx.borrow_and_update().clone();
        }
    }
    std::future::pending().await
}

/// Maps how the process ended to what the server records.
fn run_end(outcome: Outcome, timeout: Option<Duration>) -> RunEnd {
    let fail = |exit_code, signal, reason: String| {
        RunEnd::Failed(Box::new(Failure {
            exit_code,
            signal,
            reason,
            stderr_tail: outcome.stderr_tail.clone().unwrap_or_default(),
            permanent: false,
        }))
    };
    match &outcome.status {
        ExitKind::Exited(0) => RunEnd::Success,
        ExitKind::Exited(c) => fail(Some(*c), None, format!("exit code {c}")),
        ExitKind::Signaled(s) => fail(None, Some(*s), format!("killed by signal {s}")),
        ExitKind::TimedOut => fail(
            None,
            Some(libc::SIGKILL),
            format!(
                "timed out after {:?}; the process group was killed",
                timeout.unwrap_or_default()
            ),
        ),
        ExitKind::Canceled => RunEnd::Canceled,
        ExitKind::SpawnFailed(msg) => fail(None, None, msg.clone()),
        ExitKind::Unrunnable(msg) => RunEnd::Failed(Box::new(Failure {
            permanent: true,
            ..Failure::because(msg.clone())
        })),
        ExitKind::Raised(what) => fail(None, None, format!("raised {what}")),
        ExitKind::RunnerDied(how) => {
            let (code, signal) = match **how {
                ExitKind::Exited(c) => (Some(c), None),
                ExitKind::Signaled(s) => (None, Some(s)),
                _ => (None, None),
            };
            fail(
                code,
                signal,
                format!("its Python runner {how}; a fresh runner takes the next task"),
            )
        }
    }
}

/// Resolves when a worker thread asks for the cache to be reported now (never, for a worker
/// without a cache).
async fn report_asked(files: Option<&crate::files::WorkerFiles>) {
    match files {
        Some(f) => f.report_now.notified().await,
        None => std::future::pending().await,
    }
}

/// Connects, registers and serves until the connection ends. Running tasks and results not
/// yet sent stay in `state` when the connection drops, and go into the next registration.
pub(crate) async fn serve(
    config: &WorkerConfig,
    access: &Access,
    state: &mut WorkerState,
) -> Result<SessionEnd, WorkerError> {
    let (mut reader, mut writer, version) = connect_as(access, Role::Worker, SPOKEN_VERSIONS)
        .await
        // A handshake cut short is the protocol's error, as a lost connection is later.
        .map_err(|e| match e {
            ClientError::Proto(p) => WorkerError::Proto(p),
            other => WorkerError::Connect(other),
        })?;
    let WorkerState {
        exec,
        staging,
        carry: Carry { ledger, prev },
        ..
    } = state;
    // Starts the last connection did not report: its registration reports those tasks running.
    ledger.started.clear();
    let mut session = Session {
        version,
        config,
        exec: &mut **exec,
        staging,
        ledger,
        revoked: Vec::new(),
        signaled: Vec::new(),
        interrupted: None,
    };
    // Runs that ended while disconnected.
    session.take_done();
    let end = session
        .register(&mut reader, &mut writer, prev, access)
        .await;
    let end = match end {
        Ok(Ok((_, heartbeat_ms))) => session.run(&mut reader, &mut writer, heartbeat_ms).await,
        Ok(Err(end)) => Ok(end),
        Err(e) => Err(e),
    };
    let keep = match &end {
        Ok(SessionEnd::Lost(_)) => true,
        Ok(SessionEnd::Shutdown(_) | SessionEnd::Stopped(_)) => false,
        Err(e) => e.is_transient(),
    };
    // Ends held back go with the next session's report, unless the worker stops.
    let Session {
        exec,
        ledger,
        signaled,
        ..
    } = session;
    if keep {
        for (_, end, output) in signaled {
            ledger.finished.push(end);
            ledger.outputs.extend(output);
        }
    }
    // Tasks only queued here go back to the server's queue when it drops this registration.
    let mut not_started: Vec<Key> = exec
        .take_back_all()
        .iter()
        .map(|t| (t.job, t.index))
        .collect();
    not_started.extend(ledger.local.queue.iter().map(|t| (t.job, t.index)));
    ledger.local.queue.clear();
    // Their prefetch stops; running tasks keep theirs.
    if let Some(files) = &ledger.files {
        files.forget_prefetched(&not_started);
    }
    // The next registration is sent a job's template again before its first task; it tells
    // this worker to forget only the templates of jobs whose tasks it still runs then.
    let running = &ledger.running;
    ledger
        .local
        .jobs
        .retain(|job, _| running.keys().any(|(j, _)| j == job));
    if !keep {
        crate::executor::abandon(ledger, exec).await;
    }
    end
}

struct Session<'a> {
    /// The protocol version of the connection: below [`FILES_VERSION`] the server reads no
    /// cache, so none is reported (and it gives no task with files).
    version: u32,
    config: &'a WorkerConfig,
    exec: &'a mut dyn Executor,
    staging: &'a mut Staging,
    ledger: &'a mut Ledger,
    /// Answers to `Revoke` requests not sent yet, one per request.
    revoked: Vec<Vec<Key>>,
    /// Ends of runs killed by a signal that also stops workers, held back for
    /// [`SIGNALED_HOLD`] (see [`Session::on_done`]).
    signaled: Vec<Signaled>,
    /// Why the worker stops at once: its tasks were killed by the signal that drains it.
    interrupted: Option<String>,
}

/// A run's end held back: when it is due, the end, and its output report.
type Signaled = (
    tokio::time::Instant,
    Finished,
    Option<kestrel_proto::messages::TaskOutput>,
);

/// How long the end of a run killed by SIGTERM, SIGINT, SIGHUP or SIGKILL is held back before
/// it is reported as a failure: a batch system ending an allocation signals every process of
/// it at once, the worker and its tasks, and the worker may hear of its own signal after
/// its tasks' ends.
const SIGNALED_HOLD: Duration = Duration::from_secs(1);

/// Whether a run was killed by a signal that also stops workers (not by its timeout or a
/// cancel, which the worker sends).
fn killed_like_its_worker(status: &ExitKind) -> bool {
    matches!(status, ExitKind::Signaled(s)
        if [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGKILL].contains(s))
}

/// The cached files a registration lists: as many as fit in 8 MiB of names, so that a huge
/// cache never makes the registration larger than a frame (the rest are reported as they are
/// used again: a hit pins and reports nothing, so they are only missed for placement).
fn reportable(held: Vec<(String, u64)>) -> Vec<(String, u64)> {
    let mut left: usize = 8 << 20;
    held.into_iter()
        .take_while(|(name, _)| {
            let cost = name.len() + 12;
            let fits = cost <= left;
            left = left.saturating_sub(cost);
            fits
        })
        .collect()
}

impl Session<'_> {
    /// What to report of the cache in the next update: nothing to a server that cannot read
    /// it (the changes are dropped; a later registration at version 8 reports the cache whole).
    fn cache_change(&mut self) -> CacheChange {
        let change = self.ledger.take_cache_change();
        if self.version >= FILES_VERSION {
            change
        } else {
            CacheChange::default()
        }
    }

    /// Sends the registration (with what survived the last connection, and `prev`, the last
    /// registration) and waits for the answer; tells [`WorkerConfig::on_connect`]. Returns the
    /// worker id and heartbeat interval.
    async fn register(
        &mut self,
        reader: &mut FrameReader<kestrel_proto::ConnRead>,
        writer: &mut FrameWriter<kestrel_proto::ConnWrite>,
        prev: &mut Option<(WorkerId, String, u64)>,
        access: &Access,
    ) -> Result<Result<(WorkerId, u64), SessionEnd>, WorkerError> {
        let exec = self.exec.kind();
        if self.version < ALLOC_VERSION && self.config.ends_at_s.is_some() {
            tracing::warn!(
                "the server speaks protocol {}, older than {ALLOC_VERSION}: it is not told when this worker's allocation ends (--ends-at), and may start tasks that outlive it; upgrade the server",
                self.version
            );
        }
        let l = &mut *self.ledger;
        // Results whose output would make the registration too big are reported as still
        // running; their ends follow in the first updates.
        let (sent, sent_outputs) =
            outputs::fitting(&l.finished, &l.outputs, OUTPUT_BYTES_PER_MESSAGE);
        let resume = prev.as_ref().map(|(worker, server_id, epoch)| {
            let mut running: Vec<Key> = l.running.keys().copied().collect();
            running.extend(l.finished[sent..].iter().map(|f| (f.job, f.index)));
            running.sort_unstable();
            Resume {
                server_id: server_id.clone(),
                previous_worker: *worker,
                epoch: *epoch,
                running,
                finished: l.finished[..sent].to_vec(),
                outputs: outputs::for_version(&l.outputs[..sent_outputs], self.version),
            }
        });
        writer
            .send(&FromWorker::Register(Registration {
                hostname: self.config.hostname.clone(),
                slots: self.config.slots,
                gpus: self.config.gpus.len() as u32,
                mem: self.config.mem,
                named: self.config.named.clone(),
                // An older server refuses the longer registration.
                alloc: self.config.alloc.filter(|_| self.version >= ALLOC_VERSION),
                ends_at_s: self
                    .config
                    .ends_at_s
                    .filter(|_| self.version >= ALLOC_VERSION),
                group: self
                    .config
                    .group
                    .clone()
                    .filter(|_| self.version >= NODES_VERSION),
                python: self
                    .exec
                    .python()
                    .filter(|_| self.version >= FUNCTIONS_VERSION)
                    .map(|p| PythonRunner {
                        python: p.python.clone(),
                        cloudpickle: p.cloudpickle.clone(),
                        executable: p.executable.clone(),
                    }),
                cache: self
                    .ledger
                    .files
                    .as_ref()
                    .filter(|_| self.version >= FILES_VERSION)
                    .map(|files| {
                        // Peers sign their requests with this server's secret.
                        files.peers.set_key(access.secret_bytes());
                        let c = crate::files::lock(files);
                        CacheInfo {
                            serves: files.peers.url().unwrap_or_default().to_string(),
                            capacity: c.capacity(),
                            held: reportable(c.held()),
                        }
                    }),
                prefetch: self.config.prefetch,
                exec: exec.into(),
                resume,
            }))
            .await?;
        let (worker, heartbeat_ms, server, server_id, epoch) =
            match reader.recv::<ToWorker>().await? {
                ToWorker::Registered {
                    worker,
                    heartbeat_ms,
                    server,
                    server_id,
                    epoch,
                } => (worker, heartbeat_ms, server, server_id, epoch),
                ToWorker::Shutdown { reason } => return Ok(Err(SessionEnd::Shutdown(reason))),
                other => {
                    return Err(WorkerError::Proto(ProtoError::Decode(format!(
                        "expected registration, got {other:?}"
                    ))))
                }
            };
        let l = &mut *self.ledger;
        let carried = (l.running.len(), l.finished.len());
        let values_tag = kestrel_core::values::server_tag(&server_id);
        let handover = match prev.take() {
            Some((_, old, _)) if old != server_id => {
                // Another server: its tasks are not this one's; stop them and drop their results.
                tracing::warn!(
                    running = carried.0,
                    results = carried.1,
                    "registered with a different server; dropping the previous server's tasks"
                );
                crate::executor::abandon(l, &mut *self.exec).await;
                l.local = self.config.local();
                // And its values, which it alone would have dropped.
                if let Some(files) = &l.files {
                    let gone = crate::files::lock(files).release_values();
                    for path in gone {
                        let _ = std::fs::remove_file(path);
                    }
                }
                Some(Handover::Dropped {
                    running: carried.0,
                    results: carried.1,
                })
            }
            Some(_) => {
                if carried != (0, 0) {
                    tracing::info!(
                        running = carried.0,
                        results = carried.1,
                        "handed running tasks and results to the server"
                    );
                }
                l.finished.drain(..sent);
                l.outputs.drain(..sent_outputs);
                // Results that did not fit went as running tasks.
                Some(Handover::Resumed {
                    running: carried.0 + carried.1 - sent,
                    results: sent,
                })
            }
            None => None,
        };
        *prev = Some((worker, server_id, epoch));
        tracing::info!(worker, server = %server, slots = self.config.slots, exec, "registered");
        if let Some(announce) = self.config.on_connect {
            announce(&Connected {
                worker,
                address: access.address(),
                config: self.config,
                handover,
            });
        }
        self.ledger.me.worker = worker;
        self.ledger.me.server = server;
        self.ledger.me.values_tag = values_tag;
        Ok(Ok((worker, heartbeat_ms)))
    }

    async fn run(
        &mut self,
        reader: &mut FrameReader<kestrel_proto::ConnRead>,
        writer: &mut FrameWriter<kestrel_proto::ConnWrite>,
        heartbeat_ms: u64,
    ) -> Result<SessionEnd, WorkerError> {
        let mut heartbeat = tokio::time::interval(Duration::from_millis(heartbeat_ms.max(10)));
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent_since_tick = false;
        let mut stop = self.config.stop.clone();
        // Asked before this connection (a drain that outlived a lost connection): said again.
        let asked = stop.as_mut().map(|rx| rx.borrow_and_update().clone());
        if let Some(end) = self.stop_asked(asked.unwrap_or_default(), writer).await? {
            return Ok(end);
        }
        loop {
            let held_until = self.signaled.iter().map(|(due, ..)| *due).min();
            tokio::select! {
                ask = stop_asked(&mut stop) => {
                    if let Some(end) = self.stop_asked(ask, writer).await? {
                        return Ok(end);
                    }
                    self.release_signaled();
                }
                () = tokio::time::sleep_until(held_until.unwrap_or_else(tokio::time::Instant::now)), if held_until.is_some() => {
                    self.release_signaled();
                }
                msg = reader.try_recv::<ToWorker>() => match msg {
                    Ok(Some(m)) => {
                        if let Some(end) = self.on_message(m) {
                            return Ok(end);
                        }
                    }
                    Ok(None) => return Ok(SessionEnd::Lost("the server closed the connection".into())),
                    Err(ProtoError::Io(e)) => return Ok(SessionEnd::Lost(e.to_string())),
                    Err(e) => return Err(e.into()),
                },
                Some(done) = next_done(&mut *self.exec) => {
                    self.on_done(done);
                    self.take_done();
                }
                () = report_asked(self.ledger.files.as_deref()) => {
                    self.send_update(writer).await?;
                    sent_since_tick = true;
                }
                _ = heartbeat.tick() => {
                    // What staging has to say (a store that fails) goes out even while no
                    // task starts or ends.
                    let staged = self.ledger.files.as_ref().is_some_and(|f| f.has_change());
                    if staged {
                        self.send_update(writer).await?;
                    } else if !sent_since_tick {
                        writer.send(&FromWorker::Heartbeat).await?;
                    }
                    sent_since_tick = false;
                }
            }
            if let Some(reason) = self.interrupted.take() {
                if let Some(end) = self.stop_asked(StopAsk::Now(reason), writer).await? {
                    return Ok(end);
                }
            }
            self.start_tasks();
            let l = &self.ledger;
            if !l.started.is_empty() || !l.finished.is_empty() {
                self.send_update(writer).await?;
                sent_since_tick = true;
            }
            for tasks in std::mem::take(&mut self.revoked) {
                writer.send(&FromWorker::Revoked { tasks }).await?;
                sent_since_tick = true;
            }
        }
    }

    /// Carries out what the worker is asked: a drain is the server's to do (it sends off the
    /// worker once it runs nothing), and a server older than [`WORKERS_VERSION`] cannot, so
    /// the worker stops at once; a stop at once is said to the server (its tasks go back to the
    /// queue without spending a retry) and ends the session. Returns how the session ends, if
    /// it does.
    async fn stop_asked(
        &mut self,
        ask: StopAsk,
        writer: &mut FrameWriter<kestrel_proto::ConnWrite>,
    ) -> Result<Option<SessionEnd>, WorkerError> {
        let can_say = self.version >= WORKERS_VERSION;
        match ask {
            StopAsk::Run => Ok(None),
            StopAsk::Drain(reason) if can_say => {
                writer
                    .send(&FromWorker::Leaving { now: false, reason })
                    .await?;
                Ok(None)
            }
            StopAsk::Drain(reason) => {
                tracing::warn!(
                    "the server speaks protocol {}, older than {WORKERS_VERSION}: it cannot let this worker finish its tasks, so it stops now (its tasks go back to the queue); upgrade the server",
                    self.version
                );
                Ok(Some(SessionEnd::Stopped(reason)))
            }
            StopAsk::Now(reason) => {
                if can_say {
                    // Said if it can be: a worker that cannot reach its server stops all the same.
                    let leaving = FromWorker::Leaving {
                        now: true,
                        reason: reason.clone(),
                    };
                    let _ = writer.send(&leaving).await;
                }
                Ok(Some(SessionEnd::Stopped(reason)))
            }
        }
    }

    fn on_message(&mut self, m: ToWorker) -> Option<SessionEnd> {
        let l = &mut *self.ledger;
        match m {
            ToWorker::Registered { .. } => {}
            ToWorker::DefineJob {
                job,
                template,
                ids,
                resources,
                named,
                store,
            } => l.local.define(job, *template, ids, resources, named, store),
            ToWorker::Assign { tasks } => {
                let now = now_us();
                for run in tasks {
                    let r = run.run;
                    match self.staging.stage(&run) {
                        Staged::Ready => l.local.enqueue(run, now),
                    }
                    if let Some(files) = &l.files {
                        crate::staging::prefetch(&l.local, files, r);
                    }
                }
            }
            ToWorker::Revoke { tasks } => {
                // Those still waiting for a slot go back; those started run on.
                let mut given = l.local.unqueue(&tasks);
                given.extend(self.exec.take_back(&tasks).iter().map(|t| (t.job, t.index)));
                if let Some(files) = &l.files {
                    files.forget_prefetched(&given);
                }
                self.revoked.push(given);
            }
            ToWorker::Cancel { tasks } => {
                let now = now_us();
                let mut canceled = l.local.unqueue(&tasks);
                // Those the executor took but has not started; those it started end as canceled.
                canceled.extend(self.exec.cancel(&tasks).iter().map(|t| (t.job, t.index)));
                if let Some(files) = &l.files {
                    files.forget_prefetched(&canceled);
                }
                for (job, index) in canceled {
                    l.finished
                        .push(Finished::at_once(job, index, now, RunEnd::Canceled));
                }
                for key in &tasks {
                    if let Some(r) = l.running.get(key) {
                        r.cancel.cancel();
                    }
                }
            }
            ToWorker::ForgetJob { job } => {
                let dirs = l.local.jobs.remove(&job).map(|d| d.output_dirs(job));
                if let Some(dirs) = dirs.filter(|d| !d.is_empty()) {
                    // Off the loop: a shared file system may be slow to answer.
                    tokio::task::spawn_blocking(move || {
                        for d in dirs {
                            let _ = std::fs::remove_dir(d);
                        }
                    });
                }
            }
            ToWorker::Shutdown { reason } => return Some(SessionEnd::Shutdown(reason)),
            // Both off the session's loop, on tokio's bounded pool of blocking threads: the
            // copies come over the network, and a workflow's files may be thousands to unlink.
            ToWorker::Replicate { files } => {
                if let Some(f) = &l.files {
                    f.replicas_begin(&files);
                    let f = f.clone();
                    tokio::task::spawn_blocking(move || crate::files::replicate(files, &f));
                }
            }
            ToWorker::DropFiles { files } => {
                if let Some(f) = &l.files {
                    f.replicas_dropped(&files);
                    let f = f.clone();
                    tokio::task::spawn_blocking(move || {
                        let gone: Vec<_> = {
                            let mut c = crate::files::lock(&f);
                            files.iter().filter_map(|n| c.release(n)).collect()
                        };
                        for path in gone {
                            let _ = std::fs::remove_file(path);
                        }
                        // The server's view of the cache (`worker list`) follows now, not at
                        // the next task or heartbeat.
                        f.report_now.notify_one();
                    });
                }
            }
            ToWorker::Sources { files } => {
                if let Some(f) = &l.files {
                    f.peers.note_sources(files);
                }
            }
        }
        None
    }

    /// Has the executor start what it can: called after every event.
    fn start_tasks(&mut self) {
        self.exec.start(self.ledger);
    }

    /// Handles the runs that have ended, without waiting.
    fn take_done(&mut self) {
        while let Some(done) = self.exec.try_done() {
            self.on_done(done);
        }
    }

    fn on_done(&mut self, done: Done) {
        let l = &mut *self.ledger;
        let ran = l.running.remove(&done.key);
        let started_us = micros(done.outcome.started);
        let finished_us = micros(done.outcome.finished);
        let (held, waited_us) = match ran {
            Some(r) => (r.held, Some(r.waited_us)),
            None => (Default::default(), None),
        };
        // Its follower runs whether or not this run is known here: it must be tracked.
        match l.hand_on(done.next, finished_us, held) {
            Ok(key) => l.started.push(kestrel_proto::messages::Started {
                job: key.0,
                index: key.1,
                at_us: finished_us,
            }),
            Err(held) => {
                l.local.release(held);
                // Tasks the executor took for the job while its run was ending go back to the
                // head of the queue, to start in the slot just freed.
                let job = done.key.0;
                let running = l.running_of(job);
                for task in self.exec.unfollowed(job, running).into_iter().rev() {
                    l.local.queue.push_front(task);
                }
            }
        }
        // A run this session did not start or carry has nothing to report.
        let Some(waited_us) = waited_us else {
            return;
        };
        let mut outcome = done.outcome;
        let files = self.version >= kestrel_proto::OUTPUT_FILES_VERSION;
        let output = outputs::of_run(done.key, &mut outcome, files);
        let killed = killed_like_its_worker(&outcome.status);
        let end = run_end(outcome, done.timeout);
        if end == RunEnd::Success {
            l.note_wait(done.key.0, waited_us);
        }
        let finished = Finished {
            job: done.key.0,
            index: done.key.1,
            started_us,
            finished_us,
            end,
        };
        if killed {
            // Killed by what drains the worker (a batch system ending the allocation signals
            // all its processes): not the task's failure. The worker stops at once instead,
            // and the server puts its tasks back without spending a retry. Not draining yet:
            // held back a moment, in case the worker's own signal comes just after.
            if let Some(why) = crate::drain_asked(self.config) {
                self.interrupt(&finished, &why);
            } else {
                let due = tokio::time::Instant::now() + SIGNALED_HOLD;
                self.signaled.push((due, finished, output));
            }
            return;
        }
        l.outputs.extend(output);
        l.finished.push(finished);
    }

    /// The worker stops at once because `killed` was killed by the signal that drains it
    /// (`why`: the drain's reason).
    fn interrupt(&mut self, killed: &Finished, why: &str) {
        if self.interrupted.is_none() {
            let signal = match &killed.end {
                RunEnd::Failed(f) => f.signal.unwrap_or_default(),
                _ => 0,
            };
            self.interrupted = Some(format!(
                "{why} and its tasks were killed by signal {signal} (its allocation or node is going away); they go back to the queue"
            ));
        }
    }

    /// Ends held back ([`SIGNALED_HOLD`]): if the worker now drains, its tasks were killed by
    /// the same signal and it stops at once; those due are reported as the failures they are.
    fn release_signaled(&mut self) {
        if self.signaled.is_empty() {
            return;
        }
        if let Some(why) = crate::drain_asked(self.config) {
            let held = std::mem::take(&mut self.signaled);
            self.interrupt(&held[0].1, &why);
            return;
        }
        let now = tokio::time::Instant::now();
        let (due, held): (Vec<Signaled>, Vec<Signaled>) = std::mem::take(&mut self.signaled)
            .into_iter()
            .partition(|(due, _, _)| *due <= now);
        self.signaled = held;
        let l = &mut *self.ledger;
        for (_, end, output) in due {
            l.outputs.extend(output);
            l.finished.push(end);
        }
    }

    async fn send_update(
        &mut self,
        writer: &mut FrameWriter<kestrel_proto::ConnWrite>,
    ) -> Result<(), WorkerError> {
        // A start whose end is in the same update says nothing new.
        if !self.ledger.finished.is_empty() && !self.ledger.started.is_empty() {
            let ended: FxHashSet<Key> = self
                .ledger
                .finished
                .iter()
                .map(|f| (f.job, f.index))
                .collect();
            self.ledger
                .started
                .retain(|s| !ended.contains(&(s.job, s.index)));
        }
        // Streamed output can be big: the ends go in as many messages as it needs.
        loop {
            let (ends, outs) = outputs::fitting(
                &self.ledger.finished,
                &self.ledger.outputs,
                OUTPUT_BYTES_PER_MESSAGE,
            );
            if ends == self.ledger.finished.len() {
                return self.send_all(writer).await;
            }
            let msg = FromWorker::Update {
                started: std::mem::take(&mut self.ledger.started),
                finished: self.ledger.finished.drain(..ends).collect(),
                outputs: self.ledger.outputs.drain(..outs).collect(),
                waited: std::mem::take(&mut self.ledger.waited),
                cache: self.cache_change(),
            };
            if let Err(e) = writer.send(&msg).await {
                // The results stay for the next registration's resume report.
                if let FromWorker::Update {
                    finished,
                    outputs,
                    waited,
                    ..
                } = msg
                {
                    self.ledger.finished.splice(..0, finished);
                    self.ledger.outputs.splice(..0, outputs);
                    self.ledger.waited = waited;
                }
                return Err(e.into());
            }
        }
    }

    /// Sends every start and end in one update.
    async fn send_all(
        &mut self,
        writer: &mut FrameWriter<kestrel_proto::ConnWrite>,
    ) -> Result<(), WorkerError> {
        let msg = FromWorker::Update {
            started: std::mem::take(&mut self.ledger.started),
            finished: std::mem::take(&mut self.ledger.finished),
            outputs: std::mem::take(&mut self.ledger.outputs),
            waited: std::mem::take(&mut self.ledger.waited),
            cache: self.cache_change(),
        };
        let sent = writer.send(&msg).await;
        // The vectors go back for the next update, keeping their capacity (allocating them
        // afresh for every update cost page faults); on an error the results stay for the
        // next registration's resume report.
        if let FromWorker::Update {
            mut started,
            mut finished,
            mut outputs,
            mut waited,
            cache,
        } = msg
        {
            if sent.is_err() {
                // Reported with the next registration's cache instead.
                drop(cache);
            }
            started.clear();
            if sent.is_ok() {
                finished.clear();
                outputs.clear();
                waited.clear();
            }
            self.ledger.started = started;
            self.ledger.finished = finished;
            self.ledger.outputs = outputs;
            self.ledger.waited = waited;
        }
        sent.map_err(WorkerError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::CancelHandle;
    use crate::ledger::Running;
    use crate::local::LocalTask;
    use kestrel_core::{IndexRun, Resources};
    use kestrel_proto::messages::{Assigned, JobIds};
    use std::collections::VecDeque;
    use std::task::{Context, Poll};
    use std::time::SystemTime;

    /// An executor that runs nothing: it records what the session asks of it, and the test
    /// says when runs end.
    #[derive(Default)]
    struct Double {
        started: Vec<(Key, CancelHandle)>,
        ended: VecDeque<Done>,
        canceled: Vec<Key>,
    }

    impl Executor for Double {
        fn kind(&self) -> &'static str {
            "double"
        }

        fn start(&mut self, ledger: &mut Ledger) {
            while let Some((task, held)) = ledger.local.next_startable() {
                let key = (task.job, task.index);
                let cancel = CancelHandle::new();
                let run = Running {
                    cancel: cancel.clone(),
                    held,
                    waited_us: 0,
                };
                ledger.start_running(key, run, now_us());
                self.started.push((key, cancel));
            }
        }

        fn poll_done(&mut self, _cx: &mut Context<'_>) -> Poll<Option<Done>> {
            self.ended
                .pop_front()
                .map_or(Poll::Pending, |d| Poll::Ready(Some(d)))
        }

        fn try_done(&mut self) -> Option<Done> {
            self.ended.pop_front()
        }

        fn cancel(&mut self, keys: &[Key]) -> Vec<LocalTask> {
            self.canceled.extend_from_slice(keys);
            Vec::new()
        }
    }

    /// A session's borrowed parts, kept apart so a test can look at its executor between
    /// events.
    struct Rig {
        config: WorkerConfig,
        exec: Double,
        staging: Staging,
        ledger: Ledger,
    }

    impl Rig {
        fn new(slots: u32) -> Rig {
            let config = WorkerConfig::new(slots);
            let ledger = Ledger::new(&config);
            Rig {
                config,
                exec: Double::default(),
                staging: Staging::default(),
                ledger,
            }
        }

        fn session(&mut self) -> Session<'_> {
            Session {
                version: kestrel_proto::PROTOCOL_VERSION,
                config: &self.config,
                exec: &mut self.exec,
                staging: &mut self.staging,
                ledger: &mut self.ledger,
                revoked: Vec::new(),
                signaled: Vec::new(),
                interrupted: None,
            }
        }

        /// Handles `m` as the session loop does, starting what can start after it.
        fn message(&mut self, m: ToWorker) -> Vec<Vec<Key>> {
            let mut s = self.session();
            assert!(s.on_message(m).is_none());
            s.start_tasks();
            s.revoked
        }

        /// Hears of the runs the executor reports ended, as the session loop does.
        fn ends(&mut self, ended: Vec<(Key, ExitKind)>) {
            let now = SystemTime::now();
            self.exec
                .ended
                .extend(ended.into_iter().map(|(key, status)| Done {
                    key,
                    outcome: Outcome {
                        started: now,
                        finished: now,
                        status,
                        stderr_tail: None,
                        stdout: None,
                        stderr: None,
                        own_files: [None; 2],
                    },
                    timeout: None,
                    next: None,
                }));
            let mut s = self.session();
            s.take_done();
            s.start_tasks();
        }

        fn started(&self) -> Vec<Key> {
            self.exec.started.iter().map(|(k, _)| *k).collect()
        }
    }

    fn assign(job: u32, first: u32, count: u32) -> ToWorker {
        ToWorker::Assign {
            tasks: vec![Assigned::run(IndexRun { job, first, count })],
        }
    }

    #[test]
    fn a_session_drives_its_executor_through_the_trait() {
        let mut rig = Rig::new(2);
        rig.message(ToWorker::DefineJob {
            job: 1,
            template: Box::default(),
            ids: JobIds::List,
            resources: Resources {
                cpus: 1,
                ..Resources::NONE
            },
            named: vec![],
            store: None,
        });
        rig.message(assign(1, 0, 4));
        // Two slots: two tasks start, reported as started; two wait in the queue.
        assert_eq!(rig.started(), [(1, 0), (1, 1)]);
        assert_eq!(rig.ledger.started.len(), 2);
        assert_eq!(rig.ledger.local.queue.len(), 2);

        // The executor reports both ended: their ends are recorded, and their slots go to the
        // two queued tasks.
        rig.ends(vec![
            ((1, 0), ExitKind::Exited(0)),
            ((1, 1), ExitKind::Exited(3)),
        ]);
        let ends: Vec<_> = rig
            .ledger
            .finished
            .iter()
            .map(|f| (f.index, &f.end))
            .collect();
        assert_eq!(ends[0], (0, &RunEnd::Success));
        assert!(matches!(ends[1], (1, RunEnd::Failed(f)) if f.exit_code == Some(3)));
        assert_eq!(rig.started(), [(1, 0), (1, 1), (1, 2), (1, 3)]);
        assert_eq!(rig.ledger.running.len(), 2);
        assert_eq!(rig.ledger.waited.len(), 1, "the success's wait for a slot");

        // A cancel reaches the executor and the running task's handle, and no other.
        rig.message(ToWorker::Cancel {
            tasks: vec![(1, 2)],
        });
        assert_eq!(rig.exec.canceled, [(1, 2)]);
        let canceled: Vec<bool> = rig
            .exec
            .started
            .iter()
            .map(|(_, c)| c.is_canceled())
            .collect();
        assert_eq!(canceled, [false, false, true, false]);

        // A task assigned while the slots are busy waits in the queue: a revoke gives it back.
        rig.message(assign(1, 4, 1));
        assert_eq!(
            rig.message(ToWorker::Revoke {
                tasks: vec![(1, 4)]
            }),
            [vec![(1, 4)]]
        );
        assert_eq!(rig.started().len(), 4);
    }
}
