//! Durability: what goes into the journal and when.
//!
//! The scheduler's records of each event are gathered into the pending batch right after the
//! event (their order is the journal's). The journal's writer thread commits the batches (see
//! [`crate::journal::Writer`]), one at a time, in order. A batch's inputs (submissions,
//! extensions, cancels, ...) are committed, and waited for, before its scheduling pass, so no
//! task of a job goes out before the job is durable; task ends alone may gather for a few
//! milliseconds, and their commit runs while the engine goes on. Replies that promise
//! something the journal must hold wait for the commit that holds it.

use super::{ConnId, Engine};
use crate::journal::{Done, Journal, Pending, Writer};
use crate::outputs::OutputLog;
use kestrel_core::{Event, JobId, Record, RunEnd};
use kestrel_proto::messages::{Answer, Refusal, TaskOutput};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;
use std::time::Duration;

/// How long accepted task ends may wait for a journal commit when nothing else needs one. The
/// commit runs on the writer thread, one at a time, so a short wait costs the engine nothing
/// and shortens the tail of a job (its wait is answered once its last ends are committed):
/// 1M no-op tasks took 124 ms with 20 ms, 110–113 ms with 5 ms or 1 ms (issue 32). 5 ms keeps
/// the syncs of a slow disk fewer.
const ENDS_COMMIT_EVERY: Duration = Duration::from_millis(5);

/// The journal, and what waits for its next commit.
#[derive(Default)]
pub(super) struct Durability {
    /// The journal, when kept, for reads (outputs, sizes); entries of the current batch wait
    /// in `pending`.
    pub(super) journal: Option<Journal>,
    /// The thread that commits batches, with a connection of its own (none for a read-only
    /// record).
    pub(super) writer: Option<Writer>,
    pub(super) pending: Box<Pending>,
    /// Commits handed to the writer and not yet carried out, oldest first.
    in_flight: VecDeque<InFlight>,
    /// An emptied batch given back by the writer, for the next one.
    spare: Option<Box<Pending>>,
    /// Rows in the log, as the writer last counted them.
    pub(super) rows: u64,
    /// Why the journal's last commit failed; new work is refused until one succeeds again
    /// (after `job forget` made room, or disk space was freed).
    pub(super) error: Option<String>,
    /// The `next_job` the journal holds (job ids below it were given out).
    next_job_kept: Option<JobId>,
    /// Jobs whose submission never reached the journal (withdrawn): nothing of theirs is
    /// journaled afterwards.
    unjournaled: rustc_hash::FxHashSet<JobId>,
    /// Why nothing may change: the journal is the record of a finished run, only read (see
    /// [`crate::record`]).
    pub(super) read_only: Option<String>,
    /// Client replies held until the batch's journal entries are committed.
    deferred: Vec<Deferred>,
    /// Jobs with task ends in the pending transaction.
    ends_pending: FxHashSet<JobId>,
    /// Jobs some of whose task ends a failed commit dropped: those tasks run again after a
    /// restart, so a wait for such a job is not told it ended as if that were durable.
    ends_lost: rustc_hash::FxHashSet<JobId>,
    /// When the journal was last committed, on the engine's clock.
    last_commit_us: u64,
    /// The scheduler's records being journaled, a buffer kept from one event to the next.
    records: Vec<Record>,
}

impl Durability {
    /// Whether inputs are journaled: also while the journal is full (each commit tries again,
    /// and a forget, which makes room, gets in).
    pub(super) fn journaling(&self) -> bool {
        self.writer.is_some() && self.read_only.is_none()
    }

    /// Whether everything gathered is committed (or nothing is journaled).
    pub(super) fn settled(&self) -> bool {
        self.in_flight.is_empty() && self.pending.is_empty()
    }

    /// Notified when the writer carried out a commit (none without a writer).
    pub(super) fn wake(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        self.writer.as_ref().map(Writer::wake)
    }

    /// What the journal held of job ids at start (see [`Engine::attach_journal`]).
    pub(super) fn kept_next_job(&mut self, next: Option<JobId>) {
        self.next_job_kept = next;
    }

