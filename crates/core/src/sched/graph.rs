//! Task graphs: dependencies inferred from files and given explicitly, intermediate files and
//! their cleanup (AME's task and file states, §3 of `ame-sc08`).
//!
//! A task that reads a logical file another task writes waits (`Waiting`) until that task has
//! finished; a job with `after` waits until the tasks it names have. Each waiting task counts
//! the producers it still waits for; a producer's success counts each of its waiters down and
//! makes those at zero ready, so a release costs a lookup per waiter, never a scan. A producer
//! that fails for good (or is canceled) cancels its waiters, each with the reason, and theirs
//! after them.
//!
//! Jobs joined by a dependency or by a parent (a task that submitted a job) make one
//! *workflow*; an output kept `local` stays in the caches that hold it until the last job of its
//! workflow has ended, and is then deleted from them ([`Command::DropFiles`]): by then no task
//! that could still be submitted into the workflow can read it.
//!
//! Everything here is derived from submissions and task ends, so a replayed journal rebuilds
//! it: nothing of it is journaled.

use super::diffusion::store_of;
use super::{Job, SchedError, Scheduler};
use crate::files::{cached_name, FileId};
use crate::outcome::{Command, Failure};
use crate::placeholders::try_each_name;
use crate::queue::Span;
use crate::spec::{JobId, Keep, TaskIndex, TaskState};
use rustc_hash::{FxHashMap, FxHashSet};

mod deps;
mod lineage;
mod relink;
mod view;

use deps::Why;

pub use view::WorkflowGraph;

/// How long a workflow's local files outlive its last job (see [`Graph::ending`]).
pub const DROP_GRACE_US: u64 = 2_000_000;

/// A task, by its job and index.
pub type TaskKey = (JobId, TaskIndex);

/// What waits on a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiter {
    /// A task that reads this file the producer writes.
    Reader(TaskKey, FileId),
    /// A job whose `after` names the producer.
    Gate(JobId),
    /// A task whose `deps` name the producer.
    Task(TaskKey),
}

impl Waiter {
    /// The task that waits, if a task does (not a whole job).
    fn waiting_task(&self) -> Option<TaskKey> {
        match *self {
            Waiter::Reader(t, _) | Waiter::Task(t) => Some(t),
            Waiter::Gate(_) => None,
        }
    }
}

/// The graph's state, beside the scheduler's.
#[derive(Debug, Default)]
pub(super) struct Graph {
    /// File → the task that writes it.
    produced: FxHashMap<FileId, TaskKey>,
    /// Producer task → what waits for it to finish.
    waiters: FxHashMap<TaskKey, Vec<Waiter>>,
    /// Job → jobs whose `after` names all of it.
    job_waiters: FxHashMap<JobId, Vec<JobId>>,
    /// Workflows: a union-find forest over jobs (a job absent is its own root).
    up: FxHashMap<JobId, JobId>,
    /// Jobs of each workflow (by its root) that have not ended.
    live: FxHashMap<JobId, u32>,
    /// Jobs counted in `live`: those linked, and those a linked job joined while they ran (a
    /// job is outside every graph until another names it in its `after` or as its parent).
    members: FxHashSet<JobId>,
    /// Local outputs of each workflow, deleted when it ends.
    locals: FxHashMap<JobId, Vec<FileId>>,
    /// Workflows that have ended, by root, with when their local outputs are deleted: a
    /// moment later ([`DROP_GRACE_US`]), so the next job of a job file, submitted just after a
    /// fast writer's job ended, still finds them (it joins the workflow again).
    ending: FxHashMap<JobId, u64>,
    /// Tasks being run again to make outputs lost with their workers, with those outputs.
    remaking: FxHashMap<TaskKey, Vec<FileId>>,
    /// How many times each task has been run again for lost outputs.
    remade: FxHashMap<TaskKey, u8>,
    /// Copies of intermediate files deleted from caches, and their bytes.
    pub freed_files: u64,
    pub freed_bytes: u64,
    /// Tasks run again to make lost intermediate files (lineage).
    pub reruns: u64,
}

impl Graph {
    fn root(&self, mut job: JobId) -> JobId {
        while let Some(&up) = self.up.get(&job) {
            job = up;
        }
        job
    }

