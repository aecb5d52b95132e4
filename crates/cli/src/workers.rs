//! The worker commands a user runs against a server: `worker list` (with `--all`, those that
//! left and why), `worker info`, `worker stop` and `worker resume`. (`worker start` runs a
//! worker in this process: see `main.rs`.)

use crate::args::Global;
use crate::exit;
use crate::json::{self, DepartedView, ResumeView, StopView, WorkerInfoView, WorkerView};
use crate::output::{self, plural, Format};
use crate::session::{self, unexpected, Session};
use anyhow::{bail, Result};
use kestrel_proto::messages::{
    Answer, Ask, DepartedWorker, WorkerDetail, WorkerRow, WORKER_TASKS_SHOWN,
};
use kestrel_proto::WORKERS_VERSION;
use std::process::ExitCode;

/// Refuses `what` on a server too old for it, saying what to do.
fn needs_workers_version(s: &mut Session, what: &str) -> Result<()> {
    let v = s.client().version();
    if v < WORKERS_VERSION {
        bail!("the server speaks protocol {v}, older than {WORKERS_VERSION}, which `{what}` needs; upgrade the server (or use `kestrel worker list`)");
    }
    Ok(())
}

pub async fn worker_list(g: &Global, all: bool) -> Result<ExitCode> {
    let mut s = session::open(g, session::ONE_SHOT).await?;
    let (ws, stopping, departed) = if s.client().version() >= WORKERS_VERSION {
        let Answer::WorkerList(l) = s.call(Ask::Workers { departed: all }).await? else {
            return Err(unexpected());
        };
        (l.workers, l.stopping, all.then_some(l.departed))
    } else {
        if all {
            // Refused: the server cannot say who left.
            needs_workers_version(&mut s, "kestrel worker list --all")?;
        }
        let Answer::Workers(ws) = s.call(Ask::WorkerList).await? else {
            return Err(unexpected());
        };
        (ws, Vec::new(), None)
    };
    let stopping_of = |id: u32| {
        stopping
            .iter()
            .find(|(w, _)| *w == id)
            .map(|(_, why)| why.as_str())
    };
    if g.output == Format::Json {
        let view = |w: &WorkerRow| {
            let mut v = WorkerView::from(w);
            if let Some(why) = stopping_of(w.id) {
                v.state = "stopping";
                v.stopping_reason = Some(why.to_string());
            }
            v
        };
        output::json(&json::WorkerListView {
            workers: ws.iter().map(view).collect(),
            departed: departed
                .as_ref()
                .map(|d| d.iter().map(DepartedView::from).collect()),
        });
        return Ok(ExitCode::SUCCESS);
    }
    if ws.is_empty() {
        eprintln!("no workers connected; start one with `kestrel worker start`");
    } else {
        output::print_table(&connected_table(&ws, stopping_of));
    }
    match departed.as_deref() {
        None => {}
        Some([]) => eprintln!("no worker has left"),
        Some(left) => {
            println!("\nleft lately (the server keeps the last 1024):");
            output::print_table(&departed_table(left));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The connected workers, one line each.
fn connected_table<'a>(
    ws: &[WorkerRow],
    stopping_of: impl Fn(u32) -> Option<&'a str>,
) -> comfy_table::Table {
    // Which allocation each worker came from, once an allocation queue started any.
    let from_allocs = ws.iter().any(|w| w.alloc.is_some());
    let mut header = vec![
        "id",
        "host",
        "address",
        "slots",
        "gpus",
        "memory / resources",
        "cache",
        "exec",
        "tasks",
        // Runs, not tasks: a task that failed, was retried and failed again counts twice.
        "runs finished",
        "runs failed",
        "last seen",
        "state",
    ];
    if from_allocs {
        header.insert(1, "allocation");
    }
    let mut t = output::table(&header);
    for w in ws {
        let mut row = vec![
            output::cell(w.id),
            output::cell(&w.hostname),
            output::cell(&w.address),
            output::cell(w.slots),
            output::cell(w.gpus),
            output::cell(offers(w)),
            output::cell(cache(w)),
            output::cell(&w.exec),
            output::cell(w.tasks),
            output::cell(w.finished),
            output::cell(w.failed),
            output::cell(output::ago(w.last_seen_us)),
            output::cell(match stopping_of(w.id) {
                Some(why) => format!("stopping: {why}"),
                None => output::worker_state(w),
            }),
        ];
        if from_allocs {
            row.insert(1, output::cell(origin(w)));
        }
        t.add_row(row);
    }
    t
}

/// The workers that left, the earliest first, with when and why.
fn departed_table(left: &[DepartedWorker]) -> comfy_table::Table {
    let mut t = output::table(&[
        "id",
        "host",
        "allocation",
        "slots",
        "runs finished",
        "runs failed",
        "joined",
        "left",
        "why",
    ]);
    for d in left {
        let w = &d.worker;
        t.add_row(vec![
            output::cell(w.id),
            output::cell(&w.hostname),
            output::cell(origin(w)),
            output::cell(w.slots),
            output::cell(w.finished),
            output::cell(w.failed),
            output::cell(output::ago(w.joined_us)),
            output::cell(output::ago(d.left_us)),
            output::cell(&d.reason),
        ]);
    }
    t
}

/// What a worker offers beyond slots and GPUs: `23.5 GiB, licenses=4`.
fn offers(w: &WorkerRow) -> String {
    let mut parts = vec![output::bytes(w.mem)];
    parts.extend(w.named.iter().map(|(name, n)| format!("{name}={n}")));
    parts.join(", ")
}

/// `1.2 MiB / 1.0 GiB`, or `-` for a worker without a cache.
fn cache(w: &WorkerRow) -> String {
    w.cache.map_or("-".into(), |(used, cap)| {
        format!("{} / {}", output::bytes(used), output::bytes(cap))
    })
}

/// `2 (queue 1)`, or `-` for a worker started by hand.
fn origin(w: &WorkerRow) -> String {
    w.alloc
        .map_or("-".into(), |(q, a)| format!("{a} (queue {q})"))
}

pub async fn worker_info(g: &Global, worker: u32) -> Result<ExitCode> {
    let mut s = session::open(g, session::ONE_SHOT).await?;
    needs_workers_version(&mut s, "kestrel worker info")?;
    let Answer::WorkerDetail(d) = s.call(Ask::WorkerInfo { worker }).await? else {
        return Err(unexpected());
    };
    if g.output == Format::Json {
        output::json(&WorkerInfoView::from(&*d));
    } else {
        print_worker(&d);
    }
    Ok(ExitCode::SUCCESS)
}

/// `kestrel worker info` for people.
fn print_worker(d: &WorkerDetail) {
    let w = &d.worker;
    let state = match (&d.left, &d.stopping) {
        (Some((at, why)), _) => format!("left {}: {why}", output::ago(*at)),
        (None, Some(why)) => {
            format!("stopping (takes no new task, leaves once it runs nothing): {why}")
        }
        (None, None) => output::worker_state(w),
    };
    let mut rows: Vec<(&str, String)> = vec![
        ("worker", w.id.to_string()),
        ("host", w.hostname.clone()),
        ("state", state),
    ];
    if let Some(why) = w.quarantined.as_ref().filter(|_| d.left.is_some()) {
        rows.push(("quarantined", why.clone()));
    }
    if !w.address.is_empty() {
        rows.push(("address", w.address.clone()));
    }
    let alloc = match (w.alloc, d.ends_at_us) {
        (Some((q, a)), Some(end)) => format!("{a} (queue {q}), ends {}", in_time(end)),
        (Some((q, a)), None) => format!("{a} (queue {q})"),
        (None, Some(end)) => format!("ends {}", in_time(end)),
        (None, None) => "- (started by hand)".into(),
    };
    rows.extend([
        ("allocation", alloc),
        ("slots", format!("{} (prefetch {})", w.slots, w.prefetch)),
        ("gpus", w.gpus.to_string()),
        ("memory", output::bytes(w.mem)),
        (
            "resources",
            if w.named.is_empty() {
                "-".into()
            } else {
                let named: Vec<String> = w.named.iter().map(|(n, k)| format!("{n}={k}")).collect();
                named.join(", ")
            },
        ),
        ("cache", cache(w)),
        (
            "exec",
            if w.exec.is_empty() {
                "-".into()
            } else {
                w.exec.clone()
            },
        ),
        if d.left.is_some() {
            ("joined", output::ago(w.joined_us))
        } else {
            ("connected", format!("since {}", output::ago(w.joined_us)))
        },
        ("last seen", output::ago(w.last_seen_us)),
        (
            "runs",
            format!("{} finished, {} failed", w.finished, w.failed),
        ),
    ]);
    if d.left.is_none() {
        rows.push(("tasks", held(d)));
    }
    let mut table = output::fields();
    for (k, v) in rows {
        table.add_row(vec![output::cell(k), output::cell(v)]);
    }
    output::print_table(&table);
}

/// `in 29m 10s`, or `10.0 s ago` for a time passed.
fn in_time(at_us: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    if at_us <= now {
        return output::ago(at_us);
    }
    format!(
        "in {}",
        output::duration(std::time::Duration::from_micros(at_us - now))
    )
}

/// `2 running, 1 waiting for a slot: 7.12, 7.13 (running), 7.14`.
fn held(d: &WorkerDetail) -> String {
    if d.worker.tasks == 0 {
        return "none".into();
    }
    use kestrel_core::TaskState;
    let running = d
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::Running)
        .count();
    let listed: Vec<String> = d
        .tasks
        .iter()
        .map(|t| {
            let mark = if t.state == TaskState::Running {
                ""
            } else {
                " (waiting)"
            };
            format!("job {} task {}{mark}", t.job, t.task)
        })
        .collect();
    let more = d.worker.tasks.saturating_sub(d.tasks.len() as u64);
    let mut line = format!(
        "{}: {} running, {} waiting for a slot there",
        d.worker.tasks,
        running,
        d.tasks.len() - running
    );
    line.push_str(&format!("; {}", listed.join(", ")));
    if more > 0 {
        line.push_str(&format!(
            " and {more} more (the first {WORKER_TASKS_SHOWN} are listed)"
        ));
    }
    line
}

pub async fn worker_stop(g: &Global, workers: Vec<u32>, all: bool, now: bool) -> Result<ExitCode> {
    let mut s = session::open(g, session::ONE_SHOT).await?;
    needs_workers_version(&mut s, "kestrel worker stop")?;
    let ask = Ask::WorkerStop { workers, all, now };
    let Answer::WorkersStopped(results) = s.call(ask).await? else {
        return Err(unexpected());
    };
    if g.output == Format::Json {
        let out: Vec<StopView> = results.iter().map(|r| StopView::new(r, now)).collect();
        output::json(&json::StopListView { workers: out });
    } else if results.is_empty() {
        eprintln!("no workers connected: nothing to stop");
    } else {
        for r in &results {
            match r.result {
                Ok(0) if now => println!("worker {}: stopped", r.worker),
                Ok(1) if now => println!(
                    "worker {}: stopped; its task goes back to the queue",
                    r.worker
                ),
                Ok(held) if now => println!(
                    "worker {}: stopped; its {held} tasks go back to the queue",
                    r.worker
                ),
                Ok(0) => println!("worker {}: stopping; it runs nothing and exits now", r.worker),
                Ok(held) => println!(
                    "worker {}: stopping; it takes no new task, finishes the {} it runs (those waiting there for a slot go back to the queue), then exits (`kestrel worker stop {} --now` stops it at once)",
                    r.worker,
                    plural(held, "task"),
                    r.worker
                ),
                Err(_) => {}
            }
        }
    }
    if let Some(status) = exit::refused_jobs(results.iter().filter_map(|r| r.result.as_ref().err()))
    {
        return Ok(exit::code(status));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn worker_resume(g: &Global, worker: u32) -> Result<ExitCode> {
    let mut s = session::open(g, session::ONE_SHOT).await?;
    let Answer::WorkerResumed {
        worker,
        was_quarantined,
    } = s.call(Ask::ResumeWorker { worker }).await?
    else {
        return Err(unexpected());
    };
    if g.output == Format::Json {
        output::json(&ResumeView {
            id: worker,
            was_quarantined,
        });
    } else if was_quarantined {
        println!("worker {worker}: quarantine lifted; it gets tasks again");
    } else {
        println!("worker {worker} was not quarantined");
    }
    Ok(ExitCode::SUCCESS)
}
