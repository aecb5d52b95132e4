//! The scheduler: jobs, workers, the ready queue and every task transition.
//!
//! A driver (the server, the simulator, a test) calls the event methods with the current time,
//! then [`Scheduler::schedule`], then drains [`Scheduler::take_commands`] and carries them out.
//! Nothing here blocks, allocates per queued task, or reads a clock.

use crate::ledger::Ledger;
use crate::outcome::{Command, Failure, Finished, IndexRun, Record, RunEnd};
use crate::quarantine::{self, JobOutcomes, Outcomes, Tally};
use crate::queue::{ReadyQueue, Span};
use crate::spec::{
    JobId, JobSpec, Resources, SpecError, TaskIndex, TaskSet, TaskState, WorkerId, MAX_NAMED,
};
use crate::table::{TaskRecord, TaskTable};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Tunables of the scheduler.
#[derive(Clone, Debug)]
pub struct Config {
    /// A worker silent for longer than this is lost.
    pub heartbeat_timeout_us: u64,
    /// How many queue entries that fit no worker one assignment pass may look past.
    pub max_queue_skips: usize,
    /// Wait before a failed task runs again; doubles with each failure of that task.
    pub retry_backoff_us: u64,
    /// The longest wait before a retry.
    pub retry_backoff_max_us: u64,
    /// A task that was on this many lost workers is failed: it probably kills its worker.
    pub max_crashes: u8,
    /// A worker gets no new tasks when at least this many of its recent tasks of a job failed,
    /// most of its runs of that job failed, and the other workers ran as many of the job's
    /// tasks failing at most a third as often (see [`crate::quarantine`]); 0 turns quarantine
    /// off.
    pub quarantine_failures: u32,
    /// How fast the counts behind quarantine fade: they are halved every window.
    pub quarantine_window_us: u64,
    /// Tasks queued on a worker beyond its free slots should cover about this much run time
    /// per slot: a job whose tasks take longer gets a shallower prefetch, down to none (a
    /// long task waiting behind another on a busy worker while another worker idles doubles
    /// the makespan).
    pub prefetch_horizon_us: u64,
    /// A worker with free slots and nothing to take from the queue takes back tasks waiting
    /// in another worker's prefetch window, for jobs whose tasks run at least this long (or
    /// whose run time is not known yet); shorter ones will start sooner than a round trip.
    pub steal_min_run_us: u64,
    /// The id of the first job submitted (later ones count up from it).
    pub first_job: JobId,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_timeout_us: 30_000_000,
            max_queue_skips: 64,
            retry_backoff_us: 500_000,
            retry_backoff_max_us: 60_000_000,
            max_crashes: 5,
            quarantine_failures: 10,
            quarantine_window_us: 60_000_000,
            prefetch_horizon_us: 100_000,
            steal_min_run_us: 50_000,
            first_job: 1,
        }
    }
}

/// What a worker offers when it joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerOffer {
    pub hostname: String,
    /// Slots (cpus) and gpus it runs tasks on.
    pub resources: Resources,
    /// Extra cpus' worth of tasks it accepts ahead of free slots, so no slot waits a round trip.
    pub prefetch: u32,
    /// Named countable resources it has (`kestrel worker start --resource licenses=4`).
    pub named: Vec<(String, u32)>,
}

/// Per-state task counts of a job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub ready: u32,
    pub assigned: u32,
    pub running: u32,
    pub finished: u32,
    pub failed: u32,
    pub canceled: u32,
}

impl Counts {
    fn slot(&mut self, state: TaskState) -> &mut u32 {
        match state {
            TaskState::Ready => &mut self.ready,
            TaskState::Assigned => &mut self.assigned,
            TaskState::Running => &mut self.running,
            TaskState::Finished => &mut self.finished,
            TaskState::Failed => &mut self.failed,
            TaskState::Canceled => &mut self.canceled,
        }
    }

    fn moved(&mut self, from: TaskState, to: TaskState) {
        *self.slot(from) -= 1;
        *self.slot(to) += 1;
    }

    /// Tasks that reached a terminal state.
    pub fn done(&self) -> u32 {
        self.finished + self.failed + self.canceled
    }

    pub fn total(&self) -> u32 {
        self.done() + self.ready + self.assigned + self.running
    }
}

/// A job as the scheduler holds it.
#[derive(Debug)]
pub struct Job {
    pub id: JobId,
    pub spec: JobSpec,
    /// What each task holds: the spec's resources with its named ones numbered.
    pub need: Resources,
    pub tasks: TaskSet,
    pub submitted_us: u64,
    /// Set when the last task reached a terminal state (and the job is closed).
    pub finished_us: Option<u64>,
    /// More tasks may still be appended.
    pub open: bool,
    pub canceled: bool,
    pub counts: Counts,
    /// Run time of its tasks, a moving average over ended runs (`None` before the first):
    /// prefetch depth and work stealing follow it.
    pub mean_run_us: Option<u64>,
    /// Time its successful tasks waited on their workers for a free slot, summed.
    pub waited_us: u64,
    /// How its recent runs ended, on all workers (what quarantine compares a worker with).
    outcomes: JobOutcomes,
    table: TaskTable,
    failures: FxHashMap<TaskIndex, Failure>,
}

impl Job {
    /// A job as submitted: every task ready.
    fn new(
        id: JobId,
        spec: JobSpec,
        need: Resources,
        tasks: TaskSet,
        submitted_us: u64,
        open: bool,
    ) -> Job {
        let n = tasks.len();
        Job {
            id,
            need,
            table: TaskTable::new(n),
            counts: Counts {
                ready: n,
                ..Default::default()
            },
            spec,
            tasks,
            submitted_us,
            finished_us: None,
            open,
            canceled: false,
            mean_run_us: None,
            waited_us: 0,
            outcomes: JobOutcomes::default(),
            failures: FxHashMap::default(),
        }
    }

    pub fn len(&self) -> u32 {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Whether every task is terminal and no more can come.
    pub fn is_done(&self) -> bool {
        !self.open && self.counts.done() == self.len()
    }

    /// The record of a task (untouched tasks of a canceled job read as canceled).
    pub fn record(&self, index: TaskIndex) -> TaskRecord {
        let mut r = self.table.get(index);
        if self.canceled && r.state == TaskState::Ready {
            r.state = TaskState::Canceled;
        }
        r
    }

    /// The last failure of a task that ran and failed.
    pub fn failure(&self, index: TaskIndex) -> Option<&Failure> {
        self.failures.get(&index)
    }

    /// The user-visible id of a task.
    pub fn task_id(&self, index: TaskIndex) -> u32 {
        match &self.tasks {
            TaskSet::Array(r) => r.id_at(index).unwrap_or(index),
            TaskSet::List(_) | TaskSet::Lines(_) => index,
        }
    }

    /// The index of the task with a user-visible id.
    pub fn index_of(&self, id: u32) -> Option<TaskIndex> {
        match &self.tasks {
            TaskSet::Array(r) => r.index_of(id),
            TaskSet::List(_) | TaskSet::Lines(_) => (id < self.tasks.len()).then_some(id),
        }
    }

    /// The argv of one task of a list job (`None` for arrays: the template's argv applies).
    pub fn task_argv(&self, index: TaskIndex) -> Option<&[String]> {
        self.tasks.argv(index)
    }

    /// Timing statistics over the tasks that finished successfully.
    pub fn timing(&self) -> Timing {
        let mut t = Timing {
            waited_us: self.waited_us,
            ..Timing::default()
        };
        let mut assigned_to_start = 0u64;
        for (_, r) in self.table.touched() {
            if r.state != TaskState::Finished || r.assigned_us == 0 {
                continue;
            }
            t.tasks += 1;
            t.queue_us += r.assigned_us.saturating_sub(self.submitted_us);
            assigned_to_start += r.started_us.saturating_sub(r.assigned_us);
            t.run_us += r.finished_us.saturating_sub(r.started_us);
            t.first_start_us = Some(
                t.first_start_us
                    .map_or(r.started_us, |s| s.min(r.started_us)),
            );
            t.last_finish_us = t.last_finish_us.max(r.finished_us);
        }
        // What is left of assignment-to-start once the wait for a slot is taken out.
        t.dispatch_us = assigned_to_start.saturating_sub(t.waited_us);
        t
    }

    /// Counts an ended run's length into the job's moving average.
    fn note_run_time(&mut self, run_us: u64) {
        self.mean_run_us = Some(match self.mean_run_us {
            None => run_us,
            // An eighth of the way to each new sample: steady, yet a change shows in a few runs.
            Some(m) => (m as i64 + (run_us as i64 - m as i64) / 8) as u64,
        });
    }

    /// How many cpus' worth of this job's tasks `w` may hold beyond its slots: its prefetch,
    /// made shallower as the job's tasks get longer (see [`Config::prefetch_horizon_us`]).
    fn prefetch_for(&self, w: &Worker, horizon_us: u64) -> u32 {
        match self.mean_run_us {
            None => w.offer.prefetch,
            Some(m) => {
                let covered = u64::from(w.offer.resources.cpus) * horizon_us / m.max(1);
                w.offer
                    .prefetch
                    .min(covered.min(u64::from(u32::MAX)) as u32)
            }
        }
    }

    /// Whether a waiting task of this job is worth taking back from a busy worker.
    fn worth_stealing(&self, min_run_us: u64) -> bool {
        !self.canceled && self.mean_run_us.is_none_or(|m| m >= min_run_us)
    }

    /// Records of touched tasks, in index order (untouched tasks are ready or canceled).
    pub fn touched(&self) -> impl Iterator<Item = (TaskIndex, TaskRecord)> + '_ {
        self.table.touched().map(|(i, r)| (i, *r))
    }

