//! A worker's files: its cache, and the transfers that fill it. An input is fetched once per
//! worker however many runs need it, from the peers' caches ([`crate::peer`]) or the store
//! ([`Store`]), through `DIR/partial`, and moved into place whole; a worker reads from the
//! store at most `store_readers` files at once (TaskVine's bound of one reader per worker by
//! default), so many workers starting together do not stampede it.
//!
//! Fetches run on the executor thread of the task that needs the file, just before it runs
//! ([`crate::sandbox`] stages and collects a run's files), or ahead of it while it is queued
//! ([`crate::prefetch`]): inputs of queued tasks are usually in the cache by then, and a run
//! whose input is still on its way waits for that fetch on its slot.

use crate::cache::{Cache, CacheError, Digest};
use crate::exec::{CancelHandle, ExitKind};
use crate::ledger::Key;
use crate::peer::{Fetched, Peers};
use crate::prefetch::Prefetched;
use crate::store::{Store, StoreError, WriteFailed};
use kestrel_core::files::Transfers;
use kestrel_core::{JobId, TaskIndex};
use kestrel_proto::messages::{CacheChange, FileSources, JobTransfers, TaskTransfers};
use rustc_hash::FxHashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A worker's cache and its bound on reads from the store, shared by its executor threads.
#[derive(Debug)]
pub struct WorkerFiles {
    cache: Mutex<Cache>,
    /// Reads from the store under way, and the most at once.
    readers: (Mutex<u32>, Condvar),
    max_readers: u32,
    /// Where staged inputs came from, per job, since the last report.
    moved: Mutex<Vec<JobTransfers>>,
    /// Files being fetched by some run now: another run that needs one waits for it rather
    /// than fetch it again (one download per file per worker).
    fetching: (Mutex<FxHashMap<String, Key>>, Condvar),
    /// The other workers, as sources of files and askers for this one's.
    pub peers: Peers,
    /// Inputs staged ahead for queued tasks (see `crate::prefetch`).
    pub(crate) ahead: Prefetched,
    /// Wakes the session to report the cache now rather than at the next heartbeat: copies
    /// made for `--replicas` count only once the server knows of them.
    pub(crate) report_now: tokio::sync::Notify,
    /// Copies for `--replicas` under way, each with whether the server has since deleted the
    /// file (`DropFiles`): a copy that lands after its file was deleted is thrown away, or it
    /// would be kept (never evicted) and reported held for a file nobody owns.
    replicating: Mutex<FxHashMap<String, bool>>,
}

/// The worker's files, as its threads and its session hold them.
pub type SharedFiles = Arc<WorkerFiles>;

impl WorkerFiles {
    /// `cache`, reading at most `max_readers` files from stores at once.
    pub fn new(cache: Cache, max_readers: u32) -> WorkerFiles {
        WorkerFiles {
            cache: Mutex::new(cache),
            readers: (Mutex::new(0), Condvar::new()),
            max_readers: max_readers.max(1),
            moved: Mutex::new(Vec::new()),
            fetching: (Mutex::new(FxHashMap::default()), Condvar::new()),
            peers: Peers::default(),
            ahead: Prefetched::default(),
            report_now: tokio::sync::Notify::new(),
            replicating: Mutex::new(FxHashMap::default()),
        }
    }

    /// Copies of `files` are about to be made (called in message order, before the copies
    /// start off the session's loop).
    pub(crate) fn replicas_begin(&self, files: &[FileSources]) {
        let mut r = self
            .replicating
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for f in files {
            r.insert(f.file.clone(), false);
        }
    }

    /// The server deleted `names` (called in message order): copies of them under way are
    /// thrown away when they land.
    pub(crate) fn replicas_dropped(&self, names: &[String]) {
        let mut r = self
            .replicating
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for n in names {
            if let Some(dropped) = r.get_mut(n) {
                *dropped = true;
            }
        }
    }

    /// The copy of `name` is done: whether its file was deleted meanwhile.
    fn replica_end(&self, name: &str) -> bool {
        let mut r = self
            .replicating
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        r.remove(name).unwrap_or(false)
    }

    /// What the cache gained and lost and where inputs came from, since the last call: for
    /// the next update to the server.
    pub fn take_change(&self) -> CacheChange {
        let mut change = lock(self).take_delta();
        change.moved =
            std::mem::take(&mut *self.moved.lock().unwrap_or_else(PoisonError::into_inner));
        change.unheld = self.peers.take_unheld();
        change
    }

