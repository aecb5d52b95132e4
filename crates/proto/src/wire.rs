//! The wire form of core's types: field order, names and encodings of everything core
//! defines and the protocol (or the server's journal) carries.
//!
//! Core's types are plain data with no serde at all; their MessagePack form is written down
//! here and nowhere else, so a change to a core struct cannot change the bytes on the wire
//! without a change to this file (and the golden tests in `tests/golden.rs` catch one that
//! does). Each `…Def` is a serde *remote* definition: serde generates, from the field list
//! written here, code that encodes core's value directly and decodes straight into it. That
//! is the conversion at the edge without a copy: a report of a thousand task starts is decoded
//! into core's `Started` values, not into a twin type and then moved.
//!
//! Use one as `#[serde(with = "wire::JobSpecDef")]` on a field of core's type; for an `Option`
//! or a `Vec` of one, `#[serde(with = "wire::option")]` or `wire::vec`, and [`Ref`]/[`Own`]
//! to encode or decode one elsewhere (in a tuple, or on its own): generic over the core types
//! that implement [`Wire`].
//!
//! Fields are positional (MessagePack arrays), so they may only be added at the end, with
//! `#[serde(default)]`: a newer peer then still reads an older peer's message (an older peer
//! refuses the longer array, so such a field needs a protocol version, see `docs/protocol.md`).
//! The compact forms of some messages (`messages::ends_on_wire`, the journal's task ends) are
//! built from these definitions' parts where they are used.

use kestrel_core::files::Transfers;
use kestrel_core::{
    After, Counts, Failure, Finished, FunctionSpec, IdRanges, IdRun, IndexRun, JobId, JobSpec,
    Keep, LineList, Placement, PolicyName, PythonEnv, Resources, RunEnd, Sink, Started, TaskDeps,
    TaskFiles, TaskId, TaskIndex, TaskKind, TaskRef, TaskSet, TaskState, TaskTemplate, MAX_NAMED,
};
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// [`Sink`]: `"Null"`, `{"File": path}` or `{"Stream": [limit]}`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Sink")]
pub enum SinkDef {
    Null,
    File(String),
    Stream { limit: u32 },
}

/// [`Resources`]: `[cpus, gpus, mem]`. The scheduler's numbering of named resources never
/// travels (the names do, beside it), and comes back as zeros.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Resources")]
pub struct ResourcesDef {
    pub cpus: u32,
    pub gpus: u32,
    #[serde(default)]
    pub mem: u64,
    #[serde(skip)]
    pub named: [u32; MAX_NAMED],
}

/// [`TaskTemplate`]: `[argv, env, cwd, stdout, stderr, timeout_ms, files?, function?]`.
/// Decoded by the derived [`TaskTemplateFields`]; encoded by hand, as [`JobSpecDef`] is:
/// `files` goes when the job declares a file or calls a function (version 8), `function`
/// (version 12) when it calls one, so that a command's template reads as in version 7.
pub struct TaskTemplateDef;

impl TaskTemplateDef {
    pub fn serialize<S: Serializer>(v: &TaskTemplate, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let function = v.kind.function();
        let trailing = if function.is_some() {
            2
        } else if !v.files.is_empty() {
            1
        } else {
            0
        };
        let mut st = s.serialize_struct("TaskTemplate", 6 + trailing)?;
        st.serialize_field("argv", &v.argv)?;
        st.serialize_field("env", &v.env)?;
        st.serialize_field("cwd", &v.cwd)?;
        st.serialize_field("stdout", &SinkRef(&v.stdout))?;
        st.serialize_field("stderr", &SinkRef(&v.stderr))?;
        st.serialize_field("timeout_ms", &v.timeout_ms)?;
        if trailing >= 1 {
            st.serialize_field("files", &TaskFilesRef(&v.files))?;
        }
        if let Some(f) = function {
            st.serialize_field("function", &FunctionRef(f))?;
        }
        st.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TaskTemplate, D::Error> {
        TaskTemplateFields::deserialize(d)
    }
}

#[derive(Deserialize)]
#[serde(remote = "TaskTemplate")]
struct TaskTemplateFields {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    #[serde(with = "SinkDef")]
    stdout: Sink,
    #[serde(with = "SinkDef")]
    stderr: Sink,
    timeout_ms: Option<u64>,
    #[serde(default, with = "TaskFilesDef")]
    files: TaskFiles,
    #[serde(default, deserialize_with = "task_kind::deserialize")]
    kind: TaskKind,
}

struct SinkRef<'a>(&'a Sink);
impl Serialize for SinkRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        SinkDef::serialize(self.0, s)
    }
}

