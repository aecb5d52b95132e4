//! The messages that cross the wire after the handshake.
//!
//! Encoded as MessagePack with positional fields (compact; both ends agree on the schema through
//! the protocol version checked in the handshake). Every hot message carries a batch.

use crate::wire::{
    line_list, CountsDef, IndexRunDef, JobSpecDef, ResourcesDef, SinkDef, TaskSetDef, TaskStateDef,
};
use kestrel_core::files::Transfers;
/// Task counts by state (core's own type; its wire form is [`crate::wire::CountsDef`]).
pub use kestrel_core::Counts;
/// A task's process started (core's own type, decoded in place through
/// [`crate::wire::StartedDef`]: an update's starts go to the scheduler as they came).
pub use kestrel_core::Started;
use kestrel_core::{
    Finished, IdRanges, IndexRun, JobId, JobSpec, LineList, Resources, SchedError, Sink, TaskId,
    TaskIndex, TaskSet, TaskState, TaskTemplate, WorkerId,
};
use serde::{Deserialize, Serialize};
use std::fmt;

// ----- worker <-> server --------------------------------------------------------------------

/// Task ends as a worker reports them: each `[job, index, started_us, run_us, end]`, the end
/// time an offset from the start, so a short task's end time costs 1 byte instead of 9
/// (a report is a few dozen bytes per task, and workers send one per task), and a success,
/// nearly every end, is nil (1 byte, no string to write and compare on the per-task path).
/// Only the wire form: the journal stores [`Finished`] in full ([`crate::wire::FinishedDef`]).
mod ends_on_wire {
    use crate::wire::{Own, Ref};
    use kestrel_core::{Finished, JobId, RunEnd, TaskIndex};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize)]
    struct Out<'a>(JobId, TaskIndex, u64, i64, Option<Ref<'a, RunEnd>>);

    #[derive(Deserialize)]
    struct In(JobId, TaskIndex, u64, i64, Option<Own<RunEnd>>);

    pub fn serialize<S: Serializer>(ends: &[Finished], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(ends.iter().map(|f| {
            // Two's complement: an end before the start (a clock step) comes back exactly.
            let run_us = f.finished_us.wrapping_sub(f.started_us) as i64;
            let end = (f.end != RunEnd::Success).then_some(Ref(&f.end));
            Out(f.job, f.index, f.started_us, run_us, end)
        }))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Finished>, D::Error> {
        Ok(Vec::<In>::deserialize(d)?
            .into_iter()
            .map(|In(job, index, started_us, run_us, end)| Finished {
                job,
                index,
                started_us,
                // The exact inverse of the encoding, for every pair of times.
                finished_us: started_us.wrapping_add_signed(run_us),
                end: end.map_or(RunEnd::Success, |Own(e)| e),
            })
            .collect())
    }
}

/// Worker to server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromWorker {
    /// First message after the handshake.
    Register(Registration),
    /// Batched task progress: starts and ends since the last update.
    Update {
        #[serde(with = "crate::wire::vec")]
        started: Vec<Started>,
        #[serde(with = "ends_on_wire")]
        finished: Vec<Finished>,
        /// Streamed output of ended tasks, in the order of `finished` (tasks that wrote nothing
        /// to a streamed output have no entry). A worker splits its updates so that this stays
        /// well under a frame.
        #[serde(default)]
        outputs: Vec<TaskOutput>,
        /// Per job, how long the tasks whose successes this update reports waited on the
        /// worker for a free slot, summed: one pair per job, not a number per task (only the
        /// job's sum is kept).
        #[serde(default)]
        waited: Vec<(JobId, u64)>,
        /// What the worker's cache gained and lost since its last update (version 8; left
        /// out when nothing changed).
        #[serde(default, skip_serializing_if = "CacheChange::is_empty")]
        cache: CacheChange,
    },
    /// Nothing to report, still alive.
    Heartbeat,
    /// The answer to a `Revoke`: the tasks asked for that were still waiting for a slot and
    /// are dropped (the others had started).
    Revoked { tasks: Vec<(JobId, TaskIndex)> },
    /// The worker is leaving, and why (version 11; SIGTERM): it takes no new task. Without
    /// `now` it finishes what it runs (what only waits there goes back) and the server tells
    /// it to go once it runs nothing; with `now` it is killing its tasks, which go back to the
    /// queue without counting a crash.
    Leaving { now: bool, reason: String },
}

/// What a worker offers. Encoded by hand (see its `Serialize`): an old server refuses a longer
/// array, so the trailing optional fields go only as far as the last one set.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Registration {
    pub hostname: String,
    pub slots: u32,
    pub gpus: u32,
    /// Extra cpus' worth of tasks to keep queued on the worker ahead of free slots.
    pub prefetch: u32,
    /// `"process"` normally; `"noop"` for the benchmark-only executor.
    pub exec: String,
    /// Set when reconnecting: what the worker still runs and what ended while it was away.
    #[serde(default)]
    pub resume: Option<Resume>,
    /// Memory tasks may hold, in bytes.
    #[serde(default)]
    pub mem: u64,
    /// Named countable resources it has (`licenses=4`).
    #[serde(default)]
    pub named: Vec<(String, u32)>,
    /// Its cache, if it has one (version 8): only a worker with a cache is given tasks of
    /// jobs that declare files.
    #[serde(default)]
    pub cache: Option<CacheInfo>,
    /// The allocation it runs in, as the pilot script that started it says (`--alloc`).
    #[serde(default)]
    pub alloc: Option<u32>,
    /// When that allocation ends, in seconds since the epoch (`--ends-at`): the server starts
    /// no task there that could outlive it.
    #[serde(default)]
    pub ends_at_s: Option<u64>,
    /// The group of workers it may be one node of a multi-node task with (`--group`,
    /// version 11); `None`: those of its allocation, or those of none.
    #[serde(default)]
    pub group: Option<String>,
    /// The Python its runners call function tasks in (version 12); `None`: it takes none.
    #[serde(default)]
    pub python: Option<PythonRunner>,
}

/// The Python a worker calls function tasks in, as its runner said when probed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonRunner {
    /// `major.minor.micro`.
    pub python: String,
    /// cloudpickle's version, empty if it has none.
    pub cloudpickle: String,
    /// The interpreter's path on the worker.
    pub executable: String,
}

