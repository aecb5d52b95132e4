//! Answering clients: requests and queries become scheduler events or reads, rendered by
//! `views`; waits are kept until their jobs end, with progress on the way.

use super::{ConnId, Engine};
use crate::outputs::Stream;
use crate::views;
use kestrel_core::{Event, JobId, Reply, TaskSet};
use kestrel_proto::messages::*;

/// A client's `Wait`, answered when its jobs have all ended.
pub(super) struct Waiter {
    conn: ConnId,
    request: u64,
    jobs: Vec<JobId>,
    every_us: u64,
    last_us: u64,
}

impl Engine {
    /// Queues a reply; it goes out after this batch's journal commit (see [`Self::commit`]).
    fn reply(&mut self, conn: ConnId, id: u64, result: Result<Answer, Refusal>) {
        self.durable.hold(conn, id, result, None);
    }

    /// Answers a client's request (or keeps it, for a wait).
    pub(super) fn answer(&mut self, now: u64, conn: ConnId, req: Request) {
        if let Some(why) = &self.durable.read_only {
            if !reads_only(&req.body) {
                let refused = Err(Refusal::from(why.clone()));
                self.reply(conn, req.id, refused);
                return;
            }
        }
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
                        self.watch.submitted(conn, job, &self.core);
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
                } else if let Some(why) = super::inputs::missing_value(&self.core, &spec) {
                    tracing::info!("submission refused: {why}");
                    Err(Refusal::from(why))
                } else if super::inputs::needs_store(&spec)
                    && spec.placement.store.is_none()
                    && self.store.is_none()
                {
                    // Every task would fail staging, and outputs would reach no store.
                    Err(Refusal::from(
                        "the job declares files, but neither it nor the server names a store; give one with `--store DIR|URL` (or start the server with `--store`)".to_string(),
                    ))
                } else if let Some(why) = self.python_misfit(&spec) {
                    tracing::info!("submission refused: {why}");
                    Err(Refusal::from(why))
                } else if let Some(why) = self
                    .store_of(&spec)
                    // A job held until its last piece is checked whole then (a task may read
                    // what a later piece writes).
                    .filter(|_| !self.core.holds_until_closed(&spec, open))
                    .and_then(|store| {
                        let job = self.core.next_job_id();
                        super::inputs::missing_input(&self.core, store, job, &spec, &tasks)
                    })
                {
                    tracing::info!("submission refused: {why}");
                    Err(Refusal::from(why))
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
                            // Watched from its creation, if its connection watches what it
                            // submits: no end is missed before a `Watch` could name it.
                            self.watch.submitted(conn, job, &self.core);
                            // A job too big for every worker connected now is kept (a bigger
                            // one may come), but its submitter hears of it at once, unless an
                            // allocation queue may bring that bigger worker.
                            let warning = match self.core.stall(job) {
                                Some(s @ kestrel_core::Stall::TooBig { .. })
                                    if !self.provision.has_active_queue() =>
                                {
                                    Some(s.to_string())
                                }
                                _ => None,
                            };
                            let submitted = Answer::Submitted {
                                job,
                                warning,
                                repeated: false,
                            };
                            let created = Some((job, key));
                            self.durable.hold(conn, req.id, Ok(submitted), created);
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
            } => {
                let result = self.extend(now, job, at, TaskSet::List(argvs), close);
                // Held for the commit, naming its job (canceled if the commit fails).
                self.durable.hold(conn, req.id, result, Some((job, None)));
                return;
            }
            Ask::ExtendLines {
                job,
                at,
                lines,
                close,
            } => {
                let result = self.extend(now, job, at, TaskSet::Lines(lines), close);
                self.durable.hold(conn, req.id, result, Some((job, None)));
                return;
            }
            Ask::AllocAdd(spec) => match self.provision.add(*spec, (conn, req.id)) {
                Ok(crate::provision::Added::Now(queue)) => Ok(Answer::AllocAdded { queue }),
                // Answered once the batch system has checked a test allocation.
                Ok(crate::provision::Added::Checking) => return,
                Err(e) => Err(Refusal::from(e)),
            },
            Ask::AllocList => Ok(Answer::AllocQueues(self.provision.views(now))),
            Ask::AllocPause { queue, paused } => self
                .provision
                .pause(queue, paused)
                .map(|()| Answer::AllocQueues(self.provision.views(now)))
                .map_err(Refusal::from),
            Ask::AllocLog {
                queue,
                alloc,
                lines,
            } => self
                .provision
                .logs(queue, alloc, lines)
                .map(Answer::AllocLogs)
                .map_err(Refusal::from),
            Ask::AllocRemove { queue, force } => self
                .provision
                .remove(queue, force)
                .map(|()| Answer::AllocQueues(self.provision.views(now)))
                .map_err(Refusal::from),
            Ask::JobList => Ok(Answer::Jobs(
                self.core
                    .jobs()
                    .map(|j| views::job_summary(&self.core, j))
                    .collect(),
            )),
            Ask::JobInfo { job } => match self.core.job(job) {
                Some(j) => Ok(Answer::Job(Box::new(views::job_detail(
                    &self.core,
                    j,
                    self.waiting(job, now),
                )))),
                None => Err(no_such_job(job)),
            },
            Ask::TaskList { job, state, limit } => match self.core.job(job) {
                Some(j) => Ok(Answer::Tasks(views::task_page(j, state, limit))),
                None => Err(no_such_job(job)),
            },
            Ask::WorkerList => Ok(Answer::Workers(self.worker_rows())),
            Ask::Workers { departed } => Ok(Answer::WorkerList(self.worker_listing(departed))),
            Ask::WorkerInfo { worker } => self
                .worker_detail(worker)
                .map(|d| Answer::WorkerDetail(Box::new(d))),
            Ask::WorkerStop {
                workers,
                all,
                now: at_once,
            } => Ok(Answer::WorkersStopped(
                self.stop_workers(now, workers, all, at_once),
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
                        // The client's number: at least 50 ms, at most a day, never an overflow.
                        every_us: progress_ms.clamp(50, 86_400_000) * 1000,
                        last_us: now,
                    };
                    if self.wait_done(&w) {
                        let done = Ok(Answer::WaitDone(self.progress_of(&w.jobs, now)));
                        self.durable.hold_wait(conn, req.id, done, w.jobs);
                        return;
                    } else if let Some(why) = &self.durable.read_only {
                        // Nothing moves in a record: the run ended before these jobs did.
                        Err(Refusal::from(format!(
                            "{why}; the run was stopped before all of its jobs ended"
                        )))
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
                let freed = self.core.freed();
                let remade = self.core.reruns();
                // Positional: `intermediates_deleted` is sent whenever the field after it is.
                info.intermediates_deleted = (freed.0 > 0 || remade > 0).then_some(freed);
                info.intermediates_remade = (remade > 0).then_some(remade);
                info.queued = self.core.queued();
                // For a client of version 14 on (`Outbox::reply` leaves them out for others).
                info.traffic = Some(self.traffic.snapshot());
                info.values_deleted = Some(self.core.values_freed());
                info.journal = self.durable.journal.as_ref().map(|j| JournalInfo {
                    path: j.path().display().to_string(),
                    bytes: j.bytes(),
                    rows: self.durable.rows,
                    error: self.durable.error.clone(),
                });
                Ok(Answer::Info(Box::new(info)))
            }
            Ask::Retry { job, failed_only } => {
                // Re-running tasks is new work: refused, like a submission, while it cannot be
                // journaled.
                let retried = self
                    .durable
                    .accepting_work()
                    .map_err(Refusal::from)
                    .and_then(|()| {
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
                // Streamed outputs still waiting for their commit are read from the journal once
                // there; a job whose stream goes to files or nowhere has none to wait for (and a
                // `job cat` of it during a busy run forces no sync).
                let streamed = self
                    .core
                    .job(job)
                    .is_some_and(|j| Stream::of(stderr).sink(&j.spec).is_stream());
                if streamed && self.durable.journaling() && !self.durable.settled() {
                    self.commit(true);
                }
                match self.core.job(job) {
                    Some(j) => self
                        .outputs
                        .page(
                            self.durable.journal.as_ref(),
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
            Ask::Locate { files } => self.locate(files),
            Ask::Place { bytes } => self.place(bytes),
            Ask::Placed { worker, files } => self.placed(now, worker, files),
            Ask::DropValues { files } => self.drop_values(now, files),
            Ask::CancelTasks { job, tasks } => Ok(Answer::Canceled(vec![CancelResult {
                job,
                result: self.cancel_tasks(now, job, &tasks),
            }])),
            Ask::Watch { jobs, submitted } => {
                let version = self.conns.clients.get(&conn).map_or(0, |c| c.version);
                if version < kestrel_proto::WATCH_VERSION {
                    // Such a client cannot send it; nothing is pushed to one that cannot read it.
                    Err(Refusal::from(format!(
                        "a watch needs protocol version {} or later; this connection speaks {version}",
                        kestrel_proto::WATCH_VERSION
                    )))
                } else {
                    let missing = self.watch.watch(conn, jobs, submitted, &self.core);
                    Ok(Answer::Watching { missing })
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
            Ask::Jobs { filter } => views::jobs_page(&self.core, &filter).map(Answer::JobsPage),
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
            Ask::JobGraph { job, by_job } => match views::workflow(&self.core, job, by_job) {
                Some(g) => Ok(Answer::Graph(Box::new(g))),
                None => Err(no_such_job(job)),
            },
            Ask::TaskInfo { job, task } => match self.core.job(job) {
                None => Err(no_such_job(job)),
                Some(j) => match j.index_of(task) {
                    None => Err(Refusal::not_found(format!(
                        "job {job} has no task {task}; `kestrel job info {job}` shows its task ids"
                    ))),
                    Some(index) => {
                        let host = views::worker_host(&self.core, j, index);
                        let nodes = self
                            .core
                            .nodes_of((job, index))
                            .map(<[u32]>::to_vec)
                            .unwrap_or_default();
                        let detail = views::task_detail(j, index, host, nodes);
                        Ok(Answer::Task(Box::new(detail)))
                    }
                },
            },
        };
        self.pass_rows = self.pass_rows.saturating_add(rows_of(&result));
        self.reply(conn, req.id, result);
    }

    /// Cancels the tasks of `job` with ids in `tasks`; ids the job does not have are left
    /// alone (those it has are canceled, as far as they have not ended).
    fn cancel_tasks(
        &mut self,
        now: u64,
        job: JobId,
        tasks: &kestrel_core::IdRanges,
    ) -> Result<(u32, u32), Refusal> {
        let Some(j) = self.core.job(job) else {
            return Err(no_such_job(job));
        };
        if tasks.len() > j.len() {
            return Err(Refusal::from(format!(
                "{} task ids for job {job}, which has {}: name fewer (or cancel the job)",
                tasks.len(),
                j.len()
            )));
        }
        let indices: Vec<u32> = (0..tasks.len())
            .filter_map(|k| j.index_of(tasks.id_at(k)?))
            .collect();
        match self.core.handle(now, Event::CancelTasks { job, indices }) {
            Ok(Reply::Canceled { queued, running }) => {
                tracing::info!(job, queued, running, "tasks canceled");
                Ok((queued, running))
            }
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(Refusal::from(e)),
        }
    }

    /// Forgets ended jobs (`jobs`, and with `all_ended` every ended job); the scheduler records
    /// it for the journal, so a restarted server does not bring them back. Submission keys of
    /// forgotten jobs go too, and what workers said of their stores.
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
            self.store_trouble.retain(|job, _| !gone.contains(job));
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
        let held = close && self.core.job(job).is_some_and(|j| j.held());
        let (at, more) = match held {
            true => self.check_held_whole(now, job, at, more)?,
            false => (at, more),
        };
        let extend = Event::Extend {
            job,
            at,
            more,
            close,
        };
        match self.core.handle(now, extend) {
            Ok(_) => Ok(Answer::Extended),
            // A held job refused at its last piece is withdrawn by the scheduler.
            Err(e) if held && self.core.job(job).is_none() => {
                Err(self.withdrawn(job, &e.to_string()))
            }
            Err(e) => Err(Refusal::from(e)),
        }
    }

    /// The last piece of held job `job`: adds it without closing the job, then checks the
    /// whole job's inputs against the store as a submission is checked. Returns the closing
    /// extension left to send (no tasks), or withdraws the job and says why.
    fn check_held_whole(
        &mut self,
        now: u64,
        job: JobId,
        at: u32,
        more: TaskSet,
    ) -> Result<(u32, TaskSet), Refusal> {
        let none = match &more {
            TaskSet::Lines(_) => TaskSet::Lines(Default::default()),
            _ => TaskSet::List(Vec::new()),
        };
        let add = Event::Extend {
            job,
            at,
            more,
            close: false,
        };
        self.core.handle(now, add).map_err(Refusal::from)?;
        self.journal_records(now);
        let Some(j) = self.core.job(job) else {
            return Err(Refusal::from(format!("job {job} does not exist")));
        };
        let missing = self.store_of(&j.spec).and_then(|store| {
            super::inputs::missing_input(&self.core, store, job, &j.spec, &j.tasks)
        });
        let len = j.len();
        if let Some(why) = missing {
            let _ = self.core.handle(now, Event::Cancel { job });
            self.journal_records(now);
            let _ = self.core.handle(now, Event::Forget { job });
            return Err(self.withdrawn(job, &why));
        }
        Ok((len, none))
    }

    /// The refusal of a held job's last piece, after the job was withdrawn (its key freed).
    fn withdrawn(&mut self, job: JobId, why: &str) -> Refusal {
        self.keys.retain(|_, j| *j != job);
        tracing::info!("job {job} refused at its last piece and withdrawn: {why}");
        Refusal::from(format!(
            "{why}; job {job}, sent in pieces, is withdrawn: none of its tasks runs"
        ))
    }

    /// Why a function job fits the Python of none of the connected workers, if it does not.
    /// Not while an allocation queue may bring others (their runners check each job).
    fn python_misfit(&self, spec: &kestrel_core::JobSpec) -> Option<String> {
        let kestrel_core::TaskKind::Function(f) = &spec.template.kind else {
            return None;
        };
        if self.provision.has_active_queue() {
            return None;
        }
        // The common case, on every function submission: some worker fits, found without
        // building the list a refusal names.
        let fits = |w: &super::route::WorkerConn| {
            w.python
                .as_ref()
                .is_some_and(|p| super::pythons::fits(&f.env, p))
        };
        if self.conns.workers.values().any(fits) {
            return None;
        }
        let mut workers: Vec<_> = self
            .conns
            .workers
            .iter()
            .filter_map(|(&id, w)| {
                let python = w.python.as_ref()?;
                let host = self
                    .core
                    .worker(id)
                    .map_or("?", |c| c.offer.hostname.as_str());
                Some((id, host, python))
            })
            .collect();
        // Named in the order of their ids.
        workers.sort_unstable_by_key(|w| w.0);
        super::pythons::mismatch(f, workers.into_iter())
    }

    /// The store a job's files are read from: its own, else the server's.
    fn store_of<'a>(&'a self, spec: &'a kestrel_core::JobSpec) -> Option<&'a str> {
        spec.placement.store.as_deref().or(self.store.as_deref())
    }

    /// Why `job`'s queued or staging tasks wait, if they do: what they depend on has not
    /// finished, no worker can take them (the scheduler's stall), or their store fails, as a
    /// worker said lately (within three heartbeats: a worker whose reads fail says so at each)
    /// of a job not done. For an ended job: why its tasks canceled for a dependency stay so.
    fn waiting(&self, job: JobId, now: u64) -> Option<String> {
        if self.core.job(job).is_some_and(|j| j.is_done()) {
            // Ended: its tasks canceled because a dependency failed wait for its retry.
            return self.core.canceled_because(job);
        }
        if self.core.job(job).is_some_and(|j| j.held() && j.open) {
            return Some(
                "its tasks wait for the rest of the job, which its client is still sending in pieces: a job in a task graph is linked whole".to_string(),
            );
        }
        if let Some(stall) = self.core.stall(job) {
            if stall == kestrel_core::Stall::NoWorkers {
                if let Some(why) = self.provision.awaited(&self.core) {
                    return Some(why);
                }
            }
            return Some(stall.to_string());
        }
        let (why, at) = self.store_trouble.get(&job)?;
        let recent = now.saturating_sub(*at) <= 3 * self.heartbeat_ms * 1000;
        let live = self.core.job(job).is_some_and(|j| !j.is_done());
        (recent && live)
            .then(|| format!("tasks wait for the store, reading it again with backoff: {why}"))
    }

    /// How far the jobs of a wait are.
    fn progress_of(&self, jobs: &[JobId], now: u64) -> WaitProgress {
        let mut p = WaitProgress {
            jobs: jobs.len() as u32,
            ..Default::default()
        };
        for j in jobs.iter().filter_map(|id| self.core.job(*id)) {
            p.counts.add(&j.counts);
            if j.is_done() {
                p.jobs_done += 1;
            } else if p.waiting.is_none() {
                p.waiting = self
                    .waiting(j.id, now)
                    .map(|why| format!("job {}: {why}", j.id));
            }
        }
        p
    }

    /// Whether every job of a wait has ended (or was forgotten).
    fn wait_done(&self, w: &Waiter) -> bool {
        w.jobs
            .iter()
            .all(|id| self.core.job(*id).is_none_or(|j| j.is_done()))
    }

    /// Sends each wait whose interval has passed its progress.
    pub(super) fn send_progress(&mut self, now: u64) {
        for i in 0..self.waiters.len() {
            let w = &self.waiters[i];
            if now.saturating_sub(w.last_us) < w.every_us {
                continue;
            }
            let progress = self.progress_of(&w.jobs, now);
            let msg = ToClient::Progress {
                id: w.request,
                progress,
            };
            self.conns.to_client(w.conn, &msg);
            self.waiters[i].last_us = now;
        }
    }

    /// A client's connection ended: its waits and its watch end with it.
    pub(super) fn client_gone(&mut self, conn: ConnId) {
        self.conns.clients.remove(&conn);
        self.waiters.retain(|w| w.conn != conn);
        self.watch.conn_gone(conn);
    }

    /// Answers the waits whose jobs have all ended.
    pub(super) fn finish_waiters(&mut self) {
        let mut i = 0;
        while i < self.waiters.len() {
            if self.wait_done(&self.waiters[i]) {
                let w = self.waiters.swap_remove(i);
                let progress = self.progress_of(&w.jobs, self.now());
                let done = Ok(Answer::WaitDone(progress));
                self.durable.hold_wait(w.conn, w.request, done, w.jobs);
            } else {
                i += 1;
            }
        }
    }
}

/// Whether a request only reads (what the record of a finished run answers): anything else,
/// a request added later included, is refused there.
fn reads_only(ask: &Ask) -> bool {
    matches!(
        ask,
        Ask::JobList
            | Ask::JobInfo { .. }
            | Ask::TaskList { .. }
            | Ask::WorkerList
            | Ask::Workers { .. }
            | Ask::WorkerInfo { .. }
            | Ask::Wait { .. }
            | Ask::ServerInfo
            | Ask::Output { .. }
            | Ask::JobStates { .. }
            | Ask::Jobs { .. }
            | Ask::TaskPage { .. }
            | Ask::JobGraph { .. }
            | Ask::TaskInfo { .. }
            | Ask::AllocList
            | Ask::AllocLog { .. }
            | Ask::Watch { .. }
            | Ask::Locate { .. }
    )
}

/// The rows an answer lists (what a pass of the engine spends on the pages it answers).
fn rows_of(result: &Result<Answer, Refusal>) -> usize {
    match result {
        Ok(Answer::Tasks(p)) => p.rows.len(),
        Ok(Answer::TaskRange(p)) => p.rows.len(),
        Ok(Answer::Jobs(j)) => j.len(),
        Ok(Answer::JobsPage(p)) => p.jobs.len(),
        Ok(Answer::Output(p)) => p.rows.len(),
        _ => 0,
    }
}

fn no_such_job(job: JobId) -> Refusal {
    kestrel_core::SchedError::NoSuchJob(job).into()
}

/// The refusal for a reply of the wrong kind from the scheduler: a defect, said as such.
fn unexpected(reply: &Reply) -> Refusal {
    tracing::error!("the scheduler answered with {reply:?}");
    Refusal::from(format!(
        "internal error: the scheduler answered with {reply:?}; please report it"
    ))
}
