//! Scheduler state rendered as the protocol's answers.

use kestrel_core::{
    Departed, Job, JobId, Scheduler, TaskIndex, TaskSet, TaskState, Worker, WorkerId,
};
use kestrel_proto::messages::*;

/// Where a job is in its life.
pub fn job_state(j: &Job) -> JobState {
    let c = &j.counts;
    if j.canceled {
        JobState::Canceled
    } else if j.is_done() {
        // Tasks of a job not canceled were canceled because what they depended on failed:
        // the job did not do all its work, and none of it failed.
        if c.failed > 0 {
            JobState::Failed
        } else if c.canceled > 0 {
            JobState::Canceled
        } else {
            JobState::Finished
        }
    } else if c.total() > u64::from(c.ready) + u64::from(c.waiting) {
        JobState::Running
    } else {
        JobState::Queued
    }
}

/// The jobs that pass `filter`, oldest first: the newest `filter.last` of them (all if 0),
/// older than `filter.before` if given, and at most [`MAX_JOB_PAGE`]: a client pages on with
/// `before` (the oldest id it got), so no answer grows with the server's history.
/// Newest first is the walk, so `--last 10` of 100,000 jobs without other filters looks at
/// ten; the rest is only counted.
pub fn jobs_page(core: &Scheduler, filter: &JobFilter) -> Result<JobsPage, Refusal> {
    let jobs = core.jobs();
    let pattern = filter
        .name
        .as_deref()
        .map(glob::Pattern::new)
        .transpose()
        .map_err(|e| {
            Refusal::from(format!(
                "--name: {e}; write a name or a pattern with * and ?, e.g. 'sweep-*'"
            ))
        })?;
    let wanted = |j: &Job| {
        (filter.states.is_empty() || filter.states.contains(&job_state(j)))
            && pattern.as_ref().is_none_or(|p| p.matches(&j.spec.name))
    };
    let limit = match filter.last {
        0 => MAX_JOB_PAGE,
        n => n.min(MAX_JOB_PAGE),
    } as usize;
    let newer = |j: &&Job| filter.before.is_some_and(|before| j.id >= before);
    let mut page = JobsPage {
        jobs: Vec::new(),
        more: 0,
    };
    for j in jobs.rev().skip_while(newer).filter(|j| wanted(j)) {
        if page.jobs.len() < limit {
            page.jobs.push(job_summary(core, j));
        } else {
            page.more += 1;
        }
    }
    page.jobs.reverse();
    Ok(page)
}

/// A job as listed, with what its waiting tasks wait for.
pub fn job_summary(core: &Scheduler, j: &Job) -> JobSummary {
    JobSummary {
        id: j.id,
        name: j.spec.name.clone(),
        state: job_state(j).name().into(),
        counts: j.counts,
        submitted_us: j.submitted_us,
        finished_us: j.finished_us,
        waiting_for: core.waits_for(j.id).0,
    }
}

/// A job in full; `waiting` says why its tasks cannot go on now, if so.
pub fn job_detail(core: &Scheduler, j: &Job, waiting: Option<String>) -> JobDetail {
    let t = j.timing();
    let mean = |sum: u64| {
        if t.tasks == 0 {
            0.0
        } else {
            sum as f64 / t.tasks as f64
        }
    };
    let tasks = match &j.tasks {
        TaskSet::Array(r) if r.len() == 1 => format!("1 task (id {r})"),
        TaskSet::Array(r) if r.is_empty() => "no tasks".into(),
        TaskSet::Array(r) => format!("array of {} tasks, ids {r}", r.len()),
        TaskSet::List(l) => match (&j.spec.task_ids, l.len()) {
            (Some(ids), 1) => format!("list of 1 task (id {ids})"),
            (Some(ids), n) => format!("list of {n} tasks, ids {ids}"),
            (None, 1) => "list of 1 task".into(),
            (None, n) => format!("list of {n} tasks"),
        },
        TaskSet::Lines(l) => match l.len() {
            1 => "1 task, one per line".into(),
            n => format!("{n} tasks, one per line"),
        },
    };
    let ids = match (&j.tasks, &j.spec.task_ids) {
        (TaskSet::Array(r), _) | (TaskSet::List(_), Some(r)) => Some(r.to_string()),
        (TaskSet::List(_) | TaskSet::Lines(_), _) => None,
    };
    JobDetail {
        summary: job_summary(core, j),
        spec: j.spec.clone(),
        tasks,
        timing: Timing {
            tasks: t.tasks,
            mean_queue_us: mean(t.queue_us),
            mean_dispatch_us: mean(t.dispatch_us),
            mean_run_us: mean(t.run_us),
            span_us: t
                .first_start_us
                .map_or(0, |s| t.last_finish_us.saturating_sub(s)),
            mean_waited_us: mean(t.waited_us),
        },
        ids,
        waiting,
        transfers: j.transfers,
    }
}

