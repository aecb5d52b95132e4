//! Retrying a job looks at its dependencies anew (issue 29, defect 4): `job retry B --all` of
//! a job canceled because its `after` job A failed ran B anyway, and retrying A left B
//! canceled with the stale reason. Now B's retry is refused while A has failed, naming A; A's
//! retry brings B back, waiting for A; file dependencies behave the same; and a replayed
//! journal gives the same. The `deps` of single tasks (job files) are looked at the same way.

mod common;

use common::{assigned_runs, staging_worker, Events};
use kestrel_core::*;

const STORE: &str = "/store";

fn setup() -> (Scheduler, WorkerId) {
    let mut s = Scheduler::new(Config {
        store: Some(STORE.into()),
        ..Config::default()
    });
    let w = staging_worker(&mut s, 1);
    (s, w)
}

/// A job reading `inputs`, writing `outputs`, after `after`.
fn job(name: &str, inputs: &[&str], outputs: &[&str], after: &[&str]) -> JobSpec {
    let mut spec = JobSpec::command(name, vec!["/bin/true".into()]);
    spec.template.files.inputs = inputs.iter().map(|s| s.to_string()).collect();
    spec.template.files.outputs = outputs.iter().map(|s| s.to_string()).collect();
    spec.after = after.iter().map(|a| After::parse(a).unwrap()).collect();
    spec
}

fn tasks(n: u32) -> TaskSet {
    TaskSet::Array(IdRanges::span(1, n))
}

/// What a journal keeps, in order: enough to replay into a fresh scheduler.
enum Entry {
    Submit(JobId, Box<JobSpec>, TaskSet),
    End(Finished, u64),
    Retry(JobId, bool),
}

/// A scheduler with one one-slot worker, driven by hand, its journal kept.
struct Run {
    s: Scheduler,
    w: WorkerId,
    now: u64,
    log: Vec<Entry>,
    /// Tasks in the order they ran, as (job, id).
    ran: Vec<(JobId, u32)>,
}

impl Run {
    fn new() -> Run {
        let (s, w) = setup();
        Run {
            s,
            w,
            now: 0,
            log: Vec::new(),
            ran: Vec::new(),
        }
    }

    fn submit(&mut self, spec: JobSpec, n: u32) -> JobId {
        let id = self
            .s
            .submit(self.now, spec.clone(), tasks(n), false)
            .unwrap();
        self.log.push(Entry::Submit(id, Box::new(spec), tasks(n)));
        id
    }

    fn retry(&mut self, job: JobId, failed_only: bool) -> Result<(u32, u32), SchedError> {
        let r = self.s.retry_job(job, failed_only);
        if r.is_ok() {
            self.log.push(Entry::Retry(job, failed_only));
        }
        r
    }

    /// Runs what can run until nothing is handed out; each task ends as `ok(job, id)` says.
    fn run(&mut self, ok: impl Fn(JobId, u32) -> bool) {
        loop {
            let runs = assigned_runs(&mut self.s, self.now);
            if runs.is_empty() {
                return;
            }
            for r in runs {
                for index in r.first..r.first + r.count {
                    self.now += 10;
                    let j = self.s.job(r.job).unwrap();
                    let id = j.task_id(index);
                    let assigned_us = j.record(index).assigned_us;
                    let end = if ok(r.job, id) {
                        RunEnd::Success
                    } else {
                        RunEnd::Failed(Box::new(Failure::because("exit code 1")))
                    };
                    let f = Finished::at_once(r.job, index, self.now, end);
                    let ends = vec![f.clone()];
                    self.s
                        .handle(
                            self.now,
                            Event::TasksEnded {
                                worker: self.w,
                                ends,
                            },
                        )
                        .unwrap();
                    self.log.push(Entry::End(f, assigned_us));
                    self.ran.push((r.job, id));
                }
            }
        }
    }

