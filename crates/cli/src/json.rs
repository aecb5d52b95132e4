//! The JSON vocabulary of `--output json`, one for every command (docs/json.md describes it):
//! snake_case keys; lowercase state names (a task waiting for a worker is `queued`, as in job
//! states and counts); every time and duration an integer number of microseconds in a key
//! ending in `_us`, instants counted from the Unix epoch and `null` until they happen; an
//! output sink is `"none"`, a path or `"stream"`. A job, task, worker or server object has the
//! same fields wherever it appears.
//!
//! These views are built from the protocol's answers, so the wire and journal types keep their
//! own (compact, positional) representation.

use kestrel_core::files::Transfers;
use kestrel_core::{Sink, TaskState};
use kestrel_proto::messages::{
    AllocQueueView, AllocView, Counts, DepartedWorker, JobDetail, JobSummary, ServerInfo,
    StopResult, TaskDetail, TaskRow, WaitProgress, WorkerDetail, WorkerRow,
};
use serde::Serialize;
use std::collections::BTreeMap;

/// The name of a task state, for tables and JSON alike: `Ready` is shown as `queued`.
pub fn task_state(s: TaskState) -> &'static str {
    match s {
        TaskState::Ready => "queued",
        other => other.name(),
    }
}

/// A job's outputs as users write them: `local:NAME` or `persist:NAME` when the mode was
/// given or resolved, plain NAME for `auto`.
pub fn output_names(files: &kestrel_core::TaskFiles) -> Vec<String> {
    files
        .outputs
        .iter()
        .enumerate()
        .map(|(i, name)| match files.keep_of(i) {
            kestrel_core::Keep::Auto => name.clone(),
            keep => format!("{}:{name}", keep.name()),
        })
        .collect()
}

/// An output sink: `none`, a path, or `stream`.
pub fn sink(s: &Sink) -> String {
    match s {
        Sink::Null => "none".into(),
        Sink::File(p) => p.clone(),
        Sink::Stream { .. } => "stream".into(),
    }
}

/// A wire time: 0 means "not yet".
fn instant(us: u64) -> Option<u64> {
    (us > 0).then_some(us)
}

/// Milliseconds on the wire, microseconds in JSON.
fn us(ms: u64) -> u64 {
    ms.saturating_mul(1000)
}

/// Task counts by state, with their total.
#[derive(Serialize)]
pub struct CountsView {
    pub queued: u32,
    /// Waiting for the tasks they depend on (the writers of their inputs, `--after`).
    pub waiting: u32,
    pub assigned: u32,
    pub running: u32,
    pub finished: u32,
    pub failed: u32,
    pub canceled: u32,
    pub total: u64,
}

impl From<&Counts> for CountsView {
    fn from(c: &Counts) -> CountsView {
        CountsView {
            queued: c.ready,
            waiting: c.waiting,
            assigned: c.assigned,
            running: c.running,
            finished: c.finished,
            failed: c.failed,
            canceled: c.canceled,
            total: c.total(),
        }
    }
}

/// A job, as `job list` shows it and `job info` starts.
#[derive(Serialize)]
pub struct JobView {
    pub id: u32,
    pub name: String,
    /// queued, running, finished, failed or canceled.
    pub state: String,
    /// How many tasks it has.
    pub tasks: u64,
    pub counts: CountsView,
    pub submitted_us: u64,
    pub finished_us: Option<u64>,
    /// What its waiting tasks wait for, as `--after` names them: `"3"` (all of job 3),
    /// `"3:7"` (task 7 of job 3); at most 8, empty when nothing waits.
    pub waiting_for: Vec<String>,
}

impl From<&JobSummary> for JobView {
    fn from(j: &JobSummary) -> JobView {
        JobView {
            id: j.id,
            name: j.name.clone(),
            state: j.state.clone(),
            tasks: j.counts.total(),
            counts: (&j.counts).into(),
            submitted_us: j.submitted_us,
            finished_us: j.finished_us,
            waiting_for: waits_for(j),
        }
    }
}

/// What a listed job waits for, as `--after` names it: `3`, `3:7`.
pub fn waits_for(j: &JobSummary) -> Vec<String> {
    j.waiting_for
        .iter()
        .map(|&(job, task)| match task {
            None => job.to_string(),
            Some(t) => format!("{job}:{t}"),
        })
        .collect()
}