    /// A retry is refused while the journal cannot be written: it could not be made durable,
    /// nor taken back. (A submission or a piece of one is tried instead: if its commit fails,
    /// it is withdrawn and its submitter told why; if it fits, the journal works again.)
    pub(super) fn accepting_work(&self) -> Result<(), String> {
        match self.read_only.as_ref().or(self.error.as_ref()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Holds a reply until the next commit (see [`Engine::commit`]); `created` names the job
    /// it reports created (with its submission key, to withdraw if the commit fails) or
    /// extended (to cancel then).
    pub(super) fn hold(
        &mut self,
        conn: ConnId,
        id: u64,
        result: Result<Answer, Refusal>,
        created: Option<(JobId, Option<String>)>,
    ) {
        self.deferred.push(Deferred {
            conn,
            id,
            result,
            created,
            waited: Vec::new(),
        });
    }

    /// Holds a wait's `WaitDone` for the `jobs` it waited for, until the next commit: if the
    /// journal could not record how those jobs ended, the wait gets an error instead.
    pub(super) fn hold_wait(
        &mut self,
        conn: ConnId,
        id: u64,
        result: Result<Answer, Refusal>,
        jobs: Vec<JobId>,
    ) {
        self.deferred.push(Deferred {
            conn,
            id,
            result,
            created: None,
            waited: jobs,
        });
    }
}

/// A commit handed to the writer, with what waits for it.
struct InFlight {
    /// Replies released when it is carried out.
    deferred: Vec<Deferred>,
    /// Jobs with task ends in it.
    ends: FxHashSet<JobId>,
    /// The `next_job` it keeps.
    next_job: JobId,
    /// Whether it holds inputs (submissions, ...), withdrawn if it fails.
    inputs: bool,
}

/// A reply held back until the journal commit that makes it true.
struct Deferred {
    conn: ConnId,
    id: u64,
    result: Result<Answer, Refusal>,
    /// A job this batch created, with its submission key (withdrawn if the commit fails), or
    /// extended.
    created: Option<(JobId, Option<String>)>,
    /// The jobs a `WaitDone` reports ended.
    waited: Vec<JobId>,
}

impl Deferred {
    /// Whether the reply promises something the journal must hold first: a job created or
    /// extended, or a finished job (`WaitDone`). A query's answer may go out before the task
    /// ends it shows are synced: after a crash they run again (at-least-once), so nothing
    /// promised is lost, and a client polling `job list` does not force a sync each time.
    fn needs_durability(&self) -> bool {
        matches!(
            self.result,
            Ok(Answer::Submitted { .. }
                | Answer::Extended
                | Answer::WaitDone(_)
                | Answer::Forgotten(_))
        )
    }
}

impl Engine {
    /// Hands the batch's journal entries to the writer when a commit is due, and sends the
    /// replies that can go: those that promise nothing at once, the others once the commit
    /// holding what they promise is carried out. `force` (and inputs, and watched ends) waits
    /// for that commit; task ends alone gather for [`ENDS_COMMIT_EVERY`] and are committed one
    /// batch at a time while the engine goes on. A failed commit withdraws the jobs it created
    /// and their submitters are told why (unless the journal was only full and kept the
    /// batch's inputs), and no new work is accepted until a commit succeeds again.
    pub(super) fn commit(&mut self, force: bool) {
        self.collect_commits();
        let now = self.now();
        self.journal_records(now);
        let next_job = self.core.next_job_id();
        // Watched ends promise durability as a `WaitDone` does, and are awaited within a
        // millisecond: they do not wait for ends to gather.
        let watched = self.watch.due(&self.core);
        let d = &mut self.durable;
        let wait = force || watched || d.pending.has_inputs();
        // Task ends alone promise nothing to anyone (a lost one only means a re-run), so they
        // may gather for a few milliseconds: fewer syncs under a flood of tiny tasks.
        let due = wait
            || d.deferred.iter().any(Deferred::needs_durability)
            // Either way: a step back of the wall clock must not hold ends back.
            || now.abs_diff(d.last_commit_us) >= ENDS_COMMIT_EVERY.as_micros() as u64;
        // One commit of ends at a time: while one is carried out the next batch gathers.
        let sent = due && (wait || d.in_flight.is_empty()) && self.hand_over(now, next_job);
        let d = &mut self.durable;
        // Replies that promise nothing go now; the others with the commit that holds what they
        // promise: this one, or the last one handed over if nothing is gathered since.
        let (held, now_free): (Vec<Deferred>, Vec<Deferred>) = std::mem::take(&mut d.deferred)
            .into_iter()
            .partition(|x| x.needs_durability() && d.journaling());
        let mut free = now_free;
        match (sent, d.in_flight.back_mut()) {
            (true, Some(last)) => last.deferred.extend(held),
            (false, Some(last)) if d.pending.is_empty() => last.deferred.extend(held),
            (false, Some(_)) => d.deferred = held,
            (_, None) => free.extend(held),
        }
        self.unconfirm_waits(&mut free);
        for x in free {
            self.conns.send_now(x.conn, x.id, x.result);
        }
        if wait {
            self.await_commits();
        }
        // Watched ends go once the journal holds them (or at once without a journal), after
        // the replies (a `Watching` comes before the ends it watches).
        if !self.durable.journaling() || self.durable.settled() {
            self.flush_watches();
        }
    }

    /// Hands the pending batch to the writer, if there is anything to write; whether it did.
    fn hand_over(&mut self, now: u64, next_job: JobId) -> bool {
        let d = &mut self.durable;
        let Some(writer) = d.writer.as_ref().filter(|_| d.read_only.is_none()) else {
            return false;
        };
        // Ids given out are kept, so none is given out again after a restart (a job whose
        // rows went with `job forget`, or one withdrawn, leaves no other trace).
        if d.next_job_kept.is_none_or(|kept| kept < next_job) {
            d.pending.next_job = Some(next_job);
        }
        if d.pending.is_empty() {
            return false;
        }
        d.last_commit_us = now;
        let inputs = d.pending.has_inputs();
        let next = d.spare.take().unwrap_or_default();
        let batch = std::mem::replace(&mut d.pending, next);
        let flight = InFlight {
            deferred: Vec::new(),
            ends: std::mem::take(&mut d.ends_pending),
            next_job,
            inputs,
        };
        if writer.commit(batch) {
            d.in_flight.push_back(flight);
            return true;
        }
        // The writer thread is gone (it panicked): as a failed commit.
        let done = writer_gone(d.rows);
        d.in_flight.push_back(flight);
        self.commit_done(done);
        false
    }

    /// Takes in the commits the writer carried out, without waiting.
    pub(super) fn collect_commits(&mut self) {
        while let Some(done) = self.durable.writer.as_ref().and_then(Writer::try_done) {
            self.commit_done(done);
        }
    }

    /// Waits until the writer did everything handed over (commits and compaction), and takes
    /// in the commits: tests step the engine as if commits were instant.
    #[cfg(test)]
    pub(super) fn sync_journal(&mut self) {
        if let Some(w) = &self.durable.writer {
            w.barrier();
        }
        self.await_commits();
    }

    /// Waits until every commit handed over is carried out.
    fn await_commits(&mut self) {
        while !self.durable.in_flight.is_empty() {
            match self.durable.writer.as_ref().and_then(Writer::wait_done) {
                Some(done) => self.commit_done(done),
                None => {
                    // The writer is gone with them: their replies say so.
                    self.commit_done(writer_gone(self.durable.rows));
                }
            }
        }
    }

    /// A commit carried out (the oldest handed over): what it made true, or what its failure
    /// takes back; then the replies that waited for it.
    fn commit_done(&mut self, done: Done) {
        let d = &mut self.durable;
        let Some(mut flight) = d.in_flight.pop_front() else {
            return;
        };
        d.rows = done.rows;
        d.spare = Some(done.pending);
        let mut failed = None;
        match done.result {
            Ok(()) => {
                d.next_job_kept = d.next_job_kept.max(Some(flight.next_job));
                if let Some(was) = d.error.take() {
                    tracing::info!(
                        "the journal is written again; new work is accepted (it had failed: {was})"
                    );
                }
            }
            Err(e) => {
                // Ends are kept only by a whole commit: one refused for want of room keeps
                // the batch's inputs without them.
                d.ends_lost.extend(flight.ends.iter().copied());
                if e.inputs_kept {
                    d.next_job_kept = d.next_job_kept.max(Some(flight.next_job));
                }
                if d.error.is_none() {
                    tracing::error!("{}; work that does not fit is refused, and retries are, until it can be written again", e.msg);
                }
                d.error = Some(e.msg.clone());
                // Their ends are not durable: a watch of them is not told they are.
                for &job in &flight.ends {
                    let why = format!(
                        "the journal could not record how some tasks of job {job} ended ({}), so a restart of the server would run them again; the watch of job {job} ends",
                        e.msg
                    );
                    self.watch.end(job, why, true);
                }
                if !e.inputs_kept && flight.inputs {
                    failed = Some(e.msg);
                }
            }
        }
        if let Some(msg) = failed {
            self.withdraw_unjournaled(&msg, &mut flight.deferred);
        }
        self.unconfirm_waits(&mut flight.deferred);
        for x in flight.deferred {
            self.conns.send_now(x.conn, x.id, x.result);
        }
        if self.durable.settled() {
            self.flush_watches();
        }
    }

    /// A held `WaitDone` for a job whose task ends the journal did not record (in a failed
    /// commit) becomes an error: the jobs did end, but a restart would run those tasks again,
    /// and the client must not take it as durable.
    fn unconfirm_waits(&self, replies: &mut [Deferred]) {
        let d = &self.durable;
        if d.ends_lost.is_empty() {
            return;
        }
        let why = d
            .error
            .as_deref()
            .unwrap_or("an earlier write of the journal failed");
        for w in replies.iter_mut().filter(|w| !w.waited.is_empty()) {
            let mut lost: Vec<JobId> = w
                .waited
                .iter()
                .copied()
                .filter(|job| d.ends_lost.contains(job))
                .collect();
            if lost.is_empty() || !matches!(w.result, Ok(Answer::WaitDone(_))) {
                continue;
            }
            lost.sort_unstable();
            let jobs = match &lost[..] {
                [one] => format!("job {one}"),
                more => {
                    let ids: Vec<String> = more.iter().map(u32::to_string).collect();
                    format!("jobs {}", ids.join(", "))
                }
            };
            w.result = Err(format!(
                "the wait is over, but the journal could not record how some tasks of {jobs} ended, so a restart of the server would run them again ({why})"
            )
            .into());
        }
    }

    /// Gives back a step of the room forgotten jobs left in the journal (a bounded one, so a
    /// big job's room is given back over several ticks, not in one stall), on the writer.
    pub(super) fn compact_journal(&mut self) {
        if let Some(w) = &self.durable.writer {
            w.compact();
        }
    }

    /// After a commit that kept nothing: jobs created in the failed batch (replies `held`) are
    /// withdrawn (canceled, then forgotten: their ids never reached the journal) and their
    /// submitters told why; a job whose piece was not kept is canceled (its client stops
    /// sending pieces: left open, it would never end); a forget in the batch is said to be lost
    /// with a restart.
    fn withdraw_unjournaled(&mut self, msg: &str, held: &mut [Deferred]) {
        let now = self.now();
        let mut withdrawn = Vec::new();
        let mut partial = Vec::new();
        for d in held.iter_mut() {
            match (&mut d.result, d.created.take()) {
                (Ok(Answer::Submitted { .. }), Some((job, key))) => {
                    withdrawn.push(job);
                    if let Some(k) = key {
                        self.keys.remove(&k);
                    }
                    d.result = Err(format!("{msg}; job {job} was not kept").into());
                }
                (Ok(Answer::Extended), created) => {
                    let job = created.map(|(job, _)| job);
                    partial.extend(job);
                    let what = job.map_or(String::new(), |job| {
                        format!("; job {job}, sent in pieces, is canceled (its tasks so far are kept canceled)")
                    });
                    d.result = Err(format!("{msg}{what}").into());
                }
                (Ok(Answer::Forgotten(results)), _) => {
                    for r in results.iter_mut().filter(|r| r.result.is_ok()) {
                        r.result = Err(format!(
                            "job {} is forgotten by this server, but the journal could not record it ({msg}): it comes back if the server restarts; forget it again once the journal can be written",
                            r.job
                        )
                        .into());
                    }
                }
                _ => {}
            }
        }
        for &job in &withdrawn {
            self.durable.unjournaled.insert(job);
            let _ = self.core.handle(now, Event::Cancel { job });
            let _ = self.core.handle(now, Event::Forget { job });
        }
        for job in partial {
            // Journaled with the next commit that fits, so a restart does not run it again.
            let _ = self.core.handle(now, Event::Cancel { job });
        }
    }

    /// Journals what the scheduler recorded during the last event (at `now`), before the next
    /// event's records: the order matters to replay (see [`kestrel_core::Record`]).
    pub(super) fn journal_records(&mut self, now: u64) {
        self.journal_ends_with(now, OutputsOf::default());
    }

    /// [`Self::journal_records`], keeping with each recorded task end its streamed output from
    /// `outputs`. Task ends are taken even without a journal, for the output log.
    pub(super) fn journal_ends_with(&mut self, now: u64, mut outputs: OutputsOf) {
        let mut records = std::mem::take(&mut self.durable.records);
        self.core.swap_records(&mut records);
        let journaling = self.durable.journaling();
        let streaming = self.outputs.streaming();
        let pending: &mut Pending = &mut self.durable.pending;
        // Jobs forgotten one after another go in one FORGET entry.
        let mut forgotten = Vec::new();
        for r in records.drain(..) {
            if let Some(job) = record_job(&r) {
                if self.durable.unjournaled.contains(&job) {
                    // Withdrawn: the journal never had it (its cancel and forget are not news).
                    if matches!(r, Record::Forgotten { .. }) {
                        self.outputs.forget(job, None);
                        self.durable.unjournaled.remove(&job);
                        let why = format!(
                            "job {job} was withdrawn: the journal could not record its submission"
                        );
                        self.watch.end(job, why, true);
                    }
                    continue;
                }
            }
            if !forgotten.is_empty() && !matches!(r, Record::Forgotten { .. }) {
                pending.forget(std::mem::take(&mut forgotten), now);
            }
            // What a watch sees, journaled or not (nothing is looked at while none is kept).
            if self.watch.any() {
                match &r {
                    Record::GaveUp { job, index } => {
                        if let Some(j) = self.core.job(*job) {
                            self.watch.caught(&self.core, j, *index, None);
                        }
                        self.watch.unsure();
                    }
                    Record::Retried { job, .. } => self.watch.retried(*job),
                    // What may end tasks without records of their own: a cancel (its job's
                    // queued tasks), a failure or a cancel that cancels what depends on it, a
                    // job closed empty.
                    Record::Canceled { .. } | Record::Extended { close: true, .. } => {
                        self.watch.unsure()
                    }
                    Record::Ended { ends } if ends.iter().any(|f| f.end != RunEnd::Success) => {
                        self.watch.unsure()
                    }
                    _ => {}
                }
            }
            match r {
                Record::Ended { ends } => {
                    let files = self.outputs.files.any();
                    let watching = self.watch.any();
                    if !(journaling || streaming || files || watching) {
                        continue;
                    }
                    // Ends come in runs of one job: it is looked up once per run.
                    let mut job: Option<&kestrel_core::Job> = None;
                    for f in ends {
                        if job.is_none_or(|j| j.id != f.job) {
                            job = self.core.job(f.job);
                            if journaling {
                                self.durable.ends_pending.insert(f.job);
                            }
                        }
                        let Some(j) = job else {
                            continue;
                        };
                        let output = outputs.take(&f);
                        if watching {
                            self.watch.caught(&self.core, j, f.index, output.as_ref());
                        }
                        if files {
                            let told = outputs
                                .reports_files
                                .then(|| output.as_ref().map_or(0, |o| o.files));
                            self.outputs.files.record(f.job, &j.spec, f.index, told);
                        }
                        let pending = journaling.then_some(&mut *pending);
                        keep_end(pending, &mut self.outputs, f, j, output);
                    }
                }
                Record::Forgotten { job } => {
                    self.durable.ends_lost.remove(&job);
                    let why = format!("job {job} was forgotten (`kestrel job forget`)");
                    self.watch.end(job, why, false);
                    // Its output log goes in the same transaction as the FORGET entry.
                    self.outputs
                        .forget(job, journaling.then_some(&mut *pending));
                    if journaling {
                        forgotten.push(job);
                    }
                }
                _ if !journaling => {}
                Record::Submitted { job, key } => {
                    // Encoded from the core's copy: a big task list is never cloned.
                    if let Some(j) = self.core.job(job) {
                        let (at, open) = (j.submitted_us, j.open);
                        pending.submit(job, at, key, &j.spec, &j.tasks, open);
                    }
                }
                Record::Extended { job, from, close } => {
                    if let Some(j) = self.core.job(job) {
                        pending.extend(job, now, &j.tasks, from as usize, close);
                    }
                }
                Record::Canceled { job } => pending.cancel(job, now),
                Record::Retried { job, failed_only } => pending.retry(job, now, failed_only),
                Record::SlotWait { job, waited_us } => pending.slot_wait(job, waited_us),
                Record::GaveUp { job, index } => {
                    let Some(j) = self.core.job(job) else {
                        continue;
                    };
                    if let Some(failure) = j.failure(index).cloned() {
                        let at = j.record(index).finished_us;
                        pending.give_up(job, index, at, failure);
                    }
                }
                Record::Lost { tasks } => pending.lost(tasks),
            }
        }
        if !forgotten.is_empty() {
            pending.forget(forgotten, now);
        }
        self.durable.records = records;
    }
}

/// What a commit handed to a writer thread that is gone comes to: a failed one.
fn writer_gone(rows: u64) -> Done {
    Done {
        result: Err(crate::journal::Failed {
            msg: "the journal's writer stopped (see the server's log); restart the server".into(),
            inputs_kept: false,
        }),
        rows,
        pending: Box::default(),
    }
}

/// The one job a record is about, if it is about one.
fn record_job(r: &Record) -> Option<JobId> {
    match r {
        Record::Submitted { job, .. }
        | Record::Extended { job, .. }
        | Record::Canceled { job }
        | Record::Retried { job, .. }
        | Record::SlotWait { job, .. }
        | Record::GaveUp { job, .. }
        | Record::Forgotten { job } => Some(*job),
        _ => None,
    }
}

/// Journals (into `pending`, when journaling) a task end the scheduler took, and keeps its
/// streamed output if its job streams any.
fn keep_end(
    mut pending: Option<&mut Pending>,
    outputs: &mut OutputLog,
    f: kestrel_core::Finished,
    j: &kestrel_core::Job,
    output: Option<TaskOutput>,
) {
    let (job, index) = (f.job, f.index);
    if let Some(p) = pending.as_deref_mut() {
        // The worker whose report was taken: the record names it (a duplicate run's success
        // moved the task to its worker).
        let rec = j.record(index);
        p.task_end(f, rec.assigned_us, rec.worker);
    }
    if outputs.streaming() {
        // An earlier run (this one is counted already) may have left an output to replace.
        let rerun = j.record(index).runs > 1;
        outputs.record(&j.spec, job, index, rerun, output, pending);
    }
}

/// The streamed outputs of one report, taken by the end they belong to.
#[derive(Default)]
pub(super) struct OutputsOf {
    outputs: FxHashMap<(JobId, u32), TaskOutput>,
    /// Whether the report says how its tasks' own output files are (`TaskOutput::files`).
    reports_files: bool,
}

impl OutputsOf {
    /// The outputs of a report that does not say how its tasks' own files are.
    pub(super) fn new(outputs: Vec<TaskOutput>) -> OutputsOf {
        OutputsOf::from_worker(outputs, false)
    }

    /// The outputs of a report; `reports_files` if it says how its tasks' own files are.
    pub(super) fn from_worker(outputs: Vec<TaskOutput>, reports_files: bool) -> OutputsOf {
        OutputsOf {
            outputs: outputs.into_iter().map(|o| ((o.job, o.index), o)).collect(),
            reports_files,
        }
    }

    fn take(&mut self, f: &kestrel_core::Finished) -> Option<TaskOutput> {
        if self.outputs.is_empty() {
            return None;
        }
        self.outputs.remove(&(f.job, f.index))
    }
}
