//! The worker's file cache (data diffusion): logical files staged for tasks, kept for the
//! next task that reads them, evicted by policy when the cache is full.
//!
//! Layout: `DIR/files/NAME` holds the complete file of logical name `NAME` (names are
//! relative paths, checked at submission); `DIR/partial/` holds files being written, moved
//! into place whole, so a crash never leaves a truncated file under a name. Files are
//! write-once: a name is never overwritten. At start the cache re-indexes `DIR/files` (it
//! survives a worker's restart) and empties `DIR/partial`.
//!
//! Files a task uses are pinned until it ends and never evicted. A file larger than the
//! whole cache is not cached: the caller streams it to the task instead.
//!
//! Tasks read cached files in place, so nothing a task does may change what the next task
//! reads: directories are made 0700 and files 0400 (owner-only, read-only), and each file's
//! [`Stamp`] (inode, size, modification and change times) is taken as it comes in and
//! checked whenever it is handed out. A file whose stamp changed (a task running as root, or
//! one that made its input writable, wrote to it) is dropped and fetched again: no write
//! escapes the change time, which only the kernel sets.
//!
//! Eviction scans the entries for the victim (O(files)): caches hold thousands of files, not
//! millions, and an eviction is followed by a file transfer that costs far more.

use kestrel_proto::messages::CacheChange;
use rand::seq::IteratorRandom;
use rustc_hash::FxHashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mode of a cached file: its owner reads it, nobody writes it.
const FILE_MODE: u32 = 0o400;
/// The mode of the directories the cache makes: its owner alone enters them.
const DIR_MODE: u32 = 0o700;

/// Makes directory `path` and its missing parents with mode 0700 (the cache's files are the
/// tasks' data: other users of the machine are not to read them).
pub fn create_private_dir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// What a cached file looked like when it came in: a write, a truncation, a `chmod` or a
/// replacement changes it (the change time moves with every one of them, and only the
/// kernel sets it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of the file `meta` describes.
    pub fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether `meta` (of the path, not of what a link there leads to) is still the file this
    /// stamp was taken of, unchanged.
    pub fn matches(&self, meta: &fs::Metadata) -> bool {
        meta.is_file() && Stamp::of(meta) == *self
    }
}

/// Which file leaves a full cache first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Least recently used (the default, as in the dissertation's experiments).
    #[default]
    Lru,
    /// First in, first out.
    Fifo,
    /// Least frequently used (ties: least recently).
    Lfu,
    /// A random unpinned file.
    Random,
}

impl EvictionPolicy {
    /// The policy named `text` (`lru`, `fifo`, `lfu`, `random`).
    pub fn parse(text: &str) -> Option<EvictionPolicy> {
        match text {
            "lru" => Some(EvictionPolicy::Lru),
            "fifo" => Some(EvictionPolicy::Fifo),
            "lfu" => Some(EvictionPolicy::Lfu),
            "random" => Some(EvictionPolicy::Random),
            _ => None,
        }
    }
}

#[derive(Debug)]
struct Entry {
    size: u64,
    /// When it came in, and when it was last used, on the cache's own clock.
    added: u64,
    used: u64,
    /// How many times tasks used it.
    uses: u64,
    /// Tasks using it now: it is not evicted while any does.
    pins: u32,
    /// A job's static input (`--input-static`): kept for the worker's life, never evicted.
    kept: bool,
    /// Its BLAKE3 digest, taken as it came in (or when first served, for a file found at
    /// start): peers check what they fetch against it.
    hash: Option<Digest>,
    /// The file as it came in: one found otherwise is not handed out.
    stamp: Stamp,
}

/// A file's BLAKE3 digest.
pub type Digest = [u8; 32];

/// A size-bounded directory of logical files.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    capacity: u64,
    policy: EvictionPolicy,
    entries: FxHashMap<String, Entry>,
    used_bytes: u64,
    /// The cache's clock: one tick per use or insertion.
    clock: u64,
    /// What changed since the last report to the server.
    delta: CacheChange,
    next_partial: u64,
}