impl Serialize for Registration {
    /// `[hostname, slots, gpus, prefetch, exec, resume, mem, named, cache?, alloc?,
    /// ends_at_s?, group?, python?]`: `cache` (version 8), `alloc`, `ends_at_s` (version 10),
    /// `group` (version 11) and `python` (version 12) go up to the last one set, a field
    /// before it as nil, so a worker without them reads as in version 7.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let trailing = if self.python.is_some() {
            5
        } else if self.group.is_some() {
            4
        } else if self.ends_at_s.is_some() {
            3
        } else if self.alloc.is_some() {
            2
        } else if self.cache.is_some() {
            1
        } else {
            0
        };
        let mut st = s.serialize_struct("Registration", 8 + trailing)?;
        st.serialize_field("hostname", &self.hostname)?;
        st.serialize_field("slots", &self.slots)?;
        st.serialize_field("gpus", &self.gpus)?;
        st.serialize_field("prefetch", &self.prefetch)?;
        st.serialize_field("exec", &self.exec)?;
        st.serialize_field("resume", &self.resume)?;
        st.serialize_field("mem", &self.mem)?;
        st.serialize_field("named", &self.named)?;
        if trailing >= 1 {
            st.serialize_field("cache", &self.cache)?;
        }
        if trailing >= 2 {
            st.serialize_field("alloc", &self.alloc)?;
        }
        if trailing >= 3 {
            st.serialize_field("ends_at_s", &self.ends_at_s)?;
        }
        if trailing >= 4 {
            st.serialize_field("group", &self.group)?;
        }
        if trailing >= 5 {
            st.serialize_field("python", &self.python)?;
        }
        st.end()
    }
}

/// A worker's cache as it registers: where peers fetch from it, how big it may grow, and
/// what it already holds (a cache survives a worker's restart).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheInfo {
    /// The URL prefix its cache is served at to peers (`http://host:port/`), or empty if it
    /// serves none.
    pub serves: String,
    /// Bytes it may hold.
    pub capacity: u64,
    /// The logical files it holds, with their sizes.
    pub held: Vec<(String, u64)>,
}

/// What a worker's data did since its last update: what its cache gained and lost, by
/// logical file name, and where its tasks' inputs came from, per job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheChange {
    /// Files now complete in its cache, with their sizes.
    pub added: Vec<(String, u64)>,
    /// Files it evicted, or found missing or corrupt.
    #[serde(default)]
    pub evicted: Vec<String>,
    /// Inputs staged per job, by source.
    #[serde(default)]
    pub moved: Vec<JobTransfers>,
    /// Files a peer was named as holding and sent bytes that fail the check: the server drops
    /// them from its index. (A peer without the file reports its own eviction instead.)
    /// Always written: `capacity` follows it in the array.
    #[serde(default)]
    pub unheld: Vec<Unheld>,
    /// The cache's new capacity, when it shrank (its disk filled up before the capacity the
    /// worker started with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
}

/// A file a peer did not serve whole, and the peer, by the URL it serves its cache at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unheld {
    pub file: String,
    pub peer: String,
}

/// Peers that hold a file, by the URL each serves its cache at: where a worker fetches it
/// from before it falls back to the store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSources {
    /// The file's name as caches know it (`KEY/NAME`, see `kestrel_core::files::cached_name`).
    pub file: String,
    pub peers: Vec<String>,
}

impl CacheChange {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.evicted.is_empty()
            && self.moved.is_empty()
            && self.unheld.is_empty()
            && self.capacity.is_none()
    }
}

/// One job's inputs staged by a worker, by source.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTransfers {
    pub job: JobId,
    #[serde(with = "crate::wire::TransfersDef")]
    pub moved: Transfers,
    /// Why the job's store failed, if reads from it are being retried now (tasks wait).
    #[serde(default)]
    pub store_trouble: String,
    /// The same transfers task by task (they add up to `moved`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskTransfers>,
}

/// One task's inputs staged by a worker, by source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskTransfers {
    pub index: TaskIndex,
    #[serde(with = "crate::wire::TransfersDef")]
    pub moved: Transfers,
}

/// A reconnecting worker's state, so its tasks are taken back rather than run again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    /// The `server_id` of the server it was registered with; a server with another id ignores
    /// the rest (its jobs are not the ones these tasks belong to).
    pub server_id: String,
    /// Its worker id on that server.
    pub previous_worker: WorkerId,
    /// The `epoch` of the start that gave out `previous_worker`.
    pub epoch: u64,
    /// Tasks whose processes still run.
    pub running: Vec<(JobId, TaskIndex)>,
    /// Runs that ended while the connection was down.
    #[serde(with = "ends_on_wire")]
    pub finished: Vec<Finished>,
    /// Their streamed output, as in [`FromWorker::Update`]. Ends whose output would make the
    /// registration too big are left out and their tasks listed in `running` instead; their
    /// ends follow in updates.
    #[serde(default)]
    pub outputs: Vec<TaskOutput>,
}

/// What a task wrote to a streamed stdout or stderr, as its worker kept it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    /// The first bytes written (at most the job's stream limit).
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Bytes written in all; more than `data.len()` when the output was cut.
    pub total: u64,
}

impl Kept {
    /// Whether the task wrote more than was kept.
    pub fn truncated(&self) -> bool {
        self.total > self.data.len() as u64
    }

    /// Bytes on the wire and in memory, for budgets.
    pub fn size(&self) -> usize {
        self.data.len()
    }
}

/// The streamed output of one run of a task, reported with its end, and which of its own
/// output files hold output where that is not the usual.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskOutput {
    pub job: JobId,
    pub index: TaskIndex,
    pub stdout: Option<Kept>,
    pub stderr: Option<Kept>,
    /// How the task's own output files (paths naming both `{job}` and `{task}`, which the
    /// worker removes when the task leaves them empty) differ from the usual, a stdout file
    /// written and an empty stderr file removed: [`STDOUT_EMPTY`], [`STDERR_WRITTEN`]. So a
    /// usual task sends nothing, and `kestrel job cat` can tell a deleted file from an empty
    /// output (version 11; absent when 0, and never sent to an older server).
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub files: u8,
}

/// In [`TaskOutput::files`]: the task left its own stdout file empty, and it was removed.
pub const STDOUT_EMPTY: u8 = 1;
/// In [`TaskOutput::files`]: the task wrote to its own stderr file, which was kept.
pub const STDERR_WRITTEN: u8 = 2;

