//! `kestrel run`: an embedded server and local workers in this process, over loopback, for one
//! batch of work. The same code paths as a standalone server, so what works here works there.

use crate::args::{Global, RunArgs, Switch};
use crate::client_cmds::{submissions, wait_exit};
use crate::jobs::Submission;
use crate::json::{CountsView, RunView};
use crate::keep_order::KeepOrder;
use crate::output::{self, Format, Progress};
use crate::queries::FailureList;
use crate::run_dirs::RunDirs;
use anyhow::{bail, Context, Result};
use kestrel_client::{keyed, Connection, Reconnect, Target};
use kestrel_proto::messages::{Answer, Ask, Counts, WaitProgress};
use kestrel_proto::Client;
use kestrel_server::ServerConfig;
use kestrel_worker::WorkerConfig;
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub async fn run(g: &Global, a: RunArgs) -> Result<ExitCode> {
    let queue = a
        .alloc
        .as_deref()
        .map(crate::alloc::parse_queue)
        .transpose()?;
    let n_workers = a.workers.unwrap_or(if queue.is_some() { 0 } else { 1 });
    if n_workers == 0 && queue.is_none() {
        bail!(
            "--workers must be at least 1 (or give --alloc for workers from an allocation queue)"
        );
    }
    let mut subs = submissions(&a.shape, &a.options, a.command)?;
    let slots = a
        .slots
        .unwrap_or_else(|| (crate::cpus() / n_workers.max(1)).max(1));
    if slots == 0 {
        bail!("--slots must be at least 1");
    }
    // The machine's GPUs (those CUDA_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES leave, if set),
    // shared among the local workers.
    let (gpus, _) = crate::gpus::choose(None, &kestrel_worker::gpu::Probe::machine())?;
    if n_workers > 0 {
        refuse_impossible(&subs, slots, &gpus, n_workers)?;
    }
    refuse_more_nodes(&subs, n_workers, queue.is_some())?;
    if let (Some(q), 0) = (&queue, n_workers) {
        // The queue's workers take no task that would outlive their allocation (30 s margin).
        for s in &subs {
            if let Some(t) = s.spec.template.timeout_ms {
                if t.saturating_add(30_000) > q.time_limit_ms {
                    bail!(
                        "job {:?}: its tasks' --timeout {} and a 30 s margin do not fit in the queue's --time-limit {}, so no allocation would run them; give the queue a longer --time-limit",
                        s.spec.name,
                        output::duration(Duration::from_millis(t)),
                        output::duration(Duration::from_millis(q.time_limit_ms))
                    );
                }
            }
        }
    }
    let tasks: u64 = subs.iter().map(|s| s.tasks.len() as u64).sum();
    // Which outputs are streamed, to print them before the embedded server goes away.
    let streamed: Vec<[bool; 2]> = subs
        .iter()
        .map(|s| [&s.spec.template.stdout, &s.spec.template.stderr].map(|k| k.is_stream()))
        .collect();
    let streaming = streamed.iter().flatten().any(|s| *s);
    if streaming && g.output == Format::Json {
        bail!("kestrel run prints streamed output (--stdout/--stderr stream) as the tasks wrote it, which is not JSON: drop --output json, or write outputs to files");
    }
    // The server directory: the one asked for, or a temporary one that goes with this process.
    // Tasks see it as KESTREL_SERVER_DIR, so they (and the user, in another terminal) can
    // reach this server with any `kestrel` command. One asked for keeps the run's record
    // (its journal), which the same commands read once the run has ended.
    let record = g.server_dir.is_some();
    let reach = crate::session::reach(g);
    let temp;
    let dir = match &g.server_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::Builder::new()
                .prefix("kestrel-run-")
                .tempdir()
                .context("cannot create a directory for the embedded server")?;
            temp.path().to_path_buf()
        }
    };
    // Job numbers continue after the `job-N` output directories of earlier (or concurrent)
    // runs here, so runs never write into each other's outputs.
    let out_dirs = RunDirs::take(&subs);
    let first_job = out_dirs.first_job;
    // Files the tasks of a job share are written in task order when the run ends.
    let here = std::env::current_dir().unwrap_or_default();
    let keep_order = KeepOrder::prepare(&mut subs, &here);
    let started = Instant::now();
    let server = kestrel_server::start(ServerConfig {
        quarantine: a.quarantine == Switch::On,
        first_job,
        journal: record,
        run_record: record,
        ..ServerConfig::local(dir.clone())
    })
    .await?;
    let mut workers = Vec::new();
    for i in 0..n_workers {
        let mut config = WorkerConfig::new(slots);
        config.gpus = crate::gpus::share(&gpus, n_workers, i);
        config.prefetch = a.prefetch.unwrap_or(slots);
        config.exec = a.exec.into();
        config.server_dir = Some(dir.display().to_string());
        workers.push(tokio::spawn(kestrel_worker::run(
            config,
            server.access.clone(),
        )));
    }
    // The embedded server does not move or restart: no reconnection.
    let mut conn = Connection::open(Target::Fixed(server.access.clone()), Reconnect::NEVER).await?;
    let quiet = a.quiet || g.output == Format::Json;
    // The run's jobs as the server numbered them (a task's own submission may come between
    // two of them), for the files their tasks share; none if the submission was refused.
    let mut submitted: Vec<kestrel_core::JobId> = Vec::new();
    let outcome = async {
        if let Some(spec) = queue {
            match conn.client().call(Ask::AllocAdd(Box::new(spec))).await? {
                Answer::AllocAdded { .. } => {}
                other => bail!("unexpected answer to adding the allocation queue: {other:?}"),
            }
        }
        let ids: Vec<_> = conn
            .submit(&keyed(subs, None))
            .await?
            .into_iter()
            .map(|s| s.job)
            .collect();
        submitted.clone_from(&ids);
        let client = conn.client();
        let hint = format!(
            "this run's server is in {}: reach it with `kestrel --server-dir {} ...`",
            dir.display(),
            dir.display()
        );
        wait_all(client, ids.clone(), quiet, hint).await?;
        // Tasks may have submitted jobs of their own: the outputs and the summary cover every
        // job.
        let Answer::Jobs(jobs) = client.call(Ask::JobList).await? else {
            bail!("unexpected answer to a job list");
        };
        let all: Vec<u32> = jobs.iter().map(|j| j.id).collect();
        let own: HashMap<u32, [bool; 2]> = ids.iter().copied().zip(streamed).collect();
        let streams = streamed_jobs(client, &own, &all).await?;
        if g.output == Format::Json {
            // Only jobs of tasks get here: the run's own streaming is refused with JSON.
            for (job, _) in &streams {
                unprinted(*job, record.then_some(reach.as_str()));
            }
        } else {
            crate::cat::print_streamed(client, &streams).await?;
        }
        let mut counts = Counts::default();
        for j in &jobs {
            counts.add(&j.counts);
        }
        // What the allocation queue brought, for the summary.
        let allocs = match client.call(Ask::AllocList).await? {
            Answer::AllocQueues(q) => q.iter().map(|q| q.allocations.len()).sum::<usize>(),
            _ => 0,
        };
        // The embedded server goes away with this process: the failures are shown now (all of
        // them unless the run keeps its record, where `task list` finds the rest).
        let mut failed = Vec::new();
        if counts.failed > 0 && g.output == Format::Json {
            failed = crate::queries::failed_tasks(client, &all).await?;
        } else if counts.failed > 0 {
            let list = match record {
                true => FailureList::First { reach: &reach },
                false => FailureList::All,
            };
            crate::queries::show_failures(client, &all, list).await;
            if !record && counts.failed > crate::queries::FAILURES_SHOWN {
                eprintln!("note: `kestrel run --server-dir DIR ...` keeps a run's record, for `kestrel --server-dir DIR task list JOB --state failed` after it");
            }
        }
        Ok::<_, anyhow::Error>((counts, all, allocs, failed))
    };
    // Ctrl-C or a TERM stops the run: its tasks are stopped with the workers (and its
    // temporary server directory removed) instead of the process dying where it stands.
    let outcome = tokio::select! {
        o = outcome => Ok(o),
        stop = crate::exit::stopped() => Err(stop),
    };
    let wall = started.elapsed();
    if let (Err(stop), false) = (outcome.as_ref(), a.quiet) {
        eprintln!("{}: stopping the run and its tasks", stop.name());
    }
    server.stop().await;
    // A run cut short (a refused submission, a signal) stops its server before its workers
    // may have reached it: their ends then tell nothing but that, and its own error says why.
    let whole = matches!(outcome, Ok(Ok(_)));
    for w in workers {
        match w.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if whole => eprintln!("warning: a local worker ended with: {e}"),
            Ok(Err(_)) => {}
            Err(e) => eprintln!("warning: a local worker crashed: {e}"),
        }
    }
    let shared_files = keep_order.map(|k| k.finish(&submitted, &here));
    let outcome = match outcome {
        Ok(o) => o,
        Err(stop) => {
            out_dirs.finish(&here);
            return Ok(stop.code());
        }
    };
    let (counts, jobs, allocs, failed) = outcome?;
    let total = counts.total().max(tasks);
    let rate = total as f64 / wall.as_secs_f64().max(1e-9);
    let mut dirs = out_dirs.finish(&here);
    dirs.extend(shared_files.into_iter().flatten());
    match g.output {
        Format::Json => output::json(&RunView {
            jobs: jobs.clone(),
            tasks: total,
            workers: n_workers,
            slots,
            counts: CountsView::from(&counts),
            wall_us: wall.as_micros() as u64,
            tasks_per_s: rate,
            failed,
            record: record.then(|| dir.display().to_string()),
        }),
        Format::Table => {
            let on = if a.alloc.is_some() && n_workers == 0 {
                format!("workers of {}", output::plural(allocs as u64, "allocation"))
            } else {
                format!(
                    "{} x {}",
                    output::plural(n_workers, "worker"),
                    output::plural(slots, "slot")
                )
            };
            // On stderr, as every note: stdout carries only what the tasks streamed.
            eprintln!(
                "{} on {on}: {} in {} ({rate:.1} tasks/s)",
                output::plural(total, "task"),
                output::counts(&counts),
                output::duration(wall),
            );
            if !dirs.is_empty() {
                eprintln!("outputs in {}", dirs.join(", "));
            }
            if record {
                eprintln!(
                    "the run's record is in {}: `kestrel {reach}job list` (task list, job cat, ...) reads it",
                    dir.display()
                );
            }
        }
    }
    Ok(wait_exit(&WaitProgress {
        counts,
        ..Default::default()
    }))
}