    /// A fresh scheduler with the journal replayed into it, as a restarted server has.
    fn replayed(&self) -> Scheduler {
        let mut s = Scheduler::new(self.s.config().clone());
        for e in &self.log {
            match e {
                Entry::Submit(id, spec, t) => s
                    .restore_submit(*id, 0, (**spec).clone(), t.clone(), false)
                    .unwrap(),
                Entry::End(f, assigned_us) => s.restore_task_end(f.clone(), *assigned_us),
                Entry::Retry(job, failed_only) => {
                    s.retry_job(*job, *failed_only).unwrap();
                }
            }
        }
        s.restore_done();
        s
    }
}

fn counts(s: &Scheduler, job: JobId) -> Counts {
    s.job(job).unwrap().counts
}

fn state(s: &Scheduler, job: JobId, id: u32) -> TaskState {
    let j = s.job(job).unwrap();
    j.record(j.index_of(id).unwrap()).state
}

#[test]
fn a_job_canceled_because_its_after_job_failed_is_not_run_by_its_retry() {
    let mut r = Run::new();
    let a = r.submit(job("a", &[], &[], &[]), 2);
    let b = r.submit(job("b", &[], &[], &[&a.to_string()]), 2);
    r.run(|j, id| !(j == a && id == 1));
    assert_eq!(counts(&r.s, b).canceled, 2);
    // "B ran although A failed": refused, naming A and what to do.
    let err = r.retry(b, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "job {b} cannot be retried now: it runs after job {a}, which ended with 1 failed and \
             0 canceled tasks. Retry job {a} first (`kestrel job retry {a}`): the tasks of job \
             {b} canceled because of it come back with it, wait for it and run when it finishes"
        )
    );
    // Nothing changed: B is still canceled and nothing runs.
    assert_eq!(counts(&r.s, b).canceled, 2);
    assert!(r.s.job(b).unwrap().is_done());
    r.run(|_, _| true);
    assert!(!r.ran.contains(&(b, 1)));
}

#[test]
fn retrying_the_failed_job_brings_its_dependents_back_and_they_run_after_it() {
    let mut r = Run::new();
    let a = r.submit(job("a", &[], &[], &[]), 2);
    let b = r.submit(job("b", &[], &[], &[&a.to_string()]), 2);
    // C waits for task 1 of B: canceled in turn.
    let c = r.submit(job("c", &[], &[], &[&format!("{b}:1")]), 1);
    r.run(|j, id| !(j == a && id == 1));
    assert_eq!(counts(&r.s, b).canceled, 2);
    assert_eq!(counts(&r.s, c).canceled, 1);
    assert_eq!(r.retry(a, true), Ok((1, 0)));
    // B and C wait again, without the stale reason, and are live again.
    for (job, n) in [(b, 2), (c, 1)] {
        let j = r.s.job(job).unwrap();
        assert_eq!(j.counts.waiting, n, "job {job}");
        assert!(j.failure(0).is_none(), "job {job}: {:?}", j.failure(0));
        assert!(j.finished_us.is_none() && !j.is_done());
    }
    let before = r.ran.len();
    r.run(|_, _| true);
    let ran = &r.ran[before..];
    assert_eq!(ran, [(a, 1), (b, 1), (b, 2), (c, 1)]);
    for job in [a, b, c] {
        assert_eq!(counts(&r.s, job).finished, r.s.job(job).unwrap().len());
    }
    // A restarted server replays the same.
    let s = r.replayed();
    for job in [a, b, c] {
        assert_eq!(s.job(job).unwrap().counts, counts(&r.s, job), "job {job}");
        assert!(s.job(job).unwrap().is_done());
    }
}

#[test]
fn a_restart_between_the_retry_and_its_end_keeps_the_dependents_waiting() {
    let mut r = Run::new();
    let a = r.submit(job("a", &[], &[], &[]), 1);
    let b = r.submit(job("b", &[], &[], &[&a.to_string()]), 3);
    r.run(|_, _| false);
    r.retry(a, true).unwrap();
    // The server restarts before A's retry has run.
    let mut s = r.replayed();
    assert_eq!(counts(&s, a).ready, 1);
    assert_eq!(counts(&s, b).waiting, 3);
    assert!(s.job(b).unwrap().failure(0).is_none());
    // Only A is handed out; B follows when it finishes.
    let w = staging_worker(&mut s, 4);
    let given: Vec<JobId> = assigned_runs(&mut s, 1).iter().map(|r| r.job).collect();
    assert_eq!(given, [a]);
    let f = Finished::at_once(a, 0, 2, RunEnd::Success);
    s.handle(
        2,
        Event::TasksEnded {
            worker: w,
            ends: vec![f],
        },
    )
    .unwrap();
    assert_eq!(counts(&s, b).ready, 3);
}