    /// Joins the workflows of `a` and `b`.
    fn join(&mut self, a: JobId, b: JobId) {
        let (ra, rb) = (self.root(a), self.root(b));
        if ra == rb {
            return;
        }
        // The smaller id stays the root: workflows grow from their first job.
        let (keep, gone) = if ra < rb { (ra, rb) } else { (rb, ra) };
        self.up.insert(gone, keep);
        let n = self.live.remove(&gone).unwrap_or(0);
        *self.live.entry(keep).or_default() += n;
        if let Some(files) = self.locals.remove(&gone) {
            self.locals.entry(keep).or_default().extend(files);
        }
    }
}

/// What a submission adds to the graph, worked out before anything is changed.
struct Links {
    /// Whether the job takes part in a graph at all (nothing below is set otherwise).
    inside: bool,
    /// Each task's outputs, numbered (`outputs per task` each).
    outputs: Vec<FileId>,
    /// (reader index, producer, file) for inputs whose producer has not finished.
    reads: Vec<(TaskIndex, TaskKey, FileId)>,
    /// (waiting index, producer) for `deps` whose producer has not finished.
    task_waits: Vec<(TaskIndex, TaskKey)>,
    /// How many `after` tasks or jobs have not finished.
    gate: u32,
    /// Waits to register: on a task, or on a whole job.
    gate_tasks: Vec<TaskKey>,
    gate_jobs: Vec<JobId>,
    /// The parent task, by index.
    parent: Option<TaskKey>,
    /// Jobs of the same workflow.
    joined: Vec<JobId>,
    /// Each output pattern's mode.
    keep: Vec<Keep>,
    /// (reader index, writer, file) for inputs whose writer finished but whose every copy is
    /// lost (local intermediates, values): the writer runs again, the reader waits for it.
    lost_reads: Vec<(TaskIndex, TaskKey, FileId)>,
}

/// `name` without its store's key (`KEY/raw/1` → `raw/1`), for messages.
fn plain(name: &str) -> &str {
    name.split_once('/').map_or(name, |(_, n)| n)
}

impl Scheduler {
    /// The user-visible name of a task: `J:T`.
    fn task_name(&self, (job, index): TaskKey) -> String {
        let id = self.jobs.get(&job).map_or(index, |j| j.task_id(index));
        format!("{job}:{id}")
    }

    fn file_name(&self, file: FileId) -> String {
        self.files.name(file).map(plain).unwrap_or("?").to_string()
    }

    /// Links newly inserted job `id` into the graph: checks its `after`, its parent and its
    /// files against the jobs known (two writers of a file, a cycle, a producer that failed),
    /// and on success registers it, leaving its tasks that must wait `Waiting`. On an error
    /// nothing has changed.
    pub(super) fn link_graph(&mut self, id: JobId) -> Result<(), SchedError> {
        let mut links = self.plan_links(id)?;
        let lost = std::mem::take(&mut links.lost_reads);
        self.commit_links(id, links);
        for (index, writer, file) in lost {
            self.remake_for((id, index), file, writer);
        }
        Ok(())
    }

    /// Whether a job takes part in no graph at all (the common case, checked cheaply).
    fn outside_graph(&self, j: &Job) -> bool {
        j.spec.after.is_empty()
            && j.spec.parent.is_none()
            && j.spec.deps.is_empty()
            && j.spec.template.files.outputs.is_empty()
            && (self.graph.produced.is_empty() || j.inputs.is_empty())
    }

