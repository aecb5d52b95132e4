//! Lineage: making intermediate files again when their every copy is lost.
//!
//! A `local` output lives only in caches. When the last worker holding one is lost and a task
//! that has not run yet reads it, the task that wrote it runs again (and before it the writers
//! of its own inputs, if those are gone too); the readers wait for it as they waited the first
//! time. A worker that comes back with its cache (re-announcing what it holds) before such a
//! re-run has started makes it unnecessary: the writer counts as finished again and nothing is
//! recomputed.
//!
//! Two paths lead here. The loss of a worker finds the ready and waiting readers of what it
//! held alone (a scan of the live jobs' inputs, paid once per lost worker that held
//! intermediates). A reader that failed because an input was found nowhere (it was sent to its
//! worker before the loss, or the journal is being replayed, when no worker holds anything)
//! is rescued the same way instead of failing.

use super::{TaskKey, Waiter};
use crate::files::{cached_name, FileId};
use crate::outcome::Command;
use crate::queue::Span;
use crate::sched::diffusion::store_of;
use crate::sched::Scheduler;
use crate::spec::{JobId, Keep, TaskState, WorkerId};
use rustc_hash::FxHashSet;
use std::collections::BTreeMap;

/// How many times one task is run again for outputs lost, after which its readers fail: a
/// writer whose files keep vanishing (its workers keep dying) is not run forever.
pub(super) const MAX_REMAKES: u8 = 3;

/// The input named by a worker's "input not found" failure (the reasons
/// `kestrel_worker::files` gives for an input no cache, peer or store had).
fn missing_input(reason: &str) -> Option<&str> {
    let rest = reason.strip_prefix("input ")?;
    rest.split_once(" not found in ")
        .or_else(|| rest.split_once(" is in no cache and the job has no store"))
        // A value: in no store, ever.
        .or_else(|| rest.split_once(" is in no cache: "))
        .map(|(name, _)| name)
}

impl Scheduler {
    /// Whether `file` is a `local` output of task `writer` (never written to the store), or
    /// the result value it left in a cache (see [`crate::values`]): a file that only caches
    /// hold, made again by running `writer` again.
    pub(in crate::sched) fn is_local_output(&self, (job, index): TaskKey, file: FileId) -> bool {
        let Some(j) = self.jobs.get(&job) else {
            return false;
        };
        if j.values.contains(&file) {
            return true;
        }
        let per = j.spec.template.files.outputs.len();
        let first = index as usize * per;
        (0..per)
            .any(|p| j.outputs.get(first + p) == Some(&file) && j.keep.get(p) == Some(&Keep::Local))
    }

    /// The files task `writer` writes: its outputs, and its result value if it left one.
    pub(in crate::sched) fn outputs_of(&self, (job, index): TaskKey) -> Vec<FileId> {
        let Some(j) = self.jobs.get(&job) else {
            return Vec::new();
        };
        let per = j.spec.template.files.outputs.len();
        let first = index as usize * per;
        let mut files = j.outputs.get(first..first + per).unwrap_or(&[]).to_vec();
        files.extend(j.values.iter().copied().filter(|&f| {
            self.files.name(f).and_then(crate::values::kind_of)
                == Some(crate::values::ValueKind::Result { job, index })
        }));
        files
    }

    /// Copies local intermediates among `files` to other workers until each is held by as
    /// many as its writer's `--replicas` asks (each worker fetches them from a holder): least
    /// loaded workers first, spread by file. A file no worker holds is not copied (it is made
    /// again if needed).
    pub(in crate::sched) fn replicate(&mut self, files: &[FileId]) {
        // Listed once a file needs copies: most calls (a lost worker's or evicted files) have
        // none to make.
        let mut workers: Option<Vec<WorkerId>> = None;
        let mut to: BTreeMap<WorkerId, Vec<String>> = BTreeMap::new();
        for &f in files {
            let Some(&writer) = self.graph.produced.get(&f) else {
                continue;
            };
            let want = self
                .jobs
                .get(&writer.0)
                .map_or(0, |j| usize::from(j.spec.template.files.replicas));
            let holders = self.files.holders(f);
            if want <= 1 || holders.is_empty() || !self.is_local_output(writer, f) {
                continue;
            }
            let Some(name) = self.files.name(f) else {
                continue;
            };
            let workers = workers.get_or_insert_with(|| {
                let mut ws: Vec<WorkerId> = self
                    .workers
                    .values()
                    .filter(|w| w.offer.stages_files && w.quarantined.is_none())
                    .map(|w| w.id)
                    .collect();
                ws.sort_unstable_by_key(|&w| (self.files.held_count(w), w));
                ws
            });
            let others: Vec<WorkerId> = workers
                .iter()
                .copied()
                .filter(|w| !holders.contains(w))
                .collect();
            let need = want.saturating_sub(holders.len()).min(others.len());
            let start = (f as usize) % others.len().max(1);
            for k in 0..need {
                let w = others[(start + k) % others.len()];
                to.entry(w).or_default().push(name.to_string());
            }
        }
        for (worker, files) in to {
            self.commands.push(Command::Replicate { worker, files });
        }
    }

