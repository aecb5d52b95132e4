//! Journal entries as bytes: each input the scheduler recorded becomes one row of `log`, a kind
//! and a MessagePack body; [`Entry::decode`] reads a row back.
//!
//! Bodies are written from borrowed values (a big task list is never cloned) and read back
//! into owned ones. Fields are only ever added at the end with `#[serde(default)]`, so entries
//! written by an older Kestrel stay readable.

use crate::outputs::OutputOp;
use kestrel_core::{Finished, JobId, JobSpec, LineList, TaskIndex, TaskSet, WorkerId};
use kestrel_proto::wire::{line_list, FailureDef, JobSpecDef, TaskSetDef};
use serde::{Deserialize, Serialize};

const KIND_SUBMIT: i64 = 1;
pub(super) const KIND_EXTEND: i64 = 2;
const KIND_CANCEL: i64 = 3;
pub(super) const KIND_ENDS: i64 = 4;
const KIND_RETRY: i64 = 5;
const KIND_GIVE_UP: i64 = 6;
const KIND_LOST: i64 = 7;
const KIND_FORGET: i64 = 8;

/// One accepted submission, as journaled.
#[derive(Serialize, Deserialize)]
pub(super) struct SubmitBody {
    pub(super) job: JobId,
    pub(super) at_us: u64,
    pub(super) key: Option<String>,
    #[serde(with = "JobSpecDef")]
    pub(super) spec: JobSpec,
    #[serde(with = "TaskSetDef")]
    pub(super) tasks: TaskSet,
    pub(super) open: bool,
}

/// Tasks added to an open job: argvs for a list of commands, lines for a job of lines.
#[derive(Serialize, Deserialize)]
pub(super) struct ExtendBody {
    pub(super) job: JobId,
    pub(super) at_us: u64,
    pub(super) argvs: Vec<Vec<String>>,
    pub(super) close: bool,
    /// Absent from entries written before jobs of lines existed.
    #[serde(default, with = "line_list")]
    pub(super) lines: LineList,
}

/// `kestrel job retry`: failed (and maybe canceled) tasks back in the queue.
#[derive(Serialize, Deserialize)]
pub(super) struct RetryBody {
    pub(super) job: JobId,
    pub(super) at_us: u64,
    pub(super) failed_only: bool,
}

/// A task failed for good by the scheduler itself (too many lost workers).
#[derive(Serialize, Deserialize)]
pub(super) struct GiveUpBody {
    pub(super) job: JobId,
    pub(super) index: TaskIndex,
    pub(super) at_us: u64,
    #[serde(with = "FailureDef")]
    pub(super) failure: kestrel_core::Failure,
}

/// Tasks re-queued after their worker was lost, each counting one more crash.
#[derive(Serialize, Deserialize)]
pub(super) struct LostBody {
    pub(super) tasks: Vec<(JobId, TaskIndex)>,
}

/// `kestrel job forget`: ended jobs dropped from the server.
#[derive(Serialize, Deserialize)]
pub(super) struct ForgetBody {
    pub(super) jobs: Vec<JobId>,
    pub(super) at_us: u64,
}

/// `kestrel job cancel`: the job's unfinished tasks canceled.
#[derive(Serialize, Deserialize)]
pub(super) struct CancelBody {
    pub(super) job: JobId,
    pub(super) at_us: u64,
}

/// A batch of accepted task ends. Successes, the bulk, are packed as differences from the
/// success before (`packed`, about 6 bytes a task; before schema 8, `ok`: tuples of small
/// integers relative to `base_us`, about 20 bytes a task); other ends keep their full report. The workers that
/// ran them are runs over the ends (one update's ends are one worker's): a few bytes a
/// batch, not a number per task.
#[derive(Serialize, Deserialize)]
pub(super) struct EndsBody {
    pub(super) base_us: u64,
    /// (job, index, assigned, started, finished), times as offsets from `base_us`.
    pub(super) ok: Vec<(JobId, TaskIndex, i64, i64, i64)>,
    /// (report, assigned_us).
    #[serde(with = "reports_assigned")]
    pub(super) other: Vec<(Finished, u64)>,
    /// Per job, the summed wait for a slot of the successes in `ok` (one pair per job and
    /// batch, not a number per task).
    #[serde(default)]
    pub(super) waited: Vec<(JobId, u64)>,
    /// (worker, how many ends) in the order of `ok` then `other`: the worker of each end.
    /// Absent from entries written before it (schema 5): their ends name worker 0.
    #[serde(default)]
    pub(super) workers: Vec<(WorkerId, u32)>,
    /// Schema 8: the job of the successes in `packed`.
    #[serde(default)]
    pub(super) job: JobId,
    /// Schema 8: the successes of `job`, written in place of `ok` (see [`pack_successes`]);
    /// read back into `ok` by [`Entry::decode`].
    #[serde(default, with = "serde_bytes")]
    pub(super) packed: Vec<u8>,
}