/// Means over a job's successful tasks.
#[derive(Serialize)]
/// Every figure is `null` until a task has finished successfully.
pub struct TimingView {
    /// How many tasks the means are over.
    pub tasks_timed: u64,
    /// Submission to assignment to a worker.
    pub mean_queue_us: Option<u64>,
    /// Waiting on the worker, sent ahead (prefetched), for a free slot.
    pub mean_slot_wait_us: Option<u64>,
    /// Assignment to process start less the wait for a slot: network, the worker's handling
    /// and the launch's preparation.
    pub mean_dispatch_us: Option<u64>,
    /// Process start to exit.
    pub mean_run_us: Option<u64>,
    /// First start to last end.
    pub span_us: Option<u64>,
}

/// `job info`: the job, how its tasks run, and their timing.
#[derive(Serialize)]
pub struct JobInfoView {
    #[serde(flatten)]
    pub job: JobView,
    /// An array's ids (`1-100`, `0-98:2`); `null` for a list.
    pub ids: Option<String>,
    /// The command of every task of an array (placeholders not replaced); empty for a list.
    pub command: Vec<String>,
    /// The tasks' working directory; `null` for the worker's own.
    pub directory: Option<String>,
    pub env: BTreeMap<String, String>,
    pub stdout: String,
    pub stderr: String,
    /// Whole workers each task takes (`--nodes`); 0 for tasks that share a worker.
    pub nodes: u32,
    pub cpus: u32,
    pub gpus: u32,
    /// Memory each task holds, in bytes (0: none asked for).
    pub mem: u64,
    /// Named countable resources each task holds.
    pub resources: BTreeMap<String, u32>,
    pub priority: i32,
    pub retries: u32,
    pub timeout_us: Option<u64>,
    pub timing: TimingView,
    /// Why its queued tasks cannot go to any worker now (what they wait for); `null` when
    /// they can (or will, as slots free up). For an ended job, why its tasks canceled because
    /// a dependency failed stay so, and what brings them back.
    pub waiting: Option<String>,
    /// The workers running its tasks now, with the allocation each came from.
    pub running_on: Vec<RunningOn>,
    /// Logical files each task reads (names with placeholders).
    pub inputs: Vec<String>,
    /// Logical files each task writes.
    pub outputs: Vec<String>,
    /// Files every task reads, fetched once per worker.
    pub static_inputs: Vec<String>,
    /// The job's own store and policy; `null` takes the server's.
    pub store: Option<String>,
    pub policy: Option<String>,
    /// Where its tasks' inputs came from.
    pub transfers: TransfersView,
}

/// Inputs staged for a job's tasks, by source.
#[derive(Serialize)]
pub struct TransfersView {
    pub local_hits: u64,
    pub local_bytes: u64,
    pub peer_hits: u64,
    pub peer_bytes: u64,
    pub store_reads: u64,
    pub store_bytes: u64,
    /// Inputs found in a cache (own or a peer's) over all staged; `null` before any.
    pub hit_ratio: Option<f64>,
}

impl From<&Transfers> for TransfersView {
    fn from(t: &Transfers) -> TransfersView {
        TransfersView {
            local_hits: t.local_files,
            local_bytes: t.local_bytes,
            peer_hits: t.peer_files,
            peer_bytes: t.peer_bytes,
            store_reads: t.store_files,
            store_bytes: t.store_bytes,
            hit_ratio: t.hit_ratio(),
        }
    }
}

impl From<&JobDetail> for JobInfoView {
    fn from(d: &JobDetail) -> JobInfoView {
        let t = &d.spec.template;
        let timed = |mean: f64| (d.timing.tasks > 0).then_some(mean.round() as u64);
        JobInfoView {
            job: (&d.summary).into(),
            ids: d.ids.clone(),
            command: t.argv.clone(),
            directory: t.cwd.clone(),
            env: t.env.iter().cloned().collect(),
            stdout: sink(&t.stdout),
            stderr: sink(&t.stderr),
            nodes: d.spec.nodes,
            cpus: d.spec.resources.cpus,
            gpus: d.spec.resources.gpus,
            mem: d.spec.resources.mem,
            resources: d.spec.named.iter().cloned().collect(),
            priority: d.spec.priority,
            retries: d.spec.retries,
            timeout_us: t.timeout_ms.map(us),
            timing: TimingView {
                tasks_timed: d.timing.tasks,
                mean_queue_us: timed(d.timing.mean_queue_us),
                mean_slot_wait_us: timed(d.timing.mean_waited_us),
                mean_dispatch_us: timed(d.timing.mean_dispatch_us),
                mean_run_us: timed(d.timing.mean_run_us),
                span_us: (d.timing.tasks > 0).then_some(d.timing.span_us),
            },
            waiting: d.waiting.clone(),
            running_on: Vec::new(),
            inputs: t.files.inputs.clone(),
            outputs: output_names(&t.files),
            static_inputs: t.files.statics.clone(),
            store: d.spec.placement.store.clone(),
            policy: d.spec.placement.policy.map(|p| p.name().to_string()),
            transfers: (&d.transfers).into(),
        }
    }
}

