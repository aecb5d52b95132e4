//! Reading the journal back: the replay into a fresh scheduler at start, and the list of
//! recorded successes (what the chaos test checks).

use super::encoding::{each_worker, Entry, KIND_ENDS};
use super::{Journal, JournalError};
use kestrel_core::{Event, JobId, Scheduler, TaskIndex, TaskSet};
use rustc_hash::FxHashMap;

/// What a replay restored, for the start-up log line.
#[derive(Debug, Default)]
pub struct Restored {
    /// Rows of the log read.
    pub rows: u64,
    /// Jobs the server holds again (submitted and not forgotten).
    pub jobs: usize,
    /// Task ends recorded again.
    pub task_ends: u64,
}

impl Journal {
    /// Every successful task end in the log, in order: `(job, index)`. A task appears once per
    /// recorded success, so a correct journal lists each finished task exactly once (what the
    /// chaos test checks).
    pub fn successes(&self) -> Result<Vec<(JobId, TaskIndex)>, JournalError> {
        let mut out = Vec::new();
        self.each_entry(Some(KIND_ENDS), |_, kind, body| {
            // Only ends are read (`Some(KIND_ENDS)`): the `else` is never taken.
            let Entry::Ends(b) = Entry::decode(kind, body).map_err(|e| self.damaged(e))? else {
                return Ok(());
            };
            out.extend(b.ok.iter().map(|t| (t.0, t.1)));
            out.extend(
                b.other
                    .iter()
                    .filter(|(f, _)| f.end == kestrel_core::RunEnd::Success)
                    .map(|(f, _)| (f.job, f.index)),
            );
            Ok(())
        })?;
        Ok(out)
    }

    /// Replays the log into `core` (which must be fresh) and returns the submission keys it
    /// saw, key -> job.
    pub fn replay(
        &self,
        core: &mut Scheduler,
        restored: &mut Restored,
    ) -> Result<FxHashMap<String, JobId>, JournalError> {
        let mut keys = FxHashMap::default();
        self.each_entry(None, |seq, kind, body| {
            let bad = |e: &dyn std::fmt::Display| self.damaged(format!("log entry {seq}: {e}"));
            restored.rows += 1;
            match Entry::decode(kind, body).map_err(|e| bad(&e))? {
                Entry::Submit(b) => {
                    core.restore_submit(b.job, b.at_us, b.spec, b.tasks, b.open)
                        .map_err(|e| bad(&e))?;
                    if let Some(k) = b.key {
                        keys.insert(k, b.job);
                    }
                    restored.jobs += 1;
                }
                Entry::Extend(b) => {
                    // The log holds exactly the tasks each extension added, in order.
                    let at = core.job(b.job).map_or(0, |j| j.len());
                    let more = match core.job(b.job).map(|j| &j.tasks) {
                        Some(TaskSet::Lines(_)) => TaskSet::Lines(b.lines),
                        _ => TaskSet::List(b.argvs),
                    };
                    let extend = Event::Extend {
                        job: b.job,
                        at,
                        more,
                        close: b.close,
                    };
                    reapply(core, seq, b.at_us, extend, "extension", b.job);
                }
                Entry::Cancel(b) => {
                    reapply(
                        core,
                        seq,
                        b.at_us,
                        Event::Cancel { job: b.job },
                        "cancel",
                        b.job,
                    );
                }
                Entry::Retry(b) => {
                    let retry = Event::Retry {
                        job: b.job,
                        failed_only: b.failed_only,
                    };
                    reapply(core, seq, b.at_us, retry, "retry", b.job);
                }
                Entry::GiveUp(b) => {
                    core.restore_give_up(b.job, b.index, b.at_us, b.failure);
                    restored.task_ends += 1;
                }
                Entry::Lost(b) => core.restore_lost(&b.tasks),
                Entry::Forget(b) => {
                    // The rows of a job forgotten since schema 6 went with it: nothing is left to
                    // forget. Older rows stay, and the job goes again, even if the log no longer
                    // ends it (a cancel that could not be journaled): it was forgotten once, so
                    // it must not come back.
                    for job in b.jobs {
                        if core.job(job).is_none() {
                            continue;
                        }
                        if core.job(job).is_some_and(|j| !j.is_done()) {
                            let _ = core.handle(b.at_us, Event::Cancel { job });
                        }
                        match core.handle(b.at_us, Event::Forget { job }) {
                            Ok(_) => restored.jobs = restored.jobs.saturating_sub(1),
                            Err(e) => {
                                tracing::warn!("journal entry {seq}: job {job} not forgotten: {e}")
                            }
                        }
                    }
                }
                Entry::Ends(mut b) => {
                    restored.task_ends += (b.ok.len() + b.other.len()) as u64;
                    let runs = std::mem::take(&mut b.workers);
                    let mut workers = each_worker(&runs);
                    for (f, assigned_us) in b.successes() {
                        let worker = workers.next().unwrap_or(0);
                        core.restore_task_end_by(f, assigned_us, worker);
                    }
                    for (f, assigned_us) in b.other {
                        let worker = workers.next().unwrap_or(0);
                        core.restore_task_end_by(f, assigned_us, worker);
                    }
                    for (job, waited_us) in b.waited {
                        // Never refused (a forgotten job's wait is dropped).
                        let _ = core.handle(b.base_us, Event::SlotWait { job, waited_us });
                    }
                }
            }
            Ok(())
        })?;
        core.restore_done();
        // A forgotten job's key no longer names a job.
        keys.retain(|_, job| core.job(*job).is_some());
        Ok(keys)
    }
}