fn is_zero_u8(n: &u8) -> bool {
    *n == 0
}

impl TaskOutput {
    /// Bytes of output it carries.
    pub fn size(&self) -> usize {
        self.stdout.as_ref().map_or(0, Kept::size) + self.stderr.as_ref().map_or(0, Kept::size)
    }
}

/// Server to worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Reply to `Register`.
    Registered {
        worker: WorkerId,
        heartbeat_ms: u64,
        server: String,
        /// Identifies this server (and its journal); a worker resumes only with the same id.
        server_id: String,
        /// Random per server start: worker ids are only meaningful within one start (they begin
        /// again at 1 after a restart), so a resume names its previous id with this epoch.
        epoch: u64,
    },
    /// How a job's tasks run; sent before the worker's first task of the job.
    DefineJob {
        job: JobId,
        #[serde(with = "crate::wire::boxed")]
        template: Box<TaskTemplate>,
        ids: JobIds,
        #[serde(with = "ResourcesDef")]
        resources: Resources,
        /// Named resources each task holds.
        #[serde(default)]
        named: Vec<(String, u32)>,
        /// The store the job's files are in (version 8; absent for a job without files).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        store: Option<String>,
    },
    /// Tasks to run, in batches of consecutive indices.
    Assign { tasks: Vec<Assigned> },
    /// Kill these tasks if still there and report them canceled.
    Cancel { tasks: Vec<(JobId, TaskIndex)> },
    /// Give back these tasks if they still wait for a slot (another worker is idle): drop them
    /// unstarted and answer with `Revoked`, listing those dropped.
    Revoke { tasks: Vec<(JobId, TaskIndex)> },
    /// The job is over; drop its template.
    ForgetJob { job: JobId },
    /// The server is going away (stop); do not reconnect.
    Shutdown { reason: String },
    /// Where the inputs of the tasks assigned next are cached on peers (version 8; sent just
    /// before the `Assign` it serves, only for files the worker is not known to hold).
    Sources { files: Vec<FileSources> },
    /// Delete these intermediate files from the cache (version 9): the workflow that wrote
    /// them has ended and none is to be kept. Named as in the cache (`KEY/name`).
    DropFiles { files: Vec<String> },
    /// Copy these intermediate files into the cache from the peers named, and keep them
    /// until `DropFiles` (version 9; `--replicas`).
    Replicate { files: Vec<FileSources> },
}

/// How a worker turns a task index into the user-visible task id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobIds {
    /// Array: ids from the ranges.
    Array(#[serde(with = "crate::wire::IdRangesDef")] IdRanges),
    /// List or lines: id = index; each assignment carries the task's argv or line.
    List,
}

/// A run of assigned tasks; for list jobs with one argv per task, for jobs of lines with one
/// line per task (the template's command runs with `{line}` replaced by it). A multi-node
/// task (version 11) comes alone in its run, with the workers it runs on.
///
/// Written `[run, argvs, lines?, nodes?]`: each trailing field goes only as far as the last
/// one used (the array is positional), so an array's assignment is as short as before.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Assigned {
    #[serde(with = "IndexRunDef")]
    pub run: IndexRun,
    pub argvs: Vec<Vec<String>>,
    #[serde(default, with = "line_list")]
    pub lines: LineList,
    /// The workers of a multi-node task, the root (this worker) first (version 11).
    #[serde(default)]
    pub nodes: Vec<Node>,
}

impl Serialize for Assigned {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Run<'a>(&'a IndexRun);
        impl Serialize for Run<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                IndexRunDef::serialize(self.0, s)
            }
        }
        struct Lines<'a>(&'a LineList);
        impl Serialize for Lines<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                line_list::serialize(self.0, s)
            }
        }
        let trailing = if !self.nodes.is_empty() {
            2
        } else if !self.lines.is_empty() {
            1
        } else {
            0
        };
        let mut st = s.serialize_struct("Assigned", 2 + trailing)?;
        st.serialize_field("run", &Run(&self.run))?;
        st.serialize_field("argvs", &self.argvs)?;
        if trailing >= 1 {
            st.serialize_field("lines", &Lines(&self.lines))?;
        }
        if trailing >= 2 {
            st.serialize_field("nodes", &self.nodes)?;
        }
        st.end()
    }
}

/// One worker of a multi-node task: `[worker, host]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Its id.
    pub worker: WorkerId,
    /// Its host name, as it registered.
    pub host: String,
}

impl Assigned {
    /// Tasks of an array job: everything they need is in the job's template.
    pub fn run(run: IndexRun) -> Assigned {
        Assigned {
            run,
            argvs: Vec::new(),
            lines: LineList::new(),
            nodes: Vec::new(),
        }
    }

    /// Whether each task carries its own argv or line (so the run can be split).
    pub fn carries_tasks(&self) -> bool {
        !self.argvs.is_empty() || !self.lines.is_empty()
    }

    /// Splits off the tasks from the `at`th of the run on, keeping the ones before.
    pub fn split_off(&mut self, at: u32) -> Assigned {
        let at = at.min(self.run.count);
        let right = Assigned {
            run: IndexRun {
                job: self.run.job,
                first: self.run.first + at,
                count: self.run.count - at,
            },
            argvs: self.argvs.split_off((at as usize).min(self.argvs.len())),
            lines: self.lines.split_off(at as usize),
            // A multi-node task comes alone: its workers go with it.
            nodes: if at == 0 {
                std::mem::take(&mut self.nodes)
            } else {
                Vec::new()
            },
        };
        self.run.count = at;
        right
    }
}

// ----- client <-> server --------------------------------------------------------------------

/// Client to server: a numbered request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub body: Ask,
}

