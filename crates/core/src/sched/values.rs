//! Values in the caches (see [`crate::values`]): which job each result belongs to, and their
//! deletion when their job is forgotten or their client drops them.
//!
//! A result's name says its job, so a worker's report of it ([`Scheduler::cache_changed`])
//! is all it takes to tie it to the job: nothing here is journaled, and a restarted server
//! learns the values again as workers register with what their caches hold. An argument value
//! belongs to the job whose tasks read it (one of its inputs); a scattered one to the client
//! alone, who drops it.

use super::Scheduler;
use crate::files::FileId;
use crate::spec::JobId;
use crate::values::{self, ValueKind};

/// What the scheduler keeps about values beside the index.
#[derive(Debug, Default)]
pub(super) struct ValueStats {
    /// Copies of values deleted from caches, and their bytes.
    pub(super) freed_files: u64,
    pub(super) freed_bytes: u64,
}

impl Scheduler {
    /// Ties the results among files a worker reported cached to their jobs.
    pub(super) fn note_values(&mut self, added: &[(FileId, u64)]) {
        for &(file, _) in added {
            let Some(name) = self.files.name(file) else {
                continue;
            };
            if let Some(ValueKind::Result { job, index }) = values::kind_of(name) {
                if let Some(j) = self.jobs.get_mut(&job).filter(|j| index < j.len()) {
                    if !j.values.contains(&file) {
                        j.values.push(file);
                    }
                    // Its writer, for lineage: lost with its workers while a call may still
                    // read it, it is made again by running the task again.
                    self.graph_note_writer(file, (job, index));
                }
            }
        }
    }

    /// Job `job` is being forgotten: its results and the arguments its tasks read leave the
    /// caches.
    pub(super) fn forget_values(&mut self, job: JobId) {
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let results = j.values.clone();
        let mut files = results.clone();
        if j.inputs_per_task() > 0 {
            let arguments = j.inputs.iter().copied().filter(|&f| {
                self.files
                    .name(f)
                    .is_some_and(|n| values::kind_of(n) == Some(ValueKind::Argument))
            });
            files.extend(arguments);
        }
        for f in results {
            self.graph_forget_writer(f);
        }
        self.free_values(&files);
    }

    /// A client drops values it holds (futures it let go of): they leave the caches. Names
    /// that are not values are left alone (a client deletes no intermediate file this way).
    /// Returns how many of them some worker held.
    pub(super) fn drop_values(&mut self, names: &[String]) -> u32 {
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            let Some(kind) = values::kind_of(name) else {
                continue;
            };
            let Some(file) = self.files.id(name) else {
                continue;
            };
            if let ValueKind::Result { job, .. } = kind {
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.values.retain(|&f| f != file);
                }
                // Dropped by its client: nothing may read it any more, nor make it again.
                self.graph_forget_writer(file);
            }
            files.push(file);
        }
        let held = files
            .iter()
            .filter(|&&f| !self.files.holders(f).is_empty())
            .count();
        self.free_values(&files);
        held as u32
    }

    fn free_values(&mut self, files: &[FileId]) {
        if files.is_empty() {
            return;
        }
        let (copies, bytes) = self.drop_from_caches(files);
        self.values.freed_files += copies;
        self.values.freed_bytes += bytes;
    }

    /// Copies of values deleted from caches so far, and their bytes.
    pub fn values_freed(&self) -> (u64, u64) {
        (self.values.freed_files, self.values.freed_bytes)
    }

    /// Whether a call may still read value `name`: a worker holds it, or it is the result of
    /// a finished task that lineage can run again (its every copy was lost).
    pub fn value_readable(&self, name: &str) -> bool {
        let Some(file) = self.files.id(name) else {
            return false;
        };
        if !self.files.holders(file).is_empty() {
            return true;
        }
        self.graph_writer_of(file)
            .is_some_and(|writer| self.remakeable(writer))
    }

    /// The workers whose caches hold file `name` (a value, or any file), by id.
    pub fn holders_of(&self, name: &str) -> &[crate::spec::WorkerId] {
        self.files.id(name).map_or(&[], |f| self.files.holders(f))
    }
}