    /// Records where task `index` of `job`'s inputs came from, for the next report.
    pub(crate) fn note_moved(&self, (job, index): Key, moved: &Transfers) {
        if moved.is_empty() {
            return;
        }
        // One entry per note (a task's prefetch and run may note one each): the server adds
        // them up per task, so no search here.
        self.of_job(job, |t| {
            t.moved.add(moved);
            t.tasks.push(TaskTransfers {
                index,
                moved: *moved,
            });
        });
    }

    /// Reads of `job`'s store are failing and being retried, for `why`: the server shows it
    /// in `job info` until reads succeed again.
    fn note_store_trouble(&self, job: JobId, why: &str) {
        self.of_job(job, |t| t.store_trouble = why.to_string());
    }

    /// Changes `job`'s entry of what to report.
    fn of_job(&self, job: JobId, change: impl FnOnce(&mut JobTransfers)) {
        let mut all = self.moved.lock().unwrap_or_else(PoisonError::into_inner);
        let at = match all.iter().position(|t| t.job == job) {
            Some(at) => at,
            None => {
                all.push(JobTransfers {
                    job,
                    ..JobTransfers::default()
                });
                all.len() - 1
            }
        };
        change(&mut all[at]);
    }

    /// Whether anything waits to be reported (checked at each heartbeat, so that a worker
    /// whose tasks all wait for a store still says so).
    pub fn has_change(&self) -> bool {
        !self
            .moved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Claims the fetch of `key` for task `task`: `Err` once another fetch of it has ended
    /// (look in the cache again), or if the run is canceled meanwhile; `Err(true)` if that
    /// fetch was for the same task (its prefetch), whose transfer it counted.
    fn claim<'a>(
        &'a self,
        key: &'a str,
        task: (JobId, TaskIndex),
        cancel: &CancelHandle,
    ) -> Result<Claim<'a>, bool> {
        let (fetching, ended) = &self.fetching;
        let mut now = fetching.lock().unwrap_or_else(PoisonError::into_inner);
        let owner = match now.get(key) {
            Some(&owner) => owner,
            None => {
                now.insert(key.to_string(), task);
                return Ok(Claim { files: self, key });
            }
        };
        while now.contains_key(key) && !cancel.is_canceled() {
            now = ended
                .wait_timeout(now, Duration::from_millis(200))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Err(owner == task)
    }

    /// Runs `read` once fewer than `max_readers` other reads are under way (the slot is
    /// given back even if `read` panics).
    fn reading<T>(&self, read: impl FnOnce() -> T) -> T {
        struct Slot<'a>(&'a (Mutex<u32>, Condvar));
        impl Drop for Slot<'_> {
            fn drop(&mut self) {
                let (count, freed) = self.0;
                *count.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
                freed.notify_one();
            }
        }
        let (count, freed) = &self.readers;
        let mut n = count.lock().unwrap_or_else(PoisonError::into_inner);
        while *n >= self.max_readers {
            n = freed.wait(n).unwrap_or_else(PoisonError::into_inner);
        }
        *n += 1;
        drop(n);
        let _slot = Slot(&self.readers);
        read()
    }
}

/// A run's claim on fetching one file, given up (waking the runs that wait for it) when
/// dropped, also by a panic.
struct Claim<'a> {
    files: &'a WorkerFiles,
    key: &'a str,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let (fetching, ended) = &self.files.fetching;
        fetching
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(self.key);
        ended.notify_all();
    }
}

/// The cache, also after a thread panicked holding it (its index is still whole).
pub(crate) fn lock(files: &WorkerFiles) -> MutexGuard<'_, Cache> {
    files.cache.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The files of one task, their names with placeholders replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilesPlan {
    /// The job's store, if it has one.
    pub store: Option<Store>,
    /// What the cache names this store's files by, before their names (`KEY/`, see
    /// [`kestrel_core::files::cached_name`]).
    pub cache_prefix: String,
    /// Inputs, then the job's static inputs, by logical name.
    pub inputs: Vec<String>,
    /// How many of `inputs`, at their end, are static: kept in the cache for the worker's
    /// life once staged.
    pub statics: usize,
    /// Outputs the task writes under these names in `sandbox`.
    pub outputs: Vec<String>,
    /// Which of `outputs` are `local`: kept in the cache until the server says they may go
    /// (`DropFiles`), never written to the store (an output not listed is written).
    pub local: Vec<bool>,
    /// Where the task runs and writes its outputs.
    pub sandbox: PathBuf,
    /// A name that, its placeholders replaced, is not a plain relative path (`../x`): the
    /// task fails with it rather than touch anything outside the store or the cache.
    pub bad_name: Option<String>,
}