/// A success as journaled: (job, index, assigned, started, finished), times as offsets.
type Success = (JobId, TaskIndex, i64, i64, i64);

/// `ok`'s successes of one job as a MessagePack stream of integers, four a task: the index
/// and the assignment time as differences from the task before, the start as a difference
/// from the assignment, the end from the start. The differences are small (consecutive
/// indices, tasks a few microseconds apart), so most take one or two bytes where the tuples
/// took about twenty, and writing them is a loop over integers rather than serde's tuple
/// machinery: this is most of what the journal writes and encodes under a flood of short
/// tasks (issue 32). Wrapping arithmetic, so that any offsets go through and come back.
fn pack_successes(ok: impl ExactSizeIterator<Item = Success>) -> Vec<u8> {
    let mut out = Vec::with_capacity(ok.len() * 8);
    let (mut index, mut assigned) = (0i64, 0i64);
    for (_, i, a, st, f) in ok {
        for v in [
            i64::from(i).wrapping_sub(index),
            a.wrapping_sub(assigned),
            st.wrapping_sub(a),
            f.wrapping_sub(st),
        ] {
            // Writing to a Vec cannot fail.
            let _ = rmp::encode::write_sint(&mut out, v);
        }
        (index, assigned) = (i64::from(i), a);
    }
    out
}

/// The inverse of [`pack_successes`], for `job`.
fn unpack_successes(job: JobId, mut packed: &[u8]) -> Result<Vec<Success>, String> {
    let mut ok = Vec::with_capacity(packed.len() / 6);
    let (mut index, mut assigned) = (0i64, 0i64);
    while !packed.is_empty() {
        let mut next = || {
            rmp::decode::read_int::<i64, _>(&mut packed)
                .map_err(|e| format!("packed task ends: {e}"))
        };
        let (di, da, ds, df) = (next()?, next()?, next()?, next()?);
        index = index.wrapping_add(di);
        assigned = assigned.wrapping_add(da);
        let started = assigned.wrapping_add(ds);
        let i = TaskIndex::try_from(index)
            .map_err(|_| format!("packed task ends: task index {index} out of range"))?;
        ok.push((job, i, assigned, started, started.wrapping_add(df)));
    }
    Ok(ok)
}

/// `(report, assigned_us)` pairs, the report in its full wire form.
mod reports_assigned {
    use kestrel_core::Finished;
    use kestrel_proto::wire::{Own, Ref};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[(Finished, u64)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(f, at)| (Ref(f), at)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(Finished, u64)>, D::Error> {
        let pairs = Vec::<(Own<Finished>, u64)>::deserialize(d)?;
        Ok(pairs.into_iter().map(|(Own(f), at)| (f, at)).collect())
    }
}

/// The worker of each end of an [`EndsBody`] from its `workers` runs, in the order of `ok`
/// then `other`; 0 (unknown) past the runs, as in an entry written before they were kept.
pub(super) fn each_worker(runs: &[(WorkerId, u32)]) -> impl Iterator<Item = WorkerId> + '_ {
    runs.iter()
        .flat_map(|&(w, n)| std::iter::repeat_n(w, n as usize))
        .chain(std::iter::repeat(0))
}

impl EndsBody {
    /// The successes in `ok` as reports again, each with when its task had been assigned:
    /// the inverse of [`Pending::seal_ends`].
    pub(super) fn successes(&self) -> impl Iterator<Item = (Finished, u64)> + '_ {
        let at = |off: i64| (self.base_us as i64).saturating_add(off).max(0) as u64;
        self.ok.iter().map(move |&(job, index, a, s, f)| {
            let f = Finished {
                job,
                index,
                started_us: at(s),
                finished_us: at(f),
                end: kestrel_core::RunEnd::Success,
            };
            (f, at(a))
        })
    }
}

/// One row of `log`, decoded.
// One entry is decoded at a time: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Entry {
    Submit(SubmitBody),
    Extend(ExtendBody),
    Cancel(CancelBody),
    Ends(EndsBody),
    Retry(RetryBody),
    GiveUp(GiveUpBody),
    Lost(LostBody),
    Forget(ForgetBody),
}

impl Entry {
    /// Reads a row back; the error says what is wrong with it (a body that does not decode,
    /// a kind this version does not know).
    pub(super) fn decode(kind: i64, body: &[u8]) -> Result<Entry, String> {
        fn de<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, String> {
            rmp_serde::from_slice(body).map_err(|e| e.to_string())
        }
        Ok(match kind {
            KIND_SUBMIT => Entry::Submit(de(body)?),
            KIND_EXTEND => Entry::Extend(de(body)?),
            KIND_CANCEL => Entry::Cancel(de(body)?),
            KIND_ENDS => {
                let mut b: EndsBody = de(body)?;
                if !b.packed.is_empty() {
                    let packed = std::mem::take(&mut b.packed);
                    b.ok = unpack_successes(b.job, &packed)?;
                }
                Entry::Ends(b)
            }
            KIND_RETRY => Entry::Retry(de(body)?),
            KIND_GIVE_UP => Entry::GiveUp(de(body)?),
            KIND_LOST => Entry::Lost(de(body)?),
            KIND_FORGET => Entry::Forget(de(body)?),
            other => {
                return Err(format!(
                    "unknown entry kind {other} (written by a newer kestrel? start that \
                     version on this directory instead)"
                ))
            }
        })
    }
}

