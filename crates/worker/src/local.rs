//! The worker's own bookkeeping: job templates, the local queue of assigned tasks, free slots
//! and GPUs, and turning an assignment into a [`Launch`].
//!
//! Pure data; the session loop in `session.rs` drives it.

use crate::cache::is_plain_name;
use crate::exec::{Launch, NodeFile, RemoveIfEmpty, Sink as ExecSink};
use crate::executor::Body;
use crate::files::FilesPlan;
use crate::gpu::Gpu;
use crate::runner::{Call, FunctionDef};
use crate::store::Store;
use kestrel_core::files::cached_name;
use kestrel_core::placeholders::{
    names_one_task, per_task, resolve, shared_file, substitute, uses, Values, JOB,
};
use kestrel_core::{JobId, Resources, Sink, TaskIndex, TaskTemplate};
use kestrel_proto::messages::{Assigned, JobIds, Node};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How far past the head of the queue [`Local::prefer_staged`] looks for a task whose inputs
/// are here: the queue holds the worker's prefetch window, rarely more than this.
pub const LOOK_AHEAD: usize = 64;

/// A task waiting on this worker for a free slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalTask {
    pub job: JobId,
    pub index: TaskIndex,
    /// When its assignment arrived (microseconds since the Unix epoch): the time until it
    /// starts is its wait for a slot.
    pub arrived_us: u64,
    /// What the task has of its own beside its job's template; `None` for the tasks of
    /// arrays, the bulk. Boxed so that those stay small and drop with one check: with the
    /// parts inline, the drop of every task was a call (5% of a noop worker's instructions).
    pub own: Option<Box<OwnParts>>,
}

/// The parts of a [`LocalTask`] that are its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnParts {
    /// Own argv (list jobs); `None` uses the job template's.
    pub argv: Option<Vec<String>>,
    /// Own line (jobs of lines), for `{line}` in the template.
    pub line: Option<String>,
    /// The workers of a multi-node task, this one first; empty for any other task.
    pub nodes: Vec<Node>,
}

impl LocalTask {
    /// A task with nothing of its own: its job's template says everything.
    pub fn of_template(job: JobId, index: TaskIndex, arrived_us: u64) -> LocalTask {
        LocalTask {
            job,
            index,
            arrived_us,
            own: None,
        }
    }

    /// Its own argv, if it has one.
    pub fn argv(&self) -> Option<&[String]> {
        self.own.as_ref()?.argv.as_deref()
    }

    /// Its own line, if it has one.
    pub fn line(&self) -> Option<&str> {
        self.own.as_ref()?.line.as_deref()
    }

    /// The workers of a multi-node task; empty for any other task.
    pub fn nodes(&self) -> &[Node] {
        self.own.as_ref().map_or(&[], |o| &o.nodes)
    }
}

/// A job as this worker knows it.
#[derive(Debug)]
pub struct JobDef {
    pub template: TaskTemplate,
    /// The store its files are in, if it declares files.
    pub store: Option<Store>,
    /// What the cache names that store's files by, before their names.
    pub cache_prefix: String,
    pub ids: JobIds,
    pub resources: Resources,
    /// Named resources each task holds.
    pub named: Vec<(String, u32)>,
    /// How the files of stdout and stderr are written, decided once for the job.
    files: [FileRule; 2],
    /// Its function as runners are sent it, if its tasks call one.
    function: Option<Arc<FunctionDef>>,
}

/// How a task writes a file sink, decided from its path once per job, so that no task pays
/// for looking at the path again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileRule {
    /// One file per task, created or truncated, kept.
    Plain,
    /// One file per task that no other task of any job writes: removed if left empty.
    Own,
    /// One file for several tasks: each adds its output whole when it ends.
    Shared,
}

impl FileRule {
    /// The rule for a sink of a job in `cwd`, of more than one task if `many`.
    fn of(cwd: Option<&str>, sink: &Sink, many: bool) -> FileRule {
        let Sink::File(path) = sink else {
            return FileRule::Plain;
        };
        if many && shared_file(cwd, path) {
            FileRule::Shared
        } else if names_one_task(path) {
            FileRule::Own
        } else {
            FileRule::Plain
        }
    }
}

