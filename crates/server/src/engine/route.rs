//! Routing: the connections of workers and clients, and the scheduler's commands turned into
//! frames for them. Everything for one worker in a batch goes through its outbox, which
//! splits what is too big for one frame.

use super::{ConnId, Engine, Outbox};
use kestrel_core::{Command, Event, IndexRun, TaskSet, WorkerId};
use kestrel_proto::messages::{
    Answer, Assigned, FileSources, JobIds, Node, Refusal, ToClient, ToWorker,
};
use rustc_hash::{FxHashMap, FxHashSet};
use std::net::SocketAddr;

/// A registered worker's connection.
pub(super) struct WorkerConn {
    pub(super) outbox: Outbox,
    pub(super) peer: SocketAddr,
    /// Its executor (`process`, `noop`), for `worker list`.
    pub(super) exec: String,
    /// Its file cache's capacity in bytes, if it has one.
    pub(super) cache_capacity: Option<u64>,
    /// The URL it serves its cache to peers at, if it does.
    pub(super) serves: Option<String>,
    /// The Python its runners call functions in, if it runs Python (protocol 12).
    pub(super) python: Option<kestrel_proto::messages::PythonRunner>,
    /// Why it was told to leave, once it was: the reason its departure is recorded with when
    /// its connection then closes.
    pub(super) farewell: Option<String>,
}

/// At most this many peers are named per file: the first to answer serves it.
const PEERS_PER_FILE: usize = 3;
/// At most this many files' sources go with one assignment (a huge run of a job with files
/// fetches the rest from the store rather than make a message of megabytes).
const SOURCES_PER_ASSIGN: usize = 4096;

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
                    let ids = match (&j.tasks, &j.spec.task_ids) {
                        (TaskSet::Array(r), _) | (TaskSet::List(_), Some(r)) => {
                            JobIds::Array(r.clone())
                        }
                        (TaskSet::List(_) | TaskSet::Lines(_), _) => JobIds::List,
                    };
                    let mut template = j.spec.template.clone();
                    // As resolved at submission, when some output is `local` (the worker
                    // writes the others to the store); when none is, nothing of version 9
                    // goes, so a version-8 worker takes the job as before.
                    let keep = self.core.output_keep(j);
                    if keep.contains(&kestrel_core::Keep::Local) {
                        template.files.keep = keep;
                    } else {
                        template.files.keep = Vec::new();
                        template.files.replicas = 0;
                    }
                    c.outbox.send(&ToWorker::DefineJob {
                        job,
                        template: Box::new(template),
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
                    let tasks: Vec<Assigned> =
                        runs.into_iter().map(|run| self.assigned(run)).collect();
                    let sources = self.sources_for(worker, &tasks);
                    if !sources.is_empty() {
                        c.outbox.send(&ToWorker::Sources { files: sources });
                    }
                    unsendable.extend(c.outbox.assign(tasks).into_iter().map(|t| (worker, t)));
                }
                Command::AssignNodes {
                    worker,
                    job,
                    index,
                    nodes,
                } => {
                    let Some(c) = self.conns.workers.get(&worker) else {
                        continue;
                    };
                    let mut a = self.assigned(IndexRun {
                        job,
                        first: index,
                        count: 1,
                    });
                    a.nodes = nodes
                        .into_iter()
                        .map(|w| Node {
                            worker: w,
                            host: self
                                .core
                                .worker(w)
                                .map(|x| x.offer.hostname.clone())
                                .unwrap_or_default(),
                        })
                        .collect();
                    tracing::info!(job, task = index, root = worker, nodes = ?a.nodes.iter().map(|n| n.worker).collect::<Vec<_>>(), "multi-node task started");
                    unsendable.extend(c.outbox.assign(vec![a]).into_iter().map(|t| (worker, t)));
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
                Command::DropFiles { worker, files } => {
                    tracing::debug!(worker, files = files.len(), "deleting intermediate files");
                    self.conns.to_worker(worker, &ToWorker::DropFiles { files });
                }
                Command::Replicate { worker, files } => {
                    let files = self.replica_sources(worker, files);
                    tracing::debug!(worker, files = files.len(), "copying intermediate files");
                    if !files.is_empty() {
                        self.conns.to_worker(worker, &ToWorker::Replicate { files });
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
                    // is merely slow sees the end of stream and reconnects (under its id).
                    // Its allocation learns now, not when the connection's end comes through
                    // (a dead node's may take many minutes): it may be asked about, released,
                    // or replaced. A later end of the connection changes nothing.
                    let now = self.now();
                    if let Some(c) = self.conns.workers.remove(&worker) {
                        tracing::warn!(worker, peer = %c.peer, "worker lost: {reason}");
                        self.depart(now, worker, c, reason);
                    } else {
                        self.provision.worker_left(now, worker);
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

    /// The assignment of `run`: list tasks carry their argvs, tasks of lines their lines.
    fn assigned(&self, run: IndexRun) -> Assigned {
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
    }

    /// Where `worker` can fetch the inputs of `tasks` it does not hold from: the peers whose
    /// caches hold them and serve them, a few per file, each file's list starting at a place
    /// of its own for each file and asker, so that one popular file's askers spread over its
    /// holders. Empty for jobs
    /// without inputs, at no cost beyond a lookup per run.
    fn sources_for(&self, worker: WorkerId, tasks: &[Assigned]) -> Vec<FileSources> {
        let index = self.core.files();
        let mut seen = FxHashSet::default();
        let mut sources = Vec::new();
        for a in tasks {
            let Some(job) = self.core.job(a.run.job) else {
                continue;
            };
            if job.inputs_of(a.run.first).is_empty() {
                continue;
            }
            for i in a.run.first..a.run.first + a.run.count {
                for &file in job.inputs_of(i) {
                    if sources.len() >= SOURCES_PER_ASSIGN {
                        return sources;
                    }
                    if index.holds(worker, file) || !seen.insert(file) {
                        continue;
                    }
                    let peers = self.peers_of(worker, file);
                    if let (false, Some(name)) = (peers.is_empty(), index.name(file)) {
                        sources.push(FileSources {
                            file: name.to_string(),
                            peers,
                        });
                    }
                }
            }
        }
        sources
    }

    /// Up to [`PEERS_PER_FILE`] workers other than `worker` that hold `file` and serve their
    /// caches, by URL; the first one rotates with the file and the asker, to spread the load.
    fn peers_of(&self, worker: WorkerId, file: kestrel_core::files::FileId) -> Vec<String> {
        let holders = self.core.files().holders(file);
        let start = (file as usize).wrapping_add(worker as usize) % holders.len().max(1);
        holders[start..]
            .iter()
            .chain(&holders[..start])
            .filter(|&&w| w != worker)
            .filter_map(|w| self.conns.workers.get(w)?.serves.clone())
            .take(PEERS_PER_FILE)
            .collect()
    }

    /// Where `worker` can copy each of `files` from: the peers holding it that serve their
    /// caches.
    fn replica_sources(&self, worker: WorkerId, files: Vec<String>) -> Vec<FileSources> {
        let index = self.core.files();
        files
            .into_iter()
            .filter_map(|file| {
                let peers = self.peers_of(worker, index.id(&file)?);
                (!peers.is_empty()).then_some(FileSources { file, peers })
            })
            .collect()
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
