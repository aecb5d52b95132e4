//! What a worker keeps from its start to its end, across connections: [`WorkerState`].

use crate::cache::Cache;
use crate::executor::{Executor, Noop};
use crate::files::{SharedFiles, WorkerFiles};
use crate::ledger::Ledger;
use crate::pool::Pool;
use crate::staging::Staging;
use crate::{CacheConfig, ExecMode, WorkerConfig, WorkerError};
use kestrel_core::WorkerId;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

/// Everything of a worker that outlives its connections; a session (`session::serve`) borrows
/// it for one connection's life.
///
/// The worker's data cache (files kept for later tasks, served to peers) lives here too,
/// beside `staging`, which fills it; its Python runners live inside the executor (one per
/// thread of the pool, `runner.rs`).
pub(crate) struct WorkerState {
    /// Runs the tasks; chosen once, from [`WorkerConfig::exec`].
    pub(crate) exec: Box<dyn Executor>,
    /// The step between "assigned" and "queued for a slot".
    pub(crate) staging: Staging,
    /// What the next registration hands over.
    pub(crate) carry: Carry,
    /// A cache directory made for this run alone, removed when the worker ends.
    scratch_cache: Option<tempfile::TempDir>,
    /// The lock on the cache directory, held while the worker lives.
    cache_lock: Option<std::fs::File>,
}

/// What outlives a dropped connection: templates, running tasks and their buffered results,
/// so the next registration hands them over instead of the server running them again.
pub(crate) struct Carry {
    pub(crate) ledger: Ledger,
    /// Worker id, server id and epoch of the last registration.
    pub(crate) prev: Option<(WorkerId, String, u64)>,
}

impl Carry {
    /// Whether the worker has registered with a server at least once.
    pub(crate) fn registered(&self) -> bool {
        self.prev.is_some()
    }
}

impl WorkerState {
    /// A worker's state before its first connection, with the executor its `config` asks for.
    pub(crate) fn new(config: &WorkerConfig) -> Result<WorkerState, WorkerError> {
        let (cache, scratch, lock) = match (&config.cache, config.exec) {
            (Some(c), ExecMode::Process) => {
                let (cache, scratch, lock) = open_cache(c)?;
                (Some(cache), scratch, Some(lock))
            }
            _ => (None, None, None),
        };
        let exec: Box<dyn Executor> = match config.exec {
            ExecMode::Process => {
                // A wrong interpreter is refused now, not task by task.
                let python = match &config.python {
                    Some(program) => {
                        let info = crate::runner::probe(program).map_err(WorkerError::Setup)?;
                        Some((program.clone(), info))
                    }
                    None => None,
                };
                Box::new(Pool::new(config.slots.max(1), cache.clone(), python)?)
            }
            ExecMode::Noop => Box::new(Noop),
        };
        let mut state = WorkerState::with_executor(config, exec);
        state.carry.ledger.files = cache;
        state.scratch_cache = scratch;
        state.cache_lock = lock;
        Ok(state)
    }

    /// A worker's state before its first connection, running tasks with `exec`.
    pub(crate) fn with_executor(config: &WorkerConfig, exec: Box<dyn Executor>) -> WorkerState {
        WorkerState {
            exec,
            staging: Staging::default(),
            carry: Carry {
                ledger: Ledger::new(config),
                prev: None,
            },
            scratch_cache: None,
            cache_lock: None,
        }
    }

    /// The connection is gone for good: stops the tasks and waits until they are reaped.
    pub(crate) async fn abandon(&mut self) {
        crate::executor::abandon(&mut self.carry.ledger, self.exec.as_mut()).await;
    }

    /// Ends the executor. Every task has ended by now: its threads are idle, and the reaper
    /// exits. A scratch cache directory goes with it.
    pub(crate) fn close(self) {
        self.exec.close();
        drop(self.cache_lock);
        drop(self.scratch_cache);
    }
}

/// Opens the cache `c` asks for: in its directory, locked so that no other worker on this
/// machine uses it at once, or in a fresh scratch directory.
type OpenedCache = (SharedFiles, Option<tempfile::TempDir>, std::fs::File);