impl JobDef {
    /// The directories made for the outputs of job `job` that a task may have left empty:
    /// those of its own files (removed when empty) whose directory names the job and no task
    /// (`job-{job}/{task}.err`). When the job has ended, the worker removes those it finds
    /// empty (`rmdir` leaves any other), so that a job whose tasks wrote nothing there leaves
    /// no empty `job-N/` behind; one call per job, nothing per task.
    pub fn output_dirs(&self, job: JobId) -> Vec<PathBuf> {
        let t = &self.template;
        let job_s = job.to_string();
        let values = Values {
            job: &job_s,
            task: "",
            line: None,
        };
        let mut dirs: Vec<PathBuf> = Vec::new();
        for (sink, rule) in [&t.stdout, &t.stderr].into_iter().zip(self.files) {
            let Sink::File(path) = sink else { continue };
            let dir = Path::new(path)
                .parent()
                .and_then(Path::to_str)
                .unwrap_or("");
            let cwd_per_task =
                Path::new(dir).is_relative() && t.cwd.as_deref().is_some_and(|c| per_task(None, c));
            if rule != FileRule::Own || !uses(dir, JOB) || per_task(None, dir) || cwd_per_task {
                continue;
            }
            let cwd = t
                .cwd
                .as_deref()
                .map(|c| PathBuf::from(substitute(c, &values).as_ref()));
            let dir = resolve(cwd.as_deref(), &substitute(dir, &values));
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        dirs
    }

    /// What `{job}` and `{task}` stand for in `task` of this job.
    fn ids_of(&self, task: &LocalTask) -> (String, String) {
        let id = match &self.ids {
            JobIds::Array(r) => r.id_at(task.index).unwrap_or(task.index),
            JobIds::List => task.index,
        };
        (task.job.to_string(), id.to_string())
    }
}

/// What a started task holds here, given back when it ends. Kept with the task because its
/// job's definition may be forgotten first (a `ForgetJob` while a duplicate run goes on).
#[derive(Debug, Default)]
pub struct Held {
    pub cpus: u32,
    /// The GPUs it got, by number.
    pub gpus: Vec<u32>,
    pub mem: u64,
    pub named: Vec<(String, u32)>,
}

/// Values substituted into placeholders and the task environment.
#[derive(Debug, Clone)]
pub struct Identity {
    pub worker: u32,
    /// `host:port` of the server, for `KESTREL_SERVER`.
    pub server: String,
    /// The server directory, for `KESTREL_SERVER_DIR`, so a task can submit tasks.
    pub server_dir: Option<String>,
    /// The tag of the server's values ([`kestrel_core::values::server_tag`]), in the names
    /// of the results this worker keeps.
    pub values_tag: String,
}

/// Templates, queued tasks and free resources of one worker.
#[derive(Debug)]
pub struct Local {
    pub jobs: FxHashMap<JobId, JobDef>,
    pub queue: VecDeque<LocalTask>,
    free_cpus: u32,
    /// The worker's GPUs; a task holds some of them by their positions here.
    gpus: Vec<Gpu>,
    free_gpus: Vec<u32>,
    free_mem: u64,
    free_named: Vec<(String, u32)>,
}

impl Local {
    /// A worker's bookkeeping with these `slots`, GPUs, memory (bytes) and named resources.
    pub fn new(slots: u32, gpus: &[Gpu], mem: u64, named: &[(String, u32)]) -> Local {
        Local {
            jobs: FxHashMap::default(),
            queue: VecDeque::new(),
            free_cpus: slots,
            gpus: gpus.to_vec(),
            free_gpus: (0..gpus.len() as u32).collect(),
            free_mem: mem,
            free_named: named.to_vec(),
        }
    }

    pub fn define(
        &mut self,
        job: JobId,
        template: TaskTemplate,
        ids: JobIds,
        resources: Resources,
        named: Vec<(String, u32)>,
        store: Option<String>,
    ) {
        let many = match &ids {
            JobIds::Array(r) => r.len() > 1,
            // Lines may be added to a list later.
            JobIds::List => true,
        };
        let cwd = template.cwd.as_deref();
        let files = [
            FileRule::of(cwd, &template.stdout, many),
            FileRule::of(cwd, &template.stderr, many),
        ];
        let function = template.kind.function().map(|f| {
            let mut env = template.env.clone();
            env.push(("KESTREL_JOB_ID".into(), job.to_string()));
            Arc::new(FunctionDef::new(job, f, &env))
        });
        self.jobs.insert(
            job,
            JobDef {
                files,
                function,
                template,
                cache_prefix: cached_name(store.as_deref(), ""),
                store: store.as_deref().map(Store::parse),
                ids,
                resources,
                named,
            },
        );
    }