/// Which streams (`[stdout, stderr]`) of each job are streamed, for the jobs that stream any:
/// known for the run's `own` jobs, asked for those its tasks submitted.
async fn streamed_jobs(
    client: &mut Client,
    own: &HashMap<u32, [bool; 2]>,
    all: &[u32],
) -> Result<Vec<(u32, [bool; 2])>> {
    let mut out = Vec::new();
    for &job in all {
        let streams = match own.get(&job) {
            Some(s) => *s,
            None => match client.call(Ask::JobInfo { job }).await? {
                Answer::Job(d) => {
                    let t = &d.spec.template;
                    [&t.stdout, &t.stderr].map(|k| k.is_stream())
                }
                other => bail!("unexpected answer to a job's info: {other:?}"),
            },
        };
        if streams.contains(&true) {
            out.push((job, streams));
        }
    }
    Ok(out)
}

/// Says where the streamed output of a task's `job` is, since `--output json` cannot print it:
/// in the run's record (`reach` reaches it), or nowhere once the run has ended.
fn unprinted(job: u32, reach: Option<&str>) {
    match reach {
        Some(reach) => eprintln!(
            "note: job {job}, submitted by a task, streamed its output, which is not JSON: `kestrel {reach}job cat {job}` prints it"
        ),
        None => eprintln!(
            "warning: job {job}, submitted by a task, streamed its output, which --output json does not print and which goes with this run; `kestrel run --server-dir DIR` keeps a run's record, for `kestrel --server-dir DIR job cat {job}`"
        ),
    }
}

