//! The queries that scale to long histories and big jobs, and the status poll of scripts:
//! `job list` (filtered by the server), `job state`, `job forget`, `task list` (in pages) and
//! `task info`.

use crate::args::{Global, JobStateArg, Status, TaskCommand};
use crate::cat::Asker;
use crate::exit;
use crate::exit::refused_jobs;
use crate::json::{self, JobListView, JobOutcome, JobView, TaskInfoView, TaskListView, TaskView};
use crate::output::{self, plural, Format};
use crate::session::{self, unexpected, Session};
use anyhow::Result;
use kestrel_core::{JobId, TaskState};
use kestrel_proto::messages::{Answer, Ask, JobFilter, JobState, JobsPage, TaskDetail};
use serde::Serialize;
use std::process::ExitCode;

fn job_state_of(s: JobStateArg) -> JobState {
    match s {
        JobStateArg::Queued => JobState::Queued,
        JobStateArg::Running => JobState::Running,
        JobStateArg::Finished => JobState::Finished,
        JobStateArg::Failed => JobState::Failed,
        JobStateArg::Canceled => JobState::Canceled,
    }
}

fn task_state_of(s: Status) -> TaskState {
    match s {
        Status::Queued => TaskState::Ready,
        Status::Waiting => TaskState::Waiting,
        Status::Assigned => TaskState::Assigned,
        Status::Running => TaskState::Running,
        Status::Finished => TaskState::Finished,
        Status::Failed => TaskState::Failed,
        Status::Canceled => TaskState::Canceled,
    }
}