    /// Whether the task is assigned or running on `worker`.
    fn held_by(&self, index: TaskIndex, worker: WorkerId) -> bool {
        index < self.len() && {
            let r = self.table.get(index);
            r.worker == worker && matches!(r.state, TaskState::Assigned | TaskState::Running)
        }
    }

    fn set_state(&mut self, index: TaskIndex, to: TaskState) -> &mut TaskRecord {
        let rec = self.table.get_mut(index);
        self.counts.moved(rec.state, to);
        rec.state = to;
        rec
    }
}

/// Sums of the per-task intervals of a job's successful tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    pub tasks: u64,
    /// Submission to assignment.
    pub queue_us: u64,
    /// Assignment to process start, less the wait for a free slot on the worker: network,
    /// the worker's handling and the preparation of the launch.
    pub dispatch_us: u64,
    /// Waiting on the worker, assigned ahead (prefetched), for a free slot.
    pub waited_us: u64,
    /// Process start to exit.
    pub run_us: u64,
    pub first_start_us: Option<u64>,
    pub last_finish_us: u64,
}

/// A worker as the scheduler holds it.
#[derive(Debug)]
pub struct Worker {
    pub id: WorkerId,
    pub offer: WorkerOffer,
    pub joined_us: u64,
    pub last_seen_us: u64,
    /// Resources held by tasks assigned to it and not yet finished (prefetched ones included).
    pub used: Resources,
    /// Cpus held by those of its tasks known to be running (the rest wait for a slot there,
    /// or are on their way).
    running_cpus: u32,
    /// How many tasks it holds: assigned to it and not yet finished.
    held: u32,
    /// Where to find the tasks it holds (see [`holds`]).
    ledger: Ledger,
    /// Jobs whose template it has been sent.
    known_jobs: FxHashSet<JobId>,
    pub tasks_finished: u64,
    pub tasks_failed: u64,
    /// Why it gets no new tasks, if quarantined (see [`Scheduler::resume_worker`]).
    pub quarantined: Option<String>,
    /// How its recent tasks ended, per job (what quarantine judges).
    tally: Tally,
    /// Waiting tasks it was asked to give back (at most one request at a time), and their cpus.
    revoking: Vec<(JobId, TaskIndex)>,
    revoking_cpus: u32,
    /// Tasks it reported running when it resumed that were already assigned to another worker:
    /// the first successful result of either run is kept.
    duplicates: FxHashSet<(JobId, TaskIndex)>,
}

impl Worker {
    /// How much it takes at most, with `prefetch` cpus' worth held beyond its slots. Beyond
    /// cpus, a prefetch window holds one more of everything it has (GPUs, memory, named
    /// resources): tasks wait there for what frees up.
    fn capacity(&self, prefetch: u32) -> Resources {
        let r = self.offer.resources;
        if prefetch == 0 {
            return r;
        }
        let mut cap = Resources::NONE.plus(&r, 2);
        cap.cpus = r.cpus + prefetch;
        cap
    }

    /// Takes a task (resumed or moved over from a previous registration) with what it holds;
    /// the caller makes the task's record name this worker and says whether it is running.
    fn hold(&mut self, job: JobId, index: TaskIndex, need: Resources, running: bool) {
        self.ledger.push(job, index);
        self.held += 1;
        self.used = self.used.plus(&need, 1);
        if running {
            self.running_cpus += need.cpus;
        }
        self.known_jobs.insert(job);
    }

    /// Gives back what a task it holds held; the caller has checked with [`Job::held_by`]
    /// that it holds the task, passes the task's state, and then moves the task's record on.
    /// Returns whether its ledger is now due for [`Scheduler::prune_ledger`].
    #[must_use]
    fn release(&mut self, need: Resources, state: TaskState) -> bool {
        self.held -= 1;
        self.used = self.used.less_held(&need);
        if state == TaskState::Running {
            self.running_cpus = self.running_cpus.saturating_sub(need.cpus);
        }
        self.ledger.needs_pruning(self.held)
    }

    /// Cpus free for tasks that would start at once (no task of its own waits for them).
    fn idle_cpus(&self) -> u32 {
        self.offer.resources.cpus.saturating_sub(self.used.cpus)
    }

    /// Cpus' worth of tasks it holds beyond its slots: tasks waiting there for a slot.
    fn waiting_cpus(&self) -> u32 {
        self.used.cpus.saturating_sub(self.offer.resources.cpus)
    }

    /// How many tasks needing `need` still fit, holding `prefetch` cpus' worth beyond its slots.
    fn room_for(&self, need: Resources, prefetch: u32) -> u32 {
        self.capacity(prefetch).minus(&self.used).times_fits(&need)
    }

    /// Whether a task needing `need` could ever run here.
    fn can_ever_run(&self, need: Resources) -> bool {
        need.fits_in(&self.offer.resources)
    }

    /// Tasks assigned to it and not finished.
    pub fn outstanding(&self) -> usize {
        self.held as usize
    }
}

/// Answers of a per-job question, asked once per job however many ledger runs name it (a
/// handful of live jobs: a short list beats a map).
#[derive(Default)]
struct JobMemo(Vec<(JobId, bool)>);

impl JobMemo {
    fn memo(&mut self, job: JobId, ask: impl FnOnce() -> bool) -> bool {
        if let Some(&(_, answer)) = self.0.iter().find(|(j, _)| *j == job) {
            return answer;
        }
        let answer = ask();
        self.0.push((job, answer));
        answer
    }
}

/// The test of whether `worker` holds a task (see [`Job::held_by`]; the records are the
/// truth, a worker's [`Ledger`] says where to look). A ledger lists runs of one job at a
/// time, so the job is looked up once per run, not once per task.
fn holder(
    jobs: &BTreeMap<JobId, Job>,
    worker: WorkerId,
) -> impl FnMut(JobId, TaskIndex) -> bool + '_ {
    let mut last: Option<(JobId, Option<&Job>)> = None;
    move |job, index| {
        let j = match last {
            Some((id, j)) if id == job => j,
            _ => last.insert((job, jobs.get(&job))).1,
        };
        j.is_some_and(|j| j.held_by(index, worker))
    }
}

/// Why an event was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchedError {
    #[error("job {0} does not exist; `kestrel job list` shows the jobs")]
    NoSuchJob(JobId),
    #[error("job {0} is closed; no tasks can be added")]
    JobClosed(JobId),
    #[error("job {0} is an array; only list jobs take more tasks")]
    NotAList(JobId),
    #[error("job {job} holds {len} tasks, so more can start at index {len}, not {at}")]
    ExtendGap { job: JobId, len: u32, at: u32 },
    #[error("job {job} is {holds}; it cannot take {given}")]
    ExtendKind {
        job: JobId,
        holds: &'static str,
        given: &'static str,
    },
    #[error("worker {0} is not connected; `kestrel worker list` shows the workers")]
    NoSuchWorker(WorkerId),
    #[error("job {0} was canceled; `kestrel job retry {0} --all` runs its failed and canceled tasks again")]
    RetryCanceled(JobId),
    #[error("resource '{name}' would be the server's {max}th name of a resource, past the most it tells apart ({known}); use one of those names", max = MAX_NAMED + 1)]
    TooManyNames { name: String, known: String },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("job {job} has not ended ({left} of its tasks not done yet); wait for it (`kestrel job wait {job}`) or cancel it (`kestrel job cancel {job}`) first")]
    NotEnded { job: JobId, left: u32 },
}

