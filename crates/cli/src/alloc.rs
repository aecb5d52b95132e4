//! `kestrel alloc`: allocation queues. The server asks the batch system (or, with `local`,
//! this machine) for workers while work waits, and lets them go when they idle.

use crate::args::Global;
use crate::json::{AllocQueueJson, AllocQueuesJson};
use crate::output::{self, Format};
use crate::session;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use comfy_table::Cell;
use kestrel_proto::messages::{
    AllocLogView, AllocQueueSpec, AllocQueueView, AllocView, Answer, Ask,
};
use std::process::ExitCode;

#[derive(Subcommand, Debug)]
pub enum AllocCommand {
    /// Add a queue: while tasks wait, it asks for allocations that start workers; an
    /// allocation whose workers all idle for --idle-timeout is given back whole
    #[command(
        after_help = "Examples:\n  kestrel alloc add slurm --time-limit 1h --max-workers 16 --worker-args \"--slots 32\" -- --partition debug --account proj\n  kestrel alloc add pbs --time-limit 2h --nodes 4 --worker-args \"--slots 64\" -- -q workq -A proj\n  kestrel alloc add local --time-limit 30m --acquire one --idle-timeout 30s --worker-args \"--slots 2\"\n\nEach allocation runs one `kestrel worker` per node (a pilot script under the server\ndirectory, in alloc/ID/); its workers take no task that would outlive it. Queues and their\nallocations are kept in the server's journal: a restarted server takes them back and adopts\nthe allocations that still run."
    )]
    Add(AddArgs),
    /// List the queues and their allocations
    List,
    /// One queue in detail: its settings, and each allocation's nodes, wait in the batch
    /// queue, run time, and CPU-seconds busy vs idle
    Info {
        /// The queue, as `kestrel alloc list` shows it
        queue: u32,
    },
    /// The pilot script and batch output of a queue's allocations (a local queue's worker
    /// logs), kept under the server directory in alloc/ID/
    #[command(
        after_help = "Examples:\n  kestrel alloc log 1            every allocation of queue 1, the last 20 lines of each file\n  kestrel alloc log 1 7 -n 200   allocation 7 only, its last 200 lines"
    )]
    Log {
        /// The queue
        queue: u32,
        /// One allocation of it (the newest 20 if not given)
        alloc: Option<u32>,
        /// Lines shown of each file, from its end
        #[arg(short = 'n', long, default_value_t = 20, value_name = "N")]
        lines: u32,
    },
    /// Stop a queue asking for allocations (its allocations go on)
    Pause {
        /// The queue, as `kestrel alloc list` shows it
        queue: u32,
    },
    /// Let a paused queue ask for allocations again (its failure count starts afresh)
    Resume {
        /// The queue
        queue: u32,
    },
    /// Remove a queue; with --force its allocations that have not ended are canceled
    Remove {
        /// The queue
        queue: u32,
        /// Cancel its allocations that have not ended
        #[arg(long)]
        force: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Worker processes on the server's machine
    Local,
    /// Slurm allocations (sbatch, squeue, scancel)
    Slurm,
    /// PBS Professional or OpenPBS allocations (qsub, qstat, qdel)
    Pbs,
    /// Torque allocations (qsub, qstat, qdel)
    Torque,
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// Where allocations come from
    #[arg(value_enum)]
    backend: Backend,
    /// How long each allocation lasts, e.g. 1h, 30m; its workers take no task that would
    /// outlive it
    #[arg(long, value_name = "DURATION")]
    time_limit: String,
    /// Nodes (one worker each) per allocation, at most
    #[arg(long, default_value_t = 1, value_name = "N")]
    nodes: u32,
    /// Allocations that have not ended, at most
    #[arg(long, value_name = "M")]
    max_allocs: Option<u32>,
    /// Workers of this queue, at most
    #[arg(long, value_name = "W")]
    max_workers: Option<u32>,
    /// Allocations waiting in the batch queue, at most
    #[arg(long, default_value_t = 1, value_name = "B")]
    backlog: u32,
    /// An allocation whose workers have all run nothing this long is given back, e.g. 2m;
    /// `never` keeps them
    #[arg(long, default_value = "2m", value_name = "DURATION|never")]
    idle_timeout: String,
    /// Centralized release (Falkon's): while fewer than Q tasks wait and the queue's free slots
    /// take them, allocations are released one at a time, the least busy first (its workers
    /// finish what they run and leave); beside --idle-timeout, which releases only allocations
    /// that idle
    #[arg(long, value_name = "Q")]
    release_below: Option<u64>,
    /// How big each request is: one node, one more than the last (additive), twice the last
    /// (exponential), or all the waiting work needs (Falkon's acquisition policies)
    #[arg(long, default_value = "all", value_parser = ["one", "additive", "exponential", "all"])]
    acquire: String,
    /// A name for `alloc list`
    #[arg(long)]
    name: Option<String>,
    /// More `kestrel worker start` arguments for its workers, e.g. "--slots 2 --cache-size 10G";
    /// a `local` queue's workers without --slots share the machine's cores (cores divided by
    /// --max-workers, at least 1)
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    worker_args: Option<String>,
    /// Skip the check at `alloc add`: by default the batch system checks a test allocation
    /// (Slurm: `sbatch --test-only`; PBS: a held job, then deleted), so what it refuses (a
    /// wrong partition or account) is refused now, with its own message
    #[arg(long)]
    no_dry_run: bool,
    /// Arguments of the batch system's submit command (after --), e.g. --partition debug
    #[arg(last = true, value_name = "BATCH ARGS")]
    batch_args: Vec<String>,
}

