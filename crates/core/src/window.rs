//! The scheduling window of data-aware dispatch: Falkon's W (dissertation §6.2.3, Figs 39–40).
//!
//! Tasks whose job is placed by where its inputs are cached leave the ready queue for this
//! window, in queue order, up to W of them. A data-aware decision for a worker looks only at
//! the window: first at the tasks some of whose inputs the worker holds, found through the
//! window's own file → tasks map (so a decision costs what the worker's cache and the window
//! share, not W × inputs), then from the front of the window. A task waits at most until W
//! tasks ahead of it are placed, which is what keeps max-cache-hit from starving the front.
//!
//! Pure data, like [`crate::files`]: the scheduler checks an entry's task is still ready before
//! it places it, and removes entries whose task moved on.

use crate::files::{merge_hits, FileId, FileIndex, Hits};
use crate::spec::{JobId, TaskIndex, WorkerId};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// A task in the window.
#[derive(Debug)]
pub struct Entry {
    /// Its job.
    pub job: JobId,
    /// Its index in the job.
    pub index: TaskIndex,
    /// Its inputs (numbered by the [`FileIndex`]).
    pub files: Box<[FileId]>,
    alive: bool,
    /// How many tasks had left the window when it came in (see [`Window::age`]).
    born: u64,
}

/// A window position: entries are numbered in the order they came in.
pub type Seq = u64;

/// Up to W tasks in queue order, with which of them read each file.
#[derive(Debug, Default)]
pub struct Window {
    entries: VecDeque<Entry>,
    /// The number of `entries[0]`.
    base: Seq,
    live: usize,
    /// How many (task, input) pairs the live entries hold.
    live_files: usize,
    /// Entries reading each file, possibly with some that left (skipped when met, dropped
    /// by [`Window::maintain`]).
    by_file: FxHashMap<FileId, Vec<Seq>>,
    /// How many (seq, file) pairs of `by_file` name entries that left.
    stale: usize,
    /// How many tasks have left the window, ever.
    left: u64,
}

impl Window {
    /// An empty window.
    pub fn new() -> Window {
        Window::default()
    }

    /// Tasks in the window.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether it holds no task.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Adds a task at the back.
    pub fn push(&mut self, job: JobId, index: TaskIndex, files: &[FileId]) -> Seq {
        let seq = self.base + self.entries.len() as Seq;
        for &f in files {
            self.by_file.entry(f).or_default().push(seq);
        }
        self.entries.push_back(Entry {
            job,
            index,
            files: files.into(),
            alive: true,
            born: self.left,
        });
        self.live += 1;
        self.live_files += files.len();
        seq
    }