struct TaskFilesRef<'a>(&'a TaskFiles);
impl Serialize for TaskFilesRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TaskFilesDef::serialize(self.0, s)
    }
}

/// [`FunctionSpec`]: `[name, pickled (bin), [python, cloudpickle, modules], path,
/// inline_limit]` (version 12).
#[derive(Serialize, Deserialize)]
#[serde(remote = "FunctionSpec")]
pub struct FunctionSpecDef {
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub pickled: Vec<u8>,
    #[serde(with = "PythonEnvDef")]
    pub env: PythonEnv,
    pub path: Vec<String>,
    pub inline_limit: u32,
}

/// [`PythonEnv`]: `[python, cloudpickle, modules]`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "PythonEnv")]
pub struct PythonEnvDef {
    pub python: String,
    pub cloudpickle: String,
    pub modules: Vec<(String, String)>,
}

struct FunctionRef<'a>(&'a FunctionSpec);
impl Serialize for FunctionRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        FunctionSpecDef::serialize(self.0, s)
    }
}

/// [`TaskKind`] as the template's trailing `function`: present for a function, absent (or
/// nil) for a command.
mod task_kind {
    use super::*;

    #[derive(Deserialize)]
    struct Function(#[serde(with = "FunctionSpecDef")] FunctionSpec);

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TaskKind, D::Error> {
        Ok(match Option::<Function>::deserialize(d)? {
            Some(Function(f)) => TaskKind::Function(Box::new(f)),
            None => TaskKind::Command,
        })
    }
}

/// [`TaskFiles`]: `[inputs, outputs, statics, keep?, replicas?]` (version 8; `keep` and
/// `replicas` version 9). Decoded by the derived [`TaskFilesFields`]; encoded by hand, as
/// [`JobSpecDef`] is: `keep` goes when some output has a mode or there are replicas (then as
/// `auto` for each output if none was given), `replicas` when there is more than one copy.
pub struct TaskFilesDef;

impl TaskFilesDef {
    pub fn serialize<S: Serializer>(v: &TaskFiles, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let trailing = if v.replicas > 1 {
            2
        } else if !v.keep.is_empty() {
            1
        } else {
            0
        };
        let mut st = s.serialize_struct("TaskFiles", 3 + trailing)?;
        st.serialize_field("inputs", &v.inputs)?;
        st.serialize_field("outputs", &v.outputs)?;
        st.serialize_field("statics", &v.statics)?;
        if trailing >= 1 {
            let auto;
            let keep = if v.keep.is_empty() {
                auto = vec![Keep::Auto; v.outputs.len()];
                &auto
            } else {
                &v.keep
            };
            st.serialize_field("keep", &KeepList(keep))?;
        }
        if trailing >= 2 {
            st.serialize_field("replicas", &v.replicas)?;
        }
        st.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TaskFiles, D::Error> {
        TaskFilesFields::deserialize(d)
    }
}

#[derive(Deserialize)]
#[serde(remote = "TaskFiles")]
struct TaskFilesFields {
    inputs: Vec<String>,
    #[serde(default)]
    outputs: Vec<String>,
    #[serde(default)]
    statics: Vec<String>,
    #[serde(default, with = "keep_list")]
    keep: Vec<Keep>,
    #[serde(default)]
    replicas: u8,
}

struct KeepList<'a>(&'a [Keep]);
impl Serialize for KeepList<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        keep_list::serialize(self.0, s)
    }
}

/// `Vec<Keep>` as `[0 auto | 1 local | 2 persist, ...]`.
mod keep_list {
    use super::Keep;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[Keep], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|k| match k {
            Keep::Auto => 0u8,
            Keep::Local => 1,
            Keep::Persist => 2,
        }))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Keep>, D::Error> {
        Vec::<u8>::deserialize(d)?
            .into_iter()
            .map(|k| match k {
                0 => Ok(Keep::Auto),
                1 => Ok(Keep::Local),
                2 => Ok(Keep::Persist),
                other => Err(serde::de::Error::custom(format!(
                    "output mode {other}: expected 0 (auto), 1 (local) or 2 (persist)"
                ))),
            })
            .collect()
    }
}