/// Refuses at once what the local workers can never run (a server would wait for a bigger
/// worker; here none can come).
fn refuse_impossible(
    subs: &[Submission],
    slots: u32,
    gpus: &[kestrel_worker::gpu::Gpu],
    workers: u32,
) -> Result<()> {
    // The worker with the most GPUs has the first share.
    let most_gpus = crate::gpus::share(gpus, workers, 0).len() as u32;
    for s in subs {
        let need = s.spec.resources;
        if need.cpus > slots {
            bail!(
                "job {:?}: each task needs {} cpus, but each local worker has {slots} {}; give --slots {} (with fewer --workers), or ask for fewer --cpus",
                s.spec.name,
                need.cpus,
                if slots == 1 { "slot" } else { "slots" },
                need.cpus
            );
        }
        if let Some((name, _)) = s.spec.named.first() {
            bail!(
                "job {:?}: each task needs the resource '{name}', which `kestrel run`'s local workers do not have; start a server and `kestrel worker start --resource {name}=N`",
                s.spec.name
            );
        }
        let mem = kestrel_worker::memory().unwrap_or(u64::MAX);
        if need.mem > mem {
            bail!(
                "job {:?}: each task needs {} MiB of memory, but this machine has {} MiB",
                s.spec.name,
                need.mem.div_ceil(1 << 20),
                mem >> 20
            );
        }
        if need.gpus > most_gpus {
            let have = if gpus.is_empty() {
                "this machine has none that Kestrel finds (CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus, nvidia-smi; ROCR_VISIBLE_DEVICES, the KFD topology, rocm-smi)".to_string()
            } else {
                format!(
                    "its {} are shared among {workers} local worker(s), {most_gpus} at most each ({}); give fewer --workers",
                    output::plural(gpus.len() as u64, "GPU"),
                    kestrel_worker::gpu::describe(gpus)
                )
            };
            bail!(
                "job {:?}: each task needs {} GPU(s), but {have}",
                s.spec.name,
                need.gpus
            );
        }
    }
    Ok(())
}

