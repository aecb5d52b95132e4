//! The engine: one task that owns the scheduler and applies events to it in batches.
//!
//! Connections send [`Inbound`] events over one channel. The engine takes everything waiting
//! (up to a bound), applies it, runs one scheduling pass and sends the commands, so under load
//! many completions share one pass and one frame per worker.

use crate::journal::{Journal, JournalError, Pending, Restored};
pub use crate::outbox::{ConnId, Outbox};
use crate::outputs::{OutputLog, Stream};
use crate::views;
use crate::{now_us, ServerConfig};
use kestrel_core::Resources;
use kestrel_core::{
    Command, Config, Event, JobId, Record, Reply, Scheduler, TaskSet, WorkerId, WorkerOffer,
};
use kestrel_proto::messages::*;
use kestrel_proto::Access;
use rustc_hash::FxHashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Events from connections to the engine.
pub enum Inbound {
    WorkerJoin {
        registration: Registration,
        peer: SocketAddr,
        outbox: Outbox,
        reply: oneshot::Sender<WorkerId>,
    },
    FromWorker {
        worker: WorkerId,
        msg: FromWorker,
    },
    WorkerGone {
        worker: WorkerId,
        reason: String,
    },
    ClientJoin {
        outbox: Outbox,
    },
    Client {
        conn: ConnId,
        request: Request,
    },
    ClientGone {
        conn: ConnId,
    },
    Stop,
}

struct WorkerConn {
    outbox: Outbox,
    peer: SocketAddr,
    exec: String,
}

struct Waiter {
    conn: ConnId,
    request: u64,
    jobs: Vec<JobId>,
    every_us: u64,
    last_us: u64,
}

/// How many events one batch applies before the engine schedules and sends.
const BATCH: usize = 4096;
/// How long accepted task ends may wait for a journal commit when nothing else needs one.
const ENDS_COMMIT_EVERY: Duration = Duration::from_millis(20);
/// How often time-driven work runs (heartbeat checks, wait progress).
const TICK: Duration = Duration::from_millis(100);

pub struct Engine {
    core: Scheduler,
    rx: mpsc::UnboundedReceiver<Inbound>,
    workers: FxHashMap<WorkerId, WorkerConn>,
    clients: FxHashMap<ConnId, Outbox>,
    waiters: Vec<Waiter>,
    info: ServerInfo,
    heartbeat_ms: u64,
    stopping: bool,
    /// Worker reports that did not match a current assignment (late or duplicate).
    ignored_reports: u64,
    /// Identifies this server to reconnecting workers: they hand over their tasks and results
    /// only to the server they were registered with (kept in the journal across restarts).
    pub server_id: String,
    /// Random per start; a resuming worker's previous id counts only if it names this epoch.
    epoch: u64,
    /// The journal, when kept; entries of the current batch wait in `pending`.
    journal: Option<Journal>,
    pending: Pending,
    /// Why the journal can no longer be written; new work is refused from then on.
    journal_error: Option<String>,
    /// Client replies held until the batch's journal entries are committed.
    deferred: Vec<Deferred>,
    /// Submission key -> job, so a retried submit finds its job.
    keys: FxHashMap<String, JobId>,
    last_commit: std::time::Instant,
    /// Streamed output of tasks (`--stdout stream`); a forgotten job's goes with it.
    outputs: OutputLog,
    /// The scheduler's records being journaled, a buffer kept from one event to the next.
    records: Vec<Record>,
}

/// A reply held back until the journal commit that makes it true.
struct Deferred {
    conn: ConnId,
    id: u64,
    result: Result<Answer, Refusal>,
    /// A job this batch created, with its submission key (withdrawn if the commit fails).
    created: Option<(JobId, Option<String>)>,
}

impl Deferred {
    /// Whether the reply promises something the journal must hold first: a job created or
    /// extended, or a finished job (`WaitDone`). A query's answer may go out before the task
    /// ends it shows are synced: after a crash they run again (at-least-once), so nothing
    /// promised is lost, and a client polling `job list` does not force a sync each time.
    fn needs_durability(&self) -> bool {
        matches!(
            self.result,
            Ok(Answer::Submitted { .. } | Answer::Extended | Answer::WaitDone(_))
        )
    }
}

