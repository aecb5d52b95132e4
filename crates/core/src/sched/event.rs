//! The scheduler's one input: an [`Event`], taken by [`Scheduler::handle`], which answers with a
//! [`Reply`] and leaves [`crate::Command`]s for the driver to carry out and [`crate::Record`]s
//! for it to journal.
//!
//! One type for every input lets a driver log, replay or generate inputs as values: the
//! simulator and the property tests feed sequences of events, the server feeds what arrives
//! on its sockets, and both see the same outputs.

use super::{Resumed, SchedError, Scheduler, WorkerOffer};
use crate::outcome::{Failure, Finished, Started};
use crate::spec::{JobId, JobSpec, TaskIndex, TaskSet, WorkerId};

/// Something that happened which the scheduler takes into account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A client submits a job. With `open`, more tasks may follow ([`Event::Extend`]). `key`,
    /// the client's idempotency key, is only passed on to the journal
    /// ([`crate::Record::Submitted`]). The spec is boxed to keep the other events small.
    Submit {
        spec: Box<JobSpec>,
        tasks: TaskSet,
        open: bool,
        key: Option<String>,
    },
    /// Tasks for an open job. `at` is the index the first of `more` takes in the job, and
    /// `more` is of the job's kind (argvs for a list of commands, lines for a job of lines);
    /// `close` says no more will come. A client that lost its connection sends the same pieces
    /// again: tasks the job already holds are skipped and a repeated close is accepted, so a
    /// retried submission never adds a task twice.
    Extend {
        job: JobId,
        at: u32,
        more: TaskSet,
        close: bool,
    },
    /// Cancel every task of a job that has not ended: queued ones at once, running ones by
    /// asking their workers.
    Cancel { job: JobId },
    /// Queue a job's failed tasks again (and its canceled ones unless `failed_only`), with
    /// fresh retry and crash counts.
    Retry { job: JobId, failed_only: bool },
    /// Drop a job that has ended, with its task records. Its id is not given out again.
    Forget { job: JobId },
    /// A worker connects, offering what it has.
    WorkerJoined { offer: WorkerOffer },
    /// A message came from a worker: it is alive.
    WorkerSeen { worker: WorkerId },
    /// A worker is gone (disconnected or silent). Its tasks go back to the queue.
    WorkerLost { worker: WorkerId },
    /// A worker that lost its connection registered again as `worker` and reports the tasks it
    /// still runs and the runs that ended meanwhile; `previous` is its id before, if it was
    /// registered with this scheduler.
    WorkerResumed {
        worker: WorkerId,
        previous: Option<WorkerId>,
        running: Vec<(JobId, TaskIndex)>,
        finished: Vec<Finished>,
    },
    /// Lift a worker's quarantine: it gets tasks again.
    LiftQuarantine { worker: WorkerId },
    /// Tasks' processes started on `worker`.
    TasksStarted {
        worker: WorkerId,
        started: Vec<Started>,
    },
    /// Runs ended on `worker`, in the order it reported them (one update).
    TasksEnded {
        worker: WorkerId,
        ends: Vec<Finished>,
    },
    /// How long the tasks of `job` whose successes a worker reports waited there for a free
    /// slot, summed (one number per job and update).
    SlotWait { job: JobId, waited_us: u64 },
    /// A worker answers a [`crate::Command::Revoke`]: these tasks still waited there and were
    /// dropped.
    TasksRevoked {
        worker: WorkerId,
        tasks: Vec<(JobId, TaskIndex)>,
    },
    /// The driver could not hand a task to its worker at all (its command line alone is bigger
    /// than a message can carry): it fails for good with `failure`.
    Undeliverable {
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        failure: Failure,
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
    Canceled { queued: u32, running: u32 },
    /// How many failed and how many canceled tasks a retry queued again.
    Retried { failed: u32, canceled: u32 },
    /// Whether the worker whose quarantine was lifted had been quarantined.
    Lifted { was_quarantined: bool },
    /// What became of a resumed worker's report.
    Resumed(Resumed),
    /// How many task reports were taken and how many ignored as stale (the task was re-queued,
    /// ended already, or is held by another worker).
    Reports { recorded: u32, ignored: u32 },
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
            Event::Retry { job, failed_only } => {
                let (failed, canceled) = self.retry_job(job, failed_only)?;
                Reply::Retried { failed, canceled }
            }
            Event::Forget { job } => {
                self.forget_job(job)?;
                Reply::Done
            }
            Event::WorkerJoined { offer } => Reply::Joined(self.worker_joined(now_us, offer)),
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
