//! Commands that talk to a running server: submit, job, task, worker list, server info/stop.

use crate::args::{Global, JobCommand, Shape, Status, SubmitArgs, TaskCommand};
use crate::jobs::{self, Submission, TaskShape};
use crate::output::{self, Format, Progress};
use crate::sizes;
use anyhow::{anyhow, bail, Context, Result};
use comfy_table::Cell;
use kestrel_core::{JobId, TaskSet, TaskState};
use kestrel_proto::messages::{Answer, Ask, JobDetail, WaitProgress};
use kestrel_proto::{default_server_dir, Access, Client, ClientError, ProtoError, ACCESS_FILE};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The access file the global options point to.
pub fn access_path(g: &Global) -> PathBuf {
    match &g.access {
        Some(a) => a.clone(),
        None => g
            .server_dir
            .clone()
            .unwrap_or_else(default_server_dir)
            .join(ACCESS_FILE),
    }
}

pub fn read_access(g: &Global) -> Result<Access> {
    Ok(Access::read(&access_path(g))?)
}

pub async fn connect(g: &Global) -> Result<Client> {
    let access = read_access(g)?;
    Client::connect(&access).await.map_err(|e| anyhow!("{e}"))
}

/// Submits jobs; list jobs too large for one frame go in pieces. Returns their ids.
pub async fn submit_all(client: &mut Client, subs: Vec<Submission>) -> Result<Vec<JobId>> {
    let subs = keyed(subs, None);
    let mut done = Vec::with_capacity(subs.len());
    submit_keyed(client, &subs, &mut done, false).await?;
    Ok(done.into_iter().map(|d| d.job).collect())
}

/// A submission with its idempotency key: the server answers a repeated key with the job the
/// first submit created, so resending after a lost connection is safe, and so is running the
/// same `kestrel submit --key K` twice.
pub struct Keyed {
    pub key: String,
    pub sub: Submission,
}

/// A job the server holds for a submission.
#[derive(Clone, Copy, Debug)]
pub struct Done {
    pub job: JobId,
    /// The key had made the job before this command: nothing new was submitted.
    pub repeated: bool,
}

/// Gives each submission its key: `user` (`--key`) for the only job of a command line, the
/// user's key and the job's place for the jobs of a job file (`K#1`, `K#2`, ...), else a fresh
/// random key.
pub fn keyed(subs: Vec<Submission>, user: Option<(&str, bool)>) -> Vec<Keyed> {
    use rand::RngCore;
    subs.into_iter()
        .enumerate()
        .map(|(i, sub)| {
            let key = match user {
                Some((k, false)) => k.to_string(),
                Some((k, true)) => format!("{k}#{}", i + 1),
                None => {
                    let mut k = [0u8; 16];
                    rand::rngs::OsRng.fill_bytes(&mut k);
                    hex::encode(k)
                }
            };
            Keyed { key, sub }
        })
        .collect()
}