#[test]
fn a_task_reading_a_file_whose_writer_failed_comes_back_with_the_writer() {
    let mut r = Run::new();
    let a = r.submit(job("a", &[], &["mid/{task}"], &[]), 3);
    let b = r.submit(job("b", &["mid/{task}"], &[], &[]), 3);
    r.run(|j, id| !(j == a && id == 2));
    assert_eq!(state(&r.s, b, 2), TaskState::Canceled);
    assert_eq!((counts(&r.s, b).finished, counts(&r.s, b).canceled), (2, 1));
    let err = r.retry(b, false).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "job {b} cannot be retried now: task {b}:2 reads mid/2, whose writer, task {a}:2, \
             has failed. Retry job {a} first"
        )),
        "{err}"
    );
    assert_eq!(r.retry(a, true), Ok((1, 0)));
    assert_eq!(state(&r.s, b, 2), TaskState::Waiting);
    // B's other tasks, finished, stay so.
    assert_eq!(counts(&r.s, b).finished, 2);
    let before = r.ran.len();
    r.run(|_, _| true);
    assert_eq!(&r.ran[before..], [(a, 2), (b, 2)]);
    assert!(r.s.job(b).unwrap().is_done());
    let s = r.replayed();
    assert_eq!(s.job(b).unwrap().counts, counts(&r.s, b));
}

#[test]
fn a_canceled_job_retried_before_its_after_job_ends_waits_for_it() {
    let mut r = Run::new();
    let a = r.submit(job("a", &[], &[], &[]), 1);
    let b = r.submit(job("b", &[], &[], &[&a.to_string()]), 2);
    r.s.cancel_job(0, b).unwrap();
    assert_eq!(r.retry(b, false), Ok((0, 2)));
    assert_eq!(counts(&r.s, b).waiting, 2, "waits for A, which has not run");
    r.run(|_, _| true);
    assert_eq!(r.ran, [(a, 1), (b, 1), (b, 2)]);
    // Retried after its after job failed: refused, pointing to `--all` for a canceled one.
    let mut r = Run::new();
    let a = r.submit(job("a", &[], &[], &[]), 1);
    let b = r.submit(job("b", &[], &[], &[&a.to_string()]), 1);
    r.s.cancel_job(0, a).unwrap();
    let err = r.retry(b, false).unwrap_err().to_string();
    assert!(
        err.contains(&format!("`kestrel job retry {a} --all`")),
        "{err}"
    );
    assert_eq!(r.retry(a, false), Ok((0, 1)));
    assert_eq!(counts(&r.s, b).waiting, 1);
    r.run(|_, _| true);
    assert_eq!(r.ran, [(a, 1), (b, 1)]);
}

#[test]
fn a_dependent_canceled_by_its_own_user_stays_canceled() {
    let mut r = Run::new();
    let a = r.submit(job("a", &[], &[], &[]), 1);
    let b = r.submit(job("b", &[], &[], &[&a.to_string()]), 1);
    r.s.cancel_job(r.now, b).unwrap();
    r.run(|_, _| false);
    r.retry(a, true).unwrap();
    assert_eq!(counts(&r.s, b).canceled, 1);
    r.run(|_, _| true);
    assert_eq!(r.ran.last(), Some(&(a, 1)));
}

