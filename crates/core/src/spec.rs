//! What a user asks for: jobs, their tasks and the options that shape how each task runs.
//!
//! These types are plain data shared by the scheduler, the wire protocol and the CLI. The
//! scheduler only looks at resources, priority, retries and the shape of the task set; the
//! command itself is carried through to the worker untouched.

pub use crate::lines::LineList;
use std::fmt;

/// A job's number, unique for the life of a server.
pub type JobId = u32;
/// A task's user-visible id inside its job (the array value, or the position in a list).
pub type TaskId = u32;
/// A task's position in its job, `0..job.len()`; the scheduler's internal handle.
pub type TaskIndex = u32;
/// A worker's number, unique for the life of a server.
pub type WorkerId = u32;

/// Where a task's stdout or stderr goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Sink {
    /// Discarded (`/dev/null`).
    #[default]
    Null,
    /// A file path that may contain placeholders (see [`crate::placeholders`]).
    File(String),
    /// Sent to the server with the task's end and kept in the job's output log (`kestrel job
    /// cat`): no file per task. Only the first `limit` bytes of each task's output are kept.
    Stream {
        /// Bytes kept per task.
        limit: u32,
    },
}

/// What a streamed output keeps per task unless the job says otherwise (`stream:SIZE`).
pub const DEFAULT_STREAM_LIMIT: u32 = 1 << 20;
/// The most a job may keep per task and stream: a task's stdout and stderr together must fit
/// in one message from its worker, with room to spare.
pub const MAX_STREAM_LIMIT: u32 = 4 << 20;

impl Sink {
    /// Whether the output goes to the server's log.
    pub fn is_stream(&self) -> bool {
        matches!(self, Sink::Stream { .. })
    }
}

/// How many names of countable resources (licenses, scratch disks, ...) one server tells
/// apart; a fixed number keeps [`Resources`] a small `Copy` value on the dispatch path.
pub const MAX_NAMED: usize = 8;

/// Resources a task holds while it runs, or a worker has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    /// Slots (cores); at least 1 for a task.
    pub cpus: u32,
    /// Whole GPUs.
    pub gpus: u32,
    /// Memory in bytes (0: a task that asks for none).
    pub mem: u64,
    /// Amounts of named resources, by the scheduler's numbering of their names. Filled in by
    /// the scheduler from [`JobSpec::named`] and a worker's offer; the names are what travel
    /// and are journaled, never these numbers.
    pub named: [u32; MAX_NAMED],
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: 1,
            gpus: 0,
            mem: 0,
            named: [0; MAX_NAMED],
        }
    }
}

impl Resources {
    /// Nothing at all.
    pub const NONE: Resources = Resources {
        cpus: 0,
        gpus: 0,
        mem: 0,
        named: [0; MAX_NAMED],
    };

    /// One cpu and nothing else: the smallest task, to ask whether a worker has room at all.
    pub const ONE_CPU: Resources = Resources {
        cpus: 1,
        ..Resources::NONE
    };

    /// Whether `self` fits in `room`, resource by resource.
    pub fn fits_in(&self, room: &Resources) -> bool {
        self.cpus <= room.cpus
            && self.gpus <= room.gpus
            && self.mem <= room.mem
            && self.named.iter().zip(&room.named).all(|(n, r)| n <= r)
    }

    /// `self` plus `n` times `other`.
    pub fn plus(mut self, other: &Resources, n: u32) -> Resources {
        self.cpus += other.cpus * n;
        self.gpus += other.gpus * n;
        self.mem += other.mem * u64::from(n);
        for (a, b) in self.named.iter_mut().zip(&other.named) {
            *a += b * n;
        }
        self
    }

    /// `self` less `other` (never below zero).
    pub fn minus(mut self, other: &Resources) -> Resources {
        self.cpus = self.cpus.saturating_sub(other.cpus);
        self.gpus = self.gpus.saturating_sub(other.gpus);
        self.mem = self.mem.saturating_sub(other.mem);
        for (a, b) in self.named.iter_mut().zip(&other.named) {
            *a = a.saturating_sub(*b);
        }
        self
    }

    /// `self` less `part`, which it holds (what a worker gives back of what it took): plain
    /// subtraction, which the per-task path can afford where [`Self::minus`]'s checks cost.
    pub fn less_held(mut self, part: &Resources) -> Resources {
        debug_assert!(part.fits_in(&self), "{part:?} is not part of {self:?}");
        self.cpus = self.cpus.wrapping_sub(part.cpus);
        self.gpus = self.gpus.wrapping_sub(part.gpus);
        self.mem = self.mem.wrapping_sub(part.mem);
        for (a, b) in self.named.iter_mut().zip(&part.named) {
            *a = a.wrapping_sub(*b);
        }
        self
    }

    /// How many times `need` fits in `self` (`u32::MAX` if `need` is nothing).
    pub fn times_fits(&self, need: &Resources) -> u32 {
        fn div(have: u64, need: u64) -> u64 {
            have.checked_div(need).unwrap_or(u64::MAX)
        }
        let mut n = div(self.cpus.into(), need.cpus.into())
            .min(div(self.gpus.into(), need.gpus.into()))
            .min(div(self.mem, need.mem));
        for (h, w) in self.named.iter().zip(&need.named) {
            n = n.min(div((*h).into(), (*w).into()));
        }
        n.min(u64::from(u32::MAX)) as u32
    }
}

