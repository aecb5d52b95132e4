//! The scheduler's one input: an [`Event`], taken by [`Scheduler::handle`], which answers with a
//! [`Reply`] and leaves [`crate::Command`]s for the driver to carry out and [`crate::Record`]s
//! for it to journal.
//!
//! One type for every input lets a driver log, replay or generate inputs as values: the
//! simulator and the property tests feed sequences of events, the server feeds what arrives
//! on its sockets, and both see the same outputs.

use super::{Resumed, SchedError, Scheduler, WorkerOffer};
use crate::files::Transfers;
use crate::outcome::{Failure, Finished, Started};
use crate::spec::{JobId, JobSpec, TaskIndex, TaskSet, WorkerId};

/// Something that happened which the scheduler takes into account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A client submits a job. With `open`, more tasks may follow ([`Event::Extend`]). `key`,
    /// the client's idempotency key, is only passed on to the journal
    /// ([`crate::Record::Submitted`]). The spec is boxed to keep the other events small.
    Submit {
        /// What every task of the job runs and holds.
        spec: Box<JobSpec>,
        /// The tasks.
        tasks: TaskSet,
        /// Whether more tasks may follow.
        open: bool,
        /// The client's idempotency key.
        key: Option<String>,
    },
    /// Tasks for an open job. `at` is the index the first of `more` takes in the job, and
    /// `more` is of the job's kind (argvs for a list of commands, lines for a job of lines);
    /// `close` says no more will come. A client that lost its connection sends the same pieces
    /// again: tasks the job already holds are skipped and a repeated close is accepted, so a
    /// retried submission never adds a task twice.
    Extend {
        /// The open job.
        job: JobId,
        /// The index in the job of the first of `more`.
        at: u32,
        /// The tasks added.
        more: TaskSet,
        /// Whether no more will come.
        close: bool,
    },
    /// Cancel every task of a job that has not ended: queued ones at once, running ones by
    /// asking their workers.
    Cancel {
        /// The job to cancel.
        job: JobId,
    },
    /// Cancel these tasks of a job (by index) that have not ended: queued and waiting ones at
    /// once (each recorded as a canceled end), assigned and running ones by asking their
    /// workers; what waits for them is canceled in turn. Indices past the job's end and tasks
    /// that ended are left alone.
    CancelTasks {
        /// The job.
        job: JobId,
        /// The tasks, by index.
        indices: Vec<TaskIndex>,
    },
    /// Queue a job's failed tasks again (and its canceled ones unless `failed_only`), with
    /// fresh retry and crash counts.
    Retry {
        /// The job to retry.
        job: JobId,
        /// Whether to leave its canceled tasks as they are.
        failed_only: bool,
    },
    /// Drop a job that has ended, with its task records. Its id is not given out again.
    Forget {
        /// The job to drop.
        job: JobId,
    },
    /// A worker connects, offering what it has.
    WorkerJoined {
        /// What the worker offers.
        offer: WorkerOffer,
    },
    /// A worker that was registered as `previous` (with this scheduler, or with the same
    /// server before a restart, whose ids were reserved with
    /// [`Scheduler::reserve_worker_ids`]) connects again, offering what it has: it gets its
    /// id back unless another worker holds it. `same_start` says `previous` was given by this
    /// scheduler (not by the server's previous start): a registration under that id still
    /// held is then its own, not yet noticed lost, and is replaced. Its
    /// [`Event::WorkerResumed`] follows at once, naming `previous`.
    WorkerRejoined {
        /// What the worker offers.
        offer: WorkerOffer,
        /// Its id before.
        previous: WorkerId,
        /// Whether `previous` was given in this start.
        same_start: bool,
    },
    /// A worker is told to leave at once (`kestrel worker stop --now`): its tasks go back to
    /// the queue without counting a crash or spending a retry (it is killing them).
    WorkerDismissed {
        /// The worker.
        worker: WorkerId,
    },
    /// A worker's allocation ends at `at_us` (the scheduler's clock): from
    /// [`END_MARGIN_US`](super::worker::END_MARGIN_US) before then it takes no new task, and
    /// before then only tasks whose `--timeout` fits in the time left.
    WorkerEnds {
        /// The worker.
        worker: WorkerId,
        /// When its allocation ends.
        at_us: u64,
    },
    /// A worker can be one of the nodes of multi-node tasks (`--nodes`; it speaks protocol 11
    /// or later), together with workers of the same `group` (those of one allocation, or those
    /// started with one `--group`; `""` for every other worker).
    WorkerNodes {
        /// The worker.
        worker: WorkerId,
        /// Its group.
        group: String,
    },
    /// A message came from a worker: it is alive.
    WorkerSeen {
        /// The worker heard from.
        worker: WorkerId,
    },
    /// A worker is gone (disconnected or silent). Its tasks go back to the queue.
    WorkerLost {
        /// The worker gone.
        worker: WorkerId,
    },
    /// A worker that lost its connection registered again as `worker` and reports the tasks it
    /// still runs and the runs that ended meanwhile; `previous` is its id before, if it was
    /// registered with this scheduler.
    WorkerResumed {
        /// The worker's new id.
        worker: WorkerId,
        /// Its id before, if this scheduler gave it.
        previous: Option<WorkerId>,
        /// Tasks it still runs or holds.
        running: Vec<(JobId, TaskIndex)>,
        /// Runs that ended while it was away.
        finished: Vec<Finished>,
    },
    /// Lift a worker's quarantine: it gets tasks again.
    LiftQuarantine {
        /// The worker to resume.
        worker: WorkerId,
    },
    /// Tasks' processes started on `worker`.
    TasksStarted {
        /// The worker running them.
        worker: WorkerId,
        /// The tasks started, with when.
        started: Vec<Started>,
    },
    /// Runs ended on `worker`, in the order it reported them (one update).
    TasksEnded {
        /// The worker that ran them.
        worker: WorkerId,
        /// The runs that ended.
        ends: Vec<Finished>,
    },
    /// How long the tasks of `job` whose successes a worker reports waited there for a free
    /// slot, summed (one number per job and update).
    SlotWait {
        /// The job whose tasks waited.
        job: JobId,
        /// Their summed wait, in microseconds.
        waited_us: u64,
    },
    /// A worker answers a [`crate::Command::Revoke`]: these tasks still waited there and were
    /// dropped.
    TasksRevoked {
        /// The worker answering.
        worker: WorkerId,
        /// The tasks it dropped.
        tasks: Vec<(JobId, TaskIndex)>,
    },
    /// The driver could not hand a task to its worker at all (its command line alone is bigger
    /// than a message can carry): it fails for good with `failure`.
    Undeliverable {
        /// The worker the task was for.
        worker: WorkerId,
        /// The job of the task.
        job: JobId,
        /// The task's index in its job.
        index: TaskIndex,
        /// Why it could not be sent.
        failure: Failure,
    },
    /// A worker's cache gained or lost files (reported with its task updates, and whole when
    /// it registers: a cache survives a worker's restart). Files are named as in the store;
    /// a name no job reads yet is numbered all the same, for the jobs that will.
    CacheChanged {
        /// The worker.
        worker: WorkerId,
        /// Files now complete in its cache, with their sizes.
        added: Vec<(String, u64)>,
        /// Files it evicted (or found missing or corrupt).
        evicted: Vec<String>,
    },
    /// Where the inputs of `job`'s tasks a worker staged came from, summed since its last
    /// report.
    DataMoved {
        /// The job.
        job: JobId,
        /// The files and bytes by source.
        moved: Transfers,
        /// The same, task by task (adding up to `moved`).
        tasks: Vec<(TaskIndex, Transfers)>,
    },
    /// A client no longer needs these values ([`crate::values`]; other names are ignored):
    /// the workers holding them delete them.
    DropValues {
        /// The values, by name.
        files: Vec<String>,
    },
    /// Time passed: workers silent past the heartbeat timeout are lost, retries whose backoff
    /// has passed are queued.
    Tick,
    /// Hand ready tasks to workers (after a batch of other events).
    Schedule,
}

