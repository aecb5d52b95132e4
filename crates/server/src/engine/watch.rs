//! Watches (protocol 13, `Ask::Watch`): a client connection is pushed each task end of the
//! jobs it watches, with the task's kept streamed output, right after the journal commit that
//! makes the end durable (the promise a `WaitDone` makes), in one `ToClient::Ended` frame per
//! connection and pass. Without a journal they go at the end of the pass.
//!
//! Where the ends come from:
//! - runs the scheduler took (`Record::Ended`), caught while `durable` journals them, with the
//!   worker's streamed output; tasks given up (`Record::GaveUp`);
//! - ends no record names: a job's cancel (its untouched tasks read as canceled) and tasks
//!   canceled because what they depend on failed. At the flush, a watched job whose count of
//!   ended tasks is not the count told is walked, and its ended tasks not told yet are told
//!   (their output read from the output log). The same walk tells a new watch of a job what
//!   ended before (a snapshot), and takes back the tasks a retry put back in the queue, to be
//!   told again when they end again;
//! - a forgotten or withdrawn job, or one whose ends the journal could not record, ends its
//!   watch with `ToClient::Gone`.
//!
//! What it costs: a watched job holds one bit per task (what its watchers were told) and a
//! count, whatever the number of its watchers; a job done and fully told is dropped (a later
//! retry of it is not told). A connection holds the set of jobs it watches.

use super::{ConnId, Engine};
use crate::journal::Journal;
use crate::outputs::{OutputLog, Stream};
use crate::views;
use kestrel_core::{Job, JobId, Scheduler, TaskIndex, TaskState};
use kestrel_proto::messages::{Kept, TaskEnded, TaskOutput, ToClient};
use rustc_hash::{FxHashMap, FxHashSet};

/// Bytes of ends (their outputs and a fixed part each) one `Ended` frame carries at most
/// before the next starts: with one task's outputs on top (at most 4 MiB each), a frame stays
/// well under the frame limit.
const FRAME_BYTES: usize = 8 << 20;

/// Every watch of the server.
#[derive(Default)]
pub(super) struct Watches {
    /// What each connection watches.
    conns: FxHashMap<ConnId, ConnWatch>,
    /// The watched jobs.
    jobs: FxHashMap<JobId, JobWatch>,
    /// Watched jobs the next flush has something for (ends caught, new watchers, a retry,
    /// an end of their watch).
    dirty: FxHashSet<JobId>,
    /// Whether tasks may have ended since the last flush with no record of their own (a
    /// cancel, a failure that cancels what depends on it): the next flush compares every
    /// watched job's count of ended tasks with the count told. Successes alone never set it,
    /// so a flood of them costs a flush only the jobs they name.
    unsure: bool,
}

/// One connection's watch.
#[derive(Default)]
struct ConnWatch {
    /// The jobs it watches (still in `Watches::jobs`).
    jobs: FxHashSet<JobId>,
    /// Whether it watches every job it submits from now on.
    submitted: bool,
}

/// One watched job.
struct JobWatch {
    /// The tasks its watchers were told of (or will be at the next flush), by index.
    told: Bits,
    /// How many bits of `told` are set.
    count: u64,
    /// The connections told of its ends.
    watchers: Vec<ConnId>,
    /// Connections that watch it since the last flush: they are owed what was told before
    /// (a snapshot), then join `watchers`.
    fresh: Vec<ConnId>,
    /// Ends caught since the last flush, by task index, in the order they came.
    caught: Vec<(TaskIndex, TaskEnded)>,
    /// Tasks may have left an end for the queue (a retry): walk the job at the flush.
    rescan: bool,
    /// Why its watch ends, once it does; the flush says so to its watchers.
    gone: Option<String>,
}

impl JobWatch {
    fn new(conn: ConnId) -> JobWatch {
        JobWatch {
            told: Bits::default(),
            count: 0,
            watchers: vec![conn],
            fresh: Vec::new(),
            caught: Vec::new(),
            rescan: false,
            gone: None,
        }
    }

    /// Whether ended tasks of `job` (`None`: gone) may not have been told.
    fn behind(&self, job: Option<&Job>) -> bool {
        job.is_none_or(|j| j.counts.done() != self.count)
    }
}