    fn plan_links(&mut self, id: JobId) -> Result<Links, SchedError> {
        let mut links = Links {
            inside: false,
            outputs: Vec::new(),
            reads: Vec::new(),
            task_waits: Vec::new(),
            gate: 0,
            gate_tasks: Vec::new(),
            gate_jobs: Vec::new(),
            parent: None,
            joined: Vec::new(),
            keep: Vec::new(),
            lost_reads: Vec::new(),
        };
        let Some(j) = self.jobs.get(&id) else {
            return Ok(links);
        };
        if self.outside_graph(j) {
            return Ok(links);
        }
        links.inside = true;
        let graph_err = |s: String| Err(SchedError::Graph(s));
        // The parent: a task of a job that has not ended.
        if let Some((pj, tid)) = j.spec.parent {
            let Some(p) = self.jobs.get(&pj) else {
                return graph_err(format!(
                    "the parent job {pj} (KESTREL_JOB) does not exist; `kestrel submit` inside a task adds to its own job while it runs"
                ));
            };
            if p.finished_us.is_some() {
                return graph_err(format!(
                    "the parent job {pj} (KESTREL_JOB) has ended; a task can add jobs to its workflow only while it runs"
                ));
            }
            let Some(index) = p.index_of(tid) else {
                return graph_err(format!("job {pj} has no task {tid} (KESTREL_TASK)"));
            };
            links.parent = Some((pj, index));
            links.joined.push(pj);
        }
        // Explicit dependencies.
        for a in &j.spec.after {
            let Some(dep) = self.jobs.get(&a.job).filter(|_| a.job != id) else {
                return graph_err(format!(
                    "--after {a}: job {} does not exist; `kestrel job list` shows the jobs",
                    a.job
                ));
            };
            links.joined.push(a.job);
            match &a.tasks {
                None => {
                    if dep.finished_us.is_some() {
                        if dep.counts.finished as u64 != u64::from(dep.len()) {
                            return graph_err(format!(
                                "--after {a}: job {} has ended with {} failed and {} canceled tasks, so this job could never start; `kestrel job retry {}` first",
                                a.job, dep.counts.failed, dep.counts.canceled, a.job
                            ));
                        }
                    } else {
                        links.gate += 1;
                        links.gate_jobs.push(a.job);
                    }
                }
                Some(ids) => {
                    for k in 0..ids.len() {
                        let Some(tid) = ids.id_at(k) else { continue };
                        let Some(index) = dep.index_of(tid) else {
                            return graph_err(format!(
                                "--after {a}: job {} has no task {tid}",
                                a.job
                            ));
                        };
                        match dep.record(index).state {
                            TaskState::Finished => {}
                            s if s.is_terminal() => {
                                return graph_err(format!(
                                "--after {a}: task {}:{tid} has {s}, so this job could never start",
                                a.job
                            ))
                            }
                            _ => {
                                links.gate += 1;
                                links.gate_tasks.push((a.job, index));
                            }
                        }
                    }
                }
            }
        }
        // Outputs: one writer per file.
        let outs = &j.spec.template.files.outputs;
        let store = store_of(&j.spec.placement, &self.config);
        let files = &mut self.files;
        let _ = try_each_name(
            &j.spec.ids_of(&j.tasks),
            &id.to_string(),
            0,
            outs,
            |_, _, name| {
                links.outputs.push(files.intern(&cached_name(store, &name)));
                Ok::<(), ()>(())
            },
        );
        let mut mine: FxHashMap<FileId, TaskIndex> = FxHashMap::default();
        for (i, &file) in links.outputs.iter().enumerate() {
            let index = (i / outs.len()) as TaskIndex;
            if let Some(&other) = mine.get(&file) {
                return graph_err(format!(
                    "tasks {} and {} both write {}; a file has one writer (put {{task}} in the output's name)",
                    self.task_name_of(j, other),
                    self.task_name_of(j, index),
                    self.file_name(file)
                ));
            }
            // A writer whose job has ended is replaced (a workflow run again); one still
            // live is a second writer.
            let live_writer = self.graph.produced.get(&file).filter(|by| {
                self.jobs
                    .get(&by.0)
                    .is_some_and(|pj| pj.finished_us.is_none())
            });
            if let Some(&by) = live_writer {
                return graph_err(format!(
                    "task {} would write {}, which task {} writes already; a file has one writer",
                    self.task_name_of(j, index),
                    self.file_name(file),
                    self.task_name(by)
                ));
            }
            mine.insert(file, index);
        }
        // Inputs: a file another task writes is waited for.
        let k = j.inputs_per_task();
        let mut inner: Vec<(TaskIndex, TaskIndex, FileId)> = Vec::new();
        if k > 0 && !(self.graph.produced.is_empty() && mine.is_empty()) {
            for index in 0..j.len() {
                for &file in j.inputs_of(index) {
                    if let Some(&writer) = mine.get(&file) {
                        if writer == index {
                            return graph_err(format!(
                                "task {} reads {}, which it writes itself",
                                self.task_name_of(j, index),
                                self.file_name(file)
                            ));
                        }
                        inner.push((index, writer, file));
                        continue;
                    }
                    let Some(&by) = self.graph.produced.get(&file) else {
                        continue;
                    };
                    links.joined.push(by.0);
                    let state = self.jobs.get(&by.0).map(|pj| pj.record(by.1).state);
                    match state {
                        Some(TaskState::Finished) => {
                            if self.files.holders(file).is_empty()
                                && self.is_local_output(by, file)
                            {
                                links.lost_reads.push((index, by, file));
                            }
                        }
                        Some(s) if s.is_terminal() => {
                            return graph_err(format!(
                                "task {} reads {}, but its writer, task {}, has {s}; `kestrel job retry {}` first",
                                self.task_name_of(j, index),
                                self.file_name(file),
                                self.task_name(by),
                                by.0
                            ))
                        }
                        _ => links.reads.push((index, by, file)),
                    }
                }
            }
        }
        // Tasks one task of the job waits for (`deps`).
        let mut edges: Vec<(TaskIndex, TaskIndex, Why)> = Vec::new();
        self.plan_task_deps(j, &mut links, &mut edges)?;
        if !inner.is_empty() || !edges.is_empty() {
            let deps = edges.len();
            edges.extend(inner.iter().map(|&(r, w, f)| (r, w, Why::File(f))));
            self.check_acyclic(j, &edges)?;
            links
                .reads
                .extend(inner.iter().map(|&(r, w, f)| (r, (id, w), f)));
            links
                .task_waits
                .extend(edges[..deps].iter().map(|&(r, w, _)| (r, (id, w))));
        }
        // Each output pattern's mode: auto is local when a task known now reads it.
        let files = &j.spec.template.files;
        let per = files.outputs.len();
        links.keep = (0..per)
            .map(|p| match files.keep_of(p) {
                Keep::Auto => {
                    let read = inner
                        .iter()
                        .any(|&(_, w, f)| links.outputs.get(w as usize * per + p) == Some(&f));
                    if read {
                        Keep::Local
                    } else {
                        Keep::Persist
                    }
                }
                keep => keep,
            })
            .collect();
        Ok(links)
    }