/// Tasks of a job in id order, filtered by state, at most `limit` rows (the first page).
pub fn task_page(j: &Job, state: Option<TaskState>, limit: u32) -> TaskPage {
    let page = task_range(j, state, 0, limit);
    TaskPage {
        more: page.matched.saturating_sub(page.rows.len() as u64),
        rows: page.rows,
    }
}

/// How many of a job's tasks are in `state` (as [`Job::record`] shows them), from its counts.
fn count_in(j: &Job, state: Option<TaskState>) -> u64 {
    let c = &j.counts;
    u64::from(match state {
        None => j.len(),
        Some(TaskState::Ready) => c.ready,
        Some(TaskState::Assigned) => c.assigned,
        Some(TaskState::Running) => c.running,
        Some(TaskState::Finished) => c.finished,
        Some(TaskState::Failed) => c.failed,
        Some(TaskState::Canceled) => c.canceled,
        Some(TaskState::Waiting) => c.waiting,
    })
}

/// The tasks of a job in `state` (all if `None`), in task order, from the `offset`-th matching
/// one on, at most `limit`. Without a state the page is read straight from its position; a
/// state other than queued or canceled is looked for only among tasks that have left the
/// queue; the walk stops as soon as the page is full, and the total comes from the job's
/// counts, so no page walks the whole job unless it has to.
///
/// A page holds at most [`MAX_TASK_PAGE`] rows and about [`PAGE_BYTES`], whatever `limit` asks
/// for: a huge limit on a huge job would build an answer of hundreds of MiB while every other
/// client waits. The client sees a page shorter than it asked for that does not reach
/// `matched`, and asks for the next one from `offset + rows`.
pub fn task_range(j: &Job, state: Option<TaskState>, offset: u32, limit: u32) -> TaskRange {
    let matched = count_in(j, state);
    let limit = limit.min(MAX_TASK_PAGE);
    let mut rows = Vec::with_capacity(limit.min(4096) as usize);
    let mut page = PageBudget::default();
    let limit = limit as usize;
    match state {
        None => {
            let end = offset.saturating_add(limit as u32);
            for index in offset..end.min(j.len()) {
                let row = task_row(j, index);
                if !page.takes(&row, rows.len()) {
                    break;
                }
                rows.push(row);
            }
        }
        // Untouched tasks read as queued (or canceled in a canceled job, waiting in a held
        // one): walk every index.
        Some(s @ (TaskState::Ready | TaskState::Canceled)) | Some(s @ TaskState::Waiting)
            if s != TaskState::Waiting || j.held() =>
        {
            for i in untouched_or_in(j, s, offset, limit) {
                let row = task_row(j, i);
                if !page.takes(&row, rows.len()) {
                    break;
                }
                rows.push(row);
            }
        }
        Some(s) => {
            let found = j.touched().filter(|(i, _)| j.record(*i).state == s);
            for (i, _) in found.skip(offset as usize).take(limit) {
                let row = task_row(j, i);
                if !page.takes(&row, rows.len()) {
                    break;
                }
                rows.push(row);
            }
        }
    }
    TaskRange {
        rows,
        offset: u64::from(offset),
        matched,
    }
}

/// The indices of the page of tasks in state `s`, a state untouched tasks may show (queued, or
/// canceled, or waiting in a held job): the `offset`-th matching one on, at most `limit`. Runs
/// of untouched tasks (all in one state) are skipped as ranges, so a page deep into a job of
/// 20M queued tasks costs its touched tasks and the page, not 20M records read.
fn untouched_or_in(j: &Job, s: TaskState, offset: u32, limit: usize) -> Vec<TaskIndex> {
    let mut out = Vec::with_capacity(limit.min(4096));
    let mut skip = offset;
    // The untouched tasks in `start..end` that match, as far as the page goes; whether it is full.
    let gap = |start: TaskIndex, end: TaskIndex, out: &mut Vec<TaskIndex>, skip: &mut u32| {
        // Every untouched task of a job shows the same state: its first's says.
        if start >= end || j.record(start).state != s {
            return out.len() >= limit;
        }
        let len = end - start;
        if *skip >= len {
            *skip -= len;
            return out.len() >= limit;
        }
        let from = start + *skip;
        *skip = 0;
        let take = (end - from).min((limit - out.len()) as u32);
        out.extend(from..from + take);
        out.len() >= limit
    };
    let mut next: TaskIndex = 0;
    for (i, _) in j.touched() {
        if i >= j.len() || gap(next, i, &mut out, &mut skip) {
            return out;
        }
        if j.record(i).state == s {
            if skip > 0 {
                skip -= 1;
            } else {
                out.push(i);
                if out.len() >= limit {
                    return out;
                }
            }
        }
        next = i + 1;
    }
    gap(next, j.len(), &mut out, &mut skip);
    out
}