/// [`Transfers`]: `[local_files, local_bytes, peer_files, peer_bytes, store_files,
/// store_bytes]` (version 8).
#[derive(Serialize, Deserialize)]
#[serde(remote = "Transfers")]
pub struct TransfersDef {
    pub local_files: u64,
    pub local_bytes: u64,
    pub peer_files: u64,
    pub peer_bytes: u64,
    pub store_files: u64,
    pub store_bytes: u64,
}

/// [`PolicyName`]: its user-facing name, `"good-cache-compute"`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "PolicyName")]
pub enum PolicyNameDef {
    #[serde(rename = "first-available")]
    FirstAvailable,
    #[serde(rename = "first-cache-available")]
    FirstCacheAvailable,
    #[serde(rename = "max-cache-hit")]
    MaxCacheHit,
    #[serde(rename = "max-compute-util")]
    MaxComputeUtil,
    #[serde(rename = "good-cache-compute")]
    GoodCacheCompute,
}

/// [`Placement`]: `[store, policy, util_threshold_permille]` (version 8).
#[derive(Serialize, Deserialize)]
#[serde(remote = "Placement")]
pub struct PlacementDef {
    pub store: Option<String>,
    #[serde(default, with = "policy_option")]
    pub policy: Option<PolicyName>,
    #[serde(default)]
    pub util_threshold_permille: Option<u16>,
}

/// `Option<PolicyName>` as nil or the policy's name.
mod policy_option {
    use super::{PolicyName, PolicyNameDef};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Named(#[serde(with = "PolicyNameDef")] PolicyName);

    pub fn serialize<S: Serializer>(v: &Option<PolicyName>, s: S) -> Result<S::Ok, S::Error> {
        v.map(Named).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PolicyName>, D::Error> {
        Ok(Option::<Named>::deserialize(d)?.map(|n| n.0))
    }
}

/// [`JobSpec`]: `[name, template, resources, priority, retries, named, placement?, after?,
/// parent?, nodes?, deps?, task_ids?]`. Decoded by the derived [`JobSpecFields`]; encoded by hand,
/// because a field may be left out only when every field after it is too (the array is
/// positional).
pub struct JobSpecDef;

impl JobSpecDef {
    pub fn serialize<S: Serializer>(v: &JobSpec, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // How many of the trailing, optional fields go: each up to the last one present.
        let trailing = if v.task_ids.is_some() {
            6
        } else if !v.deps.is_empty() {
            5
        } else if v.nodes > 0 {
            4
        } else if v.parent.is_some() {
            3
        } else if !v.after.is_empty() {
            2
        } else if !v.placement.is_default() {
            1
        } else {
            0
        };
        let mut st = s.serialize_struct("JobSpec", 6 + trailing)?;
        st.serialize_field("name", &v.name)?;
        st.serialize_field("template", &Ref(&v.template))?;
        st.serialize_field("resources", &ResourcesRef(&v.resources))?;
        st.serialize_field("priority", &v.priority)?;
        st.serialize_field("retries", &v.retries)?;
        st.serialize_field("named", &v.named)?;
        if trailing >= 1 {
            st.serialize_field("placement", &PlacementRef(&v.placement))?;
        }
        if trailing >= 2 {
            st.serialize_field("after", &AfterList(&v.after))?;
        }
        if trailing >= 3 {
            st.serialize_field("parent", &v.parent)?;
        }
        if trailing >= 4 {
            st.serialize_field("nodes", &v.nodes)?;
        }
        if trailing >= 5 {
            st.serialize_field("deps", &DepsList(&v.deps))?;
        }
        if trailing >= 6 {
            st.serialize_field("task_ids", &v.task_ids.as_ref().map(Ref))?;
        }
        st.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<JobSpec, D::Error> {
        JobSpecFields::deserialize(d)
    }
}

struct ResourcesRef<'a>(&'a Resources);
impl Serialize for ResourcesRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ResourcesDef::serialize(self.0, s)
    }
}

