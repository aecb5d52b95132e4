//! The journal's SQLite file: opening (with its checks), the `meta` table, appending a batch's
//! entries in one transaction, and deleting a forgotten job's rows. A size limit
//! (`--journal-limit`, SQLite's `max_page_count`) fails a commit as a full disk does; such a
//! commit is tried again with its inputs alone (task ends left out: their tasks run again after
//! a restart), so a forget, which frees room, still gets in. Freed pages are given back to the
//! file system in bounded steps (incremental vacuum), so the file's size follows the live jobs.

use super::Pending;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};

/// The file name inside a server directory.
pub const JOURNAL_FILE: &str = "journal.sqlite";
/// Bumped when `log` holds something an older Kestrel cannot read, so that one refuses the
/// file with [`JournalError::Version`] instead of calling it damaged. 2: crash counts (LOST
/// entries) and one-letter run endings. 3: forgotten jobs (FORGET entries) and jobs of lines
/// (`--each`: a `Lines` task set, and extensions carrying lines). 4: streamed output
/// (`Sink::Stream` in submissions, the `output` table). 5: the worker of each task end (ENDS
/// entries' `workers`). 6: rows deleted with their forgotten job (the `job` column; ENDS and LOST
/// entries one per job; `next_job` in `meta`: an older Kestrel would give a deleted job's id
/// out again). 7: function jobs (a `function` after the template's `files`: an older Kestrel
/// would read such a job as an empty command). 8: successes packed in ENDS entries (`packed`:
/// an older Kestrel would read no success). Older journals are read as they are.
pub(super) const SCHEMA_VERSION: i64 = 8;

/// Pages given back to the file system per compaction step (16 MiB of 4 KiB pages): a big
/// forgotten job is given back over several passes of the engine, not in one long stall.
const VACUUM_PAGES: i64 = 4096;

/// Why the journal cannot be used, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("the journal {path} is damaged or is not a Kestrel journal ({err}); SQLite's own recovery (replaying its write-ahead log) did not help. Move {path} aside to start empty (its jobs are then forgotten), or start with --no-journal")]
    Damaged { path: PathBuf, err: String },
    #[error("the journal {path} was written by a newer Kestrel (schema {found}, this one reads {SCHEMA_VERSION}); use that version, or move the file aside to start empty")]
    Version { path: PathBuf, found: i64 },
    #[error("the journal {path} exists but holds no Kestrel journal ({what}): it may have been truncated or replaced, and starting on it would start empty without a word. If it should hold jobs, put back a copy of it; otherwise move {path} aside to start empty (or delete it), or start with --no-journal")]
    NoSchema { path: PathBuf, what: String },
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
    /// Worker ids it gave out are below this (absent before schema 5).
    pub next_worker: Option<u32>,
    /// Job ids it gave out are below this (absent before schema 6).
    pub next_job: Option<u32>,
}

/// Why a commit failed, and whether its inputs were kept anyway (see [`Journal::commit`]).
#[derive(Debug)]
pub struct CommitError {
    pub err: rusqlite::Error,
    /// The commit was refused for want of room, and the batch's inputs (submissions, cancels,
    /// forgets, ...) were then written without its task ends.
    pub inputs_kept: bool,
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
    /// `--journal-limit`, in bytes.
    limit: Option<u64>,
    /// Rows were deleted: free pages wait to be given back ([`Journal::compact_step`]).
    vacuum_due: bool,
}

