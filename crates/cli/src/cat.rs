//! `kestrel job cat` and `kestrel task output`: what tasks wrote, in task order, wherever it is
//! kept: in files on the workers' file system (read here, so this command must run where they
//! can be seen), or in the server's log of streamed output (`--stdout stream`), read page by
//! page so a huge log never has to fit in one message.

use crate::args::{CatArgs, TaskOutputArgs};
use crate::exit::{self, NotFound};
use crate::session::{unexpected, Session};
use anyhow::{anyhow, bail, Context, Result};
use kestrel_core::placeholders::{names_one_task, per_task};
use kestrel_core::{IdRanges, JobId, Sink, TaskState};
use kestrel_proto::messages::{Answer, Ask, Kept, OutputRow, RowOutput};
use kestrel_proto::Client;
use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

/// Bytes of output asked for per page.
const PAGE_BYTES: u32 = 4 << 20;
/// Notes of one kind printed one by one; the rest are counted.
const NOTES_SHOWN: u32 = 5;

/// Whatever answers requests: a reconnecting session, or `run`'s own client.
pub(crate) trait Asker {
    async fn ask(&mut self, ask: Ask) -> Result<Answer>;
}

impl Asker for Session {
    async fn ask(&mut self, ask: Ask) -> Result<Answer> {
        Ok(self.call(ask).await?)
    }
}

impl Asker for Client {
    async fn ask(&mut self, ask: Ask) -> Result<Answer> {
        Ok(self.call(ask).await?)
    }
}

pub async fn job_cat(client: &mut impl Asker, a: CatArgs) -> Result<ExitCode> {
    let tasks = a
        .tasks
        .as_deref()
        .map(|t| IdRanges::parse(t).map_err(|e| anyhow!("--tasks {t:?}: {e}")))
        .transpose()?;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut notes = Notes::new(a.job, a.stderr);
    let shown = cat(client, a.job, a.stderr, tasks, &mut out, &mut notes).await;
    finish(out, shown)?;
    notes.summary();
    Ok(notes.exit_code())
}

pub async fn task_output(client: &mut impl Asker, a: TaskOutputArgs) -> Result<ExitCode> {
    let (job, task) = (a.job, a.task);
    let what = stream_name(a.stderr);
    let page = output_page(client, job, a.stderr, Some(IdRanges::span(task, task)), 0).await?;
    if page.sink == Sink::Null {
        bail!(
            "job {job} discards its tasks' {what} (submitted with --{what} none): nothing was kept"
        );
    }
    let Some(row) = page.rows.into_iter().next() else {
        bail!("the server sent no output for task {task} of job {job}");
    };
    let Some(state) = row.state else {
        return Err(NotFound(format!(
            "job {job} has no task {task}; `kestrel task list {job}` lists its tasks"
        ))
        .into());
    };
    let not_yet = |why: &str| anyhow!("task {task} of job {job} {why}");
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut notes = Notes::new(job, a.stderr);
    let files = Files::of(&page.sink, a.stderr);
    let written = matches!(row.output, RowOutput::Written(_));
    let shown = match row.output {
        RowOutput::Kept(k) => write_kept(&mut out, &k, task, &mut notes),
        RowOutput::Dropped(why) => bail!("the {what} of task {task} of job {job} was {why}"),
        RowOutput::File(path) | RowOutput::Written(path) => match std::fs::File::open(&path) {
            Ok(mut f) => io::copy(&mut f, &mut out).map(drop),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match files.missing(task, state, &path, written) {
                    Missing::NotYet => return Err(not_yet(not_run(state))),
                    Missing::Nothing => Ok(()),
                    Missing::Gone(why) => bail!("{why}"),
                }
            }
            Err(e) => bail!("cannot read the {what} of task {task} ({path}): {e}"),
        },
        RowOutput::Nothing => match state {
            TaskState::Running => {
                return Err(not_yet(
                    "is still running; its streamed output is kept when it ends",
                ))
            }
            s if !s.is_terminal() => return Err(not_yet(not_run(s))),
            // It ended and wrote nothing.
            _ => Ok(()),
        },
    };
    finish(out, shown.map_err(anyhow::Error::from))?;
    notes.summary();
    Ok(notes.exit_code())
}

/// Prints the streamed outputs of jobs that just ran under `kestrel run` (their server goes
/// away with the process), each job's in task order: streamed stdout to stdout, streamed
/// stderr to stderr. `jobs` says which of each job's streams are streamed.
pub async fn print_streamed(client: &mut Client, jobs: &[(JobId, [bool; 2])]) -> Result<()> {
    for &(job, streamed) in jobs {
        for stderr in [false, true] {
            if !streamed[usize::from(stderr)] {
                continue;
            }
            let mut notes = Notes::new(job, stderr);
            let shown = if stderr {
                let mut out = io::BufWriter::new(io::stderr().lock());
                let shown = cat(client, job, true, None, &mut out, &mut notes).await;
                finish(out, shown)
            } else {
                let mut out = io::BufWriter::new(io::stdout().lock());
                let shown = cat(client, job, false, None, &mut out, &mut notes).await;
                finish(out, shown)
            };
            shown?;
            notes.summary();
        }
    }
    Ok(())
}