/// What a client can ask.
// One request at a time per client: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ask {
    /// A new job. With `open`, more list tasks follow through `Extend`.
    Submit {
        #[serde(with = "JobSpecDef")]
        spec: JobSpec,
        #[serde(with = "TaskSetDef")]
        tasks: TaskSet,
        open: bool,
        /// Client-generated idempotency key: a submit repeated with the same key (after a lost
        /// reply or a server restart) answers with the job the first one created.
        #[serde(default)]
        key: Option<String>,
    },
    /// More tasks for an open list job. `at` is the index of the first of `argvs` in the job,
    /// so a piece sent again after a lost connection adds nothing twice.
    Extend {
        job: JobId,
        at: u32,
        argvs: Vec<Vec<String>>,
        close: bool,
    },
    /// More lines for an open job of lines (`--each`), like `Extend`.
    ExtendLines {
        job: JobId,
        at: u32,
        #[serde(with = "line_list")]
        lines: LineList,
        close: bool,
    },
    JobList,
    JobInfo {
        job: JobId,
    },
    /// Tasks of a job, optionally only those in one state; at most `limit` rows.
    TaskList {
        job: JobId,
        #[serde(with = "crate::wire::option")]
        state: Option<TaskState>,
        limit: u32,
    },
    WorkerList,
    Cancel {
        jobs: Vec<JobId>,
    },
    /// Progress messages every `progress_ms`, then the reply when every job is done.
    /// An empty list waits for every job not yet done.
    Wait {
        jobs: Vec<JobId>,
        progress_ms: u64,
    },
    ServerInfo,
    /// Stop the server (workers are told to exit).
    Stop,
    /// Put a job's failed tasks (and unless `failed_only`, its canceled ones) back in the queue
    /// with fresh retry counts.
    Retry {
        job: JobId,
        failed_only: bool,
    },
    /// Lift a worker's quarantine.
    ResumeWorker {
        worker: WorkerId,
    },
    /// The state of each of these jobs, all in one answer (the status poll of workflow
    /// managers: one round trip for any number of jobs).
    JobStates {
        jobs: Vec<JobId>,
    },
    /// The jobs that pass a filter (applied by the server, so only they travel).
    Jobs {
        filter: JobFilter,
    },
    /// Drop ended jobs from the server: their tasks' records are freed and a restarted server
    /// does not bring them back. With `all_ended`, every ended job besides those listed.
    Forget {
        jobs: Vec<JobId>,
        all_ended: bool,
    },
    /// A page of a job's tasks: of the tasks in `state` (every task if `None`), in task order,
    /// those from the `offset`-th on, at most `limit`.
    TaskPage {
        job: JobId,
        #[serde(with = "crate::wire::option")]
        state: Option<TaskState>,
        offset: u32,
        limit: u32,
    },
    /// One task in full, by its user-visible id.
    TaskInfo {
        job: JobId,
        task: TaskId,
    },
    /// The graph of the workflow `job` belongs to (`kestrel job graph`, version 9): its tasks
    /// one by one, or with `by_job` (or past [`MAX_GRAPH_TASKS`] tasks) its jobs.
    JobGraph {
        job: JobId,
        by_job: bool,
    },
    /// A page of the output of a job's tasks (`kestrel job cat`, `kestrel task output`), in
    /// task order: the tasks with the ids in `tasks` (every task if `None`), from position
    /// `from` of that selection, with about `max_bytes` of output at most (at least one task).
    Output {
        job: JobId,
        stderr: bool,
        #[serde(with = "crate::wire::option")]
        tasks: Option<IdRanges>,
        from: u32,
        max_bytes: u32,
    },
    /// Add an allocation queue (version 10).
    AllocAdd(Box<AllocQueueSpec>),
    /// The allocation queues, with their allocations (version 10).
    AllocList,
    /// Stop a queue making allocations (its allocations go on), or let it again.
    AllocPause {
        queue: u32,
        paused: bool,
    },
    /// Remove a queue: refused while it has live allocations, unless `force` (they are
    /// canceled).
    AllocRemove {
        queue: u32,
        force: bool,
    },
    /// The pilot scripts and logs of a queue's allocations (or of one), the last `lines` lines
    /// of each.
    AllocLog {
        queue: u32,
        alloc: Option<u32>,
        lines: u32,
    },
    /// The connected workers and, with `departed`, those that left lately, with when and why
    /// (version 11).
    Workers {
        departed: bool,
    },
    /// One worker in full, connected or left lately (version 11).
    WorkerInfo {
        worker: WorkerId,
    },
    /// Stop workers (those listed, or with `all` every connected one): each takes no new task,
    /// finishes what it runs and exits; with `now`, it kills its tasks at once and they go back
    /// to the queue without spending a retry (version 11).
    WorkerStop {
        workers: Vec<WorkerId>,
        all: bool,
        now: bool,
    },
    /// Watch these jobs (version 13): the server pushes each of their task ends to this
    /// connection ([`ToClient::Ended`]) right after the journal commit that makes it durable,
    /// at once for the tasks already ended. With `submitted`, also every job this connection
    /// submits from now on, watched from its creation (no end is missed between the `Submit`
    /// and a `Watch`). A connection has one watch: a second `Watch` adds to it. Answered with
    /// [`Answer::Watching`].
    Watch {
        jobs: Vec<JobId>,
        submitted: bool,
    },
    /// Where these files are cached (version 14): each with the URLs of the workers that hold
    /// it and serve their caches. A client fetches a value it was told of so. Answered with
    /// [`Answer::Located`], files no worker holds left out.
    Locate {
        files: Vec<String>,
    },
    /// A worker to put a value of `bytes` bytes on (version 14): one that runs Python and
    /// serves a cache that can hold it. Answered with [`Answer::Place`]; the client then
    /// uploads it there (a signed `PUT` to the worker's peer port) and says [`Ask::Placed`].
    Place {
        bytes: u64,
    },
    /// Values the client put on `worker` (version 14), with their sizes: the server names the
    /// worker as their holder from now on, so a job submitted next finds them. Only argument
    /// and scattered values (see `kestrel_core::values`); answered with [`Answer::Placed`].
    Placed {
        worker: WorkerId,
        files: Vec<(String, u64)>,
    },
    /// Values the client no longer needs (version 14): the workers holding them delete them.
    /// Other names are ignored. Answered with [`Answer::ValuesDropped`].
    DropValues {
        files: Vec<String>,
    },
    /// Cancel these tasks of a job, by their ids (version 14): those not ended are canceled,
    /// queued ones at once, running ones by asking their workers. Answered with
    /// [`Answer::Canceled`], one result for the job.
    CancelTasks {
        job: JobId,
        #[serde(with = "crate::wire::IdRangesDef")]
        tasks: IdRanges,
    },
}

