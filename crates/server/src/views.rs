//! Scheduler state rendered as the protocol's answers.

use kestrel_core::{Job, Stall, TaskSet, TaskState, Worker};
use kestrel_proto::messages::*;

/// "queued", "running", "finished", "failed" or "canceled".
pub fn job_state(j: &Job) -> &'static str {
    let c = &j.counts;
    if j.canceled {
        "canceled"
    } else if j.is_done() {
        if c.failed > 0 {
            "failed"
        } else {
            "finished"
        }
    } else if c.assigned + c.running + c.done() > 0 {
        "running"
    } else {
        "queued"
    }
}

pub fn job_summary(j: &Job) -> JobSummary {
    JobSummary {
        id: j.id,
        name: j.spec.name.clone(),
        state: job_state(j).into(),
        counts: j.counts.into(),
        submitted_us: j.submitted_us,
        finished_us: j.finished_us,
    }
}

/// `stall` is why its queued tasks cannot go to any worker now, if so.
pub fn job_detail(j: &Job, stall: Option<Stall>) -> JobDetail {
    let t = j.timing();
    let mean = |sum: u64| {
        if t.tasks == 0 {
            0.0
        } else {
            sum as f64 / t.tasks as f64
        }
    };
    let tasks = match &j.tasks {
        TaskSet::Array(r) => match (r.id_at(0), r.id_at(r.len().saturating_sub(1))) {
            (Some(a), Some(b)) => format!("array of {} tasks, ids {a}..{b}", r.len()),
            _ => "empty array".into(),
        },
        TaskSet::List(l) => format!("list of {} tasks", l.len()),
        TaskSet::Lines(l) => match l.len() {
            1 => "1 task, one per line".into(),
            n => format!("{n} tasks, one per line"),
        },
    };
    JobDetail {
        summary: job_summary(j),
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
        waiting: stall.map(|s| s.to_string()),
    }
}

/// Tasks of a job in id order, filtered by state, at most `limit` rows.
pub fn task_page(j: &Job, state: Option<TaskState>, limit: u32) -> TaskPage {
    let mut rows = Vec::new();
    let mut more = 0u64;
    for index in 0..j.len() {
        let r = j.record(index);
        if state.is_some_and(|s| s != r.state) {
            continue;
        }
        if rows.len() >= limit as usize {
            more += 1;
            continue;
        }
        let failure = (r.state == TaskState::Failed || r.failures > 0)
            .then(|| j.failure(index))
            .flatten();
        rows.push(TaskRow {
            id: j.task_id(index),
            state: r.state,
            worker: (r.assigned_us > 0).then_some(r.worker),
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
        });
    }
    TaskPage { rows, more }
}

pub fn worker_row(w: &Worker, address: String, exec: String) -> WorkerRow {
    WorkerRow {
        id: w.id,
        hostname: w.offer.hostname.clone(),
        address,
        slots: w.offer.resources.cpus,
        gpus: w.offer.resources.gpus,
        prefetch: w.offer.prefetch,
        exec,
        tasks: w.outstanding() as u64,
        finished: w.tasks_finished,
        failed: w.tasks_failed,
        joined_us: w.joined_us,
        last_seen_us: w.last_seen_us,
        quarantined: w.quarantined.clone(),
    }
}