/// A limit as it can be written to `--journal-limit` again: `150M`, `64K`, `1000`.
fn size_name(bytes: u64) -> String {
    for (shift, unit) in [(40, 'T'), (30, 'G'), (20, 'M'), (10, 'K')] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

impl Journal {
    /// Opens (or creates) `DIR/journal.sqlite`. `limit_bytes` caps the database size (SQLite's
    /// `max_page_count`), which is also how tests simulate a full disk. A file that exists but
    /// holds no journal (0 bytes, or a database without its tables) is refused, not taken for a
    /// new one: only a file this call creates starts empty.
    pub fn open(dir: &Path, limit_bytes: Option<u64>) -> Result<Journal, JournalError> {
        let path = dir.join(JOURNAL_FILE);
        let damaged = |e: rusqlite::Error| JournalError::Damaged {
            path: path.clone(),
            err: e.to_string(),
        };
        let no_schema = |what: &str| JournalError::NoSchema {
            path: path.clone(),
            what: what.to_string(),
        };
        let existed = match std::fs::metadata(&path) {
            Ok(m) => Some(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(JournalError::Open {
                    path: path.clone(),
                    err: e.to_string(),
                })
            }
        };
        if existed == Some(0) {
            // A journal this server made is never empty (its header is written as it is
            // made): one that is was truncated or replaced. Say so rather than start empty
            // without a word; and SQLite would delete a write-ahead log left beside it.
            return Err(no_schema("it is empty, 0 bytes"));
        }
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
        if existed.is_some() {
            // Read before anything is written: a database of something else is not turned
            // into a journal. The first read checks the header (a damaged file fails here) and
            // replays a write-ahead log left by a crash.
            let tables: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('meta', 'log')",
                    [],
                    |r| r.get(0),
                )
                .map_err(damaged)?;
            if tables < 2 {
                return Err(no_schema("it has no journal tables"));
            }
        } else {
            // Only before the first table: lets deleted rows give their pages back.
            conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
                .map_err(damaged)?;
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(damaged)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(damaged)?;
        // The writer's connection, the engine's (reads) and the allocation queues' share the
        // file: one waits for another's transaction rather than failing at once.
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(damaged)?;
        if let Some(limit) = limit_bytes {
            let page: i64 = conn
                .pragma_query_value(None, "page_size", |r| r.get(0))
                .map_err(damaged)?;
            let pages = (limit as i64 / page.max(512)).max(1);
            conn.pragma_update(None, "max_page_count", pages)
                .map_err(damaged)?;
        }
        let full = |e: rusqlite::Error| {
            match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => JournalError::Write(format!(
                "the journal {} has no room even for its tables ({e}); free disk space or raise --journal-limit",
                path.display()
            )),
            _ => damaged(e),
        }
        };
        // One transaction: a crash while the file is made leaves no file half a journal.
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS log(seq INTEGER PRIMARY KEY, kind INTEGER NOT NULL, body BLOB NOT NULL, job INTEGER);
             CREATE TABLE IF NOT EXISTS output(job INTEGER NOT NULL, task INTEGER NOT NULL, stream INTEGER NOT NULL, total INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY(job, task, stream)) WITHOUT ROWID;
             COMMIT;",
        )
        .map_err(full)?;
        if conn.prepare("SELECT job FROM log LIMIT 0").is_err() {
            // A journal of schema 5 or older: its rows name no job (they stay until the file is
            // moved aside; rows written from now on go with their jobs).
            conn.execute_batch("ALTER TABLE log ADD COLUMN job INTEGER")
                .map_err(full)?;
        }
        conn.execute_batch("CREATE INDEX IF NOT EXISTS log_job ON log(job) WHERE job IS NOT NULL")
            .map_err(full)?;
        let mut j = Journal {
            conn,
            path: path.clone(),
            rows: 0,
            limit: limit_bytes,
            vacuum_due: false,
        };
        match j.get_meta("schema_version").map_err(damaged)? {
            None => {
                let id = new_server_id();
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
        j.enable_compaction();
        j.rows = j
            .conn
            .query_row("SELECT count(*) FROM log", [], |r| r.get::<_, i64>(0))
            .map_err(damaged)? as u64;
        Ok(j)
    }

    /// A journal made before it could shrink (`auto_vacuum` off) is rewritten once so that it
    /// can; if that fails (no room for the copy), it still works, only without shrinking.
    fn enable_compaction(&mut self) {
        let mode: i64 = self
            .conn
            .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
            .unwrap_or(2);
        if mode != 0 {
            return;
        }
        let t0 = std::time::Instant::now();
        let done = self
            .conn
            .execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;");
        match done {
            Ok(()) => tracing::info!(
                "the journal {} was rewritten once (in {:.2?}) so that it shrinks when jobs are forgotten",
                self.path.display(),
                t0.elapsed()
            ),
            Err(e) => tracing::warn!(
                "the journal {} cannot be rewritten to shrink when jobs are forgotten ({e}); it keeps working, and reuses the room of forgotten jobs",
                self.path.display()
            ),
        }
    }

    /// Another connection to the same journal (for the writer thread).
    pub fn reopen(&self) -> Result<Journal, JournalError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        Journal::open(dir, self.limit)
    }

    /// The database file.
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
        std::fs::metadata(&self.path).map_or(0, |m| m.len()) + wal_bytes(&self.path)
    }

    /// What the previous server left in `meta`.
    pub fn meta(&self) -> Result<Meta, JournalError> {
        let damaged = |e: rusqlite::Error| self.damaged(e);
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
            next_worker: self
                .get_meta("next_worker")
                .map_err(damaged)?
                .and_then(|n| n.parse().ok()),
            next_job: self
                .get_meta("next_job")
                .map_err(damaged)?
                .and_then(|n| n.parse().ok()),
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

    pub(super) fn get_meta(&self, key: &str) -> rusqlite::Result<Option<String>> {
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
    /// On error nothing of it is kept, except when the journal is full (its limit or the
    /// disk): the batch's inputs are then written again without its task ends (their tasks
    /// run again after a restart), and the error says whether they were kept.
    pub fn commit(&mut self, pending: &mut Pending) -> Result<(), CommitError> {
        pending.seal_ends();
        if pending.is_empty() {
            return Ok(());
        }
        let result = match self.write(pending, false) {
            Ok(()) => Ok(()),
            Err(err) if is_full(&err) && pending.has_inputs() => {
                let inputs_kept = self.write(pending, true).is_ok();
                Err(CommitError { err, inputs_kept })
            }
            Err(err) => Err(CommitError {
                err,
                inputs_kept: false,
            }),
        };
        let deleted = !pending.forgotten.is_empty();
        pending.clear();
        if deleted && (result.is_ok() || result.as_ref().is_err_and(|e| e.inputs_kept)) {
            // Given back by the server's ticks (`compact_step`), not inside the commit whose
            // replies wait.
            self.vacuum_due = true;
        }
        result
    }

    /// One transaction of `p`: the rows of its forgotten jobs deleted first (their room is then
    /// there for the rest), its rows (not task ends if `inputs_only`) but those of jobs it
    /// forgets, its outputs, and `meta`'s counters.
    fn write(&mut self, p: &Pending, inputs_only: bool) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        let mut deleted = 0;
        for job in &p.forgotten {
            deleted += tx
                .prepare_cached("DELETE FROM log WHERE job = ?1")?
                .execute([job])?;
        }
        let mut added = 0;
        {
            let mut st =
                tx.prepare_cached("INSERT INTO log(kind, body, job) VALUES (?1, ?2, ?3)")?;
            for ((kind, body), job) in p.rows.iter().zip(&p.row_jobs) {
                if inputs_only && *kind == super::encoding::KIND_ENDS {
                    continue;
                }
                // A job forgotten in this batch: its rows of the batch go too.
                if job.is_some_and(|j| p.forgotten.contains(&j)) {
                    continue;
                }
                st.execute(params![kind, body, job])?;
                added += 1;
            }
        }
        // Outputs with the ends they belong to: a restart gives back both or neither.
        for op in &p.outputs {
            if !inputs_only || op.is_forget() {
                op.apply(&tx)?;
            }
        }
        // Only ever raised: a stale value from an earlier batch never lowers them.
        for (key, next) in [("next_worker", p.next_worker), ("next_job", p.next_job)] {
            if let Some(next) = next {
                tx.execute(
                    "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = CAST(max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER)) AS TEXT)",
                    params![key, next.to_string()],
                )?;
            }
        }
        tx.commit()?;
        self.rows = (self.rows + added).saturating_sub(deleted as u64);
        Ok(())
    }

    /// Whether freed pages wait to be given back to the file system.
    pub fn compaction_due(&self) -> bool {
        self.vacuum_due
    }

    /// Gives back at most [`VACUUM_PAGES`] free pages to the file system; once none is left,
    /// the write-ahead log is checkpointed and truncated too, so the files on disk shrink.
    pub fn compact_step(&mut self) {
        if !self.vacuum_due {
            return;
        }
        let step = (|| {
            // The pragma frees one page per step of its statement (each a row): stepped to
            // its end, it is one transaction of at most VACUUM_PAGES pages.
            let mut st = self
                .conn
                .prepare_cached(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES})"))?;
            let mut rows = st.query([])?;
            while rows.next()?.is_some() {}
            drop(rows);
            drop(st);
            self.conn
                .pragma_query_value(None, "freelist_count", |r| r.get::<_, i64>(0))
        })();
        match step {
            Ok(0) => {
                self.vacuum_due = false;
                // Pages moved into the log wait there; the file shrinks at the checkpoint.
                if let Err(e) = self
                    .conn
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                {
                    tracing::debug!("journal checkpoint after compaction: {e}");
                }
            }
            Ok(_) => {}
            Err(e) => {
                // The journal works on without shrinking; a later forget tries again.
                self.vacuum_due = false;
                tracing::warn!(
                    "the journal {} cannot give back the room of forgotten jobs now: {e}",
                    self.path.display()
                );
            }
        }
    }

    /// What a failed commit means for the user, and what to do.
    pub fn explain(&self, e: &rusqlite::Error, dir: &str) -> String {
        match (self.limit, is_full(e)) {
            (Some(limit), true) if !self.disk_is_full() => format!(
                "the journal {} reached its limit of {} set by --journal-limit; forget finished jobs with `kestrel job forget` (their rows are deleted, which makes room) or restart the server with a larger --journal-limit",
                self.path.display(),
                size_name(limit)
            ),
            _ => format!(
                "the journal in {dir} cannot be written: {e}; free disk space (or forget finished jobs with `kestrel job forget`); new work is accepted again once a write succeeds"
            ),
        }
    }

    /// Whether the journal's file system has (about) no room left, whatever the limit.
    fn disk_is_full(&self) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: `c` is a valid C string, and `st` a plain struct statvfs fills in.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return false;
        }
        // The fields' types differ between platforms.
        #[allow(clippy::unnecessary_cast)]
        let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
        free < 1 << 20
    }

    /// The error for a file that turned out unreadable, with why.
    pub(crate) fn damaged(&self, err: impl ToString) -> JournalError {
        JournalError::Damaged {
            path: self.path.clone(),
            err: err.to_string(),
        }
    }

    /// Calls `each` with every row of `log` (of `kind` only, if given) in order: its sequence
    /// number, kind and body. Stops at the first error.
    pub(super) fn each_entry(
        &self,
        kind: Option<i64>,
        mut each: impl FnMut(i64, i64, &[u8]) -> Result<(), JournalError>,
    ) -> Result<(), JournalError> {
        let damaged = |e: rusqlite::Error| self.damaged(e);
        let mut st = self
            .conn
            .prepare("SELECT seq, kind, body FROM log WHERE ?1 IS NULL OR kind = ?1 ORDER BY seq")
            .map_err(damaged)?;
        let mut rows = st.query([kind]).map_err(damaged)?;
        while let Some(row) = rows.next().map_err(damaged)? {
            let seq: i64 = row.get(0).map_err(damaged)?;
            let kind: i64 = row.get(1).map_err(damaged)?;
            let body = row
                .get_ref(2)
                .and_then(|v| v.as_blob().map_err(Into::into))
                .map_err(damaged)?;
            each(seq, kind, body)?;
        }
        Ok(())
    }
}

