//! `kestrel job graph`: a workflow's graph in Graphviz's DOT, or as JSON.

use crate::json::{task_state, CountsView};
use kestrel_core::{JobId, TaskState};
use kestrel_proto::messages::{EdgeKind, GraphEdge, JobState, WorkflowView};
use serde::Serialize;
use std::fmt::Write;

/// Edges past which DOT edges carry no file names (they would hide the drawing).
const LABELLED_EDGES: usize = 100;

/// A fill colour per state: done green, failed red, canceled grey, running yellow, waiting
/// blue, queued white.
fn colour(state: &str) -> &'static str {
    match state {
        "finished" => "#c8e6c9",
        "failed" => "#ffcdd2",
        "canceled" => "#e0e0e0",
        "running" | "assigned" => "#fff59d",
        "waiting" => "#bbdefb",
        _ => "#ffffff",
    }
}

/// DOT's quoted string.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// An edge's end: a task (by id) or a whole job.
type End = (JobId, Option<u32>);

fn node((job, task): End) -> String {
    match task {
        Some(t) => quoted(&format!("{job}:{t}")),
        None => quoted(&format!("job {job}")),
    }
}

/// The workflow as a DOT digraph: with tasks, one cluster per job (edges to a whole job end
/// at its cluster); without, one node per job.
pub fn dot(g: &WorkflowView, asked: JobId) -> String {
    let by_job = g.tasks.is_empty();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "digraph {} {{",
        quoted(&format!("workflow of job {asked}"))
    );
    let _ = writeln!(out, "  compound=true;");
    let _ = writeln!(
        out,
        "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\"];"
    );
    // The first task of each job: where edges to the whole job point (at its cluster).
    let mut first: std::collections::BTreeMap<JobId, u32> = Default::default();
    for j in &g.jobs {
        let c = &j.counts;
        let label = format!(
            "job {} {}: {}, {}/{} finished",
            j.id,
            j.name,
            j.state.name(),
            c.finished,
            c.total()
        );
        if by_job {
            let _ = writeln!(
                out,
                "  {} [label={}, fillcolor={}];",
                node((j.id, None)),
                quoted(&label),
                quoted(colour(j.state.name()))
            );
            continue;
        }
        let _ = writeln!(
            out,
            "  subgraph {} {{",
            quoted(&format!("cluster_{}", j.id))
        );
        let _ = writeln!(out, "    label={};", quoted(&label));
        for t in g.tasks.iter().filter(|t| t.job == j.id) {
            first.entry(j.id).or_insert(t.id);
            let state = task_state(t.state);
            let mut attrs = format!(
                "label={}, fillcolor={}",
                quoted(&t.id.to_string()),
                quoted(colour(state))
            );
            let tip = match &t.reason {
                Some(r) => format!("task {}:{} {state}: {r}", j.id, t.id),
                None => format!("task {}:{} {state}", j.id, t.id),
            };
            let _ = write!(attrs, ", tooltip={}", quoted(&tip));
            let _ = writeln!(out, "    {} [{attrs}];", node((j.id, Some(t.id))));
        }
        let _ = writeln!(out, "  }}");
    }
    let labelled = g.edges.len() <= LABELLED_EDGES;
    for e in &g.edges {
        let _ = writeln!(out, "  {}", edge(e, by_job, labelled, &first));
    }
    out.push_str("}\n");
    out
}

fn edge(
    e: &GraphEdge,
    by_job: bool,
    labelled: bool,
    first: &std::collections::BTreeMap<JobId, u32>,
) -> String {
    // With tasks drawn, an end that is a whole job points at its cluster.
    let end = |(job, task): End| -> (String, Option<String>) {
        match (task, by_job) {
            (None, false) => match first.get(&job) {
                Some(&t) => (
                    node((job, Some(t))),
                    Some(quoted(&format!("cluster_{job}"))),
                ),
                None => (node((job, None)), None),
            },
            _ => (node((job, task)), None),
        }
    };
    let (from, ltail) = end(e.from);
    let (to, lhead) = end(e.to);
    let mut attrs: Vec<String> = Vec::new();
    if let Some(c) = ltail {
        attrs.push(format!("ltail={c}"));
    }
    if let Some(c) = lhead {
        attrs.push(format!("lhead={c}"));
    }
    match &e.kind {
        EdgeKind::Files { names, count } => {
            let label = match names.as_slice() {
                [one] => one.clone(),
                [one, ..] => format!("{one} +{}", names.len() - 1),
                [] => format!("{count} files"),
            };
            if labelled || by_job {
                attrs.push(format!("label={}", quoted(&label)));
            }
        }
        EdgeKind::After => attrs.push("style=dashed, label=\"after\"".into()),
        EdgeKind::Parent => attrs.push("style=dotted, label=\"submitted\"".into()),
        // A plain arrow: the task waits for the other, with nothing passed between them.
        EdgeKind::Deps => {}
    }
    format!("{from} -> {to} [{}];", attrs.join(", "))
}

/// `job graph --output json`.
#[derive(Serialize)]
pub struct GraphJson {
    pub jobs: Vec<GraphJobJson>,
    pub tasks: Vec<GraphTaskJson>,
    pub edges: Vec<GraphEdgeJson>,
}