struct PlacementRef<'a>(&'a Placement);
impl Serialize for PlacementRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        PlacementDef::serialize(self.0, s)
    }
}

/// [`After`]: `[job, tasks]`, `tasks` nil for the whole job (version 9).
#[derive(Serialize, Deserialize)]
#[serde(remote = "After")]
struct AfterDef {
    job: JobId,
    #[serde(with = "option")]
    tasks: Option<IdRanges>,
}

struct AfterList<'a>(&'a [After]);
impl Serialize for AfterList<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct One<'a>(&'a After);
        impl Serialize for One<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                AfterDef::serialize(self.0, s)
            }
        }
        s.collect_seq(self.0.iter().map(One))
    }
}

mod after_list {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<After>, D::Error> {
        #[derive(Deserialize)]
        struct One(#[serde(with = "AfterDef")] After);
        Ok(Vec::<One>::deserialize(d)?
            .into_iter()
            .map(|o| o.0)
            .collect())
    }
}

/// [`TaskRef`]: `[job or nil, task]` (version 11).
#[derive(Serialize, Deserialize)]
#[serde(remote = "TaskRef")]
struct TaskRefDef {
    job: Option<JobId>,
    task: TaskId,
}

/// [`TaskDeps`]: `[task, [TaskRef, ...]]` (version 11).
#[derive(Serialize, Deserialize)]
#[serde(remote = "TaskDeps")]
struct TaskDepsDef {
    task: TaskId,
    #[serde(with = "task_refs")]
    on: Vec<TaskRef>,
}

mod task_refs {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct One(#[serde(with = "TaskRefDef")] TaskRef);

    pub fn serialize<S: Serializer>(v: &[TaskRef], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|r| One(*r)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<TaskRef>, D::Error> {
        Ok(Vec::<One>::deserialize(d)?
            .into_iter()
            .map(|o| o.0)
            .collect())
    }
}

struct DepsList<'a>(&'a [TaskDeps]);
impl Serialize for DepsList<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct One<'a>(&'a TaskDeps);
        impl Serialize for One<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                TaskDepsDef::serialize(self.0, s)
            }
        }
        s.collect_seq(self.0.iter().map(One))
    }
}