    /// Queues an assigned run of tasks in order; it arrived at `now_us`.
    pub fn enqueue(&mut self, mut a: Assigned, now_us: u64) {
        let r = a.run;
        let task = |index, own: OwnParts| LocalTask {
            own: Some(Box::new(own)),
            ..LocalTask::of_template(r.job, index, now_us)
        };
        if !a.nodes.is_empty() {
            // A multi-node task comes alone in its run.
            let own = OwnParts {
                argv: a.argvs.pop(),
                line: a.lines.get(0).map(str::to_string),
                nodes: a.nodes,
            };
            self.queue.push_back(task(r.first, own));
        } else if !a.argvs.is_empty() {
            self.queue
                .extend(a.argvs.into_iter().zip(r.first..).map(|(argv, index)| {
                    let own = OwnParts {
                        argv: Some(argv),
                        ..OwnParts::default()
                    };
                    task(index, own)
                }));
        } else if !a.lines.is_empty() {
            self.queue
                .extend(a.lines.iter().zip(r.first..).map(|(line, index)| {
                    let own = OwnParts {
                        line: Some(line.to_string()),
                        ..OwnParts::default()
                    };
                    task(index, own)
                }));
        } else {
            self.queue.extend(
                (r.first..r.first + r.count)
                    .map(|index| LocalTask::of_template(r.job, index, now_us)),
            );
        }
    }

    /// When the task at the head of the queue reads files whose fetch ahead (`crate::prefetch`)
    /// `fetched` says has not ended, moves to the head the first of the next
    /// [`LOOK_AHEAD`] tasks with the same needs that waits for no fetch: the next free slot
    /// runs that one instead of waiting for the head's transfer, and the head keeps its place
    /// right behind it. A head that reads no files costs one lookup. With `for_slot`, only when
    /// what the head needs is free (a task passed forward needs the same, so with no room no
    /// scan helps); without, for the deck, which waits for a slot anyway. Returns whether a
    /// task was moved.
    pub fn prefer_staged(
        &mut self,
        for_slot: bool,
        mut fetched: impl FnMut((JobId, TaskIndex)) -> bool,
    ) -> bool {
        let Some(head) = self.queue.front() else {
            return false;
        };
        let Some(def) = self.jobs.get(&head.job) else {
            return false;
        };
        if def.template.files.is_empty() {
            return false;
        }
        let (resources, named) = (def.resources, &def.named);
        if (for_slot && !self.room_for(&resources, named)) || fetched((head.job, head.index)) {
            return false;
        }
        let jobs = &self.jobs;
        let ready = |t: &LocalTask| {
            jobs.get(&t.job).is_some_and(|d| {
                d.resources == resources
                    && d.named == *named
                    && (d.template.files.is_empty() || fetched((t.job, t.index)))
            })
        };
        let found = self.queue.iter().take(LOOK_AHEAD).skip(1).position(ready);
        match found.and_then(|i| self.queue.remove(i + 1)) {
            Some(task) => {
                self.queue.push_front(task);
                true
            }
            None => false,
        }
    }

    /// Whether `need` and `named` are free now.
    #[inline(always)]
    fn room_for(&self, need: &Resources, named: &[(String, u32)]) -> bool {
        need.cpus <= self.free_cpus
            && need.gpus as usize <= self.free_gpus.len()
            && need.mem <= self.free_mem
            && named.iter().all(|(name, n)| {
                self.free_named
                    .iter()
                    .any(|(have, free)| have == name && free >= n)
            })
    }

    /// Takes the next queued task if what it needs is free; returns it with what it holds.
    /// (Always inlined: it runs once per task, and the call cost as much as its body; with
    /// two callers, the executors' loops, a plain `#[inline]` no longer got it inlined.)
    #[inline(always)]
    pub fn next_startable(&mut self) -> Option<(LocalTask, Held)> {
        let head = self.queue.front()?;
        let (need, named) = match self.jobs.get(&head.job) {
            Some(d) => (d.resources, d.named.as_slice()),
            None => (Resources::default(), &[][..]),
        };
        if !self.room_for(&need, named) {
            return None;
        }
        // Most tasks hold no named resource: nothing more to take.
        if !named.is_empty() {
            for (name, n) in named {
                if let Some((_, f)) = self.free_named.iter_mut().find(|(have, _)| have == name) {
                    *f -= n;
                }
            }
        }
        self.free_cpus -= need.cpus;
        self.free_mem -= need.mem;
        let gpus = if need.gpus == 0 {
            Vec::new()
        } else {
            self.free_gpus
                .split_off(self.free_gpus.len() - need.gpus as usize)
        };
        let held = Held {
            cpus: need.cpus,
            gpus,
            mem: need.mem,
            named: if named.is_empty() {
                Vec::new()
            } else {
                named.to_vec()
            },
        };
        self.queue.pop_front().map(|t| (t, held))
    }