/// A worker running some of a job's tasks (`job info`).
#[derive(Serialize)]
pub struct RunningOn {
    pub worker: u32,
    /// How many of the job's tasks it runs.
    pub tasks: u64,
    /// The allocation it came from, and that allocation's queue; `null` for a worker started
    /// otherwise.
    pub alloc: Option<u32>,
    pub queue: Option<u32>,
}

/// A task, as `task list` shows it and `task info` starts.
#[derive(Serialize)]
pub struct TaskView {
    pub job: u32,
    pub id: u32,
    /// queued, assigned, running, finished, failed or canceled.
    pub state: &'static str,
    /// The worker it was last assigned to.
    pub worker: Option<u32>,
    /// Runs started, as `task list` counts them.
    pub attempts: u32,
    /// Runs that failed (each spends a retry).
    pub failures: u32,
    /// Runs lost with their worker (spend no retry).
    pub lost: u32,
    pub assigned_us: Option<u64>,
    pub started_us: Option<u64>,
    pub finished_us: Option<u64>,
    /// Start to end of its last run.
    pub run_us: Option<u64>,
    /// 0 once it finished; the code of its last failed run otherwise.
    pub exit_code: Option<i32>,
    /// Why its last failed run failed (kept after a successful retry).
    pub reason: Option<String>,
    pub stderr_tail: Option<String>,
    /// Where its inputs came from, over all its runs; `null` for a task that staged none.
    pub transfers: Option<TransfersView>,
}

impl TaskView {
    pub fn new(job: u32, r: &TaskRow) -> TaskView {
        TaskView {
            job,
            id: r.id,
            state: task_state(r.state),
            worker: r.worker,
            attempts: attempts(r),
            failures: r.failures,
            lost: r.lost,
            assigned_us: instant(r.assigned_us),
            started_us: instant(r.started_us),
            finished_us: instant(r.finished_us),
            run_us: run_us(r),
            exit_code: exit_code(r),
            reason: r.reason.clone(),
            stderr_tail: r.stderr_tail.clone(),
            transfers: (!r.transfers.is_empty()).then(|| (&r.transfers).into()),
        }
    }
}

/// How a task ended: 0 once it finished, its exit code once it failed (`None` while it has not
/// ended, even if an earlier run failed, and for a failure without one: a signal, a timeout, a
/// program that could not start).
pub fn exit_code(r: &TaskRow) -> Option<i32> {
    match r.state {
        TaskState::Finished => Some(0),
        TaskState::Failed => r.exit_code,
        // A task running again (retried, or re-queued from a lost worker) has no exit code yet;
        // its earlier run's code would read as this run's.
        _ => None,
    }
}

/// The signal that ended a task: only a failed task has one (a signal that ended an earlier
/// run of a task that runs or waits again is not its end, as with [`exit_code`]).
pub fn end_signal(d: &TaskDetail) -> Option<i32> {
    d.signal.filter(|_| d.task.state == TaskState::Failed)
}

/// How many times a task was started (runs that only waited on a worker do not count).
pub fn attempts(r: &TaskRow) -> u32 {
    r.attempts
}

/// Start to end of a task's last run, once it has ended.
pub fn run_us(r: &TaskRow) -> Option<u64> {
    (r.finished_us > 0 && r.started_us > 0).then(|| r.finished_us.saturating_sub(r.started_us))
}