/// Entries gathered while the engine applies one batch of events; written by [`super::Journal::commit`].
#[derive(Default)]
pub struct Pending {
    /// Encoded entries, (kind, body), in the order they happened.
    pub(super) rows: Vec<(i64, Vec<u8>)>,
    /// The job each row of `rows` is about (`None` for a row about several or none), so that
    /// a forgotten job's rows can be deleted.
    pub(super) row_jobs: Vec<Option<JobId>>,
    /// Jobs forgotten in this batch: their rows go from `log` in the same transaction.
    pub(super) forgotten: Vec<JobId>,
    /// Job ids given out are below this (kept in `meta`: a job whose rows were deleted, or
    /// whose submission never reached the journal, leaves no other trace of its id); `None`
    /// if it did not change.
    pub(crate) next_job: Option<JobId>,
    ok: Vec<(JobId, TaskIndex, u64, u64, u64)>,
    other: Vec<(Finished, u64)>,
    waited: Vec<(JobId, u64)>,
    /// The workers of `ok` and of `other`, as runs (see [`EndsBody::workers`]).
    ok_workers: Vec<(WorkerId, u32)>,
    other_workers: Vec<(WorkerId, u32)>,
    /// Changes to the `output` table, written after the log rows in the same transaction.
    pub(crate) outputs: Vec<OutputOp>,
    /// Worker ids given out are below this (kept in `meta`, so that a restarted server gives
    /// new workers other ids and lets each returning worker take its own); `None` if it did
    /// not change.
    pub(super) next_worker: Option<WorkerId>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
            && self.next_job.is_none()
            && self.ok.is_empty()
            && self.other.is_empty()
            && self.waited.is_empty()
            && self.outputs.is_empty()
            && self.next_worker.is_none()
    }

    /// Whether entries other than task ends wait (submissions, extensions, cancels).
    pub fn has_inputs(&self) -> bool {
        !self.rows.is_empty()
    }

    pub fn clear(&mut self) {
        self.rows.clear();
        self.row_jobs.clear();
        self.forgotten.clear();
        self.next_job = None;
        self.ok.clear();
        self.other.clear();
        self.waited.clear();
        self.ok_workers.clear();
        self.other_workers.clear();
        self.outputs.clear();
        self.next_worker = None;
    }

    /// Notes that worker ids up to `id` have been given out.
    pub fn worker_id_given(&mut self, id: WorkerId) {
        let next = id.saturating_add(1);
        self.next_worker = Some(self.next_worker.map_or(next, |n| n.max(next)));
    }

    pub fn submit(
        &mut self,
        job: JobId,
        at_us: u64,
        key: Option<String>,
        spec: &JobSpec,
        tasks: &TaskSet,
        open: bool,
    ) {
        // Serialize borrowed values without cloning the (possibly large) task list.
        #[derive(Serialize)]
        struct SubmitRef<'a> {
            job: JobId,
            at_us: u64,
            key: Option<String>,
            #[serde(with = "JobSpecDef")]
            spec: &'a JobSpec,
            #[serde(with = "TaskSetDef")]
            tasks: &'a TaskSet,
            open: bool,
        }
        self.push(
            KIND_SUBMIT,
            Some(job),
            &SubmitRef {
                job,
                at_us,
                key,
                spec,
                tasks,
                open,
            },
        );
    }

    /// The tasks an extension added to a job: those of `tasks` (the job's, after it) from
    /// index `from` on.
    pub fn extend(&mut self, job: JobId, at_us: u64, tasks: &TaskSet, from: usize, close: bool) {
        /// Lines `from..` of a list, written as a list without copying them.
        struct LinesFrom<'a>(&'a LineList, usize);
        impl Serialize for LinesFrom<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                // By index: `iter().skip(n)` would walk the n lines before (a piece of a
                // streamed `--each` job would cost the whole job so far).
                let LinesFrom(lines, from) = *self;
                s.collect_seq((from..lines.len()).map(|i| lines.get(i).unwrap_or_default()))
            }
        }
        #[derive(Serialize)]
        struct ExtendRef<'a> {
            job: JobId,
            at_us: u64,
            argvs: &'a [Vec<String>],
            close: bool,
            lines: LinesFrom<'a>,
        }
        let none = LineList::new();
        let (argvs, lines) = match tasks {
            TaskSet::List(l) => (l.get(from..).unwrap_or(&[]), LinesFrom(&none, 0)),
            TaskSet::Lines(l) => (&[][..], LinesFrom(l, from)),
            TaskSet::Array(_) => (&[][..], LinesFrom(&none, 0)),
        };
        self.push(
            KIND_EXTEND,
            Some(job),
            &ExtendRef {
                job,
                at_us,
                argvs,
                close,
                lines,
            },
        );
    }

    pub fn cancel(&mut self, job: JobId, at_us: u64) {
        self.push(KIND_CANCEL, Some(job), &CancelBody { job, at_us });
    }

    pub fn retry(&mut self, job: JobId, at_us: u64, failed_only: bool) {
        self.push(
            KIND_RETRY,
            Some(job),
            &RetryBody {
                job,
                at_us,
                failed_only,
            },
        );
    }

    pub fn give_up(
        &mut self,
        job: JobId,
        index: TaskIndex,
        at_us: u64,
        failure: kestrel_core::Failure,
    ) {
        self.push(
            KIND_GIVE_UP,
            Some(job),
            &GiveUpBody {
                job,
                index,
                at_us,
                failure,
            },
        );
    }

    /// Tasks re-queued after a lost worker: one row per job (in the order the jobs first
    /// appear), so each goes with its job when that is forgotten.
    pub fn lost(&mut self, tasks: Vec<(JobId, TaskIndex)>) {
        for (job, tasks) in by_job(tasks, |t| t.0) {
            self.push(KIND_LOST, Some(job), &LostBody { tasks });
        }
    }

    /// Jobs forgotten: a FORGET entry (what an older journal's rows of them need at replay),
    /// and every row of theirs deleted when the batch is written.
    pub fn forget(&mut self, jobs: Vec<JobId>, at_us: u64) {
        self.forgotten.extend_from_slice(&jobs);
        self.push(KIND_FORGET, None, &ForgetBody { jobs, at_us });
    }

    /// A worker's summed wait for a slot of a job's successful tasks (journaled with the
    /// batch's task ends, one pair per job).
    pub fn slot_wait(&mut self, job: JobId, waited_us: u64) {
        match self.waited.iter_mut().rev().find(|(j, _)| *j == job) {
            // From a worker's report: summed without overflowing, as core sums it.
            Some((_, sum)) => *sum = sum.saturating_add(waited_us),
            None => self.waited.push((job, waited_us)),
        }
    }

    /// An accepted task report, with when the task had been assigned (for its timing) and
    /// the worker that ran it.
    pub fn task_end(&mut self, f: Finished, assigned_us: u64, worker: WorkerId) {
        if f.end == kestrel_core::RunEnd::Success {
            self.ok
                .push((f.job, f.index, assigned_us, f.started_us, f.finished_us));
            one_more(&mut self.ok_workers, worker);
        } else {
            self.other.push((f, assigned_us));
            one_more(&mut self.other_workers, worker);
        }
    }

    pub(super) fn push<T: Serialize>(&mut self, kind: i64, job: Option<JobId>, body: &T) {
        if kind != KIND_ENDS {
            // Task ends gathered so far happened before this input: keep that order in the log,
            // or a replayed retry could run before the failure it retries.
            self.seal_ends();
        }
        match rmp_serde::to_vec(body) {
            Ok(b) => {
                self.rows.push((kind, b));
                self.row_jobs.push(job);
            }
            // Encoding plain data into a Vec cannot fail; if it ever did, the entry would be
            // missing from the journal, so say so loudly.
            Err(e) => tracing::error!("cannot encode a journal entry: {e}"),
        }
    }

    /// Turns the gathered task ends into rows, one per job (in the order the jobs first
    /// appear), so that a forgotten job's ends can be deleted with it (call just before
    /// writing, and before any other entry).
    pub(super) fn seal_ends(&mut self) {
        if self.ok.is_empty() && self.other.is_empty() && self.waited.is_empty() {
            return;
        }
        let ok = std::mem::take(&mut self.ok);
        let other = std::mem::take(&mut self.other);
        let waited = std::mem::take(&mut self.waited);
        let ok_workers = std::mem::take(&mut self.ok_workers);
        let other_workers = std::mem::take(&mut self.other_workers);
        let one_job = {
            let mut jobs = ok
                .iter()
                .map(|t| t.0)
                .chain(other.iter().map(|(f, _)| f.job))
                .chain(waited.iter().map(|w| w.0));
            let first = jobs.next();
            first.filter(|&j| jobs.all(|k| k == j))
        };
        if let Some(job) = one_job {
            // The common case (ends come in runs of one job): one row, as always. The buffer
            // goes back for the next batch's ends, its room kept.
            self.seal_ends_of(job, &ok, other, waited, ok_workers, other_workers);
            let mut ok = ok;
            ok.clear();
            self.ok = ok;
            return;
        }
        // Each end with its worker, then split by job, each job's ends in their order.
        let ok_w: Vec<WorkerId> = each_worker(&ok_workers).take(ok.len()).collect();
        let other_w: Vec<WorkerId> = each_worker(&other_workers).take(other.len()).collect();
        #[derive(Default)]
        struct OfJob {
            ok: Vec<(JobId, TaskIndex, u64, u64, u64)>,
            other: Vec<(Finished, u64)>,
            waited: Vec<(JobId, u64)>,
            ok_workers: Vec<(WorkerId, u32)>,
            other_workers: Vec<(WorkerId, u32)>,
        }
        let mut order: Vec<JobId> = Vec::new();
        let mut groups: rustc_hash::FxHashMap<JobId, OfJob> = Default::default();
        for (t, w) in ok.into_iter().zip(ok_w) {
            let g = groups.entry(t.0).or_insert_with(|| {
                order.push(t.0);
                OfJob::default()
            });
            g.ok.push(t);
            one_more(&mut g.ok_workers, w);
        }
        for (t, w) in other.into_iter().zip(other_w) {
            let job = t.0.job;
            let g = groups.entry(job).or_insert_with(|| {
                order.push(job);
                OfJob::default()
            });
            g.other.push(t);
            one_more(&mut g.other_workers, w);
        }
        for w in waited {
            let g = groups.entry(w.0).or_insert_with(|| {
                order.push(w.0);
                OfJob::default()
            });
            g.waited.push(w);
        }
        for job in order {
            if let Some(g) = groups.remove(&job) {
                self.seal_ends_of(job, &g.ok, g.other, g.waited, g.ok_workers, g.other_workers);
            }
        }
    }

    /// One ENDS row of `job`'s ends.
    fn seal_ends_of(
        &mut self,
        job: JobId,
        ok: &[(JobId, TaskIndex, u64, u64, u64)],
        other: Vec<(Finished, u64)>,
        waited: Vec<(JobId, u64)>,
        ok_workers: Vec<(WorkerId, u32)>,
        other_workers: Vec<(WorkerId, u32)>,
    ) {
        let base_us = ok.first().map_or(0, |t| t.2);
        // Start and end times come from workers' clocks: any u64. Clamped, never overflowed; a
        // time more than 292 years from the batch's first assignment reads back as that far.
        let off = |t: u64| {
            (i128::from(t) - i128::from(base_us)).clamp(i64::MIN.into(), i64::MAX.into()) as i64
        };
        let mut workers = ok_workers;
        for (w, n) in other_workers {
            match workers.last_mut() {
                Some((last, m)) if *last == w => *m += n,
                _ => workers.push((w, n)),
            }
        }
        let body = EndsBody {
            base_us,
            ok: Vec::new(),
            other,
            waited,
            workers,
            job,
            packed: pack_successes(
                ok.iter()
                    .map(|&(j, i, a, s, f)| (j, i, off(a), off(s), off(f))),
            ),
        };
        self.push(KIND_ENDS, Some(job), &body);
    }
}