/// Submits `subs[done.len()..]`, pushing each job once the server holds all its tasks.
/// A lost connection comes back as a [`ClientError`] (see [`connection_lost`]); calling again
/// after reconnecting (`resumed`) goes on with the first job not yet confirmed.
pub async fn submit_keyed(
    client: &mut Client,
    subs: &[Keyed],
    done: &mut Vec<Done>,
    resumed: bool,
) -> Result<()> {
    /// Task bytes per message, well under the frame limit.
    const CHUNK_BYTES: usize = 4 << 20;
    let first_unconfirmed = done.len();
    for k in &subs[done.len()..] {
        // Pieces are index ranges into the list, copied one at a time as they are sent: the
        // list itself is kept (for a resend after a reconnect) but never copied whole.
        let tasks = &k.sub.tasks;
        let mut ranges = match tasks {
            TaskSet::List(list) => {
                sizes::piece_ranges(list.len(), CHUNK_BYTES, |i| sizes::argv_bytes(&list[i]))
            }
            TaskSet::Lines(lines) => sizes::piece_ranges(lines.len(), CHUNK_BYTES, |i| {
                sizes::string_bytes(lines.get(i).unwrap_or_default())
            }),
            TaskSet::Array(_) => sizes::piece_ranges(0, CHUNK_BYTES, |_| 0),
        };
        let rest = ranges.split_off(1);
        let first = match tasks {
            TaskSet::List(list) => TaskSet::List(list[ranges[0].clone()].to_vec()),
            TaskSet::Lines(lines) => TaskSet::Lines(lines.slice(ranges[0].clone())),
            array => array.clone(),
        };
        let (job, repeated) = match client
            .call(Ask::Submit {
                spec: k.sub.spec.clone(),
                tasks: first,
                open: !rest.is_empty(),
                key: Some(k.key.clone()),
            })
            .await
        {
            Ok(Answer::Submitted {
                job,
                warning,
                repeated,
            }) => {
                if let Some(w) = warning {
                    eprintln!("warning: job {job} cannot run on the workers connected now: {w}");
                }
                (job, repeated)
            }
            Ok(other) => bail!("unexpected answer to a submission: {other:?}"),
            Err(e) if client_lost(&e) => return Err(e.into()),
            Err(e) => bail!("submission refused: {e}"),
        };
        let n = rest.len();
        for (i, r) in rest.into_iter().enumerate() {
            let (at, close) = (r.start as u32, i + 1 == n);
            let piece = match tasks {
                TaskSet::Lines(lines) => Ask::ExtendLines {
                    job,
                    at,
                    lines: lines.slice(r),
                    close,
                },
                TaskSet::List(list) => Ask::Extend {
                    job,
                    at,
                    argvs: list[r].to_vec(),
                    close,
                },
                TaskSet::Array(_) => break,
            };
            client.call(piece).await.with_context(|| {
                format!("adding tasks to job {job} (it holds only part of them: cancel it with `kestrel job cancel {job}` and submit again)")
            })?;
        }
        // After a reconnect the first job may have been sent before the connection broke: a
        // repeated key then names what this command itself submitted.
        let sent_before = resumed && done.len() == first_unconfirmed;
        done.push(Done {
            job,
            repeated: repeated && !sent_before,
        });
    }
    Ok(())
}

fn client_lost(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Unreachable { .. }
            | ClientError::ConnectTimeout(_)
            | ClientError::Proto(ProtoError::Io(_) | ProtoError::Closed | ProtoError::Timeout(_))
    )
}

/// Whether an error means the connection to the server went away (worth reconnecting).
pub fn connection_lost(e: &anyhow::Error) -> bool {
    e.downcast_ref::<ClientError>().is_some_and(client_lost)
}

/// Reconnects after the server went away, with backoff, re-reading the access file each time
/// (a restarted server may listen elsewhere); gives up after `within`.
pub async fn reconnect(g: &Global, within: Duration, cause: &anyhow::Error) -> Result<Client> {
    eprintln!(
        "lost the server ({cause}); reconnecting for up to {}",
        humantime::format_duration(within)
    );
    let deadline = std::time::Instant::now() + within;
    let mut delay = Duration::from_millis(100);
    loop {
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
        let attempt = async {
            let access = read_access(g)?;
            Ok::<_, anyhow::Error>(Client::connect(&access).await?)
        }
        .await;
        match attempt {
            Ok(c) => {
                eprintln!("reconnected to the server");
                return Ok(c);
            }
            Err(e) if std::time::Instant::now() >= deadline => bail!(
                "lost the server and could not reconnect within {} (last try: {e}); check it with `kestrel server info`, start it again with `kestrel server start`, then `kestrel job wait`",
                humantime::format_duration(within)
            ),
            Err(_) => {}
        }
    }
}

