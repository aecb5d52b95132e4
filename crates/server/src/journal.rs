//! The journal: an embedded SQLite database in the server directory that makes the server's
//! state survive a crash.
//!
//! It records the accepted *inputs* of the scheduler, not its state: submissions, extensions,
//! cancels and batches of accepted task reports, appended to `log` as MessagePack bodies.
//! Replaying them in order into a fresh scheduler gives back every job and every recorded task
//! end (see `kestrel_core::restore`). The engine writes everything one batch of events produced
//! in one transaction (group commit), so a million task ends cost a few hundred syncs, not a
//! million. WAL mode with `synchronous=FULL`: a committed transaction survives power loss.

use crate::outputs::OutputOp;
use kestrel_core::{Event, Finished, JobId, JobSpec, LineList, Scheduler, TaskIndex, TaskSet};
use rusqlite::{params, Connection, OptionalExtension};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file name inside a server directory.
pub const JOURNAL_FILE: &str = "journal.sqlite";
/// Bumped when `log` holds something an older Kestrel cannot read, so that one refuses the
/// file with [`JournalError::Version`] instead of calling it damaged. 2: crash counts (LOST
/// entries) and one-letter run endings. 3: forgotten jobs (FORGET entries) and jobs of lines
/// (`--each`: a `Lines` task set, and extensions carrying lines). 4: streamed output
/// (`Sink::Stream` in submissions, the `output` table). Older journals are read as they are.
const SCHEMA_VERSION: i64 = 4;

const KIND_SUBMIT: i64 = 1;
const KIND_EXTEND: i64 = 2;
const KIND_CANCEL: i64 = 3;
const KIND_ENDS: i64 = 4;
const KIND_RETRY: i64 = 5;
const KIND_GIVE_UP: i64 = 6;
const KIND_LOST: i64 = 7;
const KIND_FORGET: i64 = 8;

/// Why the journal cannot be used, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("the journal {path} is damaged or is not a Kestrel journal ({err}); SQLite's own recovery (replaying its write-ahead log) did not help. Move {path} aside to start empty (its jobs are then forgotten), or start with --no-journal")]
    Damaged { path: PathBuf, err: String },
    #[error("the journal {path} was written by a newer Kestrel (schema {found}, this one reads {SCHEMA_VERSION}); use that version, or move the file aside to start empty")]
    Version { path: PathBuf, found: i64 },
    #[error("cannot open the journal {path}: {err}")]
    Open { path: PathBuf, err: String },
    #[error("{0}")]
    Write(String),
}

/// What the previous server left in `meta`.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    /// Random id of the journal, fixed when it is created.
    pub server_id: String,
    /// The access secret (hex), so old access files stay valid.
    pub secret: Option<String>,
    /// The port it listened on, tried first.
    pub port: Option<u16>,
}

/// One accepted submission, as journaled.
#[derive(Serialize, Deserialize)]
struct SubmitBody {
    job: JobId,
    at_us: u64,
    key: Option<String>,
    spec: JobSpec,
    tasks: TaskSet,
    open: bool,
}

/// Tasks added to an open job: argvs for a list of commands, lines for a job of lines.
#[derive(Serialize, Deserialize)]
struct ExtendBody {
    job: JobId,
    at_us: u64,
    argvs: Vec<Vec<String>>,
    close: bool,
    /// Absent from entries written before jobs of lines existed.
    #[serde(default)]
    lines: LineList,
}

/// `kestrel job retry`: failed (and maybe canceled) tasks back in the queue.
#[derive(Serialize, Deserialize)]
struct RetryBody {
    job: JobId,
    at_us: u64,
    failed_only: bool,
}

/// A task failed for good by the scheduler itself (too many lost workers).
#[derive(Serialize, Deserialize)]
struct GiveUpBody {
    job: JobId,
    index: TaskIndex,
    at_us: u64,
    failure: kestrel_core::Failure,
}

/// Tasks re-queued after their worker was lost, each counting one more crash.
#[derive(Serialize, Deserialize)]
struct LostBody {
    tasks: Vec<(JobId, TaskIndex)>,
}

