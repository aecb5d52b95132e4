//! What workers report about tasks, and what the scheduler tells its driver to do.

use crate::spec::{JobId, TaskIndex, WorkerId};
use serde::{Deserialize, Serialize};

/// How a run of a task ended, as the worker saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunEnd {
    /// Exit code 0.
    // One-letter names on the wire: a worker reports one ending per task, so "Success" cost
    // 8 of a report's ~31 bytes. The full names are still read (journals written before).
    #[serde(rename = "S", alias = "Success")]
    Success,
    /// Anything else; spends one retry. Boxed so that the common endings keep a [`Finished`]
    /// small (40 bytes instead of 96): workers and the server hold thousands of them per message.
    #[serde(rename = "F", alias = "Failed")]
    Failed(Box<Failure>),
    /// Killed because the server asked (cancel).
    #[serde(rename = "C", alias = "Canceled")]
    Canceled,
}

/// Why a run failed, kept by the server for `kestrel task list --status failed`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// One line: "exit code 3", "killed by signal 9", "timed out after 5s", "program 'x' not found".
    pub reason: String,
    /// The last bytes of the task's stderr, when it went to a file.
    pub stderr_tail: String,
}

/// A worker's report that a task's run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finished {
    pub job: JobId,
    pub index: TaskIndex,
    /// Microseconds since the Unix epoch, on the worker's clock.
    pub started_us: u64,
    pub finished_us: u64,
    pub end: RunEnd,
}

/// A run of consecutive task indices of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexRun {
    pub job: JobId,
    pub first: TaskIndex,
    pub count: u32,
}

/// What the scheduler asks its driver to carry out, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send the job's template to the worker; precedes the worker's first task of that job.
    DefineJob { worker: WorkerId, job: JobId },
    /// Hand these tasks to the worker.
    Assign {
        worker: WorkerId,
        runs: Vec<IndexRun>,
    },
    /// Ask the worker to give back these tasks if they still wait there for a slot (work
    /// stealing); its answer goes to [`crate::Scheduler::tasks_revoked`].
    Revoke {
        worker: WorkerId,
        tasks: Vec<(JobId, TaskIndex)>,
    },
    /// Kill these tasks on the worker if they are still there.
    Cancel {
        worker: WorkerId,
        tasks: Vec<(JobId, TaskIndex)>,
    },
    /// Every task of the job has reached a terminal state.
    JobDone { job: JobId },
    /// The worker is considered lost (missed heartbeats); close its connection.
    Disconnect { worker: WorkerId, reason: String },
    /// The worker's tasks fail too often: it gets no new tasks until resumed.
    Quarantined { worker: WorkerId, reason: String },
}

/// A change of task state the scheduler made on its own (not the direct result of an input),
/// which a durable driver must journal to rebuild the same state after a restart. Taken with
/// [`crate::Scheduler::take_records`] right after the event that caused it, so the journal keeps
/// the order of events (a `job retry` that follows must replay after it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A task was given up without a report from a worker (it was on too many lost workers);
    /// its failure is recorded in the job.
    GaveUp { job: JobId, index: TaskIndex },
    /// These tasks went back to the queue because their worker was lost, each counting one
    /// more crash, so a task that kills its workers is still stopped after `max_crashes`
    /// across server restarts.
    Lost { tasks: Vec<(JobId, TaskIndex)> },
}