/// How every task of a job runs, apart from its own command line. The default runs nothing
/// (no argv) with its output discarded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskTemplate {
    /// Program and arguments for arrays and jobs of lines (with placeholders, see
    /// [`crate::placeholders`]); empty for lists of commands.
    pub argv: Vec<String>,
    /// Extra environment variables, added to the worker's own.
    pub env: Vec<(String, String)>,
    /// Working directory (placeholders allowed); the worker's own if `None`.
    pub cwd: Option<String>,
    /// Where standard output goes.
    pub stdout: Sink,
    /// Where standard error goes.
    pub stderr: Sink,
    /// Kill the task's process group after this many milliseconds.
    pub timeout_ms: Option<u64>,
    /// The logical files each task reads and writes (data diffusion); empty for most jobs.
    pub files: TaskFiles,
    /// What each task runs: the command line above, or a Python function.
    pub kind: TaskKind,
}

/// What a job's tasks run. The scheduler routes a task by it: a function task goes only to a
/// worker with a Python runner ([`crate::sched::WorkerOffer::runs_functions`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TaskKind {
    /// The template's command line (or each list entry's), run as a process.
    #[default]
    Command,
    /// A Python function called in a runner process kept by the worker, once per task with
    /// the arguments of the task's line (a job of lines: one pickled argument tuple per line).
    Function(Box<FunctionSpec>),
}

impl TaskKind {
    /// Whether the tasks call a Python function.
    pub fn is_function(&self) -> bool {
        matches!(self, TaskKind::Function(_))
    }

    /// The function, if the tasks call one.
    pub fn function(&self) -> Option<&FunctionSpec> {
        match self {
            TaskKind::Function(f) => Some(f),
            TaskKind::Command => None,
        }
    }
}

/// A Python function as a job carries it: pickled once (with cloudpickle) for all its tasks,
/// so a map sends it to each worker once, with the job's definition, not once per task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionSpec {
    /// Its qualified name (`module.name`), for listings and messages.
    pub name: String,
    /// The function, as `cloudpickle.dumps` gave it.
    pub pickled: Vec<u8>,
    /// The submitting client's Python, which the runner must match to unpickle it.
    pub env: PythonEnv,
    /// Directories the runner puts in front of `sys.path`, so that the modules the function
    /// refers to by name (those not pickled by value) import on the worker as on the client.
    pub path: Vec<String>,
    /// Results of at most this many bytes travel back with the task's end; a larger one
    /// fails its task with a message pointing to file outputs (which go through the workers'
    /// caches, not the server).
    pub inline_limit: u32,
}

/// What a Python runner's unpickling depends on: a pickle made by one of these is read by
/// the other only if they agree (the fingerprint compared before any task runs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PythonEnv {
    /// `major.minor.micro` of the interpreter.
    pub python: String,
    /// cloudpickle's version.
    pub cloudpickle: String,
    /// `(module, version)` of the third-party modules the function refers to, as the client
    /// sees them.
    pub modules: Vec<(String, String)>,
}

/// What a function task's result may inline by default: larger results stay on the worker.
pub const DEFAULT_INLINE_LIMIT: u32 = 1 << 20;

/// The logical files of a job's tasks: names in the job's shared store (`raw/{task}.fits`),
/// with the placeholders of [`crate::placeholders`]. Workers stage inputs into their caches
/// before a task starts and collect outputs from its sandbox after it ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskFiles {
    /// Read by each task (`--input`): the scheduler places tasks near them.
    pub inputs: Vec<String>,
    /// Written by each task into its sandbox (`--output`).
    pub outputs: Vec<String>,
    /// Read by every task (`--input-static`: a program, a database): staged like inputs (kept
    /// in the worker's cache), but they do not steer placement.
    pub statics: Vec<String>,
    /// What becomes of each output, in the order of `outputs` (empty: [`Keep::Auto`] for all).
    pub keep: Vec<Keep>,
    /// Copies of each `local` output to keep on different workers (`--replicas`; 0 and 1
    /// mean the writer's alone), so losing a worker loses no file its readers need.
    pub replicas: u8,
}

/// What becomes of an output once its task succeeded (AME's collocated store).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Keep {
    /// `Local` if a task known when its job is submitted reads it, else `Persist`.
    #[default]
    Auto,
    /// Kept in the producer's cache (and fetched from there by the tasks that read it), never
    /// written to the store; deleted from caches when its workflow has ended.
    Local,
    /// Also written to the store.
    Persist,
}

impl Keep {
    /// The name users write (`local:NAME`, `persist:NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Keep::Auto => "auto",
            Keep::Local => "local",
            Keep::Persist => "persist",
        }
    }
}

impl TaskFiles {
    /// Whether the job declares no file.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty() && self.outputs.is_empty() && self.statics.is_empty()
    }

    /// What becomes of output `i`.
    pub fn keep_of(&self, i: usize) -> Keep {
        self.keep.get(i).copied().unwrap_or_default()
    }

    /// Checks every name: relative, without `..`, within [`MAX_TASK_FILES`] per kind.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.replicas > MAX_REPLICAS {
            return Err(SpecError::TooManyReplicas(self.replicas));
        }
        if self.replicas > 1 && self.outputs.is_empty() {
            return Err(SpecError::ReplicasWithoutOutputs(self.replicas));
        }
        if !self.keep.is_empty() && self.keep.len() != self.outputs.len() {
            return Err(SpecError::KeepCount {
                keep: self.keep.len(),
                outputs: self.outputs.len(),
            });
        }
        for (names, flag) in [
            (&self.inputs, "--input"),
            (&self.outputs, "--output-file"),
            (&self.statics, "--input-static"),
        ] {
            if names.len() > MAX_TASK_FILES {
                return Err(SpecError::TooManyFiles {
                    flag,
                    count: names.len(),
                });
            }
            for name in names {
                check_file_name(name).map_err(|why| SpecError::FileName {
                    flag,
                    name: name.clone(),
                    why,
                })?;
            }
        }
        Ok(())
    }
}