/// `kestrel job forget`: ended jobs dropped from the server.
#[derive(Serialize, Deserialize)]
struct ForgetBody {
    jobs: Vec<JobId>,
    at_us: u64,
}

#[derive(Serialize, Deserialize)]
struct CancelBody {
    job: JobId,
    at_us: u64,
}

/// A batch of accepted task ends. Successes, the bulk, are tuples of small integers relative
/// to `base_us` (about 20 bytes a task); other ends keep their full report.
#[derive(Serialize, Deserialize)]
struct EndsBody {
    base_us: u64,
    /// (job, index, assigned, started, finished), times as offsets from `base_us`.
    ok: Vec<(JobId, TaskIndex, i64, i64, i64)>,
    /// (report, assigned_us).
    other: Vec<(Finished, u64)>,
    /// Per job, the summed wait for a slot of the successes in `ok` (one pair per job and
    /// batch, not a number per task).
    #[serde(default)]
    waited: Vec<(JobId, u64)>,
}

/// Entries gathered while the engine applies one batch of events; written by [`Journal::commit`].
#[derive(Default)]
pub struct Pending {
    rows: Vec<(i64, Vec<u8>)>,
    ok: Vec<(JobId, TaskIndex, u64, u64, u64)>,
    other: Vec<(Finished, u64)>,
    waited: Vec<(JobId, u64)>,
    /// Changes to the `output` table, written after the log rows in the same transaction.
    pub(crate) outputs: Vec<OutputOp>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
            && self.ok.is_empty()
            && self.other.is_empty()
            && self.outputs.is_empty()
    }

    /// Whether entries other than task ends wait (submissions, extensions, cancels).
    pub fn has_inputs(&self) -> bool {
        !self.rows.is_empty()
    }

    pub fn clear(&mut self) {
        self.rows.clear();
        self.ok.clear();
        self.other.clear();
        self.waited.clear();
        self.outputs.clear();
    }

    pub fn submit(
        &mut self,
        job: JobId,
        at_us: u64,
        key: Option<String>,
        spec: &JobSpec,
        tasks: &TaskSet,
        open: bool,
    ) {
        // Serialize borrowed values without cloning the (possibly large) task list.
        #[derive(Serialize)]
        struct SubmitRef<'a> {
            job: JobId,
            at_us: u64,
            key: Option<String>,
            spec: &'a JobSpec,
            tasks: &'a TaskSet,
            open: bool,
        }
        self.push(
            KIND_SUBMIT,
            &SubmitRef {
                job,
                at_us,
                key,
                spec,
                tasks,
                open,
            },
        );
    }

    /// The tasks an extension added to a job: those of `tasks` (the job's, after it) from
    /// index `from` on.
    pub fn extend(&mut self, job: JobId, at_us: u64, tasks: &TaskSet, from: usize, close: bool) {
        /// Lines `from..` of a list, written as a list without copying them.
        struct LinesFrom<'a>(&'a LineList, usize);
        impl Serialize for LinesFrom<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().skip(self.1))
            }
        }
        #[derive(Serialize)]
        struct ExtendRef<'a> {
            job: JobId,
            at_us: u64,
            argvs: &'a [Vec<String>],
            close: bool,
            lines: LinesFrom<'a>,
        }
        let none = LineList::new();
        let (argvs, lines) = match tasks {
            TaskSet::List(l) => (l.get(from..).unwrap_or(&[]), LinesFrom(&none, 0)),
            TaskSet::Lines(l) => (&[][..], LinesFrom(l, from)),
            TaskSet::Array(_) => (&[][..], LinesFrom(&none, 0)),
        };
        self.push(
            KIND_EXTEND,
            &ExtendRef {
                job,
                at_us,
                argvs,
                close,
                lines,
            },
        );
    }

    pub fn cancel(&mut self, job: JobId, at_us: u64) {
        self.push(KIND_CANCEL, &CancelBody { job, at_us });
    }

    pub fn retry(&mut self, job: JobId, at_us: u64, failed_only: bool) {
        self.push(
            KIND_RETRY,
            &RetryBody {
                job,
                at_us,
                failed_only,
            },
        );
    }

    pub fn give_up(
        &mut self,
        job: JobId,
        index: TaskIndex,
        at_us: u64,
        failure: kestrel_core::Failure,
    ) {
        self.push(
            KIND_GIVE_UP,
            &GiveUpBody {
                job,
                index,
                at_us,
                failure,
            },
        );
    }

    pub fn lost(&mut self, tasks: Vec<(JobId, TaskIndex)>) {
        self.push(KIND_LOST, &LostBody { tasks });
    }

    pub fn forget(&mut self, jobs: Vec<JobId>, at_us: u64) {
        self.push(KIND_FORGET, &ForgetBody { jobs, at_us });
    }

    /// A worker's summed wait for a slot of a job's successful tasks (journaled with the
    /// batch's task ends, one pair per job).
    pub fn slot_wait(&mut self, job: JobId, waited_us: u64) {
        match self.waited.iter_mut().rev().find(|(j, _)| *j == job) {
            Some((_, sum)) => *sum += waited_us,
            None => self.waited.push((job, waited_us)),
        }
    }

    /// An accepted task report, with when the task had been assigned (for its timing).
    pub fn task_end(&mut self, f: Finished, assigned_us: u64) {
        if f.end == kestrel_core::RunEnd::Success {
            self.ok
                .push((f.job, f.index, assigned_us, f.started_us, f.finished_us));
        } else {
            self.other.push((f, assigned_us));
        }
    }

    fn push<T: Serialize>(&mut self, kind: i64, body: &T) {
        if kind != KIND_ENDS {
            // Task ends gathered so far happened before this input: keep that order in the log,
            // or a replayed retry could run before the failure it retries.
            self.seal_ends();
        }
        match rmp_serde::to_vec(body) {
            Ok(b) => self.rows.push((kind, b)),
            // Encoding plain data into a Vec cannot fail; if it ever did, the entry would be
            // missing from the journal, so say so loudly.
            Err(e) => tracing::error!("cannot encode a journal entry: {e}"),
        }
    }

    /// Turns the gathered task ends into one row (call once, just before writing).
    fn seal_ends(&mut self) {
        if self.ok.is_empty() && self.other.is_empty() {
            return;
        }
        let base_us = self.ok.first().map_or(0, |t| t.2);
        let off = |t: u64| t as i64 - base_us as i64;
        let body = EndsBody {
            base_us,
            ok: self
                .ok
                .drain(..)
                .map(|(j, i, a, s, f)| (j, i, off(a), off(s), off(f)))
                .collect(),
            other: std::mem::take(&mut self.other),
            waited: std::mem::take(&mut self.waited),
        };
        self.push(KIND_ENDS, &body);
    }
}