/// Why a job's queued tasks cannot go to any worker (see [`Scheduler::stall`]): the answer to
/// "why does my job not move?" that `job info` and `job wait` print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stall {
    /// No worker is connected.
    NoWorkers,
    /// Every worker is too small for one task: `what` says what it lacks and what to do, e.g.
    /// "3 cpus, the largest worker has 2 cpus; start a bigger worker or cancel the job".
    TooBig { what: String },
    /// Every worker that could run the tasks is quarantined.
    Quarantined { workers: Vec<WorkerId> },
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural =
            |n: u32, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        match self {
            Stall::NoWorkers => {
                f.write_str("no worker is connected; start one with `kestrel worker start`")
            }
            Stall::TooBig { what } => write!(f, "each task needs {what}"),
            Stall::Quarantined { workers } => {
                let ids: Vec<String> = workers.iter().map(u32::to_string).collect();
                let n = workers.len() as u32;
                write!(
                    f,
                    "no worker can take these tasks: {} quarantined ({}); `kestrel worker resume ID` lifts it",
                    plural(n, "worker", "workers"),
                    ids.join(", ")
                )
            }
        }
    }
}

/// What a worker event did, for the driver's logs and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    Recorded,
    /// The report was stale (the task was re-queued or finished elsewhere) and was ignored.
    Ignored,
}

/// How deep one pass of [`Scheduler::schedule`] fills workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Depth {
    /// Only free slots: tasks that start at once.
    Slots,
    /// Slots and the prefetch window.
    Prefetch,
}

/// How a resumed worker's task relates to the server's view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claim {
    /// The task is now assigned to the worker.
    Taken,
    /// Another worker has it too.
    Duplicate,
    /// The task already ended, or does not exist.
    Ended,
}

/// The scheduler state machine.
#[derive(Debug, Default)]
pub struct Scheduler {
    config: Config,
    jobs: BTreeMap<JobId, Job>,
    workers: BTreeMap<WorkerId, Worker>,
    ready: ReadyQueue,
    commands: Vec<Command>,
    /// State changes the driver must journal (see [`Record`]).
    records: Vec<Record>,
    next_job: JobId,
    next_worker: WorkerId,
    /// Jobs with tasks not yet terminal (for quick "is anything left" answers).
    live_jobs: FxHashSet<JobId>,
    /// Worker to start the next assignment pass from, so no worker is always served last.
    rotate: WorkerId,
    /// Failed tasks waiting out their retry backoff: (due time, job, index).
    delayed: BTreeSet<(u64, JobId, TaskIndex)>,
    /// The due time of each delayed task, to find it in `delayed`.
    delayed_at: FxHashMap<(JobId, TaskIndex), u64>,
    /// Why each worker that left while quarantined was quarantined: a worker that comes back
    /// naming its old id (after a lost connection) stays quarantined.
    quarantined_gone: FxHashMap<WorkerId, String>,
    /// Names of named resources, numbered by position (see [`Resources::named`]).
    names: Vec<String>,
}

/// What [`Scheduler::worker_resumed`] did with a reconnected worker's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resumed {
    /// Running tasks taken back by the worker instead of being run again.
    pub taken: u32,
    /// Running tasks already assigned to another worker: both runs go on, the first success
    /// is kept.
    pub duplicates: u32,
    /// Results recorded.
    pub recorded: u32,
    /// The results recorded, for the driver's journal.
    pub recorded_ends: Vec<Finished>,
    /// Results and running tasks ignored (task already ended, unknown job or task).
    pub ignored: u32,
}

impl Scheduler {
    pub fn new(config: Config) -> Scheduler {
        Scheduler {
            next_job: config.first_job.max(1),
            config,
            next_worker: 1,
            ..Default::default()
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What each task of a job with `spec` holds, its named resources numbered.
    fn need_of(&mut self, spec: &JobSpec) -> Result<Resources, SchedError> {
        let mut need = spec.resources;
        need.named = self.number(&spec.named)?;
        Ok(need)
    }

    /// The amounts of `named` by this scheduler's numbering of names; a new name takes the
    /// next number, up to [`MAX_NAMED`] names in all.
    fn number(&mut self, named: &[(String, u32)]) -> Result<[u32; MAX_NAMED], SchedError> {
        let mut out = [0u32; MAX_NAMED];
        for (name, amount) in named {
            let i = match self.names.iter().position(|n| n == name) {
                Some(i) => i,
                None if self.names.len() < MAX_NAMED => {
                    self.names.push(name.clone());
                    self.names.len() - 1
                }
                None => {
                    return Err(SchedError::TooManyNames {
                        name: name.clone(),
                        known: self.names.join(", "),
                    })
                }
            };
            out[i] = out[i].saturating_add(*amount);
        }
        Ok(out)
    }

    /// The name numbered `i` (see [`Resources::named`]).
    pub fn resource_name(&self, i: usize) -> Option<&str> {
        self.names.get(i).map(String::as_str)
    }

    // ----- events ---------------------------------------------------------------------------

    /// A client submits a job. With `open`, more tasks may follow through [`Self::extend`].
    pub fn submit(
        &mut self,
        now_us: u64,
        spec: JobSpec,
        tasks: TaskSet,
        open: bool,
    ) -> Result<JobId, SchedError> {
        if open && matches!(&tasks, TaskSet::List(_) | TaskSet::Lines(_)) && tasks.is_empty() {
            spec.validate_spec()?;
        } else {
            spec.validate(&tasks)?;
        }
        let need = self.need_of(&spec)?;
        let id = self.next_job;
        self.next_job += 1;
        let job = Job::new(id, spec, need, tasks, now_us, open);
        let n = job.len();
        self.ready.push_new(
            job.spec.priority,
            Span {
                job: id,
                next: 0,
                end: n,
            },
        );
        self.jobs.insert(id, job);
        self.live_jobs.insert(id);
        Ok(id)
    }

    /// Appends tasks to an open list job; `close` says no more will come.
    ///
    /// `at` is the index the first of `argvs` takes in the job. A client that lost its connection
    /// sends the same pieces again; tasks the job already holds are skipped and a repeated close
    /// is accepted, so a retried submission never adds a task twice.
    pub fn extend(
        &mut self,
        now_us: u64,
        job: JobId,
        at: u32,
        argvs: Vec<Vec<String>>,
        close: bool,
    ) -> Result<(), SchedError> {
        self.extend_with(now_us, job, at, TaskSet::List(argvs), close)
    }

    /// [`Self::extend`] for any kind of open job: `more` is of the job's kind (argvs for a
    /// list of commands, lines for a job of lines).
    pub fn extend_with(
        &mut self,
        now_us: u64,
        job: JobId,
        at: u32,
        more: TaskSet,
        close: bool,
    ) -> Result<(), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        if let TaskSet::Array(_) = j.tasks {
            return Err(SchedError::NotAList(job));
        }
        if std::mem::discriminant(&j.tasks) != std::mem::discriminant(&more) {
            return Err(SchedError::ExtendKind {
                job,
                holds: j.tasks.kind(),
                given: more.kind(),
            });
        }
        let len = j.tasks.len();
        if at > len {
            return Err(SchedError::ExtendGap { job, len, at });
        }
        let already = ((len - at) as usize).min(more.len() as usize);
        if !j.open {
            // A repeat of pieces the job took before it closed changes nothing.
            return if already == more.len() as usize {
                Ok(())
            } else {
                Err(SchedError::JobClosed(job))
            };
        }
        let start = len;
        if let Some(i) = more.first_empty(already) {
            return Err(SpecError::EmptyTask(start + (i - already) as u32).into());
        }
        j.tasks.append(more, already);
        let end = j.tasks.len();
        j.table.extend_to(end);
        if j.canceled {
            j.counts.canceled += end - start;
        } else {
            j.counts.ready += end - start;
            self.ready.push_new(
                j.spec.priority,
                Span {
                    job,
                    next: start,
                    end,
                },
            );
        }
        if close {
            j.open = false;
            if j.is_empty() && !j.canceled {
                // A list job closed without tasks is a client mistake, but it must still end.
                j.canceled = true;
            }
        }
        self.check_job_done(now_us, job);
        Ok(())
    }

    /// A worker connects. Returns its id.
    pub fn worker_joined(&mut self, now_us: u64, mut offer: WorkerOffer) -> WorkerId {
        // A name past the most the server tells apart cannot be asked for by any job either.
        let named: Vec<_> = offer
            .named
            .iter()
            .filter(|(n, _)| self.names.contains(n) || self.names.len() < MAX_NAMED)
            .cloned()
            .collect();
        offer.resources.named = self.number(&named).unwrap_or([0; MAX_NAMED]);
        let id = self.next_worker;
        self.next_worker += 1;
        self.workers.insert(
            id,
            Worker {
                id,
                offer,
                joined_us: now_us,
                last_seen_us: now_us,
                used: Resources::NONE,
                running_cpus: 0,
                held: 0,
                ledger: Ledger::default(),
                known_jobs: FxHashSet::default(),
                tasks_finished: 0,
                tasks_failed: 0,
                quarantined: None,
                tally: Tally::default(),
                revoking: Vec::new(),
                revoking_cpus: 0,
                duplicates: FxHashSet::default(),
            },
        );
        id
    }

    /// Any message from a worker shows it is alive.
    pub fn worker_seen(&mut self, now_us: u64, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.last_seen_us = w.last_seen_us.max(now_us);
        }
    }