/// Why a file could not be put in the cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Larger than the whole cache: stream it instead.
    #[error("{size} bytes is more than the cache holds ({capacity} bytes)")]
    TooLarge {
        /// The file's size.
        size: u64,
        /// The cache's capacity.
        capacity: u64,
    },
    /// Every file that would have to leave is in use.
    #[error("the cache is full of files in use ({used} of {capacity} bytes)")]
    Pinned {
        /// Bytes in the cache.
        used: u64,
        /// The cache's capacity.
        capacity: u64,
    },
    /// The disk said no.
    #[error("cache directory: {0}")]
    Io(#[from] io::Error),
}

impl Cache {
    /// Opens (creating it if need be) the cache in `dir`, holding at most `capacity` bytes,
    /// and indexes the files a previous run left there. Files past the capacity (it was
    /// larger before) are evicted at once.
    pub fn open(dir: &Path, capacity: u64, policy: EvictionPolicy) -> io::Result<Cache> {
        let files = dir.join("files");
        create_private_dir(&files)?;
        // A cache of an older worker may have left it open to others.
        fs::set_permissions(&files, fs::Permissions::from_mode(DIR_MODE))?;
        let partial = dir.join("partial");
        let _ = fs::remove_dir_all(&partial);
        create_private_dir(&partial)?;
        let mut cache = Cache {
            dir: dir.to_path_buf(),
            capacity,
            policy,
            entries: FxHashMap::default(),
            used_bytes: 0,
            clock: 0,
            delta: CacheChange::default(),
            next_partial: 0,
        };
        // Values (`kestrel_core::values`) belong to the worker's life with one server, which
        // ended: their futures and jobs are gone with it. Never announced as held.
        let _ = fs::remove_dir_all(files.join(kestrel_core::values::PREFIX));
        let mut found = Vec::new();
        walk(&files, &files, &mut found)?;
        // Oldest first, so LRU and FIFO order survives a restart roughly.
        found.sort_by_key(|(_, _, mtime, _)| *mtime);
        for (name, size, _, stamp) in found {
            cache.clock += 1;
            cache.used_bytes += size;
            cache.entries.insert(
                name,
                Entry {
                    size,
                    added: cache.clock,
                    used: cache.clock,
                    uses: 0,
                    pins: 0,
                    kept: false,
                    hash: None,
                    stamp,
                },
            );
        }
        cache.make_room(0).ok();
        // What was found is reported whole at registration, not as a change.
        cache.delta = CacheChange::default();
        Ok(cache)
    }