/// `task info`: the task, its command and where its output went (placeholders replaced).
#[derive(Serialize)]
pub struct TaskInfoView {
    #[serde(flatten)]
    pub task: TaskView,
    pub signal: Option<i32>,
    pub command: Vec<String>,
    pub directory: Option<String>,
    pub stdout: String,
    pub stderr: String,
    /// The host of the worker it was last assigned to, while that worker is connected.
    pub worker_hostname: Option<String>,
    /// The workers of a multi-node task while it holds them, the one running its command
    /// first; empty otherwise.
    pub nodes: Vec<u32>,
}

/// A task's command, directory and output paths as its worker uses them.
pub struct Resolved {
    pub command: Vec<String>,
    pub directory: Option<String>,
    pub stdout: String,
    pub stderr: String,
}

/// Replaces the placeholders of a task's command, directory and output paths as the worker
/// does, and makes relative output paths relative to the directory.
pub fn resolve(d: &TaskDetail) -> Resolved {
    use kestrel_core::placeholders::{substitute, Values};
    let (job, task) = (d.job.to_string(), d.task.id.to_string());
    let values = Values {
        job: &job,
        task: &task,
        line: d.line.as_deref(),
    };
    let sub = |s: &str| substitute(s, &values).into_owned();
    let directory = d.cwd.as_deref().map(sub);
    let path = |s: &Sink| match s {
        Sink::File(p) => {
            let p = sub(p);
            match &directory {
                Some(dir) if std::path::Path::new(&p).is_relative() => {
                    std::path::Path::new(dir).join(p).display().to_string()
                }
                _ => p,
            }
        }
        other => sink(other),
    };
    Resolved {
        command: d.argv.iter().map(|a| sub(a)).collect(),
        stdout: path(&d.stdout),
        stderr: path(&d.stderr),
        directory,
    }
}

impl From<&TaskDetail> for TaskInfoView {
    fn from(d: &TaskDetail) -> TaskInfoView {
        let r = resolve(d);
        TaskInfoView {
            task: TaskView::new(d.job, &d.task),
            signal: end_signal(d),
            command: r.command,
            directory: r.directory,
            stdout: r.stdout,
            stderr: r.stderr,
            worker_hostname: d.worker_host.clone(),
            nodes: d.nodes.clone(),
        }
    }
}

/// A worker, as `worker list` shows it.
#[derive(Serialize)]
pub struct WorkerView {
    pub id: u32,
    pub hostname: String,
    pub address: String,
    pub slots: u32,
    pub gpus: u32,
    /// Memory tasks may hold there, in bytes.
    pub mem: u64,
    /// Named countable resources it offers.
    pub resources: BTreeMap<String, u32>,
    pub prefetch: u32,
    /// process, or noop (benchmarks).
    pub exec: String,
    /// Tasks assigned to it and not ended.
    pub tasks: u64,
    /// Task runs that succeeded on it.
    pub finished: u64,
    /// Task runs that failed on it (a retried task's every failure counts).
    pub failed: u64,
    pub joined_us: u64,
    pub last_seen_us: u64,
    /// active or quarantined; in `worker info`, also stopping or left; in `worker list --all`'s
    /// `departed`, left.
    pub state: &'static str,
    pub quarantine_reason: Option<String>,
    /// Why it takes no new task and leaves once it runs nothing, if it is stopping (`worker
    /// stop`, SIGTERM, a released allocation); `null` otherwise.
    pub stopping_reason: Option<String>,
    /// Bytes its file cache holds (as last reported) and may hold; `null` without a cache.
    pub cache_used: Option<u64>,
    pub cache_capacity: Option<u64>,
    /// The allocation queue and allocation that started it; `null` for a worker started by
    /// hand.
    pub alloc_queue: Option<u32>,
    pub alloc: Option<u32>,
}

impl From<&WorkerRow> for WorkerView {
    fn from(w: &WorkerRow) -> WorkerView {
        WorkerView {
            id: w.id,
            hostname: w.hostname.clone(),
            address: w.address.clone(),
            slots: w.slots,
            gpus: w.gpus,
            mem: w.mem,
            resources: w.named.iter().cloned().collect(),
            prefetch: w.prefetch,
            exec: w.exec.clone(),
            alloc_queue: w.alloc.map(|(q, _)| q),
            alloc: w.alloc.map(|(_, a)| a),
            tasks: w.tasks,
            finished: w.finished,
            failed: w.failed,
            joined_us: w.joined_us,
            last_seen_us: w.last_seen_us,
            state: if w.quarantined.is_some() {
                "quarantined"
            } else {
                "active"
            },
            quarantine_reason: w.quarantined.clone(),
            stopping_reason: None,
            cache_used: w.cache.map(|(u, _)| u),
            cache_capacity: w.cache.map(|(_, c)| c),
        }
    }
}

