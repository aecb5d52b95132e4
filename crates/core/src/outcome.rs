//! What workers report about tasks, and what the scheduler tells its driver to do.

use crate::spec::{JobId, TaskIndex, WorkerId};

/// How a run of a task ended, as the worker saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// Exit code 0.
    Success,
    /// Anything else; spends one retry. Boxed so that the common endings keep a [`Finished`]
    /// small (40 bytes instead of 96): workers and the server hold thousands of them per message.
    Failed(Box<Failure>),
    /// Killed because the server asked (cancel).
    Canceled,
}

/// Why a run failed, kept by the server for `kestrel task list --state failed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The exit code, if the process exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the process, if one did.
    pub signal: Option<i32>,
    /// One line: "exit code 3", "killed by signal 9", "timed out after 5s", "program 'x' not found".
    pub reason: String,
    /// The last bytes of the task's stderr, when it went to a file.
    pub stderr_tail: String,
    /// Running it again cannot help (an input its store does not have): not retried, and
    /// not counted against the worker.
    pub permanent: bool,
}

impl Failure {
    /// A failure seen by the worker or the scheduler itself rather than reported by the task
    /// (no exit code, signal or stderr): only its `reason`.
    pub fn because(reason: impl Into<String>) -> Failure {
        Failure {
            exit_code: None,
            signal: None,
            reason: reason.into(),
            stderr_tail: String::new(),
            permanent: false,
        }
    }
}

/// A worker's report that a task's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    /// The job of the task.
    pub job: JobId,
    /// The task's index in its job.
    pub index: TaskIndex,
    /// Microseconds since the Unix epoch, on the worker's clock.
    pub started_us: u64,
    /// When the run ended, on the same clock.
    pub finished_us: u64,
    /// How the run ended.
    pub end: RunEnd,
}

impl Finished {
    /// A run that ended the instant it started, at `at_us`: a noop success, a launch that could
    /// not be built, a task canceled before it started.
    pub fn at_once(job: JobId, index: TaskIndex, at_us: u64, end: RunEnd) -> Finished {
        Finished {
            job,
            index,
            started_us: at_us,
            finished_us: at_us,
            end,
        }
    }
}

/// A worker's report that a task's process started, at `at_us` on the worker's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Started {
    /// The job of the task.
    pub job: JobId,
    /// The task's index in its job.
    pub index: TaskIndex,
    /// When the process started, in microseconds since the Unix epoch.
    pub at_us: u64,
}

/// A run of consecutive task indices of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexRun {
    /// The job of the tasks.
    pub job: JobId,
    /// The first index of the run.
    pub first: TaskIndex,
    /// How many consecutive indices it holds.
    pub count: u32,
}

impl IndexRun {
    /// Appends `run` to `runs`, joining the last run when it continues it (same job, next
    /// index), so that consecutive tasks travel as one run.
    pub(crate) fn append(runs: &mut Vec<IndexRun>, run: IndexRun) {
        match runs.last_mut() {
            Some(l) if l.job == run.job && l.first + l.count == run.first => l.count += run.count,
            _ => runs.push(run),
        }
    }
}

