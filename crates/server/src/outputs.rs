//! The output log: what the tasks of jobs with streamed output (`--stdout stream`) wrote, kept
//! by the server per job and task, read back by `kestrel job cat` and `kestrel task output`.
//!
//! With a journal, outputs live in its `output` table, written in the same transaction as the
//! task ends they come with (a restart gives back both or neither), and are read from there
//! when asked for: nothing per task stays in the server's memory (a full journal that leaves a
//! batch's task ends out leaves their outputs out too). Without a journal they are kept in
//! memory, at most [`MEMORY_LIMIT`] bytes in all; outputs that arrive
//! past it are dropped, and reading them says why. Only the latest run of a task counts: a
//! re-run replaces (or, if it wrote nothing, removes) what an earlier run left.

use crate::file_marks::FileMarks;
use crate::journal::{Journal, Pending};
use kestrel_core::placeholders::{output_path, Values};
use kestrel_core::{IdRanges, Job, JobId, JobSpec, Sink, TaskIndex};
use kestrel_proto::messages::{Kept, OutputPage, OutputRow, RowOutput, TaskOutput};
use rusqlite::{params, OptionalExtension, Transaction};
use rustc_hash::FxHashMap;

/// Streamed output kept in memory at most, over all jobs, when there is no journal.
pub const MEMORY_LIMIT: u64 = 1 << 30;
/// Bytes of output a page carries at most (one task's may go over it): with one task's worth on
/// top (at most 4 MiB), a page stays well under a frame.
const PAGE_BYTES: u32 = 8 << 20;
/// Tasks a page lists at most (paths and empty outputs cost bytes too).
const PAGE_ROWS: usize = 10_000;

/// Which of a task's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout = 0,
    Stderr = 1,
}

impl Stream {
    pub fn of(stderr: bool) -> Stream {
        if stderr {
            Stream::Stderr
        } else {
            Stream::Stdout
        }
    }

    /// Where this stream of the job's tasks goes.
    pub fn sink(self, spec: &JobSpec) -> &Sink {
        match self {
            Stream::Stdout => &spec.template.stdout,
            Stream::Stderr => &spec.template.stderr,
        }
    }

    fn of_output(self, output: Option<&mut TaskOutput>) -> Option<Kept> {
        let o = output?;
        match self {
            Stream::Stdout => o.stdout.take(),
            Stream::Stderr => o.stderr.take(),
        }
    }
}

/// A change to the journal's `output` table, written by [`Journal::commit`].
pub(crate) enum OutputOp {
    /// A run's output, replacing the task's earlier one.
    Put {
        job: JobId,
        index: TaskIndex,
        stream: Stream,
        kept: Kept,
    },
    /// A run that wrote nothing: the task's earlier output goes.
    Clear {
        job: JobId,
        index: TaskIndex,
        stream: Stream,
    },
    /// Every output of a job goes (`kestrel job forget`).
    Forget { job: JobId },
}

impl OutputOp {
    /// Whether it drops a forgotten job's outputs (kept even when the journal has no room for
    /// task ends, since it makes room).
    pub(crate) fn is_forget(&self) -> bool {
        matches!(self, OutputOp::Forget { .. })
    }

    pub(crate) fn apply(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        match self {
            OutputOp::Put {
                job,
                index,
                stream,
                kept,
            } => {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO output(job, task, stream, total, data) VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![job, index, *stream as u8, kept.total as i64, kept.data])?;
            }
            OutputOp::Clear { job, index, stream } => {
                tx.prepare_cached(
                    "DELETE FROM output WHERE job = ?1 AND task = ?2 AND stream = ?3",
                )?
                .execute(params![job, index, *stream as u8])?;
            }
            OutputOp::Forget { job } => {
                tx.prepare_cached("DELETE FROM output WHERE job = ?1")?
                    .execute(params![job])?;
            }
        }
        Ok(())
    }
}

/// Where one task's output is in a [`Stored`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    chunk: u32,
    start: u32,
    len: u32,
}

impl Span {
    /// Nothing in memory (look in the journal).
    const ABSENT: Span = Span {
        chunk: u32::MAX,
        start: 0,
        len: 0,
    };
    /// Dropped: memory was full.
    const DROPPED: Span = Span {
        chunk: u32::MAX - 1,
        start: 0,
        len: 0,
    };
    /// The latest run wrote nothing.
    const EMPTY: Span = Span {
        chunk: u32::MAX - 2,
        start: 0,
        len: 0,
    };
}