impl Engine {
    pub fn new(
        config: &ServerConfig,
        access: &Access,
        rx: mpsc::UnboundedReceiver<Inbound>,
        _tx: mpsc::UnboundedSender<Inbound>,
    ) -> Engine {
        let heartbeat_ms = config.heartbeat.as_millis().max(1) as u64;
        let defaults = Config::default();
        let core = Scheduler::new(Config {
            heartbeat_timeout_us: heartbeat_ms * 4 * 1000,
            quarantine_failures: if config.quarantine {
                defaults.quarantine_failures
            } else {
                0
            },
            first_job: config.first_job,
            ..defaults
        });
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
        };
        Engine {
            core,
            rx,
            workers: FxHashMap::default(),
            clients: FxHashMap::default(),
            waiters: Vec::new(),
            info,
            heartbeat_ms,
            stopping: false,
            ignored_reports: 0,
            server_id: crate::journal::new_server_id(),
            epoch: rand::random(),
            journal: None,
            pending: Pending::default(),
            journal_error: None,
            deferred: Vec::new(),
            keys: FxHashMap::default(),
            last_commit: std::time::Instant::now(),
            outputs: OutputLog::default(),
            records: Vec::new(),
        }
    }

    /// Replays the journal into the (fresh) scheduler and journals from now on.
    pub fn attach_journal(&mut self, journal: Journal) -> Result<Restored, JournalError> {
        let mut restored = Restored::default();
        self.keys = journal.replay(&mut self.core, &mut restored)?;
        for j in self.core.jobs() {
            self.outputs.note_job(&j.spec);
        }
        if let Ok(meta) = journal.meta() {
            if !meta.server_id.is_empty() {
                self.server_id = meta.server_id;
            }
        }
        self.journal = Some(journal);
        Ok(restored)
    }

    /// Writes the batch's journal entries in one transaction, then sends the replies that
    /// waited for it. If the write fails, jobs created in this batch are withdrawn and their
    /// submitters told why, and no new work is accepted from then on.
    fn commit(&mut self, force: bool) {
        self.journal_records(now_us());
        // Task ends alone promise nothing to anyone (a lost one only means a re-run), so they
        // may gather for a few milliseconds: fewer syncs under a flood of tiny tasks.
        let due = force
            || self.deferred.iter().any(Deferred::needs_durability)
            || self.pending.has_inputs()
            || self.last_commit.elapsed() >= ENDS_COMMIT_EVERY;
        if let (Some(j), true) = (self.journal.as_mut(), due) {
            if !self.pending.is_empty() {
                self.last_commit = std::time::Instant::now();
                if let Err(e) = j.commit(&mut self.pending) {
                    let msg = format!(
                        "the journal in {} cannot be written: {e}; free disk space and restart the server",
                        self.info.dir
                    );
                    tracing::error!("{msg}; new submissions are refused from now on");
                    self.journal_error = Some(msg.clone());
                    self.withdraw_unjournaled(&msg);
                }
            }
        }
        for d in std::mem::take(&mut self.deferred) {
            if let Some(c) = self.clients.get(&d.conn) {
                c.reply(d.id, d.result);
            }
        }
    }

    /// After the journal failed: jobs created in the failed batch are canceled and their
    /// submitters (and those of its pieces) told why; every open list job is canceled too,
    /// since no further piece can be journaled and it would otherwise stay open forever.
    fn withdraw_unjournaled(&mut self, msg: &str) {
        let now = now_us();
        for d in &mut self.deferred {
            if let Some((job, key)) = d.created.take() {
                let _ = self.core.handle(now, Event::Cancel { job });
                if let Some(k) = key {
                    self.keys.remove(&k);
                }
                d.result = Err(msg.to_string().into());
            } else if matches!(d.result, Ok(Answer::Extended)) {
                d.result = Err(msg.to_string().into());
            }
        }
        let open: Vec<JobId> = self.core.jobs().filter(|j| j.open).map(|j| j.id).collect();
        for job in open {
            let _ = self.core.handle(now, Event::Cancel { job });
        }
    }

    /// New work (a submission, a piece of a list, a retry) is refused once the journal cannot
    /// be written: it could not be made durable.
    fn accepting_work(&self) -> Result<(), String> {
        match &self.journal_error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Whether inputs are being journaled right now.
    fn journaling(&self) -> bool {
        self.journal.is_some() && self.journal_error.is_none()
    }

    /// Runs until a stop request.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                n = self.rx.recv_many(&mut batch, BATCH) => {
                    if n == 0 {
                        break;
                    }
                    let now = now_us();
                    for ev in batch.drain(..) {
                        self.handle(now, ev);
                        self.journal_records(now);
                    }
                }
                _ = tick.tick() => {
                    let now = now_us();
                    self.event(now, Event::Tick);
                    self.journal_records(now);
                    self.send_progress(now);
                }
            }
            // A job's tasks go out only once its submission is durable: otherwise a crash in
            // the sync could leave workers running tasks of a job id the journal never had.
            if self.pending.has_inputs() {
                self.commit(true);
            }
            let now = now_us();
            self.event(now, Event::Schedule);
            self.route();
            self.commit(self.stopping);
            if self.stopping {
                break;
            }
        }
        for w in self.workers.values() {
            w.outbox.send(&ToWorker::Shutdown {
                reason: "the server is stopping".into(),
            });
        }
        if self.ignored_reports > 0 {
            tracing::info!(
                "{} late or duplicate task reports were ignored",
                self.ignored_reports
            );
        }
    }

    fn handle(&mut self, now: u64, ev: Inbound) {
        match ev {
            Inbound::WorkerJoin {
                registration: r,
                peer,
                outbox,
                reply,
            } => {
                let offer = WorkerOffer {
                    hostname: r.hostname.clone(),
                    resources: Resources {
                        cpus: r.slots.max(1),
                        gpus: r.gpus,
                        mem: r.mem,
                        ..Resources::NONE
                    },
                    prefetch: r.prefetch,
                    named: r.named.clone(),
                };
                let Reply::Joined(id) = self.event(now, Event::WorkerJoined { offer }) else {
                    tracing::error!(%peer, "the scheduler gave a joining worker no id");
                    return;
                };
                outbox.send(&ToWorker::Registered {
                    worker: id,
                    heartbeat_ms: self.heartbeat_ms,
                    server: self.info.address.clone(),
                    server_id: self.server_id.clone(),
                    epoch: self.epoch,
                });
                tracing::info!(worker = id, %peer, host = %r.hostname, slots = r.slots, "worker joined");
                if let Some(resume) = r.resume {
                    self.resume(now, id, resume);
                }
                self.workers.insert(
                    id,
                    WorkerConn {
                        outbox,
                        peer,
                        exec: r.exec,
                    },
                );
                let _ = reply.send(id);
            }
            Inbound::FromWorker { worker, msg } => {
                self.event(now, Event::WorkerSeen { worker });
                match msg {
                    FromWorker::Update {
                        started,
                        finished,
                        outputs,
                        waited,
                    } => {
                        if !started.is_empty() {
                            self.event(now, Event::TasksStarted { worker, started });
                        }
                        self.tasks_ended(now, worker, finished, outputs);
                        for (job, waited_us) in waited {
                            self.event(now, Event::SlotWait { job, waited_us });
                        }
                    }
                    FromWorker::Revoked { tasks } => {
                        self.event(now, Event::TasksRevoked { worker, tasks });
                    }
                    FromWorker::Heartbeat => {}
                    FromWorker::Register(_) => {
                        tracing::warn!(worker, "worker registered twice; ignored");
                    }
                }
            }
            Inbound::WorkerGone { worker, reason } => {
                if self.workers.remove(&worker).is_some() {
                    tracing::info!(worker, "worker left: {reason}");
                }
                self.event(now, Event::WorkerLost { worker });
            }
            Inbound::ClientJoin { outbox } => {
                self.clients.insert(outbox.conn, outbox);
            }
            Inbound::ClientGone { conn } => {
                self.clients.remove(&conn);
                self.waiters.retain(|w| w.conn != conn);
            }
            Inbound::Client { conn, request } => self.answer(now, conn, request),
            Inbound::Stop => self.stopping = true,
        }
    }

    /// Hands a reconnected worker's running tasks and results to the core, if it was
    /// registered with this server.
    fn resume(&mut self, now: u64, worker: WorkerId, resume: Resume) {
        if resume.server_id != self.server_id {
            tracing::info!(
                worker,
                "worker was registered with another server ({}); its {} running tasks and {} results are not taken",
                resume.server_id,
                resume.running.len(),
                resume.finished.len()
            );
            return;
        }
        // After a restart worker ids start again at 1: an id of the previous start may now
        // name another, live worker, which must not be dropped.
        let previous = (resume.epoch == self.epoch).then_some(resume.previous_worker);
        let resumed = Event::WorkerResumed {
            worker,
            previous,
            running: resume.running,
            finished: resume.finished,
        };
        let Reply::Resumed(r) = self.event(now, resumed) else {
            tracing::error!(
                worker,
                "the scheduler did not answer a resume with its outcome"
            );
            return;
        };
        // Its results' streamed outputs go with their ends.
        self.journal_ends_with(now, OutputsOf::new(resume.outputs));
        self.ignored_reports += r.ignored as u64;
        tracing::info!(
            worker,
            previous = resume.previous_worker,
            taken = r.taken,
            duplicates = r.duplicates,
            recorded = r.recorded,
            ignored = r.ignored,
            "worker resumed"
        );
    }

    /// Queues a reply; it goes out after this batch's journal commit (see [`Self::commit`]).
    fn reply(&mut self, conn: ConnId, id: u64, result: Result<Answer, Refusal>) {
        self.deferred.push(Deferred {
            conn,
            id,
            result,
            created: None,
        });
    }

    fn answer(&mut self, now: u64, conn: ConnId, req: Request) {
        let result: Result<Answer, Refusal> = match req.body {
            Ask::Submit {
                spec,
                tasks,
                open,
                key,
            } => {
                if let Some((k, &job)) = key.as_ref().and_then(|k| Some((k, self.keys.get(k)?))) {
                    // The key names a submission: the same one again gets its job; another one
                    // under the same key is a mistake to say, not a job to answer with.
                    let same = self
                        .core
                        .job(job)
                        .is_none_or(|j| j.spec == spec && (open || j.open || j.tasks == tasks));
                    if same {
                        tracing::info!(job, "repeated submission answered with its job");
                        Ok(Answer::Submitted {
                            job,
                            warning: None,
                            repeated: true,
                        })
                    } else {
                        Err(Refusal::from(format!(
                            "key {k:?} was used for job {job}, a different submission (another command, options or tasks); give this one a key of its own"
                        )))
                    }
                } else if let Err(e) = self.accepting_work() {
                    Err(e.into())
                } else {
                    let name = spec.name.clone();
                    let n = tasks.len();
                    self.outputs.note_job(&spec);
                    let submit = Event::Submit {
                        spec: Box::new(spec),
                        tasks,
                        open,
                        key: key.clone(),
                    };
                    match self.core.handle(now, submit) {
                        Ok(Reply::Submitted(job)) => {
                            if let Some(k) = &key {
                                self.keys.insert(k.clone(), job);
                            }
                            tracing::info!(job, tasks = n, %name, "job submitted");
                            // A job too big for every worker connected now is kept (a bigger
                            // one may come), but its submitter hears of it at once.
                            let warning = match self.core.stall(job) {
                                Some(s @ kestrel_core::Stall::TooBig { .. }) => Some(s.to_string()),
                                _ => None,
                            };
                            self.deferred.push(Deferred {
                                conn,
                                id: req.id,
                                result: Ok(Answer::Submitted {
                                    job,
                                    warning,
                                    repeated: false,
                                }),
                                created: Some((job, key)),
                            });
                            return;
                        }
                        Ok(other) => Err(unexpected(&other)),
                        Err(e) => {
                            tracing::info!("submission refused: {e}");
                            Err(e.into())
                        }
                    }
                }
            }
            Ask::Extend {
                job,
                at,
                argvs,
                close,
            } => self.extend(now, job, at, TaskSet::List(argvs), close),
            Ask::ExtendLines {
                job,
                at,
                lines,
                close,
            } => self.extend(now, job, at, TaskSet::Lines(lines), close),
            Ask::JobList => Ok(Answer::Jobs(
                self.core.jobs().map(views::job_summary).collect(),
            )),
            Ask::JobInfo { job } => match self.core.job(job) {
                Some(j) => Ok(Answer::Job(Box::new(views::job_detail(
                    j,
                    self.core.stall(job),
                )))),
                None => Err(no_such_job(job)),
            },
            Ask::TaskList { job, state, limit } => match self.core.job(job) {
                Some(j) => Ok(Answer::Tasks(views::task_page(j, state, limit))),
                None => Err(no_such_job(job)),
            },
            Ask::WorkerList => Ok(Answer::Workers(
                self.core
                    .workers()
                    .map(|w| {
                        let c = self.workers.get(&w.id);
                        views::worker_row(
                            w,
                            c.map(|c| c.peer.to_string()).unwrap_or_default(),
                            c.map(|c| c.exec.clone()).unwrap_or_default(),
                        )
                    })
                    .collect(),
            )),
            Ask::Cancel { jobs } => {
                let mut results = Vec::with_capacity(jobs.len());
                for job in jobs {
                    let result = match self.core.handle(now, Event::Cancel { job }) {
                        Ok(Reply::Canceled { queued, running }) => Ok((queued, running)),
                        Ok(other) => Err(unexpected(&other)),
                        Err(e) => Err(Refusal::from(e)),
                    };
                    results.push(CancelResult { job, result });
                }
                Ok(Answer::Canceled(results))
            }
            Ask::Wait { jobs, progress_ms } => {
                let jobs = if jobs.is_empty() {
                    self.core
                        .jobs()
                        .filter(|j| !j.is_done())
                        .map(|j| j.id)
                        .collect()
                } else {
                    jobs
                };
                if let Some(missing) = jobs.iter().find(|j| self.core.job(**j).is_none()) {
                    Err(no_such_job(*missing))
                } else {
                    let w = Waiter {
                        conn,
                        request: req.id,
                        jobs,
                        every_us: progress_ms.max(50) * 1000,
                        last_us: now,
                    };
                    if self.wait_done(&w) {
                        Ok(Answer::WaitDone(self.progress_of(&w.jobs)))
                    } else {
                        self.waiters.push(w);
                        return;
                    }
                }
            }
            Ask::ServerInfo => {
                let mut info = self.info.clone();
                info.workers = self.core.workers().count() as u32;
                info.jobs = self.core.jobs().count() as u32;
                info.live_jobs = self.core.live_jobs() as u32;
                info.queued = self.core.queued();
                info.journal = self.journal.as_ref().map(|j| JournalInfo {
                    path: j.path().display().to_string(),
                    bytes: j.bytes(),
                    rows: j.rows(),
                    error: self.journal_error.clone(),
                });
                Ok(Answer::Info(info))
            }
            Ask::Retry { job, failed_only } => {
                // Re-running tasks is new work: refused, like a submission, while it cannot be
                // journaled.
                let retried =
                    self.accepting_work().map_err(Refusal::from).and_then(|()| {
                        match self.core.handle(now, Event::Retry { job, failed_only }) {
                            Ok(Reply::Retried { failed, canceled }) => Ok((failed, canceled)),
                            Ok(other) => Err(unexpected(&other)),
                            Err(e) => Err(Refusal::from(e)),
                        }
                    });
                retried.map(|(failed, canceled)| {
                    tracing::info!(job, failed, canceled, "job retried");
                    Answer::Retried {
                        job,
                        failed,
                        canceled,
                    }
                })
            }
            Ask::ResumeWorker { worker } => {
                match self.core.handle(now, Event::LiftQuarantine { worker }) {
                    Ok(Reply::Lifted { was_quarantined }) => {
                        if was_quarantined {
                            tracing::info!(worker, "quarantine lifted");
                        }
                        Ok(Answer::WorkerResumed {
                            worker,
                            was_quarantined,
                        })
                    }
                    Ok(other) => Err(unexpected(&other)),
                    Err(e) => Err(e.into()),
                }
            }
            Ask::Output {
                job,
                stderr,
                tasks,
                from,
                max_bytes,
            } => {
                // Outputs still waiting for their commit are read from the journal once there.
                if self.journaling() && !self.pending.is_empty() {
                    self.commit(true);
                }
                match self.core.job(job) {
                    Some(j) => self
                        .outputs
                        .page(
                            self.journal.as_ref(),
                            j,
                            Stream::of(stderr),
                            tasks.as_ref(),
                            from,
                            max_bytes,
                        )
                        .map(Answer::Output)
                        .map_err(Refusal::from),
                    None => Err(no_such_job(job)),
                }
            }
            Ask::Stop => {
                tracing::info!("stop requested by a client");
                self.stopping = true;
                Ok(Answer::Stopping)
            }
            Ask::JobStates { jobs } => Ok(Answer::JobStates(
                jobs.into_iter()
                    .map(|id| (id, self.core.job(id).map(views::job_state)))
                    .collect(),
            )),
            Ask::Jobs { filter } => {
                views::jobs_page(self.core.jobs(), &filter).map(Answer::JobsPage)
            }
            Ask::Forget { jobs, all_ended } => {
                Ok(Answer::Forgotten(self.forget(now, jobs, all_ended)))
            }
            Ask::TaskPage {
                job,
                state,
                offset,
                limit,
            } => match self.core.job(job) {
                Some(j) => Ok(Answer::TaskRange(views::task_range(
                    j, state, offset, limit,
                ))),
                None => Err(no_such_job(job)),
            },
            Ask::TaskInfo { job, task } => match self.core.job(job) {
                None => Err(no_such_job(job)),
                Some(j) => match j.index_of(task) {
                    None => Err(Refusal::not_found(format!(
                        "job {job} has no task {task}; `kestrel job info {job}` shows its task ids"
                    ))),
                    Some(index) => {
                        let r = j.record(index);
                        let host = (r.assigned_us > 0)
                            .then(|| self.core.worker(r.worker))
                            .flatten()
                            .map(|w| w.offer.hostname.clone());
                        Ok(Answer::Task(Box::new(views::task_detail(j, index, host))))
                    }
                },
            },
        };
        self.reply(conn, req.id, result);
    }

    /// Forgets ended jobs (`jobs`, and with `all_ended` every ended job); the scheduler records
    /// it for the journal, so a restarted server does not bring them back. Submission keys of
    /// forgotten jobs go too.
    fn forget(&mut self, now: u64, mut jobs: Vec<JobId>, all_ended: bool) -> Vec<ForgetResult> {
        if all_ended {
            let listed: rustc_hash::FxHashSet<JobId> = jobs.iter().copied().collect();
            jobs.extend(
                self.core
                    .jobs()
                    .filter(|j| j.is_done() && !listed.contains(&j.id))
                    .map(|j| j.id),
            );
        }
        let results: Vec<ForgetResult> = jobs
            .into_iter()
            .map(|job| ForgetResult {
                job,
                result: match self.core.handle(now, Event::Forget { job }) {
                    Ok(_) => Ok(()),
                    Err(e) => Err(Refusal::from(e)),
                },
            })
            .collect();
        let gone: Vec<JobId> = results
            .iter()
            .filter(|r| r.result.is_ok())
            .map(|r| r.job)
            .collect();
        if !gone.is_empty() {
            tracing::info!(jobs = gone.len(), "jobs forgotten");
            let gone: rustc_hash::FxHashSet<JobId> = gone.into_iter().collect();
            self.keys.retain(|_, job| !gone.contains(job));
        }
        results
    }

    /// Adds the tasks of `more` to an open job (see [`Event::Extend`]); the scheduler records
    /// those it did not hold yet for the journal.
    fn extend(
        &mut self,
        now: u64,
        job: JobId,
        at: u32,
        more: TaskSet,
        close: bool,
    ) -> Result<Answer, Refusal> {
        self.accepting_work()?;
        let extend = Event::Extend {
            job,
            at,
            more,
            close,
        };
        match self.core.handle(now, extend) {
            Ok(_) => Ok(Answer::Extended),
            Err(e) => Err(Refusal::from(e)),
        }
    }

    fn progress_of(&self, jobs: &[JobId]) -> WaitProgress {
        let mut p = WaitProgress {
            jobs: jobs.len() as u32,
            ..Default::default()
        };
        for j in jobs.iter().filter_map(|id| self.core.job(*id)) {
            p.counts.add(&j.counts.into());
            if j.is_done() {
                p.jobs_done += 1;
            } else if p.waiting.is_none() {
                p.waiting = self.core.stall(j.id).map(|s| format!("job {}: {s}", j.id));
            }
        }
        p
    }

    fn wait_done(&self, w: &Waiter) -> bool {
        w.jobs
            .iter()
            .all(|id| self.core.job(*id).is_none_or(|j| j.is_done()))
    }

    fn send_progress(&mut self, now: u64) {
        for i in 0..self.waiters.len() {
            let w = &self.waiters[i];
            if now.saturating_sub(w.last_us) < w.every_us {
                continue;
            }
            let progress = self.progress_of(&w.jobs);
            if let Some(c) = self.clients.get(&w.conn) {
                c.send(&ToClient::Progress {
                    id: w.request,
                    progress,
                });
            }
            self.waiters[i].last_us = now;
        }
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

    /// Journals what the scheduler recorded during the last event (at `now`), before the next
    /// event's records: the order matters to replay (see [`kestrel_core::Record`]).
    fn journal_records(&mut self, now: u64) {
        self.journal_ends_with(now, OutputsOf::default());
    }

    /// [`Self::journal_records`], keeping with each recorded task end its streamed output from
    /// `outputs`. Task ends are taken even without a journal, for the output log.
    fn journal_ends_with(&mut self, now: u64, mut outputs: OutputsOf) {
        let mut records = std::mem::take(&mut self.records);
        self.core.swap_records(&mut records);
        let journaling = self.journaling();
        let streaming = self.outputs.streaming();
        // Jobs forgotten one after another go in one FORGET entry.
        let mut forgotten = Vec::new();
        for r in records.drain(..) {
            if !forgotten.is_empty() && !matches!(r, Record::Forgotten { .. }) {
                self.pending.forget(std::mem::take(&mut forgotten), now);
            }
            match r {
                Record::Ended { ends } => {
                    if !(journaling || streaming) {
                        continue;
                    }
                    // Ends come in runs of one job: it is looked up once per run.
                    let mut job: Option<&kestrel_core::Job> = None;
                    for f in ends {
                        if job.is_none_or(|j| j.id != f.job) {
                            job = self.core.job(f.job);
                        }
                        let Some(j) = job else {
                            continue;
                        };
                        let output = outputs.take(&f);
                        let pending = journaling.then_some(&mut self.pending);
                        keep_end(pending, &mut self.outputs, f, j, output);
                    }
                }
                Record::Forgotten { job } => {
                    // Its output log goes in the same transaction as the FORGET entry.
                    let pending = journaling.then_some(&mut self.pending);
                    self.outputs.forget(job, pending);
                    if journaling {
                        forgotten.push(job);
                    }
                }
                _ if !journaling => {}
                Record::Submitted { job, key } => {
                    // Encoded from the core's copy: a big task list is never cloned.
                    if let Some(j) = self.core.job(job) {
                        let (at, open) = (j.submitted_us, j.open);
                        self.pending.submit(job, at, key, &j.spec, &j.tasks, open);
                    }
                }
                Record::Extended { job, from, close } => {
                    if let Some(j) = self.core.job(job) {
                        self.pending
                            .extend(job, now, &j.tasks, from as usize, close);
                    }
                }
                Record::Canceled { job } => self.pending.cancel(job, now),
                Record::Retried { job, failed_only } => self.pending.retry(job, now, failed_only),
                Record::SlotWait { job, waited_us } => self.pending.slot_wait(job, waited_us),
                Record::GaveUp { job, index } => {
                    let Some(j) = self.core.job(job) else {
                        continue;
                    };
                    if let Some(failure) = j.failure(index).cloned() {
                        let at = j.record(index).finished_us;
                        self.pending.give_up(job, index, at, failure);
                    }
                }
                Record::Lost { tasks } => self.pending.lost(tasks),
            }
        }
        if !forgotten.is_empty() {
            self.pending.forget(forgotten, now);
        }
        self.records = records;
    }

    /// Applies the task ends of a worker's update, and journals each the scheduler took (with
    /// its streamed output).
    fn tasks_ended(
        &mut self,
        now: u64,
        worker: WorkerId,
        ends: Vec<kestrel_core::Finished>,
        outputs: Vec<TaskOutput>,
    ) {
        if let Reply::Reports { ignored, .. } = self.event(now, Event::TasksEnded { worker, ends })
        {
            self.ignored_reports += u64::from(ignored);
        }
        self.journal_ends_with(now, OutputsOf::new(outputs));
    }

    /// Fails tasks whose command line alone is too long for a message to a worker: they can
    /// never run, and waiting for them would hang their job.
    fn fail_unsendable(
        &mut self,
        unsendable: Vec<(WorkerId, (kestrel_core::IndexRun, Option<usize>))>,
    ) {
        let now = now_us();
        for (worker, (run, size)) in unsendable {
            let reason = crate::outbox::unsendable_reason("its command line", size);
            tracing::warn!(job = run.job, index = run.first, "task not sent: {reason}");
            let failure = kestrel_core::Failure::because(reason);
            let undeliverable = Event::Undeliverable {
                worker,
                job: run.job,
                index: run.first,
                failure,
            };
            self.event(now, undeliverable);
        }
        // Job ends and whatever else the failures set off.
        self.route();
    }

    /// Carries out the scheduler's commands.
    fn route(&mut self) {
        if !self.core.has_commands() {
            return;
        }
        let mut done_jobs = false;
        let mut unsendable = Vec::new();
        for cmd in self.core.take_commands() {
            match cmd {
                Command::DefineJob { worker, job } => {
                    let (Some(c), Some(j)) = (self.workers.get(&worker), self.core.job(job)) else {
                        continue;
                    };
                    let ids = match &j.tasks {
                        TaskSet::Array(r) => JobIds::Array(r.clone()),
                        TaskSet::List(_) | TaskSet::Lines(_) => JobIds::List,
                    };
                    c.outbox.send(&ToWorker::DefineJob {
                        job,
                        template: j.spec.template.clone(),
                        ids,
                        resources: j.spec.resources,
                        named: j.spec.named.clone(),
                    });
                }
                Command::Assign { worker, runs } => {
                    let Some(c) = self.workers.get(&worker) else {
                        continue;
                    };
                    let tasks = runs
                        .into_iter()
                        .map(|run| {
                            let mut a = Assigned::run(run);
                            let range = run.first as usize..(run.first + run.count) as usize;
                            match self.core.job(run.job).map(|j| &j.tasks) {
                                Some(TaskSet::List(list)) => {
                                    a.argvs = list.get(range).unwrap_or_default().to_vec();
                                }
                                // One copy of the run's bytes, not a string per task.
                                Some(TaskSet::Lines(lines)) => a.lines = lines.slice(range),
                                _ => {}
                            }
                            a
                        })
                        .collect();
                    unsendable.extend(c.outbox.assign(tasks).into_iter().map(|t| (worker, t)));
                }
                Command::Cancel { worker, tasks } => {
                    if let Some(c) = self.workers.get(&worker) {
                        c.outbox.send(&ToWorker::Cancel { tasks });
                    }
                }
                Command::Revoke { worker, tasks } => {
                    tracing::debug!(worker, tasks = tasks.len(), "taking back waiting tasks");
                    if let Some(c) = self.workers.get(&worker) {
                        c.outbox.send(&ToWorker::Revoke { tasks });
                    }
                }
                Command::JobDone { job } => {
                    done_jobs = true;
                    if let Some(j) = self.core.job(job) {
                        let c = j.counts;
                        tracing::info!(
                            job,
                            finished = c.finished,
                            failed = c.failed,
                            canceled = c.canceled,
                            "job done"
                        );
                    }
                }
                Command::ForgetJob { worker, job } => {
                    if let Some(c) = self.workers.get(&worker) {
                        c.outbox.send(&ToWorker::ForgetJob { job });
                    }
                }
                Command::Quarantined { worker, reason } => {
                    let peer = self.workers.get(&worker).map(|c| c.peer.to_string());
                    tracing::warn!(
                        worker,
                        peer = peer.as_deref().unwrap_or("?"),
                        "worker quarantined: {reason}; `kestrel worker resume {worker}` lifts it"
                    );
                }
                Command::Disconnect { worker, reason } => {
                    // Dropping the outbox closes the connection's sending side; a worker that
                    // is merely slow sees the end of stream and reconnects as a new worker.
                    if let Some(c) = self.workers.remove(&worker) {
                        tracing::warn!(worker, peer = %c.peer, "worker lost: {reason}");
                    }
                }
            }
        }
        if done_jobs {
            self.finish_waiters();
        }
        if !unsendable.is_empty() {
            self.fail_unsendable(unsendable);
        }
    }

    fn finish_waiters(&mut self) {
        let mut i = 0;
        while i < self.waiters.len() {
            if self.wait_done(&self.waiters[i]) {
                let w = self.waiters.swap_remove(i);
                let progress = self.progress_of(&w.jobs);
                self.reply(w.conn, w.request, Ok(Answer::WaitDone(progress)));
            } else {
                i += 1;
            }
        }
    }
}

