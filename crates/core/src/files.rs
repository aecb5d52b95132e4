//! The index of data diffusion: which workers' caches hold which logical files.
//!
//! Falkon's dispatcher kept two maps, file → executors and executor → files (§6.2.3 of the
//! dissertation, `I_map` and `E_map`), fed by the executors' periodic updates and used as hints:
//! a worker told that a peer holds a file falls back to the next holder, then to the shared
//! store, and the index is corrected ([`FileIndex::not_held`]). This is that index, with file
//! names interned to small numbers so that a task's inputs and a worker's cache cost 4 bytes per
//! file, and every query the dispatch policies ask answered without allocating per file.
//!
//! Pure data: nothing here knows where a file is stored or how it travels.

use crate::spec::WorkerId;
use rustc_hash::{FxHashMap, FxHashSet};

/// A logical file's number, given by the index the first time it sees the name.
pub type FileId = u32;

/// The name a file of store `store` goes by in caches and in the index: `KEY/NAME`, where
/// KEY is a short digest of the store's location. Two stores may both hold `raw/1.fits`;
/// qualified, the two are different files, and a typo in a job's store is a miss, not
/// another store's file. Workers and the scheduler both name files so. A value
/// ([`crate::values`]) belongs to no store: it goes by its own name, which no `KEY/` name
/// can be.
pub fn cached_name(store: Option<&str>, name: &str) -> String {
    if crate::values::is_value(name) {
        return name.to_string();
    }
    format!("{}/{name}", store_key(store.unwrap_or("")))
}

/// 16 hex digits of the 64-bit FNV-1a digest of `store`. Written out here because the key
/// must stay the same across builds and machines (a cache survives a worker's upgrade), which
/// std's hashers do not promise; collisions between the few stores of one cluster are not a
/// concern at 64 bits.
fn store_key(store: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in store.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What one worker's cache gained and lost since its last report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheDelta {
    /// Files now complete in its cache, with their sizes in bytes.
    pub added: Vec<(FileId, u64)>,
    /// Files it evicted (or found missing or corrupt).
    pub evicted: Vec<FileId>,
}

impl CacheDelta {
    /// Notes that `file` came into the cache (a pending eviction of it is dropped).
    pub fn note_added(&mut self, file: FileId, size: u64) {
        self.evicted.retain(|&f| f != file);
        if !self.added.iter().any(|&(f, _)| f == file) {
            self.added.push((file, size));
        }
    }

    /// Notes that `file` left the cache (a pending addition of it is dropped). The eviction
    /// is kept even then: the file may have been reported before that addition.
    pub fn note_evicted(&mut self, file: FileId) {
        self.added.retain(|&(f, _)| f != file);
        if !self.evicted.contains(&file) {
            self.evicted.push(file);
        }
    }

    /// Whether there is nothing to report.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.evicted.is_empty()
    }
}

/// Sorts `pairs` by key and sums the hits of each key into one entry.
pub(crate) fn merge_hits<K: Ord + Copy>(pairs: &mut Vec<(K, Hits)>) {
    pairs.sort_unstable_by_key(|(k, _)| *k);
    pairs.dedup_by(|(k, h), (kept_k, kept)| {
        let same = k == kept_k;
        if same {
            kept.files += h.files;
            kept.bytes = kept.bytes.saturating_add(h.bytes);
        }
        same
    });
}

/// Where a job's tasks' inputs came from, summed: files and bytes found in the worker's own
/// cache, fetched from a peer's, and read from the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Inputs found in the worker's own cache.
    pub local_files: u64,
    /// Their bytes.
    pub local_bytes: u64,
    /// Inputs fetched from a peer's cache.
    pub peer_files: u64,
    /// Their bytes.
    pub peer_bytes: u64,
    /// Inputs read from the store.
    pub store_files: u64,
    /// Their bytes.
    pub store_bytes: u64,
}

impl Transfers {
    /// Adds `other`, saturating (the counts come from workers).
    pub fn add(&mut self, other: &Transfers) {
        self.local_files = self.local_files.saturating_add(other.local_files);
        self.local_bytes = self.local_bytes.saturating_add(other.local_bytes);
        self.peer_files = self.peer_files.saturating_add(other.peer_files);
        self.peer_bytes = self.peer_bytes.saturating_add(other.peer_bytes);
        self.store_files = self.store_files.saturating_add(other.store_files);
        self.store_bytes = self.store_bytes.saturating_add(other.store_bytes);
    }