    /// Gives back what a task held.
    #[inline]
    pub fn release(&mut self, held: Held) {
        self.free_cpus += held.cpus;
        self.free_mem += held.mem;
        if !held.gpus.is_empty() {
            self.free_gpus.extend(held.gpus);
        }
        if held.named.is_empty() {
            return;
        }
        for (name, n) in held.named {
            if let Some((_, free)) = self.free_named.iter_mut().find(|(have, _)| *have == name) {
                *free += n;
            }
        }
    }

    /// Removes queued tasks among `tasks`; returns the ones removed.
    pub fn unqueue(&mut self, tasks: &[(JobId, TaskIndex)]) -> Vec<(JobId, TaskIndex)> {
        let mut removed = Vec::new();
        self.queue.retain(|t| {
            let hit = tasks.contains(&(t.job, t.index));
            if hit {
                removed.push((t.job, t.index));
            }
            !hit
        });
        removed
    }

    /// Job `job`'s definition; a task of a job never defined here cannot start.
    fn defined(&self, job: JobId) -> Result<&JobDef, String> {
        self.jobs
            .get(&job)
            .ok_or_else(|| format!("job {job} was never defined on this worker"))
    }

    /// What a task runs: a call of its job's function, or its launch (see [`Self::launch`]);
    /// with its files' plan.
    pub(crate) fn body(
        &self,
        task: &LocalTask,
        gpus: &[u32],
        me: &Identity,
    ) -> Result<(Body, Option<Box<FilesPlan>>), String> {
        let def = self.defined(task.job)?;
        let Some(function) = &def.function else {
            // One lookup of the job per task, not two: this is every command's path.
            let (launch, files) = self.launch_of(def, task, gpus, me);
            return Ok((Body::Process(launch), files));
        };
        let line = task.line().ok_or_else(|| {
            format!(
                "task {} of function {} came without its arguments",
                task.index, function.name
            )
        })?;
        let limit = |s: &Sink| match s {
            Sink::Stream { limit } => Some(*limit),
            _ => None,
        };
        let t = &def.template;
        let call = Call {
            function: function.clone(),
            task_id: task.index,
            line: line.to_string(),
            timeout: t.timeout_ms.map(Duration::from_millis),
            result_limit: limit(&t.stdout),
            output_limit: limit(&t.stderr),
            value: kestrel_core::values::result_name(&me.values_tag, task.job, task.index),
        };
        let (job_s, id_s) = def.ids_of(task);
        let values = Values {
            job: &job_s,
            task: &id_s,
            line: Some(line),
        };
        let cwd = t
            .cwd
            .as_deref()
            .map(|c| PathBuf::from(substitute(c, &values).into_owned()));
        Ok((Body::Call(call), files_plan(def, &values, cwd.as_deref())))
    }

    /// Builds the launch of a task (placeholders substituted, environment set) and, if its
    /// job declares files, their plan (names with placeholders replaced, the store, the
    /// directory it writes its outputs in).
    pub fn launch(
        &self,
        task: &LocalTask,
        gpus: &[u32],
        me: &Identity,
    ) -> Result<(Launch, Option<Box<FilesPlan>>), String> {
        let def = self.defined(task.job)?;
        Ok(self.launch_of(def, task, gpus, me))
    }