/// Writes the outputs of `job`'s tasks (those in `tasks`, or all) to `out`, page by page;
/// what could not be shown goes into `notes`.
async fn cat(
    client: &mut impl Asker,
    job: JobId,
    stderr: bool,
    tasks: Option<IdRanges>,
    out: &mut impl Write,
    notes: &mut Notes,
) -> Result<()> {
    let mut from = 0;
    let mut files = None;
    loop {
        let page = output_page(client, job, stderr, tasks.clone(), from).await?;
        if page.sink == Sink::Null {
            let what = stream_name(stderr);
            bail!("job {job} discards its tasks' {what} (submitted with --{what} none): nothing was kept");
        }
        let files = files.get_or_insert_with(|| Files::of(&page.sink, stderr));
        for row in page.rows {
            show_row(row, out, notes, files)?;
        }
        match page.next {
            Some(next) => from = next,
            None => return Ok(()),
        }
    }
}

async fn output_page(
    client: &mut impl Asker,
    job: JobId,
    stderr: bool,
    tasks: Option<IdRanges>,
    from: u32,
) -> Result<kestrel_proto::messages::OutputPage> {
    let ask = Ask::Output {
        job,
        stderr,
        tasks,
        from,
        max_bytes: PAGE_BYTES,
    };
    match client.ask(ask).await? {
        Answer::Output(page) => Ok(page),
        _ => Err(unexpected()),
    }
}

/// Writes one task's output, or notes why there is none.
fn show_row(
    row: OutputRow,
    out: &mut impl Write,
    notes: &mut Notes,
    files: &mut Files,
) -> Result<()> {
    let Some(state) = row.state else {
        notes.absent.push(row.id);
        return Ok(());
    };
    let written = matches!(row.output, RowOutput::Written(_));
    match row.output {
        RowOutput::Kept(k) => write_kept(out, &k, row.id, notes)?,
        RowOutput::Dropped(why) => notes.dropped(row.id, &why),
        RowOutput::Nothing => {
            if !state.is_terminal() {
                notes.not_ended += 1;
            }
        }
        RowOutput::File(path) | RowOutput::Written(path) => {
            if !state.is_terminal() {
                // What a running task wrote so far is shown; it is counted as not ended.
                notes.not_ended += 1;
            }
            if !files.first_time(&path) {
                return Ok(());
            }
            match std::fs::File::open(&path) {
                Ok(mut f) => {
                    io::copy(&mut f, out).with_context(|| format!("reading {path}"))?;
                    if files.printed.is_some() {
                        notes.shared(&path);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match files.missing(row.id, state, &path, written) {
                        Missing::NotYet | Missing::Nothing => {}
                        Missing::Gone(why) => notes.unreadable(why),
                    }
                }
                Err(e) => notes.unreadable(format!(
                    "cannot read the output of task {} ({path}): {e}",
                    row.id
                )),
            }
        }
    }
    Ok(())
}

fn write_kept(out: &mut impl Write, k: &Kept, task: u32, notes: &mut Notes) -> io::Result<()> {
    out.write_all(&k.data)?;
    if k.truncated() {
        notes.truncated(task, k);
    }
    Ok(())
}

/// Flushes what was written; a reader that went away (`| head`) ends the output quietly.
fn finish(mut out: impl Write, shown: Result<()>) -> Result<()> {
    let flushed = out.flush().map_err(anyhow::Error::from);
    for r in [shown, flushed] {
        match r {
            Err(e) if broken_pipe(&e) => return Ok(()),
            other => other?,
        }
    }
    Ok(())
}

fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// How the output files of one stream of a job are read.
struct Files {
    stream: &'static str,
    /// Whether a task's file is its own (its path names `{job}` and `{task}`), which its
    /// worker removes when the task leaves it empty: missing, it means something only if the
    /// server knows the task wrote to it (`RowOutput::Written`). Other files are never
    /// removed: missing once the task has finished, they were deleted.
    own: bool,
    /// The files printed so far, when the job's tasks share files: each is printed once,
    /// whole (it holds the outputs of every task that writes it).
    printed: Option<HashSet<String>>,
}

/// What a missing output file means.
enum Missing {
    /// The task has not started (or is starting): no file yet.
    NotYet,
    /// The task wrote nothing there, or never ran, or that is not known.
    Nothing,
    /// It was there and is not: why, to say as an error.
    Gone(String),
}

impl Files {
    fn of(sink: &Sink, stderr: bool) -> Files {
        let pattern = match sink {
            Sink::File(p) => p.as_str(),
            Sink::Null | Sink::Stream { .. } => "",
        };
        Files {
            stream: stream_name(stderr),
            own: names_one_task(pattern),
            printed: (!per_task(None, pattern)).then(HashSet::new),
        }
    }

    /// Whether `path` is to be read: always, unless it is a shared file already read.
    fn first_time(&mut self, path: &str) -> bool {
        self.printed
            .as_mut()
            .is_none_or(|p| p.insert(path.to_string()))
    }

    /// What the absence of `path`, the file of `task` (in `state`), means; `written` if the
    /// server knows the task left output in it.
    fn missing(&self, task: u32, state: TaskState, path: &str, written: bool) -> Missing {
        if !state.is_terminal() {
            return Missing::NotYet;
        }
        // A canceled task may never have run, a failed one may have failed before it started
        // (an input missing), and a task's own file left empty was removed.
        let gone = written || (!self.own && state == TaskState::Finished);
        if !gone {
            return Missing::Nothing;
        }
        let dir = Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty());
        let what = format!("the {} file of task {task}, {path},", self.stream);
        Missing::Gone(if dir.is_none_or(Path::is_dir) {
            format!("{what} is missing: it was deleted or moved since the task wrote it")
        } else {
            format!(
                "{what} is missing and so is its directory: it was deleted, or is not on this machine (run this where the task's files are, or use --stdout stream to keep outputs on the server)"
            )
        })
    }
}