    /// Whether nothing moved.
    pub fn is_empty(&self) -> bool {
        *self == Transfers::default()
    }

    /// The share of inputs found in a cache (own or a peer's), if any input was staged.
    pub fn hit_ratio(&self) -> Option<f64> {
        let hits = self.local_files.saturating_add(self.peer_files);
        let all = hits.saturating_add(self.store_files);
        (all > 0).then(|| hits as f64 / all as f64)
    }
}

/// One file as the index knows it.
#[derive(Debug)]
struct FileEntry {
    name: Box<str>,
    /// Its size, once a worker has reported it cached (files are write-once: one size).
    size: Option<u64>,
    /// The workers whose caches hold it, in the order they reported it (a few per file: a
    /// vector is smaller and faster than a set at that size).
    holders: Vec<WorkerId>,
}

/// file → workers and worker → files, kept mirror images of each other.
#[derive(Debug, Default)]
pub struct FileIndex {
    ids: FxHashMap<Box<str>, FileId>,
    files: Vec<FileEntry>,
    held: FxHashMap<WorkerId, FxHashSet<FileId>>,
}

/// How much of a set of files one worker holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hits {
    /// Bytes of the files it holds (of those with a known size).
    pub bytes: u64,
    /// How many of the files it holds.
    pub files: u32,
}

impl FileIndex {
    /// An empty index.
    pub fn new() -> FileIndex {
        FileIndex::default()
    }