/// Waits like [`wait_for`], reconnecting and waiting again when the server goes away.
pub async fn wait_reconnecting(
    g: &Global,
    client: &mut Client,
    jobs: Vec<JobId>,
    quiet: bool,
    within: Duration,
) -> Result<WaitProgress> {
    loop {
        match wait_for(client, jobs.clone(), quiet).await {
            Err(e) if connection_lost(&e) => *client = reconnect(g, within, &e).await?,
            done => return done,
        }
    }
}

/// Builds the submissions of `submit`/`run` from their flags.
pub fn submissions(
    shape: &Shape,
    opts: &jobs::TaskOptions,
    command: Vec<String>,
) -> Result<Vec<Submission>> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    match &shape.file {
        Some(file) => {
            if !command.is_empty() {
                bail!("--file takes its commands from the job file; drop the command after `--`");
            }
            jobs::from_file(file)
        }
        None => {
            let shape = TaskShape {
                array: shape.array.as_deref(),
                each: shape.each.as_deref(),
            };
            Ok(vec![jobs::from_flags(opts, shape, command, &cwd)?])
        }
    }
}

/// Waits with a progress display; returns the final counts.
pub async fn wait_for(client: &mut Client, jobs: Vec<JobId>, quiet: bool) -> Result<WaitProgress> {
    let mut progress = Progress::new(quiet);
    let every = Duration::from_millis(250);
    let done = client.wait(jobs, every, |p| progress.update(p)).await;
    progress.finish();
    Ok(done?)
}

/// Exit code of a wait: 1 if any task failed or was canceled.
pub fn wait_exit(p: &WaitProgress) -> ExitCode {
    if p.counts.failed > 0 || p.counts.canceled > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

pub async fn submit(g: &Global, args: SubmitArgs) -> Result<ExitCode> {
    let within = jobs::parse_duration(&args.reconnect_for).context("--reconnect-for")?;
    if args.key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!("--key must not be empty; use a name that stands for this submission, e.g. --key sweep-2024-06-01");
    }
    let from_file = args.shape.file.is_some();
    let user_key = args.key.as_deref().map(|k| (k, from_file));
    let subs = keyed(
        submissions(&args.shape, &args.options, args.command)?,
        user_key,
    );
    let mut client = connect(g).await?;
    let mut done = Vec::with_capacity(subs.len());
    let mut resumed = false;
    loop {
        match submit_keyed(&mut client, &subs, &mut done, resumed).await {
            Err(e) if connection_lost(&e) => {
                client = reconnect(g, within, &e).await?;
                resumed = true;
            }
            result => break result?,
        }
    }
    let ids: Vec<JobId> = done.iter().map(|d| d.job).collect();
    report_submitted(g, &subs, &done, args.parsable);
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let quiet = g.output == Format::Json;
    let p = wait_reconnecting(g, &mut client, ids, quiet, within).await?;
    if args.parsable {
        // Standard output holds the job ids alone.
        eprintln!("{}", wait_summary(&p));
    } else {
        report_wait(g, &p);
    }
    Ok(wait_exit(&p))
}

/// What `submit` prints once the server holds the jobs: the ids alone with `--parsable` (one
/// a line, on stdout), else a line on stderr or JSON; jobs a repeated `--key` named are said so.
fn report_submitted(g: &Global, subs: &[Keyed], done: &[Done], parsable: bool) {
    for (k, d) in subs.iter().zip(done).filter(|(_, d)| d.repeated) {
        eprintln!(
            "job {} was already submitted with key {:?}; nothing new was submitted",
            d.job, k.key
        );
    }
    let fresh: Vec<(&Keyed, &Done)> = subs.iter().zip(done).filter(|(_, d)| !d.repeated).collect();
    if parsable {
        let mut out = String::new();
        for d in done {
            out.push_str(&format!("{}\n", d.job));
        }
        print!("{out}");
        return;
    }
    match g.output {
        Format::Json => {
            let ids: Vec<JobId> = done.iter().map(|d| d.job).collect();
            let repeated: Vec<JobId> = done.iter().filter(|d| d.repeated).map(|d| d.job).collect();
            let total: u64 = subs.iter().map(|k| k.sub.tasks.len() as u64).sum();
            output::json(&serde_json::json!({ "jobs": ids, "tasks": total, "repeated": repeated }))
        }
        Format::Table if fresh.is_empty() => {}
        Format::Table => {
            let list: Vec<String> = fresh.iter().map(|(_, d)| d.job.to_string()).collect();
            let total: u64 = fresh.iter().map(|(k, _)| k.sub.tasks.len() as u64).sum();
            let noun = if fresh.len() == 1 { "job" } else { "jobs" };
            eprintln!("submitted {noun} {} with {total} tasks", list.join(", "));
        }
    }
}

