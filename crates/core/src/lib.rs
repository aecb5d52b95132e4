//! Kestrel's scheduler core: a pure state machine.
//!
//! Events go in ([`Scheduler::submit`], [`Scheduler::worker_joined`], [`Scheduler::task_finished`]
//! or a worker's update at once with [`Scheduler::tasks_finished`], [`Scheduler::tick`], ...),
//! commands come out ([`Scheduler::take_commands`]). There are no sockets, threads or clocks
//! here: the server and the simulator are two drivers of the same code, and
//! [`harness::Harness`] drives it in virtual time for tests.

pub mod harness;
mod id_merge;
pub mod ledger;
mod lines;
pub mod outcome;
pub mod placeholders;
pub mod quarantine;
pub mod queue;
pub mod scheduler;
pub mod spec;
pub mod table;

pub use outcome::{Command, Failure, Finished, IndexRun, Record, RunEnd};
pub use scheduler::restore::RestoreError;
pub use scheduler::{
    Accepted, Config, Counts, Job, Resumed, SchedError, Scheduler, Stall, Timing, Worker,
    WorkerOffer,
};
pub use spec::{
    IdRanges, IdRun, JobId, JobSpec, LineList, RangeError, Resources, Sink, SpecError, TaskId,
    TaskIndex, TaskSet, TaskState, TaskTemplate, WorkerId, MAX_NAMED,
};