/// The most files of one kind a task may declare.
pub const MAX_TASK_FILES: usize = 64;

/// The most copies of an output `--replicas` may ask for.
pub const MAX_REPLICAS: u8 = 8;

/// Why `name` cannot be a logical file's name, if it cannot: names are paths relative to the
/// store, so that one cannot reach outside it.
fn check_file_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > 1024 {
        return Err("it is longer than 1024 bytes");
    }
    if name.starts_with('/') {
        return Err("it is absolute; names are relative to the store");
    }
    if name.contains('\0') {
        return Err("it holds a NUL byte");
    }
    if name
        .split('/')
        .any(|part| part == ".." || part == "." || part.is_empty())
    {
        return Err("it has an empty, `.` or `..` part; names are plain paths inside the store");
    }
    Ok(())
}

/// Falkon's dispatch policies (§6.2.3 of the dissertation): how tasks that read files are
/// placed. Tasks without inputs go first-available whatever the policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PolicyName {
    /// The first worker with room; workers are not told where peers hold the inputs.
    #[default]
    FirstAvailable,
    /// The first worker with room, told which peers hold the inputs.
    FirstCacheAvailable,
    /// Only the worker holding most of the task's data; the task waits for it.
    MaxCacheHit,
    /// Any worker with room, preferring the one holding most of the task's data.
    MaxComputeUtil,
    /// Max-cache-hit while the cluster's cpus are busier than a threshold, else
    /// max-compute-util.
    GoodCacheCompute,
}

impl PolicyName {
    /// Every policy, in the order of the dissertation.
    pub const ALL: [PolicyName; 5] = [
        PolicyName::FirstAvailable,
        PolicyName::FirstCacheAvailable,
        PolicyName::MaxCacheHit,
        PolicyName::MaxComputeUtil,
        PolicyName::GoodCacheCompute,
    ];

    /// The name users give (`first-available`, ...).
    pub fn name(self) -> &'static str {
        match self {
            PolicyName::FirstAvailable => "first-available",
            PolicyName::FirstCacheAvailable => "first-cache-available",
            PolicyName::MaxCacheHit => "max-cache-hit",
            PolicyName::MaxComputeUtil => "max-compute-util",
            PolicyName::GoodCacheCompute => "good-cache-compute",
        }
    }

    /// The policy named `name` (its full name or the dissertation's initials, `gcc`).
    pub fn parse(name: &str) -> Option<PolicyName> {
        let short = ["fa", "fca", "mch", "mcu", "gcc"];
        PolicyName::ALL
            .into_iter()
            .zip(short)
            .find(|(p, s)| p.name() == name || *s == name)
            .map(|(p, _)| p)
    }

    /// Whether the scheduler places tasks by where their inputs are cached.
    pub fn data_aware(self) -> bool {
        matches!(
            self,
            PolicyName::MaxCacheHit | PolicyName::MaxComputeUtil | PolicyName::GoodCacheCompute
        )
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a job's files live and how its tasks are placed; all `None` takes the server's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The shared store its logical files are in (a directory or an HTTP(S) URL prefix).
    pub store: Option<String>,
    /// The dispatch policy for its tasks that read files.
    pub policy: Option<PolicyName>,
    /// Good-cache-compute's threshold of cpu utilisation, in thousandths (900 = 0.9).
    pub util_threshold_permille: Option<u16>,
}

impl Placement {
    /// Whether it takes everything from the server.
    pub fn is_default(&self) -> bool {
        *self == Placement::default()
    }
}

/// The set of task ids of an array job, kept as ranges so a 10-million-task array costs bytes.
/// On the wire only the runs travel ([`IdRanges::runs`]); the index is rebuilt (and checked)
/// on arrival ([`IdRanges::try_from`]).
///
/// [`IdRanges::parse`] gives ids sorted and unique (overlapping ranges merged, as Slurm does);
/// a submission must be so ([`JobSpec::validate`]). Rebuilding from runs keeps them as they
/// were stored, so a journal written before ids were merged replays with its tasks' indices intact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdRanges {
    /// `(first, count, step)` runs, in the order given by the user.
    runs: Vec<IdRun>,
    /// `starts[i]` is the task index of the first id of `runs[i]`.
    starts: Vec<u32>,
}

impl TryFrom<Vec<IdRun>> for IdRanges {
    type Error = RangeError;
    fn try_from(runs: Vec<IdRun>) -> Result<Self, RangeError> {
        if let Some(r) = runs.iter().find(|r| r.step == 0) {
            // As it travels: the sender did not parse an expression.
            return Err(RangeError::ZeroStep(format!(
                "[first {}, count {}, step 0]",
                r.first, r.count
            )));
        }
        if runs.iter().any(|r| {
            r.count > 0 && r.first as u64 + (r.count as u64 - 1) * r.step as u64 > u32::MAX as u64
        }) {
            return Err(RangeError::TooLarge);
        }
        IdRanges::from_runs(runs)
    }
}

impl From<IdRanges> for Vec<IdRun> {
    fn from(r: IdRanges) -> Vec<IdRun> {
        r.runs
    }
}