mod deps_list {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<TaskDeps>, D::Error> {
        #[derive(Deserialize)]
        struct One(#[serde(with = "TaskDepsDef")] TaskDeps);
        Ok(Vec::<One>::deserialize(d)?
            .into_iter()
            .map(|o| o.0)
            .collect())
    }
}

/// The fields of [`JobSpecDef`], decoded.
#[derive(Deserialize)]
#[serde(remote = "JobSpec")]
struct JobSpecFields {
    pub name: String,
    #[serde(with = "TaskTemplateDef")]
    pub template: TaskTemplate,
    #[serde(with = "ResourcesDef")]
    pub resources: Resources,
    pub priority: i32,
    pub retries: u32,
    #[serde(default)]
    pub named: Vec<(String, u32)>,
    /// Left out when it takes everything from the server and nothing follows (version 8).
    #[serde(default, with = "PlacementDef")]
    pub placement: Placement,
    /// Version 9.
    #[serde(default, deserialize_with = "after_list::deserialize")]
    pub after: Vec<After>,
    /// Version 9.
    #[serde(default)]
    pub parent: Option<(JobId, u32)>,
    /// Version 11.
    #[serde(default)]
    pub nodes: u32,
    /// Version 11.
    #[serde(default, deserialize_with = "deps_list::deserialize")]
    pub deps: Vec<TaskDeps>,
    /// Version 11.
    #[serde(default, with = "option")]
    pub task_ids: Option<IdRanges>,
}

/// [`TaskSet`]: `{"Array": runs}`, `{"List": [argv, ...]}` or `{"Lines": [line, ...]}`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "TaskSet")]
pub enum TaskSetDef {
    Array(#[serde(with = "IdRangesDef")] IdRanges),
    List(Vec<Vec<String>>),
    Lines(#[serde(with = "line_list")] LineList),
}

/// [`TaskState`]: its name, `"Ready"` … `"Canceled"`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "TaskState")]
pub enum TaskStateDef {
    Ready,
    Assigned,
    Running,
    Finished,
    Failed,
    Canceled,
    /// Version 9.
    Waiting,
}

/// [`RunEnd`]: `"S"`, `{"F": failure}` or `"C"`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "RunEnd")]
pub enum RunEndDef {
    // One-letter names: a worker reports one ending per task, so "Success" cost 8 of a
    // report's ~31 bytes. The full names are still read (journals written before).
    #[serde(rename = "S", alias = "Success")]
    Success,
    #[serde(rename = "F", alias = "Failed")]
    Failed(#[serde(with = "boxed_failure")] Box<Failure>),
    #[serde(rename = "C", alias = "Canceled")]
    Canceled,
}

/// [`Failure`]: `[exit_code, signal, reason, stderr_tail, permanent?]`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Failure")]
pub struct FailureDef {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: String,
    pub stderr_tail: String,
    /// Version 8; absent when false (nearly always), so older readers see four fields.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permanent: bool,
}

/// [`Finished`] in full, `[job, index, started_us, finished_us, end]`: the journal's form.
/// Workers report ends more compactly (see `messages`).
#[derive(Serialize, Deserialize)]
#[serde(remote = "Finished")]
pub struct FinishedDef {
    pub job: JobId,
    pub index: TaskIndex,
    pub started_us: u64,
    pub finished_us: u64,
    #[serde(with = "RunEndDef")]
    pub end: RunEnd,
}

/// [`Started`]: `[job, index, at_us]`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Started")]
pub struct StartedDef {
    pub job: JobId,
    pub index: TaskIndex,
    pub at_us: u64,
}

/// [`IndexRun`]: `[job, first, count]`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "IndexRun")]
pub struct IndexRunDef {
    pub job: JobId,
    pub first: TaskIndex,
    pub count: u32,
}

/// [`Counts`]: `[ready, assigned, running, finished, failed, canceled]`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Counts")]
pub struct CountsDef {
    pub ready: u32,
    pub assigned: u32,
    pub running: u32,
    pub finished: u32,
    pub failed: u32,
    pub canceled: u32,
    /// Version 9; absent when none waits.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waiting: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A core type that has its wire form here: its remote definition's two functions, so that
/// one generic [`Ref`], [`Own`], [`option`] and [`vec`] serve every such type (serde's `with`
/// names the encoding of a field's whole type, so a wrapped core type needs one of those).
pub trait Wire: Sized {
    /// Encodes the value in its wire form.
    fn encode<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error>;
    /// Decodes a value from its wire form.
    fn decode<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

macro_rules! wire {
    ($($ty:ty => $def:ty),* $(,)?) => {$(
        impl Wire for $ty {
            fn encode<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                <$def>::serialize(self, s)
            }
            fn decode<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <$def>::deserialize(d)
            }
        }
    )*};
}

// The core types that travel wrapped (in an `Option`, a `Vec`, a tuple) or on their own.
wire!(
    JobSpec => JobSpecDef,
    TaskTemplate => TaskTemplateDef,
    TaskState => TaskStateDef,
    Started => StartedDef,
    RunEnd => RunEndDef,
    Finished => FinishedDef,
    IdRanges => IdRangesDef,
);

/// Encodes a core value in its wire form, where it is not a field of its own (in a tuple, an
/// `Option`, or a message by itself).
pub struct Ref<'a, T>(pub &'a T);

impl<T: Wire> Serialize for Ref<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.encode(s)
    }
}

/// Decodes a core value from its wire form, as [`Ref`] encodes it. Transparent, so that a
/// `Vec<Own<T>>` becomes a `Vec<T>` in place.
#[repr(transparent)]
pub struct Own<T>(pub T);

impl<'de, T: Wire> Deserialize<'de> for Own<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Own<T>, D::Error> {
        T::decode(d).map(Own)
    }
}

/// `Option<T>` of a core type: `#[serde(with = "wire::option")]`.
pub mod option {
    use super::*;

    pub fn serialize<T: Wire, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().map(Ref).serialize(s)
    }

    pub fn deserialize<'de, T: Wire, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
        Ok(Option::<Own<T>>::deserialize(d)?.map(|Own(v)| v))
    }
}

/// `Vec<T>` of a core type: `#[serde(with = "wire::vec")]`.
pub mod vec {
    use super::*;