fn wait_summary(p: &WaitProgress) -> String {
    format!("{} jobs done: {}", p.jobs_done, output::counts(&p.counts))
}

fn report_wait(g: &Global, p: &WaitProgress) {
    match g.output {
        Format::Json => output::json(p),
        Format::Table => println!("{}", wait_summary(p)),
    }
}

pub async fn job(g: &Global, cmd: JobCommand) -> Result<ExitCode> {
    let mut client = connect(g).await?;
    match cmd {
        JobCommand::List => {
            let Answer::Jobs(jobs) = client.call(Ask::JobList).await? else {
                bail!("unexpected answer")
            };
            if g.output == Format::Json {
                output::json(&jobs);
            } else if jobs.is_empty() {
                println!("no jobs; submit one with `kestrel submit`");
            } else {
                let mut t =
                    output::table(&["id", "name", "state", "tasks", "progress", "submitted"]);
                for j in &jobs {
                    t.add_row(vec![
                        Cell::new(j.id),
                        Cell::new(&j.name),
                        Cell::new(&j.state),
                        Cell::new(j.counts.total()),
                        Cell::new(output::counts(&j.counts)),
                        Cell::new(output::ago(j.submitted_us)),
                    ]);
                }
                println!("{t}");
            }
        }
        JobCommand::Info { job } => {
            let Answer::Job(d) = client.call(Ask::JobInfo { job }).await? else {
                bail!("unexpected answer")
            };
            if g.output == Format::Json {
                output::json(&d);
            } else {
                print_job(&d);
            }
        }
        JobCommand::Wait {
            jobs,
            quiet,
            reconnect_for,
        } => {
            let within = jobs::parse_duration(&reconnect_for).context("--reconnect-for")?;
            let quiet = quiet || g.output == Format::Json;
            let p = wait_reconnecting(g, &mut client, jobs, quiet, within).await?;
            report_wait(g, &p);
            return Ok(wait_exit(&p));
        }
        JobCommand::Cancel { jobs } => {
            let Answer::Canceled(results) = client.call(Ask::Cancel { jobs }).await? else {
                bail!("unexpected answer")
            };
            if g.output == Format::Json {
                output::json(&results);
            }
            let mut failed = false;
            for r in &results {
                match &r.result {
                    Ok((queued, running)) if g.output == Format::Table => println!(
                        "job {}: canceled {queued} queued tasks, stopping {running} running",
                        r.job
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        failed = true;
                        eprintln!("job {}: {e}", r.job);
                    }
                }
            }
            if failed {
                return Ok(ExitCode::FAILURE);
            }
        }
        JobCommand::Retry {
            job,
            failed: _,
            all,
        } => {
            let Answer::Retried {
                job,
                failed,
                canceled,
            } = client
                .call(Ask::Retry {
                    job,
                    failed_only: !all,
                })
                .await?
            else {
                bail!("unexpected answer")
            };
            if g.output == Format::Json {
                output::json(
                    &serde_json::json!({ "job": job, "failed": failed, "canceled": canceled }),
                );
            } else if failed + canceled == 0 {
                println!(
                    "job {job}: no failed{} tasks to retry",
                    if all { " or canceled" } else { "" }
                );
            } else if all {
                println!("job {job}: resubmitted {failed} failed and {canceled} canceled tasks");
            } else {
                println!("job {job}: resubmitted {failed} failed tasks");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn worker_resume(g: &Global, worker: u32) -> Result<ExitCode> {
    let mut client = connect(g).await?;
    let Answer::WorkerResumed {
        worker,
        was_quarantined,
    } = client.call(Ask::ResumeWorker { worker }).await?
    else {
        bail!("unexpected answer")
    };
    if g.output == Format::Json {
        output::json(&serde_json::json!({ "worker": worker, "was_quarantined": was_quarantined }));
    } else if was_quarantined {
        println!("worker {worker}: quarantine lifted; it gets tasks again");
    } else {
        println!("worker {worker} was not quarantined");
    }
    Ok(ExitCode::SUCCESS)
}

fn print_job(d: &JobDetail) {
    let s = &d.summary;
    let t = &d.spec.template;
    let sink = |k: &kestrel_core::Sink| match k {
        kestrel_core::Sink::Null => "none".to_string(),
        kestrel_core::Sink::File(p) => p.clone(),
    };
    let rows: Vec<(&str, String)> = vec![
        ("job", s.id.to_string()),
        ("name", s.name.clone()),
        ("state", s.state.clone()),
        ("tasks", d.tasks.clone()),
        ("progress", output::counts(&s.counts)),
        (
            "command",
            if t.argv.is_empty() {
                "(one per task)".into()
            } else {
                shell_words(&t.argv)
            },
        ),
        (
            "directory",
            t.cwd.clone().unwrap_or_else(|| "(worker's)".into()),
        ),
        (
            "stdout / stderr",
            format!("{} / {}", sink(&t.stdout), sink(&t.stderr)),
        ),
        (
            "resources",
            format!(
                "{} cpus, {} gpus per task",
                d.spec.resources.cpus, d.spec.resources.gpus
            ),
        ),
        (
            "priority / retries",
            format!("{} / {}", d.spec.priority, d.spec.retries),
        ),
        (
            "timeout",
            t.timeout_ms.map_or("none".into(), |ms| {
                output::duration(Duration::from_millis(ms))
            }),
        ),
        ("submitted", output::ago(s.submitted_us)),
        (
            "wall time",
            s.finished_us.map_or("(running)".into(), |f| {
                output::micros(f.saturating_sub(s.submitted_us) as f64)
            }),
        ),
        ("mean queue time", output::micros(d.timing.mean_queue_us)),
        (
            "mean wait for a slot",
            output::micros(d.timing.mean_waited_us),
        ),
        (
            "mean dispatch overhead",
            output::micros(d.timing.mean_dispatch_us),
        ),
        ("mean run time", output::micros(d.timing.mean_run_us)),
    ];
    let mut rows = rows;
    if let Some(w) = &d.waiting {
        rows.insert(4, ("waiting", w.clone()));
    }
    let mut table = output::table(&["", ""]);
    table.set_header(Vec::<Cell>::new());
    for (k, v) in rows {
        table.add_row(vec![Cell::new(k), Cell::new(v)]);
    }
    println!("{table}");
}

fn shell_words(argv: &[String]) -> String {
    shlex::try_join(argv.iter().map(String::as_str)).unwrap_or_else(|_| argv.join(" "))
}

pub async fn task(g: &Global, cmd: TaskCommand) -> Result<ExitCode> {
    let TaskCommand::List { job, status, limit } = cmd;
    let state = status.map(|s| match s {
        Status::Queued => TaskState::Ready,
        Status::Assigned => TaskState::Assigned,
        Status::Running => TaskState::Running,
        Status::Finished => TaskState::Finished,
        Status::Failed => TaskState::Failed,
        Status::Canceled => TaskState::Canceled,
    });
    let mut client = connect(g).await?;
    let Answer::Tasks(page) = client.call(Ask::TaskList { job, state, limit }).await? else {
        bail!("unexpected answer")
    };
    if g.output == Format::Json {
        output::json(&page);
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = output::table(&[
        "task",
        "state",
        "worker",
        "run time",
        "attempts",
        "exit",
        "reason / stderr tail",
    ]);
    let now = kestrel_server::now_us();
    for r in &page.rows {
        let run = if r.finished_us > 0 && r.started_us > 0 {
            output::micros(r.finished_us.saturating_sub(r.started_us) as f64)
        } else if r.state == TaskState::Running && r.started_us > 0 {
            format!(
                "{} so far",
                output::micros(now.saturating_sub(r.started_us) as f64)
            )
        } else {
            "-".into()
        };
        let mut why = r.reason.clone().unwrap_or_default();
        if let Some(tail) = &r.stderr_tail {
            let last: Vec<&str> = tail.lines().rev().take(3).collect();
            let tail = last.into_iter().rev().collect::<Vec<_>>().join(" | ");
            why = if why.is_empty() {
                tail
            } else {
                format!("{why}: {tail}")
            };
        }
        t.add_row(vec![
            Cell::new(r.id),
            Cell::new(if r.state == TaskState::Ready {
                "queued".to_string()
            } else {
                r.state.to_string()
            }),
            Cell::new(r.worker.map_or("-".into(), |w| w.to_string())),
            Cell::new(run),
            Cell::new(r.attempts),
            Cell::new(r.exit_code.map_or("-".into(), |c| c.to_string())),
            Cell::new(why),
        ]);
    }
    if page.rows.is_empty() {
        println!("no tasks match");
    } else {
        println!("{t}");
    }
    if page.more > 0 {
        println!("... and {} more (raise --limit)", page.more);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn worker_list(g: &Global) -> Result<ExitCode> {
    let mut client = connect(g).await?;
    let Answer::Workers(ws) = client.call(Ask::WorkerList).await? else {
        bail!("unexpected answer")
    };
    if g.output == Format::Json {
        output::json(&ws);
    } else if ws.is_empty() {
        println!("no workers connected; start one with `kestrel worker start`");
    } else {
        let mut t = output::table(&[
            "id",
            "host",
            "address",
            "slots",
            "gpus",
            "exec",
            "tasks",
            "finished",
            "failed",
            "last seen",
            "state",
        ]);
        for w in &ws {
            t.add_row(vec![
                Cell::new(w.id),
                Cell::new(&w.hostname),
                Cell::new(&w.address),
                Cell::new(w.slots),
                Cell::new(w.gpus),
                Cell::new(&w.exec),
                Cell::new(w.tasks),
                Cell::new(w.finished),
                Cell::new(w.failed),
                Cell::new(output::ago(w.last_seen_us)),
                Cell::new(output::worker_state(w)),
            ]);
        }
        println!("{t}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn server_info(g: &Global) -> Result<ExitCode> {
    let mut client = connect(g).await?;
    let Answer::Info(i) = client.call(Ask::ServerInfo).await? else {
        bail!("unexpected answer")
    };
    if g.output == Format::Json {
        output::json(&i);
    } else {
        println!(
            "server    {} (pid {}, kestrel {}, protocol {})",
            i.address, i.pid, i.version, i.protocol
        );
        println!("directory {}", i.dir);
        println!("started   {}", output::ago(i.started_us));
        println!("workers   {}", i.workers);
        println!("jobs      {} ({} not done)", i.jobs, i.live_jobs);
        println!("queued    {} tasks", i.queued);
        match &i.journal {
            Some(j) => {
                println!(
                    "journal   {} ({}, {} log rows)",
                    j.path,
                    output::bytes(j.bytes),
                    j.rows
                );
                if let Some(e) = &j.error {
                    println!("          NOT WRITABLE: {e}");
                }
            }
            None => println!("journal   none (state is lost if the server dies)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn server_stop(g: &Global) -> Result<ExitCode> {
    let mut client = connect(g).await?;
    client.call(Ask::Stop).await?;
    eprintln!("server stopping");
    Ok(ExitCode::SUCCESS)
}