/// The expression the ranges parse from, e.g. `1-100`, `0-98:2`, `1,5,9-12`.
impl fmt::Display for IdRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.runs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let last = r.first as u64 + r.count.saturating_sub(1) as u64 * r.step as u64;
            match (r.count, r.step) {
                (0 | 1, _) => write!(f, "{}", r.first)?,
                (_, 1) => write!(f, "{}-{last}", r.first)?,
                (_, step) => write!(f, "{}-{last}:{step}", r.first)?,
            }
        }
        Ok(())
    }
}

/// `count` ids `first, first + step, ...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRun {
    pub(crate) first: u32,
    pub(crate) count: u32,
    pub(crate) step: u32,
}

impl IdRun {
    /// The run `first, first + step, ...` of `count` ids, as stored; [`IdRanges::try_from`]
    /// checks it.
    pub fn new(first: u32, count: u32, step: u32) -> IdRun {
        IdRun { first, count, step }
    }

    /// The run as `(first, count, step)`.
    pub fn parts(&self) -> (u32, u32, u32) {
        (self.first, self.count, self.step)
    }
}

/// Why an array expression was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RangeError {
    /// The expression is empty.
    #[error("empty array expression; write e.g. 1-100, 0-98:2 or 1,5,9-12")]
    Empty,
    /// A part is neither a number nor a range.
    #[error("'{0}' is not a number, a range a-b, or a range with a step a-b:s; write e.g. 1-100, 0-98:2 or 1,5,9-12")]
    Syntax(String),
    /// An id does not fit in 32 bits.
    #[error("'{0}': task ids must be at most 4294967295")]
    IdTooLarge(String),
    /// A range runs backwards.
    #[error("range '{0}' runs backwards; write the smaller number first, e.g. 1-5")]
    Backwards(String),
    /// A step is 0.
    #[error("step in '{0}' must be at least 1")]
    ZeroStep(String),
    /// More than 2^32 - 1 tasks.
    #[error("the array has more than 4294967295 tasks")]
    TooLarge,
    /// Two ranges overlap in a way that needs a range per id.
    #[error("ranges {one} and {other} overlap over {ids} ids in a pattern that would need a range per id; write ranges that do not overlap")]
    CannotMerge {
        /// One of the ranges.
        one: String,
        /// The other.
        other: String,
        /// How many ids they share.
        ids: u64,
    },
}

impl IdRanges {
    /// Parses `1-100`, `0-98:2`, `7`, and comma-separated lists of those; the ids come out
    /// sorted and unique (overlapping ranges merged as Slurm does).
    pub fn parse(text: &str) -> Result<IdRanges, RangeError> {
        let mut runs = Vec::new();
        for part in text.split(',').map(str::trim) {
            if part.is_empty() {
                continue;
            }
            runs.push(parse_run(part)?);
        }
        if runs.is_empty() {
            return Err(RangeError::Empty);
        }
        Self::from_runs(crate::id_merge::merge(&runs)?)
    }

    /// The same ids, sorted and unique.
    pub fn merged(&self) -> Result<IdRanges, RangeError> {
        Self::from_runs(crate::id_merge::merge(&self.runs)?)
    }

    /// Whether every id is larger than the one before it (no id twice, none out of order).
    pub fn is_sorted_unique(&self) -> bool {
        let mut next_allowed: u64 = 0;
        self.runs.iter().filter(|r| r.count > 0).all(|r| {
            let ok = r.first as u64 >= next_allowed && (r.count == 1 || r.step > 0);
            next_allowed = r.first as u64 + (r.count as u64 - 1) * r.step as u64 + 1;
            ok
        })
    }

    /// The runs, as they travel.
    pub fn runs(&self) -> &[IdRun] {
        &self.runs
    }

    /// The ids `first ..= last`, every one.
    pub fn span(first: u32, last: u32) -> IdRanges {
        Self::from_runs(vec![IdRun {
            first,
            count: last - first + 1,
            step: 1,
        }])
        .expect("one run fits")
    }

    /// The ids `0..count` (a list job's ids).
    pub fn first_n(count: u32) -> IdRanges {
        let runs = if count == 0 {
            vec![]
        } else {
            vec![IdRun {
                first: 0,
                count,
                step: 1,
            }]
        };
        Self::from_runs(runs).expect("one run fits")
    }

    /// The ids `ids` (in any order, repeats allowed), sorted and unique, consecutive ones in
    /// one run: a client's list of tasks (the futures it cancels) as few runs as it makes.
    pub fn from_ids(ids: impl IntoIterator<Item = TaskId>) -> IdRanges {
        let mut ids: Vec<TaskId> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        let mut runs: Vec<IdRun> = Vec::new();
        for id in ids {
            match runs.last_mut() {
                Some(r) if r.first as u64 + r.count as u64 == id as u64 => r.count += 1,
                _ => runs.push(IdRun::new(id, 1, 1)),
            }
        }
        // At most 2^32 ids, each once: never too many for the index.
        IdRanges::from_runs(runs).expect("fewer than 2^32 distinct ids")
    }

    fn from_runs(runs: Vec<IdRun>) -> Result<IdRanges, RangeError> {
        let mut starts = Vec::with_capacity(runs.len());
        let mut total: u64 = 0;
        for r in &runs {
            starts.push(total as u32);
            total += r.count as u64;
            if total > u32::MAX as u64 {
                return Err(RangeError::TooLarge);
            }
        }
        Ok(IdRanges { runs, starts })
    }

    /// Number of tasks.
    pub fn len(&self) -> u32 {
        self.runs.iter().map(|r| r.count).sum()
    }