    pub fn serialize<T: Wire, S: Serializer>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(Ref))
    }

    pub fn deserialize<'de, T: Wire, D: Deserializer<'de>>(d: D) -> Result<Vec<T>, D::Error> {
        // Collected in place: `Own<T>` is laid out as `T`.
        Ok(Vec::<Own<T>>::deserialize(d)?
            .into_iter()
            .map(|Own(v)| v)
            .collect())
    }
}

/// `Box<T>` of a core type: `#[serde(with = "wire::boxed")]` (a big field kept out of line,
/// so that a message enum stays small).
pub mod boxed {
    use super::*;

    // serde hands a `with` module a reference to the field's own type.
    #[allow(clippy::borrowed_box)]
    pub fn serialize<T: Wire, S: Serializer>(v: &Box<T>, s: S) -> Result<S::Ok, S::Error> {
        v.encode(s)
    }

    pub fn deserialize<'de, T: Wire, D: Deserializer<'de>>(d: D) -> Result<Box<T>, D::Error> {
        T::decode(d).map(Box::new)
    }
}

/// `Box<Failure>`, as [`RunEnd::Failed`] holds it.
mod boxed_failure {
    use super::*;

    pub fn serialize<S: Serializer>(v: &Failure, s: S) -> Result<S::Ok, S::Error> {
        FailureDef::serialize(v, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Box<Failure>, D::Error> {
        FailureDef::deserialize(d).map(Box::new)
    }
}

/// [`IdRanges`]: its runs as `[[first, count, step], ...]`, in the order stored. Decoding
/// checks them and rebuilds the index ([`IdRanges::try_from`]), keeping their order so that a
/// journal written before ids were merged replays with its tasks' indices intact.
pub struct IdRangesDef;

/// One run of an [`IdRanges`], `[first, count, step]`; a struct (not a tuple) so that, as
/// before core lost its serde, a run written as a map by another encoder is read too.
#[derive(Serialize, Deserialize)]
struct IdRunWire {
    first: u32,
    count: u32,
    step: u32,
}

impl IdRangesDef {
    pub fn serialize<S: Serializer>(r: &IdRanges, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(r.runs().iter().map(|run| {
            let (first, count, step) = run.parts();
            IdRunWire { first, count, step }
        }))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<IdRanges, D::Error> {
        let runs = Vec::<IdRunWire>::deserialize(d)?
            .into_iter()
            .map(|r| IdRun::new(r.first, r.count, r.step))
            .collect::<Vec<_>>();
        IdRanges::try_from(runs).map_err(serde::de::Error::custom)
    }
}

/// [`LineList`]: a plain list of strings, each decoded straight onto the end of the list's one
/// buffer (no `String` per line: a million-line job is a million short strings).
pub mod line_list {
    use super::*;

    pub fn serialize<S: Serializer>(l: &LineList, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(l.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LineList, D::Error> {
        d.deserialize_seq(ListVisitor)
    }

    struct ListVisitor;

    impl<'de> Visitor<'de> for ListVisitor {
        type Value = LineList;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of strings")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LineList, A::Error> {
            let mut list = LineList::new();
            // The size hint comes from the input: a cap keeps a lying one from reserving
            // gigabytes.
            list.reserve(seq.size_hint().unwrap_or(0).min(1 << 16));
            while seq.next_element_seed(PushLine(&mut list))?.is_some() {}
            Ok(list)
        }
    }

    /// Decodes one string straight onto the end of a list, without a `String` of its own.
    struct PushLine<'a>(&'a mut LineList);

    impl<'de> DeserializeSeed<'de> for PushLine<'_> {
        type Value = ();

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_str(self)
        }
    }

    impl<'de> Visitor<'de> for PushLine<'_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
            self.0.push(v);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Lines(#[serde(with = "line_list")] LineList);

    #[test]
    fn a_line_list_is_a_list_of_strings_on_the_wire() {
        let l = Lines(["one", "twö", ""].into_iter().collect());
        let bytes = rmp_serde::to_vec(&l).unwrap();
        let plain = vec!["one".to_string(), "twö".into(), "".into()];
        assert_eq!(bytes, rmp_serde::to_vec(&plain).unwrap());
        assert_eq!(rmp_serde::from_slice::<Lines>(&bytes).unwrap(), l);
        assert!(rmp_serde::from_slice::<Lines>(&rmp_serde::to_vec(&[1, 2]).unwrap()).is_err());
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Ids(#[serde(with = "IdRangesDef")] IdRanges);

    #[test]
    fn id_ranges_are_checked_on_arrival() {
        let ids = Ids(IdRanges::parse("1-5,9,20-30:5").unwrap());
        let bytes = rmp_serde::to_vec(&ids).unwrap();
        let triples = vec![(1u32, 5u32, 1u32), (9, 1, 1), (20, 3, 5)];
        assert_eq!(bytes, rmp_serde::to_vec(&triples).unwrap());
        assert_eq!(rmp_serde::from_slice::<Ids>(&bytes).unwrap(), ids);
        let zero_step = rmp_serde::to_vec(&vec![(1u32, 5u32, 0u32)]).unwrap();
        let err = rmp_serde::from_slice::<Ids>(&zero_step).unwrap_err();
        assert!(err.to_string().contains("step"), "{err}");
        let too_many = rmp_serde::to_vec(&vec![(u32::MAX, 2u32, 1u32)]).unwrap();
        assert!(rmp_serde::from_slice::<Ids>(&too_many).is_err());
        // Runs as maps, from an encoder that names fields, are read as before.
        let named = rmp_serde::to_vec_named(&vec![IdRunWire {
            first: 1,
            count: 5,
            step: 1,
        }])
        .unwrap();
        let ids = rmp_serde::from_slice::<Ids>(&named).unwrap();
        assert_eq!(ids.0, IdRanges::parse("1-5").unwrap());
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Files(#[serde(with = "TaskFilesDef")] TaskFiles);

    #[test]
    fn replicas_travel_even_when_no_output_mode_was_given() {
        let files = Files(TaskFiles {
            outputs: vec!["mid/{task}".into()],
            replicas: 2,
            ..TaskFiles::default()
        });
        let bytes = rmp_serde::to_vec(&files).unwrap();
        let back = rmp_serde::from_slice::<Files>(&bytes).unwrap().0;
        assert_eq!(back.replicas, 2);
        assert_eq!(back.keep, vec![Keep::Auto]);
        // Without modes or replicas, the version-8 form: three fields.
        let plain = Files(TaskFiles {
            outputs: vec!["out".into()],
            ..TaskFiles::default()
        });
        let three = (Vec::<String>::new(), vec!["out"], Vec::<String>::new());
        assert_eq!(
            rmp_serde::to_vec(&plain).unwrap(),
            rmp_serde::to_vec(&three).unwrap()
        );
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Template(#[serde(with = "TaskTemplateDef")] TaskTemplate);

    #[test]
    fn a_function_travels_after_the_files_and_a_command_reads_as_before() {
        let function = FunctionSpec {
            name: "sweep.simulate".into(),
            pickled: vec![0x80, 0x05, 0x95, 0x00, b'.'],
            env: PythonEnv {
                python: "3.11.7".into(),
                cloudpickle: "3.1.1".into(),
                modules: vec![("numpy".into(), "2.1.0".into())],
            },
            path: vec!["/home/me/project".into()],
            inline_limit: 1 << 20,
        };
        let t = Template(TaskTemplate {
            kind: TaskKind::Function(Box::new(function)),
            ..TaskTemplate::default()
        });
        let bytes = rmp_serde::to_vec(&t).unwrap();
        assert_eq!(rmp_serde::from_slice::<Template>(&bytes).unwrap(), t);
        // The pickle is MessagePack binary, not an array of numbers.
        assert!(bytes
            .windows(6)
            .any(|w| w == [0xc4, 5, 0x80, 0x05, 0x95, 0x00]));
        // A function without files still sends the (empty) files, so positions hold.
        let array_len = bytes[0] & 0x0f;
        assert_eq!((bytes[0] & 0xf0, array_len), (0x90, 8));
        // A command's template is the six fields of version 7, and reads back as a command.
        let plain = Template(TaskTemplate {
            argv: vec!["true".into()],
            ..TaskTemplate::default()
        });
        let bytes = rmp_serde::to_vec(&plain).unwrap();
        assert_eq!(bytes[0], 0x96);
        assert_eq!(rmp_serde::from_slice::<Template>(&bytes).unwrap(), plain);
    }
}