/// Creates `path` with mode 0600 if it is missing, or narrows it to 0600 if it exists.
fn restrict_to_owner(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// The journal of one server directory.
pub struct Journal {
    conn: Connection,
    path: PathBuf,
    rows: u64,
}

/// What a replay restored, for the start-up log line.
#[derive(Debug, Default)]
pub struct Restored {
    pub rows: u64,
    pub jobs: usize,
    pub task_ends: u64,
}

impl Journal {
    /// Opens (or creates) `DIR/journal.sqlite`. `limit_bytes` caps the database size (SQLite's
    /// `max_page_count`), which is how tests simulate a full disk.
    pub fn open(dir: &Path, limit_bytes: Option<u64>) -> Result<Journal, JournalError> {
        let path = dir.join(JOURNAL_FILE);
        let damaged = |e: rusqlite::Error| JournalError::Damaged {
            path: path.clone(),
            err: e.to_string(),
        };
        // The journal holds the access secret: owner-only, like the access file. SQLite gives
        // its -wal and -shm files the database file's permissions.
        restrict_to_owner(&path).map_err(|e| JournalError::Open {
            path: path.clone(),
            err: e.to_string(),
        })?;
        let conn = Connection::open(&path).map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
                damaged(e)
            }
            _ => JournalError::Open {
                path: path.clone(),
                err: e.to_string(),
            },
        })?;
        // The first statements read the header: a damaged file fails here.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(damaged)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(damaged)?;
        if let Some(limit) = limit_bytes {
            let page: i64 = conn
                .pragma_query_value(None, "page_size", |r| r.get(0))
                .map_err(damaged)?;
            let pages = (limit as i64 / page.max(512)).max(1);
            conn.pragma_update(None, "max_page_count", pages)
                .map_err(damaged)?;
        }
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS log(seq INTEGER PRIMARY KEY, kind INTEGER NOT NULL, body BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS output(job INTEGER NOT NULL, task INTEGER NOT NULL, stream INTEGER NOT NULL, total INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY(job, task, stream)) WITHOUT ROWID;",
        )
        .map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => JournalError::Write(format!(
                "the journal {} has no room even for its tables ({e}); free disk space or raise --journal-limit",
                path.display()
            )),
            _ => damaged(e),
        })?;
        let mut j = Journal {
            conn,
            path: path.clone(),
            rows: 0,
        };
        match j.get_meta("schema_version").map_err(damaged)? {
            None => {
                let id = crate::new_server_id();
                j.put_meta(&[
                    ("schema_version", SCHEMA_VERSION.to_string()),
                    ("server_id", id),
                ])
                .map_err(|e| JournalError::Write(e.to_string()))?;
            }
            Some(v) => {
                let found: i64 = v.parse().map_err(|_| JournalError::Damaged {
                    path: path.clone(),
                    err: format!("schema version {v:?} is not a number"),
                })?;
                if found > SCHEMA_VERSION {
                    return Err(JournalError::Version { path, found });
                }
                if found < SCHEMA_VERSION {
                    // What this version appends, older ones cannot read: say so in the file.
                    j.put_meta(&[("schema_version", SCHEMA_VERSION.to_string())])
                        .map_err(|e| JournalError::Write(e.to_string()))?;
                }
            }
        }
        j.rows = j
            .conn
            .query_row("SELECT count(*) FROM log", [], |r| r.get::<_, i64>(0))
            .map_err(damaged)? as u64;
        Ok(j)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The database, for the output log's reads (see `outputs`).
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Rows in the log.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes on disk: the database and its write-ahead log.
    pub fn bytes(&self) -> u64 {
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        size(&self.path) + size(Path::new(&wal))
    }

    pub fn meta(&self) -> Result<Meta, JournalError> {
        let damaged = |e: rusqlite::Error| JournalError::Damaged {
            path: self.path.clone(),
            err: e.to_string(),
        };
        Ok(Meta {
            server_id: self
                .get_meta("server_id")
                .map_err(damaged)?
                .unwrap_or_default(),
            secret: self.get_meta("secret").map_err(damaged)?,
            port: self
                .get_meta("port")
                .map_err(damaged)?
                .and_then(|p| p.parse().ok()),
        })
    }

    /// Records the secret and port this server uses.
    pub fn set_access(&mut self, secret: &str, port: u16) -> Result<(), JournalError> {
        self.put_meta(&[("secret", secret.to_string()), ("port", port.to_string())])
            .map_err(|e| {
                JournalError::Write(format!(
                    "cannot write the journal {}: {e}; free disk space and restart",
                    self.path.display()
                ))
            })
    }

    fn get_meta(&self, key: &str) -> rusqlite::Result<Option<String>> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| {
                r.get::<_, String>(0)
            })
            .optional()
    }

    fn put_meta(&mut self, kv: &[(&str, String)]) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        for (k, v) in kv {
            tx.execute(
                "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![k, v],
            )?;
        }
        tx.commit()
    }

    /// Writes everything gathered in one transaction (group commit) and empties `pending`.
    /// On error nothing of it is kept.
    pub fn commit(&mut self, pending: &mut Pending) -> Result<(), rusqlite::Error> {
        pending.seal_ends();
        if pending.rows.is_empty() && pending.outputs.is_empty() {
            return Ok(());
        }
        let n = pending.rows.len() as u64;
        let result = (|| {
            let tx = self.conn.transaction()?;
            {
                let mut st = tx.prepare_cached("INSERT INTO log(kind, body) VALUES (?1, ?2)")?;
                for (kind, body) in &pending.rows {
                    st.execute(params![kind, body])?;
                }
            }
            // Outputs with the ends they belong to: a restart gives back both or neither.
            for op in &pending.outputs {
                op.apply(&tx)?;
            }
            tx.commit()
        })();
        pending.clear();
        result?;
        self.rows += n;
        Ok(())
    }

    /// Every successful task end in the log, in order: `(job, index)`. A task appears once per
    /// recorded success, so a correct journal lists each finished task exactly once (what the
    /// chaos test checks).
    pub fn successes(&self) -> Result<Vec<(JobId, TaskIndex)>, JournalError> {
        let damaged = |err: String| JournalError::Damaged {
            path: self.path.clone(),
            err,
        };
        let mut st = self
            .conn
            .prepare("SELECT body FROM log WHERE kind = ?1 ORDER BY seq")
            .map_err(|e| damaged(e.to_string()))?;
        let mut rows = st.query([KIND_ENDS]).map_err(|e| damaged(e.to_string()))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(|e| damaged(e.to_string()))? {
            let body = row
                .get_ref(0)
                .and_then(|v| v.as_blob().map_err(Into::into))
                .map_err(|e| damaged(e.to_string()))?;
            let b: EndsBody = rmp_serde::from_slice(body).map_err(|e| damaged(e.to_string()))?;
            out.extend(b.ok.iter().map(|t| (t.0, t.1)));
            out.extend(
                b.other
                    .iter()
                    .filter(|(f, _)| f.end == kestrel_core::RunEnd::Success)
                    .map(|(f, _)| (f.job, f.index)),
            );
        }
        Ok(out)
    }

    /// Replays the log into `core` (which must be fresh) and returns the submission keys it
    /// saw, key -> job.
    pub fn replay(
        &self,
        core: &mut Scheduler,
        restored: &mut Restored,
    ) -> Result<FxHashMap<String, JobId>, JournalError> {
        let damaged = |err: String| JournalError::Damaged {
            path: self.path.clone(),
            err,
        };
        let mut keys = FxHashMap::default();
        let mut st = self
            .conn
            .prepare("SELECT seq, kind, body FROM log ORDER BY seq")
            .map_err(|e| damaged(e.to_string()))?;
        let mut rows = st.query([]).map_err(|e| damaged(e.to_string()))?;
        while let Some(row) = rows.next().map_err(|e| damaged(e.to_string()))? {
            let seq: i64 = row.get(0).map_err(|e| damaged(e.to_string()))?;
            let kind: i64 = row.get(1).map_err(|e| damaged(e.to_string()))?;
            let body = row
                .get_ref(2)
                .and_then(|v| v.as_blob().map_err(Into::into))
                .map_err(|e| damaged(e.to_string()))?;
            let bad = |e: &dyn std::fmt::Display| damaged(format!("log entry {seq}: {e}"));
            restored.rows += 1;
            match kind {
                KIND_SUBMIT => {
                    let b: SubmitBody = rmp_serde::from_slice(body).map_err(|e| bad(&e))?;
                    core.restore_submit(b.job, b.at_us, b.spec, b.tasks, b.open)
                        .map_err(|e| bad(&e))?;
                    if let Some(k) = b.key {
                        keys.insert(k, b.job);
                    }
                    restored.jobs += 1;
                }
                KIND_EXTEND => {
                    let b: ExtendBody = rmp_serde::from_slice(body).map_err(|e| bad(&e))?;
                    // Accepted once, so it applies again; if the log's order makes it
                    // refused now, the job's state differs a little, not the journal's health.
                    // The log holds exactly the tasks each extension added, in order.
                    let at = core.job(b.job).map_or(0, |j| j.len());
                    let more = match core.job(b.job).map(|j| &j.tasks) {
                        Some(TaskSet::Lines(_)) => TaskSet::Lines(b.lines),
                        _ => TaskSet::List(b.argvs),
                    };
                    let extend = Event::Extend {
                        job: b.job,
                        at,
                        more,
                        close: b.close,
                    };
                    if let Err(e) = core.handle(b.at_us, extend) {
                        tracing::warn!(
                            "journal entry {seq}: extension of job {} not replayed: {e}",
                            b.job
                        );
                    }
                }
                KIND_CANCEL => {
                    let b: CancelBody = rmp_serde::from_slice(body).map_err(|e| bad(&e))?;
                    // Accepted once, so it applies again; if the log's order makes it
                    // refused now, the job's state differs a little, not the journal's health.
                    if let Err(e) = core.handle(b.at_us, Event::Cancel { job: b.job }) {
                        tracing::warn!(
                            "journal entry {seq}: cancel of job {} not replayed: {e}",
                            b.job
                        );
                    }
                }
                KIND_RETRY => {
                    let b: RetryBody = rmp_serde::from_slice(body).map_err(|e| bad(&e))?;
                    // Accepted once, so it applies again; if the log's order makes it
                    // refused now, the job's state differs a little, not the journal's health.
                    let retry = Event::Retry {
                        job: b.job,
                        failed_only: b.failed_only,
                    };
                    if let Err(e) = core.handle(b.at_us, retry) {
                        tracing::warn!(
                            "journal entry {seq}: retry of job {} not replayed: {e}",
                            b.job
                        );
                    }
                }
                KIND_GIVE_UP => {
                    let b: GiveUpBody = rmp_serde::from_slice(body).map_err(|e| bad(&e))?;
                    core.restore_give_up(b.job, b.index, b.at_us, b.failure);
                    restored.task_ends += 1;
                }
                KIND_LOST => {
                    let b: LostBody = rmp_serde::from_slice(body).map_err(|e| bad(&e))?;
                    core.restore_lost(&b.tasks);
                }
                KIND_FORGET => {
                    let b: ForgetBody = rmp_serde::from_slice(body).map_err(|e| bad(&e))?;
                    // Accepted once, so it applies again; if the log's order makes it
                    // refused now, the job's state differs a little, not the journal's health.
                    for job in b.jobs {
                        match core.handle(b.at_us, Event::Forget { job }) {
                            Ok(_) => restored.jobs = restored.jobs.saturating_sub(1),
                            Err(e) => {
                                tracing::warn!("journal entry {seq}: job {job} not forgotten: {e}")
                            }
                        }
                    }
                }
                KIND_ENDS => {
                    let b: EndsBody = rmp_serde::from_slice(body).map_err(|e| bad(&e))?;
                    let at = |off: i64| (b.base_us as i64).saturating_add(off).max(0) as u64;
                    restored.task_ends += (b.ok.len() + b.other.len()) as u64;
                    for (job, index, a, s, f) in b.ok {
                        let f = Finished {
                            job,
                            index,
                            started_us: at(s),
                            finished_us: at(f),
                            end: kestrel_core::RunEnd::Success,
                        };
                        core.restore_task_end(f, at(a));
                    }
                    for (f, a) in b.other {
                        core.restore_task_end(f, a);
                    }
                    for (job, waited_us) in b.waited {
                        // Never refused (a forgotten job's wait is dropped).
                        let _ = core.handle(b.base_us, Event::SlotWait { job, waited_us });
                    }
                }
                other => {
                    return Err(bad(&format!(
                        "unknown entry kind {other} (written by a newer kestrel? start that \
                         version on this directory instead)"
                    )))
                }
            }
        }
        core.restore_done();
        // A forgotten job's key no longer names a job.
        keys.retain(|_, job| core.job(*job).is_some());
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::{Config, IdRanges, RunEnd};

    fn spec() -> JobSpec {
        JobSpec::command("t", vec!["true".into()])
    }

    #[test]
    fn entries_survive_reopen_and_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        j.set_access("abcd", 4242).unwrap();
        let tasks = TaskSet::Array(IdRanges::span(1, 100));
        let mut p = Pending::default();
        p.submit(5, 10, Some("k1".into()), &spec(), &tasks, false);
        for i in 0..40 {
            p.task_end(
                Finished {
                    job: 5,
                    index: i,
                    started_us: 1_000 + i as u64,
                    finished_us: 2_000 + i as u64,
                    end: RunEnd::Success,
                },
                900,
            );
        }
        j.commit(&mut p).unwrap();
        assert!(p.is_empty());
        assert_eq!(j.rows(), 2);
        drop(j);

        let j = Journal::open(dir.path(), None).unwrap();
        assert_eq!(j.rows(), 2);
        let m = j.meta().unwrap();
        assert_eq!((m.secret.as_deref(), m.port), (Some("abcd"), Some(4242)));
        let mut core = Scheduler::new(Config::default());
        let mut r = Restored::default();
        let keys = j.replay(&mut core, &mut r).unwrap();
        assert_eq!(keys.get("k1"), Some(&5));
        assert_eq!((r.rows, r.jobs, r.task_ends), (2, 1, 40));
        let job = core.job(5).unwrap();
        assert_eq!(job.counts.finished, 40);
        assert_eq!(job.counts.ready, 60);
        let rec = job.record(7);
        assert_eq!(
            (rec.assigned_us, rec.started_us, rec.finished_us),
            (900, 1007, 2007)
        );
        assert_eq!(core.queued(), 60);
    }

    #[test]
    fn a_damaged_file_names_itself_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        drop(Journal::open(dir.path(), None).unwrap());
        let path = dir.path().join(JOURNAL_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..16].copy_from_slice(b"garbage garbage!");
        std::fs::write(&path, bytes).unwrap();
        let e = Journal::open(dir.path(), None).err().unwrap().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(e.contains("aside"), "{e}");
    }

    #[test]
    fn an_older_journal_is_read_and_marked_newer_and_a_newer_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        j.put_meta(&[("schema_version", "1".into())]).unwrap();
        drop(j);
        let j = Journal::open(dir.path(), None).unwrap();
        assert_eq!(
            j.get_meta("schema_version").unwrap(),
            Some(SCHEMA_VERSION.to_string())
        );
        let mut j = j;
        j.put_meta(&[("schema_version", (SCHEMA_VERSION + 1).to_string())])
            .unwrap();
        drop(j);
        let e = Journal::open(dir.path(), None).err().unwrap();
        assert!(matches!(e, JournalError::Version { .. }), "{e}");
        assert!(e.to_string().contains("newer Kestrel"), "{e}");
    }

    #[test]
    fn a_full_journal_fails_the_commit_and_keeps_nothing_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), Some(64 * 1024)).unwrap();
        let list = TaskSet::List((0..20_000).map(|i| vec![format!("task-{i:08}")]).collect());
        let mut p = Pending::default();
        p.submit(1, 0, None, &spec(), &list, false);
        let e = j.commit(&mut p).unwrap_err();
        assert_eq!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DiskFull));
        assert_eq!(j.rows(), 0);
        // Small entries still fit afterwards.
        p.cancel(1, 0);
        j.commit(&mut p).unwrap();
        assert_eq!(j.rows(), 1);
    }

    fn failed(job: JobId, index: TaskIndex) -> Finished {
        Finished {
            job,
            index,
            started_us: 100,
            finished_us: 200,
            end: RunEnd::Failed(Box::new(kestrel_core::Failure {
                exit_code: Some(1),
                signal: None,
                reason: "exit code 1".into(),
                stderr_tail: String::new(),
            })),
        }
    }

    #[test]
    fn retries_and_give_ups_replay_in_the_order_they_happened() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let tasks = TaskSet::Array(IdRanges::span(0, 3));
        let mut p = Pending::default();
        p.submit(1, 10, None, &spec(), &tasks, false);
        // Task 0 fails for good, task 1 is given up after lost workers, then `job retry`
        // arrives in the same batch: the retry must replay after both.
        p.task_end(failed(1, 0), 50);
        let gone = kestrel_core::Failure::because("lost with 5 workers (it may kill its worker)");
        p.give_up(1, 1, 300, gone);
        p.retry(1, 400, true);
        j.commit(&mut p).unwrap();
        let mut core = Scheduler::new(Config::default());
        let mut r = Restored::default();
        j.replay(&mut core, &mut r).unwrap();
        let job = core.job(1).unwrap();
        // Four tasks (ids 0-3): both failed ones are ready again with the two untouched.
        assert_eq!(
            (job.counts.ready, job.counts.failed),
            (4, 0),
            "{:?}",
            job.counts
        );
        assert!(!job.is_done());
        // The journal holds the secret: nobody else may read it.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(JOURNAL_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "journal mode {mode:o}");
    }

    #[test]
    fn forgotten_jobs_stay_forgotten_and_their_ids_stay_used() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let mut p = Pending::default();
        let one = TaskSet::Array(IdRanges::span(0, 0));
        p.submit(1, 10, Some("k1".into()), &spec(), &one, false);
        p.submit(2, 10, Some("k2".into()), &spec(), &one, false);
        p.task_end(
            Finished {
                job: 1,
                index: 0,
                started_us: 20,
                finished_us: 30,
                end: RunEnd::Success,
            },
            15,
        );
        p.forget(vec![1], 40);
        j.commit(&mut p).unwrap();
        drop(j);
        let j = Journal::open(dir.path(), None).unwrap();
        assert_eq!(
            j.get_meta("schema_version").unwrap(),
            Some(SCHEMA_VERSION.to_string()),
            "an older kestrel must refuse a journal that can hold FORGET entries"
        );
        let mut core = Scheduler::new(Config::default());
        let keys = j.replay(&mut core, &mut Restored::default()).unwrap();
        assert!(core.job(1).is_none(), "job 1 was forgotten");
        assert!(core.job(2).is_some());
        assert_eq!(keys.get("k1"), None, "a forgotten job's key names nothing");
        assert_eq!(keys.get("k2"), Some(&2));
        let spec_tasks = TaskSet::Array(IdRanges::span(0, 0));
        let submit = Event::Submit {
            spec: Box::new(spec()),
            tasks: spec_tasks,
            open: false,
            key: None,
        };
        let next = core.handle(50, submit).unwrap();
        assert_eq!(
            next,
            kestrel_core::Reply::Submitted(3),
            "ids are not given out again"
        );
    }

    #[test]
    fn a_job_of_lines_and_its_pieces_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let lines = |l: &[&str]| TaskSet::Lines(l.iter().copied().collect());
        let mut p = Pending::default();
        p.submit(1, 10, None, &spec(), &lines(&["a", "b"]), true);
        // The job's tasks after the extension; the entry holds those from index 2 on.
        p.extend(1, 20, &lines(&["a", "b", "c {task}", "d"]), 2, true);
        j.commit(&mut p).unwrap();
        let mut core = Scheduler::new(Config::default());
        j.replay(&mut core, &mut Restored::default()).unwrap();
        let job = core.job(1).unwrap();
        assert_eq!(job.tasks, lines(&["a", "b", "c {task}", "d"]));
        assert!(!job.open);
        assert_eq!(job.counts.ready, 4);
    }

    #[test]
    fn an_extension_journaled_before_lines_existed_replays() {
        // The form of an extension entry before it had `lines`.
        #[derive(Serialize)]
        struct OldExtend {
            job: JobId,
            at_us: u64,
            argvs: Vec<Vec<String>>,
            close: bool,
        }
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let mut p = Pending::default();
        let list = TaskSet::List(vec![vec!["echo".into(), "a".into()]]);
        p.submit(1, 10, None, &spec(), &list, true);
        p.push(
            KIND_EXTEND,
            &OldExtend {
                job: 1,
                at_us: 20,
                argvs: vec![vec!["echo".into(), "b".into()]],
                close: true,
            },
        );
        j.commit(&mut p).unwrap();
        let mut core = Scheduler::new(Config::default());
        j.replay(&mut core, &mut Restored::default()).unwrap();
        let job = core.job(1).unwrap();
        assert_eq!(job.len(), 2);
        assert_eq!(
            job.task_argv(1),
            Some(&["echo".to_string(), "b".into()][..])
        );
        assert!(!job.open);
    }

    #[test]
    fn crash_counts_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let mut p = Pending::default();
        p.submit(
            1,
            10,
            None,
            &spec(),
            &TaskSet::Array(IdRanges::span(0, 3)),
            false,
        );
        p.lost(vec![(1, 0), (1, 2)]);
        p.lost(vec![(1, 2)]);
        // A loss of a job the journal does not know is ignored, not an error.
        p.lost(vec![(9, 0)]);
        j.commit(&mut p).unwrap();
        let mut core = Scheduler::new(Config::default());
        j.replay(&mut core, &mut Restored::default()).unwrap();
        let job = core.job(1).unwrap();
        let lost: Vec<u8> = (0..4).map(|i| job.record(i).lost).collect();
        assert_eq!(lost, vec![1, 0, 2, 0]);
    }
}