/// An allocation queue as `kestrel alloc add` gives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocQueueSpec {
    /// `local`, `slurm` or `pbs`.
    pub backend: String,
    /// A name for `alloc list`.
    pub name: Option<String>,
    /// Nodes per allocation, at most.
    pub nodes: u32,
    /// Task slots a worker offers on a node (its `--slots`).
    pub slots_per_node: u32,
    pub time_limit_ms: u64,
    pub max_allocs: Option<u32>,
    pub max_workers: Option<u32>,
    pub backlog: u32,
    /// `None`: idle workers never leave.
    pub idle_timeout_ms: Option<u64>,
    /// `one`, `additive`, `exponential` or `all`.
    pub acquire: String,
    /// More `kestrel worker start` arguments.
    pub worker_args: Vec<String>,
    /// Arguments of the batch system's submit command (`--partition`, `-q`, ...).
    pub batch_args: Vec<String>,
    /// Check a test allocation with the batch system before taking the queue (Slurm's
    /// `sbatch --test-only`; a held PBS job, then canceled), so that what the batch system
    /// refuses is refused at `alloc add`.
    pub dry_run: bool,
    /// Centralized release: while fewer tasks than this wait (and the queue's free slots take
    /// them), one allocation at a time finishes what it runs and leaves. `None`: off (and not
    /// sent, so that a server or client of before this field reads the spec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_below: Option<u64>,
}

/// A queue as `alloc list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocQueueView {
    pub id: u32,
    pub spec: AllocQueueSpec,
    /// Why it makes no allocations, if it is paused.
    pub paused: Option<String>,
    /// The last failure of its batch system's commands.
    pub last_error: Option<String>,
    pub allocations: Vec<AllocView>,
}

/// One allocation as `alloc list` and `alloc info` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocView {
    pub id: u32,
    /// The batch system's id (a process id for `local`).
    pub batch_id: Option<String>,
    /// submitting, queued, running, draining, canceling, finished, canceled, failed,
    /// not submitted.
    pub state: String,
    /// Why it failed, if it did.
    pub reason: Option<String>,
    pub nodes: u32,
    /// Its workers connected now.
    pub workers: Vec<WorkerId>,
    pub submitted_ms: u64,
    /// How long it waited in the batch queue (so far).
    pub queue_wait_ms: u64,
    pub ended_ms: Option<u64>,
    /// When its nodes were given.
    #[serde(default)]
    pub started_ms: Option<u64>,
    /// CPU-milliseconds its slots were held (slots × time from start to end, or to now) and
    /// spent running tasks; the difference was idle.
    #[serde(default)]
    pub held_cpu_ms: u64,
    #[serde(default)]
    pub busy_cpu_ms: u64,
}

/// The files of one allocation (`kestrel alloc log`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocLogView {
    pub alloc: u32,
    pub batch_id: Option<String>,
    pub state: String,
    /// Its pilot script, the batch job's stdout and stderr, or its local workers' logs.
    pub files: Vec<LogFile>,
}

/// A file the server keeps, and its last lines.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogFile {
    pub path: String,
    /// Bytes in the file; `None` if it does not exist (yet).
    pub size: Option<u64>,
    pub tail: String,
}

/// Server to client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ToClient {
    /// The answer to request `id`.
    Reply {
        id: u64,
        result: Result<Answer, Refusal>,
    },
    /// Progress of a `Wait` request `id`.
    Progress { id: u64, progress: WaitProgress },
    /// Task ends of watched jobs (version 13; see [`Ask::Watch`]), each told once, after the
    /// journal commit that holds it; the ends of one engine pass share a frame (several when
    /// they would not fit one).
    Ended { ends: Vec<TaskEnded> },
    /// The watch of a job ends, and why (version 13): the job was forgotten or withdrawn, or
    /// the journal could not record some of its ends (they would run again after a restart).
    /// None of its ends comes after this.
    Gone { job: JobId, why: String },
}

/// A task of a watched job that ended (finished, failed or canceled), as
/// [`ToClient::Ended`] tells it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEnded {
    pub job: JobId,
    /// Its user-visible id.
    pub id: TaskId,
    /// `Finished`, `Failed` or `Canceled`.
    #[serde(with = "TaskStateDef")]
    pub state: TaskState,
    /// Why it failed or was canceled, as `kestrel task info` says (`None` for a success, and
    /// for a task canceled with its job).
    pub reason: Option<String>,
    /// The host name of the worker it ran on, if the server knows it (`None` for a task that
    /// never ran, or whose worker left long ago).
    pub worker: Option<String>,
    /// Its kept streamed stdout (for a function task, the pickled result or the pickled
    /// exception); `None` if it is not streamed or the task wrote nothing.
    pub stdout: Option<Kept>,
    /// Its kept streamed stderr, only for a task that did not finish (a failed function's
    /// traceback); `None` for a success.
    pub stderr: Option<Kept>,
}

impl TaskEnded {
    /// Bytes of output it carries (for splitting frames).
    pub fn size(&self) -> usize {
        self.stdout.as_ref().map_or(0, Kept::size) + self.stderr.as_ref().map_or(0, Kept::size)
    }
}