/// Issue 29: a job waiting on a dependency did not say which. Its stall names the jobs of its
/// `after` and the writers of its inputs that have not finished.
#[test]
fn a_waiting_job_names_what_it_waits_for() {
    let mut r = Run::new();
    let a = r.submit(job("a", &[], &["mid/{task}"], &[]), 12);
    let b = r.submit(job("b", &[], &[], &[]), 1);
    let gated = r.submit(job("g", &[], &[], &[&b.to_string(), &format!("{a}:2")]), 2);
    let reads = r.submit(job("r", &["mid/{task}"], &[], &[]), 12);
    let stall = r.s.stall(gated).unwrap();
    assert_eq!(
        stall.to_string(),
        format!("its tasks wait for task {a}:2 and job {b} to finish")
    );
    assert_eq!(
        r.s.stall(reads).unwrap().to_string(),
        format!(
            "its tasks wait for task {a}:1, task {a}:2, task {a}:3, task {a}:4, task {a}:5, \
             task {a}:6, task {a}:7, task {a}:8 and 4 more to finish"
        )
    );
    // As the writers finish, fewer are named; a job with nothing waiting names nothing.
    r.run(|j, id| j != a || id <= 11);
    assert_eq!(
        r.s.waits_for(reads),
        (vec![], 0, false),
        "task 12 of a failed: its reader was canceled"
    );
    assert_eq!(r.s.stall(gated), None, "ready now");
    assert_eq!(r.s.waits_for(b), (vec![], 0, false));
}

/// What one task waits for: `(job, task)`, `None` for a task of the same job.
type On<'a> = &'a [(Option<JobId>, u32)];

/// A job whose task `deps` are `(task, on)`, as a job file gives them.
fn deps_job(name: &str, deps: &[(u32, On)]) -> JobSpec {
    let mut spec = job(name, &[], &[], &[]);
    spec.deps = deps
        .iter()
        .map(|&(task, on)| TaskDeps {
            task,
            on: on
                .iter()
                .map(|&(job, task)| TaskRef { job, task })
                .collect(),
        })
        .collect();
    spec
}

#[test]
fn retrying_the_failed_tasks_of_a_job_brings_back_its_tasks_whose_deps_named_them() {
    let mut r = Run::new();
    // 2 depends on 1, 3 on 2: 1 fails, 2 and 3 are canceled.
    let a = r.submit(deps_job("a", &[(2, &[(None, 1)]), (3, &[(None, 2)])]), 3);
    r.run(|_, id| id != 1);
    let c = counts(&r.s, a);
    assert_eq!((c.failed, c.canceled), (1, 2));
    // Its failed task only: the two canceled because of it come back, waiting for it.
    assert_eq!(r.retry(a, true), Ok((1, 0)));
    assert_eq!(state(&r.s, a, 2), TaskState::Waiting);
    assert_eq!(state(&r.s, a, 3), TaskState::Waiting);
    let before = r.ran.len();
    r.run(|_, _| true);
    assert_eq!(&r.ran[before..], [(a, 1), (a, 2), (a, 3)]);
    assert_eq!(counts(&r.s, a).finished, 3);
    let s = r.replayed();
    assert_eq!(s.job(a).unwrap().counts, counts(&r.s, a));
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}

#[test]
fn deps_on_another_job_are_looked_at_anew_by_retries() {
    let mut r = Run::new();
    let a = r.submit(job("a", &[], &[], &[]), 2);
    // Task 1 of B waits for task 2 of A; task 2 of B for nothing.
    let b = r.submit(deps_job("b", &[(1, &[(Some(a), 2)])]), 2);
    r.run(|j, id| !(j == a && id == 2));
    assert_eq!(state(&r.s, b, 1), TaskState::Canceled);
    assert_eq!(state(&r.s, b, 2), TaskState::Finished);
    // B's retry cannot run task 1 while A's task 2 has failed: refused, naming A.
    let err = r.retry(b, false).unwrap_err().to_string();
    assert!(
        err.contains(&format!("depends on task {a}:2, which has failed"))
            && err.contains(&format!("`kestrel job retry {a}`")),
        "{err}"
    );
    assert_eq!(state(&r.s, b, 1), TaskState::Canceled);
    // A's retry brings it back, waiting for A's task 2, and it runs after it.
    assert_eq!(r.retry(a, true), Ok((1, 0)));
    assert_eq!(state(&r.s, b, 1), TaskState::Waiting);
    let before = r.ran.len();
    r.run(|_, _| true);
    assert_eq!(&r.ran[before..], [(a, 2), (b, 1)]);
    let s = r.replayed();
    for job in [a, b] {
        assert_eq!(s.job(job).unwrap().counts, counts(&r.s, job), "job {job}");
    }
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}