/// The server, as `server info` shows it.
#[derive(Serialize)]
pub struct ServerView {
    pub version: String,
    pub protocol: u32,
    pub address: String,
    pub directory: String,
    pub pid: u32,
    pub started_us: u64,
    pub workers: u32,
    pub jobs: u32,
    /// Jobs not ended.
    pub live_jobs: u32,
    /// Tasks waiting for a worker.
    pub queued: u64,
    pub journal: Option<JournalView>,
    /// Copies of intermediate (`local`) files deleted from caches when their workflows ended,
    /// and their bytes.
    pub intermediate_files_deleted: u64,
    pub intermediate_bytes_deleted: u64,
    /// Tasks run again to make intermediate files lost with their workers (lineage).
    pub intermediate_tasks_rerun: u64,
    /// Copies of Python values (results and arguments kept in caches) deleted from caches,
    /// and their bytes.
    pub value_files_deleted: u64,
    pub value_bytes_deleted: u64,
    /// Bytes through the server's connections since it started (`null` from a server older
    /// than protocol 14).
    pub traffic: Option<TrafficView>,
}

/// Bytes the server read from and wrote to its clients and workers.
#[derive(Serialize)]
pub struct TrafficView {
    pub from_clients: u64,
    pub to_clients: u64,
    pub from_workers: u64,
    pub to_workers: u64,
}

#[derive(Serialize)]
pub struct JournalView {
    pub path: String,
    pub bytes: u64,
    pub rows: u64,
    /// Why it can no longer be written, if so.
    pub error: Option<String>,
}

impl From<&ServerInfo> for ServerView {
    fn from(i: &ServerInfo) -> ServerView {
        ServerView {
            version: i.version.clone(),
            protocol: i.protocol,
            address: i.address.clone(),
            directory: i.dir.clone(),
            pid: i.pid,
            started_us: i.started_us,
            workers: i.workers,
            jobs: i.jobs,
            live_jobs: i.live_jobs,
            queued: i.queued,
            intermediate_files_deleted: i.intermediates_deleted.map_or(0, |d| d.0),
            intermediate_bytes_deleted: i.intermediates_deleted.map_or(0, |d| d.1),
            intermediate_tasks_rerun: i.intermediates_remade.unwrap_or(0),
            value_files_deleted: i.values_deleted.map_or(0, |d| d.0),
            value_bytes_deleted: i.values_deleted.map_or(0, |d| d.1),
            traffic: i.traffic.map(|t| TrafficView {
                from_clients: t.from_clients,
                to_clients: t.to_clients,
                from_workers: t.from_workers,
                to_workers: t.to_workers,
            }),
            journal: i.journal.as_ref().map(|j| JournalView {
                path: j.path.clone(),
                bytes: j.bytes,
                rows: j.rows,
                error: j.error.clone(),
            }),
        }
    }
}

/// What a wait ended with (`job wait`, and `submit --wait` after the submission's fields).
#[derive(Serialize)]
pub struct WaitView {
    pub jobs_done: u32,
    pub counts: CountsView,
}

impl From<&WaitProgress> for WaitView {
    fn from(p: &WaitProgress) -> WaitView {
        WaitView {
            jobs_done: p.jobs_done,
            counts: (&p.counts).into(),
        }
    }
}

/// What a command that acts on several jobs did to one of them (`job cancel`, `job forget`):
/// `error` is `null` when it was done.
#[derive(Serialize)]
pub struct JobOutcome<T: Serialize> {
    pub id: u32,
    pub error: Option<String>,
    #[serde(flatten)]
    pub done: Option<T>,
}

/// `job list`: the jobs, oldest first, and how many older ones `--last` left out.
#[derive(Serialize)]
pub struct JobListView {
    pub jobs: Vec<JobView>,
    pub more: u64,
}

/// `task list`: a page of a job's tasks.
#[derive(Serialize)]
pub struct TaskListView {
    pub job: u32,
    pub tasks: Vec<TaskView>,
    /// How many matching tasks come before this page.
    pub offset: u64,
    /// How many tasks match in all.
    pub matched: u64,
    /// The `--offset` of the next page; `null` on the last one.
    pub next_offset: Option<u64>,
}

