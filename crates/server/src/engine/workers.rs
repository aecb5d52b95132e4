//! What workers say, as scheduler events: joining (and resuming after a reconnect), their
//! batched reports of starts and ends, and leaving.

use super::durable::OutputsOf;
use super::route::WorkerConn;
use super::{ConnId, Engine, Outbox};
use kestrel_core::{Event, Reply, Resources, WorkerId, WorkerOffer};
use kestrel_proto::messages::{
    CacheChange, FromWorker, Registration, Resume, TaskOutput, ToWorker, Unheld,
};
use std::net::SocketAddr;
use tokio::sync::oneshot;

impl Engine {
    /// Registers a worker: the scheduler gives it an id, it is told its id and the server's,
    /// and a reconnecting worker's tasks and results are taken back.
    pub(super) fn worker_joined(
        &mut self,
        now: u64,
        r: Registration,
        peer: SocketAddr,
        outbox: Outbox,
        reply: oneshot::Sender<WorkerId>,
    ) {
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
            stages_files: r.cache.is_some(),
            runs_functions: r.python.is_some(),
        };
        // A worker that was registered with this server (before a lost connection, or before
        // a restart: the journal keeps the server's id) asks for its id back.
        let previous = r
            .resume
            .as_ref()
            .filter(|res| res.server_id == self.server_id)
            .map(|res| (res.previous_worker, res.epoch == self.epoch));
        let join = match previous {
            Some((previous, same_start)) => Event::WorkerRejoined {
                offer,
                previous,
                same_start,
            },
            None => Event::WorkerJoined { offer },
        };
        let Reply::Joined(id) = self.event(now, join) else {
            tracing::error!(%peer, "the scheduler gave a joining worker no id");
            return;
        };
        if self.durable.journaling() {
            self.durable.pending.worker_id_given(id);
        }
        let back = previous.is_some_and(|(p, _)| p == id);
        if let Some(old) = self.conns.workers.remove(&id) {
            // Its own registration, whose connection had not been noticed dead: dropping it
            // closes that connection, whose end then changes nothing.
            tracing::info!(worker = id, peer = %old.peer, "worker registered again before its connection was noticed lost");
            self.provision.worker_left(now, id);
        }
        self.departures.returned(id);
        outbox.send(&ToWorker::Registered {
            worker: id,
            heartbeat_ms: self.heartbeat_ms,
            server: self.info.address.clone(),
            server_id: self.server_id.clone(),
            epoch: self.epoch,
        });
        if back {
            tracing::info!(worker = id, %peer, host = %r.hostname, slots = r.slots, "worker joined again under its id");
        } else {
            tracing::info!(worker = id, %peer, host = %r.hostname, slots = r.slots, "worker joined");
        }
        let mut farewell = None;
        if let Some(alloc) = r.alloc {
            match self.provision.worker_joined(now, id, alloc) {
                crate::provision::Joined::Work => {}
                crate::provision::Joined::Leave(reason) => {
                    tracing::info!(worker = id, alloc, "worker told to leave: {reason}");
                    outbox.send(&ToWorker::Shutdown {
                        reason: reason.clone(),
                    });
                    farewell = Some(reason);
                }
                crate::provision::Joined::Unknown => tracing::warn!(
                    worker = id,
                    alloc,
                    "the worker says it runs in allocation {alloc}, which no queue of this server made (another server's pilot, or a removed queue): it runs tasks as any worker"
                ),
            }
        }
        if outbox.version >= kestrel_proto::NODES_VERSION {
            // It can be one node of multi-node tasks, beside the workers of its `--group`, else
            // of its allocation (HyperQueue's default grouping), else of none.
            let group = match (&r.group, r.alloc) {
                (Some(g), _) => g.clone(),
                (None, Some(a)) => format!("allocation {a}"),
                (None, None) => String::new(),
            };
            self.event(now, Event::WorkerNodes { worker: id, group });
        }
        if let Some(end) = r.ends_at_s {
            let at_us = end.saturating_mul(1_000_000);
            if at_us <= now {
                tracing::warn!(
                    worker = id,
                    "worker joined after its allocation's end (--ends-at {end}): it gets no task"
                );
            }
            self.event(now, Event::WorkerEnds { worker: id, at_us });
        }
        if let Some(resume) = r.resume {
            self.resume(now, id, back, resume);
        }
        let cache_capacity = r.cache.as_ref().map(|c| c.capacity);
        let serves = r
            .cache
            .as_ref()
            .map(|c| c.serves.as_str())
            .filter(|url| !url.is_empty())
            .and_then(|url| {
                let usable = peer_url_usable(url, peer);
                if !usable {
                    tracing::warn!(worker = id, %peer, "worker's cache URL {url:?} is not an http(s) URL its peers can dial; not named to them (see `worker start --peer-listen`)");
                }
                usable.then(|| url.to_string())
            });
        if let Some(cache) = r.cache {
            // A cache that survived a restart: what it holds is placed by again at once.
            let (added, evicted) = (cache.held, Vec::new());
            self.event(
                now,
                Event::CacheChanged {
                    worker: id,
                    added,
                    evicted,
                },
            );
        }
        let conn = WorkerConn {
            outbox,
            peer,
            exec: r.exec,
            cache_capacity,
            serves,
            python: r.python,
            farewell,
        };
        self.conns.workers.insert(id, conn);
        let _ = reply.send(id);
    }

    /// Applies a registered worker's message.
    pub(super) fn worker_said(&mut self, now: u64, worker: WorkerId, msg: FromWorker) {
        self.event(now, Event::WorkerSeen { worker });
        match msg {
            FromWorker::Update {
                started,
                finished,
                outputs,
                waited,
                cache,
            } => {
                for t in &cache.moved {
                    let (job, moved) = (t.job, t.moved);
                    if !t.store_trouble.is_empty() {
                        let why = t.store_trouble.chars().take(500).collect();
                        self.store_trouble.insert(job, (why, now));
                    } else if moved.store_files > 0 {
                        // Reads from the store succeed again.
                        self.store_trouble.remove(&job);
                    }
                    if !moved.is_empty() {
                        let tasks = t.tasks.iter().map(|t| (t.index, t.moved)).collect();
                        self.event(now, Event::DataMoved { job, moved, tasks });
                    }
                }
                self.peers_did_not_hold(now, &cache.unheld);
                if let Some(capacity) = cache.capacity {
                    if let Some(conn) = self.conns.workers.get_mut(&worker) {
                        conn.cache_capacity = Some(capacity);
                    }
                }
                if !cache.added.is_empty() || !cache.evicted.is_empty() {
                    let CacheChange { added, evicted, .. } = cache;
                    self.event(
                        now,
                        Event::CacheChanged {
                            worker,
                            added,
                            evicted,
                        },
                    );
                }
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
            FromWorker::Leaving {
                now: at_once,
                reason,
            } => {
                let reason: String = reason.chars().take(500).collect();
                tracing::info!(worker, "the worker says it leaves: {reason}");
                let _ = self.stop_worker(now, worker, at_once, reason);
            }
            FromWorker::Register(_) => {
                tracing::warn!(worker, "worker registered twice; ignored");
            }
        }
    }

    /// Peers that were named as holding files and did not serve them whole: the index stops
    /// naming them for those files (until they report them again).
    fn peers_did_not_hold(&mut self, now: u64, unheld: &[Unheld]) {
        for u in unheld {
            let holder = self
                .conns
                .workers
                .iter()
                .find(|(_, c)| c.serves.as_deref() == Some(u.peer.as_str()))
                .map(|(&id, _)| id);
            if let Some(worker) = holder {
                tracing::debug!(worker, file = %u.file, "a peer did not serve a file it was listed for");
                self.event(
                    now,
                    Event::CacheChanged {
                        worker,
                        added: Vec::new(),
                        evicted: vec![u.file.clone()],
                    },
                );
            }
        }
    }

    /// A worker's connection `conn` ended: its tasks go back to the queue. The end of a
    /// connection the engine dropped already (a heartbeat timeout, `worker stop --now`, a
    /// registration its worker replaced) changes nothing: the worker may be registered again
    /// under its id, on another connection.
    pub(super) fn worker_gone(&mut self, now: u64, worker: WorkerId, conn: ConnId, reason: &str) {
        if self
            .conns
            .workers
            .get(&worker)
            .is_none_or(|c| c.outbox.conn != conn)
        {
            return;
        }
        let Some(c) = self.conns.workers.remove(&worker) else {
            return;
        };
        let why = self.why_gone(now, worker, &c, reason);
        tracing::info!(worker, "worker left: {why}");
        self.depart(now, worker, c, why);
        self.event(now, Event::WorkerLost { worker });
    }

    /// Why a worker whose connection ended (with `reason`) left, in words for
    /// `worker list --all`.
    fn why_gone(&self, now: u64, worker: WorkerId, c: &WorkerConn, reason: &str) -> String {
        let w = self.core.worker(worker);
        let mut why = if let Some(told) = &c.farewell {
            told.clone()
        } else if let Some(stopping) = self.leaving.get(&worker) {
            format!("its connection closed ({reason}) while it was stopping: {stopping}")
        } else if w.and_then(|w| w.ends_at_us).is_some_and(|end| end <= now) {
            format!("its allocation ended ({reason})")
        } else if reason == "connection closed" {
            "its connection closed (the worker exited, or its node went away)".to_string()
        } else {
            format!("its connection failed: {reason}")
        };
        if let Some(q) = w.and_then(|w| w.quarantined.as_ref()) {
            why.push_str(&format!("; it was quarantined: {q}"));
        }
        why
    }

    /// Hands a reconnected worker's running tasks and results to the core, if it was
    /// registered with this server; `back` says it got its previous id again.
    fn resume(&mut self, now: u64, worker: WorkerId, back: bool, resume: Resume) {
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
        // Its previous registration, if any, is its own: under its id, which it got back.
        let previous = back.then_some(worker);
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

    /// Applies the task ends of a worker's update, and journals each the scheduler took (with
    /// its streamed output).
    fn tasks_ended(
        &mut self,
        now: u64,
        worker: WorkerId,
        ends: Vec<kestrel_core::Finished>,
        outputs: Vec<TaskOutput>,
    ) {
        if self.provision.origin_of(worker).is_some() {
            // What the worker's allocation spent on tasks, for its busy vs idle CPU-seconds.
            let cpu_us: u64 = ends
                .iter()
                .map(|f| {
                    let cpus = self.core.job(f.job).map_or(1, |j| j.need.cpus.max(1));
                    f.finished_us
                        .saturating_sub(f.started_us)
                        .saturating_mul(u64::from(cpus))
                })
                .fold(0u64, u64::saturating_add);
            self.provision.task_ran(worker, cpu_us);
        }
        if let Reply::Reports { ignored, .. } = self.event(now, Event::TasksEnded { worker, ends })
        {
            self.ignored_reports += u64::from(ignored);
        }
        // A worker that runs processes says how its tasks' own output files are from
        // version 11 on (a no-op one runs nothing, and writes no file).
        let reports_files = self.conns.workers.get(&worker).is_some_and(|c| {
            c.outbox.version >= kestrel_proto::OUTPUT_FILES_VERSION && c.exec == "process"
        });
        self.journal_ends_with(now, OutputsOf::from_worker(outputs, reports_files));
    }
}

/// Whether `url`, where a worker connected from `peer` serves its cache, is one other workers
/// can dial: http(s), not a wildcard address, and not a loopback one unless the worker itself
/// is on the server's machine (then its peers there are too).
fn peer_url_usable(url: &str, peer: SocketAddr) -> bool {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return false;
    };
    if url.len() > 512 {
        return false;
    }
    let authority = rest.split('/').next().unwrap_or_default();
    match authority.parse::<SocketAddr>() {
        Ok(a) => !a.ip().is_unspecified() && (!a.ip().is_loopback() || peer.ip().is_loopback()),
        // A host name: taken as given.
        Err(_) => !authority.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::peer_url_usable;

    #[test]
    fn only_urls_peers_can_dial_are_named() {
        let remote = "10.0.0.7:40000".parse().unwrap();
        let local = "127.0.0.1:40000".parse().unwrap();
        assert!(peer_url_usable("http://10.0.0.7:7100/", remote));
        assert!(peer_url_usable("http://node7:7100/", remote));
        assert!(peer_url_usable("http://[fd00::7]:7100/", remote));
        assert!(!peer_url_usable("http://0.0.0.0:7100/", remote));
        assert!(!peer_url_usable("http://[::]:7100/", remote));
        assert!(!peer_url_usable("http://127.0.0.1:7100/", remote));
        assert!(peer_url_usable("http://127.0.0.1:7100/", local));
        assert!(!peer_url_usable("ftp://10.0.0.7/", remote));
        assert!(!peer_url_usable("http:///", remote));
    }
}