#[derive(Serialize)]
pub struct GraphJobJson {
    pub id: JobId,
    pub name: String,
    pub state: &'static str,
    pub counts: CountsView,
}

#[derive(Serialize)]
pub struct GraphTaskJson {
    pub job: JobId,
    pub id: u32,
    pub state: &'static str,
    pub reason: Option<String>,
}

/// One end of an edge: a task, or a whole job (`task` null).
#[derive(Serialize)]
pub struct EndJson {
    pub job: JobId,
    pub task: Option<u32>,
}

#[derive(Serialize)]
pub struct GraphEdgeJson {
    pub from: EndJson,
    pub to: EndJson,
    /// files, after or parent.
    pub kind: &'static str,
    /// The files, between tasks.
    pub files: Vec<String>,
    /// How many files, between jobs too.
    pub file_count: u32,
}

impl From<&WorkflowView> for GraphJson {
    fn from(g: &WorkflowView) -> GraphJson {
        let end = |(job, task): End| EndJson { job, task };
        GraphJson {
            jobs: g
                .jobs
                .iter()
                .map(|j| GraphJobJson {
                    id: j.id,
                    name: j.name.clone(),
                    state: JobState::name(j.state),
                    counts: (&j.counts).into(),
                })
                .collect(),
            tasks: g
                .tasks
                .iter()
                .map(|t| GraphTaskJson {
                    job: t.job,
                    id: t.id,
                    state: task_state(t.state),
                    reason: t.reason.clone(),
                })
                .collect(),
            edges: g
                .edges
                .iter()
                .map(|e| {
                    let (kind, files, file_count) = match &e.kind {
                        EdgeKind::Files { names, count } => ("files", names.clone(), *count),
                        EdgeKind::After => ("after", Vec::new(), 0),
                        EdgeKind::Parent => ("parent", Vec::new(), 0),
                        EdgeKind::Deps => ("deps", Vec::new(), 0),
                    };
                    GraphEdgeJson {
                        from: end(e.from),
                        to: end(e.to),
                        kind,
                        files,
                        file_count,
                    }
                })
                .collect(),
        }
    }
}

/// Lines of the failed subtree that `job info` prints at most per failed task.
const SUBTREE_LINES: usize = 5;
/// Failed tasks whose subtree `job info` prints at most.
const SUBTREE_ROOTS: usize = 10;

/// What `job`'s failed tasks canceled downstream, task by task (each failed task with its
/// reason, then the tasks it canceled through files and `after`, transitively), for `job info`.
/// Empty if its failures canceled nothing. `reach` is the global options of the command a
/// hint names (see [`crate::session::reach`]).
pub fn failed_subtree(g: &WorkflowView, job: JobId, reach: &str) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    // What each task (or whole job, `None`) holds up.
    let mut next: BTreeMap<End, Vec<End>> = BTreeMap::new();
    for e in &g.edges {
        if e.kind != EdgeKind::Parent {
            next.entry(e.from).or_default().push(e.to);
        }
    }
    let state: BTreeMap<(JobId, u32), (TaskState, Option<&String>)> = g
        .tasks
        .iter()
        .map(|t| ((t.job, t.id), (t.state, t.reason.as_ref())))
        .collect();
    let tasks_of = |j: JobId| g.tasks.iter().filter(move |t| t.job == j).map(|t| t.id);
    let failed: Vec<u32> = g
        .tasks
        .iter()
        .filter(|t| t.job == job && t.state == TaskState::Failed)
        .map(|t| t.id)
        .collect();
    let mut lines = Vec::new();
    let mut canceled_any = false;
    for &root in failed.iter().take(SUBTREE_ROOTS) {
        let reason = state.get(&(job, root)).and_then(|s| s.1);
        lines.push(format!(
            "task {root} failed: {}",
            reason.map_or("", String::as_str)
        ));
        let mut seen: BTreeSet<(JobId, u32)> = BTreeSet::new();
        let mut todo = vec![(job, Some(root)), (job, None)];
        while let Some(at) = todo.pop() {
            for &to in next.get(&at).into_iter().flatten() {
                let targets: Vec<u32> = match to.1 {
                    Some(t) => vec![t],
                    None => tasks_of(to.0).collect(),
                };
                for t in targets {
                    let canceled = state.get(&(to.0, t)).map(|s| s.0) == Some(TaskState::Canceled);
                    if canceled && seen.insert((to.0, t)) {
                        todo.push((to.0, Some(t)));
                        todo.push((to.0, None));
                    }
                }
            }
        }
        let n = seen.len();
        canceled_any |= n > 0;
        for &(j, t) in seen.iter().take(SUBTREE_LINES) {
            let why = state.get(&(j, t)).and_then(|s| s.1);
            lines.push(format!(
                "  canceled {j}:{t}: {}",
                why.map_or("", String::as_str)
            ));
        }
        if n > SUBTREE_LINES {
            lines.push(format!("  ... and {} more canceled", n - SUBTREE_LINES));
        }
    }
    if !canceled_any {
        return Vec::new();
    }
    if failed.len() > SUBTREE_ROOTS {
        lines.push(format!(
            "... and {} (`kestrel {reach}task list {job} --state failed`)",
            crate::output::plural((failed.len() - SUBTREE_ROOTS) as u64, "more failed task")
        ));
    }
    lines
}