/// `job retry`: how many tasks went back to the queue.
#[derive(Serialize)]
pub struct RetryView {
    pub id: u32,
    pub retried_failed: u32,
    pub retried_canceled: u32,
}

/// `worker resume`.
#[derive(Serialize)]
pub struct ResumeView {
    pub id: u32,
    pub was_quarantined: bool,
}

/// `kestrel run`: what ran where, how it ended, how long it took.
#[derive(Serialize)]
pub struct RunView {
    /// Every job the run's server held: those submitted and those its tasks submitted.
    pub jobs: Vec<u32>,
    pub tasks: u64,
    pub workers: u32,
    pub slots: u32,
    pub counts: CountsView,
    pub wall_us: u64,
    pub tasks_per_s: f64,
    /// Every failed task of every job, as `task list` shows it (the run's server is gone
    /// after it; without `--server-dir` so is everything else about it).
    pub failed: Vec<TaskView>,
    /// The `--server-dir` that keeps the run's record, `null` without one.
    pub record: Option<String>,
}

/// A list of jobs (`{"jobs": [...]}`): `job state`, `job cancel`, `job forget`.
#[derive(Serialize)]
pub struct Jobs<T: Serialize> {
    pub jobs: Vec<T>,
}

/// `worker list`.
#[derive(Serialize)]
pub struct WorkerListView {
    pub workers: Vec<WorkerView>,
    /// With `--all`: the workers that left lately, the earliest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub departed: Option<Vec<DepartedView>>,
}

/// A worker that left, as `worker list --all` shows it: as it was then (`state` is `left`),
/// when it left and why.
#[derive(Serialize)]
pub struct DepartedView {
    #[serde(flatten)]
    pub worker: WorkerView,
    pub left_us: u64,
    /// "no message for 20 s (heartbeat timeout)", "its connection closed (...)", "stopped by
    /// `kestrel worker stop` (...)", ...
    pub reason: String,
}

impl From<&DepartedWorker> for DepartedView {
    fn from(d: &DepartedWorker) -> DepartedView {
        let mut worker = WorkerView::from(&d.worker);
        worker.state = "left";
        DepartedView {
            worker,
            left_us: d.left_us,
            reason: d.reason.clone(),
        }
    }
}

/// `worker info`: one worker in full.
#[derive(Serialize)]
pub struct WorkerInfoView {
    #[serde(flatten)]
    pub worker: WorkerView,
    /// Tasks it holds (running, or waiting there for a slot), at most 100; `tasks` counts them
    /// all.
    pub held: Vec<HeldTaskView>,
    /// When its allocation ends.
    pub ends_at_us: Option<u64>,
    /// When it left and why, for a worker no longer connected.
    pub left_us: Option<u64>,
    pub left_reason: Option<String>,
}

/// A task a worker holds.
#[derive(Serialize)]
pub struct HeldTaskView {
    pub job: u32,
    pub task: u32,
    /// running, or assigned (waiting there for a slot).
    pub state: &'static str,
}

impl From<&WorkerDetail> for WorkerInfoView {
    fn from(d: &WorkerDetail) -> WorkerInfoView {
        let mut worker = WorkerView::from(&d.worker);
        if d.left.is_some() {
            worker.state = "left";
        } else if d.stopping.is_some() {
            worker.state = "stopping";
            worker.stopping_reason = d.stopping.clone();
        }
        WorkerInfoView {
            worker,
            held: d
                .tasks
                .iter()
                .map(|t| HeldTaskView {
                    job: t.job,
                    task: t.task,
                    state: task_state(t.state),
                })
                .collect(),
            ends_at_us: d.ends_at_us,
            left_us: d.left.as_ref().map(|(at, _)| *at),
            left_reason: d.left.as_ref().map(|(_, why)| why.clone()),
        }
    }
}

/// `worker stop`: what became of each worker.
#[derive(Serialize)]
pub struct StopListView {
    pub workers: Vec<StopView>,
}

/// What `worker stop` did to one worker: `error` is `null` when it was done.
#[derive(Serialize)]
pub struct StopView {
    pub id: u32,
    pub error: Option<String>,
    /// The tasks it runs and finishes (those waiting for a slot go back to the queue), or
    /// (with `now`) all it held, killed and back in the queue.
    pub tasks: Option<u32>,
    /// Whether it was stopped at once (`--now`) rather than drained.
    pub now: bool,
}

