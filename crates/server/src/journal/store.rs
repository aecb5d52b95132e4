//! The journal's SQLite file: opening (with its checks), the `meta` table, and appending a
//! batch's entries in one transaction. A size limit (SQLite's `max_page_count`) stands in for a
//! full disk in tests; a full disk fails the commit and keeps nothing of it.

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
/// entries' `workers`). Older journals are read as they are.
pub(super) const SCHEMA_VERSION: i64 = 5;

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
    /// Worker ids it gave out are below this (absent before schema 5).
    pub next_worker: Option<u32>,
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
        j.rows = j
            .conn
            .query_row("SELECT count(*) FROM log", [], |r| r.get::<_, i64>(0))
            .map_err(damaged)? as u64;
        Ok(j)
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
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        size(&self.path) + size(Path::new(&wal))
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
    /// On error nothing of it is kept.
    pub fn commit(&mut self, pending: &mut Pending) -> Result<(), rusqlite::Error> {
        pending.seal_ends();
        if pending.rows.is_empty() && pending.outputs.is_empty() && pending.next_worker.is_none() {
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
            if let Some(next) = pending.next_worker {
                // Only ever raised: a stale value from an earlier batch never lowers it.
                tx.execute(
                    "INSERT INTO meta(key, value) VALUES ('next_worker', ?1) ON CONFLICT(key) DO UPDATE SET value = CAST(max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER)) AS TEXT)",
                    params![next.to_string()],
                )?;
            }
            tx.commit()
        })();
        pending.clear();
        result?;
        self.rows += n;
        Ok(())
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
        assert_eq!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DiskFull));
        assert_eq!(j.rows(), 0);
        // Small entries still fit afterwards.
        p.cancel(1, 0);
        j.commit(&mut p).unwrap();
        assert_eq!(j.rows(), 1);
    }
}