    /// Task `index` of `j`, the job being submitted, by its id alone: the job's number is not
    /// the user's until it is taken (a refused job's would be the next job's).
    fn task_name_of(&self, j: &Job, index: TaskIndex) -> String {
        j.task_id(index).to_string()
    }

    /// Refuses a job whose tasks wait for each other in a circle, naming the tasks and files.
    fn check_acyclic(
        &self,
        j: &Job,
        edges: &[(TaskIndex, TaskIndex, Why)],
    ) -> Result<(), SchedError> {
        // Kahn's algorithm over the tasks that take part: what is left has a cycle.
        let mut after: FxHashMap<TaskIndex, Vec<(TaskIndex, Why)>> = FxHashMap::default();
        let mut indegree: FxHashMap<TaskIndex, u32> = FxHashMap::default();
        for &(reader, writer, why) in edges {
            after.entry(writer).or_default().push((reader, why));
            *indegree.entry(reader).or_default() += 1;
            indegree.entry(writer).or_default();
        }
        let mut free: Vec<TaskIndex> = indegree
            .iter()
            .filter(|(_, &d)| d == 0)
            .map(|(&t, _)| t)
            .collect();
        while let Some(t) = free.pop() {
            for &(r, _) in after.get(&t).map(Vec::as_slice).unwrap_or(&[]) {
                let d = indegree.get_mut(&r).expect("counted");
                *d -= 1;
                if *d == 0 {
                    free.push(r);
                }
            }
            indegree.remove(&t);
        }
        let Some(&start) = indegree.keys().min() else {
            return Ok(());
        };
        // Walk back through writers that are left until a task repeats: that is a cycle.
        let writer_of: FxHashMap<TaskIndex, (TaskIndex, Why)> = edges
            .iter()
            .filter(|(r, w, _)| indegree.contains_key(r) && indegree.contains_key(w))
            .map(|&(r, w, f)| (r, (w, f)))
            .collect();
        let mut path = vec![start];
        let mut seen = FxHashSet::default();
        let mut t = start;
        while seen.insert(t) {
            let Some(&(w, _)) = writer_of.get(&t) else {
                break;
            };
            path.push(w);
            t = w;
        }
        let from = path.iter().position(|&x| x == t).unwrap_or(0);
        let cycle = &path[from..];
        let mut text = Vec::new();
        for pair in cycle.windows(2) {
            let (reader, writer) = (pair[0], pair[1]);
            let why = writer_of.get(&reader).map_or(Why::Dep, |&(_, w)| w);
            text.push(self.edge_text(j, reader, writer, why));
        }
        Err(SchedError::Graph(format!(
            "the job's tasks wait for each other in a cycle: {}",
            text.join(", ")
        )))
    }