    /// Whether it holds no id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The user-visible id of the task at `index`.
    pub fn id_at(&self, index: TaskIndex) -> Option<TaskId> {
        let run = self
            .starts
            .partition_point(|&s| s <= index)
            .checked_sub(1)?;
        let r = self.runs[run];
        let off = index - self.starts[run];
        (off < r.count).then(|| r.first + off * r.step)
    }

    /// The index of the task with id `id`, if the array has it (first match for repeated ids).
    pub fn index_of(&self, id: TaskId) -> Option<TaskIndex> {
        self.runs.iter().zip(&self.starts).find_map(|(r, &start)| {
            let off = id.checked_sub(r.first)?;
            (off % r.step == 0 && off / r.step < r.count).then(|| start + off / r.step)
        })
    }
}

fn parse_run(part: &str) -> Result<IdRun, RangeError> {
    let num = |s: &str| {
        let s = s.trim();
        s.parse::<u32>().map_err(|_| {
            if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
                RangeError::IdTooLarge(part.into())
            } else {
                RangeError::Syntax(part.into())
            }
        })
    };
    let (range, step) = match part.split_once(':') {
        Some((r, s)) => (r, num(s)?),
        None => (part, 1),
    };
    if step == 0 {
        return Err(RangeError::ZeroStep(part.into()));
    }
    let (first, last) = match range.split_once('-') {
        Some((a, b)) => (num(a)?, num(b)?),
        None => {
            let v = num(range)?;
            (v, v)
        }
    };
    if last < first {
        return Err(RangeError::Backwards(part.into()));
    }
    let count =
        u32::try_from((last - first) as u64 / step as u64 + 1).map_err(|_| RangeError::TooLarge)?;
    Ok(IdRun { first, count, step })
}

/// The tasks of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskSet {
    /// One task per id, all running the template's command.
    Array(IdRanges),
    /// One task per entry, each with its own argv (ids `0..n`).
    List(Vec<Vec<String>>),
    /// One task per line (`--each`), all running the template's command with `{line}` replaced
    /// by the task's line (ids `0..n`). The lines alone are kept, not a command line per task.
    Lines(LineList),
}

impl TaskSet {
    /// How many tasks it holds.
    pub fn len(&self) -> u32 {
        match self {
            TaskSet::Array(r) => r.len(),
            TaskSet::List(l) => l.len() as u32,
            TaskSet::Lines(l) => l.len() as u32,
        }
    }

    /// Whether it holds no task.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What kind of task set this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            TaskSet::Array(_) => "an array",
            TaskSet::List(_) => "a list of commands",
            TaskSet::Lines(_) => "a list of lines",
        }
    }

    /// The user-visible id of task `index` (the array value, or the position in a list).
    pub fn id_at(&self, index: TaskIndex) -> TaskId {
        match self {
            TaskSet::Array(r) => r.id_at(index).unwrap_or(index),
            TaskSet::List(_) | TaskSet::Lines(_) => index,
        }
    }

    /// The argv of task `index` of a list (`None` otherwise: the template's argv applies).
    pub fn argv(&self, index: TaskIndex) -> Option<&[String]> {
        match self {
            TaskSet::List(l) => l.get(index as usize).map(Vec::as_slice),
            _ => None,
        }
    }

    /// The line of task `index` of a `Lines` job.
    pub fn line(&self, index: TaskIndex) -> Option<&str> {
        match self {
            TaskSet::Lines(l) => l.get(index as usize),
            _ => None,
        }
    }

    /// Appends the entries of `more` (of the same kind, lists only) from its `skip`th on.
    /// Returns `false`, appending nothing, if the kinds differ.
    pub fn append(&mut self, more: TaskSet, skip: usize) -> bool {
        match (self, more) {
            (TaskSet::List(l), TaskSet::List(m)) => {
                l.extend(m.into_iter().skip(skip));
                true
            }
            (TaskSet::Lines(l), TaskSet::Lines(m)) => {
                l.append_from(&m, skip);
                true
            }
            _ => false,
        }
    }

    /// The index of the first list entry from `skip` on with an empty command line.
    pub fn first_empty(&self, skip: usize) -> Option<usize> {
        match self {
            TaskSet::List(l) => l
                .iter()
                .skip(skip)
                .position(Vec::is_empty)
                .map(|i| i + skip),
            _ => None,
        }
    }
}

/// Everything the scheduler needs to know about a job at submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    /// The job's name, for listings.
    pub name: String,
    /// What each task runs.
    pub template: TaskTemplate,
    /// What each task holds while it runs.
    pub resources: Resources,
    /// Higher runs first.
    pub priority: i32,
    /// How many times a failed task is run again.
    pub retries: u32,
    /// Named countable resources each task holds (`--resource licenses=1`), matched against
    /// what workers offer under the same names.
    pub named: Vec<(String, u32)>,
    /// Its store and dispatch policy, where they differ from the server's.
    pub placement: Placement,
    /// Tasks that must all finish successfully before any task of this job starts
    /// (`--after JOB[:TASKS]`); if one fails for good, this job's tasks are canceled.
    pub after: Vec<After>,
    /// The running task that submitted this job (`kestrel submit` inside a task, as `(job,
    /// task id)`): its job is complete only when this one is.
    pub parent: Option<(JobId, TaskId)>,
    /// Whole workers each task takes (`--nodes N`, HyperQueue's multi-node tasks): 0 for an
    /// ordinary task, which holds `resources` on one worker. A task of N nodes runs on the
    /// first of N workers of one group and holds all N whole (nothing else runs on them) until
    /// it ends; `resources` is then what each of them must offer at least.
    pub nodes: u32,
    /// Tasks single tasks of this job wait for (a job file's `deps = [...]`), beside `after`.
    pub deps: Vec<TaskDeps>,
    /// The ids of a list job's tasks, in order, when they are not their positions (a job
    /// file's `id = ...`, as HyperQueue's); `None` numbers them 0, 1, 2, ...
    pub task_ids: Option<IdRanges>,
}