/// The outputs of one stream of one job, in memory: the bytes in chunks that never move
/// (appending never copies what is there), and 12 bytes per task saying where its bytes are.
#[derive(Default)]
struct Stored {
    chunks: Vec<Vec<u8>>,
    /// By task index.
    spans: Vec<Span>,
    /// What cut outputs wrote in all, by task index (rare).
    totals: FxHashMap<TaskIndex, u64>,
}

impl Stored {
    /// Bytes this takes from the heap (what the memory limit counts).
    fn heap_bytes(&self) -> u64 {
        let chunks: usize = self.chunks.iter().map(Vec::capacity).sum();
        (chunks + self.spans.capacity() * std::mem::size_of::<Span>()) as u64
    }

    fn set(&mut self, index: TaskIndex, span: Span) {
        let i = index as usize;
        if self.spans.len() <= i {
            self.spans.resize(i + 1, Span::ABSENT);
        }
        self.spans[i] = span;
    }

    /// Appends `data`; chunks grow with the log (4 KiB to 1 MiB) so a job with little output
    /// holds little.
    fn append(&mut self, data: &[u8]) -> Span {
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| c.capacity() - c.len() >= data.len());
        if !fits {
            let grown = self.chunks.iter().map(Vec::capacity).sum::<usize>();
            let size = grown.clamp(4 << 10, 1 << 20).max(data.len());
            self.chunks.push(Vec::with_capacity(size));
        }
        let chunk = self.chunks.len() - 1;
        let c = &mut self.chunks[chunk];
        let start = c.len();
        c.extend_from_slice(data);
        Span {
            chunk: chunk as u32,
            start: start as u32,
            len: data.len() as u32,
        }
    }

    fn get(&self, index: TaskIndex) -> Option<RowOutput> {
        let span = *self.spans.get(index as usize)?;
        match span {
            Span::ABSENT => None,
            Span::DROPPED => Some(RowOutput::Dropped(format!(
                "not kept: without a journal the server keeps at most {} MiB of streamed output in memory, and it was full; write large outputs to files (--stdout PATH)",
                MEMORY_LIMIT >> 20
            ))),
            Span::EMPTY => Some(RowOutput::Nothing),
            Span { chunk, start, len } => {
                let bytes = self.chunks.get(chunk as usize)?;
                let data = bytes.get(start as usize..(start + len) as usize)?.to_vec();
                let total = self.totals.get(&index).copied().unwrap_or(len as u64);
                Some(RowOutput::Kept(Kept { data, total }))
            }
        }
    }
}

/// The output log of every job.
pub struct OutputLog {
    /// Outputs kept in memory (no journal), by job: stdout and stderr.
    memory: FxHashMap<JobId, [Stored; 2]>,
    /// Heap bytes of `memory`.
    held: u64,
    limit: u64,
    /// Whether any job streams an output (until then task ends skip this module).
    streaming: bool,
    /// Which own output files of tasks hold output, for the rows of jobs that write files.
    pub files: FileMarks,
}

impl Default for OutputLog {
    fn default() -> Self {
        OutputLog::new(MEMORY_LIMIT)
    }
}

impl OutputLog {
    /// A log that keeps at most `limit` bytes in memory.
    pub fn new(limit: u64) -> OutputLog {
        OutputLog {
            memory: FxHashMap::default(),
            held: 0,
            limit,
            streaming: false,
            files: FileMarks::default(),
        }
    }

    /// Notes a job (submitted or restored); its task ends concern this log if it streams.
    pub fn note_job(&mut self, spec: &JobSpec) {
        self.streaming |= spec.template.stdout.is_stream() || spec.template.stderr.is_stream();
        self.files.note_job(spec);
    }

    /// Whether a task end may concern this log.
    pub fn streaming(&self) -> bool {
        self.streaming
    }

    /// Bytes of output held in memory.
    #[cfg(test)]
    pub fn memory_bytes(&self) -> u64 {
        self.held
    }