/// Applies a client's input again (an extension, a cancel, a retry of `job`). It was accepted
/// once, so it applies again; if the log's order makes it refused now, the job's state differs
/// a little, not the journal's health: said, not failed.
fn reapply(core: &mut Scheduler, seq: i64, at_us: u64, ev: Event, what: &str, job: JobId) {
    if let Err(e) = core.handle(at_us, ev) {
        tracing::warn!("journal entry {seq}: {what} of job {job} not replayed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::super::encoding::KIND_EXTEND;
    use super::super::store::SCHEMA_VERSION;
    use super::super::Pending;
    use super::*;
    use kestrel_core::{Config, Finished, IdRanges, JobSpec, RunEnd};
    use serde::Serialize;

    fn spec() -> JobSpec {
        JobSpec::command("t", vec!["true".into()])
    }

    #[test]
    fn entries_survive_reopen_and_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        j.set_access("abcd", 4242).unwrap();
        let tasks = TaskSet::Array(IdRanges::span(1, 100));
        let mut p = Pending::default();
        p.submit(5, 10, Some("k1".into()), &spec(), &tasks, false);
        for i in 0..40 {
            p.task_end(
                Finished {
                    job: 5,
                    index: i,
                    started_us: 1_000 + i as u64,
                    finished_us: 2_000 + i as u64,
                    end: RunEnd::Success,
                },
                900,
                3,
            );
        }
        j.commit(&mut p).unwrap();
        assert!(p.is_empty());
        assert_eq!(j.rows(), 2);
        drop(j);

        let j = Journal::open(dir.path(), None).unwrap();
        assert_eq!(j.rows(), 2);
        let m = j.meta().unwrap();
        assert_eq!((m.secret.as_deref(), m.port), (Some("abcd"), Some(4242)));
        let mut core = Scheduler::new(Config::default());
        let mut r = Restored::default();
        let keys = j.replay(&mut core, &mut r).unwrap();
        assert_eq!(keys.get("k1"), Some(&5));
        assert_eq!((r.rows, r.jobs, r.task_ends), (2, 1, 40));
        let job = core.job(5).unwrap();
        assert_eq!(job.counts.finished, 40);
        assert_eq!(job.counts.ready, 60);
        let rec = job.record(7);
        assert_eq!(
            (rec.assigned_us, rec.started_us, rec.finished_us),
            (900, 1007, 2007)
        );
        assert_eq!(core.queued(), 60);
    }

    fn failed(job: JobId, index: TaskIndex) -> Finished {
        Finished {
            job,
            index,
            started_us: 100,
            finished_us: 200,
            end: RunEnd::Failed(Box::new(kestrel_core::Failure {
                exit_code: Some(1),
                signal: None,
                reason: "exit code 1".into(),
                stderr_tail: String::new(),
                permanent: false,
            })),
        }
    }

    #[test]
    fn retries_and_give_ups_replay_in_the_order_they_happened() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let tasks = TaskSet::Array(IdRanges::span(0, 3));
        let mut p = Pending::default();
        p.submit(1, 10, None, &spec(), &tasks, false);
        // Task 0 fails for good, task 1 is given up after lost workers, then `job retry`
        // arrives in the same batch: the retry must replay after both.
        p.task_end(failed(1, 0), 50, 3);
        let gone = kestrel_core::Failure::because("lost with 5 workers (it may kill its worker)");
        p.give_up(1, 1, 300, gone);
        p.retry(1, 400, true);
        j.commit(&mut p).unwrap();
        let mut core = Scheduler::new(Config::default());
        let mut r = Restored::default();
        j.replay(&mut core, &mut r).unwrap();
        let job = core.job(1).unwrap();
        // Four tasks (ids 0-3): both failed ones are ready again with the two untouched.
        assert_eq!(
            (job.counts.ready, job.counts.failed),
            (4, 0),
            "{:?}",
            job.counts
        );
        assert!(!job.is_done());
    }

    #[test]
    fn forgotten_jobs_stay_forgotten_and_their_ids_stay_used() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let mut p = Pending::default();
        let one = TaskSet::Array(IdRanges::span(0, 0));
        p.submit(1, 10, Some("k1".into()), &spec(), &one, false);
        p.submit(2, 10, Some("k2".into()), &spec(), &one, false);
        p.task_end(
            Finished {
                job: 1,
                index: 0,
                started_us: 20,
                finished_us: 30,
                end: RunEnd::Success,
            },
            15,
            3,
        );
        p.forget(vec![1], 40);
        j.commit(&mut p).unwrap();
        drop(j);
        let j = Journal::open(dir.path(), None).unwrap();
        assert_eq!(
            j.get_meta("schema_version").unwrap(),
            Some(SCHEMA_VERSION.to_string()),
            "an older kestrel must refuse a journal that can hold FORGET entries"
        );
        let mut core = Scheduler::new(Config::default());
        let keys = j.replay(&mut core, &mut Restored::default()).unwrap();
        assert!(core.job(1).is_none(), "job 1 was forgotten");
        assert!(core.job(2).is_some());
        assert_eq!(keys.get("k1"), None, "a forgotten job's key names nothing");
        assert_eq!(keys.get("k2"), Some(&2));
        let spec_tasks = TaskSet::Array(IdRanges::span(0, 0));
        let submit = Event::Submit {
            spec: Box::new(spec()),
            tasks: spec_tasks,
            open: false,
            key: None,
        };
        let next = core.handle(50, submit).unwrap();
        assert_eq!(
            next,
            kestrel_core::Reply::Submitted(3),
            "ids are not given out again"
        );
    }

    #[test]
    fn a_job_of_lines_and_its_pieces_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let lines = |l: &[&str]| TaskSet::Lines(l.iter().copied().collect());
        let mut p = Pending::default();
        p.submit(1, 10, None, &spec(), &lines(&["a", "b"]), true);
        // The job's tasks after the extension; the entry holds those from index 2 on.
        p.extend(1, 20, &lines(&["a", "b", "c {task}", "d"]), 2, true);
        j.commit(&mut p).unwrap();
        let mut core = Scheduler::new(Config::default());
        j.replay(&mut core, &mut Restored::default()).unwrap();
        let job = core.job(1).unwrap();
        assert_eq!(job.tasks, lines(&["a", "b", "c {task}", "d"]));
        assert!(!job.open);
        assert_eq!(job.counts.ready, 4);
    }

    #[test]
    fn a_function_job_replays_with_its_function() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let mut spec = JobSpec::command("calls", Vec::new());
        spec.template.kind =
            kestrel_core::TaskKind::Function(Box::new(kestrel_core::FunctionSpec {
                name: "m.f".into(),
                pickled: b"\x80\x05N.".to_vec(),
                inline_limit: 1024,
                ..Default::default()
            }));
        let tasks = TaskSet::Lines(["gAVLAS4=", "gAVLAi4="].into_iter().collect());
        let mut p = Pending::default();
        p.submit(1, 10, None, &spec, &tasks, false);
        j.commit(&mut p).unwrap();
        drop(j);
        let j = Journal::open(dir.path(), None).unwrap();
        let mut core = Scheduler::new(Config::default());
        j.replay(&mut core, &mut Restored::default()).unwrap();
        let job = core.job(1).unwrap();
        assert_eq!(job.spec.template.kind, spec.template.kind);
        assert_eq!(job.tasks, tasks);
    }

    #[test]
    fn an_extension_journaled_before_lines_existed_replays() {
        // The form of an extension entry before it had `lines`.
        #[derive(Serialize)]
        struct OldExtend {
            job: JobId,
            at_us: u64,
            argvs: Vec<Vec<String>>,
            close: bool,
        }
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let mut p = Pending::default();
        let list = TaskSet::List(vec![vec!["echo".into(), "a".into()]]);
        p.submit(1, 10, None, &spec(), &list, true);
        p.push(
            KIND_EXTEND,
            Some(1),
            &OldExtend {
                job: 1,
                at_us: 20,
                argvs: vec![vec!["echo".into(), "b".into()]],
                close: true,
            },
        );
        j.commit(&mut p).unwrap();
        let mut core = Scheduler::new(Config::default());
        j.replay(&mut core, &mut Restored::default()).unwrap();
        let job = core.job(1).unwrap();
        assert_eq!(job.len(), 2);
        assert_eq!(
            job.task_argv(1),
            Some(&["echo".to_string(), "b".into()][..])
        );
        assert!(!job.open);
    }

    #[test]
    fn crash_counts_replay() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let mut p = Pending::default();
        p.submit(
            1,
            10,
            None,
            &spec(),
            &TaskSet::Array(IdRanges::span(0, 3)),
            false,
        );
        p.lost(vec![(1, 0), (1, 2)]);
        p.lost(vec![(1, 2)]);
        // A loss of a job the journal does not know is ignored, not an error.
        p.lost(vec![(9, 0)]);
        j.commit(&mut p).unwrap();
        let mut core = Scheduler::new(Config::default());
        j.replay(&mut core, &mut Restored::default()).unwrap();
        let job = core.job(1).unwrap();
        let lost: Vec<u8> = (0..4).map(|i| job.record(i).lost).collect();
        assert_eq!(lost, vec![1, 0, 2, 0]);
    }

    #[test]
    fn a_task_end_journaled_before_ends_named_their_worker_lists_no_worker() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path(), None).unwrap();
        let mut p = Pending::default();
        let tasks = TaskSet::Array(IdRanges::span(0, 9));
        p.submit(7, 10, None, &spec(), &tasks, false);
        // An ENDS entry as schema 4 wrote it: task 2 of job 7 succeeded, worker not named.
        let hex = "94cd076c919507020064cd02589292950702cd07d0cd09c481a1469403c0ab6578697420636f64652033a4626f6f6dcd079e92950702cd07d0cd09c4a143cd07a891920728";
        p.rows.push((KIND_ENDS, hex::decode(hex).unwrap()));
        p.row_jobs.push(Some(7));
        j.commit(&mut p).unwrap();
        let mut core = Scheduler::new(Config::default());
        j.replay(&mut core, &mut Restored::default()).unwrap();
        let row = crate::views::task_row(core.job(7).unwrap(), 2);
        assert_eq!(row.state, kestrel_core::TaskState::Finished);
        assert!(row.assigned_us > 0);
        assert_eq!(row.worker, None, "worker 0 is no worker: shown as none");
    }
}