    /// The task at `seq`, if it is still in the window.
    pub fn get(&self, seq: Seq) -> Option<&Entry> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.entries.get(i).filter(|e| e.alive)
    }

    /// Takes the task at `seq` out of the window.
    pub fn remove(&mut self, seq: Seq) {
        let Some(i) = seq
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
        else {
            return;
        };
        let Some(e) = self.entries.get_mut(i).filter(|e| e.alive) else {
            return;
        };
        e.alive = false;
        self.live -= 1;
        self.live_files -= e.files.len();
        self.stale += e.files.len();
        self.left += 1;
        // Entries that left at the front are dropped; their seqs in `by_file` are skipped
        // (they fall below `base`) and dropped when next met.
        while self.entries.front().is_some_and(|e| !e.alive) {
            self.entries.pop_front();
            self.base += 1;
        }
    }

    /// How many tasks left the window since the task at `seq` came in: once that passes W,
    /// the task has waited its turn, and any worker with room takes it (so that a policy
    /// that waits for data holders cannot starve it).
    pub fn age(&self, seq: Seq) -> Option<u64> {
        self.get(seq).map(|e| self.left - e.born)
    }

    /// Drops what entries that left still cost: their seqs in the file map, and the dead
    /// entries behind the front. Call between decisions, not during one: it renumbers the
    /// entries (old numbers then name nothing).
    pub fn maintain(&mut self) {
        let dead = self.entries.len() - self.live;
        if self.stale <= self.live_files + 1024 && dead <= self.live + 1024 {
            return;
        }
        let old_end = self.base + self.entries.len() as Seq;
        let kept: VecDeque<Entry> = std::mem::take(&mut self.entries)
            .into_iter()
            .filter(|e| e.alive)
            .collect();
        self.base = old_end;
        self.entries = kept;
        self.by_file.clear();
        for (i, e) in self.entries.iter().enumerate() {
            for &f in e.files.iter() {
                self.by_file
                    .entry(f)
                    .or_default()
                    .push(self.base + i as Seq);
            }
        }
        self.stale = 0;
    }

    /// The tasks in the window, front first.
    pub fn iter(&self) -> impl Iterator<Item = (Seq, &Entry)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.alive)
            .map(|(i, e)| (self.base + i as Seq, e))
    }

    /// The tasks in the window from `from` on (in order).
    pub fn iter_from(&self, from: Seq) -> impl Iterator<Item = (Seq, &Entry)> + '_ {
        let skip = usize::try_from(from.saturating_sub(self.base)).unwrap_or(usize::MAX);
        self.entries
            .iter()
            .enumerate()
            .skip(skip)
            .filter(|(_, e)| e.alive)
            .map(|(i, e)| (self.base + i as Seq, e))
    }

    /// Takes out every task for which `keep` says no (a canceled job's).
    pub fn retain(&mut self, mut keep: impl FnMut(JobId, TaskIndex) -> bool) {
        let gone: Vec<Seq> = self
            .iter()
            .filter(|(_, e)| !keep(e.job, e.index))
            .map(|(s, _)| s)
            .collect();
        for seq in gone {
            self.remove(seq);
        }
    }

    /// The tasks in the window some of whose inputs `worker` holds, with how much of them
    /// (Falkon's `cacheHit`, with the bytes beside the count), in window order. Appends to
    /// `out` (cleared first). Walks whichever is smaller: the worker's cache, through this
    /// window's file → tasks map, or the window's inputs.
    pub fn hits_for(&mut self, index: &FileIndex, worker: WorkerId, out: &mut Vec<(Seq, Hits)>) {
        out.clear();
        let held = index.held_count(worker);
        if held == 0 || self.live == 0 {
            return;
        }
        if held <= self.live_files {
            let base = self.base;
            for f in index.held_by(worker) {
                let Some(seqs) = self.by_file.get_mut(&f) else {
                    continue;
                };
                let hit = Hits {
                    bytes: index.size(f).unwrap_or(0),
                    files: 1,
                };
                let entries = &self.entries;
                let before = seqs.len();
                seqs.retain(|&s| {
                    let alive =
                        s >= base && entries.get((s - base) as usize).is_some_and(|e| e.alive);
                    if alive {
                        out.push((s, hit));
                    }
                    alive
                });
                self.stale = self.stale.saturating_sub(before - seqs.len());
                if seqs.is_empty() {
                    self.by_file.remove(&f);
                }
            }
            merge_hits(out);
        } else {
            for (seq, e) in self.iter() {
                let hits = index.hits(worker, &e.files);
                if hits.files > 0 {
                    out.push((seq, hits));
                }
            }
        }
    }

    /// Every way the window's counts and map disagree with its entries, for tests.
    pub fn audit(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let live: Vec<_> = self.iter().collect();
        if live.len() != self.live {
            bad.push(format!(
                "{} live entries, counted {}",
                live.len(),
                self.live
            ));
        }
        let files: usize = live.iter().map(|(_, e)| e.files.len()).sum();
        if files != self.live_files {
            bad.push(format!("{files} live inputs, counted {}", self.live_files));
        }
        for (seq, e) in &live {
            for f in e.files.iter() {
                if !self.by_file.get(f).is_some_and(|s| s.contains(seq)) {
                    bad.push(format!(
                        "entry {seq} reads file {f}, which does not list it"
                    ));
                }
            }
        }
        if self.entries.front().is_some_and(|e| !e.alive) {
            bad.push("a dead entry is at the front".into());
        }
        let listed: usize = self.by_file.values().map(Vec::len).sum();
        if listed != self.live_files + self.stale {
            bad.push(format!(
                "the file map lists {listed} pairs, {} live and {} stale counted",
                self.live_files, self.stale
            ));
        }
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::CacheDelta;

    fn index_with(held: &[(WorkerId, &[(FileId, u64)])], files: u32) -> FileIndex {
        let mut ix = FileIndex::new();
        for f in 0..files {
            ix.intern(&format!("f{f}"));
        }
        for &(w, added) in held {
            ix.apply(
                w,
                &CacheDelta {
                    added: added.to_vec(),
                    evicted: vec![],
                },
            );
        }
        ix
    }

    #[test]
    fn a_workers_hits_come_in_window_order_with_their_bytes() {
        let ix = index_with(&[(1, &[(0, 10), (1, 20)]), (2, &[(2, 5)])], 4);
        let mut w = Window::new();
        let a = w.push(1, 0, &[0, 3]);
        let b = w.push(1, 1, &[2]);
        let c = w.push(1, 2, &[1, 0]);
        let mut out = Vec::new();
        w.hits_for(&ix, 1, &mut out);
        assert_eq!(
            out,
            vec![
                (
                    a,
                    Hits {
                        bytes: 10,
                        files: 1
                    }
                ),
                (
                    c,
                    Hits {
                        bytes: 30,
                        files: 2
                    }
                )
            ]
        );
        w.hits_for(&ix, 2, &mut out);
        assert_eq!(out, vec![(b, Hits { bytes: 5, files: 1 })]);
        w.hits_for(&ix, 3, &mut out);
        assert!(out.is_empty());
        assert!(w.audit().is_empty());
    }

    #[test]
    fn both_ways_of_finding_hits_agree() {
        // A worker holding many files walks the window; one holding few walks its cache.
        let many: Vec<(FileId, u64)> = (0..50).map(|f| (f, u64::from(f))).collect();
        let ix = index_with(&[(1, &many), (2, &[(7, 7)])], 60);
        let mut w = Window::new();
        for i in 0..5 {
            w.push(1, i, &[i * 3, 55, 7]);
        }
        let mut walked = Vec::new();
        w.hits_for(&ix, 1, &mut walked);
        let by_file: Vec<_> = w
            .iter()
            .map(|(s, e)| (s, ix.hits(1, &e.files)))
            .filter(|(_, h)| h.files > 0)
            .collect();
        assert_eq!(walked, by_file);
        let mut few = Vec::new();
        w.hits_for(&ix, 2, &mut few);
        assert_eq!(few.len(), 5);
    }

    #[test]
    fn what_left_costs_nothing_after_maintenance_and_ages_count_departures() {
        let mut w = Window::new();
        // One distinct input per task, all but the first placed: the map would keep them all.
        let first = w.push(1, 0, &[0]);
        let seqs: Vec<Seq> = (1..5_000).map(|i| w.push(1, i, &[i])).collect();
        for &s in &seqs {
            w.remove(s);
        }
        assert_eq!(
            w.age(first),
            Some(4_999),
            "4,999 tasks left after it came in"
        );
        w.maintain();
        assert!(w.audit().is_empty(), "{:?}", w.audit());
        assert_eq!(w.by_file.len(), 1, "only the live task's file is mapped");
        // Renumbered: the live task is found again by walking, its old number names nothing.
        let (now, e) = w.iter().next().expect("the live task");
        assert_eq!(
            (e.job, e.index, w.get(first).is_none()),
            (1, 0, now != first)
        );
        assert_eq!(w.age(now), Some(4_999));
    }

    #[test]
    fn removed_tasks_leave_the_counts_and_the_map() {
        let ix = index_with(&[(1, &[(0, 1)])], 2);
        let mut w = Window::new();
        let a = w.push(1, 0, &[0]);
        let b = w.push(1, 1, &[0, 1]);
        let c = w.push(2, 0, &[1]);
        w.remove(b);
        w.remove(b);
        assert_eq!((w.len(), w.get(b).is_none()), (2, true));
        w.remove(a);
        assert_eq!(w.iter().map(|(s, _)| s).collect::<Vec<_>>(), vec![c]);
        let mut out = Vec::new();
        w.hits_for(&ix, 1, &mut out);
        assert!(out.is_empty(), "the tasks reading file 0 left");
        w.retain(|job, _| job != 2);
        assert!(w.is_empty());
        assert!(w.audit().is_empty(), "{:?}", w.audit());
        w.maintain();
        assert!(w.audit().is_empty(), "{:?}", w.audit());
        // Numbers go on after the window empties.
        let d = w.push(3, 0, &[]);
        assert!(d > c);
        assert_eq!(w.get(d).map(|e| e.job), Some(3));
    }
}