    /// Records the output of an accepted run of a task of `spec`'s job. `rerun` says the task
    /// ran before, so an output of that run may be stored: a run that wrote nothing removes it. With `journal`, the changes go into the journal's pending transaction.
    pub fn record(
        &mut self,
        spec: &JobSpec,
        job: JobId,
        index: TaskIndex,
        rerun: bool,
        mut output: Option<TaskOutput>,
        mut journal: Option<&mut Pending>,
    ) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            if !stream.sink(spec).is_stream() {
                continue;
            }
            let kept = stream.of_output(output.as_mut()).filter(|k| k.total > 0);
            if kept.is_none() && !rerun {
                continue;
            }
            match journal.as_deref_mut() {
                Some(p) => p.outputs.push(match kept {
                    Some(kept) => OutputOp::Put {
                        job,
                        index,
                        stream,
                        kept,
                    },
                    None => OutputOp::Clear { job, index, stream },
                }),
                None => self.keep(job, index, stream, kept),
            }
        }
    }

    fn keep(&mut self, job: JobId, index: TaskIndex, stream: Stream, kept: Option<Kept>) {
        let stored = &mut self.memory.entry(job).or_default()[stream as usize];
        let before = stored.heap_bytes();
        let span = match kept {
            None => Span::EMPTY,
            // (A new chunk or a longer index may take the log a little past the limit.)
            Some(k) if self.held + k.data.len() as u64 > self.limit => Span::DROPPED,
            Some(k) => {
                let span = stored.append(&k.data);
                if k.truncated() {
                    stored.totals.insert(index, k.total);
                } else {
                    stored.totals.remove(&index);
                }
                span
            }
        };
        stored.set(index, span);
        self.held = self.held + stored.heap_bytes() - before;
    }

    /// Drops every output of `job` (`kestrel job forget`); with `journal`, from the journal too
    /// (in its pending transaction).
    pub fn forget(&mut self, job: JobId, journal: Option<&mut Pending>) {
        self.files.forget(job);
        if let Some(stored) = self.memory.remove(&job) {
            self.held -= stored.iter().map(Stored::heap_bytes).sum::<u64>();
        }
        if let Some(p) = journal {
            p.outputs.push(OutputOp::Forget { job });
        }
    }

    /// A page of the outputs of `job` (see [`kestrel_proto::messages::Ask::Output`]). Pending
    /// journal changes must have been committed first.
    pub fn page(
        &self,
        journal: Option<&Journal>,
        job: &Job,
        stream: Stream,
        tasks: Option<&IdRanges>,
        from: u32,
        max_bytes: u32,
    ) -> Result<OutputPage, String> {
        let sink = stream.sink(&job.spec).clone();
        let count = tasks.map_or(job.len(), IdRanges::len);
        let mut page = OutputPage {
            sink,
            rows: Vec::new(),
            next: None,
        };
        if page.sink == Sink::Null {
            return Ok(page);
        }
        let budget = max_bytes.clamp(1, PAGE_BYTES) as usize;
        let (mut pos, mut bytes) = (from, 0usize);
        while pos < count && page.rows.len() < PAGE_ROWS && (page.rows.is_empty() || bytes < budget)
        {
            let (id, index) = match tasks {
                Some(t) => {
                    let id = t.id_at(pos).unwrap_or_default();
                    (id, job.index_of(id))
                }
                None => (job.task_id(pos), Some(pos)),
            };
            pos += 1;
            let Some(index) = index else {
                page.rows.push(OutputRow {
                    id,
                    state: None,
                    output: RowOutput::Nothing,
                });
                continue;
            };
            let output = match &page.sink {
                Sink::File(_) => {
                    let (job_id, task_id) = (job.id.to_string(), id.to_string());
                    let values = Values {
                        job: &job_id,
                        task: &task_id,
                        line: job.tasks.line(index),
                    };
                    let path = output_path(&job.spec.template, &page.sink, &values)
                        .unwrap_or_default()
                        .display()
                        .to_string();
                    bytes += path.len();
                    match self.files.written(job.id, index, stream as usize) {
                        Some(true) => RowOutput::Written(path),
                        // Left empty, and removed by its worker.
                        Some(false) => RowOutput::Nothing,
                        None => RowOutput::File(path),
                    }
                }
                _ => self.read(journal, job.id, index, stream)?,
            };
            if let RowOutput::Kept(k) = &output {
                bytes += k.data.len();
            }
            page.rows.push(OutputRow {
                id,
                state: Some(job.record(index).state),
                output,
            });
        }
        page.next = (pos < count).then_some(pos);
        Ok(page)
    }

    /// What task `index` of `job` wrote to `stream`, if it is kept (from memory, else from
    /// the journal, whose pending changes must have been committed first): a watch's end of a
    /// task that ended before it was watched.
    pub fn kept(
        &self,
        journal: Option<&Journal>,
        job: JobId,
        index: TaskIndex,
        stream: Stream,
    ) -> Result<Option<Kept>, String> {
        Ok(match self.read(journal, job, index, stream)? {
            RowOutput::Kept(k) => Some(k),
            _ => None,
        })
    }

    /// One task's output: from memory if it is there, else from the journal.
    fn read(
        &self,
        journal: Option<&Journal>,
        job: JobId,
        index: TaskIndex,
        stream: Stream,
    ) -> Result<RowOutput, String> {
        if let Some(out) = self
            .memory
            .get(&job)
            .and_then(|s| s[stream as usize].get(index))
        {
            return Ok(out);
        }
        let Some(j) = journal else {
            return Ok(RowOutput::Nothing);
        };
        let row = j
            .conn()
            .prepare_cached(
                "SELECT total, data FROM output WHERE job = ?1 AND task = ?2 AND stream = ?3",
            )
            .and_then(|mut st| {
                st.query_row(params![job, index, stream as u8], |r| {
                    Ok(Kept {
                        total: r.get::<_, i64>(0)? as u64,
                        data: r.get(1)?,
                    })
                })
                .optional()
            })
            .map_err(|e| format!("cannot read the output log in {}: {e}", j.path().display()))?;
        Ok(row.map_or(RowOutput::Nothing, RowOutput::Kept))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::{Config, Finished, RunEnd, Scheduler, TaskSet};

    fn spec(stdout: Sink, stderr: Sink) -> JobSpec {
        let mut spec = JobSpec::command("t", vec!["echo".into()]);
        spec.template.cwd = Some("/w".into());
        spec.template.stdout = stdout;
        spec.template.stderr = stderr;
        spec
    }

    fn stream() -> Sink {
        Sink::Stream { limit: 1 << 20 }
    }

    /// A scheduler holding one job with ids `ids` and the given sinks.
    fn job_with(ids: &str, stdout: Sink, stderr: Sink) -> (Scheduler, JobId) {
        let mut core = Scheduler::new(Config::default());
        let tasks = TaskSet::Array(IdRanges::parse(ids).unwrap());
        let submit = kestrel_core::Event::Submit {
            spec: Box::new(spec(stdout, stderr)),
            tasks,
            open: false,
            key: None,
        };
        let Ok(kestrel_core::Reply::Submitted(job)) = core.handle(1, submit) else {
            panic!("the job is valid")
        };
        (core, job)
    }

    fn out(job: JobId, index: TaskIndex, text: &str, total: u64) -> TaskOutput {
        TaskOutput {
            job,
            index,
            files: 0,
            stdout: Some(Kept {
                data: text.as_bytes().to_vec(),
                total,
            }),
            stderr: None,
        }
    }

    fn texts(page: &OutputPage) -> Vec<String> {
        page.rows
            .iter()
            .map(|r| match &r.output {
                RowOutput::Kept(k) => String::from_utf8_lossy(&k.data).into_owned(),
                RowOutput::Nothing => "-".into(),
                RowOutput::File(p) => format!("file {p}"),
                RowOutput::Written(p) => format!("written {p}"),
                RowOutput::Dropped(_) => "dropped".into(),
            })
            .collect()
    }

    #[test]
    fn memory_keeps_the_latest_run_in_task_order_within_its_limit() {
        let (core, job) = job_with("10-14", stream(), Sink::Null);
        let s = &core.job(job).unwrap().spec;
        // The first chunk takes 4 KiB.
        let mut log = OutputLog::new(5000);
        log.note_job(s);
        assert!(log.streaming());
        log.record(s, job, 3, false, Some(out(job, 3, "three\n", 6)), None);
        log.record(s, job, 0, false, Some(out(job, 0, "zero\n", 5)), None);
        log.record(s, job, 1, false, Some(out(job, 1, "one!", 1000)), None);
        // A re-run replaces the output; a re-run that wrote nothing removes it.
        log.record(s, job, 0, true, Some(out(job, 0, "ZERO\n", 5)), None);
        log.record(s, job, 3, true, None, None);
        // Past the limit, outputs are dropped, not kept.
        log.record(
            s,
            job,
            4,
            false,
            Some(out(job, 4, &"x".repeat(2000), 2000)),
            None,
        );
        let j = core.job(job).unwrap();
        let page = log.page(None, j, Stream::Stdout, None, 0, 1 << 20).unwrap();
        assert_eq!(texts(&page), ["ZERO\n", "one!", "-", "-", "dropped"]);
        assert_eq!(page.rows[2].id, 12);
        let RowOutput::Kept(k) = &page.rows[1].output else {
            panic!("kept")
        };
        assert!(k.truncated() && k.total == 1000);
        assert_eq!(page.next, None);
        // Pages of about `max_bytes`, at least one task each; a selection by id.
        let page = log.page(None, j, Stream::Stdout, None, 0, 3).unwrap();
        assert_eq!(
            (texts(&page), page.next),
            (vec!["ZERO\n".to_string()], Some(1))
        );
        let sel = IdRanges::parse("11,10,99").unwrap();
        let page = log
            .page(None, j, Stream::Stdout, Some(&sel), 0, 1 << 20)
            .unwrap();
        assert_eq!(texts(&page), ["ZERO\n", "one!", "-"]);
        assert_eq!(page.rows[2].state, None, "99 is not a task of the job");
        // The job's stderr is discarded: nothing to list.
        let page = log.page(None, j, Stream::Stderr, None, 0, 1 << 20).unwrap();
        assert_eq!((page.sink, page.rows.len()), (Sink::Null, 0));
        assert!(log.memory_bytes() > 0);
        log.forget(job, None);
        assert_eq!(log.memory_bytes(), 0);
    }

    #[test]
    fn file_sinks_give_each_task_its_path() {
        let (core, job) = job_with("1-2", Sink::File("job-{job}/{task}.out".into()), stream());
        let j = core.job(job).unwrap();
        let page = OutputLog::default()
            .page(None, j, Stream::Stdout, None, 0, 1 << 20)
            .unwrap();
        assert_eq!(
            texts(&page),
            [
                format!("file /w/job-{job}/1.out"),
                format!("file /w/job-{job}/2.out")
            ]
        );
        assert_eq!(page.rows[0].state, Some(kestrel_core::TaskState::Ready));
    }

    #[test]
    fn an_own_file_known_written_or_left_empty_is_said_so() {
        use kestrel_proto::messages::STDOUT_EMPTY;
        let (core, job) = job_with("1-3", Sink::File("job-{job}/{task}.out".into()), stream());
        let j = core.job(job).unwrap();
        let mut log = OutputLog::default();
        log.note_job(&j.spec);
        log.files.record(job, &j.spec, 0, Some(0));
        log.files.record(job, &j.spec, 1, Some(STDOUT_EMPTY));
        let page = log.page(None, j, Stream::Stdout, None, 0, 1 << 20).unwrap();
        assert_eq!(
            texts(&page),
            [
                format!("written /w/job-{job}/1.out"),
                "-".to_string(),
                format!("file /w/job-{job}/3.out")
            ]
        );
        log.forget(job, None);
        let page = log.page(None, j, Stream::Stdout, None, 0, 1 << 20).unwrap();
        assert_eq!(texts(&page)[0], format!("file /w/job-{job}/1.out"));
    }

    #[test]
    fn journaled_outputs_commit_with_their_ends_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (core, job) = job_with("1-3", stream(), stream());
        let s = core.job(job).unwrap().spec.clone();
        let mut journal = Journal::open(dir.path(), None).unwrap();
        let mut log = OutputLog::default();
        let mut p = Pending::default();
        p.submit(job, 1, None, &s, &core.job(job).unwrap().tasks, false);
        for index in 0..3 {
            let f = Finished {
                job,
                index,
                started_us: 2,
                finished_us: 3,
                end: RunEnd::Success,
            };
            p.task_end(f, 1, 1);
            let mut o = out(job, index, &format!("out {index}\n"), 6);
            o.stderr = (index == 1).then(|| Kept {
                data: b"err\n".to_vec(),
                total: 4,
            });
            log.record(&s, job, index, false, Some(o), Some(&mut p));
        }
        journal.commit(&mut p).unwrap();
        assert_eq!(
            log.memory_bytes(),
            0,
            "a journaled log keeps nothing in memory"
        );
        drop(journal);

        let journal = Journal::open(dir.path(), None).unwrap();
        let mut fresh = Scheduler::new(Config::default());
        journal.replay(&mut fresh, &mut Default::default()).unwrap();
        let j = fresh.job(job).unwrap();
        let page = log
            .page(Some(&journal), j, Stream::Stdout, None, 0, 1 << 20)
            .unwrap();
        assert_eq!(texts(&page), ["out 0\n", "out 1\n", "out 2\n"]);
        assert_eq!(page.rows[0].state, Some(kestrel_core::TaskState::Finished));
        let page = log
            .page(Some(&journal), j, Stream::Stderr, None, 0, 1 << 20)
            .unwrap();
        assert_eq!(texts(&page), ["-", "err\n", "-"]);

        // A re-run that wrote nothing clears the stored output; forgetting drops the job's.
        let mut journal = journal;
        let mut p = Pending::default();
        log.record(&s, job, 0, true, None, Some(&mut p));
        journal.commit(&mut p).unwrap();
        let page = log
            .page(Some(&journal), j, Stream::Stdout, None, 0, 1 << 20)
            .unwrap();
        assert_eq!(texts(&page), ["-", "out 1\n", "out 2\n"]);
        log.forget(job, Some(&mut p));
        journal.commit(&mut p).unwrap();
        let page = log
            .page(Some(&journal), j, Stream::Stdout, None, 0, 1 << 20)
            .unwrap();
        assert_eq!(texts(&page), ["-", "-", "-"]);
    }
}