impl FilesPlan {
    /// What the cache calls file `name` of this job's store (a value goes by its own name:
    /// see [`kestrel_core::files::cached_name`]).
    pub(crate) fn cached(&self, name: &str) -> String {
        if kestrel_core::values::is_value(name) {
            return name.to_string();
        }
        format!("{}{name}", self.cache_prefix)
    }
}

/// Pins `name` if the cache holds it (and it is still on disk as it came in: one gone from
/// under the cache, or changed by a task that wrote to it, is forgotten, to be fetched again):
/// its path and size.
fn pin_cached(name: &str, cache: &WorkerFiles) -> Option<(PathBuf, u64)> {
    let (path, size, stamp) = lock(cache).pin(name)?;
    // Looked at without the lock: the other slots' lookups do not wait on this disk access.
    let meta = fs::symlink_metadata(&path);
    if !meta.as_ref().is_ok_and(|m| stamp.matches(m)) {
        if meta.is_ok() {
            crate::cache::warn_changed(name);
        }
        let mut c = lock(cache);
        c.unpin(name);
        c.discard(name);
        return None;
    }
    Some((path, size))
}

/// What fetching one file came to.
pub(crate) enum Fetch {
    /// It is in the cache, pinned for the caller, at this path; whether this call fetched it.
    Cached(PathBuf, bool),
    /// It came, but the cache cannot hold it (larger than the cache, or full of files in use):
    /// the whole file is at this partial path, the caller's to place or remove.
    Uncached(PathBuf),
    /// It did not come: the disk under the cache is full and nothing in the cache can leave.
    /// The caller fetches it elsewhere (streams it) or leaves it to the task's run.
    NoRoom,
}

/// Why a file did not come.
pub(crate) enum NotFetched {
    /// The task ends so (canceled, or the file cannot be had).
    Exit(ExitKind),
    /// This worker could not write it.
    Local(WriteFailed),
}

/// Fetches file `name` of `job` (`key` in the cache) to `to`: from the peers the server named
/// as holding it, then from the store, counting the transfer in `moved`.
pub(crate) fn fetch_to(
    (job, name): (JobId, &str),
    key: &str,
    plan: &FilesPlan,
    to: &Path,
    cache: &WorkerFiles,
    cancel: &CancelHandle,
    moved: &mut Transfers,
) -> Result<(u64, Digest), NotFetched> {
    for peer in cache.peers.sources_of(key) {
        if cancel.is_canceled() {
            break;
        }
        match cache.peers.fetch(&peer, key, to) {
            Fetched::Got(size, digest) => {
                moved.peer_files += 1;
                moved.peer_bytes += size;
                return Ok((size, digest));
            }
            // The next peer would fail the same way.
            Fetched::Local(w) => return Err(NotFetched::Local(w)),
            _ => {}
        }
    }
    if cancel.is_canceled() {
        let _ = fs::remove_file(to);
        return Err(NotFetched::Exit(ExitKind::Canceled));
    }
    let (size, digest) = read_from_store((job, name), plan, to, cache, cancel)?;
    moved.store_files += 1;
    moved.store_bytes += size;
    Ok((size, digest))
}

