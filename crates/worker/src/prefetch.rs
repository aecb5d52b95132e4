//! Prefetch: the inputs of tasks waiting in this worker's queue (its prefetch window) are
//! fetched while its slots run earlier tasks, so that a slot does not wait for a transfer it
//! could have overlapped.
//!
//! When a run of tasks of a job with files is assigned ([`WorkerFiles::prefetch`], from the
//! staging step), each task's file plan goes to a few prefetch threads. They bring each input
//! into the cache the way a run would ([`fetch_once`]: once per file, from peers, then the
//! store) and pin it for the task, so it is not evicted before the task starts. The task's run
//! finds its inputs cached, or waits for the fetch still under way instead of starting another,
//! and gives the pins back when it ends ([`WorkerFiles::take_prefetched`]). A task revoked,
//! canceled or taken back before it starts gives its pins back ([`WorkerFiles::forget_prefetched`]).
//!
//! A slot that frees while the head of the queue still waits for its fetch takes the first
//! queued task whose fetch ahead has ended instead ([`crate::local::Local::prefer_staged`]), so
//! the transfer goes on beside a running task rather than on an idle slot.
//!
//! A fetch that fails here is not reported: the task's run meets the same failure and reports
//! it with the task. Transfers are counted once: by the prefetcher for what it fetched, and not
//! again as local hits when the run finds those files.

use crate::exec::CancelHandle;
use crate::files::{fetch_once, lock, Fetch, FilesPlan, WorkerFiles};
use crate::ledger::Key;
use crossbeam_channel::{Receiver, Sender};
use kestrel_core::files::Transfers;
use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

/// How many files a worker prefetches at once (each waits its turn for a store reader
/// beside the runs' own reads).
pub const PREFETCH_THREADS: usize = 2;

/// What the prefetcher holds for queued tasks.
#[derive(Debug, Default)]
pub(crate) struct Prefetched {
    /// Per task not ended: the files pinned for it, and whether the prefetcher fetched each
    /// (else it was cached already). A task's entry exists from its assignment to the end of
    /// its run; a task without one is not prefetched for.
    pinned: Mutex<FxHashMap<Key, Ahead>>,
    /// Where file plans go to the prefetch threads, once they run.
    tx: OnceLock<Sender<(Key, Box<FilesPlan>, CancelHandle)>>,
}

/// What is fetched ahead for one task.
#[derive(Debug, Default)]
struct Ahead {
    /// Canceled when the task ends or goes: its prefetch stops (also a wait for a failing
    /// store).
    cancel: CancelHandle,
    /// The files pinned for it, and whether the prefetcher fetched each.
    names: Vec<(String, bool)>,
    /// Whether the prefetcher is done with it (whatever came of it): its run waits for no
    /// fetch of the prefetcher's.
    ended: bool,
}

impl Prefetched {
    fn pinned(&self) -> MutexGuard<'_, FxHashMap<Key, Ahead>> {
        self.pinned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes task `key`'s entry, stopping its prefetch.
    fn take(&self, key: Key) -> Vec<String> {
        let Some(ahead) = self.pinned().remove(&key) else {
            return Vec::new();
        };
        ahead.cancel.cancel();
        ahead.names.into_iter().map(|(name, _)| name).collect()
    }
}

impl WorkerFiles {
    /// Starts the prefetch threads. They hold the files weakly: they end when the worker's
    /// files are dropped (the channel closes with them).
    pub(crate) fn start_prefetch(self: &Arc<Self>) -> std::io::Result<()> {
        let (tx, rx) = crossbeam_channel::unbounded();
        if self.ahead.tx.set(tx).is_err() {
            return Ok(());
        }
        for i in 0..PREFETCH_THREADS {
            let (files, rx) = (Arc::downgrade(self), rx.clone());
            std::thread::Builder::new()
                .name(format!("kestrel-prefetch-{i}"))
                .spawn(move || prefetch_loop(&files, &rx))?;
        }
        Ok(())
    }