/// The tasks one task waits for: it starts only once they have all finished successfully,
/// and is canceled, saying why, if one of them fails for good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskDeps {
    /// The id of the waiting task, in its job.
    pub task: TaskId,
    /// What it waits for.
    pub on: Vec<TaskRef>,
}

/// A task named by its id: in the same job (`job: None`), or in another job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskRef {
    /// Its job; `None` for the job that names it.
    pub job: Option<JobId>,
    /// Its id in that job.
    pub task: TaskId,
}

impl fmt::Display for TaskRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.job {
            None => write!(f, "{}", self.task),
            Some(j) => write!(f, "{j}:{}", self.task),
        }
    }
}

/// A dependency on another job's tasks: all of them (`tasks: None`) or those with these ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct After {
    /// The job depended on.
    pub job: JobId,
    /// The ids of its tasks depended on; `None` for the whole job.
    pub tasks: Option<IdRanges>,
}

impl fmt::Display for After {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tasks {
            None => write!(f, "{}", self.job),
            Some(t) => write!(f, "{}:{t}", self.job),
        }
    }
}

impl After {
    /// Parses `JOB` or `JOB:TASKS` (`7`, `7:1-10`).
    pub fn parse(text: &str) -> Result<After, String> {
        let (job, tasks) = match text.split_once(':') {
            Some((j, t)) => (j, Some(t)),
            None => (text, None),
        };
        let job = job
            .trim()
            .parse::<JobId>()
            .map_err(|_| format!("--after {text:?}: give a job id, or JOB:TASKS such as 7:1-10"))?;
        let tasks = tasks
            .map(|t| IdRanges::parse(t).map_err(|e| format!("--after {text:?}: {e}")))
            .transpose()?;
        Ok(After { job, tasks })
    }
}

impl JobSpec {
    /// A job named `name` whose tasks run `argv`, with everything else at its default: one cpu
    /// per task, output discarded, the worker's directory, no timeout, priority 0, no retries.
    pub fn command(name: impl Into<String>, argv: Vec<String>) -> JobSpec {
        JobSpec {
            name: name.into(),
            template: TaskTemplate {
                argv,
                ..TaskTemplate::default()
            },
            resources: Resources::default(),
            priority: 0,
            retries: 0,
            named: Vec::new(),
            placement: Placement::default(),
            after: Vec::new(),
            parent: None,
            nodes: 0,
            deps: Vec::new(),
            task_ids: None,
        }
    }

    /// `tasks` as their ids go: an array standing in for a list whose tasks have ids of
    /// their own ([`Self::task_ids`]), for what computes names from ids (file names).
    pub fn ids_of<'a>(&self, tasks: &'a TaskSet) -> std::borrow::Cow<'a, TaskSet> {
        match (&self.task_ids, tasks) {
            (Some(ids), TaskSet::List(_)) => std::borrow::Cow::Owned(TaskSet::Array(ids.clone())),
            _ => std::borrow::Cow::Borrowed(tasks),
        }
    }
}

/// Why a job specification was refused at submission.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// A task must hold at least one cpu.
    #[error("a task needs at least one cpu (got --cpus 0)")]
    NoCpus,
    /// No tasks were given.
    #[error("the job has no tasks")]
    NoTasks,
    /// An array has no command.
    #[error("an array job needs a command: give it after `--`, e.g. `kestrel submit --array 1-10 -- ./sim {{task}}`")]
    NoCommand,
    /// A listed task has an empty command line.
    #[error("task {0} of the list has an empty command line")]
    EmptyTask(u32),
    /// A job of lines has no command.
    #[error("a job of lines needs a command: give it after `--`, e.g. `kestrel submit --each inputs.txt -- ./process {{line}}`")]
    NoLineCommand,
    /// An array's ranges are not merged.
    #[error("the array's ids must be sorted and unique (its ranges overlap or are out of order); `kestrel submit --array` merges them")]
    Unmerged,
    /// The array expression is wrong.
    #[error("array: {0}")]
    Range(#[from] RangeError),
    /// More retries than a task's failure count holds.
    #[error("--retries {0} is too many: at most {max} (a task's failures are counted in a byte)", max = MAX_RETRIES)]
    TooManyRetries(u32),
    /// A streamed output limit above the most allowed.
    #[error("a streamed output may keep at most {max} bytes per task (4M), not {0}", max = MAX_STREAM_LIMIT)]
    StreamLimit(u32),
    /// A logical file's name is not one.
    #[error("{flag} {name:?}: {why}")]
    FileName {
        /// The option that named it.
        flag: &'static str,
        /// The name.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// More files of one kind than a task may declare.
    #[error("{count} {flag} files per task; at most {max} may be declared", max = MAX_TASK_FILES)]
    TooManyFiles {
        /// The option.
        flag: &'static str,
        /// How many were given.
        count: usize,
    },
    /// Copies of outputs asked for a job that writes none.
    #[error("--replicas {0}: the job writes no file; it keeps copies of the `local` outputs of `--output-file`")]
    ReplicasWithoutOutputs(u8),
    /// More copies of outputs than [`MAX_REPLICAS`].
    #[error("--replicas {0}: at most {max} copies of an output are kept", max = MAX_REPLICAS)]
    TooManyReplicas(u8),
    /// The output modes do not match the outputs one for one.
    #[error("{keep} output modes for {outputs} outputs; give one mode per output")]
    KeepCount {
        /// How many modes.
        keep: usize,
        /// How many outputs.
        outputs: usize,
    },
    /// A utilisation threshold above 1.
    #[error("--util-threshold {0}/1000 is above 1; give a fraction such as 0.9")]
    UtilThreshold(u16),
    /// A multi-node job that declares files (staged on one worker only).
    #[error("--nodes {0}: a multi-node task cannot declare files (--input, --output-file, --input-static); read and write them on a shared file system")]
    NodesWithFiles(u32),
    /// More nodes than one task may take.
    #[error("--nodes {0}: a task may take at most {max} workers", max = MAX_NODES)]
    TooManyNodes(u32),
    /// Ids of their own for tasks that are not a list, or not one per task.
    #[error("{0}")]
    TaskIds(String),
    /// A function job whose tasks are not one argument line each.
    #[error("function {name}: its tasks must be a list of argument lines (one pickled argument tuple per task), not {tasks}")]
    FunctionNotLines {
        /// The function.
        name: String,
        /// What the tasks were.
        tasks: &'static str,
    },
    /// A function job that also gives a command line.
    #[error("function {0}: a job runs a command or a function, not both; drop the command")]
    FunctionWithCommand(String),
    /// A multi-node function job.
    #[error(
        "--nodes {0}: a function task runs in one worker's runner; multi-node tasks are commands"
    )]
    NodesWithFunction(u32),
    /// A result inline limit above what one message carries.
    #[error("a function result may travel inline up to {max} bytes (4M), not {0}; larger results stay on the worker as files", max = MAX_STREAM_LIMIT)]
    InlineLimit(u32),
}