    /// A worker is gone (disconnected or silent). Its tasks go back to the queue, ahead of new
    /// work, without spending their retries. Each that ran there counts one crash (and one
    /// attempt), and a task that was on [`Config::max_crashes`] lost workers fails (it
    /// probably kills its worker); tasks that only waited there for a slot count nothing.
    pub fn worker_lost(&mut self, now_us: u64, worker: WorkerId) {
        self.drop_worker(now_us, worker, true, &FxHashSet::default());
    }

    /// Removes a worker and re-queues its tasks, except those in `keep` (taken over by its
    /// reconnection); `crashed` says whether the re-queued tasks count a crash.
    fn drop_worker(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        crashed: bool,
        keep: &FxHashSet<(JobId, TaskIndex)>,
    ) {
        let Some(w) = self.workers.remove(&worker) else {
            return;
        };
        if let Some(reason) = w.quarantined {
            self.quarantined_gone.insert(worker, reason);
        }
        let tasks = {
            let mut holds = holder(&self.jobs, worker);
            w.ledger
                .held(|job, index| !keep.contains(&(job, index)) && holds(job, index))
        };
        let max_crashes = self.config.max_crashes.max(1);
        // Slots not known to be busy: assigned tasks may have started there unreported (the
        // worker starts them in the order they came, which the index order approximates).
        let mut unreported = w.offer.resources.cpus.saturating_sub(w.running_cpus);
        let mut counted = Vec::new();
        for (job, index) in tasks {
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            if j.canceled {
                j.set_state(index, TaskState::Canceled);
                self.check_job_done(now_us, job);
                continue;
            }
            let need = j.need.cpus;
            let ran = match j.table.get(index).state {
                TaskState::Running => true,
                _ if need <= unreported => {
                    unreported -= need;
                    true
                }
                _ => false,
            };
            let was_running = j.table.get(index).state == TaskState::Running;
            let rec = j.set_state(index, TaskState::Ready);
            let crashed = crashed && ran;
            if crashed {
                rec.lost = rec.lost.saturating_add(1);
                if !was_running {
                    // Its start was never reported, but it probably ran (the crash counts it).
                    rec.runs = rec.runs.saturating_add(1);
                }
            }
            if rec.lost >= max_crashes {
                let failure = Failure {
                    exit_code: None,
                    signal: None,
                    reason: format!("lost with {} workers (it may kill its worker)", rec.lost),
                    stderr_tail: String::new(),
                };
                self.give_up(now_us, job, index, failure);
                continue;
            }
            if crashed {
                counted.push((job, index));
            }
            self.ready
                .push_requeued(j.spec.priority, Span::one(job, index));
        }
        if !counted.is_empty() {
            self.records.push(Record::Lost { tasks: counted });
        }
    }