/// Brings input `name` of task `index` of `job` into this worker's cache, or finds it there:
/// fetched once (runs that need it meanwhile wait for that fetch), from the peers the server
/// named as holding it, then from the store. Peer and store transfers are counted in `moved`;
/// a local hit too, unless `prefetching` (the task's run counts it, or not: see below).
///
/// Each transfer is counted once, for the task it was made for: a prefetch records what it
/// fetched for its task (`WorkerFiles::pinned_for`) before it lets go of the file's claim, so
/// the task's run, which either waited on that claim or looks after it, counts no hit.
pub(crate) fn fetch_once(
    (job, index, name): (JobId, TaskIndex, &str),
    plan: &FilesPlan,
    cache: &WorkerFiles,
    cancel: &CancelHandle,
    moved: &mut Transfers,
    prefetching: bool,
) -> Result<Fetch, ExitKind> {
    let key = plan.cached(name);
    let task = (job, index);
    let mut count_hit = !prefetching;
    // A hit is counted when it happens, unless this task's prefetch fetched the file.
    let hit = |moved: &mut Transfers, count_hit: bool| {
        let (path, size) = pin_cached(&key, cache)?;
        if count_hit && !cache.fetched_ahead(task, &key) {
            moved.local_files += 1;
            moved.local_bytes += size;
        }
        Some(path)
    };
    let claim = loop {
        if let Some(path) = hit(moved, count_hit) {
            return Ok(Fetch::Cached(path, false));
        }
        match cache.claim(&key, task, cancel) {
            Ok(claim) => break claim,
            // This task's own prefetch brought it (and counted it): not a hit as well.
            Err(same_task) => count_hit &= !same_task,
        }
        if cancel.is_canceled() {
            return Err(ExitKind::Canceled);
        }
    };
    // Looked at again under the claim: the fetch that ended just before may have cached it.
    if let Some(path) = hit(moved, count_hit) {
        return Ok(Fetch::Cached(path, false));
    }
    let partial = lock(cache).partial_path();
    // A full disk under the cache: evict to make room and fetch again, a few times at most
    // (other fetches fill the room made); then the caller streams the file past the cache.
    let mut room_made = 0;
    let (size, digest) = loop {
        match fetch_to((job, name), &key, plan, &partial, cache, cancel, moved) {
            Ok(got) => break got,
            Err(NotFetched::Exit(why)) => return Err(why),
            Err(NotFetched::Local(w)) if w.is_no_space() => {
                let _ = fs::remove_file(&partial);
                if room_made < 3 && lock(cache).disk_full(w.written, w.size) {
                    room_made += 1;
                    continue;
                }
                return Ok(Fetch::NoRoom);
            }
            Err(NotFetched::Local(w)) => {
                let _ = fs::remove_file(&partial);
                return Err(ExitKind::SpawnFailed(format!(
                    "input {name}: the cache directory failed: {w}"
                )));
            }
        }
    };
    cache.peers.forget_sources(&key);
    let inserted = {
        let mut c = lock(cache);
        let inserted = c.insert(&key, &partial, size, Some(digest));
        // A prefetch records the file as fetched for its task under the cache's lock, as it
        // goes in: the task's run, which finds it only under that lock, never counts it as a
        // hit as well, and a task that ended or went meanwhile leaves no pin behind.
        if prefetching && inserted.is_ok() && !cache.record_fetched(task, &key) {
            c.unpin(&key);
        }
        inserted
    };
    drop(claim);
    match inserted {
        Ok(path) => Ok(Fetch::Cached(path, true)),
        Err(CacheError::TooLarge { .. } | CacheError::Pinned { .. }) => {
            Ok(Fetch::Uncached(partial))
        }
        Err(CacheError::Io(e)) => {
            let _ = fs::remove_file(&partial);
            Err(ExitKind::SpawnFailed(format!(
                "input {name}: the cache directory failed: {e}"
            )))
        }
    }
}

/// How long a task waits for a failing store (reading again with backoff) before it fails.
const STORE_PATIENCE: Duration = Duration::from_secs(300);
/// The longest wait between two reads of a failing store.
const MAX_STORE_BACKOFF: Duration = Duration::from_secs(30);

/// Sleeps `delay`, or less if the run is canceled meanwhile: whether it was not.
fn sleep_unless_canceled(delay: Duration, cancel: &CancelHandle) -> bool {
    let until = Instant::now() + delay;
    while Instant::now() < until {
        if cancel.is_canceled() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100).min(until - Instant::now()));
    }
    !cancel.is_canceled()
}