/// What the scheduler asks its driver to carry out, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send the job's template to the worker; precedes the worker's first task of that job.
    DefineJob {
        /// The worker to send it to.
        worker: WorkerId,
        /// The job whose template it is.
        job: JobId,
    },
    /// Hand these tasks to the worker.
    Assign {
        /// The worker to send them to.
        worker: WorkerId,
        /// The tasks, as runs of consecutive indices.
        runs: Vec<IndexRun>,
    },
    /// Hand a multi-node task (`--nodes`) to its root worker, the first of `nodes`: it runs
    /// there, told every worker of the set, and the others are held for it, idle, until it
    /// ends. Preceded by [`Command::DefineJob`] like any first task of a job on a worker.
    AssignNodes {
        /// The root worker, which runs the task's process.
        worker: WorkerId,
        /// The job of the task.
        job: JobId,
        /// The task's index in its job.
        index: TaskIndex,
        /// The workers it takes, the root first.
        nodes: Vec<WorkerId>,
    },
    /// Ask the worker to give back these tasks if they still wait there for a slot (work
    /// stealing); its answer comes back as [`crate::Event::TasksRevoked`].
    Revoke {
        /// The worker holding them.
        worker: WorkerId,
        /// The tasks asked back.
        tasks: Vec<(JobId, TaskIndex)>,
    },
    /// Kill these tasks on the worker if they are still there.
    Cancel {
        /// The worker running them.
        worker: WorkerId,
        /// The tasks to kill.
        tasks: Vec<(JobId, TaskIndex)>,
    },
    /// Every task of the job has reached a terminal state.
    JobDone {
        /// The job that ended.
        job: JobId,
    },
    /// The worker may drop the job's template: it was sent one and the job has ended.
    ForgetJob {
        /// The worker that holds the template.
        worker: WorkerId,
        /// The job it may forget.
        job: JobId,
    },
    /// The worker is considered lost (missed heartbeats); close its connection.
    Disconnect {
        /// The worker to disconnect.
        worker: WorkerId,
        /// Why, for its log and the server's.
        reason: String,
    },
    /// Delete these intermediate files from the worker's cache: their workflow has ended and
    /// none of them is to be kept (`local` outputs).
    DropFiles {
        /// The worker whose cache holds them.
        worker: WorkerId,
        /// The files, by their names in the cache.
        files: Vec<String>,
    },
    /// Copy these intermediate files into the worker's cache from the workers that hold them
    /// (`--replicas`), and keep them there like the writer's copy.
    Replicate {
        /// The worker to copy them to.
        worker: WorkerId,
        /// The files, by their names in the cache.
        files: Vec<String>,
    },
    /// The worker's tasks fail too often: it gets no new tasks until resumed.
    Quarantined {
        /// The quarantined worker.
        worker: WorkerId,
        /// Why, for `kestrel worker list`.
        reason: String,
    },
}

/// What a durable driver must journal to rebuild the same state after a restart: every input
/// the scheduler took (a refused one leaves nothing) and every change it made on its own. Taken
/// with [`crate::Scheduler::take_records`] right after the event that caused them, so the journal
/// keeps the order of events (a `job retry` that follows must replay after it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A job was submitted: its spec and tasks are the job's. `key` is the client's
    /// idempotency key, as it came with the submission.
    Submitted {
        /// The job's id.
        job: JobId,
        /// The client's idempotency key.
        key: Option<String>,
    },
    /// An open job took the tasks from index `from` to its end as of this event; `close` says
    /// it was closed by it.
    Extended {
        /// The job extended.
        job: JobId,
        /// The index of its first new task.
        from: u32,
        /// Whether the job was closed by it.
        close: bool,
    },
    /// A job was canceled.
    Canceled {
        /// The job canceled.
        job: JobId,
    },
    /// A job's failed tasks (and its canceled ones unless `failed_only`) were queued again.
    Retried {
        /// The job retried.
        job: JobId,
        /// Whether only its failed tasks were.
        failed_only: bool,
    },
    /// An ended job was dropped.
    Forgotten {
        /// The job dropped.
        job: JobId,
    },
    /// Reported runs ended and were taken, in this order (the ends of one worker's update
    /// that were not ignored).
    Ended {
        /// The ends, in the order they were taken.
        ends: Vec<Finished>,
    },
    /// Tasks of `job` whose successes a worker reported waited there `waited_us` for a slot.
    SlotWait {
        /// The job whose tasks waited.
        job: JobId,
        /// Their summed wait, in microseconds.
        waited_us: u64,
    },
    /// A task was given up without a report from a worker (it was on too many lost workers,
    /// or could not be sent); its failure is recorded in the job.
    GaveUp {
        /// The job of the task.
        job: JobId,
        /// The task's index in its job.
        index: TaskIndex,
    },
    /// These tasks went back to the queue because their worker was lost, each counting one
    /// more crash, so a task that kills its workers is still stopped after `max_crashes`
    /// across server restarts.
    Lost {
        /// The tasks, as (job, index).
        tasks: Vec<(JobId, TaskIndex)>,
    },
}
