//! Commands that talk to a running server: submit, wait, job info/cancel/retry, worker
//! list/resume, server info/stop. (Listings that page or filter are in [`crate::queries`].)

use crate::args::{Global, JobCommand, Shape, SubmitArgs};
use crate::exit;
use crate::jobs::{self, Submission, TaskShape};
use crate::json::{self, JobInfoView, JobOutcome, RetryView, RunningOn, ServerView, WaitView};
use crate::output::{self, plural, Format, Progress};
use crate::session::{self, unexpected, Session};
use anyhow::{bail, Context, Result};
use kestrel_client::{keyed, Keyed, Submitted};
use kestrel_core::{JobId, TaskState, WorkerId};
use kestrel_proto::messages::{Answer, Ask, JobDetail, WaitProgress, MAX_GRAPH_TASKS};
use serde::Serialize;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

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
                bail!(
                    "--file takes its commands from the job file; drop the command given with it ({})",
                    command.join(" ")
                );
            }
            jobs::from_file(file)
        }
        None => {
            let shape = TaskShape {
                array: shape.array.as_deref(),
                each: shape.each.as_deref(),
            };
            jobs::check_after_flags(opts)?;
            Ok(vec![jobs::from_flags(opts, shape, command, &cwd)?])
        }
    }
}

/// The task this command runs inside, if it runs inside one (`KESTREL_JOB_ID` and
/// `KESTREL_TASK_ID`, set by the worker) and submits to that task's own server: a task that
/// names another server (`--server-dir`, `--access`) starts jobs that are not its children.
fn running_task(g: &Global) -> Option<(JobId, u32)> {
    let var = |k| std::env::var(k).ok()?.parse::<u32>().ok();
    let own_dir = std::env::var_os("KESTREL_SERVER_DIR").map(std::path::PathBuf::from);
    let same_server = g.access.is_none()
        && g.server_dir
            .as_ref()
            .is_none_or(|d| own_dir.as_ref() == Some(d));
    if !same_server {
        return None;
    }
    Some((var("KESTREL_JOB_ID")?, var("KESTREL_TASK_ID")?))
}

/// How a wait ended: with its jobs, or cut short by a signal.
pub enum Waited {
    Done(WaitProgress),
    Stopped(exit::Stop),
}

/// Waits with a progress display, through server restarts, until the jobs end (the final
/// counts) or a Ctrl-C or SIGTERM comes.
pub async fn wait_for(conn: &mut Session, jobs: Vec<JobId>, quiet: bool) -> Result<Waited> {
    let mut progress = Progress::new(quiet);
    let every = Duration::from_millis(250);
    let done = tokio::select! {
        done = conn.wait(jobs, every, |p| progress.update(p)) => Ok(done),
        stop = exit::stopped() => Err(stop),
    };
    progress.finish();
    Ok(match done {
        Ok(done) => Waited::Done(done?),
        Err(stop) => Waited::Stopped(stop),
    })
}

/// What a wait cut short by `stop` says: the jobs go on without it, and how to wait for them
/// again or cancel them. Returns the status of a command ended by that signal.
fn left_running(g: &Global, jobs: &[JobId], stop: exit::Stop) -> ExitCode {
    let reach = session::reach(g);
    let (them, go) = if jobs.len() == 1 {
        ("it", "goes")
    } else {
        ("them", "go")
    };
    let next = if jobs.is_empty() || jobs.len() > 10 {
        format!("`kestrel {reach}job wait` waits for every unfinished job again, `kestrel {reach}job cancel ID...` cancels one")
    } else {
        let ids: Vec<String> = jobs.iter().map(ToString::to_string).collect();
        let ids = ids.join(" ");
        format!("`kestrel {reach}job wait {ids}` waits for {them} again, `kestrel {reach}job cancel {ids}` cancels {them}")
    };
    let what = match jobs {
        [] => "the jobs go".to_string(),
        _ => format!("{} {go}", output::jobs(jobs)),
    };
    eprintln!("{}: {what} on without this command; {next}", stop.name());
    stop.code()
}