    /// Fetches the inputs of queued task `key` ahead of its start, as `plan` names them.
    pub(crate) fn prefetch(&self, key: Key, plan: Box<FilesPlan>) {
        let Some(tx) = self.ahead.tx.get() else {
            return;
        };
        // A worker that caches nothing would fetch each input twice: ahead, then for the run.
        if lock(self).capacity() == 0 {
            return;
        }
        // Once per task: a second entry would drop the first one's pins without giving them
        // back.
        let cancel = match self.ahead.pinned().entry(key) {
            std::collections::hash_map::Entry::Occupied(_) => return,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Ahead::default()).cancel.clone()
            }
        };
        let _ = tx.send((key, plan, cancel));
    }

    /// What was pinned for task `key`, now that its run has ended: the run unpins them.
    pub(crate) fn take_prefetched(&self, key: Key) -> Vec<String> {
        self.ahead.take(key)
    }

    /// Which tasks wait for no fetch ahead, under one lock for as many questions as a caller
    /// has (a scan of the queue asks up to [`crate::local::LOOK_AHEAD`]).
    pub(crate) fn prefetch_view(&self) -> PrefetchView<'_> {
        PrefetchView(self.ahead.pinned())
    }

    /// Whether task `key` waits for no fetch ahead ([`PrefetchView::ended`]).
    #[cfg(test)]
    fn prefetch_ended(&self, key: Key) -> bool {
        self.prefetch_view().ended(key)
    }

    /// Whether the prefetcher fetched `name` for task `key` (and counted the transfer).
    pub(crate) fn fetched_ahead(&self, key: Key, name: &str) -> bool {
        self.ahead
            .pinned()
            .get(&key)
            .is_some_and(|a| a.names.iter().any(|(n, fetched)| *fetched && n == name))
    }

    /// Tasks that will not run here (revoked, canceled, taken back, not launchable): their
    /// prefetch stops and their pins go.
    pub(crate) fn forget_prefetched(&self, keys: &[Key]) {
        let dropped: Vec<String> = keys.iter().flat_map(|&k| self.ahead.take(k)).collect();
        self.unpin_all(&dropped);
    }

    fn unpin_all(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        let mut c = lock(self);
        for name in names {
            c.unpin(name);
        }
    }

    /// Records `name`, pinned for task `key` (`fetched` for it, if so); unpins it if the
    /// task has ended or gone meanwhile.
    pub(crate) fn pinned_for(&self, key: Key, name: String, fetched: bool) {
        let mut pinned = self.ahead.pinned();
        match pinned.get_mut(&key) {
            Some(ahead) => ahead.names.push((name, fetched)),
            None => {
                drop(pinned);
                self.unpin_all(&[name]);
            }
        }
    }

    /// Records `name` as fetched (and pinned) for task `key`, if the task has not ended:
    /// whether it was recorded.
    pub(crate) fn record_fetched(&self, key: Key, name: &str) -> bool {
        match self.ahead.pinned().get_mut(&key) {
            Some(ahead) => {
                ahead.names.push((name.to_string(), true));
                true
            }
            None => false,
        }
    }

    #[cfg(test)]
    fn wanted(&self, key: Key) -> bool {
        self.ahead.pinned().contains_key(&key)
    }
}

/// The prefetcher's books, held for a few questions.
pub(crate) struct PrefetchView<'a>(MutexGuard<'a, FxHashMap<Key, Ahead>>);

impl PrefetchView<'_> {
    /// Whether task `key` waits for no fetch ahead: the prefetcher is done with it, or it
    /// has none (its job reads no files, or this worker caches nothing).
    pub(crate) fn ended(&self, key: Key) -> bool {
        self.0.get(&key).is_none_or(|a| a.ended)
    }
}

fn prefetch_loop(files: &Weak<WorkerFiles>, rx: &Receiver<(Key, Box<FilesPlan>, CancelHandle)>) {
    while let Ok((key, plan, cancel)) = rx.recv() {
        let Some(files) = files.upgrade() else {
            return;
        };
        prefetch_one(&files, key, &plan, &cancel);
    }
}

/// Brings task `key`'s inputs into the cache and pins them for it, while it is still queued;
/// `cancel` stops it when the task ends or goes. Then marks the task's prefetch ended, so a
/// slot may take it before tasks whose fetches are still under way.
fn prefetch_one(files: &WorkerFiles, key: Key, plan: &FilesPlan, cancel: &CancelHandle) {
    fetch_ahead(files, key, plan, cancel);
    if let Some(ahead) = files.ahead.pinned().get_mut(&key) {
        ahead.ended = true;
    }
}