    /// The number of `name`, numbering it if it is new.
    pub fn intern(&mut self, name: &str) -> FileId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = FileId::try_from(self.files.len()).expect("fewer than 2^32 distinct files");
        self.files.push(FileEntry {
            name: name.into(),
            size: None,
            holders: Vec::new(),
        });
        self.ids.insert(name.into(), id);
        id
    }

    /// The number of `name`, if the index has seen it.
    pub fn id(&self, name: &str) -> Option<FileId> {
        self.ids.get(name).copied()
    }

    /// The name of file `id`.
    pub fn name(&self, id: FileId) -> Option<&str> {
        self.files.get(id as usize).map(|f| &*f.name)
    }

    /// The size of file `id`, once a worker has reported it cached.
    pub fn size(&self, id: FileId) -> Option<u64> {
        self.files.get(id as usize).and_then(|f| f.size)
    }

    /// How many distinct files the index has numbered.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether it has numbered none.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The workers whose caches hold `file`, as last reported.
    pub fn holders(&self, file: FileId) -> &[WorkerId] {
        self.files
            .get(file as usize)
            .map_or(&[], |f| f.holders.as_slice())
    }

    /// Whether `worker`'s cache holds `file`, as last reported.
    pub fn holds(&self, worker: WorkerId, file: FileId) -> bool {
        self.held.get(&worker).is_some_and(|h| h.contains(&file))
    }

    /// The files `worker`'s cache holds, as last reported.
    pub fn held_by(&self, worker: WorkerId) -> impl Iterator<Item = FileId> + '_ {
        self.held.get(&worker).into_iter().flatten().copied()
    }

    /// Every worker the index lists as holding something.
    pub fn workers(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.held.keys().copied()
    }

    /// How many files `worker`'s cache holds, as last reported.
    pub fn held_count(&self, worker: WorkerId) -> usize {
        self.held.get(&worker).map_or(0, |h| h.len())
    }

    /// Bytes `worker`'s cache holds, of files with a known size.
    pub fn cached_bytes(&self, worker: WorkerId) -> u64 {
        // Sizes come from workers: summed without overflowing.
        self.held_by(worker)
            .filter_map(|f| self.size(f))
            .fold(0, u64::saturating_add)
    }

    /// Applies a worker's report. Ids the index never gave out are ignored (a worker cannot
    /// name a file into existence by number), as is a size that contradicts the one known.
    pub fn apply(&mut self, worker: WorkerId, delta: &CacheDelta) {
        for &file in &delta.evicted {
            self.not_held(worker, file);
        }
        for &(file, size) in &delta.added {
            let Some(entry) = self.files.get_mut(file as usize) else {
                continue;
            };
            if entry.size.is_some_and(|known| known != size) {
                continue;
            }
            entry.size = Some(size);
            if self.held.entry(worker).or_default().insert(file) {
                entry.holders.push(worker);
            }
        }
    }

    /// `worker` does not hold `file` (it evicted it, or a peer asked for it in vain).
    pub fn not_held(&mut self, worker: WorkerId, file: FileId) {
        let Some(held) = self.held.get_mut(&worker) else {
            return;
        };
        if held.remove(&file) {
            if let Some(entry) = self.files.get_mut(file as usize) {
                entry.holders.retain(|&w| w != worker);
            }
            if held.is_empty() {
                self.held.remove(&worker);
            }
        }
    }

    /// `worker` is gone, and its cache with it.
    pub fn worker_gone(&mut self, worker: WorkerId) {
        let Some(held) = self.held.remove(&worker) else {
            return;
        };
        for file in held {
            if let Some(entry) = self.files.get_mut(file as usize) {
                entry.holders.retain(|&w| w != worker);
            }
        }
    }

    /// How much of `files` `worker` holds: Falkon's `cacheHit` of a task on an executor, with
    /// the bytes beside the count (the larger input matters more to move).
    pub fn hits(&self, worker: WorkerId, files: &[FileId]) -> Hits {
        let Some(held) = self.held.get(&worker) else {
            return Hits::default();
        };
        let mut hits = Hits::default();
        for &f in files {
            if held.contains(&f) {
                hits.files += 1;
                hits.bytes = hits.bytes.saturating_add(self.size(f).unwrap_or(0));
            }
        }
        hits
    }

    /// Every worker holding any of `files`, with how much of them it holds, most first (ties
    /// by worker id): step 1 of Falkon's window algorithm (Fig. 39), which counts candidate
    /// executors per needed file. Appends to `out` (cleared first), so that a policy can keep
    /// one buffer across decisions.
    pub fn candidates(&self, files: &[FileId], out: &mut Vec<(WorkerId, Hits)>) {
        out.clear();
        // One entry per (holder, file), then merged per holder: linear in the pairs plus a
        // sort, even for a file that every worker holds.
        for &f in files {
            let hit = Hits {
                bytes: self.size(f).unwrap_or(0),
                files: 1,
            };
            out.extend(self.holders(f).iter().map(|&w| (w, hit)));
        }
        merge_hits(out);
        out.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    }

    /// Every way in which the two maps are not mirror images of each other, for tests.
    pub fn audit(&self) -> Vec<String> {
        let mut bad = Vec::new();
        for (id, f) in self.files.iter().enumerate() {
            let id = id as FileId;
            if self.ids.get(&f.name) != Some(&id) {
                bad.push(format!(
                    "file {id} ({}) is not named back to itself",
                    f.name
                ));
            }
            let distinct: FxHashSet<_> = f.holders.iter().collect();
            if distinct.len() != f.holders.len() {
                bad.push(format!("file {id} lists a holder twice: {:?}", f.holders));
            }
            for &w in &f.holders {
                if !self.holds(w, id) {
                    bad.push(format!(
                        "file {id} lists worker {w}, which does not hold it"
                    ));
                }
            }
        }
        for (&w, held) in &self.held {
            if held.is_empty() {
                bad.push(format!("worker {w} has an empty entry"));
            }
            for &f in held {
                if !self.holders(f).contains(&w) {
                    bad.push(format!("worker {w} holds file {f}, which does not list it"));
                }
            }
        }
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(added: &[(FileId, u64)], evicted: &[FileId]) -> CacheDelta {
        CacheDelta {
            added: added.to_vec(),
            evicted: evicted.to_vec(),
        }
    }

    #[test]
    fn files_of_two_stores_are_two_files() {
        let a = cached_name(Some("/data/store"), "raw/1.fits");
        let b = cached_name(Some("http://s:8080/"), "raw/1.fits");
        assert_ne!(a, b);
        assert!(a.ends_with("/raw/1.fits") && a.len() == 16 + 1 + 10);
        // Stable: the same store gives the same key in every build.
        assert_eq!(cached_name(None, "x"), "cbf29ce484222325/x");
    }

    #[test]
    fn a_pending_delta_ends_as_the_cache_did() {
        let mut ix = FileIndex::new();
        let (a, b) = (ix.intern("a"), ix.intern("b"));
        ix.apply(1, &delta(&[(a, 1)], &[]));
        // a leaves and comes back, b comes and goes: one report of the end state.
        let mut d = CacheDelta::default();
        d.note_evicted(a);
        d.note_added(b, 2);
        d.note_added(a, 1);
        d.note_evicted(b);
        ix.apply(1, &d);
        assert_eq!((ix.holds(1, a), ix.holds(1, b)), (true, false));
        // Reported, then evicted after coming back: the eviction still reaches the index.
        let mut d = CacheDelta::default();
        d.note_added(a, 1);
        d.note_evicted(a);
        ix.apply(1, &d);
        assert!(!ix.holds(1, a));
    }

    #[test]
    fn names_are_numbered_once() {
        let mut ix = FileIndex::new();
        let a = ix.intern("raw/1.fits");
        let b = ix.intern("raw/2.fits");
        assert_ne!(a, b);
        assert_eq!(ix.intern("raw/1.fits"), a);
        assert_eq!(
            (ix.id("raw/2.fits"), ix.name(b)),
            (Some(b), Some("raw/2.fits"))
        );
        assert_eq!((ix.id("nope"), ix.name(99)), (None, None));
    }

    #[test]
    fn reports_move_files_between_workers_and_both_maps_agree() {
        let mut ix = FileIndex::new();
        let (a, b, c) = (ix.intern("a"), ix.intern("b"), ix.intern("c"));
        ix.apply(1, &delta(&[(a, 100), (b, 2_000)], &[]));
        ix.apply(2, &delta(&[(b, 2_000)], &[]));
        assert_eq!(ix.holders(b), &[1, 2]);
        assert_eq!(
            ix.hits(1, &[a, b, c]),
            Hits {
                bytes: 2_100,
                files: 2
            }
        );
        assert_eq!(ix.hits(3, &[a]), Hits::default());
        ix.apply(1, &delta(&[(c, 5)], &[b]));
        assert_eq!(ix.holders(b), &[2]);
        assert_eq!(ix.cached_bytes(1), 105);
        ix.worker_gone(2);
        assert!(ix.holders(b).is_empty());
        assert_eq!(ix.audit(), Vec::<String>::new());
    }

    #[test]
    fn a_report_cannot_invent_files_or_change_a_size() {
        let mut ix = FileIndex::new();
        let a = ix.intern("a");
        ix.apply(1, &delta(&[(a, 10), (77, 1)], &[]));
        ix.apply(2, &delta(&[(a, 11)], &[]));
        assert_eq!(
            (ix.len(), ix.holders(a), ix.size(a)),
            (1, &[1][..], Some(10))
        );
        // Evicting what it does not hold, or a file that does not exist, changes nothing.
        ix.apply(3, &delta(&[], &[a, 99]));
        assert_eq!(ix.holders(a), &[1]);
        assert_eq!(ix.audit(), Vec::<String>::new());
    }

    #[test]
    fn candidates_come_most_data_first() {
        let mut ix = FileIndex::new();
        let (a, b, c) = (ix.intern("a"), ix.intern("b"), ix.intern("c"));
        ix.apply(1, &delta(&[(a, 1_000)], &[]));
        ix.apply(2, &delta(&[(a, 1_000), (b, 10)], &[]));
        ix.apply(3, &delta(&[(c, 5_000)], &[]));
        ix.apply(4, &delta(&[(b, 10)], &[]));
        let mut out = Vec::new();
        ix.candidates(&[a, b], &mut out);
        let order: Vec<_> = out.iter().map(|(w, _)| *w).collect();
        assert_eq!(order, vec![2, 1, 4], "2 holds both; then by bytes");
        assert_eq!(
            out[0].1,
            Hits {
                bytes: 1_010,
                files: 2
            }
        );
        ix.candidates(&[], &mut out);
        assert!(out.is_empty());
    }
}