/// The answers, one per kind of request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Answer {
    Submitted {
        job: JobId,
        /// Why the job's tasks cannot run on the workers connected now, if so (it is kept:
        /// a bigger worker may still come).
        #[serde(default)]
        warning: Option<String>,
        /// The submission's key had already made this job: nothing new was submitted.
        #[serde(default)]
        repeated: bool,
    },
    Extended,
    Jobs(Vec<JobSummary>),
    Job(Box<JobDetail>),
    Tasks(TaskPage),
    Workers(Vec<WorkerRow>),
    Canceled(Vec<CancelResult>),
    WaitDone(WaitProgress),
    Info(Box<ServerInfo>),
    Stopping,
    /// Tasks resubmitted by `Retry`.
    Retried {
        job: JobId,
        failed: u32,
        canceled: u32,
    },
    /// `ResumeWorker` done; whether it was quarantined.
    WorkerResumed {
        worker: WorkerId,
        was_quarantined: bool,
    },
    Output(OutputPage),
    /// Each job asked about with its state, `None` for a job the server does not have.
    JobStates(Vec<(JobId, Option<JobState>)>),
    /// The jobs a [`JobFilter`] let through.
    JobsPage(JobsPage),
    /// What `Forget` did to each job.
    Forgotten(Vec<ForgetResult>),
    /// The answer to `TaskPage`.
    TaskRange(TaskRange),
    /// The answer to `TaskInfo`.
    Task(Box<TaskDetail>),
    /// The answer to `JobGraph`.
    Graph(Box<WorkflowView>),
    /// The answer to `AllocAdd`.
    AllocAdded {
        queue: u32,
    },
    /// The answer to `AllocList`.
    AllocQueues(Vec<AllocQueueView>),
    /// The answer to `AllocLog`.
    AllocLogs(Vec<AllocLogView>),
    /// The answer to `Workers`.
    WorkerList(WorkerListing),
    /// The answer to `WorkerInfo`.
    WorkerDetail(Box<WorkerDetail>),
    /// The answer to `WorkerStop`: what became of each worker.
    WorkersStopped(Vec<StopResult>),
    /// The answer to `Watch` (version 13): the jobs asked for that the server does not have
    /// (a restarted server without journal, a forgotten job); the others are watched.
    Watching {
        missing: Vec<JobId>,
    },
    /// The answer to `Locate` (version 14): the files some worker holds, with where.
    Located(Vec<FileSources>),
    /// The answer to `Place` (version 14): the worker to upload to, and the URL of its cache.
    Place {
        worker: WorkerId,
        url: String,
    },
    /// The answer to `Placed` (version 14).
    Placed,
    /// The answer to `DropValues` (version 14): how many of the values some worker held.
    ValuesDropped {
        held: u32,
    },
}

/// The workers, as `worker list --all` shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerListing {
    /// The connected workers, in id order.
    pub workers: Vec<WorkerRow>,
    /// Those of them that are stopping (take no new task and leave once they run nothing),
    /// with why.
    pub stopping: Vec<(WorkerId, String)>,
    /// Workers that left, the earliest first (the server keeps the last 1024).
    pub departed: Vec<DepartedWorker>,
}

/// A worker that left: as it was when it left, when, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepartedWorker {
    /// What it offered and ran (`tasks` is 0: what it held went back to the queue).
    pub worker: WorkerRow,
    pub left_us: u64,
    /// "no message for 8 s (heartbeat timeout)", "its connection closed (...)", "stopped by
    /// `kestrel worker stop`, once its tasks were done", ...
    pub reason: String,
}

/// One worker in full (`kestrel worker info`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerDetail {
    pub worker: WorkerRow,
    /// Tasks it holds, running or waiting there for a slot, in job and index order (at most
    /// [`WORKER_TASKS_SHOWN`]; `worker.tasks` counts them all).
    pub tasks: Vec<HeldTask>,
    /// Why it takes no new task and leaves once it runs nothing, if it is stopping.
    pub stopping: Option<String>,
    /// When its allocation ends, if it knows.
    pub ends_at_us: Option<u64>,
    /// When it left and why, for a worker no longer connected.
    pub left: Option<(u64, String)>,
}

/// How many of a worker's tasks `WorkerInfo` lists.
pub const WORKER_TASKS_SHOWN: usize = 100;

/// A task a worker holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldTask {
    pub job: JobId,
    pub task: TaskId,
    #[serde(with = "TaskStateDef")]
    pub state: TaskState,
}

/// What `WorkerStop` did to one worker: the tasks it still ran (to finish, or killed with
/// `now`), or why it was not stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopResult {
    pub worker: WorkerId,
    pub result: Result<u32, Refusal>,
}

/// Tasks past which a workflow's graph is drawn job by job: a drawing of more is unreadable,
/// and its message large.
pub const MAX_GRAPH_TASKS: usize = 5_000;

/// Tasks a page of `task list` (`TaskPage`, `TaskList`) holds at most, whatever limit was
/// asked: a bigger limit is served in pages of this many (fewer if their failures' text would
/// make a page bigger than a few MiB); the answer's `offset` and `matched` say where the next
/// page starts.
pub const MAX_TASK_PAGE: u32 = 10_000;

/// A workflow's graph (`kestrel job graph`): jobs, tasks (unless drawn by job) and edges.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowView {
    pub jobs: Vec<GraphJob>,
    /// Its tasks, in job and task order; empty when drawn by job.
    pub tasks: Vec<GraphTask>,
    /// Edges between tasks, or between jobs when drawn by job.
    pub edges: Vec<GraphEdge>,
}

/// A job of a workflow's graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphJob {
    pub id: JobId,
    pub name: String,
    pub state: JobState,
    #[serde(with = "CountsDef")]
    pub counts: Counts,
}

/// A task of a workflow's graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphTask {
    pub job: JobId,
    pub id: TaskId,
    #[serde(with = "TaskStateDef")]
    pub state: TaskState,
    /// Why it failed or was canceled, if it did.
    pub reason: Option<String>,
}

/// An edge: `from` must finish before `to` runs (or, for `Parent`, `from` submitted `to`).
/// A task is `(job, Some(task id))`, a job `(job, None)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphEdge {
    pub from: (JobId, Option<TaskId>),
    pub to: (JobId, Option<TaskId>),
    pub kind: EdgeKind,
}

/// Why an edge is there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EdgeKind {
    /// Files `to` reads that `from` writes: their names (one, between tasks), or how many
    /// (between jobs).
    Files { names: Vec<String>, count: u32 },
    /// `to`'s job has `after` naming `from`.
    After,
    /// `from` submitted the job `to`.
    Parent,
    /// `to` waits for `from` by its `deps` (version 11; an older client is sent `After`).
    Deps,
}

/// Why the server refused a request: a message for people (what is wrong and what to do) and
/// a kind for programs (the CLI's exit code).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub message: String,
    pub kind: RefusalKind,
}

/// What kind of refusal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefusalKind {
    /// The request cannot be carried out (bad input, a full journal, a job in the wrong state).
    #[default]
    Refused,
    /// The request names a job, task or worker the server does not have.
    NotFound,
}

impl Refusal {
    /// A refusal because something named does not exist.
    pub fn not_found(message: impl Into<String>) -> Refusal {
        Refusal {
            message: message.into(),
            kind: RefusalKind::NotFound,
        }
    }
}

impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal {
            message,
            kind: RefusalKind::Refused,
        }
    }
}