/// The most workers one multi-node task may take.
pub const MAX_NODES: u32 = 4096;

/// The most retries a task may have: failures are counted per task in one byte (task records
/// stay small for millions of tasks), and the count must be able to exceed the retries.
pub const MAX_RETRIES: u32 = u8::MAX as u32 - 1;

impl JobSpec {
    /// Checks what a job needs whatever its tasks (an open list job may start with none).
    pub fn validate_spec(&self) -> Result<(), SpecError> {
        if self.resources.cpus == 0 {
            return Err(SpecError::NoCpus);
        }
        if self.retries > MAX_RETRIES {
            return Err(SpecError::TooManyRetries(self.retries));
        }
        for sink in [&self.template.stdout, &self.template.stderr] {
            if let Sink::Stream { limit } = sink {
                if *limit > MAX_STREAM_LIMIT {
                    return Err(SpecError::StreamLimit(*limit));
                }
            }
        }
        self.template.files.validate()?;
        if let Some(t) = self.placement.util_threshold_permille.filter(|&t| t > 1000) {
            return Err(SpecError::UtilThreshold(t));
        }
        if self.nodes > MAX_NODES {
            return Err(SpecError::TooManyNodes(self.nodes));
        }
        if self.nodes > 0 && !self.template.files.is_empty() {
            return Err(SpecError::NodesWithFiles(self.nodes));
        }
        if let Some(f) = self.template.kind.function() {
            if self.nodes > 0 {
                return Err(SpecError::NodesWithFunction(self.nodes));
            }
            if !self.template.argv.is_empty() {
                return Err(SpecError::FunctionWithCommand(f.name.clone()));
            }
            if f.inline_limit > MAX_STREAM_LIMIT {
                return Err(SpecError::InlineLimit(f.inline_limit));
            }
        }
        Ok(())
    }

    /// Checks what the scheduler relies on; the server calls this on every submission.
    pub fn validate(&self, tasks: &TaskSet) -> Result<(), SpecError> {
        self.validate_spec()?;
        if tasks.is_empty() {
            return Err(SpecError::NoTasks);
        }
        if let Some(f) = self.template.kind.function() {
            if !matches!(tasks, TaskSet::Lines(_)) {
                return Err(SpecError::FunctionNotLines {
                    name: f.name.clone(),
                    tasks: tasks.kind(),
                });
            }
            return Ok(());
        }
        match tasks {
            TaskSet::Array(r) => {
                if self.template.argv.is_empty() {
                    return Err(SpecError::NoCommand);
                }
                if !r.is_sorted_unique() {
                    return Err(SpecError::Unmerged);
                }
            }
            TaskSet::Lines(_) => {
                if self.template.argv.is_empty() {
                    return Err(SpecError::NoLineCommand);
                }
            }
            TaskSet::List(_) => {
                if let Some(i) = tasks.first_empty(0) {
                    return Err(SpecError::EmptyTask(i as u32));
                }
            }
        }
        self.check_task_ids(tasks)
    }

    /// Checks the ids a list's tasks have of their own, if any: one per task, sorted, unique.
    pub fn check_task_ids(&self, tasks: &TaskSet) -> Result<(), SpecError> {
        let Some(ids) = &self.task_ids else {
            return Ok(());
        };
        if !matches!(tasks, TaskSet::List(_)) {
            return Err(SpecError::TaskIds(format!(
                "only a list of commands may give its tasks ids of their own, not {}",
                tasks.kind()
            )));
        }
        if ids.len() != tasks.len() {
            return Err(SpecError::TaskIds(format!(
                "{} ids for {} tasks; give one id per task",
                ids.len(),
                tasks.len()
            )));
        }
        if !ids.is_sorted_unique() {
            return Err(SpecError::TaskIds(
                "the tasks' ids must be sorted and unique".into(),
            ));
        }
        Ok(())
    }
}

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TaskState {
    /// Queued (or waiting out a retry backoff).
    Ready = 0,
    /// Sent to a worker, not known to have started.
    Assigned = 1,
    /// Running on a worker.
    Running = 2,
    /// Ended in success.
    Finished = 3,
    /// Failed for good.
    Failed = 4,
    /// Canceled.
    Canceled = 5,
    /// Waiting for the tasks it depends on (the writers of its inputs, `--after`).
    Waiting = 6,
}