/// Whether a write failed for want of room (the disk, or `max_page_count`).
fn is_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

/// Bytes in the write-ahead log of the database at `path`.
fn wal_bytes(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(Path::new(&wal)).map_or(0, |m| m.len())
}

/// A random id naming a server's state (kept in the journal, so it survives restarts): workers
/// resume only with the server that gave them their id.
pub(crate) fn new_server_id() -> String {
    use rand::Rng;
    let bytes: [u8; 12] = rand::thread_rng().gen();
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::{JobSpec, TaskSet};

    #[test]
    fn the_file_is_the_owners_only() {
        let dir = tempfile::tempdir().unwrap();
        drop(Journal::open(dir.path(), None).unwrap());
        // The journal holds the secret: nobody else may read it.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(JOURNAL_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "journal mode {mode:o}");
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
        let spec = JobSpec::command("t", vec!["true".into()]);
        p.submit(1, 0, None, &spec, &list, false);
        let e = j.commit(&mut p).unwrap_err();
        assert_eq!(
            e.err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DiskFull)
        );
        assert!(!e.inputs_kept, "the submission itself does not fit");
        assert_eq!(j.rows(), 0);
        let msg = j.explain(&e.err, "D");
        assert!(
            msg.contains("reached its limit of 64K set by --journal-limit"),
            "{msg}"
        );
        assert!(msg.contains("kestrel job forget"), "{msg}");
        assert!(!msg.contains("database or disk is full"), "{msg}");
        // Small entries still fit afterwards.
        p.cancel(1, 0);
        j.commit(&mut p).unwrap();
        assert_eq!(j.rows(), 1);
    }

    /// A successful end of task `index` of `job`.
    fn ok(job: u32, index: u32) -> kestrel_core::Finished {
        kestrel_core::Finished {
            job,
            index,
            started_us: 10,
            finished_us: 20,
            end: kestrel_core::RunEnd::Success,
        }
    }

    #[test]
    fn an_empty_file_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        std::fs::write(&path, b"").unwrap();
        let e = Journal::open(dir.path(), None).err().unwrap();
        assert!(matches!(e, JournalError::NoSchema { .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(e.contains("0 bytes") && e.contains("aside"), "{e}");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "nothing written"
        );
    }

    #[test]
    fn a_database_without_journal_tables_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let other = Connection::open(&path).unwrap();
        other
            .execute_batch("CREATE TABLE notes(x); INSERT INTO notes VALUES (1);")
            .unwrap();
        drop(other);
        let before = std::fs::read(&path).unwrap();
        let e = Journal::open(dir.path(), None).err().unwrap().to_string();
        assert!(
            e.contains("no journal tables") && e.contains("aside"),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before, "nothing written");
    }

    #[test]
    fn a_new_journal_is_made_in_one_transaction_and_can_shrink() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), None).unwrap();
        let mode: i64 = j
            .conn
            .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, 2, "incremental vacuum");
        drop(j);
        // Opened again: it is a journal now, not a file that merely exists.
        Journal::open(dir.path(), None).unwrap();
    }

    #[test]
    fn a_journal_of_schema_5_gets_a_job_column_and_is_rewritten_to_shrink() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        // As schema 5 made it: no `job` column, auto_vacuum off.
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
             CREATE TABLE log(seq INTEGER PRIMARY KEY, kind INTEGER NOT NULL, body BLOB NOT NULL);
             CREATE TABLE output(job INTEGER NOT NULL, task INTEGER NOT NULL, stream INTEGER NOT NULL, total INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY(job, task, stream)) WITHOUT ROWID;
             INSERT INTO meta VALUES ('schema_version', '5');",
        )
        .unwrap();
        drop(old);
        let mut j = Journal::open(dir.path(), None).unwrap();
        let mode: i64 = j
            .conn
            .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, 2);
        let mut p = Pending::default();
        let one = TaskSet::Array(kestrel_core::IdRanges::span(0, 0));
        p.submit(
            1,
            0,
            None,
            &JobSpec::command("t", vec!["true".into()]),
            &one,
            false,
        );
        j.commit(&mut p).unwrap();
        assert_eq!(j.rows(), 1);
    }

    /// A journal holding job 1 with `n` lines of tasks and their ends, and job 2 of one task.
    fn two_jobs(dir: &Path, n: usize, limit: Option<u64>) -> Journal {
        let mut j = Journal::open(dir, limit).unwrap();
        let spec = JobSpec::command("t", vec!["echo".into(), "{line}".into()]);
        let names: Vec<String> = (0..n).map(|i| format!("input-{i:08}.fits")).collect();
        let lines = TaskSet::Lines(names.iter().map(String::as_str).collect());
        let mut p = Pending::default();
        p.submit(1, 0, Some("k1".into()), &spec, &lines, false);
        j.commit(&mut p).unwrap();
        for chunk in (0..n as u32).collect::<Vec<_>>().chunks(1000) {
            for &i in chunk {
                p.task_end(ok(1, i), 5, 3);
            }
            j.commit(&mut p).unwrap();
        }
        let one = TaskSet::Array(kestrel_core::IdRanges::span(0, 0));
        p.submit(2, 0, None, &spec, &one, false);
        j.commit(&mut p).unwrap();
        j
    }

    #[test]
    fn a_forgotten_jobs_rows_go_and_the_file_shrinks() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = two_jobs(dir.path(), 100_000, None);
        let before = j.bytes();
        let rows = j.rows();
        let mut p = Pending::default();
        p.forget(vec![1], 100);
        j.commit(&mut p).unwrap();
        // Given back in bounded steps of 16 MiB (the engine makes one per tick).
        for _ in 0..10 {
            if !j.compaction_due() {
                break;
            }
            j.compact_step();
        }
        assert!(!j.compaction_due());
        let after = j.bytes();
        assert!(
            after * 4 < before,
            "the journal was {before} bytes and is {after} after forgetting job 1"
        );
        // Job 2's submission and the FORGET entry are left.
        assert_eq!(j.rows(), 2, "{rows} rows before");
        drop(j);
        let j = Journal::open(dir.path(), None).unwrap();
        assert_eq!(j.rows(), 2);
        let mut core = kestrel_core::Scheduler::new(kestrel_core::Config::default());
        let keys = j.replay(&mut core, &mut Default::default()).unwrap();
        assert!(core.job(1).is_none(), "job 1 stays forgotten");
        assert!(core.job(2).is_some());
        assert!(keys.is_empty());
        assert_eq!(
            j.meta().unwrap().next_job,
            None,
            "the engine writes next_job"
        );
    }

    #[test]
    fn a_full_journal_keeps_a_batchs_inputs_without_its_ends_and_a_forget_makes_room() {
        let dir = tempfile::tempdir().unwrap();
        let limit = 1 << 20;
        let mut j = two_jobs(dir.path(), 10_000, Some(limit));
        let rows = j.rows();
        // Ends of a big job that do not fit, with a cancel in the same batch.
        let spec = JobSpec::command("t", vec!["true".into()]);
        let mut p = Pending::default();
        let big = TaskSet::Array(kestrel_core::IdRanges::span(0, 999_999));
        p.submit(3, 0, None, &spec, &big, false);
        j.commit(&mut p).unwrap();
        let rows = rows + 1;
        let mut full = None;
        for round in 0..100u32 {
            for i in 0..10_000 {
                p.task_end(ok(3, round * 10_000 + i), 5, 3);
            }
            p.cancel(2, 7);
            match j.commit(&mut p) {
                Ok(()) => continue,
                Err(e) => {
                    full = Some((round, e));
                    break;
                }
            }
        }
        let Some((round, e)) = full else {
            panic!("the journal never filled");
        };
        assert!(e.inputs_kept, "the cancel is kept: {}", e.err);
        // Each round that fitted added an ENDS and a CANCEL row; the full one its CANCEL.
        assert_eq!(j.rows(), rows + 2 * u64::from(round) + 1);
        // Forgetting job 1 makes room: ends fit again.
        p.forget(vec![1], 9);
        for i in 0..1_000 {
            p.task_end(ok(3, 999_000 + i), 5, 3);
        }
        j.commit(&mut p).unwrap();
    }
}