    fn commit_links(&mut self, id: JobId, links: Links) {
        if !links.inside {
            return;
        }
        let Links {
            inside: _,
            outputs,
            reads,
            task_waits,
            gate,
            gate_tasks,
            gate_jobs,
            parent,
            joined,
            keep,
            lost_reads: _,
        } = links;
        self.enter_workflow(id, &joined);
        let per = keep.len().max(1);
        for (i, &file) in outputs.iter().enumerate() {
            self.graph
                .produced
                .insert(file, (id, (i / per) as TaskIndex));
            if keep.get(i % per) == Some(&Keep::Local) {
                let root = self.graph.root(id);
                self.graph.locals.entry(root).or_default().push(file);
            }
        }
        let mut unmet: FxHashMap<TaskIndex, u32> = FxHashMap::default();
        let waits = reads
            .iter()
            .map(|&(reader, by, file)| (reader, by, Waiter::Reader((id, reader), file)))
            .chain(
                task_waits
                    .iter()
                    .map(|&(reader, by)| (reader, by, Waiter::Task((id, reader)))),
            );
        for (reader, by, waiter) in waits {
            let w = self.graph.waiters.entry(by).or_default();
            // One wait per (reader, producer), however many of its files it reads.
            if !w.iter().any(|x| x.waiting_task() == Some((id, reader))) {
                w.push(waiter);
                *unmet.entry(reader).or_default() += 1;
            }
            if let Some(pj) = self.jobs.get_mut(&by.0) {
                pj.feeds = true;
            }
        }
        for &t in &gate_tasks {
            self.graph
                .waiters
                .entry(t)
                .or_default()
                .push(Waiter::Gate(id));
            if let Some(pj) = self.jobs.get_mut(&t.0) {
                pj.feeds = true;
            }
        }
        for &dep in &gate_jobs {
            self.graph.job_waiters.entry(dep).or_default().push(id);
        }
        if let Some((pj, _)) = parent {
            if let Some(p) = self.jobs.get_mut(&pj) {
                p.live_children += 1;
            }
        }
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        j.parent = parent;
        j.keep = keep;
        j.outputs = outputs;
        j.gate = gate;
        j.feeds |= !j.outputs.is_empty();
        let waiting: Vec<TaskIndex> = if gate > 0 {
            (0..j.len()).collect()
        } else {
            let mut w: Vec<TaskIndex> = unmet.keys().copied().collect();
            w.sort_unstable();
            w
        };
        for &i in &waiting {
            j.set_state(i, TaskState::Waiting);
        }
        j.unmet = unmet;
    }

    /// Makes `id` a live job of the workflows of `joined` (and so of one workflow with them).
    fn enter_workflow(&mut self, id: JobId, joined: &[JobId]) {
        if self.graph.members.insert(id) {
            let root = self.graph.root(id);
            *self.graph.live.entry(root).or_default() += 1;
        }
        for &other in joined {
            let Some(o) = self.jobs.get(&other) else {
                continue;
            };
            if o.finished_us.is_none() && self.graph.members.insert(other) {
                let root = self.graph.root(other);
                *self.graph.live.entry(root).or_default() += 1;
            }
            // A workflow that had ended but keeps its files a moment is live again.
            let root = self.graph.root(other);
            self.graph.ending.remove(&root);
            self.graph.join(id, other);
        }
    }

    /// Whether a job of `spec` submitted in pieces (`open`) waits for its last piece before
    /// any of its tasks may run: whether it may take part in a graph, whose links are known
    /// only with all its tasks (a task may read a file that a later piece writes). Decided
    /// from the spec alone, so a replayed journal decides the same, whatever files other
    /// jobs wrote meanwhile.
    pub fn holds_until_closed(&self, spec: &crate::spec::JobSpec, open: bool) -> bool {
        let files = &spec.template.files;
        open && !(spec.after.is_empty()
            && spec.parent.is_none()
            && spec.deps.is_empty()
            && files.outputs.is_empty()
            && files.inputs.is_empty())
    }

    /// Links newly inserted job `id` into the graph, or, if it is submitted in pieces and may
    /// take part in one, holds all its tasks until the last piece ([`Self::release_held`]).
    pub(super) fn link_or_hold(&mut self, id: JobId) -> Result<(), SchedError> {
        let Some(j) = self.jobs.get(&id) else {
            return Ok(());
        };
        if !self.holds_until_closed(&j.spec, j.open) {
            return self.link_graph(id);
        }
        // The workflows it will surely join stay live while its pieces come: a writer job
        // ending meanwhile must not have its files deleted before this job can read them.
        let mut joined: Vec<JobId> = j
            .spec
            .after
            .iter()
            .map(|a| a.job)
            .chain(j.spec.parent.map(|(pj, _)| pj))
            .filter(|&o| o != id)
            .collect();
        joined.extend(
            j.inputs
                .iter()
                .filter_map(|f| self.graph.produced.get(f).map(|by| by.0)),
        );
        joined.sort_unstable();
        joined.dedup();
        let Some(j) = self.jobs.get_mut(&id) else {
            return Ok(());
        };
        j.held = true;
        // Every task of a new job is ready: all are counted waiting instead.
        j.counts.waiting += std::mem::take(&mut j.counts.ready);
        self.enter_workflow(id, &joined);
        Ok(())
    }

