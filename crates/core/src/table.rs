//! Per-task records of one job, allocated in chunks only as tasks leave the ready queue.
//!
//! A queued array costs nothing here; a dispatched task costs one [`TaskRecord`] (40 bytes).
//! Tasks that were never touched read as `Ready` with no timestamps.

use crate::spec::{TaskIndex, TaskState, WorkerId};

const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;

/// What the server remembers of one task that has left the ready queue at least once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    /// Microseconds since the Unix epoch; 0 = not yet.
    pub assigned_us: u64,
    pub started_us: u64,
    pub finished_us: u64,
    /// The worker it was last assigned to (meaningful once assigned).
    pub worker: WorkerId,
    pub state: TaskState,
    /// Runs that ended in failure (each spends one retry).
    pub failures: u8,
    /// Runs lost with their worker (spend no retry).
    pub lost: u8,
    /// Runs that started (the attempts `kestrel task list` shows); tasks that only waited on
    /// a worker that was lost, or were taken back from it, did not start.
    pub runs: u8,
}

impl TaskRecord {
    const READY: TaskRecord = TaskRecord {
        assigned_us: 0,
        started_us: 0,
        finished_us: 0,
        worker: 0,
        state: TaskState::Ready,
        failures: 0,
        lost: 0,
        runs: 0,
    };
}

/// The records of a job's tasks, indexed by task index.
#[derive(Debug, Default)]
pub struct TaskTable {
    chunks: Vec<Option<Box<[TaskRecord]>>>,
    len: u32,
}

impl TaskTable {
    pub fn new(len: u32) -> TaskTable {
        let nchunks = (len as usize).div_ceil(CHUNK);
        TaskTable {
            chunks: (0..nchunks).map(|_| None).collect(),
            len,
        }
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Grows the table for tasks appended to an open job.
    pub fn extend_to(&mut self, len: u32) {
        let nchunks = (len as usize).div_ceil(CHUNK);
        self.chunks.resize_with(nchunks, || None);
        self.len = len;
    }

    /// The record of a task; untouched tasks read as ready.
    pub fn get(&self, index: TaskIndex) -> TaskRecord {
        debug_assert!(index < self.len);
        match &self.chunks[(index >> CHUNK_BITS) as usize] {
            Some(chunk) => chunk[index as usize & (CHUNK - 1)],
            None => TaskRecord::READY,
        }
    }

    /// The record of a task, allocating its chunk on first touch.
    pub fn get_mut(&mut self, index: TaskIndex) -> &mut TaskRecord {
        debug_assert!(index < self.len);
        let chunk = self.chunks[(index >> CHUNK_BITS) as usize]
            .get_or_insert_with(|| vec![TaskRecord::READY; CHUNK].into_boxed_slice());
        &mut chunk[index as usize & (CHUNK - 1)]
    }

    /// Every touched record with its index, in index order.
    pub fn touched(&self) -> impl Iterator<Item = (TaskIndex, &TaskRecord)> + '_ {
        let len = self.len;
        self.chunks
            .iter()
            .enumerate()
            .flat_map(move |(c, chunk)| {
                chunk.iter().flat_map(move |recs| {
                    recs.iter()
                        .enumerate()
                        .map(move |(i, r)| (((c << CHUNK_BITS) + i) as u32, r))
                })
            })
            .filter(move |(i, _)| *i < len)
    }

    /// Bytes held by allocated chunks.
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        self.chunks.iter().flatten().count() * CHUNK * std::mem::size_of::<TaskRecord>()
            + self.chunks.capacity() * std::mem::size_of::<Option<Box<[TaskRecord]>>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untouched_tasks_cost_no_chunk() {
        let mut t = TaskTable::new(10_000_000);
        assert_eq!(t.get(9_999_999).state, TaskState::Ready);
        assert!(t.heap_bytes() < 64 * 1024);
        t.get_mut(5).state = TaskState::Running;
        assert_eq!(t.get(5).state, TaskState::Running);
        assert_eq!(
            t.touched()
                .filter(|(_, r)| r.state == TaskState::Running)
                .count(),
            1
        );
        assert!(std::mem::size_of::<TaskRecord>() <= 40);
    }
}
