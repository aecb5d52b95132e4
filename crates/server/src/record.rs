//! The record of a finished `kestrel run`: with `--server-dir DIR`, the run's server keeps its
//! journal in DIR and marks the directory as a run's; once the run has ended (and its server
//! with it), client commands pointed at DIR read the record through [`open`]: a server of their
//! own process, on loopback, that replays the journal and answers queries (jobs, tasks, their
//! streamed output) but changes nothing, so `kestrel task list 1 --state failed` works after
//! the run as it did during it.

use crate::config::ServerConfig;
use crate::journal::{Journal, JOURNAL_FILE};
use crate::start::{serve, RunningServer, StartError};
use kestrel_proto::Access;
use std::path::Path;
use tokio::net::TcpListener;

/// The file that marks a directory as a run's (what it says is for a person who finds it).
pub const RUN_MARK: &str = "run-record.txt";

const MARK_TEXT: &str =
    "This directory holds the record of a `kestrel run` (its journal, journal.sqlite).\n\
Once the run has ended, `kestrel --server-dir <this directory> job list` (task list, task info,\n\
job cat, ...) reads it. The next `kestrel run --server-dir <this directory>` replaces it.\n";

/// Whether `dir` holds the record of a run (its server may still be running).
pub fn is_run_record(dir: &Path) -> bool {
    dir.join(RUN_MARK).is_file() && dir.join(JOURNAL_FILE).is_file()
}

/// Whether `dir` holds the record of a run that has ended: its server is gone. That is so
/// when the run removed its access file as it ended, and also when the run was killed
/// (`kill -9`, a node's crash) and left it behind: nobody holds the directory's lock then.
pub fn has_ended_run(dir: &Path) -> bool {
    is_run_record(dir)
        && (!dir.join(kestrel_proto::ACCESS_FILE).exists()
            || crate::lock::DirLock::acquire(dir).is_ok())
}

/// Makes `dir` (locked by the caller) ready for a run's record: an earlier run's record goes,
/// a server's journal stays and is refused (a run must not take over, nor erase, a server's
/// jobs).
pub(crate) fn prepare(dir: &Path) -> Result<(), StartError> {
    let journal = dir.join(JOURNAL_FILE);
    if journal.exists() {
        if !dir.join(RUN_MARK).is_file() {
            return Err(StartError::ServerJournal {
                dir: dir.to_path_buf(),
            });
        }
        for suffix in ["", "-wal", "-shm"] {
            let mut path = journal.clone().into_os_string();
            path.push(suffix);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    return Err(StartError::Dir {
                        path: path.into(),
                        err,
                    })
                }
            }
        }
    }
    std::fs::write(dir.join(RUN_MARK), MARK_TEXT).map_err(|err| StartError::Dir {
        path: dir.join(RUN_MARK),
        err,
    })
}

/// Serves the record of the run that ended in `dir`, read only, on loopback for this process
/// alone: its access (a fresh secret) is returned, never written to a file, and `dir` is not
/// locked (several commands may read one record at once) nor written.
pub async fn open(dir: &Path) -> Result<RunningServer, StartError> {
    let config = ServerConfig::local(dir.to_path_buf());
    let journal = Journal::open(dir, None)?;
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|err| StartError::Bind {
            addr: "127.0.0.1:0".into(),
            err,
        })?;
    let local_addr = listener.local_addr().map_err(|err| StartError::Bind {
        addr: "127.0.0.1:0".into(),
        err,
    })?;
    let access = Access::generate("127.0.0.1".into(), local_addr.port());
    let mut engine = crate::engine::Engine::new(&config, &access);
    let why = format!(
        "{} holds the record of a `kestrel run` that has ended: it can be read (job list, job info, job cat, task list, task info, ...), not changed; no server runs there",
        dir.display()
    );
    engine.attach_record(journal, why)?;
    Ok(serve(
        engine,
        listener,
        access,
        None,
        config.timeouts(),
        None,
    ))
}