    /// The last piece of held job `id` is in: its tasks stop waiting for it and it is linked
    /// as if submitted whole. On an error (what [`Self::link_graph`] refuses) nothing of it
    /// has changed: its tasks still wait.
    pub(super) fn release_held(&mut self, id: JobId) -> Result<(), SchedError> {
        let links = self.plan_links(id)?;
        let Some(j) = self.jobs.get_mut(&id) else {
            return Ok(());
        };
        // Its tasks are all stored ready: counted so again, then linked as a new job's are.
        j.held = false;
        j.counts.ready += std::mem::take(&mut j.counts.waiting);
        self.commit_links(id, links);
        Ok(())
    }

    /// The ready spans of a job just linked (its tasks not waiting), for the queue.
    pub(super) fn ready_spans(&self, id: JobId) -> Vec<Span> {
        let Some(j) = self.jobs.get(&id).filter(|j| !j.held) else {
            return Vec::new();
        };
        if j.counts.waiting == 0 {
            return vec![Span {
                job: id,
                next: 0,
                end: j.len(),
            }];
        }
        let mut spans: Vec<Span> = Vec::new();
        for i in 0..j.len() {
            if j.table.get(i).state != TaskState::Ready {
                continue;
            }
            match spans.last_mut() {
                Some(s) if s.end == i => s.end += 1,
                _ => spans.push(Span::one(id, i)),
            }
        }
        spans
    }

    /// A task finished successfully: what waited for it may go.
    pub(super) fn graph_task_finished(&mut self, job: JobId, index: TaskIndex) {
        if !self.graph.remaking.is_empty() {
            self.graph.remaking.remove(&(job, index));
        }
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        if j.spec.template.files.replicas > 1 {
            let outputs = self.outputs_of((job, index));
            self.replicate(&outputs);
        } else if !j.feeds {
            return;
        }
        let Some(waiters) = self.graph.waiters.remove(&(job, index)) else {
            return;
        };
        for w in waiters {
            match w {
                Waiter::Reader((rj, ri), _) | Waiter::Task((rj, ri)) => {
                    let Some(r) = self.jobs.get_mut(&rj) else {
                        continue;
                    };
                    let left = match r.unmet.get_mut(&ri) {
                        Some(n) => {
                            *n -= 1;
                            *n
                        }
                        None => continue,
                    };
                    if left == 0 {
                        r.unmet.remove(&ri);
                        if r.gate == 0 {
                            self.wake(rj, ri);
                        }
                    }
                }
                Waiter::Gate(gj) => self.open_gate(gj),
            }
        }
    }