impl Watches {
    /// Whether any job is watched (until then task ends cost nothing here).
    pub(super) fn any(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// Adds `jobs` to `conn`'s watch (and with `submitted`, the jobs it submits from now on);
    /// returns those the scheduler does not have.
    pub(super) fn watch(
        &mut self,
        conn: ConnId,
        jobs: Vec<JobId>,
        submitted: bool,
        core: &Scheduler,
    ) -> Vec<JobId> {
        self.conns.entry(conn).or_default().submitted |= submitted;
        let mut missing = Vec::new();
        for job in jobs {
            if core.job(job).is_some() {
                self.add(conn, job);
            } else if !missing.contains(&job) {
                missing.push(job);
            }
        }
        missing
    }

    /// `conn` submitted `job` (or was answered with it, for a repeated key): watched from now
    /// on if the connection watches what it submits.
    pub(super) fn submitted(&mut self, conn: ConnId, job: JobId, core: &Scheduler) {
        if self.conns.get(&conn).is_some_and(|c| c.submitted) && core.job(job).is_some() {
            self.add(conn, job);
        }
    }

    fn add(&mut self, conn: ConnId, job: JobId) {
        if !self.conns.entry(conn).or_default().jobs.insert(job) {
            return;
        }
        self.dirty.insert(job);
        match self.jobs.entry(job) {
            std::collections::hash_map::Entry::Occupied(mut w) => w.get_mut().fresh.push(conn),
            // What already ended is found by the flush's walk (its count told is 0).
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(JobWatch::new(conn));
            }
        }
    }

    /// Task `index` of `j` took an end (a run the scheduler took, with the worker's `output`,
    /// or a task given up): told at the next flush if it is watched, ended for good, and not
    /// told yet (a duplicate report is told once).
    pub(super) fn caught(
        &mut self,
        core: &Scheduler,
        j: &Job,
        index: TaskIndex,
        output: Option<&TaskOutput>,
    ) {
        let Some(w) = self.jobs.get_mut(&j.id) else {
            return;
        };
        if w.gone.is_some() || !j.record(index).state.is_terminal() || w.told.get(index) {
            return;
        }
        w.told.set(index);
        w.count += 1;
        let stdout = output.and_then(|o| o.stdout.clone());
        let stderr = output.and_then(|o| o.stderr.clone());
        w.caught
            .push((index, ended(core, j, index, stdout, stderr)));
        self.dirty.insert(j.id);
    }

    /// Tasks may have ended without a record of their own (see [`Watches::unsure`]).
    pub(super) fn unsure(&mut self) {
        if self.any() {
            self.unsure = true;
        }
    }

    /// `job` was retried: some of its tasks told of may be queued again.
    pub(super) fn retried(&mut self, job: JobId) {
        if let Some(w) = self.jobs.get_mut(&job) {
            w.rescan = true;
            self.dirty.insert(job);
        }
    }

    /// The watch of `job` ends, and why (it was forgotten, withdrawn, or its ends could not be
    /// journaled); what was caught of it before is still told, unless `drop_caught`.
    pub(super) fn end(&mut self, job: JobId, why: String, drop_caught: bool) {
        if let Some(w) = self.jobs.get_mut(&job) {
            if drop_caught {
                w.caught.clear();
            }
            w.gone.get_or_insert(why);
            self.dirty.insert(job);
        }
    }

    /// `conn` closed: its watch goes, and the jobs no other connection watches.
    pub(super) fn conn_gone(&mut self, conn: ConnId) {
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        for job in c.jobs {
            let Some(w) = self.jobs.get_mut(&job) else {
                continue;
            };
            w.watchers.retain(|&x| x != conn);
            w.fresh.retain(|&x| x != conn);
            if w.watchers.is_empty() && w.fresh.is_empty() {
                self.jobs.remove(&job);
            }
        }
    }

    /// Whether the next flush has ends (or a job gone) to tell: the commit it follows is due
    /// at once, not after the few milliseconds ends may gather.
    pub(super) fn due(&self, core: &Scheduler) -> bool {
        !self.dirty.is_empty()
            || (self.unsure && self.jobs.iter().any(|(&id, w)| w.behind(core.job(id))))
    }

    /// The jobs the next flush is to look at, in order; taken, so the one after starts
    /// clean.
    fn take_due(&mut self, core: &Scheduler) -> Vec<JobId> {
        let mut ids: Vec<JobId> = self.dirty.drain().collect();
        if std::mem::take(&mut self.unsure) {
            let dirty: FxHashSet<JobId> = ids.iter().copied().collect();
            ids.extend(
                self.jobs
                    .iter()
                    .filter(|(id, w)| !dirty.contains(id) && w.behind(core.job(**id)))
                    .map(|(&id, _)| id),
            );
        }
        ids.sort_unstable();
        ids
    }