/// Exit code of a wait: 1 if any task failed or was canceled.
pub fn wait_exit(p: &WaitProgress) -> ExitCode {
    if p.counts.failed > 0 || p.counts.canceled > 0 {
        exit::code(exit::TASKS_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// `submit --output json`: the jobs, and with `--wait` how they ended.
#[derive(Serialize)]
struct SubmitView {
    jobs: Vec<JobId>,
    tasks: u64,
    /// Jobs a repeated `--key` named: submitted before, nothing new.
    repeated: Vec<JobId>,
    #[serde(flatten)]
    waited: Option<WaitView>,
}

pub async fn submit(g: &Global, args: SubmitArgs) -> Result<ExitCode> {
    if args.key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!("--key must not be empty; use a name that stands for this submission, e.g. --key sweep-2024-06-01");
    }
    let from_file = args.shape.file.is_some();
    let user_key = args.key.as_deref().map(|k| (k, from_file));
    let mut subs = submissions(&args.shape, &args.options, args.command)?;
    if let Some(parent) = running_task(g) {
        // Inside a task: the jobs join its workflow, and its job ends only after them.
        for s in &mut subs {
            s.spec.parent = Some(parent);
        }
    }
    let existing = crate::run_dirs::Existing::before(&subs);
    let subs = keyed(subs, user_key);
    let total: u64 = subs.iter().map(|s| s.sub.tasks.len() as u64).sum();
    let mut conn = session::open(g, session::WAITING).await?;
    let done = match conn.submit(&subs).await {
        Err(kestrel_client::Error::RefusedAfter {
            submitted,
            at,
            source,
        }) => {
            // A job file goes in whole or not at all: the jobs taken before the refused one
            // are canceled and forgotten (a task of theirs may have started meanwhile).
            let _ = conn
                .client()
                .call(Ask::Cancel {
                    jobs: submitted.clone(),
                })
                .await;
            let _ = conn
                .wait(submitted.clone(), Duration::from_millis(250), |_| {})
                .await;
            let _ = conn
                .client()
                .call(Ask::Forget {
                    jobs: submitted.clone(),
                    all_ended: false,
                })
                .await;
            let ids: Vec<String> = submitted.iter().map(|j| j.to_string()).collect();
            let earlier = match ids.as_slice() {
                [one] => format!("the job before it (job {one}) was"),
                _ => format!(
                    "the {} jobs before it (jobs {}) were",
                    ids.len(),
                    ids.join(", ")
                ),
            };
            bail!(
                "job #{} of the file was refused: {source}; {earlier} withdrawn, so nothing of the file was submitted",
                at + 1
            );
        }
        // The first job of a file: say which, as for the others.
        Err(e @ kestrel_client::Error::Refused(_)) => match &args.shape.file {
            Some(file) => {
                let name = subs.first().map_or("", |k| k.sub.spec.name.as_str());
                return Err(anyhow::Error::new(e)
                    .context(format!("job file {}, job #1 ({name})", file.display())));
            }
            None => return Err(e.into()),
        },
        other => other?,
    };
    let ids: Vec<JobId> = done.iter().map(|d| d.job).collect();
    report_submitted(g, &subs, &done, args.parsable);
    let fresh: Vec<Option<JobId>> = done
        .iter()
        .map(|d| (!d.repeated).then_some(d.job))
        .collect();
    existing.warn(&fresh);
    let waited = if args.wait {
        let quiet = g.output == Format::Json || args.parsable;
        let p = match wait_for(&mut conn, ids.clone(), quiet).await? {
            Waited::Done(p) => p,
            Waited::Stopped(stop) => return Ok(left_running(g, &ids, stop)),
        };
        // Standard output holds the job ids alone with --parsable, the JSON document (below)
        // with --output json; the summary is a note.
        if args.parsable || g.output == Format::Table {
            eprintln!("{}", wait_summary(&p));
            if p.counts.failed > 0 {
                let reach = session::reach(g);
                let list = crate::queries::FailureList::First { reach: &reach };
                crate::queries::show_failures(conn.client(), &ids, list).await;
            }
        }
        Some(p)
    } else {
        None
    };
    if g.output == Format::Json && !args.parsable {
        output::json(&SubmitView {
            jobs: ids,
            tasks: total,
            repeated: done.iter().filter(|d| d.repeated).map(|d| d.job).collect(),
            waited: waited.as_ref().map(WaitView::from),
        });
    }
    Ok(waited.as_ref().map_or(ExitCode::SUCCESS, wait_exit))
}

/// What `submit` prints once the server holds the jobs: the ids alone with `--parsable` (one
/// a line, on stdout), else a line on stderr (JSON comes once the command is done); jobs a
/// repeated `--key` named are said so.
fn report_submitted(g: &Global, subs: &[Keyed], done: &[Submitted], parsable: bool) {
    for d in done {
        if let Some(w) = &d.warning {
            eprintln!(
                "warning: job {} cannot run on the workers connected now: {}",
                d.job,
                output::clean(w)
            );
        }
    }
    for (k, d) in subs.iter().zip(done).filter(|(_, d)| d.repeated) {
        eprintln!(
            "job {} was already submitted with key {:?}; nothing new was submitted",
            d.job, k.key
        );
    }
    let fresh: Vec<(&Keyed, &Submitted)> =
        subs.iter().zip(done).filter(|(_, d)| !d.repeated).collect();
    if parsable {
        let mut out = String::new();
        for d in done {
            out.push_str(&format!("{}\n", d.job));
        }
        print!("{out}");
        return;
    }
    if g.output == Format::Table && !fresh.is_empty() {
        let ids: Vec<JobId> = fresh.iter().map(|(_, d)| d.job).collect();
        let total: u64 = fresh.iter().map(|(k, _)| k.sub.tasks.len() as u64).sum();
        eprintln!(
            "submitted {} with {}",
            output::jobs(&ids),
            plural(total, "task")
        );
    }
}

fn wait_summary(p: &WaitProgress) -> String {
    format!(
        "{} done: {}",
        plural(p.jobs_done, "job"),
        output::counts(&p.counts)
    )
}

/// How a wait ended: a JSON document on stdout, or a summary on stderr (a note, like the
/// progress before it; the exit status says whether a task failed).
fn report_wait(g: &Global, p: &WaitProgress) {
    match g.output {
        Format::Json => output::json(&WaitView::from(p)),
        Format::Table => eprintln!("{}", wait_summary(p)),
    }
}

/// `job cancel --output json`: what happened to one job.
#[derive(Serialize)]
struct Canceled {
    queued_canceled: u32,
    running_stopping: u32,
}

pub async fn job(g: &Global, cmd: JobCommand) -> Result<ExitCode> {
    if let JobCommand::Wait { jobs, quiet } = cmd {
        let mut conn = session::open(g, session::WAITING).await?;
        let quiet = quiet || g.output == Format::Json;
        // Without ids, the jobs waited for are those not done now: their failures are said.
        let shown = if jobs.is_empty() {
            match conn.client().call(Ask::JobList).await {
                Ok(Answer::Jobs(all)) => all
                    .iter()
                    .filter(|j| j.finished_us.is_none())
                    .map(|j| j.id)
                    .collect(),
                _ => Vec::new(),
            }
        } else {
            jobs.clone()
        };
        let p = match wait_for(&mut conn, jobs, quiet).await? {
            Waited::Done(p) => p,
            Waited::Stopped(stop) => return Ok(left_running(g, &shown, stop)),
        };
        report_wait(g, &p);
        if p.counts.failed > 0 && g.output == Format::Table {
            let reach = session::reach(g);
            let list = crate::queries::FailureList::First { reach: &reach };
            crate::queries::show_failures(conn.client(), &shown, list).await;
        }
        return Ok(wait_exit(&p));
    }
    let mut s = session::open(g, session::ONE_SHOT).await?;
    match cmd {
        JobCommand::Wait { .. } => unreachable!("handled above"),
        JobCommand::List { state, name, last } => {
            return crate::queries::job_list(g, &mut s, state, name, last).await
        }
        JobCommand::State { jobs, snakemake } => {
            return crate::queries::job_state(g, &mut s, jobs, snakemake).await
        }
        JobCommand::Forget { jobs, all_finished } => {
            return crate::queries::job_forget(g, &mut s, jobs, all_finished).await
        }
        JobCommand::Info { job } => {
            let Answer::Job(d) = s.call(Ask::JobInfo { job }).await? else {
                return Err(unexpected());
            };
            let on = running_on(&mut s, job, d.summary.counts.running.into()).await;
            if g.output == Format::Json {
                let mut view = JobInfoView::from(&*d);
                view.running_on = on;
                output::json(&view);
            } else {
                print_job(&d, &on);
                // In a workflow, what its failures canceled downstream (a workflow drawn task
                // by task: a job past that is not asked for its graph at all).
                let c = &d.summary.counts;
                if c.failed > 0 && c.total() <= MAX_GRAPH_TASKS as u64 {
                    if let Ok(Answer::Graph(graph)) =
                        s.call(Ask::JobGraph { job, by_job: false }).await
                    {
                        let lines = crate::graph_dot::failed_subtree(
                            &graph,
                            job,
                            &crate::session::reach(g),
                        );
                        if !lines.is_empty() {
                            println!("failed subtree (what each failed task canceled downstream):");
                            for l in lines {
                                println!("  {}", output::clean(&l));
                            }
                        }
                    }
                }
            }
        }
        JobCommand::Graph { job, by_job } => {
            let Answer::Graph(graph) = s.call(Ask::JobGraph { job, by_job }).await? else {
                return Err(unexpected());
            };
            if g.output == Format::Json {
                output::json(&crate::graph_dot::GraphJson::from(&*graph));
            } else {
                let dot = crate::graph_dot::dot(&graph, job);
                output::say(output::escape_controls(dot.trim_end(), true));
            }
        }
        JobCommand::Cancel { jobs } => {
            let Answer::Canceled(results) = s.call(Ask::Cancel { jobs }).await? else {
                return Err(unexpected());
            };
            if g.output == Format::Json {
                let out: Vec<JobOutcome<Canceled>> = results
                    .iter()
                    .map(|r| JobOutcome {
                        id: r.job,
                        error: r.result.as_ref().err().map(ToString::to_string),
                        done: r.result.as_ref().ok().map(|&(queued, running)| Canceled {
                            queued_canceled: queued,
                            running_stopping: running,
                        }),
                    })
                    .collect();
                output::json(&json::Jobs { jobs: out });
            } else {
                for r in &results {
                    if let Ok((queued, running)) = r.result {
                        println!(
                            "job {}: canceled {}, stopping {running} running",
                            r.job,
                            plural(queued, "queued task"),
                        );
                    }
                }
            }
            if let Some(status) =
                exit::refused_jobs(results.iter().filter_map(|r| r.result.as_ref().err()))
            {
                return Ok(exit::code(status));
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
            } = s
                .call(Ask::Retry {
                    job,
                    failed_only: !all,
                })
                .await?
            else {
                return Err(unexpected());
            };
            if g.output == Format::Json {
                output::json(&RetryView {
                    id: job,
                    retried_failed: failed,
                    retried_canceled: canceled,
                });
            } else if failed + canceled == 0 && !all {
                println!("{}", nothing_failed(&mut s, job).await?);
            } else if failed + canceled == 0 {
                println!("job {job}: no failed or canceled tasks to retry");
            } else if all {
                println!(
                    "job {job}: resubmitted {} and {}",
                    plural(failed, "failed task"),
                    plural(canceled, "canceled task")
                );
            } else {
                println!("job {job}: resubmitted {}", plural(failed, "failed task"));
            }
        }
        JobCommand::Cat(a) => return crate::cat::job_cat(&mut s, a).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// What `job retry JOB` says when no task failed: if some were canceled, why and what runs
/// them again (retrying the job a failed dependency of theirs belongs to, or `--all`).
async fn nothing_failed(s: &mut Session, job: JobId) -> Result<String> {
    let Answer::Job(d) = s.call(Ask::JobInfo { job }).await? else {
        return Err(unexpected());
    };
    let canceled = d.summary.counts.canceled;
    Ok(match (canceled, &d.waiting) {
        (0, _) => format!("job {job}: no failed tasks to retry"),
        (n, Some(why)) if d.summary.finished_us.is_some() => format!(
            "job {job}: no failed tasks; {} canceled because {why}",
            plural_were(n)
        ),
        (n, _) => format!(
            "job {job}: no failed tasks; {} canceled: retry them with `kestrel job retry {job} --all`",
            plural_were(n)
        ),
    })
}

/// "1 was" or "3 were".
fn plural_were(n: u32) -> String {
    if n == 1 {
        "1 was".into()
    } else {
        format!("{n} were")
    }
}

/// What each task of a job holds: `2 cpus, 1 GPU, 4.0 GiB of memory, 1 licenses per task`.
fn resources(spec: &kestrel_core::JobSpec) -> String {
    let r = spec.resources;
    let mut parts = vec![plural(r.cpus, "cpu")];
    if r.gpus > 0 {
        parts.push(plural(r.gpus, "GPU"));
    }
    if r.mem > 0 {
        parts.push(format!("{} of memory", output::bytes(r.mem)));
    }
    parts.extend(spec.named.iter().map(|(name, n)| format!("{n} {name}")));
    if spec.nodes > 0 {
        return format!(
            "{} per task, each with at least {}",
            plural(spec.nodes, "whole worker"),
            parts.join(", ")
        );
    }
    format!("{} per task", parts.join(", "))
}

/// The workers running a job's tasks now, with the allocation each came from: a page of its
/// running tasks (as many as `running`) and the worker list. Empty if it runs nothing, or if
/// either question fails (job info is still worth showing).
async fn running_on(s: &mut Session, job: JobId, running: u64) -> Vec<RunningOn> {
    if running == 0 {
        return Vec::new();
    }
    let mut tasks: BTreeMap<WorkerId, u64> = BTreeMap::new();
    // In the server's pages, at most 100,000 tasks in all.
    let want = running.min(100_000) as u32;
    let mut offset = 0;
    while offset < want {
        let page = Ask::TaskPage {
            job,
            state: Some(TaskState::Running),
            offset,
            limit: want - offset,
        };
        let Ok(Answer::TaskRange(page)) = s.call(page).await else {
            return Vec::new();
        };
        for w in page.rows.iter().filter_map(|r| r.worker) {
            *tasks.entry(w).or_default() += 1;
        }
        if page.rows.is_empty() {
            break;
        }
        offset += page.rows.len() as u32;
    }
    let Ok(Answer::Workers(ws)) = s.call(Ask::WorkerList).await else {
        return Vec::new();
    };
    tasks
        .into_iter()
        .map(|(worker, tasks)| {
            let from = ws.iter().find(|w| w.id == worker).and_then(|w| w.alloc);
            RunningOn {
                worker,
                tasks,
                alloc: from.map(|(alloc, _)| alloc),
                queue: from.map(|(_, queue)| queue),
            }
        })
        .collect()
}

/// "worker 3: 4 tasks (allocation 2 of queue 1); worker 5: 1 task", the first 8 workers.
fn running_on_line(on: &[RunningOn]) -> String {
    const SHOWN: usize = 8;
    let mut parts: Vec<String> = on
        .iter()
        .take(SHOWN)
        .map(|r| {
            let tasks = if r.tasks == 1 { "task" } else { "tasks" };
            let from = match (r.alloc, r.queue) {
                (Some(a), Some(q)) => format!(" (allocation {a} of queue {q})"),
                _ => String::new(),
            };
            format!("worker {}: {} {tasks}{from}", r.worker, r.tasks)
        })
        .collect();
    if on.len() > SHOWN {
        parts.push(format!("{} more workers", on.len() - SHOWN));
    }
    parts.join("; ")
}

fn print_job(d: &JobDetail, on: &[RunningOn]) {
    let s = &d.summary;
    let t = &d.spec.template;
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
            format!("{} / {}", json::sink(&t.stdout), json::sink(&t.stderr)),
        ),
        ("resources", resources(&d.spec)),
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
    ];
    let mut rows = rows;
    // "yet" only while the job runs: an ended job whose tasks all failed never has any.
    let yet = if s.finished_us.is_some() { "" } else { " yet" };
    // Means over the tasks that finished: none before the first one.
    let mean = |us: f64| {
        if d.timing.tasks == 0 {
            format!("- (no task finished{yet})")
        } else {
            output::micros(us)
        }
    };
    rows.extend([
        ("mean queue time", mean(d.timing.mean_queue_us)),
        ("mean wait for a slot", mean(d.timing.mean_waited_us)),
        ("mean dispatch overhead", mean(d.timing.mean_dispatch_us)),
        ("mean run time", mean(d.timing.mean_run_us)),
    ]);
    let f = &t.files;
    if !f.is_empty() {
        let list = |names: &[String]| {
            if names.is_empty() {
                "-".to_string()
            } else {
                names.join(" ")
            }
        };
        rows.push(("inputs", list(&f.inputs)));
        rows.push(("outputs", list(&crate::json::output_names(f))));
        if !f.statics.is_empty() {
            rows.push(("static inputs", list(&f.statics)));
        }
        let p = &d.spec.placement;
        rows.push((
            "store / policy",
            format!(
                "{} / {}",
                p.store.as_deref().unwrap_or("(the server's)"),
                p.policy
                    .map_or("(the server's)".to_string(), |p| p.to_string())
            ),
        ));
        let m = &d.transfers;
        let moved = |files: u64, bytes: u64| format!("{files} ({})", output::bytes(bytes));
        rows.extend([
            ("local hits", moved(m.local_files, m.local_bytes)),
            ("peer hits", moved(m.peer_files, m.peer_bytes)),
            ("store reads", moved(m.store_files, m.store_bytes)),
            (
                "hit ratio",
                m.hit_ratio()
                    .map_or(format!("- (no input staged{yet})"), |r| {
                        format!("{:.1}%", r * 100.0)
                    }),
            ),
        ]);
    }
    if !on.is_empty() {
        rows.insert(5, ("running on", running_on_line(on)));
    }
    if let Some(w) = &d.waiting {
        // An ended job's is why its tasks canceled for a dependency stay so.
        let label = if s.finished_us.is_some() {
            "canceled because"
        } else {
            "waiting"
        };
        rows.insert(4, (label, w.clone()));
    }
    let mut table = output::fields();
    for (k, v) in rows {
        table.add_row(vec![output::cell(k), output::cell(v)]);
    }
    output::print_table(&table);
}

fn shell_words(argv: &[String]) -> String {
    shlex::try_join(argv.iter().map(String::as_str)).unwrap_or_else(|_| argv.join(" "))
}

pub async fn server_info(g: &Global) -> Result<ExitCode> {
    let mut s = session::open(g, session::ONE_SHOT).await?;
    let Answer::Info(i) = s.call(Ask::ServerInfo).await? else {
        return Err(unexpected());
    };
    if g.output == Format::Json {
        output::json(&ServerView::from(&*i));
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
        if let Some((files, bytes)) = i.intermediates_deleted.filter(|d| d.0 > 0) {
            println!(
                "deleted   {files} intermediate files from caches ({})",
                output::bytes(bytes)
            );
        }
        if let Some(n) = i.intermediates_remade.filter(|&n| n > 0) {
            println!("re-ran    {n} tasks to make intermediate files lost with their workers");
        }
        if let Some((files, bytes)) = i.values_deleted.filter(|d| d.0 > 0) {
            println!(
                "deleted   {files} Python values from caches ({})",
                output::bytes(bytes)
            );
        }
        if let Some(t) = &i.traffic {
            println!(
                "traffic   {} from clients, {} to clients, {} from workers, {} to workers",
                output::bytes(t.from_clients),
                output::bytes(t.to_clients),
                output::bytes(t.from_workers),
                output::bytes(t.to_workers)
            );
        }
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
    let mut s = session::open(g, session::ONE_SHOT).await?;
    s.call(Ask::Stop).await?;
    if g.output == Format::Json {
        output::json(&serde_json::json!({ "stopping": true }));
    }
    eprintln!("server stopping");
    Ok(ExitCode::SUCCESS)
}