fn no_such_job(job: JobId) -> Refusal {
    kestrel_core::SchedError::NoSuchJob(job).into()
}

/// Journals (into `pending`, when journaling) a task end the scheduler took, and keeps its
/// streamed output if its job streams any.
fn keep_end(
    mut pending: Option<&mut Pending>,
    outputs: &mut OutputLog,
    f: kestrel_core::Finished,
    j: &kestrel_core::Job,
    output: Option<TaskOutput>,
) {
    let (job, index) = (f.job, f.index);
    if let Some(p) = pending.as_deref_mut() {
        p.task_end(f, j.record(index).assigned_us);
    }
    if outputs.streaming() {
        // An earlier run (this one is counted already) may have left an output to replace.
        let rerun = j.record(index).runs > 1;
        outputs.record(&j.spec, job, index, rerun, output, pending);
    }
}

/// The streamed outputs of one report, taken by the end they belong to.
#[derive(Default)]
struct OutputsOf(FxHashMap<(JobId, u32), TaskOutput>);

impl OutputsOf {
    fn new(outputs: Vec<TaskOutput>) -> OutputsOf {
        OutputsOf(outputs.into_iter().map(|o| ((o.job, o.index), o)).collect())
    }

    fn take(&mut self, f: &kestrel_core::Finished) -> Option<TaskOutput> {
        if self.0.is_empty() {
            return None;
        }
        self.0.remove(&(f.job, f.index))
    }
}

/// The refusal for a reply of the wrong kind from the scheduler: a defect, said as such.
fn unexpected(reply: &Reply) -> Refusal {
    tracing::error!("the scheduler answered with {reply:?}");
    Refusal::from(format!(
        "internal error: the scheduler answered with {reply:?}; please report it"
    ))
}