    /// A worker that lost its connection registered again (new id `worker`) and reports the
    /// tasks it still runs and the results it got while disconnected. `previous` is its id
    /// before, if it was registered with this scheduler (its connection may not have been
    /// noticed dead yet): that registration is dropped without counting crashes.
    ///
    /// - A result of a task not yet ended is recorded, once: a task that already ended ignores
    ///   it. A result of a task now assigned to another worker is recorded too if it is a
    ///   success (the other run is canceled); a failure there is ignored (the other run decides).
    /// - A running task that is ready again (re-queued after the loss) or was assigned to
    ///   `previous` is taken back by `worker` instead of being run again.
    /// - A running task already assigned to another worker keeps both runs; the first
    ///   success to arrive is kept, the other report is ignored.
    pub fn worker_resumed(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        previous: Option<WorkerId>,
        running: Vec<(JobId, TaskIndex)>,
        finished: Vec<Finished>,
    ) -> Resumed {
        let mut out = Resumed::default();
        if !self.workers.contains_key(&worker) {
            out.ignored = (running.len() + finished.len()) as u32;
            return out;
        }
        let named = previous.filter(|p| *p != worker);
        let previous = named.filter(|p| self.workers.contains_key(p));
        if let Some(p) = previous {
            // Tasks it still runs or has results for move over; the rest go back to the queue.
            let keep: FxHashSet<_> = running
                .iter()
                .copied()
                .chain(finished.iter().map(|f| (f.job, f.index)))
                .collect();
            let moved = {
                let mut holds = holder(&self.jobs, p);
                self.workers[&p]
                    .ledger
                    .held(|job, index| keep.contains(&(job, index)) && holds(job, index))
            };
            self.drop_worker(now_us, p, false, &keep);
            for (job, index) in moved {
                // Reassign to the new id so its report matches; state stays as it was.
                let Some(j) = self.jobs.get_mut(&job) else {
                    continue;
                };
                let need = j.need;
                let rec = j.table.get_mut(index);
                rec.worker = worker;
                let running = rec.state == TaskState::Running;
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.hold(job, index, need, running);
                }
            }
        }
        // A quarantine outlives the connection (the previous registration was dropped above
        // or when its loss was noticed).
        if let Some(reason) = named.and_then(|p| self.quarantined_gone.remove(&p)) {
            if let Some(w) = self.workers.get_mut(&worker) {
                w.quarantined = Some(reason.clone());
            }
            self.commands.push(Command::Quarantined { worker, reason });
        }
        let mut stale = Vec::new();
        for (job, index) in running {
            match self.claim(now_us, worker, job, index, true) {
                Claim::Taken => out.taken += 1,
                Claim::Duplicate => out.duplicates += 1,
                Claim::Ended => {
                    // Its result is no longer wanted: stop the run and free the slot.
                    out.ignored += 1;
                    stale.push((job, index));
                }
            }
        }
        if !stale.is_empty() {
            self.commands.push(Command::Cancel {
                worker,
                tasks: stale,
            });
        }
        for f in finished {
            if self.claim(now_us, worker, f.job, f.index, false) == Claim::Ended {
                out.ignored += 1;
                continue;
            }
            let kept = f.clone();
            match self.task_finished(now_us, worker, f) {
                Accepted::Recorded => {
                    out.recorded += 1;
                    out.recorded_ends.push(kept);
                }
                Accepted::Ignored => out.ignored += 1,
            }
        }
        out
    }

    /// Makes a task a resumed worker runs (or ran) its own if it is ready again; notes it as a
    /// duplicate run if another worker has it.
    fn claim(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        running: bool,
    ) -> Claim {
        let Some(j) = self.jobs.get_mut(&job) else {
            return Claim::Ended;
        };
        if index >= j.len() {
            return Claim::Ended;
        }
        let rec = j.table.get(index);
        let shown = j.record(index).state;
        if shown.is_terminal() {
            return Claim::Ended;
        }
        if rec.state != TaskState::Ready {
            if rec.worker == worker {
                // Moved over from its previous registration.
                if running && rec.state == TaskState::Assigned {
                    let cpus = j.need.cpus;
                    let rec = j.set_state(index, TaskState::Running);
                    rec.runs = rec.runs.saturating_add(1);
                    if let Some(w) = self.workers.get_mut(&worker) {
                        w.running_cpus += cpus;
                    }
                }
                return Claim::Taken;
            }
            let Some(w) = self.workers.get_mut(&worker) else {
                return Claim::Ended;
            };
            w.duplicates.insert((job, index));
            return Claim::Duplicate;
        }
        // Ready: re-queued after the loss. Its queue entry is skipped when reached.
        if let Some(due) = self.delayed_at.remove(&(job, index)) {
            self.delayed.remove(&(due, job, index));
        }
        let Some(w) = self.workers.get_mut(&worker) else {
            return Claim::Ended;
        };
        let need = j.need;
        let rec = j.set_state(index, TaskState::Running);
        rec.worker = worker;
        rec.assigned_us = now_us;
        rec.started_us = now_us;
        rec.finished_us = 0;
        w.hold(job, index, need, true);
        Claim::Taken
    }

    /// A worker reports that a task's process started.
    pub fn task_started(
        &mut self,
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        at_us: u64,
    ) -> Accepted {
        let Some(j) = self.jobs.get_mut(&job) else {
            return Accepted::Ignored;
        };
        if index >= j.len() {
            return Accepted::Ignored;
        }
        let rec = j.table.get(index);
        if rec.worker != worker || rec.state != TaskState::Assigned {
            return Accepted::Ignored;
        }
        let cpus = j.need.cpus;
        let rec = j.set_state(index, TaskState::Running);
        rec.started_us = at_us;
        rec.runs = rec.runs.saturating_add(1);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.running_cpus += cpus;
        }
        Accepted::Recorded
    }

    /// A worker reports that a task's run ended. Reports that do not match the task's current
    /// assignment (late, duplicate, or from a worker it was taken from) are ignored, so each
    /// completion is recorded once. The exception is a success of a duplicate run noted by
    /// [`Self::worker_resumed`]: the first success wins and the other run is canceled.
    pub fn task_finished(&mut self, now_us: u64, worker: WorkerId, f: Finished) -> Accepted {
        self.finish_one(now_us, worker, &f)
    }

    /// The ends of one worker's update, in order, as [`Self::task_finished`] takes each; calls
    /// `recorded` with every end it took and the job after it. Returns how many were ignored.
    ///
    /// The common end, a success of a task the worker holds, is applied with the job and the
    /// worker looked up once per run of ends of one job, and the job's end checked once per
    /// run: on the per-task path of a noop array these lookups were a third of its cost.
    pub fn tasks_finished(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        ends: Vec<Finished>,
        mut recorded: impl FnMut(Finished, &Job),
    ) -> u32 {
        let mut ignored = 0;
        let mut ends = ends.into_iter().peekable();
        while let Some(first) = ends.next() {
            let job = first.job;
            let (Some(j), Some(w)) = (self.jobs.get_mut(&job), self.workers.get_mut(&worker))
            else {
                // An unknown job or worker: a late report, ignored as `finish_one` would.
                ignored += 1;
                continue;
            };
            let mut prune = false;
            // The first end the fast path does not take, which goes the whole way.
            let mut slow = None;
            let mut f = first;
            loop {
                match Self::success_of_holder(j, w, &self.config, now_us, &f) {
                    Some(due) => {
                        prune |= due;
                        recorded(f, j);
                    }
                    None => {
                        slow = Some(f);
                        break;
                    }
                }
                match ends.next_if(|n| n.job == job) {
                    Some(n) => f = n,
                    None => break,
                }
            }
            if prune {
                self.prune_ledger(worker);
            }
            self.check_job_done(now_us, job);
            if let Some(f) = slow {
                match self.finish_one(now_us, worker, &f) {
                    Accepted::Recorded => {
                        if let Some(j) = self.jobs.get(&f.job) {
                            recorded(f, j);
                        }
                    }
                    Accepted::Ignored => ignored += 1,
                }
            }
        }
        ignored
    }

    /// Records a success of a task `w` holds, with its job and worker at hand; `None` (and
    /// nothing changed) for any other end. Says whether `w`'s ledger is due for pruning.
    fn success_of_holder(
        j: &mut Job,
        w: &mut Worker,
        config: &Config,
        now_us: u64,
        f: &Finished,
    ) -> Option<bool> {
        if f.end != RunEnd::Success || f.index >= j.len() {
            return None;
        }
        let TaskRecord { worker, state, .. } = j.table.get(f.index);
        if worker != w.id || !matches!(state, TaskState::Assigned | TaskState::Running) {
            return None;
        }
        let prune = w.release(j.need, state);
        Self::note_success(
            j,
            w,
            config,
            now_us,
            f,
            u8::from(state == TaskState::Assigned),
        );
        Some(prune)
    }

    /// What a success tells: the job's run time, quarantine's counts, the task's record.
    fn note_success(
        j: &mut Job,
        w: &mut Worker,
        config: &Config,
        now_us: u64,
        f: &Finished,
        unreported_run: u8,
    ) {
        Self::note_outcome(j, w, config, now_us, f, true, unreported_run);
        w.tasks_finished += 1;
        let rec = j.set_state(f.index, TaskState::Finished);
        rec.started_us = f.started_us;
        rec.finished_us = f.finished_us;
        rec.runs = rec.runs.saturating_add(unreported_run);
    }

    /// Counts a run that ended with a success (`ok`) or a failure: the job's mean run time
    /// and, once the job has had a failure, quarantine's outcomes of the worker and of the
    /// job. After a failure, returns those of this worker and those of the others.
    fn note_outcome(
        j: &mut Job,
        w: &mut Worker,
        config: &Config,
        now_us: u64,
        f: &Finished,
        ok: bool,
        unreported_run: u8,
    ) -> Option<(Outcomes, Outcomes)> {
        j.note_run_time(f.finished_us.saturating_sub(f.started_us));
        // Only a task's first run says anything about the worker: tasks run again (a retry,
        // `job retry`) are those that failed before, and judging the worker that gets them
        // against the others' first runs would blame it for the tasks.
        let first_run = j.table.get(f.index).runs.saturating_add(unreported_run) <= 1;
        if config.quarantine_failures == 0 || !first_run || !j.outcomes.counting(ok) {
            return None;
        }
        let window = config.quarantine_window_us;
        let mine = w.tally.record(now_us, window, f.job, ok);
        let all = j.outcomes.record(now_us, window, ok);
        (!ok).then(|| (mine, all.without(mine)))
    }

    /// [`Self::task_finished`] for any end.
    fn finish_one(&mut self, now_us: u64, worker: WorkerId, f: &Finished) -> Accepted {
        let key = (f.job, f.index);
        let Some(j) = self.jobs.get_mut(&f.job) else {
            return Accepted::Ignored;
        };
        if f.index >= j.len() {
            return Accepted::Ignored;
        }
        let rec = j.table.get(f.index);
        let active = matches!(rec.state, TaskState::Assigned | TaskState::Running);
        let ours = rec.worker == worker && active;
        let need = j.need;
        let Some(w) = self.workers.get_mut(&worker) else {
            return Accepted::Ignored;
        };
        // The worker whose ledger a release made due for pruning.
        let mut prune = None;
        if ours {
            prune = w.release(need, rec.state).then_some(worker);
        } else {
            let dup = w.duplicates.remove(&key);
            if !(dup && active && f.end == RunEnd::Success) {
                return Accepted::Ignored;
            }
            // The duplicate run finished first: take the task from the other worker.
            let other = rec.worker;
            if let Some(o) = self.workers.get_mut(&other) {
                prune = o.release(need, rec.state).then_some(other);
                self.commands.push(Command::Cancel {
                    worker: other,
                    tasks: vec![key],
                });
            }
            j.table.get_mut(f.index).worker = worker;
        }
        let Some(w) = self.workers.get_mut(&worker) else {
            return Accepted::Ignored;
        };
        // After a failure: this worker's and the other workers' outcomes of the job.
        let mut judged = None;
        // A run whose start came with its end (or not at all) is counted now.
        let unreported_run = u8::from(ours && rec.state == TaskState::Assigned);
        match &f.end {
            RunEnd::Success => {
                Self::note_success(j, w, &self.config, now_us, f, unreported_run);
            }
            RunEnd::Canceled => {
                let rec = j.set_state(f.index, TaskState::Canceled);
                rec.finished_us = f.finished_us;
            }
            RunEnd::Failed(failure) => {
                judged = Self::note_outcome(j, w, &self.config, now_us, f, false, unreported_run);
                w.tasks_failed += 1;
                let rec = j.set_state(f.index, TaskState::Failed);
                rec.started_us = f.started_us;
                rec.finished_us = f.finished_us;
                rec.runs = rec.runs.saturating_add(unreported_run);
                rec.failures = rec.failures.saturating_add(1);
                let failures = rec.failures;
                let again = !j.canceled && (failures as u32) <= j.spec.retries;
                j.failures.insert(f.index, (**failure).clone());
                let priority = j.spec.priority;
                if again {
                    j.set_state(f.index, TaskState::Ready);
                    let delay = self.backoff_us(failures);
                    if delay == 0 {
                        let span = Span::one(f.job, f.index);
                        self.ready.push_requeued(priority, span);
                    } else {
                        let due = now_us + delay;
                        self.delayed.insert((due, f.job, f.index));
                        self.delayed_at.insert(key, due);
                    }
                }
            }
        }
        if let Some((mine, others)) = judged {
            self.note_failure(worker, f.job, mine, others);
        }
        if let Some(id) = prune {
            self.prune_ledger(id);
        }
        self.check_job_done(now_us, f.job);
        Accepted::Recorded
    }

    /// A worker reports how long the tasks of `job` whose successes it reports waited there
    /// for a free slot, summed (one number per job and update, not one per task: only the
    /// job's sum is kept, for [`Job::timing`]). Also what a journal replays.
    pub fn add_slot_wait(&mut self, job: JobId, waited_us: u64) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.waited_us = j.waited_us.saturating_add(waited_us);
        }
    }

    /// Drops ended tasks from a worker's ledger (when a release says it lists far more than
    /// the worker holds).
    fn prune_ledger(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.ledger.prune(holder(&self.jobs, worker));
        }
    }

    /// A task the driver could not hand to its worker at all (its command line alone is bigger
    /// than a message can carry): it can never run, so it fails for good with `failure`,
    /// spending no retries and counting against no worker. Journaled as a give-up.
    pub fn task_undeliverable(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        failure: Failure,
    ) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if !j.held_by(index, worker) {
            return;
        }
        let need = j.need;
        let state = j.table.get(index).state;
        if let Some(w) = self.workers.get_mut(&worker) {
            if w.release(need, state) {
                w.ledger.prune(holder(&self.jobs, worker));
            }
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.canceled {
            j.set_state(index, TaskState::Canceled).finished_us = now_us;
            self.check_job_done(now_us, job);
        } else {
            self.give_up(now_us, job, index, failure);
        }
    }

    /// Fails a task for good, whatever its retries, for a reason the scheduler saw itself (no
    /// worker reported it): recorded so the driver journals it.
    fn give_up(&mut self, now_us: u64, job: JobId, index: TaskIndex, failure: Failure) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.set_state(index, TaskState::Failed).finished_us = now_us;
        j.failures.insert(index, failure);
        self.records.push(Record::GaveUp { job, index });
        self.check_job_done(now_us, job);
    }

    /// The wait before the retry after a task's `failures`-th failure.
    fn backoff_us(&self, failures: u8) -> u64 {
        let base = self.config.retry_backoff_us;
        let shift = u32::from(failures.saturating_sub(1)).min(40);
        base.saturating_mul(1u64 << shift)
            .min(self.config.retry_backoff_max_us)
    }

    /// After a task of `job` failed on `worker`, whose runs of the job ended as `mine` and on
    /// the other workers as `others`: quarantines the worker if it is faulty (see
    /// [`crate::quarantine`]), unless no other worker able to run the job would be left.
    fn note_failure(&mut self, worker: WorkerId, job: JobId, mine: Outcomes, others: Outcomes) {
        let k = self.config.quarantine_failures;
        if !quarantine::faulty(mine, others, k) {
            return;
        }
        let Some(need) = self.jobs.get(&job).map(|j| j.need) else {
            return;
        };
        let mut others_can_run = false;
        for o in self.workers.values() {
            if o.id == worker && o.quarantined.is_some() {
                return;
            }
            others_can_run |= o.id != worker && o.quarantined.is_none() && o.can_ever_run(need);
        }
        if !others_can_run {
            return;
        }
        let reason = format!(
            "{} of its last {} tasks of job {job} failed, against {} of {} on the other workers",
            mine.failed,
            u64::from(mine.ok) + u64::from(mine.failed),
            others.failed,
            u64::from(others.ok) + u64::from(others.failed),
        );
        if let Some(w) = self.workers.get_mut(&worker) {
            w.quarantined = Some(reason.clone());
        }
        self.commands.push(Command::Quarantined { worker, reason });
    }

    /// Lifts a worker's quarantine: it gets tasks again. A quarantined worker that has left
    /// can be lifted too, so it is not quarantined when it comes back.
    pub fn resume_worker(&mut self, worker: WorkerId) -> Result<bool, SchedError> {
        if self.quarantined_gone.remove(&worker).is_some() {
            return Ok(true);
        }
        let w = self
            .workers
            .get_mut(&worker)
            .ok_or(SchedError::NoSuchWorker(worker))?;
        w.tally.clear();
        Ok(w.quarantined.take().is_some())
    }

    /// Puts a job's failed tasks (and with `failed_only` false, its canceled ones) back in the
    /// queue with fresh retry and crash counts; the job is live again. Returns how many failed
    /// and how many canceled tasks were resubmitted.
    pub fn retry_job(&mut self, job: JobId, failed_only: bool) -> Result<(u32, u32), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        if j.canceled && failed_only {
            return Err(SchedError::RetryCanceled(job));
        }
        let mut spans: Vec<Span> = Vec::new();
        let (mut failed, mut canceled) = (0u32, 0u32);
        for index in 0..j.len() {
            let raw = j.table.get(index).state;
            let shown = j.record(index).state;
            let take = match shown {
                TaskState::Failed => true,
                TaskState::Canceled => !failed_only,
                _ => false,
            };
            if !take {
                continue;
            }
            if shown == TaskState::Failed {
                failed += 1;
            } else {
                canceled += 1;
            }
            if raw == shown {
                let rec = j.set_state(index, TaskState::Ready);
                rec.failures = 0;
                rec.lost = 0;
                j.failures.remove(&index);
            } else {
                // Untouched or re-queued task of a canceled job: counted canceled, stored ready.
                j.counts.moved(TaskState::Canceled, TaskState::Ready);
                if let Some(due) = self.delayed_at.remove(&(job, index)) {
                    self.delayed.remove(&(due, job, index));
                }
            }
            match spans.last_mut() {
                Some(s) if s.end == index => s.end += 1,
                _ => spans.push(Span::one(job, index)),
            }
        }
        if failed + canceled == 0 {
            return Ok((0, 0));
        }
        j.canceled = false;
        j.finished_us = None;
        let priority = j.spec.priority;
        for span in spans {
            self.ready.push_requeued(priority, span);
        }
        self.live_jobs.insert(job);
        Ok((failed, canceled))
    }

    /// Moves failed tasks whose retry backoff has passed to the queue.
    pub fn release_due(&mut self, now_us: u64) {
        while let Some(&(due, job, index)) = self.delayed.first() {
            if due > now_us {
                break;
            }
            self.delayed.pop_first();
            self.delayed_at.remove(&(job, index));
            let Some(j) = self.jobs.get(&job) else {
                continue;
            };
            if j.canceled || j.table.get(index).state != TaskState::Ready {
                continue;
            }
            self.ready
                .push_requeued(j.spec.priority, Span::one(job, index));
        }
    }

    /// When the driver should call [`Self::tick`] or [`Self::schedule`] next for time-driven
    /// work (a retry backoff ending), if any; heartbeat checks are on top of this.
    pub fn next_wakeup(&self) -> Option<u64> {
        self.delayed.first().map(|(due, _, _)| *due)
    }

    /// Cancels every task of a job that has not ended: queued tasks at once, running ones by
    /// asking their workers. Returns how many tasks were still queued and how many running.
    pub fn cancel_job(&mut self, now_us: u64, job: JobId) -> Result<(u32, u32), SchedError> {
        let j = self.jobs.get_mut(&job).ok_or(SchedError::NoSuchJob(job))?;
        if j.canceled || j.is_done() {
            return Ok((0, 0));
        }
        j.canceled = true;
        j.open = false;
        let queued = j.counts.ready;
        j.counts.canceled += queued;
        j.counts.ready = 0;
        self.ready.retain(|s| s.job != job);
        let delayed_at = &mut self.delayed_at;
        self.delayed.retain(|(_, jb, index)| {
            let keep = *jb != job;
            if !keep {
                delayed_at.remove(&(job, *index));
            }
            keep
        });
        let mut running = 0;
        let jobs = &self.jobs;
        for w in self.workers.values() {
            let holds = holder(jobs, w.id);
            let tasks = w.ledger.held_of(|jb| jb == job, holds);
            if !tasks.is_empty() {
                running += tasks.len() as u32;
                self.commands.push(Command::Cancel {
                    worker: w.id,
                    tasks,
                });
            }
        }
        // Tasks requeued for retry were counted as ready: their records say Ready.
        self.check_job_done(now_us, job);
        Ok((queued, running))
    }

    /// Time passes: workers silent past the heartbeat timeout are lost, and failed tasks whose
    /// retry backoff has passed are queued.
    pub fn tick(&mut self, now_us: u64) {
        self.release_due(now_us);
        let timeout = self.config.heartbeat_timeout_us;
        let silent: Vec<WorkerId> = self
            .workers
            .values()
            .filter(|w| now_us.saturating_sub(w.last_seen_us) > timeout)
            .map(|w| w.id)
            .collect();
        for id in silent {
            self.commands.push(Command::Disconnect {
                worker: id,
                reason: format!(
                    "no message for {} s (heartbeat timeout)",
                    timeout / 1_000_000
                ),
            });
            self.worker_lost(now_us, id);
        }
    }

    /// Hands ready tasks to workers with free credit. Call after a batch of events.
    ///
    /// Free slots everywhere are filled before any prefetch window, so a few long tasks spread
    /// over the workers instead of queueing on the first one; then windows are filled as deep
    /// as each job's run time makes useful; then idle workers take back tasks waiting on busy
    /// ones ([`Self::steal`]).
    pub fn schedule(&mut self, now_us: u64) {
        self.release_due(now_us);
        if self.workers.is_empty() {
            return;
        }
        if !self.ready.is_empty() {
            let ids: Vec<WorkerId> = self
                .workers
                .range(self.rotate..)
                .chain(self.workers.range(..self.rotate))
                .map(|(id, _)| *id)
                .collect();
            // With more queued than all workers can hold, every window fills whatever the
            // order: one pass does it.
            let room: u64 = self
                .workers
                .values()
                .map(|w| {
                    u64::from(
                        w.capacity(w.offer.prefetch)
                            .cpus
                            .saturating_sub(w.used.cpus),
                    )
                })
                .sum();
            let depths: &[Depth] = if self.ready.len() >= room {
                &[Depth::Prefetch]
            } else {
                &[Depth::Slots, Depth::Prefetch]
            };
            // Each worker's runs of both passes go out as one assignment.
            let mut given: Vec<Vec<IndexRun>> = vec![Vec::new(); ids.len()];
            for &depth in depths {
                for (&id, runs) in ids.iter().zip(&mut given) {
                    if self.ready.is_empty() {
                        break;
                    }
                    self.fill_worker(now_us, id, depth, runs);
                }
            }
            for (id, runs) in ids.into_iter().zip(given) {
                if !runs.is_empty() {
                    self.commands.push(Command::Assign { worker: id, runs });
                }
            }
            self.rotate = self.rotate.wrapping_add(1);
        }
        self.steal();
    }

    /// Gives worker `id` ready tasks up to `depth`, adding them to `runs` (the caller sends
    /// them); the worker's first task of a job is preceded by a [`Command::DefineJob`].
    fn fill_worker(&mut self, now_us: u64, id: WorkerId, depth: Depth, runs: &mut Vec<IndexRun>) {
        let Some(w) = self.workers.get_mut(&id) else {
            return;
        };
        if w.quarantined.is_some() {
            return;
        }
        let horizon = self.config.prefetch_horizon_us;
        let most_prefetch = match depth {
            Depth::Slots => 0,
            Depth::Prefetch => w.offer.prefetch,
        };
        let jobs = &mut self.jobs;
        let mut mine: Vec<IndexRun> = Vec::new();
        let mut defines: Vec<JobId> = Vec::new();
        self.ready.take_front(self.config.max_queue_skips, |span| {
            let Some(j) = jobs.get_mut(&span.job) else {
                return Some(0);
            };
            let need = j.need;
            if !w.can_ever_run(need) {
                return Some(0);
            }
            let prefetch = match depth {
                Depth::Slots => 0,
                Depth::Prefetch => j.prefetch_for(w, horizon),
            };
            let room = w.room_for(need, prefetch);
            if room == 0 {
                // Out of credit for this shape; smaller tasks further down may still fit.
                let one_cpu = Resources {
                    cpus: 1,
                    ..Resources::NONE
                };
                return if w.room_for(one_cpu, most_prefetch) == 0 {
                    None
                } else {
                    Some(0)
                };
            }
            let n = room.min(span.len());
            let mut given = 0;
            for index in span.next..span.next + n {
                // A resumed worker may have taken the task back while its entry was queued.
                if j.table.get(index).state != TaskState::Ready {
                    continue;
                }
                let rec = j.set_state(index, TaskState::Assigned);
                rec.assigned_us = now_us;
                rec.started_us = 0;
                rec.finished_us = 0;
                rec.worker = id;
                given += 1;
                match mine.last_mut() {
                    Some(r) if r.job == span.job && r.first + r.count == index => r.count += 1,
                    _ => mine.push(IndexRun {
                        job: span.job,
                        first: index,
                        count: 1,
                    }),
                }
            }
            w.held += given;
            w.used = w.used.plus(&need, given);
            if given > 0 && w.known_jobs.insert(span.job) {
                defines.push(span.job);
            }
            Some(n)
        });
        for r in mine {
            w.ledger.push_run(r);
            // A run that continues one of the first pass joins it.
            match runs.last_mut() {
                Some(l) if l.job == r.job && l.first + l.count == r.first => l.count += r.count,
                _ => runs.push(r),
            }
        }
        for job in defines {
            self.commands.push(Command::DefineJob { worker: id, job });
        }
    }

    /// Work stealing of prefetch windows: while workers have free slots that nothing in the
    /// queue fills, asks busy workers to give back tasks waiting there for a slot
    /// ([`Command::Revoke`]); what they give back ([`Self::tasks_revoked`]) goes to the front
    /// of the queue and from there to the idle slots. Only one request per worker is out at a
    /// time, and no more is asked back than the idle slots can take.
    fn steal(&mut self) {
        let min_run = self.config.steal_min_run_us;
        let mut idle: u32 = 0;
        let mut on_the_way: u32 = 0;
        for w in self.workers.values() {
            on_the_way += w.revoking_cpus;
            if w.quarantined.is_none() {
                idle += w.idle_cpus();
            }
        }
        let mut wanted = idle.saturating_sub(on_the_way);
        if wanted == 0 {
            return;
        }
        // The busiest first: the most tasks waiting for a slot.
        let mut victims: Vec<(u32, WorkerId)> = self
            .workers
            .values()
            .filter(|w| w.revoking.is_empty() && w.waiting_cpus() > 0)
            .map(|w| (w.waiting_cpus(), w.id))
            .collect();
        if victims.is_empty() {
            return;
        }
        victims.sort_unstable_by(|a, b| b.cmp(a));
        let mut worth = JobMemo::default();
        let thieves: Vec<Resources> = self
            .workers
            .values()
            .filter(|w| w.quarantined.is_none() && w.idle_cpus() > 0)
            .map(|w| w.offer.resources)
            .collect();
        for (waiting, victim) in victims {
            if wanted == 0 {
                break;
            }
            let jobs = &self.jobs;
            let w = &self.workers[&victim];
            let mut holds = holder(jobs, victim);
            // Tasks it holds that have not started, of jobs long enough to be worth moving and
            // small enough for an idle worker. The job test comes first and once per listed
            // run: short jobs (the common case) cost no walk of the ledger's tasks.
            let candidates = w.ledger.held_of(
                |job| {
                    worth.memo(job, || {
                        jobs.get(&job).is_some_and(|j| {
                            j.worth_stealing(min_run) && thieves.iter().any(|t| j.need.fits_in(t))
                        })
                    })
                },
                |job, index| {
                    holds(job, index)
                        && jobs
                            .get(&job)
                            .is_some_and(|j| j.table.get(index).state == TaskState::Assigned)
                },
            );
            // The last handed out wait the longest there.
            let mut budget = waiting.min(wanted);
            let mut tasks = Vec::new();
            let mut cpus = 0;
            for (job, index) in candidates.into_iter().rev() {
                let need = jobs[&job].need.cpus;
                if need > budget {
                    continue;
                }
                budget -= need;
                cpus += need;
                tasks.push((job, index));
                if budget == 0 {
                    break;
                }
            }
            if tasks.is_empty() {
                continue;
            }
            wanted = wanted.saturating_sub(cpus);
            let w = self.workers.get_mut(&victim).expect("victim is a worker");
            w.revoking = tasks.clone();
            w.revoking_cpus = cpus;
            self.commands.push(Command::Revoke {
                worker: victim,
                tasks,
            });
        }
    }

    /// A worker answers a [`Command::Revoke`]: `tasks` are those it still had waiting and has
    /// dropped; they go back to the front of the queue, counting no attempt. Tasks it was asked
    /// for and does not list had started (their reports follow).
    pub fn tasks_revoked(&mut self, now_us: u64, worker: WorkerId, tasks: Vec<(JobId, TaskIndex)>) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        let asked = std::mem::take(&mut w.revoking);
        w.revoking_cpus = 0;
        let mut prune = false;
        for (job, index) in tasks {
            if !asked.contains(&(job, index)) {
                continue;
            }
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            if !j.held_by(index, worker) || j.table.get(index).state != TaskState::Assigned {
                continue;
            }
            let need = j.need;
            if let Some(w) = self.workers.get_mut(&worker) {
                prune |= w.release(need, TaskState::Assigned);
            }
            if j.canceled {
                j.set_state(index, TaskState::Canceled).finished_us = now_us;
                self.check_job_done(now_us, job);
                continue;
            }
            j.set_state(index, TaskState::Ready);
            self.ready
                .push_requeued(j.spec.priority, Span::one(job, index));
        }
        if prune {
            self.prune_ledger(worker);
        }
    }

    fn check_job_done(&mut self, now_us: u64, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.finished_us.is_none() && j.is_done() {
            j.finished_us = Some(now_us);
            self.live_jobs.remove(&job);
            for w in self.workers.values_mut() {
                w.known_jobs.remove(&job);
            }
            self.commands.push(Command::JobDone { job });
        }
    }

    /// Removes a job that has ended, with its task records, so a long-lived server does not
    /// keep every job it ever ran. Its id is not given out again. A job with tasks still queued
    /// or running is refused.
    pub fn forget_job(&mut self, job: JobId) -> Result<(), SchedError> {
        let j = self.jobs.get(&job).ok_or(SchedError::NoSuchJob(job))?;
        if !j.is_done() {
            let left = j.len() - j.counts.done();
            return Err(SchedError::NotEnded { job, left });
        }
        self.jobs.remove(&job);
        self.live_jobs.remove(&job);
        // An ended job rarely has queue entries left (a task a resumed worker took back keeps
        // its entry until it is reached); without its job they would never be reached.
        if !self.ready.is_empty() {
            self.ready.retain(|s| s.job != job);
        }
        Ok(())
    }

    // ----- output ---------------------------------------------------------------------------

    /// Commands produced since the last call, in the order they must be carried out.
    pub fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.commands)
    }

    /// State changes to journal, in the order they happened; take them after every event.
    pub fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.records)
    }

    /// Whether commands are waiting (lets a driver skip an empty drain).
    pub fn has_commands(&self) -> bool {
        !self.commands.is_empty()
    }

    // ----- queries --------------------------------------------------------------------------

    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    pub fn jobs(&self) -> impl DoubleEndedIterator<Item = &Job> + '_ {
        self.jobs.values()
    }

    pub fn worker(&self, id: WorkerId) -> Option<&Worker> {
        self.workers.get(&id)
    }

    pub fn workers(&self) -> impl Iterator<Item = &Worker> + '_ {
        self.workers.values()
    }

    /// Tasks waiting for a worker. Approximate after a worker resume: a queue entry of a task
    /// the resumed worker took back counts until the entry is reached and skipped. Tasks waiting
    /// out a retry backoff are not counted (see [`Self::next_wakeup`]).
    pub fn queued(&self) -> u64 {
        self.ready.len()
    }

    /// Jobs with tasks not yet terminal.
    pub fn live_jobs(&self) -> usize {
        self.live_jobs.len()
    }

    /// What no connected worker has enough of for a task needing `need`: "3 cpus, the largest
    /// worker has 2 cpus", or, when each resource is somewhere but never all on one worker,
    /// everything the task needs.
    fn lacking(&self, need: &Resources) -> String {
        let most = self
            .workers
            .values()
            .fold(Resources::NONE, |m, w| max_each(m, &w.offer.resources));
        let count = |n: u64, one: &str| {
            if n == 1 {
                format!("1 {one}")
            } else {
                format!("{n} {one}s")
            }
        };
        let mem = |b: u64| {
            if b >= 1 << 30 {
                format!("{:.1} GiB of memory", b as f64 / f64::from(1u32 << 30))
            } else {
                format!("{} MiB of memory", b.div_ceil(1 << 20))
            }
        };
        let bigger = "; start a bigger worker or cancel the job";
        let short =
            |need: String, most: String| format!("{need}, the largest worker has {most}{bigger}");
        let mut needs = vec![count(need.cpus.into(), "cpu")];
        if need.cpus > most.cpus {
            return short(needs.remove(0), count(most.cpus.into(), "cpu"));
        }
        if need.gpus > 0 {
            needs.push(count(need.gpus.into(), "GPU"));
            if need.gpus > most.gpus {
                return short(
                    count(need.gpus.into(), "GPU"),
                    count(most.gpus.into(), "GPU"),
                );
            }
        }
        if need.mem > 0 {
            needs.push(mem(need.mem));
            if need.mem > most.mem {
                return short(mem(need.mem), mem(most.mem));
            }
        }
        for (i, (&n, &m)) in need.named.iter().zip(&most.named).enumerate() {
            if n == 0 {
                continue;
            }
            let name = self.resource_name(i).unwrap_or("?");
            needs.push(format!("{n} {name}"));
            if n > m {
                let offer = format!(
                    "start a worker with `kestrel worker start --resource {name}=N` or cancel the job"
                );
                return match m {
                    0 => format!("{n} {name}, which no worker offers; {offer}"),
                    m => format!("{n} {name}, the most a worker offers is {m}; {offer}"),
                };
            }
        }
        format!(
            "{}, and no worker has all of it{bigger}",
            needs.join(" and ")
        )
    }

    /// Why a job's queued tasks cannot go to any worker, if so (`None` also when they simply
    /// wait for busy slots). Looks at every worker: for displays, not for every event.
    pub fn stall(&self, job: JobId) -> Option<Stall> {
        let j = self.jobs.get(&job)?;
        if j.canceled || j.counts.ready == 0 {
            return None;
        }
        if self.workers.is_empty() {
            return Some(Stall::NoWorkers);
        }
        let need = j.need;
        let able = || self.workers.values().filter(|w| w.can_ever_run(need));
        if able().any(|w| w.quarantined.is_none()) {
            return None;
        }
        let quarantined: Vec<WorkerId> = able().map(|w| w.id).collect();
        if !quarantined.is_empty() {
            return Some(Stall::Quarantined {
                workers: quarantined,
            });
        }
        Some(Stall::TooBig {
            what: self.lacking(&need),
        })
    }
}

/// The larger of each resource of `a` and `b`.
fn max_each(mut a: Resources, b: &Resources) -> Resources {
    a.cpus = a.cpus.max(b.cpus);
    a.gpus = a.gpus.max(b.gpus);
    a.mem = a.mem.max(b.mem);
    for (x, y) in a.named.iter_mut().zip(&b.named) {
        *x = (*x).max(*y);
    }
    a
}

/// Replay of a journal after a crash (a child module so it can reach the private state).
#[path = "restore.rs"]
pub mod restore;
