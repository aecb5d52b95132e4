//! `kestrel run`: an embedded server and local workers in this process, over loopback, for one
//! batch of work. The same code paths as a standalone server, so what works here works there.

use crate::args::{Exec, Global, RunArgs};
use crate::client_cmds::{submissions, submit_all, wait_exit, wait_for};
use crate::json::{CountsView, RunView};
use crate::output::{self, Format};
use anyhow::{anyhow, bail, Context, Result};
use kestrel_core::TaskState;
use kestrel_proto::messages::{Answer, Ask};
use kestrel_proto::Client;
use kestrel_server::ServerConfig;
use kestrel_worker::{ExecMode, WorkerConfig};
use std::process::ExitCode;
use std::time::Instant;

pub async fn run(g: &Global, a: RunArgs) -> Result<ExitCode> {
    if a.workers == 0 {
        bail!("--workers must be at least 1");
    }
    let subs = submissions(&a.shape, &a.options, a.command)?;
    let tasks: u64 = subs.iter().map(|s| s.tasks.len() as u64).sum();
    let slots = a
        .slots
        .unwrap_or_else(|| (crate::cpus() / a.workers).max(1));
    if slots == 0 {
        bail!("--slots must be at least 1");
    }
    let dir = tempfile::Builder::new()
        .prefix("kestrel-run-")
        .tempdir()
        .context("cannot create a directory for the embedded server")?;
    let started = Instant::now();
    let server = kestrel_server::start(ServerConfig::local(dir.path().to_path_buf())).await?;
    let mut workers = Vec::new();
    for _ in 0..a.workers {
        let mut config = WorkerConfig::new(slots);
        config.prefetch = a.prefetch.unwrap_or(slots);
        config.exec = match a.exec {
            Exec::Process => ExecMode::Process,
            Exec::Noop => ExecMode::Noop,
        };
        workers.push(tokio::spawn(kestrel_worker::run(
            config,
            server.access.clone(),
        )));
    }
    let mut client = Client::connect(&server.access)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let outcome = async {
        let ids = submit_all(&mut client, subs).await?;
        let p = wait_for(
            &mut client,
            ids.clone(),
            a.quiet || g.output == Format::Json,
        )
        .await?;
        if p.counts.failed > 0 && g.output == Format::Table {
            // The embedded server goes away with this process: show the failures now.
            show_failures(&mut client, &ids).await;
        }
        Ok::<_, anyhow::Error>(p)
    }
    .await;
    let wall = started.elapsed();
    server.stop().await;
    for w in workers {
        match w.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: a local worker ended with: {e}"),
            Err(e) => eprintln!("warning: a local worker crashed: {e}"),
        }
    }
    let p = outcome?;
    let rate = tasks as f64 / wall.as_secs_f64().max(1e-9);
    match g.output {
        Format::Json => output::json(&RunView {
            tasks,
            workers: a.workers,
            slots,
            counts: CountsView::from(&p.counts),
            wall_us: wall.as_micros() as u64,
            tasks_per_s: rate,
        }),
        Format::Table => {
            println!(
                "{} on {} x {}: {} in {} ({rate:.1} tasks/s)",
                output::plural(tasks, "task"),
                output::plural(a.workers, "worker"),
                output::plural(slots, "slot"),
                output::counts(&p.counts),
                output::duration(wall),
            );
        }
    }
    Ok(wait_exit(&p))
}

/// Prints the first failed tasks of each job with their reason and stderr tail.
async fn show_failures(client: &mut Client, ids: &[kestrel_core::JobId]) {
    const SHOWN: u32 = 10;
    for &job in ids {
        let ask = Ask::TaskList {
            job,
            state: Some(TaskState::Failed),
            limit: SHOWN,
        };
        let Ok(Answer::Tasks(page)) = client.call(ask).await else {
            continue;
        };
        for r in &page.rows {
            let reason = r.reason.as_deref().unwrap_or("failed");
            let tail = r
                .stderr_tail
                .as_deref()
                .and_then(|t| t.lines().last())
                .unwrap_or("");
            let tail = if tail.is_empty() {
                String::new()
            } else {
                format!(" | {tail}")
            };
            eprintln!("job {job} task {}: {reason}{tail}", r.id);
        }
        if page.more > 0 {
            eprintln!("job {job}: ... and {} more failed tasks", page.more);
        }
    }
}