impl StopView {
    pub fn new(r: &StopResult, now: bool) -> StopView {
        StopView {
            id: r.worker,
            error: r.result.as_ref().err().map(ToString::to_string),
            tasks: r.result.as_ref().ok().copied(),
            now,
        }
    }
}

/// An allocation queue, as `alloc list` (and `pause`, `resume`, `remove`) list them and
/// `alloc info` shows one: its settings, state and allocations. The wire's milliseconds are
/// turned into the vocabulary's microseconds here.
#[derive(Serialize)]
pub struct AllocQueueJson {
    pub id: u32,
    pub name: Option<String>,
    /// local, slurm, pbs or torque.
    pub backend: String,
    /// Why it makes no allocations; `null` while it is active.
    pub paused: Option<String>,
    /// The last failure of its batch system's commands.
    pub last_error: Option<String>,
    /// Nodes per allocation, at most, and the slots a worker offers on each.
    pub nodes: u32,
    pub slots_per_node: u32,
    pub time_limit_us: u64,
    pub max_allocs: Option<u32>,
    pub max_workers: Option<u32>,
    pub backlog: u32,
    /// `null`: idle allocations are kept.
    pub idle_timeout_us: Option<u64>,
    /// one, additive, exponential or all.
    pub acquire: String,
    /// `null`: no centralized release.
    pub release_below: Option<u64>,
    pub worker_args: Vec<String>,
    pub batch_args: Vec<String>,
    pub allocations: Vec<AllocJson>,
}

impl From<&AllocQueueView> for AllocQueueJson {
    fn from(q: &AllocQueueView) -> AllocQueueJson {
        let s = &q.spec;
        AllocQueueJson {
            id: q.id,
            name: s.name.clone(),
            backend: s.backend.clone(),
            paused: q.paused.clone(),
            last_error: q.last_error.clone(),
            nodes: s.nodes,
            slots_per_node: s.slots_per_node,
            time_limit_us: us(s.time_limit_ms),
            max_allocs: s.max_allocs,
            max_workers: s.max_workers,
            backlog: s.backlog,
            idle_timeout_us: s.idle_timeout_ms.map(us),
            acquire: s.acquire.clone(),
            release_below: s.release_below,
            worker_args: s.worker_args.clone(),
            batch_args: s.batch_args.clone(),
            allocations: q.allocations.iter().map(AllocJson::from).collect(),
        }
    }
}

/// One allocation of a queue.
#[derive(Serialize)]
pub struct AllocJson {
    pub id: u32,
    /// The batch system's id (a process id for `local`); `null` before it has one.
    pub batch_id: Option<String>,
    pub state: String,
    /// Why it failed, if it did.
    pub reason: Option<String>,
    pub nodes: u32,
    /// Its workers connected now.
    pub workers: Vec<u32>,
    pub submitted_us: u64,
    /// When its nodes were given, and when it ended.
    pub started_us: Option<u64>,
    pub ended_us: Option<u64>,
    /// How long it waited in the batch queue (so far).
    pub queue_wait_us: u64,
    /// CPU-time its slots were held (slots × its time from start to end, or to now), and
    /// spent running tasks; the difference was idle.
    pub held_cpu_us: u64,
    pub busy_cpu_us: u64,
}

impl From<&AllocView> for AllocJson {
    fn from(a: &AllocView) -> AllocJson {
        AllocJson {
            id: a.id,
            batch_id: a.batch_id.clone(),
            state: a.state.clone(),
            reason: a.reason.clone(),
            nodes: a.nodes,
            workers: a.workers.clone(),
            submitted_us: us(a.submitted_ms),
            started_us: a.started_ms.map(us),
            ended_us: a.ended_ms.map(us),
            queue_wait_us: us(a.queue_wait_ms),
            held_cpu_us: us(a.held_cpu_ms),
            busy_cpu_us: us(a.busy_cpu_ms),
        }
    }
}

/// `alloc list`, and `alloc pause`, `resume` and `remove`, which answer with the queues.
#[derive(Serialize)]
pub struct AllocQueuesJson {
    pub queues: Vec<AllocQueueJson>,
}