    /// Bytes it may hold.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes it holds.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Every file it holds, with its size.
    pub fn held(&self) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self
            .entries
            .iter()
            .map(|(n, e)| (n.clone(), e.size))
            .collect();
        v.sort();
        v
    }

    /// Whether it holds `name`.
    pub fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Where file `name` lives when cached.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join("files").join(name)
    }

    /// Where incoming files are written before [`Self::insert`]: a Python runner spills
    /// a large result there, on the cache's own disk, so it goes in by a rename.
    pub fn partial_dir(&self) -> PathBuf {
        self.dir.join("partial")
    }

    /// Lets go of every value (`kestrel_core::values`) the cache holds: the worker is now
    /// another server's, which will never drop the old one's. Returns the paths to delete
    /// (after letting go of the lock); values a run still reads go once it is done.
    #[must_use = "the files returned must be deleted"]
    pub fn release_values(&mut self) -> Vec<PathBuf> {
        let names: Vec<String> = self
            .entries
            .keys()
            .filter(|n| kestrel_core::values::is_value(n))
            .cloned()
            .collect();
        names.iter().filter_map(|n| self.release(n)).collect()
    }

    /// A fresh path to write an incoming file to, before [`Self::insert`].
    pub fn partial_path(&mut self) -> PathBuf {
        self.next_partial += 1;
        self.dir
            .join("partial")
            .join(format!("{}-{}", std::process::id(), self.next_partial))
    }

    /// If `name` is cached, pins it for a task and returns its path, size and stamp (the
    /// caller checks the file against it before the task may read it: see [`Stamp`]).
    pub fn pin(&mut self, name: &str) -> Option<(PathBuf, u64, Stamp)> {
        self.clock += 1;
        let e = self.entries.get_mut(name)?;
        e.pins += 1;
        e.uses += 1;
        e.used = self.clock;
        let (size, stamp) = (e.size, e.stamp);
        Some((self.path_of(name), size, stamp))
    }

    /// Keeps `name` for the worker's life: a static input, which every task of its job
    /// reads (SC08's binaries and shared databases). Not kept across a restart. Returns
    /// whether it holds `name`.
    pub fn keep(&mut self, name: &str) -> bool {
        match self.entries.get_mut(name) {
            Some(e) => {
                e.kept = true;
                true
            }
            None => false,
        }
    }

    /// The server no longer needs `name` (an intermediate file of a workflow that ended): it
    /// leaves the cache now, and the path returned is the caller's to delete (after letting go
    /// of the cache's lock), or, if a run still reads it, it is evicted once that run is done.
    #[must_use = "the file returned must be deleted"]
    pub fn release(&mut self, name: &str) -> Option<PathBuf> {
        let e = self.entries.get_mut(name)?;
        e.kept = false;
        if e.pins > 0 {
            return None;
        }
        let size = e.size;
        self.entries.remove(name);
        self.used_bytes -= size;
        self.note_evicted(name);
        Some(self.path_of(name))
    }

    /// A task is done with `name`.
    pub fn unpin(&mut self, name: &str) {
        if let Some(e) = self.entries.get_mut(name) {
            e.pins = e.pins.saturating_sub(1);
        }
    }

    /// Opens cached file `name` for a peer: the open file (which stays readable if the file
    /// is evicted meanwhile), its size and its digest if known. One gone from the disk is
    /// dropped (and reported evicted), so the server stops naming this worker for it.
    /// One changed since it came in is dropped too: a task wrote to it, and peers are not
    /// to get what it wrote.
    pub fn open_for_peer(&mut self, name: &str) -> Option<(fs::File, u64, Option<Digest>)> {
        let e = self.entries.get(name)?;
        let (size, hash, stamp) = (e.size, e.hash, e.stamp);
        match fs::File::open(self.path_of(name)) {
            Ok(file) => {
                if file.metadata().is_ok_and(|m| stamp.matches(&m)) {
                    return Some((file, size, hash));
                }
                warn_changed(name);
                self.discard(name);
                None
            }
            Err(err) => {
                if err.kind() == io::ErrorKind::NotFound {
                    self.discard(name);
                }
                None
            }
        }
    }

    /// Records the digest of `name`, taken after it came in.
    pub fn set_digest(&mut self, name: &str, hash: Digest) {
        if let Some(e) = self.entries.get_mut(name) {
            e.hash.get_or_insert(hash);
        }
    }

    /// Moves the complete file at `partial` (of `size` bytes, digest `hash`) into the cache
    /// as `name`, evicting others if need be, and pins it. Write-once: if `name` is already
    /// cached the new copy is dropped and the cached one pinned.
    pub fn insert(
        &mut self,
        name: &str,
        partial: &Path,
        size: u64,
        hash: Option<Digest>,
    ) -> Result<PathBuf, CacheError> {
        if !is_plain_name(name) {
            let _ = fs::remove_file(partial);
            return Err(CacheError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name:?} is not a plain relative name"),
            )));
        }
        if self.entries.contains_key(name) {
            let _ = fs::remove_file(partial);
            return Ok(self
                .pin(name)
                .map(|(p, _, _)| p)
                .unwrap_or_else(|| self.path_of(name)));
        }
        if size > self.capacity {
            return Err(CacheError::TooLarge {
                size,
                capacity: self.capacity,
            });
        }
        self.make_room(size)?;
        let to = self.path_of(name);
        if let Some(parent) = to.parent() {
            create_private_dir(parent)?;
        }
        // Read-only before it has a name: no task ever sees it writable.
        fs::set_permissions(partial, fs::Permissions::from_mode(FILE_MODE))?;
        fs::rename(partial, &to)?;
        // Taken after the rename, which moves the change time.
        let stamp = match fs::symlink_metadata(&to) {
            Ok(m) => Stamp::of(&m),
            Err(e) => {
                let _ = fs::remove_file(&to);
                return Err(e.into());
            }
        };
        self.clock += 1;
        self.used_bytes += size;
        self.entries.insert(
            name.to_string(),
            Entry {
                size,
                added: self.clock,
                used: self.clock,
                uses: 1,
                pins: 1,
                kept: false,
                hash,
                stamp,
            },
        );
        self.delta.added.retain(|(n, _)| n != name);
        self.delta.evicted.retain(|n| n != name);
        self.delta.added.push((name.to_string(), size));
        Ok(to)
    }

    /// The disk under the cache ran out of space (it is smaller than the cache's capacity, or
    /// shared) after `written` bytes of a file of `size` (if known; that partial file is
    /// gone): evicts unpinned files until the file fits beside the other files coming in, and
    /// lowers the capacity to what the disk held less room for one such file, so that later
    /// files are placed without the disk filling up. Whether the file may fit now (if not,
    /// it goes past the cache).
    pub fn disk_full(&mut self, written: u64, size: Option<u64>) -> bool {
        // Other fetches' partial files hold disk space the cache does not count.
        let coming = self.partial_bytes();
        let disk = self.used_bytes + coming + written;
        let size = size.unwrap_or(written + 1);
        if size > disk.saturating_sub(coming) {
            // More than the disk could hold with every cached file gone: stream it, and leave
            // the capacity be (a file this large says nothing about the others).
            return false;
        }
        let capacity = disk - size;
        if capacity < self.capacity {
            tracing::warn!(
                dir = %self.dir.display(),
                "the cache's disk is full at {disk} bytes: the cache now holds at most {capacity} (it was {})",
                self.capacity
            );
            self.capacity = capacity;
            self.delta.capacity = Some(capacity);
        }
        // Evicted until this file fits beside what is cached and coming in.
        while self.used_bytes + coming + size > disk {
            let Some(victim) = self.victim() else {
                return false;
            };
            self.evict(&victim);
        }
        true
    }

    /// Bytes in files being fetched now.
    fn partial_bytes(&self) -> u64 {
        let partials = fs::read_dir(self.dir.join("partial")).into_iter().flatten();
        partials
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// Drops `name` (found corrupt or missing on disk): it is evicted even if pinned.
    pub fn discard(&mut self, name: &str) {
        if let Some(e) = self.entries.remove(name) {
            self.used_bytes -= e.size;
            let _ = fs::remove_file(self.path_of(name));
            self.note_evicted(name);
        }
    }

    /// What changed since the last call, for the next update to the server.
    pub fn take_delta(&mut self) -> CacheChange {
        std::mem::take(&mut self.delta)
    }

    fn note_evicted(&mut self, name: &str) {
        self.delta.added.retain(|(n, _)| n != name);
        if !self.delta.evicted.iter().any(|n| n == name) {
            self.delta.evicted.push(name.to_string());
        }
    }

    /// Evicts unpinned files until `size` more bytes fit.
    fn make_room(&mut self, size: u64) -> Result<(), CacheError> {
        while self.used_bytes + size > self.capacity {
            let Some(victim) = self.victim() else {
                return Err(CacheError::Pinned {
                    used: self.used_bytes,
                    capacity: self.capacity,
                });
            };
            self.evict(&victim);
        }
        Ok(())
    }

    fn evict(&mut self, victim: &str) {
        if let Some(e) = self.entries.remove(victim) {
            self.used_bytes -= e.size;
        }
        let _ = fs::remove_file(self.path_of(victim));
        self.note_evicted(victim);
    }

    /// The unpinned file the policy evicts first.
    fn victim(&self) -> Option<String> {
        let unpinned = self.entries.iter().filter(|(_, e)| e.pins == 0 && !e.kept);
        let pick = match self.policy {
            EvictionPolicy::Lru => unpinned.min_by_key(|(n, e)| (e.used, *n)),
            EvictionPolicy::Fifo => unpinned.min_by_key(|(n, e)| (e.added, *n)),
            EvictionPolicy::Lfu => unpinned.min_by_key(|(n, e)| (e.uses, e.used, *n)),
            EvictionPolicy::Random => unpinned.choose(&mut rand::thread_rng()),
        };
        pick.map(|(n, _)| n.clone())
    }
}