/// The fetches of [`prefetch_one`].
fn fetch_ahead(files: &WorkerFiles, key: Key, plan: &FilesPlan, cancel: &CancelHandle) {
    if plan.bad_name.is_some() {
        return;
    }
    let mut moved = Transfers::default();
    for name in &plan.inputs {
        if cancel.is_canceled() {
            break;
        }
        match fetch_once((key.0, key.1, name), plan, files, cancel, &mut moved, true) {
            // Recorded by `fetch_once` under the file's claim.
            Ok(Fetch::Cached(_, true)) => {}
            Ok(Fetch::Cached(_, false)) => files.pinned_for(key, plan.cached(name), false),
            // Too large for the cache, or it is full of files in use: the run streams it
            // itself, and the rest waits for it too (each such fetch here is one too many).
            Ok(Fetch::Uncached(partial)) => {
                let _ = std::fs::remove_file(partial);
                break;
            }
            // The cache's disk is full of files in use: the run streams it.
            Ok(Fetch::NoRoom) => break,
            // The run meets the same failure, and reports it with the task.
            Err(_) => break,
        }
    }
    files.note_moved(key, &moved);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Cache, EvictionPolicy};
    use crate::store::Store;
    use kestrel_core::files::cached_name;
    use std::fs;
    use std::time::{Duration, Instant};

    fn files_with_store() -> (tempfile::TempDir, Arc<WorkerFiles>, Box<FilesPlan>) {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        fs::create_dir_all(&store).unwrap();
        for n in ["a", "b"] {
            fs::write(store.join(n), n.repeat(100)).unwrap();
        }
        let cache = Cache::open(&dir.path().join("cache"), 1 << 20, EvictionPolicy::Lru).unwrap();
        let files = Arc::new(WorkerFiles::new(cache, 1));
        files.start_prefetch().unwrap();
        let plan = Box::new(FilesPlan {
            cache_prefix: cached_name(Some(&store.display().to_string()), ""),
            store: Some(Store::Dir(store)),
            inputs: vec!["a".into(), "b".into()],
            statics: 0,
            outputs: vec![],
            local: vec![],
            sandbox: dir.path().to_path_buf(),
            bad_name: None,
        });
        (dir, files, plan)
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// How many files are pinned for task `key` so far.
    fn pinned_for(files: &WorkerFiles, key: Key) -> usize {
        files.ahead.pinned().get(&key).map_or(0, |a| a.names.len())
    }

    #[test]
    fn a_task_prefetched_twice_is_fetched_and_pinned_once() {
        let (_dir, files, plan) = files_with_store();
        assert!(files.prefetch_ended((1, 0)), "no fetch ahead to wait for");
        files.prefetch((1, 0), plan.clone());
        wait_until("both inputs pinned for the task", || {
            pinned_for(&files, (1, 0)) == 2
        });
        wait_until("its prefetch marked ended", || files.prefetch_ended((1, 0)));
        // Assigned again (a malformed or repeated assignment): the pins taken stay recorded,
        // to be given back.
        files.prefetch((1, 0), plan);
        assert_eq!(pinned_for(&files, (1, 0)), 2);
        for name in files.take_prefetched((1, 0)) {
            lock(&files).unpin(&name);
        }
        // Nothing else holds a pin: a file as large as the whole cache gets in.
        let p = lock(&files).partial_path();
        fs::write(&p, vec![b'x'; 1 << 20]).unwrap();
        wait_until("the cache to take a file needing all of it", || {
            lock(&files).insert("big", &p, 1 << 20, None).is_ok()
        });
    }

    #[test]
    fn a_queued_tasks_inputs_are_fetched_pinned_and_counted_once() {
        let (_dir, files, plan) = files_with_store();
        let (a, b) = (plan.cached("a"), plan.cached("b"));
        files.prefetch((1, 0), plan);
        wait_until("both inputs pinned for the task", || {
            pinned_for(&files, (1, 0)) == 2
        });
        assert!(files.fetched_ahead((1, 0), &a) && files.fetched_ahead((1, 0), &b));
        let taken = files.take_prefetched((1, 0));
        assert_eq!(taken, vec![a.clone(), b.clone()]);
        let t = files.take_change().moved[0].moved;
        assert_eq!((t.store_files, t.store_bytes), (2, 200));
        // Pinned for the task: a full cache cannot evict them.
        let mut c = lock(&files);
        c.unpin(&a);
        c.unpin(&b);
        assert_eq!(c.held().len(), 2);
    }

    #[test]
    fn a_worker_that_caches_nothing_fetches_nothing_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 0, EvictionPolicy::Lru).unwrap();
        let files = Arc::new(WorkerFiles::new(cache, 1));
        files.start_prefetch().unwrap();
        let (_store, _, plan) = files_with_store();
        files.prefetch((1, 0), plan);
        // Not even queued for the prefetch threads (an entry is made before a plan is sent).
        assert!(!files.wanted((1, 0)));
    }

    #[test]
    fn a_task_that_goes_before_its_prefetch_gives_its_pins_back() {
        let (_dir, files, plan) = files_with_store();
        let a = plan.cached("a");
        files.prefetch((1, 0), plan);
        wait_until("the first input pinned", || pinned_for(&files, (1, 0)) > 0);
        files.forget_prefetched(&[(1, 0)]);
        assert!(files.take_prefetched((1, 0)).is_empty());
        // Nothing stays pinned (a fetch under way at the forget lets go when it ends): a file
        // as large as the whole cache gets in, evicting everything.
        let p = lock(&files).partial_path();
        fs::write(&p, vec![b'x'; 1 << 20]).unwrap();
        wait_until("the cache to take a file needing all of it", || {
            lock(&files).insert("big", &p, 1 << 20, None).is_ok()
        });
        assert!(lock(&files).held().iter().all(|(n, _)| n != &a));
    }
}
