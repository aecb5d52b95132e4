//! Routing: the connections of workers and clients, and the scheduler's commands turned into
//! frames for them. Everything for one worker in a batch goes through its outbox, which
//! splits what is too big for one frame.

use super::{ConnId, Engine, Outbox};
use kestrel_core::{Command, Event, TaskSet, WorkerId};
use kestrel_proto::messages::{Answer, Assigned, JobIds, Refusal, ToClient, ToWorker};
use rustc_hash::FxHashMap;
use std::net::SocketAddr;

/// A registered worker's connection.
pub(super) struct WorkerConn {
    pub(super) outbox: Outbox,
    pub(super) peer: SocketAddr,
    /// Its executor (`process`, `noop`), for `worker list`.
    pub(super) exec: String,
    /// Its file cache's capacity in bytes, if it has one.
    pub(super) cache_capacity: Option<u64>,
}

/// The open connections: registered workers by id, clients by connection.
#[derive(Default)]
pub(super) struct Conns {
    pub(super) workers: FxHashMap<WorkerId, WorkerConn>,
    pub(super) clients: FxHashMap<ConnId, Outbox>,
}

impl Conns {
    /// Sends `msg` to `worker` if it is still connected.
    pub(super) fn to_worker(&self, worker: WorkerId, msg: &ToWorker) {
        if let Some(c) = self.workers.get(&worker) {
            c.outbox.send(msg);
        }
    }

    /// Sends `msg` to client `conn` if it is still connected.
    pub(super) fn to_client(&self, conn: ConnId, msg: &ToClient) {
        if let Some(c) = self.clients.get(&conn) {
            c.send(msg);
        }
    }

    /// Sends the answer to request `id` of client `conn` now, if it is still connected; what the
    /// engine answers goes through `Engine::reply`, which holds it until the journal commit.
    pub(super) fn send_now(&self, conn: ConnId, id: u64, result: Result<Answer, Refusal>) {
        if let Some(c) = self.clients.get(&conn) {
            c.reply(id, result);
        }
    }
}

impl Engine {
    /// Carries out the scheduler's commands.
    pub(super) fn route(&mut self) {
        if !self.core.has_commands() {
            return;
        }
        let mut done_jobs = false;
        let mut unsendable = Vec::new();
        for cmd in self.core.take_commands() {
            match cmd {
                Command::DefineJob { worker, job } => {
                    let (Some(c), Some(j)) = (self.conns.workers.get(&worker), self.core.job(job))
                    else {
                        continue;
                    };
                    let ids = match &j.tasks {
                        TaskSet::Array(r) => JobIds::Array(r.clone()),
                        TaskSet::List(_) | TaskSet::Lines(_) => JobIds::List,
                    };
                    c.outbox.send(&ToWorker::DefineJob {
                        job,
                        template: Box::new(j.spec.template.clone()),
                        ids,
                        resources: j.spec.resources,
                        named: j.spec.named.clone(),
                        store: if j.spec.template.files.is_empty() {
                            None
                        } else {
                            j.spec
                                .placement
                                .store
                                .clone()
                                .or_else(|| self.store.clone())
                        },
                    });
                }
                Command::Assign { worker, runs } => {
                    let Some(c) = self.conns.workers.get(&worker) else {
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
                    self.conns.to_worker(worker, &ToWorker::Cancel { tasks });
                }
                Command::Revoke { worker, tasks } => {
                    tracing::debug!(worker, tasks = tasks.len(), "taking back waiting tasks");
                    self.conns.to_worker(worker, &ToWorker::Revoke { tasks });
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
                    self.conns.to_worker(worker, &ToWorker::ForgetJob { job });
                }
                Command::Quarantined { worker, reason } => {
                    let peer = self.conns.workers.get(&worker).map(|c| c.peer.to_string());
                    tracing::warn!(
                        worker,
                        peer = peer.as_deref().unwrap_or("?"),
                        "worker quarantined: {reason}; `kestrel worker resume {worker}` lifts it"
                    );
                }
                Command::Disconnect { worker, reason } => {
                    // Dropping the outbox closes the connection's sending side; a worker that
                    // is merely slow sees the end of stream and reconnects as a new worker.
                    if let Some(c) = self.conns.workers.remove(&worker) {
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

    /// Fails tasks whose command line alone is too long for a message to a worker: they can
    /// never run, and waiting for them would hang their job.
    fn fail_unsendable(
        &mut self,
        unsendable: Vec<(WorkerId, (kestrel_core::IndexRun, Option<usize>))>,
    ) {
        let now = self.now();
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
}