    /// The writer of `file` if `file` is a local intermediate whose every copy is gone, and
    /// its writer has finished (or is being run again for it).
    fn lost_writer(&self, file: FileId) -> Option<TaskKey> {
        let by = *self.graph.produced.get(&file)?;
        if !self.files.holders(file).is_empty() || !self.is_local_output(by, file) {
            return None;
        }
        let state = self.jobs.get(&by.0)?.table.get(by.1).state;
        (state == TaskState::Finished || self.graph.remaking.contains_key(&by)).then_some(by)
    }

    /// `files` were held by a worker that is gone (or evicted them): the local intermediates
    /// among them that no cache holds now are made again for the ready and waiting tasks
    /// that read them, which wait for them.
    pub(in crate::sched) fn files_lost(&mut self, files: &[FileId]) {
        let lost: FxHashSet<FileId> = files
            .iter()
            .copied()
            .filter(|&f| self.lost_writer(f).is_some())
            .collect();
        // Copies kept by `--replicas` that are still held somewhere: copied again.
        let kept: Vec<FileId> = files
            .iter()
            .copied()
            .filter(|f| !lost.contains(f) && !self.files.holders(*f).is_empty())
            .collect();
        if !kept.is_empty() {
            self.replicate(&kept);
        }
        if lost.is_empty() {
            return;
        }
        let mut live: Vec<JobId> = self.live_jobs.iter().copied().collect();
        live.sort_unstable();
        let mut readers = Vec::new();
        for job in live {
            let Some(j) = self.jobs.get(&job) else {
                continue;
            };
            if j.canceled || j.inputs_per_task() == 0 {
                continue;
            }
            for index in 0..j.len() {
                if !matches!(
                    j.table.get(index).state,
                    TaskState::Ready | TaskState::Waiting
                ) {
                    continue;
                }
                for &f in j.inputs_of(index) {
                    if lost.contains(&f) {
                        readers.push(((job, index), f));
                    }
                }
            }
        }
        for (reader, file) in readers {
            let Some(writer) = self.lost_writer(file) else {
                continue;
            };
            if self.remake(writer) {
                self.wait_for(reader, file, writer);
            }
        }
    }

    /// Task `reader` failed for good because input `reason` names was found nowhere. If that
    /// input is a local intermediate, the loss is the graph's, not the task's: the task waits
    /// for its writer to make it again (or, if a copy is held again, is queued at once).
    /// Whether it was rescued (it is then no longer failed).
    pub(in crate::sched) fn rescue_reader(&mut self, reader: TaskKey, reason: &str) -> bool {
        if self.graph.produced.is_empty() {
            return false;
        }
        let Some(j) = self.jobs.get(&reader.0) else {
            return false;
        };
        let Some(name) = missing_input(reason) else {
            return false;
        };
        if j.canceled {
            return false;
        }
        let store = store_of(&j.spec.placement, &self.config);
        let Some(file) = self.files.id(&cached_name(store, name)) else {
            return false;
        };
        let Some(&writer) = self.graph.produced.get(&file) else {
            return false;
        };
        let failures = j.table.get(reader.1).failures;
        if !self.is_local_output(writer, file) {
            return false;
        }
        // As shown: a task of a canceled job will not run, whatever it was stored as.
        let writer_state = self.jobs.get(&writer.0).map(|w| w.record(writer.1).state);
        let writer_done = writer_state == Some(TaskState::Finished);
        let writer_to_run = matches!(
            writer_state,
            Some(TaskState::Ready | TaskState::Waiting | TaskState::Assigned | TaskState::Running)
        );
        // (A writer that is to run: it is being made again, or was retried with its reader.
        // One of a canceled job is not: waiting for it would never end.)
        let rescued = if writer_to_run {
            self.wait_for(reader, file, writer);
            true
        } else if writer_done && self.files.holders(file).is_empty() {
            let remade = self.remake(writer);
            if remade {
                self.wait_for(reader, file, writer);
            }
            remade
        } else if writer_done && failures <= MAX_REMAKES {
            // Made again since the task was sent (or held where the task's worker did not
            // look): it only has to run again.
            self.queue_again(reader);
            true
        } else {
            false
        };
        if rescued {
            if let Some(j) = self.jobs.get_mut(&reader.0) {
                j.failures.remove(&reader.1);
            }
        }
        rescued
    }