/// Counts one more end of `worker` in `runs`.
fn one_more(runs: &mut Vec<(WorkerId, u32)>, worker: WorkerId) {
    match runs.last_mut() {
        Some((w, n)) if *w == worker => *n += 1,
        _ => runs.push((worker, 1)),
    }
}

/// `items` split by the job `job_of` names, each job's in their order, the jobs in the order
/// they first appear.
fn by_job<T>(items: Vec<T>, job_of: impl Fn(&T) -> JobId) -> Vec<(JobId, Vec<T>)> {
    let mut out: Vec<(JobId, Vec<T>)> = Vec::new();
    for item in items {
        let job = job_of(&item);
        // Few jobs per entry: a look back is cheaper than a map.
        match out.iter_mut().rev().find(|(j, _)| *j == job) {
            Some((_, v)) => v.push(item),
            None => out.push((job, vec![item])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::{Failure, RunEnd};

    #[test]
    fn sealed_ends_read_back_as_the_reports_they_were() {
        let mut p = Pending::default();
        let ok = |index, started_us, finished_us| Finished {
            job: 3,
            index,
            started_us,
            finished_us,
            end: RunEnd::Success,
        };
        // The second ends before it starts (a clock step) and before the base time.
        p.task_end(ok(1, 1_500, 2_000), 1_200, 3);
        p.task_end(ok(2, 900, 800), 700, 3);
        let failed = Finished {
            end: RunEnd::Failed(Box::new(Failure::because("exit code 1"))),
            ..ok(4, 10, 20)
        };
        p.task_end(failed.clone(), 5, 3);
        p.slot_wait(3, 7);
        p.slot_wait(3, 5);
        p.seal_ends();
        assert_eq!(p.rows.len(), 1);
        let (kind, body) = &p.rows[0];
        let Ok(Entry::Ends(b)) = Entry::decode(*kind, body) else {
            panic!("not task ends");
        };
        let successes: Vec<_> = b.successes().collect();
        assert_eq!(
            successes,
            vec![(ok(1, 1_500, 2_000), 1_200), (ok(2, 900, 800), 700)]
        );
        assert_eq!(b.other, vec![(failed, 5)]);
        assert_eq!(b.waited, vec![(3, 12)], "one sum per job");
    }

    #[test]
    fn ends_of_several_jobs_are_one_row_per_job_each_with_its_workers() {
        let mut p = Pending::default();
        let end = |job, index| Finished {
            job,
            index,
            started_us: 10,
            finished_us: 20,
            end: RunEnd::Success,
        };
        p.task_end(end(1, 0), 5, 7);
        p.task_end(end(2, 0), 5, 7);
        p.task_end(end(1, 1), 5, 9);
        let failed = Finished {
            end: RunEnd::Failed(Box::new(Failure::because("exit code 1"))),
            ..end(2, 1)
        };
        p.task_end(failed, 5, 9);
        p.slot_wait(2, 3);
        p.lost(vec![(1, 4), (2, 5), (1, 6)]);
        assert_eq!(p.row_jobs, vec![Some(1), Some(2), Some(1), Some(2)]);
        let decoded: Vec<Entry> = p
            .rows
            .iter()
            .map(|(kind, body)| Entry::decode(*kind, body).unwrap())
            .collect();
        let [Entry::Ends(one), Entry::Ends(two), Entry::Lost(l1), Entry::Lost(l2)] = &decoded[..]
        else {
            panic!("two ENDS rows and two LOST rows");
        };
        let idx: Vec<_> = one.successes().map(|(f, _)| (f.job, f.index)).collect();
        assert_eq!(idx, vec![(1, 0), (1, 1)]);
        assert_eq!(one.workers, vec![(7, 1), (9, 1)]);
        assert_eq!((two.ok.len(), two.other.len()), (1, 1));
        assert_eq!(two.workers, vec![(7, 1), (9, 1)]);
        assert_eq!(two.waited, vec![(2, 3)]);
        assert!(one.waited.is_empty());
        assert_eq!(l1.tasks, vec![(1, 4), (1, 6)]);
        assert_eq!(l2.tasks, vec![(2, 5)]);
    }

    #[test]
    fn a_worker_clock_at_the_ends_of_u64_is_journaled_without_overflow() {
        let mut p = Pending::default();
        let end = |started_us, finished_us| Finished {
            job: 1,
            index: 0,
            started_us,
            finished_us,
            end: RunEnd::Success,
        };
        p.task_end(end(1 << 63, 0), 1_000, 3);
        p.task_end(end(0, u64::MAX), 1_000, 3);
        p.seal_ends();
        let (kind, body) = &p.rows[0];
        let Ok(Entry::Ends(b)) = Entry::decode(*kind, body) else {
            panic!("not task ends");
        };
        let back: Vec<_> = b
            .successes()
            .map(|(f, _)| (f.started_us, f.finished_us))
            .collect();
        assert_eq!(back, vec![(i64::MAX as u64, 0), (0, i64::MAX as u64)]);
    }

    #[test]
    fn an_entry_of_an_unknown_kind_is_named_not_guessed() {
        let Err(e) = Entry::decode(99, &[0x90]) else {
            panic!("kind 99 decoded");
        };
        assert!(e.contains("unknown entry kind 99"), "{e}");
    }

    #[test]
    fn an_ends_entry_of_schema_4_reads_with_unknown_workers() {
        // The ENDS entry of `entries_are_written_as_they_always_were` as schema 4 wrote it.
        let hex = "94cd076c919507020064cd02589292950702cd07d0cd09c481a1469403c0ab6578697420636f64652033a4626f6f6dcd079e92950702cd07d0cd09c4a143cd07a891920728";
        let body = hex::decode(hex).unwrap();
        let Ok(Entry::Ends(b)) = Entry::decode(KIND_ENDS, &body) else {
            panic!("an old ENDS entry no longer reads");
        };
        assert_eq!((b.ok.len(), b.other.len()), (1, 2));
        assert!(b.workers.is_empty());
        let workers: Vec<WorkerId> = each_worker(&b.workers).take(3).collect();
        assert_eq!(workers, vec![0, 0, 0]);
    }

    #[test]
    fn the_workers_of_a_batch_of_ends_are_runs_over_its_successes_then_the_rest() {
        let mut p = Pending::default();
        let end = |index, end| Finished {
            job: 1,
            index,
            started_us: 10,
            finished_us: 20,
            end,
        };
        let failed = || RunEnd::Failed(Box::new(Failure::because("exit code 1")));
        p.task_end(end(0, RunEnd::Success), 5, 7);
        p.task_end(end(1, failed()), 5, 7);
        p.task_end(end(2, RunEnd::Success), 5, 7);
        p.task_end(end(3, RunEnd::Success), 5, 9);
        p.task_end(end(4, failed()), 5, 9);
        p.seal_ends();
        let (kind, body) = &p.rows[0];
        let Ok(Entry::Ends(b)) = Entry::decode(*kind, body) else {
            panic!("not task ends");
        };
        // Successes 0, 2 (worker 7), 3 (9); then failures 1 (7), 4 (9).
        assert_eq!(b.workers, vec![(7, 2), (9, 1), (7, 1), (9, 1)]);
        let each: Vec<WorkerId> = each_worker(&b.workers).take(5).collect();
        assert_eq!(each, vec![7, 7, 9, 7, 9]);
    }

    /// Every kind of entry, as bytes. The journal outlives the binary that wrote it, so these
    /// bytes are its schema: a change that alters them fails here (and must keep the old ones
    /// readable). The encodings of core's types come from `kestrel_proto::wire`.
    #[test]
    fn entries_are_written_as_they_always_were() {
        let mut spec = JobSpec::command("sweep", vec!["sim".into(), "{task}".into()]);
        spec.template.env = vec![("K".into(), "v".into())];
        spec.template.cwd = Some("/scratch/{job}".into());
        spec.template.stdout = kestrel_core::Sink::File("out.{task}".into());
        spec.template.stderr = kestrel_core::Sink::Stream { limit: 4096 };
        spec.template.timeout_ms = Some(60_000);
        spec.resources.cpus = 2;
        spec.resources.mem = 1 << 30;
        spec.priority = -1;
        spec.retries = 3;
        spec.named = vec![("licenses".into(), 1)];
        let array = TaskSet::Array(kestrel_core::IdRanges::parse("1-5,9,20-30:5").unwrap());
        let lines = TaskSet::Lines(["a.fits", "b c.fits"].into_iter().collect());
        let list = TaskSet::List(vec![vec!["echo".into(), "1".into()], vec!["true".into()]]);
        let mut p = Pending::default();
        p.submit(7, 1_000, Some("key".into()), &spec, &array, false);
        p.submit(
            8,
            1_001,
            None,
            &JobSpec::command("l", vec!["x".into()]),
            &lines,
            true,
        );
        p.extend(8, 1_002, &lines, 1, false);
        p.submit(9, 1_003, None, &JobSpec::command("c", vec![]), &list, true);
        p.extend(9, 1_004, &list, 1, true);
        let ok = Finished {
            job: 7,
            index: 2,
            started_us: 2_000,
            finished_us: 2_500,
            end: RunEnd::Success,
        };
        p.task_end(ok.clone(), 1_900, 3);
        let failed = Failure {
            exit_code: Some(3),
            signal: None,
            reason: "exit code 3".into(),
            stderr_tail: "boom".into(),
            permanent: false,
        };
        let end = |end| Finished { end, ..ok.clone() };
        p.task_end(end(RunEnd::Failed(Box::new(failed.clone()))), 1_950, 3);
        p.task_end(end(RunEnd::Canceled), 1_960, 3);
        p.slot_wait(7, 40);
        p.cancel(9, 3_000);
        p.retry(7, 3_001, true);
        p.give_up(7, 4, 3_002, Failure::because("lost with 3 workers"));
        p.lost(vec![(7, 1), (7, 3)]);
        p.forget(vec![8, 9], 3_003);
        let hex: Vec<String> = p
            .rows
            .iter()
            .map(|(kind, body)| {
                let bytes: String = body.iter().map(|b| format!("{b:02x}")).collect();
                format!("{kind}:{bytes}")
            })
            .collect();
        // Written by the journal of 6c03047, before core's types lost their serde derives;
        // task ends name their workers since schema 5 (the last element of the ENDS entry,
        // see `an_ends_entry_of_schema_4_reads_with_unknown_workers`), and pack their
        // successes since schema 8 (see `an_ends_entry_of_schema_7_reads_as_it_did`).
        #[rustfmt::skip]
        let expected: &[&str] = &[
            "1:9607cd03e8a36b657996a573776565709692a373696da67b7461736b7d9192a14ba176ae2f736372617463682f7b6a6f627d81a446696c65aa6f75742e7b7461736b7d81a653747265616d91cd1000cdea60930200ce40000000ff039192a86c6963656e7365730181a5417272617993930105019309010193140305c2",
            "1:9608cd03e9c096a16c9691a17890c0a44e756c6ca44e756c6cc09301000000009081a54c696e657392a6612e66697473a86220632e66697473c3",
            "2:9508cd03ea90c291a86220632e66697473",
            "1:9609cd03ebc096a163969090c0a44e756c6ca44e756c6cc09301000000009081a44c6973749292a46563686fa13191a474727565c3",
            "2:9509cd03ec9191a474727565c390",
            "4:97cd076c909292950702cd07d0cd09c481a1469403c0ab6578697420636f64652033a4626f6f6dcd079e92950702cd07d0cd09c4a143cd07a8919207289192030307c406020064cd01f4",
            "3:9209cd0bb8",
            "5:9307cd0bb9c3",
            "6:940704cd0bba94c0c0b36c6f73742077697468203320776f726b657273a0",
            "7:9192920701920703",
            "8:92920809cd0bbb",
        ];
        assert_eq!(hex, expected, "journal entries changed their bytes");
        for (kind, body) in &p.rows {
            assert!(Entry::decode(*kind, body).is_ok(), "kind {kind} reads back");
        }
    }

    /// The ENDS entry above as schema 7 wrote it (successes as tuples) reads back as the packed
    /// one does.
    #[test]
    fn an_ends_entry_of_schema_7_reads_as_it_did() {
        let row = |h: &str| hex::decode(h).unwrap();
        let old = row("95cd076c919507020064cd02589292950702cd07d0cd09c481a1469403c0ab6578697420636f64652033a4626f6f6dcd079e92950702cd07d0cd09c4a143cd07a89192072891920303");
        let new = row("97cd076c909292950702cd07d0cd09c481a1469403c0ab6578697420636f64652033a4626f6f6dcd079e92950702cd07d0cd09c4a143cd07a8919207289192030307c406020064cd01f4");
        let ends = |body: &[u8]| {
            let Ok(Entry::Ends(b)) = Entry::decode(KIND_ENDS, body) else {
                panic!("not task ends");
            };
            let ok: Vec<(Finished, u64)> = b.successes().collect();
            (ok, b.other.len(), b.waited.clone(), b.workers.clone())
        };
        let (ok, others, waited, workers) = ends(&old);
        assert_eq!(ok.len(), 1);
        assert_eq!(
            (
                ok[0].0.index,
                ok[0].0.started_us,
                ok[0].0.finished_us,
                ok[0].1
            ),
            (2, 2_000, 2_500, 1_900)
        );
        assert_eq!(
            (others, waited.clone(), workers.clone()),
            (2, vec![(7, 40)], vec![(3, 3)])
        );
        assert_eq!(ends(&new), (ok, others, waited, workers));
    }

    proptest::proptest! {
        /// Any successes, times anywhere in u64 (offsets clamped as `seal_ends` does), read back
        /// as they were written.
        #[test]
        fn packed_successes_read_back_as_written(
            ends in proptest::collection::vec(
                (0u32..u32::MAX, proptest::num::i64::ANY, proptest::num::i64::ANY, proptest::num::i64::ANY),
                0..64,
            )
        ) {
            let ok: Vec<_> = ends.iter().map(|&(i, a, s, f)| (5, i, a, s, f)).collect();
            let packed = pack_successes(ok.iter().copied());
            proptest::prop_assert_eq!(unpack_successes(5, &packed), Ok(ok));
        }
    }

    /// Packed successes cut short, or with a value that is not an integer, are an error, not
    /// a panic or made-up ends.
    #[test]
    fn damaged_packed_successes_are_refused() {
        let packed = pack_successes([(1, 3, 10, 20, 30), (1, 4, 11, 21, 31)].into_iter());
        assert!(unpack_successes(1, &packed[..packed.len() - 1]).is_err());
        assert!(unpack_successes(1, &[0xc0]).is_err());
        // The second task's four differences are one byte each: its index, u32::MAX + 127.
        let mut too_big =
            pack_successes([(1, u32::MAX, 0, 0, 0), (1, u32::MAX, 0, 0, 0)].into_iter());
        let at = too_big.len() - 4;
        too_big[at] = 0x7f;
        assert!(unpack_successes(1, &too_big).is_err());
    }

    /// A job of multi-node tasks with task dependencies (version 11): its two trailing fields
    /// are journaled and read back; a job without them is written as before (above).
    #[test]
    fn nodes_and_task_deps_are_journaled_and_read_back() {
        let mut spec = JobSpec::command("mpi", vec!["run".into()]);
        spec.nodes = 2;
        spec.deps = vec![kestrel_core::TaskDeps {
            task: 1,
            on: vec![
                kestrel_core::TaskRef { job: None, task: 0 },
                kestrel_core::TaskRef {
                    job: Some(3),
                    task: 4,
                },
            ],
        }];
        let list = TaskSet::List(vec![vec!["a".into()], vec!["b".into()]]);
        let mut p = Pending::default();
        p.submit(7, 1_000, None, &spec, &list, false);
        let (kind, body) = &p.rows[0];
        let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            format!("{kind}:{hex}"),
            "1:9607cd03e8c09ba36d70699691a372756e90c0a44e756c6ca44e756c6cc09301000000009093c0c0c090c0029192019292c00092030481a44c6973749291a16191a162c2",
            "journal entry changed its bytes"
        );
        let Ok(Entry::Submit(back)) = Entry::decode(*kind, body) else {
            panic!("a submission reads back");
        };
        assert_eq!(back.spec, spec);
    }
}
