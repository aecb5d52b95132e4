#![warn(missing_docs)]
//! Kestrel's scheduler core: a pure state machine.
//!
//! One input type goes in: an [`Event`] (a submission, a worker joining, a worker's update,
//! time passing, ...), taken by [`Scheduler::handle`]. Two kinds of output come out: commands
//! for workers and clients ([`Scheduler::take_commands`]) and records for the journal
//! ([`Scheduler::take_records`]). There are no sockets, threads or clocks here: the server and
//! the simulator are two drivers of the same code, and [`harness::Harness`] drives it in
//! virtual time for tests.

pub mod files;
pub mod harness;
mod id_merge;
mod ledger;
mod lines;
mod outcome;
pub mod placeholders;
pub mod policy;
mod quarantine;
mod queue;
mod sched;
mod spec;
mod table;
pub mod values;
pub mod window;

pub use outcome::{Command, Failure, Finished, IndexRun, Record, RunEnd, Started};
pub use policy::{DispatchPolicy, FirstAvailable, Offer};
pub use sched::restore::RestoreError;
pub use sched::{
    Accepted, Config, Counts, Departed, Event, Job, Reply, Resumed, SchedError, Scheduler, Stall,
    Timing, Worker, WorkerOffer, WorkflowGraph, DROP_GRACE_US, END_MARGIN_US, MAX_DEPARTED,
};
pub use spec::{
    After, FunctionSpec, IdRanges, IdRun, JobId, JobSpec, Keep, LineList, Placement, PolicyName,
    PythonEnv, RangeError, Resources, Sink, SpecError, TaskDeps, TaskFiles, TaskId, TaskIndex,
    TaskKind, TaskRef, TaskSet, TaskState, TaskTemplate, WorkerId, DEFAULT_INLINE_LIMIT,
    DEFAULT_STREAM_LIMIT, MAX_NAMED, MAX_NODES, MAX_REPLICAS, MAX_STREAM_LIMIT, MAX_TASK_FILES,
};