pub async fn alloc(g: &Global, c: AllocCommand) -> Result<ExitCode> {
    let info_of = match c {
        AllocCommand::Info { queue } => Some(queue),
        _ => None,
    };
    let ask = match c {
        AllocCommand::Add(a) => Ask::AllocAdd(Box::new(spec(a)?)),
        AllocCommand::List | AllocCommand::Info { .. } => Ask::AllocList,
        AllocCommand::Log {
            queue,
            alloc,
            lines,
        } => Ask::AllocLog {
            queue,
            alloc,
            lines,
        },
        AllocCommand::Pause { queue } => Ask::AllocPause {
            queue,
            paused: true,
        },
        AllocCommand::Resume { queue } => Ask::AllocPause {
            queue,
            paused: false,
        },
        AllocCommand::Remove { queue, force } => Ask::AllocRemove { queue, force },
    };
    let mut s = session::open(g, session::ONE_SHOT).await?;
    match s.call(ask).await? {
        Answer::AllocAdded { queue } => {
            if g.output == Format::Json {
                output::json(&serde_json::json!({ "queue": queue }));
            } else {
                println!("allocation queue {queue} added; `kestrel alloc list` shows its allocations");
            }
        }
        Answer::AllocQueues(queues) => match info_of {
            Some(id) => {
                let Some(q) = queues.iter().find(|q| q.id == id) else {
                    bail!("no allocation queue {id}; `kestrel alloc list` shows them");
                };
                info(g, q);
            }
            None => show(g, &queues),
        },
        Answer::AllocLogs(logs) => show_logs(g, &logs),
        other => bail!("the server sent an unexpected answer ({other:?}); use the same kestrel version for the server and this client"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `kestrel run --alloc "..."`: the arguments of `kestrel alloc add` in one string.
pub fn parse_queue(text: &str) -> Result<AllocQueueSpec> {
    #[derive(clap::Parser)]
    #[command(name = "--alloc", no_binary_name = true)]
    struct Queue {
        #[command(flatten)]
        add: AddArgs,
    }
    let words = shlex::split(text).with_context(|| {
        format!("--alloc {text:?}: unbalanced quotes; quote it as a shell would")
    })?;
    let q = <Queue as clap::Parser>::try_parse_from(words).map_err(|e| {
        // clap's message up to its usage, on one line: a list it ends with (the missing
        // options) follows its colon.
        let rendered = e.render().to_string();
        let first = rendered
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .map(|l| l.trim().trim_start_matches("error: "))
            .collect::<Vec<_>>()
            .join(" ");
        anyhow::anyhow!("--alloc {text:?}: {first}; it takes the arguments of `kestrel alloc add`, e.g. \"local --time-limit 30m --max-workers 4\"")
    })?;
    spec(q.add)
}

fn spec(a: AddArgs) -> Result<AllocQueueSpec> {
    let time_limit = crate::jobs::parse_duration(&a.time_limit)
        .with_context(|| format!("--time-limit {:?}", a.time_limit))?;
    let idle_timeout = match a.idle_timeout.trim() {
        "never" | "inf" | "infinite" => None,
        t => Some(
            crate::jobs::parse_duration(t)
                .with_context(|| format!("--idle-timeout {t:?}"))?
                .as_millis() as u64,
        ),
    };
    let worker_args = match &a.worker_args {
        Some(text) => shlex::split(text).with_context(|| {
            format!("--worker-args {text:?}: unbalanced quotes; quote it as a shell would")
        })?,
        None => Vec::new(),
    };
    // A worker's slots, to turn waiting tasks into nodes: its --slots, else this machine's
    // cores (said when they stand for a batch system's nodes: this is likely a login node).
    let given = worker_args
        .iter()
        .enumerate()
        .find_map(|(i, w)| match w.strip_prefix("--slots") {
            Some("") => worker_args.get(i + 1).map(String::as_str),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        });
    let slots = match given {
        Some(n) => n.parse().ok().filter(|&n: &u32| n > 0).with_context(|| {
            format!("--worker-args: --slots {n:?} is not a number of slots above 0")
        })?,
        None => {
            let cpus = crate::cpus();
            if a.backend != Backend::Local {
                eprintln!(
                    "warning: --worker-args has no --slots: this machine's {cpus} cores stand for a compute node's when waiting tasks are turned into nodes; give --worker-args \"--slots N\" with the nodes' cores"
                );
            }
            cpus
        }
    };
    let backend = match a.backend {
        Backend::Local => "local",
        Backend::Slurm => "slurm",
        Backend::Pbs => "pbs",
        Backend::Torque => "torque",
    };
    Ok(AllocQueueSpec {
        backend: backend.into(),
        name: a.name,
        nodes: a.nodes,
        slots_per_node: slots,
        time_limit_ms: time_limit.as_millis() as u64,
        max_allocs: a.max_allocs,
        max_workers: a.max_workers,
        backlog: a.backlog,
        idle_timeout_ms: idle_timeout,
        acquire: a.acquire,
        worker_args,
        batch_args: a.batch_args,
        dry_run: !a.no_dry_run,
        release_below: a.release_below,
    })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// CPU-seconds, for tables.
fn cpu_s(ms: u64) -> String {
    format!("{:.1}", ms as f64 / 1000.0)
}

fn ms(ms: u64) -> String {
    output::duration(std::time::Duration::from_millis(ms))
}

/// `kestrel alloc info Q`.
fn info(g: &Global, q: &AllocQueueView) {
    if g.output == Format::Json {
        output::json(&AllocQueueJson::from(q));
        return;
    }
    let s = &q.spec;
    let line = |k: &str, v: String| println!("{k:<14}{}", output::clean(&v));
    line(
        "queue",
        format!(
            "{}{} ({})",
            q.id,
            s.name
                .as_deref()
                .map(|n| format!(" {n}"))
                .unwrap_or_default(),
            s.backend
        ),
    );
    line("state", q.paused.clone().unwrap_or_else(|| "active".into()));
    if let Some(e) = &q.last_error {
        line("last error", e.clone());
    }
    line(
        "allocations",
        format!(
            "up to {} node(s) each, {} slot(s) a node, time limit {}",
            s.nodes,
            s.slots_per_node,
            ms(s.time_limit_ms)
        ),
    );
    let bound = |v: Option<u32>| v.map_or("no limit".into(), |v| v.to_string());
    line(
        "limits",
        format!(
            "max allocations {}, max workers {}, backlog {}",
            bound(s.max_allocs),
            bound(s.max_workers),
            s.backlog
        ),
    );
    line(
        "policy",
        format!(
            "acquire {}, idle timeout {}{}",
            s.acquire,
            s.idle_timeout_ms.map_or("never".into(), ms),
            s.release_below
                .map(|q| format!(", release while fewer than {q} tasks wait"))
                .unwrap_or_default()
        ),
    );
    if !s.worker_args.is_empty() {
        line(
            "worker args",
            shlex::try_join(s.worker_args.iter().map(String::as_str)).unwrap_or_default(),
        );
    }
    if !s.batch_args.is_empty() {
        line(
            "batch args",
            shlex::try_join(s.batch_args.iter().map(String::as_str)).unwrap_or_default(),
        );
    }
    let (held, busy): (u64, u64) = q
        .allocations
        .iter()
        .fold((0, 0), |(h, b), a| (h + a.held_cpu_ms, b + a.busy_cpu_ms));
    line(
        "CPU-seconds",
        format!(
            "{} held by allocations, {} running tasks, {} idle",
            cpu_s(held),
            cpu_s(busy),
            cpu_s(held.saturating_sub(busy))
        ),
    );
    if q.allocations.is_empty() {
        println!("no allocations yet");
        return;
    }
    let mut t = output::table(&[
        "alloc",
        "batch id",
        "state",
        "nodes",
        "workers",
        "waited",
        "ran",
        "busy CPU-s",
        "idle CPU-s",
        "reason",
    ]);
    for a in &q.allocations {
        let ran = a.started_ms.map_or("-".into(), |start| {
            let end = a.ended_ms.unwrap_or_else(now_ms);
            ms(end.saturating_sub(start))
        });
        let mut row = first_cells(a);
        row.extend([
            output::cell(ran),
            output::cell(cpu_s(a.busy_cpu_ms)),
            output::cell(cpu_s(a.held_cpu_ms.saturating_sub(a.busy_cpu_ms))),
            output::cell(a.reason.as_deref().unwrap_or("")),
        ]);
        t.add_row(row);
    }
    output::print_table(&t);
}

/// What `alloc list` and `alloc info` both show of an allocation: id, batch id, state, nodes,
/// workers, and its wait in the batch queue.
fn first_cells(a: &AllocView) -> Vec<Cell> {
    let workers: Vec<String> = a.workers.iter().map(u32::to_string).collect();
    vec![
        output::cell(a.id),
        output::cell(a.batch_id.as_deref().unwrap_or("-")),
        output::cell(&a.state),
        output::cell(a.nodes),
        output::cell(if workers.is_empty() {
            "-".into()
        } else {
            workers.join(",")
        }),
        output::cell(ms(a.queue_wait_ms)),
    ]
}

/// `kestrel alloc log`.
fn show_logs(g: &Global, logs: &[AllocLogView]) {
    if g.output == Format::Json {
        output::json(&serde_json::json!({ "allocations": logs }));
        return;
    }
    if logs.is_empty() {
        eprintln!("the queue has made no allocations yet");
    }
    for a in logs {
        println!(
            "== allocation {} ({}, batch id {})",
            a.alloc,
            a.state,
            a.batch_id.as_deref().unwrap_or("-")
        );
        for f in &a.files {
            match f.size {
                None => println!("-- {} (not there)", output::clean(&f.path)),
                Some(0) => println!("-- {} (empty)", output::clean(&f.path)),
                Some(n) => {
                    println!("-- {} ({})", output::clean(&f.path), output::bytes(n));
                    println!("{}", output::escape_controls(&f.tail, true));
                }
            }
        }
    }
}

fn show(g: &Global, queues: &[AllocQueueView]) {
    if g.output == Format::Json {
        output::json(&AllocQueuesJson {
            queues: queues.iter().map(AllocQueueJson::from).collect(),
        });
        return;
    }
    if queues.is_empty() {
        eprintln!("no allocation queues; add one with `kestrel alloc add local --time-limit 1h`");
        return;
    }
    for q in queues {
        let s = &q.spec;
        let state = q.paused.as_deref().unwrap_or("active");
        println!(
            "queue {}{} ({}): {}; up to {} node(s) per allocation, {} time limit, idle timeout {}, acquire {}",
            q.id,
            s.name.as_deref().map(|n| format!(" {n}")).unwrap_or_default(),
            s.backend,
            state,
            s.nodes,
            humantime::format_duration(std::time::Duration::from_millis(s.time_limit_ms)),
            s.idle_timeout_ms
                .map(|ms| humantime::format_duration(std::time::Duration::from_millis(ms)).to_string())
                .unwrap_or_else(|| "never".into()),
            s.acquire,
        );
        if let Some(e) = &q.last_error {
            println!("  last error: {}", output::clean(e));
        }
        if q.allocations.is_empty() {
            println!("  no allocations yet");
            continue;
        }
        let mut t = output::table(&[
            "alloc", "batch id", "state", "nodes", "workers", "waited", "reason",
        ]);
        for a in &q.allocations {
            let mut row = first_cells(a);
            row.push(output::cell(a.reason.as_deref().unwrap_or("")));
            t.add_row(row);
        }
        output::print_table(&t);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_queue;

    /// A missing option is named, not lost with the lines of clap's message past its first.
    #[test]
    fn a_bad_alloc_names_what_it_lacks() {
        let err = parse_queue("local --max-workers 2")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the following required arguments were not provided: --time-limit"),
            "{err}"
        );
        assert!(!err.contains("Usage"), "{err}");
        let ok = parse_queue("local --time-limit 30m --max-workers 2");
        assert!(ok.is_ok(), "{ok:?}");
    }
}