    /// Drops `job` from the connections that watch it.
    fn forget_job(&mut self, job: JobId) {
        let Some(w) = self.jobs.remove(&job) else {
            return;
        };
        for conn in w.watchers.iter().chain(&w.fresh) {
            if let Some(c) = self.conns.get_mut(conn) {
                c.jobs.remove(&job);
                if c.jobs.is_empty() && !c.submitted {
                    self.conns.remove(conn);
                }
            }
        }
    }

    /// The watched jobs and connections, for tests: (jobs, connections).
    #[cfg(test)]
    pub(super) fn sizes(&self) -> (usize, usize) {
        (self.jobs.len(), self.conns.len())
    }
}

impl Engine {
    /// Tells each watching connection the ends of its jobs since the last flush, then the
    /// jobs whose watch ended. Runs once the journal holds those ends (see `commit`).
    pub(super) fn flush_watches(&mut self) {
        if !self.watch.any() {
            return;
        }
        let ids = self.watch.take_due(&self.core);
        let mut out: FxHashMap<ConnId, Vec<TaskEnded>> = FxHashMap::default();
        let mut gone: Vec<(ConnId, JobId, String)> = Vec::new();
        let mut dropped = Vec::new();
        let journal = self.durable.journal.as_ref();
        for id in ids {
            let Some(w) = self.watch.jobs.get_mut(&id) else {
                continue;
            };
            match (self.core.job(id), w.gone.take()) {
                (Some(j), None) => {
                    if flush_job(w, &self.core, j, &self.outputs, journal, &mut out) {
                        dropped.push(id);
                    }
                }
                (j, why) => {
                    // What was caught before it went is still told, then that it went.
                    let why = why.unwrap_or_else(|| format!("job {id} is no longer on the server"));
                    let caught: Vec<TaskEnded> = w.caught.drain(..).map(|(_, e)| e).collect();
                    let conns: Vec<ConnId> = w.watchers.iter().chain(&w.fresh).copied().collect();
                    tell(&mut out, &conns, caught);
                    gone.extend(conns.into_iter().map(|c| (c, id, why.clone())));
                    if j.is_some() {
                        tracing::info!(job = id, "watch of the job ended: {why}");
                    }
                    dropped.push(id);
                }
            }
        }
        for id in dropped {
            self.watch.forget_job(id);
        }
        let mut conns: Vec<ConnId> = out.keys().copied().collect();
        conns.sort_unstable();
        for conn in conns {
            let ends = out.remove(&conn).unwrap_or_default();
            self.send_ends(conn, ends);
        }
        for (conn, job, why) in gone {
            self.conns.to_client(conn, &ToClient::Gone { job, why });
        }
    }

    /// Sends `ends` to `conn` in as few `Ended` frames as [`FRAME_BYTES`] allows.
    fn send_ends(&self, conn: ConnId, ends: Vec<TaskEnded>) {
        let mut frame = Vec::new();
        let mut bytes = 0;
        for e in ends {
            let size = 64
                + e.size()
                + e.reason.as_ref().map_or(0, String::len)
                + e.worker.as_ref().map_or(0, String::len);
            if !frame.is_empty() && bytes + size > FRAME_BYTES {
                let ends = std::mem::take(&mut frame);
                self.conns.to_client(conn, &ToClient::Ended { ends });
                bytes = 0;
            }
            frame.push(e);
            bytes += size;
        }
        if !frame.is_empty() {
            self.conns.to_client(conn, &ToClient::Ended { ends: frame });
        }
    }
}

/// The flush of one watched job that is still there: its caught ends, checked again; a
/// snapshot for its new watchers; the ends no record named, found by a walk when its count of
/// ended tasks says so. Returns whether the job is done and fully told (its watch is dropped).
fn flush_job(
    w: &mut JobWatch,
    core: &Scheduler,
    j: &Job,
    outputs: &OutputLog,
    journal: Option<&Journal>,
    out: &mut FxHashMap<ConnId, Vec<TaskEnded>>,
) -> bool {
    // A task caught ending may have been put back in the queue later in the pass (a retry).
    let mut caught = std::mem::take(&mut w.caught);
    caught.retain(|&(index, _)| {
        let ended = j.record(index).state.is_terminal();
        if !ended {
            w.told.clear(index);
            w.count -= 1;
        }
        ended
    });
    // New watchers are owed what was told before this flush (what is new goes to all).
    let mut snapshot = Vec::new();
    if !w.fresh.is_empty() {
        let new: FxHashSet<TaskIndex> = caught.iter().map(|&(i, _)| i).collect();
        for index in w.told.ones() {
            if !new.contains(&index) && j.record(index).state.is_terminal() {
                snapshot.push(logged(core, j, index, outputs, journal));
            }
        }
    }
    let mut news: Vec<TaskEnded> = caught.into_iter().map(|(_, e)| e).collect();
    if w.rescan || w.count != j.counts.done() {
        w.rescan = false;
        for index in 0..j.len() {
            match (j.record(index).state.is_terminal(), w.told.get(index)) {
                (true, false) => {
                    w.told.set(index);
                    w.count += 1;
                    news.push(logged(core, j, index, outputs, journal));
                }
                (false, true) => {
                    w.told.clear(index);
                    w.count -= 1;
                }
                _ => {}
            }
        }
    }
    let fresh = std::mem::take(&mut w.fresh);
    for &conn in &fresh {
        let to = out.entry(conn).or_default();
        to.extend(snapshot.iter().cloned());
    }
    w.watchers.extend(fresh);
    tell(out, &w.watchers, news);
    !j.open && w.count == u64::from(j.len()) && j.counts.done() == u64::from(j.len())
}