/// Reads input `name` of `job` from its store into `partial`, within the worker's bound on
/// store readers: its size and digest. A store that fails (down, overloaded: anything but
/// "no such file") is read again with backoff for up to [`STORE_PATIENCE`], and the job is
/// told why its tasks wait.
fn read_from_store(
    (job, name): (JobId, &str),
    plan: &FilesPlan,
    partial: &Path,
    cache: &WorkerFiles,
    cancel: &CancelHandle,
) -> Result<(u64, Digest), NotFetched> {
    let exit = |why| Err(NotFetched::Exit(why));
    if kestrel_core::values::is_value(name) {
        // In no store: only a cache ever held it.
        return exit(ExitKind::Unrunnable(crate::values::lost(name)));
    }
    let Some(store) = &plan.store else {
        return exit(ExitKind::Unrunnable(format!(
            "input {name} is in no cache and the job has no store; give one with `--store DIR|URL` (or `kestrel server start --store`)"
        )));
    };
    let patience = Instant::now() + STORE_PATIENCE;
    let mut delay = Duration::from_millis(500);
    loop {
        match cache.reading(|| store.read_into(name, partial)) {
            Ok(read) => return Ok(read),
            Err(StoreError::NotFound(store)) => {
                let _ = fs::remove_file(partial);
                // Not retried: running the task again would not make the file appear.
                return exit(ExitKind::Unrunnable(format!(
                    "input {name} not found in {store}; check the name, or put the file there (not retried)"
                )));
            }
            // Not the store's doing: no backoff, no "store trouble".
            Err(StoreError::Local(w)) => return Err(NotFetched::Local(w)),
            Err(StoreError::Failed(why)) => {
                let _ = fs::remove_file(partial);
                if Instant::now() + delay > patience {
                    return exit(ExitKind::SpawnFailed(format!(
                        "{why} (the store failed for {}s; gave up)",
                        STORE_PATIENCE.as_secs()
                    )));
                }
                tracing::warn!(job, "{why}; reading again in {:.1}s", delay.as_secs_f64());
                cache.note_store_trouble(job, &why);
                if !sleep_unless_canceled(delay, cancel) {
                    return exit(ExitKind::Canceled);
                }
                delay = (delay * 2).min(MAX_STORE_BACKOFF);
            }
        }
    }
}