    /// A task just submitted reads `file`, whose writer `writer` has finished but whose every
    /// copy is gone: the writer runs again and the task waits for it, as if the loss had come
    /// after the submission. Whether it will run again.
    pub(in crate::sched) fn remake_for(
        &mut self,
        reader: TaskKey,
        file: FileId,
        writer: TaskKey,
    ) -> bool {
        if !self.remake(writer) {
            return false;
        }
        self.wait_for(reader, file, writer);
        true
    }

    /// Whether `writer` could run again to make its lost outputs (see [`Self::remake`]).
    pub(in crate::sched) fn remakeable(&self, writer: TaskKey) -> bool {
        let Some(j) = self.jobs.get(&writer.0) else {
            return false;
        };
        if j.canceled {
            return false;
        }
        if self.graph.remaking.contains_key(&writer) {
            return true;
        }
        j.table.get(writer.1).state == TaskState::Finished
            && self.graph.remade.get(&writer).copied().unwrap_or(0) < MAX_REMAKES
    }

    /// Runs `writer` again to make its lost outputs, unless it already is; whether it will.
    /// Its own lost local inputs are made again first.
    fn remake(&mut self, writer: TaskKey) -> bool {
        let Some(j) = self.jobs.get(&writer.0) else {
            return false;
        };
        // A writer of a canceled job never runs again (waiting for it would never end).
        if j.canceled {
            return false;
        }
        if self.graph.remaking.contains_key(&writer) {
            return true;
        }
        if j.table.get(writer.1).state != TaskState::Finished {
            return false;
        }
        let times = self.graph.remade.get(&writer).copied().unwrap_or(0);
        if times >= MAX_REMAKES {
            return false;
        }
        let inputs: Vec<FileId> = j.inputs_of(writer.1).to_vec();
        let lost: Vec<FileId> = self
            .outputs_of(writer)
            .into_iter()
            .filter(|&f| self.files.holders(f).is_empty() && self.is_local_output(writer, f))
            .collect();
        self.graph.remade.insert(writer, times + 1);
        self.graph.remaking.insert(writer, lost);
        self.graph.reruns += 1;
        self.reopen(writer.0);
        if let Some(j) = self.jobs.get_mut(&writer.0) {
            j.set_state(writer.1, TaskState::Waiting);
        }
        let mut waits = false;
        for f in inputs {
            if let Some(up) = self.lost_writer(f).filter(|&up| up != writer) {
                if self.remake(up) {
                    self.wait_for(writer, f, up);
                    waits = true;
                }
            }
        }
        if !waits {
            self.queue_again(writer);
        }
        true
    }

    /// Makes `reader` wait for `writer` to finish (again), counting the wait once.
    fn wait_for(&mut self, reader: TaskKey, file: FileId, writer: TaskKey) {
        let waiters = self.graph.waiters.entry(writer).or_default();
        if waiters
            .iter()
            .any(|w| matches!(*w, Waiter::Reader(r, _) if r == reader))
        {
            return;
        }
        waiters.push(Waiter::Reader(reader, file));
        if let Some(wj) = self.jobs.get_mut(&writer.0) {
            wj.feeds = true;
        }
        let Some(j) = self.jobs.get_mut(&reader.0) else {
            return;
        };
        *j.unmet.entry(reader.1).or_default() += 1;
        if j.table.get(reader.1).state != TaskState::Waiting {
            j.set_state(reader.1, TaskState::Waiting);
            if let Some(due) = self.delayed_at.remove(&reader) {
                self.delayed.remove(&(due, reader.0, reader.1));
            }
        }
    }