/// Refuses at once a multi-node task that takes more workers than the run's local ones (with
/// an allocation queue, its allocations' nodes decide, and the server says if too few).
fn refuse_more_nodes(subs: &[Submission], workers: u32, queue: bool) -> Result<()> {
    let Some(s) = subs.iter().find(|s| s.spec.nodes > workers) else {
        return Ok(());
    };
    if queue {
        return Ok(());
    }
    bail!(
        "job {:?}: each task takes {} whole workers (--nodes), but this run has {workers}; give --workers {} (they share this machine's cores: --slots divides them)",
        s.spec.name,
        s.spec.nodes,
        s.spec.nodes
    )
}

/// Waits for `ids`, then for every job tasks submitted meanwhile, with one progress display;
/// when the work stalls, says why and how to reach this run's server.
async fn wait_all(client: &mut Client, ids: Vec<u32>, quiet: bool, hint: String) -> Result<()> {
    let mut progress = Progress::new(quiet);
    let mut hinted = false;
    let every = Duration::from_millis(250);
    let mut jobs = ids;
    loop {
        let done = client
            .wait(jobs, every, |p| {
                progress.update(p);
                if p.waiting.is_some() && !hinted && !quiet {
                    hinted = true;
                    eprintln!("{hint}");
                }
            })
            .await;
        let done = match done {
            Ok(d) => d,
            Err(e) => {
                progress.finish();
                return Err(e.into());
            }
        };
        // An empty list waits for every job not done yet; none left ends the run.
        if done.jobs == 0 {
            break;
        }
        jobs = Vec::new();
    }
    progress.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{from_flags, TaskOptions, TaskShape};
    use std::path::Path;

    fn sub(dir: &Path) -> Submission {
        from_flags(
            &TaskOptions::default(),
            TaskShape {
                array: Some("1-3"),
                each: None,
            },
            vec!["true".into()],
            dir,
        )
        .unwrap()
    }

    #[test]
    fn a_task_of_more_nodes_than_local_workers_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sub(dir.path());
        s.spec.nodes = 3;
        let e = refuse_more_nodes(&[s.clone()], 2, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "each task takes 3 whole workers (--nodes), but this run has 2; give --workers 3"
            ),
            "{e}"
        );
        assert!(refuse_more_nodes(&[s], 3, false).is_ok());
    }

    #[test]
    fn tasks_bigger_than_a_local_worker_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sub(dir.path());
        s.spec.resources.cpus = 4;
        let e = refuse_impossible(&[s.clone()], 2, &[], 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("each task needs 4 cpus, but each local worker has 2 slots"),
            "{e}"
        );
        assert!(refuse_impossible(&[s], 4, &[], 1).is_ok());
    }
}