/// Bytes of rows a page of tasks carries at most (about: each row's text and a fixed part),
/// well under a frame even with the last row's failure text on top.
pub const PAGE_BYTES: usize = 4 << 20;

/// The bytes a page has taken so far.
#[derive(Default)]
struct PageBudget(usize);

impl PageBudget {
    /// Whether `row` still fits (a page's first row always does).
    fn takes(&mut self, row: &TaskRow, rows: usize) -> bool {
        let size = 96
            + row.reason.as_ref().map_or(0, String::len)
            + row.stderr_tail.as_ref().map_or(0, String::len);
        if rows > 0 && self.0 + size > PAGE_BYTES {
            return false;
        }
        self.0 += size;
        true
    }
}

/// One task as listed.
pub fn task_row(j: &Job, index: TaskIndex) -> TaskRow {
    let r = j.record(index);
    // A canceled task's reason is kept when it was canceled for a reason of its own (what it
    // depended on failed).
    let failure =
        (r.state == TaskState::Failed || r.state == TaskState::Canceled || r.failures > 0)
            .then(|| j.failure(index))
            .flatten();
    TaskRow {
        id: j.task_id(index),
        state: r.state,
        // Worker 0 is no worker: a task end journaled before ends named their worker.
        worker: (r.assigned_us > 0 && r.worker != 0).then_some(r.worker),
        assigned_us: r.assigned_us,
        started_us: r.started_us,
        finished_us: r.finished_us,
        failures: r.failures as u32,
        lost: r.lost as u32,
        exit_code: failure.and_then(|f| f.exit_code),
        reason: failure.map(|f| f.reason.clone()),
        stderr_tail: failure
            .map(|f| f.stderr_tail.clone())
            .filter(|s| !s.is_empty()),
        attempts: r.runs.into(),
        transfers: j.task_transfers(index),
    }
}

/// Why ended task `index` failed or was canceled, as `kestrel task info` says: the reason of
/// its failure for a failed task, and for one canceled because what it depended on failed;
/// `None` for a success and for a task canceled with its job (whose earlier run's failure, if
/// any, is not why it ended).
pub fn end_reason(j: &Job, index: TaskIndex) -> Option<String> {
    let because = match j.record(index).state {
        TaskState::Failed => true,
        TaskState::Canceled => j.canceled_for_deps(index),
        _ => false,
    };
    because
        .then(|| j.failure(index).map(|f| f.reason.clone()))
        .flatten()
}

/// The host name of the worker task `index` was last assigned to, while that worker is
/// connected or among the departed the scheduler keeps; `None` for a task never assigned.
pub fn worker_host(core: &Scheduler, j: &Job, index: TaskIndex) -> Option<String> {
    let r = j.record(index);
    if r.assigned_us == 0 {
        return None;
    }
    match core.worker(r.worker) {
        Some(w) => Some(w.offer.hostname.clone()),
        None => core.departed(r.worker).map(|d| d.offer.hostname.clone()),
    }
}

/// One task in full; `worker_host` names the worker it was last assigned to, if connected;
/// `nodes`, the workers of a multi-node task while it holds them.
pub fn task_detail(
    j: &Job,
    index: TaskIndex,
    worker_host: Option<String>,
    nodes: Vec<u32>,
) -> TaskDetail {
    let t = &j.spec.template;
    let failure = j.failure(index);
    TaskDetail {
        job: j.id,
        task: task_row(j, index),
        signal: failure.and_then(|f| f.signal),
        argv: j.task_argv(index).unwrap_or(&t.argv).to_vec(),
        cwd: t.cwd.clone(),
        stdout: t.stdout.clone(),
        stderr: t.stderr.clone(),
        worker_host,
        line: j.tasks.line(index).map(str::to_string),
        nodes,
    }
}

/// `cache` is its cache's bytes held and capacity, if it has one.
pub fn worker_row(
    w: &Worker,
    address: String,
    exec: String,
    cache: Option<(u64, u64)>,
    alloc: Option<(u32, u32)>,
) -> WorkerRow {
    let seen = w.departed(w.last_seen_us);
    WorkerRow {
        tasks: w.outstanding() as u64,
        ..departed_row(w.id, &seen, address, exec, cache, alloc)
    }
}