/// Copies intermediate files from the peers named into the cache and keeps them there until
/// the server releases them (`--replicas`: more copies than the writer's). A file already here
/// is kept as it is; one no peer serves whole is left out (peers report what they did not
/// serve, which corrects the server's index, and the file is made again if it is lost).
pub(crate) fn replicate(files: Vec<FileSources>, cache: &WorkerFiles) {
    for f in files {
        let key = f.file;
        if lock(cache).keep(&key) {
            cache.replica_end(&key);
            continue;
        }
        let partial = lock(cache).partial_path();
        let got = f
            .peers
            .iter()
            .find_map(|peer| match cache.peers.fetch(peer, &key, &partial) {
                Fetched::Got(size, digest) => Some((size, digest)),
                _ => None,
            });
        let dropped = cache.replica_end(&key);
        let Some((size, digest)) = got.filter(|_| !dropped) else {
            let _ = fs::remove_file(&partial);
            tracing::debug!(file = %key, dropped, "no copy kept of an intermediate file");
            continue;
        };
        let mut c = lock(cache);
        match c.insert(&key, &partial, size, Some(digest)) {
            Ok(_) => {
                c.unpin(&key);
                c.keep(&key);
                drop(c);
                cache.report_now.notify_one();
            }
            Err(e) => {
                drop(c);
                let _ = fs::remove_file(&partial);
                tracing::warn!(file = %key, "cannot keep a copy of an intermediate file: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::EvictionPolicy;
    use crate::exec::{CancelHandle, Launch, Outcome};
    use crate::sandbox::{run_with_files, with_files, STREAMED};
    use kestrel_core::files::cached_name;

    /// A task reading `raw/a` through a cache of `capacity` bytes, in `sandbox`.
    fn setup(capacity: u64) -> (tempfile::TempDir, SharedFiles, FilesPlan) {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        fs::create_dir_all(store.join("raw")).unwrap();
        fs::write(store.join("raw/a"), vec![b'a'; 4096]).unwrap();
        let sandbox = dir.path().join("work");
        fs::create_dir_all(&sandbox).unwrap();
        let cache = Cache::open(&dir.path().join("cache"), capacity, EvictionPolicy::Lru).unwrap();
        let plan = FilesPlan {
            cache_prefix: cached_name(Some(&store.display().to_string()), ""),
            store: Some(Store::Dir(store)),
            inputs: vec!["raw/a".into()],
            statics: 0,
            outputs: vec![],
            local: vec![],
            sandbox,
            bad_name: None,
        };
        (dir, Arc::new(WorkerFiles::new(cache, 2)), plan)
    }

    fn reads_its_input(plan: &FilesPlan) -> Launch {
        Launch {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "test $(wc -c < {input:raw/a}) = 4096 && sleep 0.05 && test -f {input:0}".into(),
            ],
            cwd: Some(plan.sandbox.clone()),
            ..Launch::default()
        }
    }

    /// Runs four tasks reading `raw/a` at once, each on a thread of its own; all succeed.
    fn run_four_at_once(files: &SharedFiles, plan: &FilesPlan) {
        let launch = reads_its_input(plan);
        let runs: Vec<_> = (0..4)
            .map(|i| {
                let (files, plan, launch) = (files.clone(), plan.clone(), launch.clone());
                std::thread::spawn(move || {
                    run_with_files((1, i), &launch, &plan, &files, &CancelHandle::new(), None)
                })
            })
            .collect();
        for r in runs {
            let outcome = r.join().unwrap();
            assert!(outcome.status.is_success(), "{:?}", outcome.status);
        }
    }

    #[test]
    fn runs_streaming_one_file_at_once_do_not_trip_over_each_other() {
        // A cache of 0 bytes: every run streams its own copy into the shared sandbox.
        let (_dir, files, plan) = setup(0);
        run_four_at_once(&files, &plan);
        assert!(
            !plan.sandbox.join(STREAMED).exists(),
            "streamed copies are removed"
        );
        let change = files.take_change();
        assert_eq!(change.moved[0].moved.store_files, 4);
        assert!(change.added.is_empty(), "nothing was cached");
    }

    #[test]
    fn runs_needing_one_file_at_once_share_one_download() {
        let (_dir, files, plan) = setup(1 << 20);
        run_four_at_once(&files, &plan);
        let t = files.take_change().moved[0].moved;
        assert_eq!((t.store_files, t.local_files), (1, 3), "{t:?}");
    }

    #[test]
    fn a_cached_file_gone_from_disk_is_fetched_again_without_a_hang() {
        let (_dir, files, plan) = setup(1 << 20);
        let launch = reads_its_input(&plan);
        let run = |i| {
            let (files, plan, launch) = (files.clone(), plan.clone(), launch.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let out =
                    run_with_files((1, i), &launch, &plan, &files, &CancelHandle::new(), None);
                let _ = tx.send(out);
            });
            rx.recv_timeout(std::time::Duration::from_secs(30))
                .expect("the run ended (no deadlock on the cache)")
        };
        assert!(run(0).status.is_success());
        fs::remove_file(lock(&files).path_of(&plan.cached("raw/a"))).unwrap();
        let out = run(1);
        assert!(out.status.is_success(), "{:?}", out.status);
        let t = files.take_change().moved[0].moved;
        assert_eq!((t.store_files, t.local_files), (2, 0));
    }

    #[test]
    fn a_name_that_leaves_the_store_once_filled_in_fails_the_task() {
        let (_dir, files, mut plan) = setup(1 << 20);
        plan.bad_name = Some("../../etc/passwd".into());
        let launch = reads_its_input(&plan);
        let out = run_with_files((1, 0), &launch, &plan, &files, &CancelHandle::new(), None);
        match out.status {
            ExitKind::Unrunnable(why) => assert!(why.contains("not a plain path"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(lock(&files).held().is_empty(), "nothing was staged");
    }

    #[test]
    fn a_run_canceled_before_staging_reads_nothing_and_ends_canceled() {
        let (_dir, files, plan) = setup(1 << 20);
        let cancel = CancelHandle::new();
        cancel.cancel();
        let out = run_with_files(
            (1, 0),
            &reads_its_input(&plan),
            &plan,
            &files,
            &cancel,
            None,
        );
        assert_eq!(out.status, ExitKind::Canceled);
        assert!(files.take_change().moved.is_empty(), "no input was staged");
    }

    /// Whatever runs between staging and collecting (a process, a Python call) may panic: the
    /// thread's unwinding still lets go of the pins and removes the streamed copies.
    #[test]
    fn a_body_that_panics_still_unpins_its_inputs_and_removes_its_streamed_copies() {
        // A cache too small for the input: it is streamed into the sandbox.
        let (_dir, files, plan) = setup(0);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_files((1, 0), &plan, &files, &CancelHandle::new(), |paths| {
                assert!(paths[0].1.exists(), "staged before the body runs");
                panic!("the body failed")
            })
        }));
        assert!(panicked.is_err());
        assert!(
            !plan.sandbox.join(STREAMED).exists(),
            "streamed copy removed"
        );
        assert_eq!(
            files.take_change().moved[0].moved.store_files,
            1,
            "its move is counted"
        );

        // A cache that holds it: pinned for the body, unpinned after the panic.
        let (_dir, files, plan) = setup(1 << 20);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_files((1, 0), &plan, &files, &CancelHandle::new(), |_| {
                panic!("the body failed")
            })
        }));
        assert!(panicked.is_err());
        let name = plan.cached("raw/a");
        let released = lock(&files).release(&name);
        assert!(released.is_some(), "no pin is left on {name}");
    }

    #[test]
    fn a_static_input_stays_in_the_cache_for_good() {
        // A cache exactly the size of the static input.
        let (_dir, files, mut plan) = setup(4096);
        plan.statics = 1;
        let out = run_with_files(
            (1, 0),
            &reads_its_input(&plan),
            &plan,
            &files,
            &CancelHandle::new(),
            None,
        );
        assert!(out.status.is_success(), "{:?}", out.status);
        let mut c = lock(&files);
        let p = c.partial_path();
        fs::write(&p, [b'b'; 10]).unwrap();
        assert!(
            matches!(
                c.insert("other", &p, 10, None),
                Err(CacheError::Pinned { .. })
            ),
            "the static input is not evicted for another file"
        );
        assert_eq!(c.held(), vec![(plan.cached("raw/a"), 4096)]);
    }

    /// A run of `script` in `plan`'s sandbox.
    fn run_sh(plan: &FilesPlan, files: &SharedFiles, index: u32, script: &str) -> Outcome {
        let launch = Launch {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            cwd: Some(plan.sandbox.clone()),
            ..Launch::default()
        };
        run_with_files((1, index), &launch, plan, files, &CancelHandle::new(), None)
    }

    #[test]
    fn a_run_that_writes_to_its_input_leaves_the_next_run_the_stores_bytes() {
        let (dir, files, plan) = setup(1 << 20);
        // Read-only, so the write fails unless the run is root; then made writable and written.
        let tamper = "echo X > {input:raw/a}; chmod u+w {input:raw/a} && echo X > {input:raw/a}";
        assert!(run_sh(&plan, &files, 0, tamper).status.is_success());
        let original = dir.path().join("store/raw/a");
        let check = format!("cmp {{input:raw/a}} {}", original.display());
        let out = run_sh(&plan, &files, 1, &check);
        assert!(out.status.is_success(), "{:?}", out.status);
        let t = files.take_change().moved[0].moved;
        assert_eq!((t.store_files, t.local_files), (2, 0), "fetched again");
    }

    #[test]
    fn outputs_that_are_links_or_lead_out_of_the_task_directory_fail_the_run() {
        let (dir, files, mut plan) = setup(1 << 20);
        plan.inputs.clear();
        let outside = dir.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("x"), b"private").unwrap();
        let cases = [
            (
                "leak",
                format!("ln -s {}/x leak", outside.display()),
                "is a symbolic link",
            ),
            (
                "linked/x",
                format!("ln -s {} linked", outside.display()),
                "outside the task's directory",
            ),
        ];
        for (i, (output, script, says)) in cases.into_iter().enumerate() {
            plan.outputs = vec![output.into()];
            plan.local = vec![false];
            match run_sh(&plan, &files, i as u32, &script).status {
                ExitKind::SpawnFailed(why) => assert!(why.contains(says), "{why}"),
                other => panic!("{other:?}"),
            }
            assert!(!dir.path().join("store").join(output).exists(), "{output}");
        }
        assert!(lock(&files).held().is_empty(), "nothing was cached");
        // A file written in place is an output as before.
        plan.outputs = vec!["fine".into()];
        let out = run_sh(&plan, &files, 2, "echo ok > fine");
        assert!(out.status.is_success(), "{:?}", out.status);
        assert_eq!(fs::read(dir.path().join("store/fine")).unwrap(), b"ok\n");
    }

    #[test]
    fn a_second_run_finds_its_input_in_the_cache() {
        let (_dir, files, plan) = setup(1 << 20);
        let launch = reads_its_input(&plan);
        for i in 0..2 {
            let out = run_with_files((1, i), &launch, &plan, &files, &CancelHandle::new(), None);
            assert!(out.status.is_success(), "{:?}", out.status);
        }
        let change = files.take_change();
        let t = change.moved[0].moved;
        assert_eq!((t.store_files, t.local_files), (1, 1));
        assert_eq!(change.added, vec![(plan.cached("raw/a"), 4096)]);
    }
}