impl TaskState {
    /// Whether the task has ended for good (finished, failed or canceled).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Finished | TaskState::Failed | TaskState::Canceled
        )
    }

    /// The state's name in listings and JSON.
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Ready => "ready",
            TaskState::Assigned => "assigned",
            TaskState::Running => "running",
            TaskState::Finished => "finished",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
            TaskState::Waiting => "waiting",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_list_of_ids_becomes_sorted_unique_runs() {
        let r = IdRanges::from_ids([9, 3, 4, 5, 3, 12, u32::MAX]);
        assert_eq!(r.to_string(), format!("3-5,9,12,{}", u32::MAX));
        assert!(r.is_sorted_unique());
        assert_eq!(r.len(), 6);
        assert!(IdRanges::from_ids([]).is_empty());
    }

    #[test]
    fn parses_ranges_steps_and_lists() {
        let r = IdRanges::parse("1-5").unwrap();
        assert_eq!(r.len(), 5);
        assert_eq!(r.id_at(0), Some(1));
        assert_eq!(r.id_at(4), Some(5));
        assert_eq!(r.id_at(5), None);
        let r = IdRanges::parse("0-10:5, 20,30-31").unwrap();
        let ids: Vec<_> = (0..r.len()).map(|i| r.id_at(i).unwrap()).collect();
        assert_eq!(ids, vec![0, 5, 10, 20, 30, 31]);
        assert_eq!(r.index_of(20), Some(3));
        assert_eq!(r.index_of(7), None);
    }

    #[test]
    fn refuses_bad_ranges() {
        assert_eq!(
            IdRanges::parse("5-1"),
            Err(RangeError::Backwards("5-1".into()))
        );
        assert_eq!(IdRanges::parse(""), Err(RangeError::Empty));
        assert_eq!(
            IdRanges::parse("1-x"),
            Err(RangeError::Syntax("1-x".into()))
        );
        assert_eq!(
            IdRanges::parse("1-9:0"),
            Err(RangeError::ZeroStep("1-9:0".into()))
        );
        assert_eq!(IdRanges::parse("0-4294967295,1"), Err(RangeError::TooLarge));
    }

    #[test]
    fn ranges_print_as_they_parse() {
        for text in ["1-100", "0-98:2", "1,5,9-12", "7", "0-10:5,20,30-31"] {
            assert_eq!(IdRanges::parse(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn ids_past_u32_say_the_limit() {
        assert_eq!(
            IdRanges::parse("0-10000000000"),
            Err(RangeError::IdTooLarge("0-10000000000".into()))
        );
        assert!(RangeError::IdTooLarge("x".into())
            .to_string()
            .contains("at most 4294967295"));
    }

    fn array_spec() -> JobSpec {
        JobSpec::command("a", vec!["true".into()])
    }

    #[test]
    fn arrays_from_the_wire_keep_their_order_but_a_submission_must_be_merged() {
        let run = |first, count, step| IdRun { first, count, step };
        // Stored as given: a journal written before ids were merged keeps its indices.
        let old = IdRanges::try_from(vec![run(1, 5, 1), run(3, 5, 1)]).unwrap();
        assert_eq!((old.len(), old.id_at(5)), (10, Some(3)));
        assert!(!old.is_sorted_unique());
        let spec = array_spec();
        assert_eq!(
            spec.validate(&TaskSet::Array(old.clone())),
            Err(SpecError::Unmerged)
        );
        let merged = old.merged().unwrap();
        assert_eq!(merged, IdRanges::parse("1-7").unwrap());
        assert_eq!(spec.validate(&TaskSet::Array(merged)), Ok(()));
        let unsorted = IdRanges::try_from(vec![run(5, 1, 1), run(1, 1, 1)]).unwrap();
        assert!(!unsorted.is_sorted_unique());
        let mut no_command = spec.clone();
        no_command.template.argv.clear();
        let lines = TaskSet::Lines(["a"].into_iter().collect());
        assert_eq!(no_command.validate(&lines), Err(SpecError::NoLineCommand));
        assert_eq!(spec.validate(&lines), Ok(()));
    }

    #[test]
    fn a_stream_keeps_at_most_its_maximum() {
        let mut spec = array_spec();
        spec.template.stdout = Sink::Stream {
            limit: MAX_STREAM_LIMIT,
        };
        assert_eq!(spec.validate_spec(), Ok(()));
        spec.template.stderr = Sink::Stream {
            limit: MAX_STREAM_LIMIT + 1,
        };
        assert_eq!(
            spec.validate_spec(),
            Err(SpecError::StreamLimit(MAX_STREAM_LIMIT + 1))
        );
    }

    proptest! {
        #[test]
        fn index_and_id_are_inverse(first in 0u32..1000, count in 1u32..500, step in 1u32..7) {
            let last = first + (count - 1) * step;
            let r = IdRanges::parse(&format!("{first}-{last}:{step}")).unwrap();
            prop_assert_eq!(r.len(), count);
            for i in 0..count {
                let id = r.id_at(i).unwrap();
                prop_assert_eq!(r.index_of(id), Some(i));
            }
        }
    }
}