    /// Queues a task ahead of new work (it has run before).
    fn queue_again(&mut self, (job, index): TaskKey) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.set_state(index, TaskState::Ready);
        self.ready
            .push_requeued(j.spec.priority, Span::one(job, index));
        if j.windowed {
            self.windowed_jobs.insert(job);
        }
    }

    /// A job that had ended has a task to run again: it is live again, in its workflow and
    /// for its parent.
    fn reopen(&mut self, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.finished_us.take().is_none() {
            return;
        }
        self.live_jobs.insert(job);
        self.graph_rejoin(job);
    }

    /// A job that had ended is live again (lineage, `job retry`): its workflow and its parent
    /// count it again.
    pub(in crate::sched) fn graph_rejoin(&mut self, job: JobId) {
        let Some(parent) = self.jobs.get(&job).map(|j| j.parent) else {
            return;
        };
        if self.graph.members.insert(job) {
            let root = self.graph.root(job);
            *self.graph.live.entry(root).or_default() += 1;
        }
        if let Some((pj, _)) = parent {
            if let Some(p) = self.jobs.get_mut(&pj).filter(|p| p.finished_us.is_none()) {
                p.live_children += 1;
            }
        }
    }

    /// Files came (back) into a worker's cache: a writer waiting to be run again for files
    /// that are all held again need not run, and counts as finished as before.
    pub(in crate::sched) fn files_back(&mut self, now_us: u64, added: &[(FileId, u64)]) {
        if self.graph.remaking.is_empty() {
            return;
        }
        let mut writers: Vec<TaskKey> = added
            .iter()
            .filter_map(|(f, _)| self.graph.produced.get(f).copied())
            .filter(|w| self.graph.remaking.contains_key(w))
            .collect();
        writers.sort_unstable();
        writers.dedup();
        for w in writers {
            let back = self
                .graph
                .remaking
                .get(&w)
                .is_some_and(|files| files.iter().all(|&f| !self.files.holders(f).is_empty()));
            let Some(j) = self.jobs.get_mut(&w.0) else {
                continue;
            };
            let state = j.table.get(w.1).state;
            if !back || !matches!(state, TaskState::Ready | TaskState::Waiting) {
                continue;
            }
            j.unmet.remove(&w.1);
            j.set_state(w.1, TaskState::Finished);
            self.graph.remaking.remove(&w);
            self.graph.reruns = self.graph.reruns.saturating_sub(1);
            if let Some(n) = self.graph.remade.get_mut(&w) {
                *n = n.saturating_sub(1);
            }
            self.graph_task_finished(w.0, w.1);
            self.check_job_done(now_us, w.0);
        }
    }

    /// A task failed for good for want of an input and could not be rescued: if that input
    /// is a local intermediate lost with its workers, the worker's "not found" is not the
    /// story, and the reason says so.
    pub(in crate::sched) fn explain_lost_input(
        &mut self,
        job: JobId,
        index: crate::spec::TaskIndex,
    ) {
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let lost = j.inputs_of(index).iter().find_map(|&f| {
            let by = *self.graph.produced.get(&f)?;
            (self.files.holders(f).is_empty() && self.is_local_output(by, f)).then_some((f, by))
        });
        let Some((file, by)) = lost else {
            return;
        };
        let why = match self.jobs.get(&by.0) {
            Some(w) if w.canceled => format!("job {} was canceled", by.0),
            Some(w) if w.table.get(by.1).state != TaskState::Finished => {
                format!("its writer has {}", w.record(by.1).state)
            }
            _ => format!("it was made again {MAX_REMAKES} times already"),
        };
        let reason = format!(
            "input {}, written by task {}, was lost with the worker that held it and is not made again: {why}",
            self.file_name(file),
            self.task_name(by)
        );
        if let Some(f) = self
            .jobs
            .get_mut(&job)
            .and_then(|j| j.failures.get_mut(&index))
        {
            f.reason = reason;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::missing_input;

    #[test]
    fn the_missing_input_is_read_from_the_workers_reasons() {
        assert_eq!(
            missing_input("input mid/1.txt not found in /data; check the name, or put the file there (not retried)"),
            Some("mid/1.txt")
        );
        assert_eq!(
            missing_input("input a b is in no cache and the job has no store; give one with `--store DIR|URL`"),
            Some("a b")
        );
        assert_eq!(
            missing_input("input kestrel-values/r/ab/3/0 is in no cache: the result of task 3:0"),
            Some("kestrel-values/r/ab/3/0")
        );
        assert_eq!(missing_input("exit code 1"), None);
        assert_eq!(missing_input("input x: producer task 1:1 failed"), None);
    }
}