/// The row of a worker that left, as it was then (it holds nothing any more); `cache` and
/// `alloc` as in [`worker_row`].
pub fn departed_row(
    id: WorkerId,
    d: &Departed,
    address: String,
    exec: String,
    cache: Option<(u64, u64)>,
    alloc: Option<(u32, u32)>,
) -> WorkerRow {
    WorkerRow {
        id,
        hostname: d.offer.hostname.clone(),
        address,
        slots: d.offer.resources.cpus,
        gpus: d.offer.resources.gpus,
        prefetch: d.offer.prefetch,
        exec,
        tasks: 0,
        finished: d.tasks_finished,
        failed: d.tasks_failed,
        joined_us: d.joined_us,
        last_seen_us: d.last_seen_us,
        quarantined: d.quarantined.clone(),
        mem: d.offer.resources.mem,
        named: d.offer.named.clone(),
        cache,
        alloc,
    }
}

/// The tasks worker `id` holds, as `worker info` lists them (their user-visible ids).
pub fn held_tasks(core: &kestrel_core::Scheduler, id: WorkerId) -> Vec<HeldTask> {
    core.tasks_of(id, WORKER_TASKS_SHOWN)
        .into_iter()
        .filter_map(|(job, index, state)| {
            let j = core.job(job)?;
            Some(HeldTask {
                job,
                task: j.task_id(index),
                state,
            })
        })
        .collect()
}

/// An edge's end: a task (by id) or a whole job.
type End = (JobId, Option<u32>);

/// The graph of the workflow `job` belongs to: task by task, or job by job with `by_job` or
/// past [`MAX_GRAPH_TASKS`] tasks (file edges between two jobs then count their files).
pub fn workflow(core: &kestrel_core::Scheduler, job: JobId, by_job: bool) -> Option<WorkflowView> {
    let g = core.workflow_graph(job)?;
    let jobs: Vec<&Job> = g.jobs.iter().filter_map(|&id| core.job(id)).collect();
    let total: u64 = jobs.iter().map(|j| u64::from(j.len())).sum();
    let by_job = by_job || total > MAX_GRAPH_TASKS as u64;
    let name = |file| {
        let n = core.files().name(file).unwrap_or("?");
        // Without its store's key (`KEY/mid/1` is `mid/1` to the user).
        n.split_once('/').map_or(n, |(_, n)| n).to_string()
    };
    let id_of =
        |(job, index): (JobId, TaskIndex)| core.job(job).map_or(index, |j| j.task_id(index));
    let at = |key: (JobId, TaskIndex)| {
        if by_job {
            (key.0, None)
        } else {
            (key.0, Some(id_of(key)))
        }
    };
    let mut edges: Vec<GraphEdge> = Vec::new();
    // File edges, merged per (from, to): a task reading three files of one writer is one edge.
    let mut files: std::collections::BTreeMap<_, (Vec<String>, u32)> = Default::default();
    for (w, r, f) in g.files {
        let e = files.entry((at(w), at(r))).or_default();
        e.1 += 1;
        if !by_job {
            e.0.push(name(f));
        }
    }
    for ((from, to), (names, count)) in files {
        edges.push(GraphEdge {
            from,
            to,
            kind: EdgeKind::Files { names, count },
        });
    }
    let mut after: Vec<(End, End)> = Vec::new();
    for (dep, waiting) in g.after_jobs {
        after.push(((dep, None), (waiting, None)));
    }
    for (task, waiting) in g.after_tasks {
        after.push((at(task), (waiting, None)));
    }
    after.sort_unstable();
    after.dedup();
    edges.extend(after.into_iter().map(|(from, to)| GraphEdge {
        from,
        to,
        kind: EdgeKind::After,
    }));
    let mut deps: Vec<(End, End)> = g.deps.into_iter().map(|(a, b)| (at(a), at(b))).collect();
    deps.sort_unstable();
    deps.dedup();
    // Between jobs, an edge of the jobs' own (two tasks of one job make none).
    deps.retain(|(from, to)| from != to);
    edges.extend(deps.into_iter().map(|(from, to)| GraphEdge {
        from,
        to,
        kind: EdgeKind::Deps,
    }));
    edges.extend(g.parents.into_iter().map(|(p, child)| GraphEdge {
        from: at(p),
        to: (child, None),
        kind: EdgeKind::Parent,
    }));
    let tasks = if by_job {
        Vec::new()
    } else {
        jobs.iter()
            .flat_map(|j| {
                (0..j.len()).map(move |index| GraphTask {
                    job: j.id,
                    id: j.task_id(index),
                    state: j.record(index).state,
                    reason: j.failure(index).map(|f| f.reason.clone()),
                })
            })
            .collect()
    };
    Some(WorkflowView {
        jobs: jobs
            .iter()
            .map(|j| GraphJob {
                id: j.id,
                name: j.spec.name.clone(),
                state: job_state(j),
                counts: j.counts,
            })
            .collect(),
        tasks,
        edges,
    })
}
