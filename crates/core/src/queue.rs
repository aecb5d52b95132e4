//! The ready queue: spans of task indices ordered by priority, re-queued work first.
//!
//! An array of ten million tasks is one entry until workers take its tasks from the front,
//! so a cancel that drops a job's entries ([`ReadyQueue::retain`]) walks entries, not tasks.

use crate::spec::{JobId, TaskIndex};
use std::cmp::Reverse;
use std::collections::BTreeMap;

/// Which tasks an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub job: JobId,
    /// Next index to hand out.
    pub next: TaskIndex,
    /// One past the last index.
    pub end: TaskIndex,
}

impl Span {
    /// The one task `index` of `job` (a task put back in the queue).
    pub fn one(job: JobId, index: TaskIndex) -> Span {
        Span {
            job,
            next: index,
            end: index + 1,
        }
    }

    pub fn len(&self) -> u32 {
        self.end - self.next
    }

    pub fn is_empty(&self) -> bool {
        self.next >= self.end
    }
}

/// Orders entries: higher priority first; within a priority, re-queued work before new work
/// (Chronos' recovery first), then first come first served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey {
    priority: Reverse<i32>,
    fresh: bool,
    seq: u64,
}

#[derive(Debug, Default)]
pub struct ReadyQueue {
    entries: BTreeMap<QueueKey, Span>,
    seq: u64,
    tasks: u64,
}

impl ReadyQueue {
    /// Adds new work at the back of its priority class.
    pub fn push_new(&mut self, priority: i32, span: Span) {
        self.push(priority, true, span);
    }

    /// Adds work that ran before (retry, lost worker) ahead of new work of its priority.
    pub fn push_requeued(&mut self, priority: i32, span: Span) {
        self.push(priority, false, span);
    }

    fn push(&mut self, priority: i32, fresh: bool, span: Span) {
        if span.is_empty() {
            return;
        }
        self.seq += 1;
        self.tasks += span.len() as u64;
        let key = QueueKey {
            priority: Reverse(priority),
            fresh,
            seq: self.seq,
        };
        self.entries.insert(key, span);
    }

    /// The entries, front to back.
    pub fn spans(&self) -> impl Iterator<Item = &Span> + '_ {
        self.entries.values()
    }

    /// Tasks waiting in the queue (including ones of canceled jobs not yet dropped).
    pub fn len(&self) -> u64 {
        self.tasks
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Walks entries front to back; `take` sees each span and returns how many tasks to take
    /// from its front (0 = skip it), or `None` to stop the walk. Emptied entries are removed.
    /// At most `max_skips` entries that yield nothing are looked at, so a queue full of work that
    /// fits no worker cannot make one scheduling pass cost O(queue).
    pub fn take_front(&mut self, max_skips: usize, mut take: impl FnMut(&Span) -> Option<u32>) {
        let mut skips = 0;
        let mut emptied = Vec::new();
        for (key, span) in self.entries.iter_mut() {
            match take(span) {
                None => break,
                Some(0) => {
                    skips += 1;
                    if skips > max_skips {
                        break;
                    }
                }
                Some(n) => {
                    let n = n.min(span.len());
                    span.next += n;
                    self.tasks -= n as u64;
                    if span.is_empty() {
                        emptied.push(*key);
                    }
                }
            }
        }
        for key in emptied {
            self.entries.remove(&key);
        }
    }

    /// The priority of the entry at the front, if there is one.
    pub fn front_priority(&self) -> Option<i32> {
        self.entries.keys().next().map(|k| k.priority.0)
    }

    /// Moves the entries `pick` chooses, from the front, into `to`, each keeping its place in
    /// the order (priority, re-queued first, then first come); at most `max_skips` entries it
    /// does not choose are looked at. `to` must take entries from this queue alone, so that
    /// their places stay unique.
    pub fn move_front(
        &mut self,
        to: &mut ReadyQueue,
        max_skips: usize,
        mut pick: impl FnMut(&Span) -> bool,
    ) {
        let mut skips = 0;
        let mut moved = Vec::new();
        for (key, span) in &self.entries {
            if pick(span) {
                moved.push(*key);
            } else {
                skips += 1;
                if skips > max_skips {
                    break;
                }
            }
        }
        for key in moved {
            if let Some(span) = self.entries.remove(&key) {
                self.tasks -= u64::from(span.len());
                to.tasks += u64::from(span.len());
                to.entries.insert(key, span);
            }
        }
    }

    /// Drops every entry for which `keep` says no (used to purge a canceled job's spans when
    /// they are seen; also used by tests).
    pub fn retain(&mut self, mut keep: impl FnMut(&Span) -> bool) {
        let tasks = &mut self.tasks;
        self.entries.retain(|_, span| {
            let k = keep(span);
            if !k {
                *tasks -= span.len() as u64;
            }
            k
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut ReadyQueue) -> Vec<(JobId, TaskIndex)> {
        let mut out = Vec::new();
        q.take_front(usize::MAX, |s| {
            out.extend((s.next..s.end).map(|i| (s.job, i)));
            Some(s.len())
        });
        out
    }

    #[test]
    fn priority_then_requeued_then_fifo() {
        let mut q = ReadyQueue::default();
        q.push_new(
            0,
            Span {
                job: 1,
                next: 0,
                end: 2,
            },
        );
        q.push_new(
            5,
            Span {
                job: 2,
                next: 0,
                end: 1,
            },
        );
        q.push_requeued(
            0,
            Span {
                job: 3,
                next: 7,
                end: 8,
            },
        );
        q.push_new(
            0,
            Span {
                job: 4,
                next: 0,
                end: 1,
            },
        );
        assert_eq!(q.len(), 5);
        assert_eq!(drain(&mut q), vec![(2, 0), (3, 7), (1, 0), (1, 1), (4, 0)]);
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn partial_takes_keep_the_rest() {
        let mut q = ReadyQueue::default();
        q.push_new(
            0,
            Span {
                job: 1,
                next: 0,
                end: 1_000_000,
            },
        );
        q.take_front(0, |_| Some(10));
        assert_eq!(q.len(), 999_990);
        let mut first = None;
        q.take_front(0, |s| {
            first = Some(s.next);
            None
        });
        assert_eq!(first, Some(10));
    }

    #[test]
    fn skips_are_bounded() {
        let mut q = ReadyQueue::default();
        for j in 0..100 {
            q.push_new(
                0,
                Span {
                    job: j,
                    next: 0,
                    end: 1,
                },
            );
        }
        let mut seen = 0;
        q.take_front(3, |_| {
            seen += 1;
            Some(0)
        });
        assert_eq!(seen, 4);
    }
}