impl From<SchedError> for Refusal {
    fn from(e: SchedError) -> Refusal {
        let kind = match e {
            SchedError::NoSuchJob(_) | SchedError::NoSuchWorker(_) => RefusalKind::NotFound,
            _ => RefusalKind::Refused,
        };
        Refusal {
            message: e.to_string(),
            kind,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

/// Where a job is in its life, as `kestrel job list` and `kestrel job state` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobState {
    /// No task has been handed to a worker yet (they are queued, or wait for the tasks they
    /// depend on).
    Queued,
    /// Some task has been handed out or has ended, and some has not ended.
    Running,
    /// Every task finished successfully.
    Finished,
    /// Every task ended and at least one failed, or was canceled because a task it depended
    /// on failed.
    Failed,
    /// The job was canceled.
    Canceled,
}

impl JobState {
    /// Every state, in the order of a job's life.
    pub const ALL: [JobState; 5] = [
        JobState::Queued,
        JobState::Running,
        JobState::Finished,
        JobState::Failed,
        JobState::Canceled,
    ];

    /// The lowercase name the CLI prints and parses.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Finished => "finished",
            JobState::Failed => "failed",
            JobState::Canceled => "canceled",
        }
    }

    /// Whether the job has ended (nothing of it runs or waits any more).
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            JobState::Finished | JobState::Failed | JobState::Canceled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which jobs `Jobs` returns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFilter {
    /// Only jobs in one of these states (any state if empty).
    pub states: Vec<JobState>,
    /// Only jobs whose name matches this shell-style pattern (`*`, `?`, `[abc]`).
    pub name: Option<String>,
    /// Only the last (newest) this many of the matching jobs; 0 = all. A server answers at
    /// most [`MAX_JOB_PAGE`] at once: the rest comes with `before`.
    pub last: u32,
    /// Only jobs older than this one (ids below it): the next page, after an answer cut at
    /// [`MAX_JOB_PAGE`]. Not sent when `None`, so a server of before this field reads the
    /// filter (and such a server never cuts an answer, so it is never asked for more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<JobId>,
}

/// Jobs a page of `job list` (`Jobs`) holds at most, whatever `last` asked: each job's
/// summary is small, but a server's history can hold millions of them. `more` says what was
/// left out, and the next page is asked with `JobFilter::before`.
pub const MAX_JOB_PAGE: u32 = 1_000;

/// The jobs a filter let through, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobsPage {
    pub jobs: Vec<JobSummary>,
    /// Older jobs that matched but were left out by `last` or by [`MAX_JOB_PAGE`].
    pub more: u64,
}

/// What `Forget` did to one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForgetResult {
    pub job: JobId,
    pub result: Result<(), Refusal>,
}

/// A page of a job's tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRange {
    pub rows: Vec<TaskRow>,
    /// How many matching tasks come before `rows`.
    pub offset: u64,
    /// How many tasks match in all.
    pub matched: u64,
}

/// One task in full (`kestrel task info`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDetail {
    pub job: JobId,
    pub task: TaskRow,
    /// The signal that ended its last failed run, if one did.
    pub signal: Option<i32>,
    /// Its command line as submitted (placeholders not yet replaced).
    pub argv: Vec<String>,
    /// The job's working directory (placeholders not yet replaced); the worker's if `None`.
    pub cwd: Option<String>,
    #[serde(with = "SinkDef")]
    pub stdout: Sink,
    #[serde(with = "SinkDef")]
    pub stderr: Sink,
    /// The host name of the worker it was last assigned to, while that worker is connected.
    pub worker_host: Option<String>,
    /// Its line, for a job of lines (`--each`): the value of `{line}`.
    #[serde(default)]
    pub line: Option<String>,
    /// The workers of a multi-node task (`--nodes`) while it is assigned or running, the one
    /// that runs its command first; empty otherwise (and then left out: an older client reads
    /// the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<u32>,
}

/// A page of task outputs, the answer to [`Ask::Output`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputPage {
    /// Where the job sends this stream (placeholders not substituted).
    #[serde(with = "SinkDef")]
    pub sink: Sink,
    /// One per selected task, in order; none for a job that discards the stream.
    pub rows: Vec<OutputRow>,
    /// The position of the next page in the selection, if there is more.
    pub next: Option<u32>,
}

/// The output of one task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRow {
    pub id: TaskId,
    /// `None` if the job has no task with this id.
    #[serde(with = "crate::wire::option")]
    pub state: Option<TaskState>,
    pub output: RowOutput,
}

/// Where a task's output is, or why there is none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowOutput {
    /// Nothing kept: the task has not ended, wrote nothing, or does not exist.
    Nothing,
    /// Written on its worker to this file (placeholders substituted); the client reads it.
    File(String),
    /// Kept by the server (streamed).
    Kept(Kept),
    /// Streamed but not kept, and why.
    Dropped(String),
    /// Written to this file, which the task is known to have left holding output: if it is
    /// not there, it was deleted (or is on another machine). `File` says as much when the
    /// server does not know (version 11; an older client gets `File`).
    Written(String),
}

/// One line of `kestrel job list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: JobId,
    pub name: String,
    /// "queued", "running", "finished", "failed", "canceled".
    pub state: String,
    #[serde(with = "CountsDef")]
    pub counts: Counts,
    pub submitted_us: u64,
    pub finished_us: Option<u64>,
    /// What its waiting tasks wait for (version 11; absent when nothing waits, and for older
    /// clients): whole jobs `(job, None)` and tasks `(job, Some(task id))`, at most a few.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<(JobId, Option<TaskId>)>,
}

/// `kestrel job info`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobDetail {
    pub summary: JobSummary,
    #[serde(with = "JobSpecDef")]
    pub spec: JobSpec,
    /// "array of 100 tasks, ids 1-100", "1 task (id 0)" or "list of 12 tasks".
    pub tasks: String,
    pub timing: Timing,
    /// An array job's ids as a range expression (`1-100`, `0-98:2`); `None` for a list.
    #[serde(default)]
    pub ids: Option<String>,
    /// Why its queued tasks cannot go to any worker now, if so.
    #[serde(default)]
    pub waiting: Option<String>,
    /// Where its tasks' inputs came from (version 8; absent for a job that staged none).
    #[serde(
        default,
        skip_serializing_if = "Transfers::is_empty",
        with = "crate::wire::TransfersDef"
    )]
    pub transfers: Transfers,
}