/// Whether `name` is a relative path of plain parts (no `..`, `.`, empty part or leading
/// `/`): a name that cannot reach outside the directory it is joined to.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.contains('\0')
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// Says that cached file `name` changed on disk since it came in, and what happens to it.
pub fn warn_changed(name: &str) {
    tracing::warn!(
        file = %name,
        "a cached file changed since it came in (a task wrote to its input?): it is dropped and fetched again"
    );
}

/// Every regular file under `dir`, named relative to `root`, with its size, mtime and stamp;
/// each made read-only for its owner alone if it was not (a cache of an older worker).
fn walk(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(String, u64, std::time::SystemTime, Stamp)>,
) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        // Not followed: a link in the cache is nobody's file.
        let mut meta = entry.metadata()?;
        let path = entry.path();
        if meta.is_dir() {
            walk(root, &path, out)?;
        } else if meta.is_file() {
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            let Some(name) = rel.to_str() else {
                continue;
            };
            if meta.permissions().mode() & 0o7777 != FILE_MODE {
                fs::set_permissions(&path, fs::Permissions::from_mode(FILE_MODE))?;
                meta = fs::symlink_metadata(&path)?;
            }
            let mtime = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            out.push((name.to_string(), meta.len(), mtime, Stamp::of(&meta)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(c: &mut Cache, name: &str, size: usize) -> Result<PathBuf, CacheError> {
        let p = c.partial_path();
        fs::write(&p, vec![b'x'; size]).unwrap();
        c.insert(name, &p, size as u64, None)
    }

    fn names(c: &Cache) -> Vec<String> {
        c.held().into_iter().map(|(n, _)| n).collect()
    }

    #[test]
    fn each_policy_evicts_its_own_victim() {
        // a, b, c of 10 bytes in a cache of 30; a is used twice more; then d comes in.
        let expect = [
            (EvictionPolicy::Lru, "b"),
            (EvictionPolicy::Fifo, "a"),
            (EvictionPolicy::Lfu, "b"),
        ];
        for (policy, gone) in expect {
            let dir = tempfile::tempdir().unwrap();
            let mut c = Cache::open(dir.path(), 30, policy).unwrap();
            for n in ["a", "b", "c"] {
                put(&mut c, n, 10).unwrap();
                c.unpin(n);
            }
            for _ in 0..2 {
                c.pin("a");
                c.unpin("a");
            }
            c.pin("c");
            c.unpin("c");
            put(&mut c, "d", 10).unwrap();
            assert!(
                !names(&c).contains(&gone.to_string()),
                "{policy:?}: {:?}",
                names(&c)
            );
            assert_eq!(c.used_bytes(), 30);
            let delta = c.take_delta();
            assert_eq!(delta.evicted, vec![gone.to_string()], "{policy:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cache::open(dir.path(), 20, EvictionPolicy::Random).unwrap();
        for n in ["a", "b", "c", "d"] {
            put(&mut c, n, 10).unwrap();
            c.unpin(n);
        }
        assert_eq!((c.held().len(), c.used_bytes()), (2, 20));
    }

    #[test]
    fn a_full_disk_shrinks_the_cache_and_evicts_for_the_file_at_hand() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cache::open(dir.path(), 1000, EvictionPolicy::Lru).unwrap();
        for n in ["a", "b", "c"] {
            put(&mut c, n, 10).unwrap();
        }
        c.unpin("a");
        c.unpin("b");
        // Another fetch has 5 bytes on the way in.
        let coming = c.partial_path();
        fs::write(&coming, [0; 5]).unwrap();
        c.take_delta();
        // The disk filled after 3 bytes of a 10-byte file: it holds 30 + 5 + 3. The cache
        // keeps room for one such file beside it (38 - 10), and a goes so that this one fits.
        assert!(c.disk_full(3, Some(10)));
        assert_eq!(names(&c), vec!["b", "c"]);
        assert_eq!(c.capacity(), 28);
        let delta = c.take_delta();
        assert_eq!(delta.capacity, Some(28));
        assert_eq!(delta.evicted, vec!["a".to_string()]);
        // A file larger than the disk could ever hold changes nothing: it is streamed.
        assert!(!c.disk_full(8, Some(100)));
        assert_eq!((c.capacity(), names(&c).len()), (28, 2));
        // The disk filled again after 13 bytes of 18 (it holds 20 + 5 + 13): b goes too.
        assert!(c.disk_full(13, Some(18)));
        assert_eq!((names(&c), c.capacity()), (vec!["c".to_string()], 20));
        // Then after 5 bytes of 12: the disk holds 20, c (in use) cannot go, no room for 12.
        assert!(!c.disk_full(5, Some(12)));
        // Later files are placed within the new capacity, or go past the cache.
        assert_eq!(c.capacity(), 8);
        assert!(matches!(
            put(&mut c, "d", 9),
            Err(CacheError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_file_gone_from_the_disk_is_not_served_and_is_reported_evicted() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cache::open(dir.path(), 100, EvictionPolicy::Lru).unwrap();
        let path = put(&mut c, "k/a", 10).unwrap();
        c.unpin("k/a");
        c.take_delta();
        assert!(c.open_for_peer("k/a").is_some());
        fs::remove_file(path).unwrap();
        assert!(c.open_for_peer("k/a").is_none());
        assert_eq!(c.take_delta().evicted, vec!["k/a".to_string()]);
        assert_eq!(c.used_bytes(), 0);
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn files_are_private_and_read_only_and_a_changed_one_is_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        let mut c = Cache::open(&root, 100, EvictionPolicy::Lru).unwrap();
        let path = put(&mut c, "k/a", 10).unwrap();
        assert_eq!(mode(&path), 0o400);
        for d in ["", "files", "files/k", "partial"] {
            assert_eq!(mode(&root.join(d)), 0o700, "{d:?}");
        }
        c.unpin("k/a");
        c.take_delta();
        assert!(c.open_for_peer("k/a").is_some());
        // A task makes its input writable and writes as many bytes to it.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, b"tampered!!").unwrap();
        assert!(
            c.open_for_peer("k/a").is_none(),
            "a changed file is not served"
        );
        assert!(c.held().is_empty());
        assert_eq!(c.take_delta().evicted, vec!["k/a".to_string()]);
    }

    #[test]
    fn a_cache_left_open_to_others_is_made_private_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let files = dir.path().join("files");
        fs::create_dir_all(files.join("k")).unwrap();
        fs::write(files.join("k/a"), b"x").unwrap();
        fs::set_permissions(&files, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(files.join("k/a"), fs::Permissions::from_mode(0o644)).unwrap();
        let mut c = Cache::open(dir.path(), 100, EvictionPolicy::Lru).unwrap();
        assert_eq!((mode(&files), mode(&files.join("k/a"))), (0o700, 0o400));
        // Stamped as it is now: handed out as it is.
        let (path, _, stamp) = c.pin("k/a").unwrap();
        assert!(stamp.matches(&fs::symlink_metadata(path).unwrap()));
    }

    #[test]
    fn kept_files_are_never_evicted() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cache::open(dir.path(), 20, EvictionPolicy::Lru).unwrap();
        put(&mut c, "static/db", 10).unwrap();
        c.keep("static/db");
        c.unpin("static/db");
        for n in ["a", "b", "c"] {
            put(&mut c, n, 10).unwrap();
            c.unpin(n);
        }
        assert_eq!(names(&c), vec!["c", "static/db"]);
    }

    #[test]
    fn pinned_files_stay_and_a_file_larger_than_the_cache_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cache::open(dir.path(), 20, EvictionPolicy::Lru).unwrap();
        put(&mut c, "a", 10).unwrap();
        put(&mut c, "b", 10).unwrap();
        // Both pinned (in use): nothing can leave.
        assert!(matches!(
            put(&mut c, "c", 10),
            Err(CacheError::Pinned { .. })
        ));
        assert!(matches!(
            put(&mut c, "big", 21),
            Err(CacheError::TooLarge { .. })
        ));
        c.unpin("a");
        put(&mut c, "c", 10).unwrap();
        assert_eq!(names(&c), vec!["b", "c"]);
    }

    #[test]
    fn files_are_write_once_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut c = Cache::open(dir.path(), 100, EvictionPolicy::Lru).unwrap();
            put(&mut c, "raw/1.fits", 10).unwrap();
            let p = c.partial_path();
            fs::write(&p, b"other").unwrap();
            c.insert("raw/1.fits", &p, 5, None).unwrap();
            assert_eq!(
                fs::read(c.path_of("raw/1.fits")).unwrap().len(),
                10,
                "kept the first"
            );
            assert!(!p.exists(), "the second copy was dropped");
            // A half-written file left behind by a crash.
            fs::write(dir.path().join("partial/leftover"), b"half").unwrap();
        }
        let mut c = Cache::open(dir.path(), 100, EvictionPolicy::Lru).unwrap();
        assert_eq!(c.held(), vec![("raw/1.fits".to_string(), 10)]);
        assert!(
            c.take_delta().added.is_empty(),
            "found files are reported at registration"
        );
        assert!(!dir.path().join("partial/leftover").exists());
        // Re-opened smaller: what does not fit leaves at once.
        drop(c);
        let c = Cache::open(dir.path(), 5, EvictionPolicy::Lru).unwrap();
        assert!(c.held().is_empty());
    }
}