    /// A `Waiting` task all of whose dependencies have finished: to the queue.
    fn wake(&mut self, job: JobId, index: TaskIndex) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.canceled || j.table.get(index).state != TaskState::Waiting {
            return;
        }
        j.set_state(index, TaskState::Ready);
        let priority = j.spec.priority;
        self.ready.push_new(priority, Span::one(job, index));
        if j.windowed {
            self.windowed_jobs.insert(job);
        }
    }

    /// One of a job's `after` dependencies finished; at the last, its tasks that wait for
    /// no file go to the queue.
    fn open_gate(&mut self, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.gate = j.gate.saturating_sub(1);
        if j.gate > 0 || j.canceled {
            return;
        }
        let mut spans: Vec<Span> = Vec::new();
        for i in 0..j.len() {
            if j.table.get(i).state != TaskState::Waiting || j.unmet.contains_key(&i) {
                continue;
            }
            j.set_state(i, TaskState::Ready);
            match spans.last_mut() {
                Some(s) if s.end == i => s.end += 1,
                _ => spans.push(Span::one(job, i)),
            }
        }
        let priority = j.spec.priority;
        for s in spans {
            self.ready.push_new(priority, s);
        }
    }

    /// A task ended for good without success (failed, canceled): what waits for it can never
    /// run and is canceled, with the reason, and so on down the graph.
    pub(super) fn graph_task_lost(&mut self, now_us: u64, job: JobId, index: TaskIndex) {
        self.graph_cascade(now_us, vec![(job, index)]);
    }

    /// [`Self::graph_task_lost`] for each of `todo`, and for what that cancels in turn.
    pub(super) fn graph_cascade(&mut self, now_us: u64, mut todo: Vec<TaskKey>) {
        while let Some(key) = todo.pop() {
            let Some(waiters) = self.graph.waiters.remove(&key) else {
                continue;
            };
            let (state, producer) = (
                self.jobs
                    .get(&key.0)
                    .map_or(TaskState::Canceled, |j| j.record(key.1).state),
                self.task_name(key),
            );
            let verb = if state == TaskState::Failed {
                "failed"
            } else {
                "was canceled"
            };
            for w in waiters {
                match w {
                    Waiter::Reader(reader, file) => {
                        let reason = format!(
                            "input {}: producer task {producer} {verb}",
                            self.file_name(file)
                        );
                        if self.cancel_waiting(now_us, reader, reason) {
                            todo.push(reader);
                        }
                    }
                    Waiter::Gate(gj) => {
                        let reason = format!("--after: task {producer} {verb}");
                        todo.extend(self.cancel_gated(now_us, gj, &reason));
                    }
                    Waiter::Task(waiter) => {
                        let reason = format!("deps: task {producer} {verb}");
                        if self.cancel_waiting(now_us, waiter, reason) {
                            todo.push(waiter);
                        }
                    }
                }
            }
        }
    }

    /// Cancels a waiting task because what it waits for cannot come; whether it was waiting.
    fn cancel_waiting(&mut self, now_us: u64, (job, index): TaskKey, reason: String) -> bool {
        let Some(j) = self.jobs.get_mut(&job) else {
            return false;
        };
        if j.record(index).state != TaskState::Waiting {
            return false;
        }
        j.unmet.remove(&index);
        j.set_state(index, TaskState::Canceled).finished_us = now_us;
        let mut failure = Failure::because(reason);
        failure.permanent = true;
        j.failures.insert(index, failure);
        j.canceled_by_deps += 1;
        self.check_job_done(now_us, job);
        true
    }

    /// Cancels every waiting task of a job whose `after` can never be met; returns them, for
    /// their own waiters.
    fn cancel_gated(&mut self, now_us: u64, job: JobId, reason: &str) -> Vec<TaskKey> {
        let Some(j) = self.jobs.get(&job) else {
            return Vec::new();
        };
        let waiting: Vec<TaskIndex> = (0..j.len())
            .filter(|&i| j.record(i).state == TaskState::Waiting)
            .collect();
        let mut gone = Vec::new();
        for i in waiting {
            if self.cancel_waiting(now_us, (job, i), reason.to_string()) {
                gone.push((job, i));
            }
        }
        gone
    }

    /// A job ended: jobs waiting on all of it go on or are canceled, its parent may end, and a
    /// workflow that has ended deletes its local intermediates.
    pub(super) fn graph_job_ended(&mut self, now_us: u64, job: JobId) {
        if self.graph.live.is_empty() {
            return;
        }
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let all_ok = u64::from(j.counts.finished) == u64::from(j.len());
        let (failed, canceled, parent) = (j.counts.failed, j.counts.canceled, j.parent);
        if let Some(waiting) = self.graph.job_waiters.remove(&job) {
            for gj in waiting {
                if all_ok {
                    self.open_gate(gj);
                } else {
                    let reason = format!(
                        "--after {job}: job {job} ended with {failed} failed and {canceled} canceled tasks"
                    );
                    let gone = self.cancel_gated(now_us, gj, &reason);
                    self.graph_cascade(now_us, gone);
                }
            }
        }
        let root = self.graph.root(job);
        if self.graph.members.remove(&job) {
            if let Some(n) = self.graph.live.get_mut(&root) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.graph.live.remove(&root);
                    self.graph.ending.insert(root, now_us + DROP_GRACE_US);
                }
            }
        }
        if let Some((pj, _)) = parent {
            if let Some(p) = self.jobs.get_mut(&pj) {
                p.live_children = p.live_children.saturating_sub(1);
            }
            self.check_job_done(now_us, pj);
        }
    }

    /// Time passes: workflows ended [`DROP_GRACE_US`] ago and not joined since delete their
    /// local files.
    pub(super) fn graph_tick(&mut self, now_us: u64) {
        if self.graph.ending.is_empty() {
            return;
        }
        let mut due: Vec<JobId> = self
            .graph
            .ending
            .iter()
            .filter(|(_, &at)| at <= now_us)
            .map(|(&root, _)| root)
            .collect();
        due.sort_unstable();
        for root in due {
            self.graph.ending.remove(&root);
            if !self.graph.live.contains_key(&root) {
                self.drop_locals(root);
            }
        }
    }

    /// Deletes a workflow's local intermediates from the caches that hold them.
    fn drop_locals(&mut self, root: JobId) {
        let Some(files) = self.graph.locals.remove(&root) else {
            return;
        };
        for &f in &files {
            self.graph.produced.remove(&f);
        }
        let (copies, bytes) = self.drop_from_caches(&files);
        self.graph.freed_files += copies;
        self.graph.freed_bytes += bytes;
    }

    /// Tells the workers holding `files` to delete them, and stops naming them as holders
    /// at once: a task reading a file of that name again (a workflow run again) must not be
    /// told a worker has it while that worker deletes it. The copies deleted and their bytes.
    pub(super) fn drop_from_caches(&mut self, files: &[FileId]) -> (u64, u64) {
        let mut by_worker: FxHashMap<u32, Vec<String>> = FxHashMap::default();
        let mut unheld = Vec::new();
        let (mut copies, mut bytes) = (0, 0);
        for &f in files {
            let size = self.files.size(f).unwrap_or(0);
            let Some(name) = self.files.name(f) else {
                continue;
            };
            for &w in self.files.holders(f) {
                by_worker.entry(w).or_default().push(name.to_string());
                unheld.push((w, f));
                copies += 1;
                bytes += size;
            }
        }
        for (w, f) in unheld {
            self.files.not_held(w, f);
        }
        let mut workers: Vec<_> = by_worker.into_iter().collect();
        workers.sort_unstable_by_key(|(w, _)| *w);
        for (worker, files) in workers {
            self.commands.push(Command::DropFiles { worker, files });
        }
        (copies, bytes)
    }

    /// `file` was written by `writer` outside its job's declared outputs (a result value):
    /// its writer for lineage, unless one is known.
    pub(super) fn graph_note_writer(&mut self, file: FileId, writer: TaskKey) {
        self.graph.produced.entry(file).or_insert(writer);
    }

    /// `file` is no longer anyone's to make again.
    pub(super) fn graph_forget_writer(&mut self, file: FileId) {
        self.graph.produced.remove(&file);
    }

    /// The task that writes `file`, if one is known.
    pub(super) fn graph_writer_of(&self, file: FileId) -> Option<TaskKey> {
        self.graph.produced.get(&file).copied()
    }

    /// A job is being forgotten: the files it wrote are no longer anyone's.
    pub(super) fn graph_forget(&mut self, job: JobId) {
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        for f in &j.outputs {
            if self.graph.produced.get(f).is_some_and(|by| by.0 == job) {
                self.graph.produced.remove(f);
            }
        }
    }

    /// Tasks of `job` that something waits on, in order.
    pub(super) fn graph_waited_on(&self, job: JobId) -> Vec<TaskKey> {
        let mut keys: Vec<TaskKey> = self
            .graph
            .waiters
            .keys()
            .filter(|k| k.0 == job)
            .copied()
            .collect();
        keys.sort_unstable();
        keys
    }

    /// The task that writes `file`, if a task known to the scheduler does.
    pub(super) fn graph_writer(&self, file: FileId) -> Option<&TaskKey> {
        self.graph.produced.get(&file)
    }

    /// Whether some task writes a file (lineage has work only then).
    pub(super) fn graph_has_files(&self) -> bool {
        !self.graph.produced.is_empty()
    }

    /// Whether some task known to the scheduler writes file `name` (named as in caches,
    /// `KEY/name`).
    pub fn is_produced(&self, name: &str) -> bool {
        self.files
            .id(name)
            .is_some_and(|f| self.graph.produced.contains_key(&f))
    }

    /// The id the next submitted job will get.
    pub fn next_job_id(&self) -> JobId {
        self.next_job
    }

    /// Copies of intermediate files deleted from caches so far, and their bytes.
    pub fn freed(&self) -> (u64, u64) {
        (self.graph.freed_files, self.graph.freed_bytes)
    }

    /// Tasks run again so far to make intermediate files lost with their workers.
    pub fn reruns(&self) -> u64 {
        self.graph.reruns
    }

    /// The output modes of `job`'s outputs, as resolved at its submission (what its workers
    /// are told).
    pub fn output_keep(&self, job: &Job) -> Vec<Keep> {
        if job.keep.is_empty() {
            vec![Keep::Persist; job.spec.template.files.outputs.len()]
        } else {
            job.keep.clone()
        }
    }
}