/// Means over the successful tasks of a job, from the server's timestamps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub tasks: u64,
    /// Submission to assignment.
    pub mean_queue_us: f64,
    /// Assignment to process start, less the wait for a slot: network, the worker's handling
    /// and the launch's preparation.
    pub mean_dispatch_us: f64,
    /// Process start to exit.
    pub mean_run_us: f64,
    /// First start to last end.
    pub span_us: u64,
    /// Waiting on the worker, sent ahead of a free slot (prefetched), until one freed up.
    #[serde(default)]
    pub mean_waited_us: f64,
}

/// A page of `kestrel task list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPage {
    pub rows: Vec<TaskRow>,
    /// Rows that matched but were left out by the limit.
    pub more: u64,
}

/// One task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRow {
    pub id: u32,
    #[serde(with = "TaskStateDef")]
    pub state: TaskState,
    pub worker: Option<WorkerId>,
    pub assigned_us: u64,
    pub started_us: u64,
    pub finished_us: u64,
    pub failures: u32,
    pub lost: u32,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    pub stderr_tail: Option<String>,
    /// Runs that started (a task that failed once and then succeeded made 2).
    #[serde(default)]
    pub attempts: u32,
    /// Where its inputs came from, over all its runs (version 8; absent for a task that
    /// staged none).
    #[serde(
        default,
        with = "crate::wire::TransfersDef",
        skip_serializing_if = "Transfers::is_empty"
    )]
    pub transfers: Transfers,
}

/// One line of `kestrel worker list`. Encoded by hand (see its `Serialize`): its trailing
/// optional fields go only as far as the last one set.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct WorkerRow {
    pub id: WorkerId,
    pub hostname: String,
    pub address: String,
    pub slots: u32,
    pub gpus: u32,
    pub prefetch: u32,
    pub exec: String,
    /// Tasks assigned and not finished.
    pub tasks: u64,
    pub finished: u64,
    pub failed: u64,
    pub joined_us: u64,
    pub last_seen_us: u64,
    /// Why it gets no new tasks, if quarantined.
    #[serde(default)]
    pub quarantined: Option<String>,
    /// Memory tasks may hold there, in bytes.
    #[serde(default)]
    pub mem: u64,
    /// Named countable resources it offers (`licenses=4`).
    #[serde(default)]
    pub named: Vec<(String, u32)>,
    /// Its file cache: bytes held (as last reported) and capacity (version 8; absent for a
    /// worker without a cache).
    #[serde(default)]
    pub cache: Option<(u64, u64)>,
    /// The allocation it runs in, and that allocation's queue, if an allocation queue of this
    /// server started it (version 10).
    #[serde(default)]
    pub alloc: Option<(u32, u32)>,
}

impl Serialize for WorkerRow {
    /// Its fields in order, `cache` and `alloc` up to the last one set (`cache` then as nil
    /// if need be): skipping `cache` alone, as the derived form did, made a worker of an
    /// allocation without a cache read back with its allocation as its cache.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let trailing = if self.alloc.is_some() {
            2
        } else {
            usize::from(self.cache.is_some())
        };
        let mut st = s.serialize_struct("WorkerRow", 15 + trailing)?;
        st.serialize_field("id", &self.id)?;
        st.serialize_field("hostname", &self.hostname)?;
        st.serialize_field("address", &self.address)?;
        st.serialize_field("slots", &self.slots)?;
        st.serialize_field("gpus", &self.gpus)?;
        st.serialize_field("prefetch", &self.prefetch)?;
        st.serialize_field("exec", &self.exec)?;
        st.serialize_field("tasks", &self.tasks)?;
        st.serialize_field("finished", &self.finished)?;
        st.serialize_field("failed", &self.failed)?;
        st.serialize_field("joined_us", &self.joined_us)?;
        st.serialize_field("last_seen_us", &self.last_seen_us)?;
        st.serialize_field("quarantined", &self.quarantined)?;
        st.serialize_field("mem", &self.mem)?;
        st.serialize_field("named", &self.named)?;
        if trailing >= 1 {
            st.serialize_field("cache", &self.cache)?;
        }
        if trailing >= 2 {
            st.serialize_field("alloc", &self.alloc)?;
        }
        st.end()
    }
}

/// The result of canceling one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelResult {
    pub job: JobId,
    /// Queued tasks canceled at once, running ones asked to stop; or why not.
    pub result: Result<(u32, u32), Refusal>,
}

/// Progress of the jobs a client waits for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitProgress {
    pub jobs: u32,
    pub jobs_done: u32,
    #[serde(with = "CountsDef")]
    pub counts: Counts,
    /// Why some of the jobs' queued tasks cannot go to any worker now, if so.
    #[serde(default)]
    pub waiting: Option<String>,
}

/// `kestrel server info`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub version: String,
    pub protocol: u32,
    pub address: String,
    pub dir: String,
    pub pid: u32,
    pub started_us: u64,
    pub workers: u32,
    pub jobs: u32,
    pub live_jobs: u32,
    pub queued: u64,
    /// The journal, when the server keeps one.
    #[serde(default)]
    pub journal: Option<JournalInfo>,
    /// Copies of intermediate files deleted from caches since the server started, and their
    /// bytes (version 9; absent before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediates_deleted: Option<(u64, u64)>,
    /// Tasks run again since the server started to make intermediate files lost with their
    /// workers (version 9; absent before the first; `intermediates_deleted` is then sent too,
    /// the message being an array).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediates_remade: Option<u64>,
    /// What went through the server's connections since it started (version 14; the two
    /// fields before it are then sent too, the message being an array).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<Traffic>,
    /// Copies of values deleted from caches since the server started, and their bytes
    /// (version 14, sent with `traffic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values_deleted: Option<(u64, u64)>,
}

/// Bytes a server read from and wrote to its clients and its workers, frames whole (their
/// length prefixes included): what went through it, as opposed to worker to worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Traffic {
    pub from_clients: u64,
    pub to_clients: u64,
    pub from_workers: u64,
    pub to_workers: u64,
}

/// Where a server journals its state, and how big the journal is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalInfo {
    pub path: String,
    /// The database file plus its write-ahead log.
    pub bytes: u64,
    /// Entries in the log.
    pub rows: u64,
    /// Why the journal can no longer be written (new submissions are refused), if so.
    pub error: Option<String>,
}