fn open_cache(c: &CacheConfig) -> Result<OpenedCache, WorkerError> {
    let (dir, scratch) = match &c.dir {
        Some(d) => (d.clone(), None),
        None => {
            remove_abandoned_scratch(&std::env::temp_dir());
            let t = tempfile::Builder::new()
                .prefix(SCRATCH_PREFIX)
                .tempdir()
                .map_err(|e| WorkerError::Setup(format!("cannot make a cache directory: {e}")))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let setup =
        |e: std::io::Error| WorkerError::Setup(format!("cache directory {}: {e}", dir.display()));
    // Owner-only when the worker makes it (a scratch directory is made so by tempfile).
    crate::cache::create_private_dir(&dir).map_err(setup)?;
    let lock = lock_dir(&dir)?;
    let cache = Cache::open(&dir, c.capacity, c.policy).map_err(setup)?;
    let files = Arc::new(WorkerFiles::new(cache, c.store_readers));
    files
        .start_prefetch()
        .map_err(|e| WorkerError::Setup(format!("cannot start prefetch threads: {e}")))?;
    Ok((files, scratch, lock))
}

/// What a scratch cache directory's name starts with, in the temporary directory.
const SCRATCH_PREFIX: &str = "kestrel-cache-";

/// Removes the scratch caches under `tmp` that workers killed without their ending (SIGKILL,
/// or SIGTERM, whose default is to die) left behind: those no live worker holds the lock of.
/// One made a moment ago may not be locked yet: only those older than a minute go.
fn remove_abandoned_scratch(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let old = |m: &std::fs::Metadata| {
        m.modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(60))
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let is_scratch = name.to_str().is_some_and(|n| n.starts_with(SCRATCH_PREFIX));
        let dir = e.path();
        if !is_scratch || !e.metadata().is_ok_and(|m| m.is_dir() && old(&m)) {
            continue;
        }
        // Held while its lock is: this open takes it, and closing lets it go at once.
        if lock_dir(&dir).is_ok() && std::fs::remove_dir_all(&dir).is_ok() {
            tracing::debug!(dir = %dir.display(), "removed a scratch cache a dead worker left");
        }
    }
}

/// Takes an exclusive lock on `dir/lock`, held as long as the file returned is open (two
/// workers sharing one cache directory would evict each other's files under them).
fn lock_dir(dir: &Path) -> Result<std::fs::File, WorkerError> {
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| WorkerError::Setup(format!("cache lock {}: {e}", path.display())))?;
    // SAFETY: flock on a descriptor this function owns; the call touches no memory.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !locked {
        return Err(WorkerError::Setup(format!(
            "cache directory {} is in use by another worker on this machine; give each worker its own --cache-dir",
            dir.display()
        )));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_caches_of_dead_workers_go_and_live_or_new_ones_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let make = |name: &str, age_s: u64| {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(dir.join("files")).unwrap();
            std::fs::write(dir.join("files/x"), b"x").unwrap();
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age_s);
            std::fs::File::open(&dir)
                .unwrap()
                .set_modified(when)
                .unwrap();
            dir
        };
        let dead = make("kestrel-cache-dead", 3600);
        let live = make("kestrel-cache-live", 3600);
        let new = make("kestrel-cache-new", 0);
        let other = make("not-a-cache", 3600);
        let _held = lock_dir(&live).unwrap();
        remove_abandoned_scratch(tmp.path());
        assert!(!dead.exists());
        assert!(live.join("files/x").exists() && new.exists() && other.exists());
    }

    #[test]
    fn the_exec_mode_chooses_the_executor_once() {
        let mut config = WorkerConfig::new(1);
        config.exec = ExecMode::Noop;
        let noop = WorkerState::new(&config).unwrap();
        assert_eq!(noop.exec.kind(), "noop");
        assert!(!noop.carry.registered());
        noop.close();
        config.exec = ExecMode::Process;
        let process = WorkerState::new(&config).unwrap();
        assert_eq!(process.exec.kind(), "process");
        process.close();
    }
}