/// `kestrel job list`.
pub async fn job_list(
    g: &Global,
    s: &mut Session,
    states: Vec<JobStateArg>,
    name: Option<String>,
    last: u32,
) -> Result<ExitCode> {
    let filtered = !states.is_empty() || name.is_some();
    let mut filter = JobFilter {
        states: states.into_iter().map(job_state_of).collect(),
        name,
        last,
        before: None,
    };
    let page = jobs_in_pages(s, &mut filter).await?;
    if g.output == Format::Json {
        output::json(&JobListView {
            jobs: page.jobs.iter().map(JobView::from).collect(),
            more: page.more,
        });
        return Ok(ExitCode::SUCCESS);
    }
    // Notes (an empty result, a page left out) go to stderr: stdout has the table alone.
    if page.jobs.is_empty() {
        if filtered {
            eprintln!("no jobs match; `kestrel job list` without filters shows them all");
        } else {
            eprintln!("no jobs; submit one with `kestrel submit`");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = output::table(&["id", "name", "state", "tasks", "progress", "submitted"]);
    for j in &page.jobs {
        t.add_row(vec![
            output::cell(j.id),
            output::cell(&j.name),
            output::cell(&j.state),
            output::cell(j.counts.total()),
            output::cell(progress(j)),
            output::cell(output::ago(j.submitted_us)),
        ]);
    }
    output::print_table(&t);
    if page.more > 0 {
        eprintln!(
            "... and {} (--last N shows more, --last 0 all)",
            plural(page.more, "older job")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The jobs `filter` lets through, asked a page at a time: a server cuts an answer at
/// `MAX_JOB_PAGE` jobs (newest first), so while it left out older jobs that `last` still
/// wants (every one, for `--last 0`), the next page is asked with `before`, the oldest so far.
async fn jobs_in_pages(s: &mut Session, filter: &mut JobFilter) -> Result<JobsPage> {
    let want = filter.last;
    let mut pages: Vec<JobsPage> = Vec::new();
    loop {
        let Answer::JobsPage(page) = s
            .call(Ask::Jobs {
                filter: filter.clone(),
            })
            .await?
        else {
            return Err(unexpected());
        };
        let got: u64 = pages
            .iter()
            .chain([&page])
            .map(|p| p.jobs.len() as u64)
            .sum();
        let oldest = page.jobs.first().map(|j| j.id);
        let more = page.more;
        pages.push(page);
        let wanted = want == 0 || got < u64::from(want);
        match oldest {
            // (An empty page, even with more left, ends it: the same question would follow.)
            Some(oldest) if more > 0 && wanted => {
                filter.before = Some(oldest);
                if want > 0 {
                    filter.last = want - got as u32;
                }
            }
            _ => break,
        }
    }
    // Oldest first: the last page asked holds the oldest jobs.
    let more = pages.last().map_or(0, |p| p.more);
    let jobs = pages.into_iter().rev().flat_map(|p| p.jobs).collect();
    Ok(JobsPage { jobs, more })
}

/// A listed job's progress, and what its waiting tasks wait for: `5 waiting for 3, 4:2`.
fn progress(j: &kestrel_proto::messages::JobSummary) -> String {
    let counts = output::counts(&j.counts);
    let on = crate::json::waits_for(j);
    if on.is_empty() {
        counts
    } else {
        format!("{counts} for {}", on.join(", "))
    }
}

/// One line of `job state --output json`.
#[derive(Serialize)]
struct JobStateView {
    id: JobId,
    /// A job state, or `unknown`.
    state: &'static str,
}

/// `kestrel job state`: `ID STATE` per job, one request for all; exit status 3 if some id is
/// unknown. With `snakemake`, the word alone that Snakemake's status command must print.
pub async fn job_state(
    g: &Global,
    s: &mut Session,
    jobs: Vec<JobId>,
    snakemake: bool,
) -> Result<ExitCode> {
    let Answer::JobStates(states) = s.call(Ask::JobStates { jobs }).await? else {
        return Err(unexpected());
    };
    if snakemake {
        let mut out = String::new();
        for &(_, st) in &states {
            out.push_str(snakemake_status(st));
            out.push('\n');
        }
        print!("{out}");
        // Snakemake takes any other status for its own failure to ask.
        return Ok(ExitCode::SUCCESS);
    }
    let name = |st: Option<JobState>| st.map_or("unknown", JobState::name);
    if g.output == Format::Json {
        let jobs: Vec<JobStateView> = states
            .iter()
            .map(|&(id, st)| JobStateView {
                id,
                state: name(st),
            })
            .collect();
        output::json(&json::Jobs { jobs });
    } else {
        // One write for all lines: a poll of thousands of jobs stays one syscall.
        let mut out = String::with_capacity(states.len() * 12);
        for &(id, st) in &states {
            out.push_str(&format!("{id} {}\n", name(st)));
        }
        print!("{out}");
    }
    if states.iter().any(|(_, st)| st.is_none()) {
        return Ok(exit::code(exit::NOT_FOUND));
    }
    Ok(ExitCode::SUCCESS)
}

/// What Snakemake's cluster-generic executor understands of a job state: a job the server does
/// not have (forgotten) will never succeed.
fn snakemake_status(state: Option<JobState>) -> &'static str {
    match state {
        Some(JobState::Queued | JobState::Running) => "running",
        Some(JobState::Finished) => "success",
        Some(JobState::Failed | JobState::Canceled) | None => "failed",
    }
}

/// `kestrel job forget`.
pub async fn job_forget(
    g: &Global,
    s: &mut Session,
    jobs: Vec<JobId>,
    all_ended: bool,
) -> Result<ExitCode> {
    let Answer::Forgotten(results) = s.call(Ask::Forget { jobs, all_ended }).await? else {
        return Err(unexpected());
    };
    let forgotten: Vec<JobId> = results
        .iter()
        .filter(|r| r.result.is_ok())
        .map(|r| r.job)
        .collect();
    if g.output == Format::Json {
        let out: Vec<JobOutcome<()>> = results
            .iter()
            .map(|r| JobOutcome {
                id: r.job,
                error: r.result.as_ref().err().map(ToString::to_string),
                done: None,
            })
            .collect();
        output::json(&json::Jobs { jobs: out });
    } else if forgotten.is_empty() {
        if all_ended && results.is_empty() {
            println!("no ended jobs to forget");
        }
    } else {
        println!("forgot {}", output::jobs(&forgotten));
    }
    let refused = refused_jobs(results.iter().filter_map(|r| r.result.as_ref().err()));
    Ok(refused.map_or(ExitCode::SUCCESS, exit::code))
}

/// `kestrel task ...`.
pub async fn task(g: &Global, cmd: TaskCommand) -> Result<ExitCode> {
    let mut s = session::open(g, session::ONE_SHOT).await?;
    match cmd {
        TaskCommand::List {
            job,
            state,
            offset,
            limit,
        } => task_list(g, &mut s, job, state, offset, limit).await,
        TaskCommand::Info { job, task } => task_info(g, &mut s, job, task).await,
        TaskCommand::Output(a) => crate::cat::task_output(&mut s, a).await,
    }
}

async fn task_list(
    g: &Global,
    s: &mut Session,
    job: JobId,
    state: Option<Status>,
    offset: u32,
    limit: u32,
) -> Result<ExitCode> {
    let ask = Ask::TaskPage {
        job,
        state: state.map(task_state_of),
        offset,
        limit,
    };
    let Answer::TaskRange(page) = s.call(ask).await? else {
        return Err(unexpected());
    };
    let end = page.offset + page.rows.len() as u64;
    let next_offset = (end < page.matched && !page.rows.is_empty()).then_some(end);
    if g.output == Format::Json {
        output::json(&TaskListView {
            job,
            tasks: page.rows.iter().map(|r| TaskView::new(job, r)).collect(),
            offset: page.offset,
            matched: page.matched,
            next_offset,
        });
        return Ok(ExitCode::SUCCESS);
    }
    // Notes (an empty page, where the next one starts) go to stderr: stdout has the table.
    if page.rows.is_empty() {
        if page.matched > 0 {
            eprintln!(
                "no tasks from offset {offset}: {} match (`--offset 0` starts again)",
                page.matched
            );
        } else {
            eprintln!("no tasks match");
        }
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
    for r in &page.rows {
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
            output::cell(r.id),
            output::cell(json::task_state(r.state)),
            output::cell(r.worker.map_or("-".into(), |w| w.to_string())),
            output::cell(run_time(r)),
            output::cell(json::attempts(r)),
            output::cell(json::exit_code(r).map_or("-".into(), |c| c.to_string())),
            output::cell(why),
        ]);
    }
    output::print_table(&t);
    if let Some(next) = next_offset {
        let state = state.map_or(String::new(), |s| {
            format!(" --state {}", json::task_state(task_state_of(s)))
        });
        // A page shorter than asked that does not reach the end: the server's page size.
        let shown = page.rows.len() as u32;
        let (limit, capped) = if shown < limit {
            (
                shown.min(kestrel_proto::messages::MAX_TASK_PAGE),
                format!(
                    " (the server sends at most {} tasks a page)",
                    kestrel_proto::messages::MAX_TASK_PAGE
                ),
            )
        } else {
            (limit, String::new())
        };
        eprintln!(
            "tasks {}-{end} of {}{capped}; next page: kestrel task list {job}{state} --offset {next} --limit {limit}",
            page.offset + 1,
            page.matched
        );
    } else if page.offset > 0 {
        eprintln!("tasks {}-{end} of {}", page.offset + 1, page.matched);
    }
    Ok(ExitCode::SUCCESS)
}

async fn task_info(g: &Global, s: &mut Session, job: JobId, task: u32) -> Result<ExitCode> {
    let Answer::Task(d) = s.call(Ask::TaskInfo { job, task }).await? else {
        return Err(unexpected());
    };
    if g.output == Format::Json {
        output::json(&TaskInfoView::from(&*d));
    } else {
        print_task(&d);
    }
    Ok(ExitCode::SUCCESS)
}

/// `kestrel task info` for people.
fn print_task(d: &TaskDetail) {
    let r = &d.task;
    let paths = json::resolve(d);
    let time = |us: u64| if us == 0 { "-".into() } else { output::ago(us) };
    let worker = match (r.worker, &d.worker_host) {
        (None, _) => "-".to_string(),
        (Some(w), Some(host)) => format!("{w} ({host})"),
        (Some(w), None) => format!("{w} (no longer connected)"),
    };
    let worker = match d.nodes.as_slice() {
        [_, _, ..] => {
            let ids: Vec<String> = d.nodes.iter().map(u32::to_string).collect();
            format!("{worker}; its nodes: workers {}", ids.join(", "))
        }
        _ => worker,
    };
    let ended = match (json::exit_code(r), json::end_signal(d)) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "-".into(),
    };
    let command = shlex::try_join(paths.command.iter().map(String::as_str))
        .unwrap_or_else(|_| paths.command.join(" "));
    let rows: Vec<(&str, String)> = vec![
        ("task", format!("{} of job {}", r.id, d.job)),
        ("state", json::task_state(r.state).into()),
        ("worker", worker),
        (
            "attempts",
            format!(
                "{} runs started; {} failed since the last `job retry` (each spends a retry), {} lost with their worker",
                json::attempts(r),
                r.failures,
                r.lost
            ),
        ),
        ("assigned", time(r.assigned_us)),
        ("started", time(r.started_us)),
        ("finished", time(r.finished_us)),
        ("run time", run_time(r)),
        ("ended with", ended),
        match (&r.reason, r.state) {
            (Some(why), TaskState::Failed) => ("reason", why.clone()),
            // Not this run's end: the failure of a run before (the task runs or waits again).
            (Some(why), _) => ("earlier run", format!("failed: {why}")),
            (None, _) => ("reason", "-".into()),
        },
        ("command", command),
        (
            "directory",
            paths.directory.unwrap_or_else(|| "(worker's)".into()),
        ),
        ("stdout", paths.stdout),
        ("stderr", paths.stderr),
    ];
    let mut table = output::fields();
    for (k, v) in rows {
        table.add_row(vec![output::cell(k), output::cell(v)]);
    }
    output::print_table(&table);
    if let Some(tail) = &r.stderr_tail {
        println!("end of stderr:");
        for line in tail.lines() {
            println!("  {}", output::escape_controls(line, true));
        }
    }
}

/// A task's run time for people: its last run's once ended, the time so far while it runs.
fn run_time(r: &kestrel_proto::messages::TaskRow) -> String {
    match json::run_us(r) {
        Some(us) => output::micros(us as f64),
        None if r.state == kestrel_core::TaskState::Running && r.started_us > 0 => {
            let now = kestrel_server::now_us();
            format!(
                "{} so far",
                output::micros(now.saturating_sub(r.started_us) as f64)
            )
        }
        None => "-".into(),
    }
}

/// How many failed tasks of each job a list shows, and what it says of the others.
pub enum FailureList<'a> {
    /// The first few, then the command that lists the rest; `reach` is the global options that
    /// reach the same server (see [`crate::session::reach`]).
    First { reach: &'a str },
    /// Every one: nothing will be left to ask once the command ends (a run without a record).
    All,
}

/// Failed tasks shown per job before the command that lists the rest.
pub const FAILURES_SHOWN: u32 = 10;

/// Prints failed tasks of each job with their reason and stderr tail (on stderr): what a run or
/// a wait that ended with failures owes its user. A courtesy after the result: give it a
/// connection that does not wait out a reconnection window, and a server gone meanwhile ends
/// the list.
pub async fn show_failures(asker: &mut impl Asker, ids: &[JobId], list: FailureList<'_>) {
    for &job in ids {
        let limit = match list {
            FailureList::First { .. } => FAILURES_SHOWN,
            FailureList::All => 1000,
        };
        let mut offset = 0;
        loop {
            let Ok(page) = failed_page(asker, job, offset, limit).await else {
                return;
            };
            for r in &page.rows {
                eprintln!("{}", failure_line(job, r));
            }
            offset += page.rows.len() as u32;
            let left = page.matched.saturating_sub(u64::from(offset));
            if left == 0 || page.rows.is_empty() {
                break;
            }
            if let FailureList::First { reach } = list {
                eprintln!(
                    "job {job}: ... and {} (`kestrel {reach}task list {job} --state failed`)",
                    crate::output::plural(left, "more failed task")
                );
                break;
            }
        }
    }
}

/// `job 3 task 7: exit code 2 | the last line of its stderr`.
fn failure_line(job: JobId, r: &kestrel_proto::messages::TaskRow) -> String {
    let reason = r.reason.as_deref().unwrap_or("failed");
    let tail = r
        .stderr_tail
        .as_deref()
        .and_then(|t| t.lines().last())
        .unwrap_or("");
    let line = if tail.is_empty() {
        format!("job {job} task {}: {reason}", r.id)
    } else {
        format!("job {job} task {}: {reason} | {tail}", r.id)
    };
    output::clean(&line).into_owned()
}

/// Every failed task of the jobs, for `run --output json` (its server goes away with it).
pub async fn failed_tasks(asker: &mut impl Asker, ids: &[JobId]) -> Result<Vec<TaskView>> {
    let mut out = Vec::new();
    for &job in ids {
        let mut offset = 0;
        loop {
            let page = failed_page(asker, job, offset, 1000).await?;
            out.extend(page.rows.iter().map(|r| TaskView::new(job, r)));
            offset += page.rows.len() as u32;
            if page.rows.is_empty() || u64::from(offset) >= page.matched {
                break;
            }
        }
    }
    Ok(out)
}

/// A page of a job's failed tasks.
async fn failed_page(
    asker: &mut impl Asker,
    job: JobId,
    offset: u32,
    limit: u32,
) -> Result<kestrel_proto::messages::TaskRange> {
    let ask = Ask::TaskPage {
        job,
        state: Some(TaskState::Failed),
        offset,
        limit,
    };
    match asker.ask(ask).await? {
        Answer::TaskRange(page) => Ok(page),
        _ => Err(unexpected()),
    }
}
