//! One connection's life: register, receive assignments, start tasks on free slots, report
//! batched starts and ends, answer cancels, send heartbeats.

use crate::exec::{CancelHandle, ExitKind, Outcome};
use crate::local::{Held, Identity, Local, LocalTask};
use crate::outputs::{self, OUTPUT_BYTES_PER_MESSAGE};
use crate::pool::{Done, Key, Pool};
use crate::{Connected, ExecMode, Handover, WorkerConfig, WorkerError};
use kestrel_core::{Failure, Finished, JobId, RunEnd, WorkerId};
use kestrel_proto::client::open;
use kestrel_proto::messages::{FromWorker, Registration, Resume, Started, TaskOutput, ToWorker};
use kestrel_proto::{connect_handshake, Access, FrameReader, FrameWriter, ProtoError, Role};
use rustc_hash::{FxHashMap, FxHashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How a session ended.
pub(crate) enum SessionEnd {
    /// The server told the worker to exit.
    Shutdown(String),
    /// The connection dropped after registering; worth reconnecting.
    Lost(String),
}

struct Running {
    cancel: CancelHandle,
    /// What it holds, kept here because its job's definition may be forgotten first.
    held: Held,
    /// How long it waited here for a slot.
    waited_us: u64,
}

/// What outlives a dropped connection: templates, running tasks and their buffered results,
/// so the next registration hands them over instead of the server running them again.
#[derive(Default)]
pub(crate) struct Carry {
    local: Option<Local>,
    running: FxHashMap<Key, Running>,
    finished: Vec<Finished>,
    /// Streamed output of `finished`, in its order.
    outputs: Vec<TaskOutput>,
    /// Summed waits for a slot of successful tasks, per job, not reported yet.
    waited: Vec<(JobId, u64)>,
    /// Worker id and server id of the last registration.
    prev: Option<(WorkerId, String, u64)>,
}

impl Carry {
    /// Whether the worker has registered with a server at least once.
    pub(crate) fn registered(&self) -> bool {
        self.prev.is_some()
    }

    /// The connection is gone for good: stop the tasks and wait until they are reaped.
    pub(crate) async fn abandon(&mut self, pool: &mut Option<Pool>) {
        if let Some(p) = pool.as_mut() {
            // Those no thread has taken were only queued here; the others end at once.
            p.take_back_all();
            p.cancel_all_decked();
        }
        for r in self.running.values() {
            r.cancel.cancel();
        }
        while !self.running.is_empty() {
            let Some(done) = recv_done(pool).await else {
                break;
            };
            let held = self.running.remove(&done.key).map(|r| r.held);
            // A follower was canceled above: it ends at once, and is waited for like the rest.
            let _ = hand_on(&mut self.running, &done, pool, held.unwrap_or_default());
        }
        self.finished.clear();
        self.outputs.clear();
    }
}

fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn now_us() -> u64 {
    micros(SystemTime::now())
}

/// Maps how the process ended to what the server records.
fn run_end(outcome: Outcome, timeout: Option<Duration>) -> RunEnd {
    let fail = |exit_code, signal, reason: String| {
        RunEnd::Failed(Box::new(Failure {
            exit_code,
            signal,
            reason,
            stderr_tail: outcome.stderr_tail.clone().unwrap_or_default(),
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
    }
}

/// Connects, registers and serves until the connection ends. Running tasks and results not
/// yet sent stay in `carry` when the connection drops, and go into the next registration.
pub(crate) async fn serve(
    config: &WorkerConfig,
    access: &Access,
    pool: &mut Option<Pool>,
    carry: &mut Carry,
) -> Result<SessionEnd, WorkerError> {
    let (r, w) = open(access).await?;
    let mut reader = FrameReader::new(r);
    let mut writer = FrameWriter::new(w);
    connect_handshake(
        &mut reader,
        &mut writer,
        Role::Worker,
        &access.secret_bytes(),
    )
    .await
    .map_err(WorkerError::from_handshake)?;
    let exec = match config.exec {
        ExecMode::Process => "process",
        ExecMode::Noop => "noop",
    };
    let mut session = Session {
        config,
        me: Identity {
            worker: 0,
            server: String::new(),
            server_dir: config.server_dir.clone(),
        },
        local: carry.local.take().unwrap_or_else(|| config.local()),
        running: std::mem::take(&mut carry.running),
        started: Vec::new(),
        finished: std::mem::take(&mut carry.finished),
        revoked: Vec::new(),
        outputs: std::mem::take(&mut carry.outputs),
        waited: std::mem::take(&mut carry.waited),
    };
    // Runs that ended while disconnected.
    while let Some(done) = pool.as_mut().and_then(Pool::try_done) {
        session.on_done(done, pool);
    }
    let end = session
        .register(&mut reader, &mut writer, pool, carry, (exec, access))
        .await;
    let end = match end {
        Ok(Ok((_, heartbeat_ms))) => {
            session
                .run(&mut reader, &mut writer, pool, heartbeat_ms)
                .await
        }
        Ok(Err(end)) => Ok(end),
        Err(e) => Err(e),
    };
    let keep = match &end {
        Ok(SessionEnd::Lost(_)) => true,
        Ok(SessionEnd::Shutdown(_)) => false,
        Err(e) => e.is_transient(),
    };
    // Tasks only queued here go back to the server's queue when it drops this registration.
    if let Some(p) = pool.as_mut() {
        p.take_back_all();
    }
    session.local.queue.clear();
    // The next registration is sent a job's template again before its first task; it tells
    // this worker to forget only the templates of jobs whose tasks it still runs then.
    let running = &session.running;
    session
        .local
        .jobs
        .retain(|job, _| running.keys().any(|(j, _)| j == job));
    carry.local = Some(session.local);
    carry.running = session.running;
    carry.finished = session.finished;
    carry.outputs = session.outputs;
    carry.waited = session.waited;
    if !keep {
        carry.abandon(pool).await;
    }
    end
}

struct Session<'a> {
    config: &'a WorkerConfig,
    me: Identity,
    local: Local,
    running: FxHashMap<Key, Running>,
    started: Vec<Started>,
    finished: Vec<Finished>,
    /// Answers to `Revoke` requests not sent yet, one per request.
    revoked: Vec<Vec<Key>>,
    /// Streamed output of `finished`, in its order (see [`outputs`]).
    outputs: Vec<TaskOutput>,
    /// Summed waits for a slot of successful tasks, per job, for the next update.
    waited: Vec<(JobId, u64)>,
}

impl Session<'_> {
    /// Sends the registration (with what survived the last connection) and waits for the
    /// answer; tells [`WorkerConfig::on_connect`]. Returns the worker id and heartbeat interval.
    async fn register(
        &mut self,
        reader: &mut FrameReader<kestrel_proto::ConnRead>,
        writer: &mut FrameWriter<kestrel_proto::ConnWrite>,
        pool: &mut Option<Pool>,
        carry: &mut Carry,
        (exec, access): (&str, &Access),
    ) -> Result<Result<(WorkerId, u64), SessionEnd>, WorkerError> {
        // Results whose output would make the registration too big are reported as still
        // running; their ends follow in the first updates.
        let (sent, sent_outputs) =
            outputs::fitting(&self.finished, &self.outputs, OUTPUT_BYTES_PER_MESSAGE);
        let resume = carry.prev.as_ref().map(|(worker, server_id, epoch)| {
            let mut running: Vec<Key> = self.running.keys().copied().collect();
            running.extend(self.finished[sent..].iter().map(|f| (f.job, f.index)));
            running.sort_unstable();
            Resume {
                server_id: server_id.clone(),
                previous_worker: *worker,
                epoch: *epoch,
                running,
                finished: self.finished[..sent].to_vec(),
                outputs: self.outputs[..sent_outputs].to_vec(),
            }
        });
        writer
            .send(&FromWorker::Register(Registration {
                hostname: self.config.hostname.clone(),
                slots: self.config.slots,
                gpus: self.config.gpus,
                mem: self.config.mem,
                named: self.config.named.clone(),
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
        let carried = (self.running.len(), self.finished.len());
        let handover = match carry.prev.take() {
            Some((_, old, _)) if old != server_id => {
                // Another server: its tasks are not this one's; stop them and drop their results.
                tracing::warn!(
                    running = self.running.len(),
                    results = self.finished.len(),
                    "registered with a different server; dropping the previous server's tasks"
                );
                let mut old = Carry {
                    running: std::mem::take(&mut self.running),
                    ..Carry::default()
                };
                old.abandon(pool).await;
                self.finished.clear();
                self.outputs.clear();
                self.waited.clear();
                self.local = self.config.local();
                Some(Handover::Dropped {
                    running: carried.0,
                    results: carried.1,
                })
            }
            Some(_) => {
                if !self.running.is_empty() || !self.finished.is_empty() {
                    tracing::info!(
                        running = self.running.len(),
                        results = self.finished.len(),
                        "handed running tasks and results to the server"
                    );
                }
                self.finished.drain(..sent);
                self.outputs.drain(..sent_outputs);
                // Results that did not fit went as running tasks.
                Some(Handover::Resumed {
                    running: carried.0 + carried.1 - sent,
                    results: sent,
                })
            }
            None => None,
        };
        carry.prev = Some((worker, server_id, epoch));
        tracing::info!(worker, server = %server, slots = self.config.slots, exec, "registered");
        if let Some(announce) = self.config.on_connect {
            announce(&Connected {
                worker,
                address: access.address(),
                config: self.config,
                handover,
            });
        }
        self.me.worker = worker;
        self.me.server = server;
        Ok(Ok((worker, heartbeat_ms)))
    }

    async fn run(
        &mut self,
        reader: &mut FrameReader<kestrel_proto::ConnRead>,
        writer: &mut FrameWriter<kestrel_proto::ConnWrite>,
        pool: &mut Option<Pool>,
        heartbeat_ms: u64,
    ) -> Result<SessionEnd, WorkerError> {
        let mut heartbeat = tokio::time::interval(Duration::from_millis(heartbeat_ms.max(10)));
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent_since_tick = false;
        loop {
            tokio::select! {
                msg = reader.try_recv::<ToWorker>() => match msg {
                    Ok(Some(m)) => {
                        if let Some(end) = self.on_message(m, pool) {
                            return Ok(end);
                        }
                    }
                    Ok(None) => return Ok(SessionEnd::Lost("the server closed the connection".into())),
                    Err(ProtoError::Io(e)) => return Ok(SessionEnd::Lost(e.to_string())),
                    Err(e) => return Err(e.into()),
                },
                Some(done) = recv_done(pool) => {
                    self.on_done(done, pool);
                    while let Some(more) = pool.as_mut().and_then(Pool::try_done) {
                        self.on_done(more, pool);
                    }
                }
                _ = heartbeat.tick() => {
                    if !sent_since_tick {
                        writer.send(&FromWorker::Heartbeat).await?;
                    }
                    sent_since_tick = false;
                }
            }
            self.start_tasks(pool);
            if !self.started.is_empty() || !self.finished.is_empty() {
                self.send_update(writer).await?;
                sent_since_tick = true;
            }
            for tasks in std::mem::take(&mut self.revoked) {
                writer.send(&FromWorker::Revoked { tasks }).await?;
                sent_since_tick = true;
            }
        }
    }

    fn on_message(&mut self, m: ToWorker, pool: &mut Option<Pool>) -> Option<SessionEnd> {
        match m {
            ToWorker::Registered { .. } => {}
            ToWorker::DefineJob {
                job,
                template,
                ids,
                resources,
                named,
            } => self.local.define(job, template, ids, resources, named),
            ToWorker::Assign { tasks } => self.local.enqueue(tasks, now_us()),
            ToWorker::Revoke { tasks } => {
                // Those still waiting for a slot go back; those started run on.
                let mut given = self.local.unqueue(&tasks);
                if let Some(p) = pool.as_mut() {
                    given.extend(p.take_back(&tasks).iter().map(|t| (t.job, t.index)));
                }
                self.revoked.push(given);
            }
            ToWorker::Cancel { tasks } => {
                let now = now_us();
                let mut canceled = self.local.unqueue(&tasks);
                if let Some(p) = pool.as_mut() {
                    canceled.extend(p.take_back(&tasks).iter().map(|t| (t.job, t.index)));
                    // Those a thread has taken end as canceled.
                    p.cancel_decked(&tasks);
                }
                for (job, index) in canceled {
                    self.finished.push(Finished {
                        job,
                        index,
                        started_us: now,
                        finished_us: now,
                        end: RunEnd::Canceled,
                    });
                }
                for key in &tasks {
                    if let Some(r) = self.running.get(key) {
                        r.cancel.cancel();
                    }
                }
            }
            ToWorker::ForgetJob { job } => {
                self.local.jobs.remove(&job);
            }
            ToWorker::Shutdown { reason } => return Some(SessionEnd::Shutdown(reason)),
        }
        None
    }

    fn on_done(&mut self, done: Done, pool: &mut Option<Pool>) {
        let ran = self.running.remove(&done.key);
        let started_us = micros(done.outcome.started);
        let finished_us = micros(done.outcome.finished);
        let (held, waited_us) = match ran {
            Some(r) => (r.held, Some(r.waited_us)),
            None => (Held::default(), None),
        };
        // Its follower runs whether or not this run is known here: it must be tracked.
        match hand_on(&mut self.running, &done, pool, held) {
            Ok(key) => self.started.push(Started {
                job: key.0,
                index: key.1,
                at_us: finished_us,
            }),
            Err(held) => {
                self.local.release(held);
                // Tasks decked for the job while its thread was finding none go back to the
                // head of the queue, to start in the slot just freed.
                let job = done.key.0;
                if let Some(p) = pool.as_mut() {
                    let running = running_of(&self.running, job);
                    for task in p.take_back_unfollowed(job, running).into_iter().rev() {
                        self.local.queue.push_front(task);
                    }
                }
            }
        }
        // A run this session did not start or carry has nothing to report.
        let Some(waited_us) = waited_us else {
            return;
        };
        let mut outcome = done.outcome;
        if let Some(output) = outputs::of_run(done.key, &mut outcome) {
            self.outputs.push(output);
        }
        let end = run_end(outcome, done.timeout);
        if end == RunEnd::Success {
            self.note_wait(done.key.0, waited_us);
        }
        self.finished.push(Finished {
            job: done.key.0,
            index: done.key.1,
            started_us,
            finished_us,
            end,
        });
    }

    /// Adds a successful task's wait for a slot to its job's sum for the next update.
    fn note_wait(&mut self, job: JobId, waited_us: u64) {
        match self.waited.last_mut() {
            Some((j, sum)) if *j == job => *sum += waited_us,
            _ => match self.waited.iter_mut().find(|(j, _)| *j == job) {
                Some((_, sum)) => *sum += waited_us,
                None => self.waited.push((job, waited_us)),
            },
        }
    }

    /// Starts queued tasks while slots are free, then decks the next ones to follow running
    /// tasks of their job. The no-op executor completes them on the spot.
    fn start_tasks(&mut self, pool: &mut Option<Pool>) {
        // The no-op executor ends a whole batch at one instant: one clock read serves it.
        let batch_now = now_us();
        while let Some((task, held)) = self.local.next_startable() {
            let key = (task.job, task.index);
            match (self.config.exec, pool.as_ref()) {
                (ExecMode::Noop, _) | (_, None) => {
                    self.local.release(held);
                    self.note_wait(task.job, batch_now.saturating_sub(task.arrived_us));
                    self.finished.push(Finished {
                        job: task.job,
                        index: task.index,
                        started_us: batch_now,
                        finished_us: batch_now,
                        end: RunEnd::Success,
                    });
                }
                (ExecMode::Process, Some(p)) => self.launch(p, key, task, held),
            }
        }
        if let Some(p) = pool.as_mut() {
            self.fill_deck(p);
        }
    }

    /// Decks tasks from the head of the queue while its job has fewer decked than running
    /// tasks, so that each running task of the job can be followed by one. GPU tasks are
    /// never decked: their device list is the slot's they start on.
    fn fill_deck(&mut self, p: &mut Pool) {
        while let Some(head) = self.local.queue.front() {
            let job = head.job;
            let Some(def) = self.local.jobs.get(&job) else {
                return;
            };
            if def.resources.gpus > 0 || p.decked_of(job) >= running_of(&self.running, job) {
                return;
            }
            let Some(task) = self.local.queue.pop_front() else {
                return;
            };
            match self.local.launch(&task, &[], &self.me) {
                Ok(launch) => p.put_on_deck(task, launch, CancelHandle::new()),
                Err(reason) => self.cannot_launch(&task, now_us(), reason),
            }
        }
    }

    /// Hands a task to the process pool, or reports it failed if it cannot be launched.
    fn launch(&mut self, p: &Pool, key: Key, task: LocalTask, held: Held) {
        let now = now_us();
        let waited_us = now.saturating_sub(task.arrived_us);
        match self.local.launch(&task, &held.gpus, &self.me) {
            Ok(launch) => {
                let cancel = CancelHandle::new();
                self.running.insert(
                    key,
                    Running {
                        cancel: cancel.clone(),
                        held,
                        waited_us,
                    },
                );
                self.started.push(Started {
                    job: task.job,
                    index: task.index,
                    at_us: now,
                });
                p.start(key, launch, cancel);
            }
            Err(reason) => {
                self.local.release(held);
                self.cannot_launch(&task, now, reason);
            }
        }
    }

    /// Reports a task failed whose launch could not be built.
    fn cannot_launch(&mut self, task: &LocalTask, now: u64, reason: String) {
        self.finished.push(Finished {
            job: task.job,
            index: task.index,
            started_us: now,
            finished_us: now,
            end: RunEnd::Failed(Box::new(Failure::because(reason))),
        });
    }

    async fn send_update(
        &mut self,
        writer: &mut FrameWriter<kestrel_proto::ConnWrite>,
    ) -> Result<(), WorkerError> {
        // A start whose end is in the same update says nothing new.
        if !self.finished.is_empty() && !self.started.is_empty() {
            let ended: FxHashSet<Key> = self.finished.iter().map(|f| (f.job, f.index)).collect();
            self.started.retain(|s| !ended.contains(&(s.job, s.index)));
        }
        // Streamed output can be big: the ends go in as many messages as it needs.
        loop {
            let (ends, outs) =
                outputs::fitting(&self.finished, &self.outputs, OUTPUT_BYTES_PER_MESSAGE);
            if ends == self.finished.len() {
                return self.send_all(writer).await;
            }
            let msg = FromWorker::Update {
                started: std::mem::take(&mut self.started),
                finished: self.finished.drain(..ends).collect(),
                outputs: self.outputs.drain(..outs).collect(),
                waited: std::mem::take(&mut self.waited),
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
                    self.finished.splice(..0, finished);
                    self.outputs.splice(..0, outputs);
                    self.waited = waited;
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
            started: std::mem::take(&mut self.started),
            finished: std::mem::take(&mut self.finished),
            outputs: std::mem::take(&mut self.outputs),
            waited: std::mem::take(&mut self.waited),
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
        } = msg
        {
            started.clear();
            if sent.is_ok() {
                finished.clear();
                outputs.clear();
                waited.clear();
            }
            self.started = started;
            self.finished = finished;
            self.outputs = outputs;
            self.waited = waited;
        }
        sent.map_err(WorkerError::from)
    }
}

/// Records the decked task a thread went straight on to after `done`'s run as running, with
/// `held`, what the ended run held (same job, same needs). Returns its key, or `held` back
/// when the thread went on to nothing.
fn hand_on(
    running: &mut FxHashMap<Key, Running>,
    done: &Done,
    pool: &mut Option<Pool>,
    held: Held,
) -> Result<Key, Held> {
    let Some((key, d)) = done
        .next
        .and_then(|key| Some((key, pool.as_mut()?.followed(key)?)))
    else {
        return Err(held);
    };
    let waited_us = micros(done.outcome.finished).saturating_sub(d.task.arrived_us);
    running.insert(
        key,
        Running {
            cancel: d.cancel,
            held,
            waited_us,
        },
    );
    Ok(key)
}

/// How many of `running`'s tasks are of `job`: each can be followed by one decked task.
fn running_of(running: &FxHashMap<Key, Running>, job: JobId) -> usize {
    running.keys().filter(|(j, _)| *j == job).count()
}

async fn recv_done(pool: &mut Option<Pool>) -> Option<Done> {
    match pool {
        Some(p) => p.recv_done().await,
        None => std::future::pending().await,
    }
}