/// What [`Scheduler::handle`] answers, beyond the commands and records it leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Nothing more to say.
    Done,
    /// The id of the submitted job.
    Submitted(JobId),
    /// The id of the worker that joined.
    Joined(WorkerId),
    /// How many of the job's tasks were still queued and how many running when it was canceled.
    Canceled {
        /// Tasks that had not started (now canceled): queued, or waiting in a worker's
        /// prefetch window (which drops them).
        queued: u32,
        /// Tasks that were running (asked to stop).
        running: u32,
    },
    /// How many failed and how many canceled tasks a retry queued again.
    Retried {
        /// Failed tasks queued again.
        failed: u32,
        /// Canceled tasks queued again.
        canceled: u32,
    },
    /// Whether the worker whose quarantine was lifted had been quarantined.
    Lifted {
        /// Whether it had been quarantined.
        was_quarantined: bool,
    },
    /// What became of a resumed worker's report.
    Resumed(Resumed),
    /// How many of the values a client dropped some worker held.
    Dropped(u32),
    /// How many task reports were taken and how many ignored as stale (the task was re-queued,
    /// ended already, or is held by another worker).
    Reports {
        /// Reports taken.
        recorded: u32,
        /// Reports ignored as stale.
        ignored: u32,
    },
}

impl Scheduler {
    /// Takes one event at time `now_us` (microseconds, the driver's clock). Commands and
    /// records it causes wait in [`Self::take_commands`] and [`Self::take_records`]; take the
    /// records after every event, before the next one changes the state they describe.
    pub fn handle(&mut self, now_us: u64, event: Event) -> Result<Reply, SchedError> {
        Ok(match event {
            Event::Submit {
                spec,
                tasks,
                open,
                key,
            } => Reply::Submitted(self.submit(now_us, *spec, tasks, open, key)?),
            Event::Extend {
                job,
                at,
                more,
                close,
            } => {
                self.extend_with(now_us, job, at, more, close)?;
                Reply::Done
            }
            Event::Cancel { job } => {
                let (queued, running) = self.cancel_job(now_us, job)?;
                Reply::Canceled { queued, running }
            }
            Event::CancelTasks { job, indices } => {
                let (queued, running) = self.cancel_tasks(now_us, job, &indices)?;
                Reply::Canceled { queued, running }
            }
            Event::Retry { job, failed_only } => {
                let (failed, canceled) = self.retry_job(now_us, job, failed_only)?;
                self.rewait_task_deps(now_us, job);
                Reply::Retried { failed, canceled }
            }
            Event::Forget { job } => {
                self.forget_job(job)?;
                Reply::Done
            }
            Event::WorkerJoined { offer } => Reply::Joined(self.worker_joined(now_us, offer)),
            Event::WorkerRejoined {
                offer,
                previous,
                same_start,
            } => Reply::Joined(self.worker_rejoined(now_us, offer, previous, same_start)),
            Event::WorkerDismissed { worker } => {
                if !self.workers.contains_key(&worker) {
                    return Err(SchedError::NoSuchWorker(worker));
                }
                self.drop_worker(now_us, worker, false, &Default::default());
                Reply::Done
            }
            Event::WorkerEnds { worker, at_us } => {
                let w = self
                    .workers
                    .get_mut(&worker)
                    .ok_or(SchedError::NoSuchWorker(worker))?;
                w.ends_at_us = Some(at_us);
                self.ending.insert(worker);
                Reply::Done
            }
            Event::WorkerNodes { worker, group } => {
                let w = self
                    .workers
                    .get_mut(&worker)
                    .ok_or(SchedError::NoSuchWorker(worker))?;
                w.group = Some(group);
                Reply::Done
            }
            Event::WorkerSeen { worker } => {
                self.worker_seen(now_us, worker);
                Reply::Done
            }
            Event::WorkerLost { worker } => {
                self.worker_lost(now_us, worker);
                Reply::Done
            }
            Event::WorkerResumed {
                worker,
                previous,
                running,
                finished,
            } => Reply::Resumed(self.worker_resumed(now_us, worker, previous, running, finished)),
            Event::LiftQuarantine { worker } => Reply::Lifted {
                was_quarantined: self.resume_worker(worker)?,
            },
            Event::TasksStarted { worker, started } => {
                let mut recorded = 0;
                for s in &started {
                    if self.task_started(worker, s.job, s.index, s.at_us)
                        == super::Accepted::Recorded
                    {
                        recorded += 1;
                    }
                }
                Reply::Reports {
                    recorded,
                    ignored: started.len() as u32 - recorded,
                }
            }
            Event::TasksEnded { worker, ends } => {
                let n = ends.len() as u32;
                let ignored = self.tasks_finished(now_us, worker, ends);
                Reply::Reports {
                    recorded: n - ignored,
                    ignored,
                }
            }
            Event::SlotWait { job, waited_us } => {
                self.add_slot_wait(job, waited_us);
                Reply::Done
            }
            Event::TasksRevoked { worker, tasks } => {
                self.tasks_revoked(now_us, worker, tasks);
                Reply::Done
            }
            Event::Undeliverable {
                worker,
                job,
                index,
                failure,
            } => {
                self.task_undeliverable(now_us, worker, job, index, failure);
                Reply::Done
            }
            Event::CacheChanged {
                worker,
                added,
                evicted,
            } => {
                self.cache_changed(now_us, worker, &added, &evicted);
                Reply::Done
            }
            Event::DataMoved { job, moved, tasks } => {
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.transfers.add(&moved);
                    let len = j.len();
                    for (index, t) in tasks.into_iter().filter(|(i, _)| *i < len) {
                        j.task_transfers.entry(index).or_default().add(&t);
                    }
                }
                Reply::Done
            }
            Event::DropValues { files } => Reply::Dropped(self.drop_values(&files)),
            Event::Tick => {
                self.tick(now_us);
                Reply::Done
            }
            Event::Schedule => {
                self.schedule(now_us);
                Reply::Done
            }
        })
    }
}
