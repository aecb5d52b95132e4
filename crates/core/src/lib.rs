//! Kestrel's scheduler core: a pure state machine.
//!
//! One input type goes in: an [`Event`] (a submission, a worker joining, a worker's update,
//! time passing, ...), taken by [`Scheduler::handle`]. Two kinds of output come out: commands
//! for workers and clients ([`Scheduler::take_commands`]) and records for the journal
//! ([`Scheduler::take_records`]). There are no sockets, threads or clocks here: the server and
//! the simulator are two drivers of the same code, and [`harness::Harness`] drives it in
//! virtual time for tests.

pub mod harness;
mod id_merge;
pub mod ledger;
mod lines;
pub mod outcome;
pub mod placeholders;
pub mod quarantine;
pub mod queue;
mod sched;
pub mod spec;
pub mod table;

pub use outcome::{Command, Failure, Finished, IndexRun, Record, RunEnd, Started};
pub use sched::restore::RestoreError;
pub use sched::{
    Accepted, Config, Counts, Event, Job, Reply, Resumed, SchedError, Scheduler, Stall, Timing,
    Worker, WorkerOffer,
};
pub use spec::{
    IdRanges, IdRun, JobId, JobSpec, LineList, RangeError, Resources, Sink, SpecError, TaskId,
    TaskIndex, TaskSet, TaskState, TaskTemplate, WorkerId, MAX_NAMED,
};