/// Adds `ends` to what each of `conns` is sent (the last one takes them, the others copies).
fn tell(out: &mut FxHashMap<ConnId, Vec<TaskEnded>>, conns: &[ConnId], ends: Vec<TaskEnded>) {
    if ends.is_empty() {
        return;
    }
    let Some((&last, others)) = conns.split_last() else {
        return;
    };
    for &conn in others {
        out.entry(conn).or_default().extend(ends.iter().cloned());
    }
    out.entry(last).or_default().extend(ends);
}

/// The end of task `index` of `j` as a watch tells it, with its kept `stdout`, and its
/// `stderr` unless it finished.
fn ended(
    core: &Scheduler,
    j: &Job,
    index: TaskIndex,
    stdout: Option<Kept>,
    stderr: Option<Kept>,
) -> TaskEnded {
    let state = j.record(index).state;
    TaskEnded {
        job: j.id,
        id: j.task_id(index),
        state,
        reason: views::end_reason(j, index),
        worker: views::worker_host(core, j, index),
        stdout: stdout.filter(|k| k.total > 0),
        stderr: stderr.filter(|k| k.total > 0 && state != TaskState::Finished),
    }
}

/// [`ended`] for a task whose end was not caught with its report: its output as the output
/// log kept it (none for a task never handed out).
fn logged(
    core: &Scheduler,
    j: &Job,
    index: TaskIndex,
    outputs: &OutputLog,
    journal: Option<&Journal>,
) -> TaskEnded {
    let r = j.record(index);
    let ran = r.runs > 0 || r.assigned_us > 0;
    let read = |stream: Stream| {
        if !ran || !stream.sink(&j.spec).is_stream() {
            return None;
        }
        outputs
            .kept(journal, j.id, index, stream)
            .unwrap_or_else(|e| {
                tracing::warn!(
                    job = j.id,
                    index,
                    "a watched end goes without its output: {e}"
                );
                None
            })
    };
    let stdout = read(Stream::Stdout);
    let stderr = match r.state {
        TaskState::Finished => None,
        _ => read(Stream::Stderr),
    };
    ended(core, j, index, stdout, stderr)
}

/// A set of task indices, one bit each.
#[derive(Default)]
struct Bits(Vec<u64>);

impl Bits {
    fn get(&self, i: TaskIndex) -> bool {
        self.0
            .get(i as usize / 64)
            .is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    fn set(&mut self, i: TaskIndex) {
        let k = i as usize / 64;
        if self.0.len() <= k {
            self.0.resize(k + 1, 0);
        }
        self.0[k] |= 1 << (i % 64);
    }

    fn clear(&mut self, i: TaskIndex) {
        if let Some(w) = self.0.get_mut(i as usize / 64) {
            *w &= !(1 << (i % 64));
        }
    }

    /// The indices set, in order.
    fn ones(&self) -> impl Iterator<Item = TaskIndex> + '_ {
        self.0.iter().enumerate().flat_map(|(k, &word)| {
            let mut w = word;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let bit = w.trailing_zeros();
                    w &= w - 1;
                    k as TaskIndex * 64 + bit
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Bits;

    #[test]
    fn bits_set_clear_and_list_their_indices() {
        let mut b = Bits::default();
        for i in [0, 63, 64, 1000, 70] {
            b.set(i);
        }
        b.clear(64);
        b.clear(5_000);
        assert!(b.get(63) && b.get(1000) && !b.get(64) && !b.get(10_000));
        assert_eq!(b.ones().collect::<Vec<_>>(), vec![0, 63, 70, 1000]);
    }
}