    /// [`Self::launch`] of a task of the job `def` defines.
    fn launch_of(
        &self,
        def: &JobDef,
        task: &LocalTask,
        gpus: &[u32],
        me: &Identity,
    ) -> (Launch, Option<Box<FilesPlan>>) {
        let t = &def.template;
        let (job_s, id_s) = def.ids_of(task);
        let values = Values {
            job: &job_s,
            task: &id_s,
            line: task.line(),
        };
        let sub = |s: &str| substitute(s, &values).into_owned();
        let argv: Vec<String> = match task.argv() {
            Some(a) => a.iter().map(|s| sub(s)).collect(),
            None => t.argv.iter().map(|s| sub(s)).collect(),
        };
        let cwd = t.cwd.as_deref().map(|c| PathBuf::from(sub(c)));
        let sink = |s: &Sink, rule| match (s, rule) {
            (Sink::Null, _) => ExecSink::Null,
            (Sink::File(p), FileRule::Shared) => ExecSink::Shared(resolve(cwd.as_deref(), &sub(p))),
            (Sink::File(p), _) => ExecSink::File(resolve(cwd.as_deref(), &sub(p))),
            (Sink::Stream { limit }, _) => ExecSink::Capture(*limit),
        };
        let mut env = Vec::with_capacity(t.env.len() + 6);
        env.push(("KESTREL_JOB_ID".to_string(), job_s.clone()));
        env.push(("KESTREL_TASK_ID".to_string(), id_s.clone()));
        env.push(("KESTREL_WORKER_ID".to_string(), me.worker.to_string()));
        env.push(("KESTREL_SERVER".to_string(), me.server.clone()));
        if let Some(d) = &me.server_dir {
            env.push(("KESTREL_SERVER_DIR".to_string(), d.clone()));
        }
        if !gpus.is_empty() {
            let held: Vec<&Gpu> = gpus
                .iter()
                .filter_map(|&i| self.gpus.get(i as usize))
                .collect();
            crate::gpu::task_env(&held, &mut env);
        }
        let node_file = (!task.nodes().is_empty()).then(|| node_env(task, &mut env));
        env.extend(t.env.iter().map(|(k, v)| (k.clone(), sub(v))));
        let files = files_plan(def, &values, cwd.as_deref());
        let launch = Launch {
            argv,
            env,
            stdout: sink(&t.stdout, def.files[0]),
            stderr: sink(&t.stderr, def.files[1]),
            cwd,
            timeout: t.timeout_ms.map(Duration::from_millis),
            remove_if_empty: RemoveIfEmpty {
                stdout: def.files[0] == FileRule::Own,
                stderr: def.files[1] == FileRule::Own,
            },
            node_file,
        };
        (launch, files)
    }
}

/// What a multi-node task is told of its workers (as HyperQueue's `HQ_NODE_FILE` and
/// `HQ_NUM_NODES`): `KESTREL_NODE_LIST` (host names, comma-separated, this worker's first),
/// `KESTREL_NUM_NODES`, `KESTREL_NODE_WORKERS` (their worker ids, in the same order: host
/// names alone cannot tell apart two workers of one machine) and `KESTREL_NODE_FILE`, the
/// host file `mpirun --hostfile` takes (one host per line), written in the temporary
/// directory before the task starts and removed when it ends.
fn node_env(task: &LocalTask, env: &mut Vec<(String, String)>) -> NodeFile {
    let hosts: Vec<&str> = task.nodes().iter().map(|n| n.host.as_str()).collect();
    let ids: Vec<String> = task.nodes().iter().map(|n| n.worker.to_string()).collect();
    let path = std::env::temp_dir().join(format!(
        "kestrel-nodes-{}-{}.{}",
        std::process::id(),
        task.job,
        task.index
    ));
    env.push(("KESTREL_NODE_LIST".to_string(), hosts.join(",")));
    env.push(("KESTREL_NUM_NODES".to_string(), hosts.len().to_string()));
    env.push(("KESTREL_NODE_WORKERS".to_string(), ids.join(",")));
    env.push(("KESTREL_NODE_FILE".to_string(), path.display().to_string()));
    let mut text = hosts.join("\n");
    text.push('\n');
    NodeFile { path, text }
}

impl Local {
    /// The files plan of `task`, if its job declares files (for staging its inputs before it
    /// launches; see `WorkerFiles::prefetch`).
    pub fn files_plan(&self, task: &LocalTask) -> Option<Box<FilesPlan>> {
        let def = self.jobs.get(&task.job)?;
        if def.template.files.is_empty() {
            return None;
        }
        let (job_s, id_s) = def.ids_of(task);
        let values = Values {
            job: &job_s,
            task: &id_s,
            line: task.line(),
        };
        let cwd = def
            .template
            .cwd
            .as_deref()
            .map(|c| PathBuf::from(substitute(c, &values).into_owned()));
        files_plan(def, &values, cwd.as_deref())
    }
}

/// The files of a task of job `def` whose placeholders stand for `values`, running in `cwd`.
fn files_plan(def: &JobDef, values: &Values, cwd: Option<&Path>) -> Option<Box<FilesPlan>> {
    let f = &def.template.files;
    if f.is_empty() {
        return None;
    }
    let sub = |s: &str| substitute(s, values).into_owned();
    let inputs: Vec<String> = f.inputs.iter().chain(&f.statics).map(|n| sub(n)).collect();
    let outputs: Vec<String> = f.outputs.iter().map(|n| sub(n)).collect();
    // Checked again with the placeholders replaced: a line such as `../x` must not make a
    // name that leaves the store, the cache or the task's directory.
    let bad_name = inputs
        .iter()
        .chain(&outputs)
        .find(|n| !is_plain_name(n))
        .cloned();
    Some(Box::new(FilesPlan {
        store: def.store.clone(),
        cache_prefix: def.cache_prefix.clone(),
        inputs,
        statics: f.statics.len(),
        local: (0..outputs.len())
            .map(|i| f.keep_of(i) == kestrel_core::Keep::Local)
            .collect(),
        outputs,
        sandbox: cwd.map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        bad_name,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::{IdRanges, IndexRun};
    use std::path::Path;

    fn template() -> TaskTemplate {
        TaskTemplate {
            argv: vec![
                "sim".into(),
                "--seed".into(),
                "{task}".into(),
                "j{job}".into(),
            ],
            env: vec![("OUT".into(), "out-{task}".into())],
            cwd: Some("/data/run-{job}".into()),
            stdout: Sink::File("logs/{task}.out".into()),
            stderr: Sink::Null,
            timeout_ms: Some(1500),
            files: Default::default(),
            kind: Default::default(),
        }
    }

    fn me() -> Identity {
        Identity {
            worker: 7,
            server: "h:1".into(),
            server_dir: None,
            values_tag: "ab".into(),
        }
    }

    #[test]
    fn a_multinode_task_is_told_its_nodes_and_gets_a_host_file() {
        let mut l = Local::new(2, &[], 0, &[]);
        let ids = JobIds::Array(IdRanges::parse("10-20:5").unwrap());
        l.define(3, template(), ids, Resources::default(), vec![], None);
        let mut a = Assigned::run(IndexRun {
            job: 3,
            first: 1,
            count: 1,
        });
        let node = |worker, host: &str| Node {
            worker,
            host: host.into(),
        };
        a.nodes = vec![node(7, "cn01"), node(2, "cn02"), node(9, "cn02")];
        l.enqueue(a, 0);
        let (t, _) = l.next_startable().unwrap();
        let launch = l.launch(&t, &[], &me()).unwrap().0;
        let env: FxHashMap<_, _> = launch.env.into_iter().collect();
        assert_eq!(env["KESTREL_NODE_LIST"], "cn01,cn02,cn02");
        assert_eq!(env["KESTREL_NUM_NODES"], "3");
        assert_eq!(env["KESTREL_NODE_WORKERS"], "7,2,9");
        assert_eq!(env["KESTREL_TASK_ID"], "15");
        let file = launch.node_file.expect("a host file");
        assert_eq!(env["KESTREL_NODE_FILE"], file.path.display().to_string());
        assert_eq!(file.text, "cn01\ncn02\ncn02\n");
        // Any other task has none.
        l.enqueue(
            Assigned::run(IndexRun {
                job: 3,
                first: 2,
                count: 1,
            }),
            0,
        );
        let (t, _) = l.next_startable().unwrap();
        let launch = l.launch(&t, &[], &me()).unwrap().0;
        assert!(launch.node_file.is_none());
        assert!(launch
            .env
            .iter()
            .all(|(k, _)| !k.starts_with("KESTREL_NODE")));
    }

    #[test]
    fn placeholders_and_environment() {
        let mut l = Local::new(2, &[], 0, &[]);
        l.define(
            3,
            template(),
            JobIds::Array(IdRanges::parse("10-20:5").unwrap()),
            Resources::default(),
            vec![],
            None,
        );
        let t = LocalTask::of_template(3, 2, 0);
        let launch = l.launch(&t, &[], &me()).unwrap().0;
        assert_eq!(launch.argv, vec!["sim", "--seed", "20", "j3"]);
        assert_eq!(launch.cwd.as_deref(), Some(Path::new("/data/run-3")));
        assert_eq!(
            launch.stdout,
            ExecSink::File("/data/run-3/logs/20.out".into())
        );
        assert_eq!(launch.timeout, Some(Duration::from_millis(1500)));
        // `{task}` in the path but not `{job}`: another job's task may write it too.
        assert_eq!(launch.remove_if_empty, RemoveIfEmpty::default());
        let env: FxHashMap<_, _> = launch.env.into_iter().collect();
        assert_eq!(env["KESTREL_TASK_ID"], "20");
        assert_eq!(env["KESTREL_JOB_ID"], "3");
        assert_eq!(env["KESTREL_WORKER_ID"], "7");
        assert_eq!(env["OUT"], "out-20");
    }

    #[test]
    fn how_each_file_is_written_is_decided_once_per_job() {
        let rule =
            |cwd: Option<&str>, p: &str, many| FileRule::of(cwd, &Sink::File(p.into()), many);
        assert_eq!(rule(None, "job-{job}/{task}.err", true), FileRule::Own);
        assert_eq!(rule(None, "out/{task}.txt", true), FileRule::Plain);
        assert_eq!(rule(None, "job-{job}/${task}.err", true), FileRule::Shared);
        // Several tasks write these: each adds its output whole.
        assert_eq!(rule(None, "all.txt", true), FileRule::Shared);
        assert_eq!(rule(None, "by-{line:1}.txt", true), FileRule::Shared);
        assert_eq!(
            rule(Some("/r/{job}"), "/abs/{job}.log", true),
            FileRule::Shared
        );
        // Unless the job has one task, the directory is the task's, or the file a device.
        assert_eq!(rule(None, "all.txt", false), FileRule::Plain);
        assert_eq!(rule(Some("/r/{task}"), "all.txt", true), FileRule::Plain);
        assert_eq!(rule(None, "/dev/stdout", true), FileRule::Plain);
        assert_eq!(FileRule::of(None, &Sink::Null, true), FileRule::Plain);
    }

    #[test]
    fn a_shared_file_goes_to_the_executor_as_such_and_job_dirs_are_named() {
        let mut l = Local::new(1, &[], 0, &[]);
        let mut t = template();
        t.stdout = Sink::File("all-{job}.txt".into());
        t.stderr = Sink::File("job-{job}/{task}.err".into());
        l.define(
            5,
            t.clone(),
            JobIds::Array(IdRanges::parse("1-3").unwrap()),
            Resources::default(),
            vec![],
            None,
        );
        l.enqueue(
            Assigned::run(IndexRun {
                job: 5,
                first: 0,
                count: 1,
            }),
            0,
        );
        let (task, _) = l.next_startable().unwrap();
        let launch = l.launch(&task, &[], &me()).unwrap().0;
        assert_eq!(
            launch.stdout,
            ExecSink::Shared("/data/run-5/all-5.txt".into())
        );
        assert_eq!(
            launch.stderr,
            ExecSink::File("/data/run-5/job-5/1.err".into())
        );
        assert_eq!(
            launch.remove_if_empty,
            RemoveIfEmpty {
                stdout: false,
                stderr: true
            }
        );
        assert_eq!(
            l.jobs[&5].output_dirs(5),
            vec![PathBuf::from("/data/run-5/job-5")]
        );
        // A directory of the task's own, or one that does not name the job, is left alone.
        t.stderr = Sink::File("job-{job}/{task}/{job}-{task}.err".into());
        l.define(
            6,
            t.clone(),
            JobIds::List,
            Resources::default(),
            vec![],
            None,
        );
        assert!(l.jobs[&6].output_dirs(6).is_empty());
        t.stderr = Sink::File("logs/{job}-{task}.err".into());
        l.define(7, t, JobIds::List, Resources::default(), vec![], None);
        assert!(l.jobs[&7].output_dirs(7).is_empty());
    }

    #[test]
    fn a_task_whose_inputs_are_here_starts_before_a_head_still_fetching() {
        let mut l = Local::new(2, &[], 0, &[]);
        let mut reads = template();
        reads.files.inputs = vec!["raw/{task}".into()];
        let two = Resources {
            cpus: 2,
            ..Resources::NONE
        };
        l.define(
            1,
            reads.clone(),
            JobIds::List,
            Resources::default(),
            vec![],
            None,
        );
        l.define(2, reads, JobIds::List, two, vec![], None);
        let run = |job, first, count| Assigned::run(IndexRun { job, first, count });
        // Job 1's tasks 0 and 1, a task of another shape, job 1's task 2, job 1's task 3.
        l.enqueue(run(1, 0, 2), 0);
        l.enqueue(run(2, 0, 1), 0);
        l.enqueue(run(1, 2, 2), 0);
        let order = |l: &Local| -> Vec<(JobId, TaskIndex)> {
            l.queue.iter().map(|t| (t.job, t.index)).collect()
        };
        // Every fetch under way: nothing moves.
        l.prefer_staged(false, |_| false);
        assert_eq!(order(&l), [(1, 0), (1, 1), (2, 0), (1, 2), (1, 3)]);
        // The head's fetch ended: it stays the head.
        l.prefer_staged(false, |k| k == (1, 0) || k == (1, 3));
        assert_eq!(order(&l), [(1, 0), (1, 1), (2, 0), (1, 2), (1, 3)]);
        // For a slot, only when what the head needs is free: with no cpu free, nothing moves.
        l.free_cpus = 0;
        assert!(!l.prefer_staged(true, |k| k == (1, 2)));
        assert_eq!(order(&l), [(1, 0), (1, 1), (2, 0), (1, 2), (1, 3)]);
        l.free_cpus = 2;
        // Job 2's task (other needs) is passed over: the first of the same needs comes first,
        // and the head keeps its place behind it.
        l.prefer_staged(false, |k| k == (2, 0) || k == (1, 2) || k == (1, 3));
        assert_eq!(order(&l), [(1, 2), (1, 0), (1, 1), (2, 0), (1, 3)]);
        // A head that reads no files is never moved for one that does.
        let mut plain = Local::new(2, &[], 0, &[]);
        plain.define(
            3,
            template(),
            JobIds::List,
            Resources::default(),
            vec![],
            None,
        );
        plain.enqueue(run(3, 0, 3), 0);
        plain.prefer_staged(false, |_| false);
        assert_eq!(order(&plain), [(3, 0), (3, 1), (3, 2)]);
    }

    #[test]
    fn slots_and_gpus_limit_what_starts() {
        let mut l = Local::new(2, &Gpu::numbered(1), 0, &[]);
        let need = Resources {
            cpus: 1,
            gpus: 1,
            ..Resources::NONE
        };
        l.define(1, template(), JobIds::List, need, vec![], None);
        l.enqueue(
            Assigned {
                run: IndexRun {
                    job: 1,
                    first: 0,
                    count: 2,
                },
                argvs: vec![vec!["a".into()], vec!["b".into()]],
                lines: Default::default(),
                nodes: vec![],
            },
            0,
        );
        let (t, held) = l.next_startable().unwrap();
        assert_eq!((t.index, held.gpus.clone()), (0, vec![0]));
        assert!(l.next_startable().is_none(), "the only GPU is taken");
        let launch = l.launch(&t, &held.gpus, &me()).unwrap().0;
        assert_eq!(launch.argv, vec!["a"]);
        assert!(launch
            .env
            .contains(&("CUDA_VISIBLE_DEVICES".into(), "0".into())));
        l.release(held);
        assert_eq!(l.next_startable().unwrap().0.index, 1);
    }

    #[test]
    fn memory_and_named_resources_limit_what_starts() {
        let mut l = Local::new(8, &[], 3 << 30, &[("licenses".into(), 3)]);
        let need = Resources {
            cpus: 1,
            mem: 1 << 30,
            ..Resources::NONE
        };
        l.define(
            1,
            template(),
            JobIds::List,
            need,
            vec![("licenses".into(), 2)],
            None,
        );
        l.define(2, template(), JobIds::List, need, vec![], None);
        let run = |job, count| Assigned {
            run: IndexRun {
                job,
                first: 0,
                count,
            },
            argvs: vec![vec!["x".into()]; count as usize],
            lines: Default::default(),
            nodes: vec![],
        };
        l.enqueue(run(1, 2), 0);
        l.enqueue(run(2, 3), 0);
        let (_, a) = l.next_startable().unwrap();
        assert!(
            l.next_startable().is_none(),
            "one license is left, a task needs 2"
        );
        l.release(a);
        let (_, b) = l.next_startable().unwrap();
        let (_, c) = l.next_startable().unwrap();
        let (_, d) = l.next_startable().unwrap();
        assert!(l.next_startable().is_none(), "3 GiB of memory are taken");
        l.release(b);
        assert!(l.next_startable().is_some());
        drop((c, d));
    }

    #[test]
    fn canceled_tasks_leave_the_queue() {
        let mut l = Local::new(1, &[], 0, &[]);
        l.enqueue(
            Assigned::run(IndexRun {
                job: 1,
                first: 0,
                count: 3,
            }),
            0,
        );
        assert_eq!(l.unqueue(&[(1, 1), (2, 0)]), vec![(1, 1)]);
        assert_eq!(l.queue.len(), 2);
    }

    #[test]
    fn a_line_goes_into_the_command_paths_and_environment() {
        let mut l = Local::new(1, &[], 0, &[]);
        let mut t = template();
        t.argv = vec!["sha1sum".into(), "{line}".into()];
        t.stdout = Sink::File("sums/{line}.sha".into());
        t.stderr = Sink::File("${line}/{task}.err".into());
        t.env = vec![("IN".into(), "{line}-{job}".into())];
        l.define(4, t, JobIds::List, Resources::default(), vec![], None);
        l.enqueue(
            Assigned {
                run: IndexRun {
                    job: 4,
                    first: 7,
                    count: 2,
                },
                argvs: vec![],
                lines: ["a.dat", "b {task}.dat"].into_iter().collect(),
                nodes: vec![],
            },
            0,
        );
        let (first, held) = l.next_startable().unwrap();
        let launch = l.launch(&first, &[], &me()).unwrap().0;
        assert_eq!(launch.argv, vec!["sha1sum", "a.dat"]);
        assert_eq!(
            launch.stdout,
            ExecSink::File("/data/run-4/sums/a.dat.sha".into())
        );
        // `${line}` is the shell's, not a placeholder.
        assert_eq!(
            launch.stderr,
            ExecSink::File("/data/run-4/${line}/7.err".into())
        );
        assert!(launch.env.contains(&("IN".into(), "a.dat-4".into())));
        l.release(held);
        let (second, _) = l.next_startable().unwrap();
        let launch = l.launch(&second, &[], &me()).unwrap().0;
        // A line is put in as it is, never read for placeholders itself.
        assert_eq!(launch.argv, vec!["sha1sum", "b {task}.dat"]);
    }
}