fn not_run(state: TaskState) -> &'static str {
    match state {
        TaskState::Assigned => "has not started yet (it is about to start on a worker); its output is there once it has run",
        TaskState::Running => "is still running",
        _ => "has not run yet (it is queued); its output is there once it has run",
    }
}

fn stream_name(stderr: bool) -> &'static str {
    if stderr {
        "stderr"
    } else {
        "stdout"
    }
}

/// What could not be shown, said once on stderr at the end (the first few one by one).
struct Notes {
    job: JobId,
    stream: &'static str,
    not_ended: u64,
    absent: Vec<u32>,
    truncated: u32,
    dropped: u32,
    unreadable: u32,
    /// Shared files printed, said once.
    shared: u32,
}

impl Notes {
    fn new(job: JobId, stderr: bool) -> Notes {
        Notes {
            job,
            stream: stream_name(stderr),
            not_ended: 0,
            absent: Vec::new(),
            truncated: 0,
            dropped: 0,
            unreadable: 0,
            shared: 0,
        }
    }

    fn truncated(&mut self, task: u32, k: &Kept) {
        self.truncated += 1;
        if self.truncated <= NOTES_SHOWN {
            eprintln!(
                "note: task {task} of job {} wrote {} bytes to {}; only the first {} were kept (--{} stream:SIZE keeps up to 4M)",
                self.job,
                k.total,
                self.stream,
                k.data.len(),
                self.stream
            );
        }
    }

    fn dropped(&mut self, task: u32, why: &str) {
        self.dropped += 1;
        if self.dropped <= NOTES_SHOWN {
            eprintln!(
                "note: the {} of task {task} of job {} was {why}",
                self.stream, self.job
            );
        }
    }

    fn shared(&mut self, path: &str) {
        self.shared += 1;
        if self.shared == 1 {
            eprintln!(
                "note: the tasks of job {} share {path}: it is printed once, as it is (each task's {} added to it whole)",
                self.job, self.stream
            );
        }
    }

    fn unreadable(&mut self, msg: String) {
        self.unreadable += 1;
        if self.unreadable <= NOTES_SHOWN {
            eprintln!("error: {msg}");
        }
    }

    /// The counts behind the notes not printed one by one.
    fn summary(&self) {
        let more = |n: u32, what: &str| {
            if n > NOTES_SHOWN {
                eprintln!("note: ... and {} more {what}", n - NOTES_SHOWN);
            }
        };
        more(self.truncated, "truncated outputs");
        more(self.dropped, "outputs not kept");
        more(self.unreadable, "unreadable output files");
        if !self.absent.is_empty() {
            let shown: Vec<String> = self.absent.iter().take(5).map(u32::to_string).collect();
            let etc = if self.absent.len() > 5 { ", ..." } else { "" };
            eprintln!(
                "note: job {} has no task{} {}{etc}",
                self.job,
                if self.absent.len() == 1 { "" } else { "s" },
                shown.join(", ")
            );
        }
        if self.not_ended > 0 {
            eprintln!(
                "note: {} task(s) of job {} have not ended yet; their output is complete once they have (`kestrel job wait {}`)",
                self.not_ended, self.job, self.job
            );
        }
    }

    /// 2 (trouble) when an output file could not be read, else 0.
    fn exit_code(&self) -> ExitCode {
        if self.unreadable > 0 {
            exit::code(exit::ERROR)
        } else {
            ExitCode::SUCCESS
        }
    }
}
