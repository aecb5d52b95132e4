//! Task graphs in the scheduler: dependencies inferred from files and given with `after`,
//! what a failed producer does to its readers, refusals at submission, dynamic jobs and the
//! cleanup of intermediate files.

mod common;

use common::{staging_worker, Events};
use kestrel_core::files::cached_name;
use kestrel_core::*;

const STORE: &str = "/store";

/// A scheduler whose jobs use [`STORE`], with one worker of `slots` slots that stages files.
fn setup(slots: u32) -> (Scheduler, WorkerId) {
    let mut s = Scheduler::new(Config {
        store: Some(STORE.into()),
        ..Config::default()
    });
    let w = staging_worker(&mut s, slots);
    (s, w)
}

/// A job of tasks with ids `1..=n` reading `inputs` and writing `outputs`.
fn files_job(name: &str, n: u32, inputs: &[&str], outputs: &[&str]) -> (JobSpec, TaskSet) {
    let mut spec = JobSpec::command(name, vec!["/bin/true".into()]);
    spec.template.files.inputs = inputs.iter().map(|s| s.to_string()).collect();
    spec.template.files.outputs = outputs.iter().map(|s| s.to_string()).collect();
    (spec, TaskSet::Array(IdRanges::span(1, n)))
}

fn submit(s: &mut Scheduler, (spec, tasks): (JobSpec, TaskSet)) -> Result<JobId, SchedError> {
    s.submit(0, spec, tasks, false)
}

/// Runs everything that can run on `w`, in the order the scheduler hands it out, until nothing
/// is handed out: each task ends as `end(job, id)` says (`true`: success) and, on success, its
/// outputs are reported cached on `w`. Returns the tasks in the order they ran, as (job, id).
fn run(
    s: &mut Scheduler,
    w: WorkerId,
    now: &mut u64,
    end: impl Fn(JobId, u32) -> bool,
) -> Vec<(JobId, u32)> {
    run_keeping(s, w, now, end, &mut Vec::new(), usize::MAX)
}

/// [`run`], keeping the commands other than assignments in `others`, for at most `rounds`
/// scheduling passes.
fn run_keeping(
    s: &mut Scheduler,
    w: WorkerId,
    now: &mut u64,
    end: impl Fn(JobId, u32) -> bool,
    others: &mut Vec<Command>,
    rounds: usize,
) -> Vec<(JobId, u32)> {
    let mut ran = Vec::new();
    for _ in 0..rounds {
        s.handle(*now, Event::Schedule).unwrap();
        let mut runs: Vec<IndexRun> = Vec::new();
        for c in s.take_commands() {
            match c {
                Command::Assign { runs: r, .. } => runs.extend(r),
                other => others.push(other),
            }
        }
        if runs.is_empty() {
            return ran;
        }
        for r in runs {
            for index in r.first..r.first + r.count {
                *now += 10;
                let j = s.job(r.job).unwrap();
                let id = j.task_id(index);
                let ok = end(r.job, id);
                let outputs: Vec<(String, u64)> = j
                    .spec
                    .template
                    .files
                    .outputs
                    .iter()
                    .map(|p| {
                        let line = j.tasks.line(index).unwrap_or("");
                        let name = p.replace("{task}", &id.to_string()).replace("{line}", line);
                        (cached_name(Some(STORE), &name), 10)
                    })
                    .collect();
                if ok && !outputs.is_empty() {
                    s.handle(
                        *now,
                        Event::CacheChanged {
                            worker: w,
                            added: outputs,
                            evicted: vec![],
                        },
                    )
                    .unwrap();
                }
                let result = if ok {
                    RunEnd::Success
                } else {
                    RunEnd::Failed(Box::new(Failure::because("exit code 1")))
                };
                let ends = vec![Finished::at_once(r.job, index, *now, result)];
                s.handle(*now, Event::TasksEnded { worker: w, ends })
                    .unwrap();
                ran.push((r.job, id));
            }
        }
    }
    ran
}

fn state(s: &Scheduler, job: JobId, id: u32) -> TaskState {
    let j = s.job(job).unwrap();
    j.record(j.index_of(id).unwrap()).state
}

#[test]
fn a_reader_waits_for_the_writer_of_its_input() {
    let (mut s, w) = setup(1);
    let a = submit(&mut s, files_job("a", 3, &[], &["mid/{task}"])).unwrap();
    let b = submit(&mut s, files_job("b", 3, &["mid/{task}"], &["out/{task}"])).unwrap();
    let jb = s.job(b).unwrap();
    assert_eq!(jb.counts.waiting, 3);
    assert_eq!(jb.counts.ready, 0);
    assert_eq!(state(&s, b, 2), TaskState::Waiting);
    let mut now = 0;
    let ran = run(&mut s, w, &mut now, |_, _| true);
    assert_eq!(ran.len(), 6);
    // Every reader ran after its writer.
    for id in 1..=3 {
        let wrote = ran.iter().position(|&t| t == (a, id)).unwrap();
        let read = ran.iter().position(|&t| t == (b, id)).unwrap();
        assert!(wrote < read, "{ran:?}");
    }
    assert!(s.job(a).unwrap().is_done() && s.job(b).unwrap().is_done());
    assert_eq!(s.job(b).unwrap().counts.finished, 3);
}

#[test]
fn a_failed_writer_cancels_its_readers_and_theirs_with_the_reason() {
    let (mut s, w) = setup(1);
    let a = submit(&mut s, files_job("a", 3, &[], &["mid/{task}"])).unwrap();
    let b = submit(&mut s, files_job("b", 3, &["mid/{task}"], &["out/{task}"])).unwrap();
    let c = submit(&mut s, files_job("c", 3, &["out/{task}"], &[])).unwrap();
    let mut now = 0;
    let ran = run(&mut s, w, &mut now, |job, id| !(job == a && id == 2));
    assert!(!ran.contains(&(b, 2)) && !ran.contains(&(c, 2)), "{ran:?}");
    assert_eq!(state(&s, a, 2), TaskState::Failed);
    assert_eq!(state(&s, b, 2), TaskState::Canceled);
    assert_eq!(state(&s, c, 2), TaskState::Canceled);
    let jb = s.job(b).unwrap();
    assert_eq!(
        jb.failure(jb.index_of(2).unwrap()).unwrap().reason,
        format!("input mid/2: producer task {a}:2 failed")
    );
    let jc = s.job(c).unwrap();
    assert_eq!(
        jc.failure(jc.index_of(2).unwrap()).unwrap().reason,
        format!("input out/2: producer task {b}:2 was canceled")
    );
    // The others ran, and every job ended.
    assert_eq!(jc.counts.finished, 2);
    for j in [a, b, c] {
        assert!(s.job(j).unwrap().is_done(), "job {j}");
    }
}

#[test]
fn after_waits_for_a_whole_job_or_some_of_its_tasks() {
    let (mut s, w) = setup(1);
    let a = submit(&mut s, files_job("a", 3, &[], &[])).unwrap();
    let (mut spec, tasks) = files_job("b", 2, &[], &[]);
    spec.after = vec![After::parse(&a.to_string()).unwrap()];
    let b = s.submit(0, spec, tasks, false).unwrap();
    let (mut spec, tasks) = files_job("c", 2, &[], &[]);
    spec.after = vec![After::parse(&format!("{a}:1")).unwrap()];
    let c = s.submit(0, spec, tasks, false).unwrap();
    assert_eq!(s.job(b).unwrap().counts.waiting, 2);
    let mut now = 0;
    let ran = run(&mut s, w, &mut now, |_, _| true);
    let pos = |t| ran.iter().position(|&x| x == t).unwrap();
    assert!(pos((b, 1)) > pos((a, 3)), "{ran:?}");
    assert!(pos((c, 1)) > pos((a, 1)), "{ran:?}");
    assert_eq!(s.job(b).unwrap().counts.finished, 2);
}

#[test]
fn after_a_job_that_fails_cancels_the_waiting_job() {
    let (mut s, w) = setup(1);
    let a = submit(&mut s, files_job("a", 2, &[], &[])).unwrap();
    let (mut spec, tasks) = files_job("b", 2, &[], &[]);
    spec.after = vec![After::parse(&a.to_string()).unwrap()];
    let b = s.submit(0, spec, tasks, false).unwrap();
    let mut now = 0;
    run(&mut s, w, &mut now, |job, id| !(job == a && id == 1));
    let jb = s.job(b).unwrap();
    assert_eq!(jb.counts.canceled, 2);
    assert!(jb.is_done());
    assert_eq!(
        jb.failure(0).unwrap().reason,
        format!("--after {a}: job {a} ended with 1 failed and 0 canceled tasks")
    );
}

#[test]
fn refusals_name_the_tasks_and_files_and_change_nothing() {
    let (mut s, _) = setup(1);
    let a = submit(&mut s, files_job("a", 2, &[], &["mid/{task}"])).unwrap();
    // Two writers of one file.
    let err = submit(&mut s, files_job("b", 2, &[], &["mid/{task}"])).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("task 1 would write mid/1, which task {a}:1 writes already; a file has one writer")
    );
    let err = submit(&mut s, files_job("b", 2, &[], &["same"])).unwrap_err();
    assert!(err.to_string().contains("both write same"), "{err}");
    // Once the first writer's job has ended, a job writing the same files again (a workflow
    // run a second time) is taken.
    let (mut s2, w2) = setup(1);
    let first = submit(&mut s2, files_job("a", 1, &[], &["x"])).unwrap();
    run(&mut s2, w2, &mut 0, |_, _| true);
    assert!(s2.job(first).unwrap().is_done());
    submit(&mut s2, files_job("again", 1, &[], &["x"])).unwrap();
    // A dangling after.
    let (mut spec, tasks) = files_job("c", 1, &[], &[]);
    spec.after = vec![After::parse("99").unwrap()];
    let err = s.submit(0, spec, tasks, false).unwrap_err();
    assert!(
        err.to_string()
            .contains("--after 99: job 99 does not exist"),
        "{err}"
    );
    let (mut spec, tasks) = files_job("c", 1, &[], &[]);
    spec.after = vec![After::parse(&format!("{a}:7")).unwrap()];
    let err = s.submit(0, spec, tasks, false).unwrap_err();
    assert!(err.to_string().contains("has no task 7"), "{err}");
    // A cycle inside one job: line `q` reads q.o.o, which line `q.o` writes, and `q.o` reads
    // q.o, which `q` writes.
    let mut spec = JobSpec::command("cyc", vec!["/bin/true".into()]);
    spec.template.files.inputs = vec!["{line}".into(), "{line}.o.o".into()];
    spec.template.files.outputs = vec!["{line}.o".into()];
    let lines = TaskSet::Lines(["q.o", "q"].into_iter().collect());
    let err = s.submit(0, spec, lines, false).unwrap_err();
    assert!(err.to_string().contains("cycle"), "{err}");
    assert!(
        err.to_string().contains("reads q.o.o written by task"),
        "{err}"
    );
    // Nothing of the refused jobs stayed: the next job takes the next id.
    assert_eq!(s.jobs().count(), 1);
    let d = submit(&mut s, files_job("d", 1, &["mid/1"], &[])).unwrap();
    assert_eq!(d, a + 1);
    assert_eq!(s.job(d).unwrap().counts.waiting, 1);
}

#[test]
fn a_job_submitted_by_a_task_keeps_its_parent_open() {
    let (mut s, w) = setup(2);
    let a = submit(&mut s, files_job("a", 2, &[], &[])).unwrap();
    // Task 1 of `a` submits `b` while it runs; `a` ends only after `b`.
    s.handle(0, Event::Schedule).unwrap();
    s.take_commands();
    let (mut spec, tasks) = files_job("b", 2, &[], &[]);
    spec.parent = Some((a, 1));
    let b = s.submit(0, spec, tasks, false).unwrap();
    let mut now = 0;
    let done = |s: &Scheduler, j| s.job(j).unwrap().is_done();
    // Run only `a`'s tasks first: ends of the assignment made above.
    for index in 0..2 {
        let ends = vec![Finished::at_once(a, index, 5, RunEnd::Success)];
        s.handle(5, Event::TasksEnded { worker: w, ends }).unwrap();
    }
    assert_eq!(s.job(a).unwrap().counts.finished, 2);
    assert!(!done(&s, a), "its child has not run");
    run(&mut s, w, &mut now, |_, _| true);
    assert!(done(&s, b) && done(&s, a));
}

#[test]
fn local_intermediates_are_deleted_when_their_workflow_ends() {
    let (mut s, w) = setup(2);
    let mut local = files_job("a", 3, &[], &["mid/{task}", "final/{task}"]);
    local.0.template.files.keep = vec![Keep::Local, Keep::Persist];
    let a = submit(&mut s, local).unwrap();
    let b = submit(&mut s, files_job("b", 3, &["mid/{task}"], &[])).unwrap();
    assert_eq!(
        s.output_keep(s.job(a).unwrap()),
        vec![Keep::Local, Keep::Persist]
    );
    let mut now = 0;
    let mut others = Vec::new();
    run_keeping(&mut s, w, &mut now, |_, _| true, &mut others, usize::MAX);
    others.extend(s.take_commands());
    // Not at once: the next job of a job file may still join the workflow.
    assert!(!others
        .iter()
        .any(|c| matches!(c, Command::DropFiles { .. })));
    s.handle(now + DROP_GRACE_US - 1, Event::Tick).unwrap();
    assert!(!s
        .take_commands()
        .iter()
        .any(|c| matches!(c, Command::DropFiles { .. })));
    s.handle(now + DROP_GRACE_US, Event::Tick).unwrap();
    others.extend(s.take_commands());
    let mut dropped = Vec::new();
    for c in others {
        if let Command::DropFiles { worker, files } = c {
            assert_eq!(worker, w);
            dropped.extend(files);
        }
    }
    assert!(s.job(b).unwrap().is_done());
    let plain: Vec<String> = dropped
        .iter()
        .map(|n| n.split_once('/').unwrap().1.to_string())
        .collect();
    assert_eq!(
        plain,
        vec!["mid/1", "mid/2", "mid/3"],
        "persisted files stay"
    );
    assert_eq!(s.freed(), (3, 30));
}

#[test]
fn auto_outputs_read_by_a_known_task_stay_local_the_others_persist() {
    let (mut s, _) = setup(1);
    // Task 1 writes all/x (read by the other tasks of the job) and each writes own/{task}.
    let mut spec = JobSpec::command("fan", vec!["/bin/true".into()]);
    spec.template.files.outputs = vec!["own/{line}".into()];
    spec.template.files.inputs = vec!["own/{line}.in".into()];
    let lines = TaskSet::Lines(["a", "a.in"].into_iter().collect());
    let job = s.submit(0, spec, lines, false).unwrap();
    let j = s.job(job).unwrap();
    assert_eq!(s.output_keep(j), vec![Keep::Local]);
    assert_eq!(
        j.counts.waiting, 1,
        "task `a` reads own/a.in, which task `a.in` writes"
    );
    let plain = submit(&mut s, files_job("p", 1, &[], &["solo/{task}"])).unwrap();
    assert_eq!(s.output_keep(s.job(plain).unwrap()), vec![Keep::Persist]);
}

/// A job of one task writing `local:OUTPUT` (as the CLI marks an output a later job of the
/// same job file reads).
fn local_job(name: &str, inputs: &[&str], output: &str) -> (JobSpec, TaskSet) {
    let mut job = files_job(name, 1, inputs, &[output]);
    job.0.template.files.keep = vec![Keep::Local];
    job
}

/// The three-stage chain a → b → c through `mid/{task}` and `mid2/{task}`, one task each,
/// with a and b run on `w` (their outputs only in its cache) and c ready.
fn chain(s: &mut Scheduler, w: WorkerId, now: &mut u64) -> (JobId, JobId, JobId) {
    let a = submit(s, local_job("a", &[], "mid/{task}")).unwrap();
    let b = submit(s, local_job("b", &["mid/{task}"], "mid2/{task}")).unwrap();
    let c = submit(s, files_job("c", 1, &["mid2/{task}"], &[])).unwrap();
    let ran = run_keeping(s, w, now, |_, _| true, &mut Vec::new(), 2);
    assert_eq!(ran, vec![(a, 1), (b, 1)]);
    assert_eq!(state(s, c, 1), TaskState::Ready);
    (a, b, c)
}

#[test]
fn intermediates_lost_with_their_worker_are_made_again_by_their_writers_in_order() {
    let (mut s, w) = setup(1);
    let mut now = 0;
    let (a, b, c) = chain(&mut s, w, &mut now);
    assert!(s.job(a).unwrap().is_done() && s.job(a).unwrap().finished_us.is_some());
    s.handle(now, Event::WorkerLost { worker: w }).unwrap();
    // c waits for b, which waits for a: both outputs are gone.
    assert_eq!(state(&s, c, 1), TaskState::Waiting);
    assert_eq!(state(&s, b, 1), TaskState::Waiting);
    assert_eq!(state(&s, a, 1), TaskState::Ready);
    assert_eq!(s.job(a).unwrap().finished_us, None, "a's job is live again");
    assert_eq!(s.reruns(), 2);
    assert_eq!(s.audit(), Vec::<String>::new());
    let w2 = staging_worker(&mut s, 1);
    let ran = run(&mut s, w2, &mut now, |_, _| true);
    assert_eq!(ran, vec![(a, 1), (b, 1), (c, 1)]);
    for job in [a, b, c] {
        let j = s.job(job).unwrap();
        assert!(j.is_done() && j.finished_us.is_some(), "job {job}");
        assert_eq!(j.counts.finished, 1);
    }
    assert_eq!(s.reruns(), 2);
    assert_eq!(s.audit(), Vec::<String>::new());
}

#[test]
fn a_worker_back_with_its_cache_before_the_re_runs_start_saves_them() {
    let (mut s, w) = setup(1);
    let mut now = 0;
    let (a, b, c) = chain(&mut s, w, &mut now);
    s.handle(now, Event::WorkerLost { worker: w }).unwrap();
    assert_eq!(s.reruns(), 2);
    // The same worker restarts with its cache: it registers anew and reports what it holds.
    let back = staging_worker(&mut s, 1);
    let added = ["mid/1", "mid2/1"]
        .iter()
        .map(|n| (cached_name(Some(STORE), n), 10))
        .collect();
    s.handle(
        now,
        Event::CacheChanged {
            worker: back,
            added,
            evicted: vec![],
        },
    )
    .unwrap();
    assert_eq!(s.reruns(), 0);
    assert_eq!(state(&s, a, 1), TaskState::Finished);
    assert_eq!(state(&s, b, 1), TaskState::Finished);
    assert!(
        s.job(a).unwrap().finished_us.is_some(),
        "a's job ended again"
    );
    assert_eq!(state(&s, c, 1), TaskState::Ready);
    let ran = run(&mut s, back, &mut now, |_, _| true);
    assert_eq!(ran, vec![(c, 1)], "nothing is recomputed");
    assert_eq!(s.audit(), Vec::<String>::new());
}

/// Assigns what can run on `w` and returns the (job, index) of the one task assigned.
fn assign_one(s: &mut Scheduler, now: u64) -> (JobId, TaskIndex) {
    s.handle(now, Event::Schedule).unwrap();
    let runs: Vec<IndexRun> = s
        .take_commands()
        .into_iter()
        .flat_map(|c| match c {
            Command::Assign { runs, .. } => runs,
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    (runs[0].job, runs[0].first)
}

fn not_found(name: &str) -> RunEnd {
    let mut failure = Failure::because(format!(
        "input {name} not found in {STORE}; check the name, or put the file there (not retried)"
    ));
    failure.permanent = true;
    RunEnd::Failed(Box::new(failure))
}

#[test]
fn a_reader_sent_out_before_its_input_was_lost_waits_for_it_instead_of_failing() {
    let (mut s, w) = setup(1);
    let a = submit(&mut s, local_job("a", &[], "mid/{task}")).unwrap();
    let b = submit(&mut s, files_job("b", 1, &["mid/{task}"], &[])).unwrap();
    let mid = cached_name(Some(STORE), "mid/1");
    let mut now = 0;
    // Each round: a runs (again), b is sent out, the only copy of mid/1 vanishes (evicted),
    // and b finds its input nowhere. Three times a runs again; the fourth, b fails.
    for round in 0..=3u8 {
        assert_eq!(assign_one(&mut s, now), (a, 0), "round {round}");
        now += 10;
        let added = vec![(mid.clone(), 10)];
        s.handle(
            now,
            Event::CacheChanged {
                worker: w,
                added,
                evicted: vec![],
            },
        )
        .unwrap();
        let ends = vec![Finished::at_once(a, 0, now, RunEnd::Success)];
        s.handle(now, Event::TasksEnded { worker: w, ends })
            .unwrap();
        assert_eq!(assign_one(&mut s, now), (b, 0));
        s.handle(
            now,
            Event::CacheChanged {
                worker: w,
                added: vec![],
                evicted: vec![mid.clone()],
            },
        )
        .unwrap();
        let ends = vec![Finished::at_once(b, 0, now, not_found("mid/1"))];
        s.handle(now, Event::TasksEnded { worker: w, ends })
            .unwrap();
        assert_eq!(s.audit(), Vec::<String>::new());
        if round < 3 {
            assert_eq!(state(&s, b, 1), TaskState::Waiting, "round {round}");
            assert_eq!(state(&s, a, 1), TaskState::Ready);
            assert_eq!(s.reruns(), u64::from(round) + 1);
        }
    }
    let jb = s.job(b).unwrap();
    assert_eq!(jb.record(0).state, TaskState::Failed);
    assert_eq!(
        jb.failure(0).unwrap().reason,
        format!("input mid/1, written by task {a}:1, was lost with the worker that held it and is not made again: it was made again 3 times already")
    );
    assert!(jb.is_done());
}

#[test]
fn a_replayed_journal_rescues_a_reader_as_it_was_rescued() {
    let mut s = Scheduler::new(Config {
        store: Some(STORE.into()),
        ..Config::default()
    });
    let (spec, tasks) = local_job("a", &[], "mid/{task}");
    s.restore_submit(1, 0, spec, tasks, false).unwrap();
    let (spec, tasks) = files_job("b", 1, &["mid/{task}"], &[]);
    s.restore_submit(2, 0, spec, tasks, false).unwrap();
    s.restore_task_end(Finished::at_once(1, 0, 10, RunEnd::Success), 5);
    s.restore_task_end(Finished::at_once(2, 0, 20, not_found("mid/1")), 15);
    // a's second success, as the journal has it.
    s.restore_task_end(Finished::at_once(1, 0, 30, RunEnd::Success), 25);
    s.restore_task_end(Finished::at_once(2, 0, 40, RunEnd::Success), 35);
    s.restore_done();
    for job in [1, 2] {
        let j = s.job(job).unwrap();
        assert!(j.is_done(), "job {job}: {:?}", j.counts);
        assert_eq!(j.counts.finished, 1);
    }
    assert_eq!(s.audit(), Vec::<String>::new());
}

#[test]
fn a_writer_with_replicas_has_its_local_outputs_copied_to_other_workers() {
    let (mut s, w) = setup(1);
    let others = [staging_worker(&mut s, 1), staging_worker(&mut s, 1)];
    let mut spec = local_job("a", &[], "mid/{task}");
    spec.0.template.files.replicas = 2;
    let a = submit(&mut s, spec).unwrap();
    submit(&mut s, local_job("b", &["mid/{task}"], "out/{task}")).unwrap();
    let (job, index) = assign_one(&mut s, 0);
    assert_eq!(job, a);
    let writer = s.job(a).unwrap().record(index).worker;
    let mid = cached_name(Some(STORE), "mid/1");
    s.handle(
        10,
        Event::CacheChanged {
            worker: writer,
            added: vec![(mid.clone(), 10)],
            evicted: vec![],
        },
    )
    .unwrap();
    let ends = vec![Finished::at_once(a, 0, 10, RunEnd::Success)];
    s.handle(
        10,
        Event::TasksEnded {
            worker: writer,
            ends,
        },
    )
    .unwrap();
    let copies: Vec<(WorkerId, Vec<String>)> = s
        .take_commands()
        .into_iter()
        .filter_map(|c| match c {
            Command::Replicate { worker, files } => Some((worker, files)),
            _ => None,
        })
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_ne!(copies[0].0, writer);
    assert!([w, others[0], others[1]].contains(&copies[0].0));
    assert_eq!(copies[0].1, vec![mid]);
}

#[test]
fn a_parent_job_keeps_its_workflow_and_files_alive_while_it_runs() {
    let (mut s, w) = setup(3);
    // A plain job of two tasks, both running: each will submit a child job.
    let parent = submit(&mut s, files_job("p", 2, &[], &[])).unwrap();
    s.handle(0, Event::Schedule).unwrap();
    s.take_commands();
    let mut child_a = local_job("a", &[], "mid/{task}");
    child_a.0.parent = Some((parent, 1));
    submit(&mut s, child_a).unwrap();
    // The first child runs and ends; the parent's second task has yet to submit its reader.
    let mut now = 0;
    let mut others = Vec::new();
    run_keeping(&mut s, w, &mut now, |_, _| true, &mut others, usize::MAX);
    others.extend(s.take_commands());
    assert!(
        !others
            .iter()
            .any(|c| matches!(c, Command::DropFiles { .. })),
        "the parent still runs: {others:?}"
    );
    let mut child_b = local_job("b", &["mid/{task}"], "out/{task}");
    child_b.0.parent = Some((parent, 2));
    let b = submit(&mut s, child_b).unwrap();
    assert_eq!(state(&s, b, 1), TaskState::Ready, "mid/1 is there to read");
}

#[test]
fn a_plain_job_named_in_an_after_keeps_its_workflow_and_files_alive() {
    let (mut s, w) = setup(2);
    let gate = submit(&mut s, files_job("gate", 1, &[], &[])).unwrap();
    let a = submit(&mut s, local_job("a", &[], "mid/{task}")).unwrap();
    let mut reader = local_job("b", &["mid/{task}"], "out/{task}");
    reader.0.after = vec![After {
        job: gate,
        tasks: None,
    }];
    let b = submit(&mut s, reader).unwrap();
    let mut now = 0;
    // a runs, then the gate: the workflow (gate, a, b) is not over, b has yet to read mid/1.
    let mut others = Vec::new();
    run_keeping(&mut s, w, &mut now, |job, _| job != b, &mut others, 1);
    others.extend(s.take_commands());
    assert!(s.job(a).unwrap().is_done() && s.job(gate).unwrap().is_done());
    assert!(
        !others
            .iter()
            .any(|c| matches!(c, Command::DropFiles { .. })),
        "{others:?}"
    );
    run(&mut s, w, &mut now, |_, _| true);
    assert!(s.job(b).unwrap().is_done());
}

#[test]
fn a_reader_submitted_just_after_its_writers_workflow_ended_still_finds_the_files() {
    let (mut s, w) = setup(1);
    let a = submit(&mut s, local_job("a", &[], "mid/{task}")).unwrap();
    let mut now = 0;
    run(&mut s, w, &mut now, |_, _| true);
    assert!(s.job(a).unwrap().finished_us.is_some());
    // The next job of the job file comes a moment later: it joins the ended workflow.
    s.handle(now + DROP_GRACE_US / 2, Event::Tick).unwrap();
    let b = submit(&mut s, local_job("b", &["mid/{task}"], "out/{task}")).unwrap();
    assert_eq!(state(&s, b, 1), TaskState::Ready);
    s.handle(now + DROP_GRACE_US, Event::Tick).unwrap();
    assert!(!s
        .take_commands()
        .iter()
        .any(|c| matches!(c, Command::DropFiles { .. })));
    run(&mut s, w, &mut now, |_, _| true);
    now += DROP_GRACE_US;
    s.handle(now, Event::Tick).unwrap();
    let dropped = s
        .take_commands()
        .into_iter()
        .filter(|c| matches!(c, Command::DropFiles { .. }))
        .count();
    assert_eq!(dropped, 1);
    // Told to delete them, the worker is no longer named as holding them.
    let mid = s.files().id(&cached_name(Some(STORE), "mid/1")).unwrap();
    assert!(s.files().holders(mid).is_empty());
}

#[test]
fn a_reader_of_a_file_whose_writers_job_was_canceled_fails_instead_of_waiting() {
    let (mut s, w) = setup(1);
    let a = submit(&mut s, local_job("a", &[], "mid/{task}")).unwrap();
    // Two readers of mid/1: one sent out, one still queued when the file goes.
    let b = submit(&mut s, files_job("b", 2, &["mid/1"], &[])).unwrap();
    let mid = cached_name(Some(STORE), "mid/1");
    assert_eq!(assign_one(&mut s, 0), (a, 0));
    let added = vec![(mid.clone(), 10)];
    s.handle(
        10,
        Event::CacheChanged {
            worker: w,
            added,
            evicted: vec![],
        },
    )
    .unwrap();
    let ends = vec![Finished::at_once(a, 0, 10, RunEnd::Success)];
    s.handle(10, Event::TasksEnded { worker: w, ends }).unwrap();
    assert_eq!(assign_one(&mut s, 10), (b, 0));
    // The only copy goes while b's first task is out: a is to run again for the second;
    // then a's job is canceled.
    let evicted = vec![mid];
    s.handle(
        20,
        Event::CacheChanged {
            worker: w,
            added: vec![],
            evicted,
        },
    )
    .unwrap();
    assert_eq!(s.reruns(), 1);
    s.handle(30, Event::Cancel { job: a }).unwrap();
    let ends = vec![Finished::at_once(b, 0, 40, not_found("mid/1"))];
    s.handle(40, Event::TasksEnded { worker: w, ends }).unwrap();
    let jb = s.job(b).unwrap();
    assert_eq!(jb.record(0).state, TaskState::Failed);
    assert!(
        jb.is_done(),
        "b ends rather than wait for a writer that will not run"
    );
    assert!(
        jb.failure(0)
            .unwrap()
            .reason
            .contains(&format!("job {a} was canceled")),
        "{}",
        jb.failure(0).unwrap().reason
    );
}

/// A job of lines reading `inputs` and writing `outputs` (patterns over `{line}`).
fn lines_job(inputs: &[&str], outputs: &[&str], lines: &[&str]) -> (JobSpec, TaskSet) {
    let mut spec = JobSpec::command("pieces", vec!["/bin/true".into()]);
    spec.template.files.inputs = inputs.iter().map(|s| s.to_string()).collect();
    spec.template.files.outputs = outputs.iter().map(|s| s.to_string()).collect();
    (spec, TaskSet::Lines(lines.iter().copied().collect()))
}

fn extend(s: &mut Scheduler, job: JobId, at: u32, lines: &[&str]) -> Result<Reply, SchedError> {
    let more = TaskSet::Lines(lines.iter().copied().collect());
    s.handle(
        0,
        Event::Extend {
            job,
            at,
            more,
            close: true,
        },
    )
}

#[test]
fn a_job_sent_in_pieces_is_linked_when_its_last_piece_is_in() {
    let (mut s, w) = setup(1);
    // Line `x.o` (first piece) reads x.o, which line `x` (second piece) writes.
    let (spec, first) = lines_job(&["{line}"], &["{line}.o"], &["x.o"]);
    let job = s.submit(0, spec, first, true).unwrap();
    let j = s.job(job).unwrap();
    assert!(j.held());
    assert_eq!((j.counts.waiting, j.counts.ready), (1, 0));
    let mut now = 0;
    assert!(run(&mut s, w, &mut now, |_, _| true).is_empty(), "held");
    extend(&mut s, job, 1, &["x"]).unwrap();
    let j = s.job(job).unwrap();
    assert!(!j.held());
    // Tasks of a list are numbered from 0.
    assert_eq!(
        state(&s, job, 0),
        TaskState::Waiting,
        "waits for its writer"
    );
    assert_eq!(state(&s, job, 1), TaskState::Ready);
    let ran = run(&mut s, w, &mut now, |_, _| true);
    assert_eq!(ran, vec![(job, 1), (job, 0)]);
    assert!(s.job(job).unwrap().is_done());
    // x.o was read by a task of the job: kept local.
    assert_eq!(s.output_keep(s.job(job).unwrap()), vec![Keep::Local]);
    assert!(s
        .take_records()
        .iter()
        .any(|r| matches!(r, Record::Extended { close: true, .. })));
}

#[test]
fn a_job_sent_in_pieces_refused_at_its_last_piece_is_withdrawn_whole() {
    let (mut s, _) = setup(1);
    // The cycle of `refusals_name_the_tasks_and_files_and_change_nothing`, one line a piece.
    let (spec, first) = lines_job(&["{line}", "{line}.o.o"], &["{line}.o"], &["q.o"]);
    let job = s.submit(0, spec, first, true).unwrap();
    s.take_records();
    let err = extend(&mut s, job, 1, &["q"]).unwrap_err();
    assert!(err.to_string().contains("cycle"), "{err}");
    assert!(s.job(job).is_none(), "withdrawn");
    let records = s.take_records();
    assert!(
        matches!(
            records.as_slice(),
            [Record::Canceled { .. }, Record::Forgotten { .. }]
        ),
        "{records:?}"
    );
    // Nothing of it stayed in the graph: another job may write its files.
    let again = submit(&mut s, files_job("again", 1, &[], &["q.o"])).unwrap();
    assert_eq!(again, job + 1);
}

#[test]
fn a_writers_files_outlive_its_workflow_while_a_reader_is_sent_in_pieces() {
    let (mut s, w) = setup(1);
    let a = submit(&mut s, local_job("a", &[], "mid/{task}")).unwrap();
    let (spec, first) = lines_job(&["mid/1"], &[], &["r1"]);
    let b = s.submit(0, spec, first, true).unwrap();
    let mut now = 0;
    run(&mut s, w, &mut now, |_, _| true);
    assert!(s.job(a).unwrap().finished_us.is_some());
    // The last piece comes long after the writer's job ended: its file is still there.
    now += 10 * DROP_GRACE_US;
    s.handle(now, Event::Tick).unwrap();
    assert!(!s
        .take_commands()
        .iter()
        .any(|c| matches!(c, Command::DropFiles { .. })));
    extend(&mut s, b, 1, &["r2"]).unwrap();
    assert_eq!(run(&mut s, w, &mut now, |_, _| true).len(), 2);
    s.handle(now + DROP_GRACE_US, Event::Tick).unwrap();
    assert!(s
        .take_commands()
        .iter()
        .any(|c| matches!(c, Command::DropFiles { .. })));
}

#[test]
fn a_replayed_journal_holds_and_links_a_job_sent_in_pieces_as_it_was() {
    let (mut s, w) = setup(1);
    let (spec, first) = lines_job(&["{line}"], &["{line}.o"], &["x.o"]);
    s.restore_submit(1, 0, spec, first, true).unwrap();
    assert!(s.job(1).unwrap().held());
    extend(&mut s, 1, 1, &["x"]).unwrap();
    s.restore_done();
    let mut now = 0;
    assert_eq!(run(&mut s, w, &mut now, |_, _| true), vec![(1, 1), (1, 0)]);
}

#[test]
fn a_job_canceled_while_sent_in_pieces_is_not_retried_and_an_open_array_is_refused() {
    let (mut s, w) = setup(1);
    let (spec, first) = lines_job(&["{line}"], &["{line}.o"], &["x.o"]);
    let job = s.submit(0, spec, first, true).unwrap();
    assert_eq!(state(&s, job, 0), TaskState::Waiting);
    s.handle(0, Event::Cancel { job }).unwrap();
    assert!(s.job(job).unwrap().is_done());
    let err = s
        .handle(
            0,
            Event::Retry {
                job,
                failed_only: false,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("submit it again"), "{err}");
    assert!(run(&mut s, w, &mut 0, |_, _| true).is_empty());
    let (spec, tasks) = files_job("arr", 2, &[], &["a/{task}"]);
    assert!(
        s.submit(0, spec, tasks, true).is_err(),
        "an open array never ends"
    );
}

/// What one task waits for: `(job, task)`, `None` for a task of the same job.
type On<'a> = &'a [(Option<JobId>, u32)];

/// A list job of `n` tasks (ids `0..n`) whose `deps` are `(task, on)`.
fn deps_job(name: &str, n: u32, deps: &[(u32, On)]) -> (JobSpec, TaskSet) {
    let mut spec = JobSpec::command(name, Vec::new());
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
    let list = (0..n).map(|i| vec![format!("t{i}")]).collect();
    (spec, TaskSet::List(list))
}

#[test]
fn deps_order_the_tasks_of_a_job() {
    let (mut s, w) = setup(4);
    let job = submit(
        &mut s,
        deps_job(
            "diamond",
            4,
            &[
                (3, &[(None, 1), (None, 2)]),
                (1, &[(None, 0)]),
                (2, &[(None, 0)]),
            ],
        ),
    )
    .unwrap();
    assert_eq!(s.job(job).unwrap().counts.waiting, 3);
    assert_eq!(state(&s, job, 0), TaskState::Ready);
    let mut now = 0;
    let ran = run(&mut s, w, &mut now, |_, _| true);
    // 0 first; 1 and 2 once it ended; 3 last, although four slots were free all along.
    assert_eq!(ran, vec![(job, 0), (job, 1), (job, 2), (job, 3)]);
    assert!(s.job(job).unwrap().is_done());
    let g = s.workflow_graph(job).unwrap();
    let mut edges = g.deps.clone();
    edges.sort_unstable();
    assert_eq!(
        edges,
        vec![
            ((job, 0), (job, 1)),
            ((job, 0), (job, 2)),
            ((job, 1), (job, 3)),
            ((job, 2), (job, 3))
        ]
    );
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}

#[test]
fn a_failed_task_cancels_what_depends_on_it_with_the_reason() {
    let (mut s, w) = setup(1);
    let job = submit(
        &mut s,
        deps_job("chain", 4, &[(1, &[(None, 0)]), (2, &[(None, 1)])]),
    )
    .unwrap();
    let mut now = 0;
    let ran = run(&mut s, w, &mut now, |_, id| id != 0);
    // 3 depends on nothing and runs; 1 and 2 never do.
    assert_eq!(ran, vec![(job, 0), (job, 3)]);
    let j = s.job(job).unwrap();
    assert_eq!(
        (j.counts.failed, j.counts.canceled, j.counts.finished),
        (1, 2, 1)
    );
    assert!(j.is_done());
    assert_eq!(
        j.failure(1).unwrap().reason,
        format!("deps: task {job}:0 failed")
    );
    assert_eq!(
        j.failure(2).unwrap().reason,
        format!("deps: task {job}:1 was canceled")
    );
}

#[test]
fn a_task_may_wait_for_a_task_of_an_earlier_job() {
    let (mut s, w) = setup(2);
    let (spec, tasks) = files_job("prep", 2, &[], &[]);
    let prep = submit(&mut s, (spec, tasks)).unwrap();
    let post = submit(&mut s, deps_job("post", 2, &[(0, &[(Some(prep), 2)])])).unwrap();
    assert_eq!(state(&s, post, 0), TaskState::Waiting);
    assert_eq!(state(&s, post, 1), TaskState::Ready);
    let mut now = 0;
    let ran = run(&mut s, w, &mut now, |_, _| true);
    let at = |k| ran.iter().position(|x| *x == k).unwrap();
    assert!(at((prep, 2)) < at((post, 0)), "{ran:?}");
    assert!(s.job(post).unwrap().is_done());
    // Once prep:2 has finished, a job depending on it waits for nothing.
    let late = submit(&mut s, deps_job("late", 1, &[(0, &[(Some(prep), 2)])])).unwrap();
    assert_eq!(state(&s, late, 0), TaskState::Ready);
}

#[test]
fn impossible_deps_are_refused_naming_the_tasks() {
    let (mut s, w) = setup(1);
    let refused = |s: &mut Scheduler, job| match submit(s, job) {
        Err(SchedError::Graph(msg)) => msg,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        refused(&mut s, deps_job("self", 2, &[(1, &[(None, 1)])])),
        "task 1 depends on itself"
    );
    assert_eq!(
        refused(&mut s, deps_job("unknown", 2, &[(1, &[(None, 5)])])),
        "task 1 depends on task 5, which the job does not have"
    );
    assert_eq!(
        refused(&mut s, deps_job("nobody", 2, &[(7, &[(None, 0)])])),
        "deps of task 7: the job has no task 7"
    );
    assert_eq!(
        refused(
            &mut s,
            deps_job("cycle", 4, &[(0, &[(None, 2)]), (1, &[(None, 0)]), (2, &[(None, 1)])])
        ),
        "the job's tasks wait for each other in a cycle: task 0 depends on task 2, task 2 depends on task 1, task 1 depends on task 0"
    );
    assert_eq!(
        refused(&mut s, deps_job("ghost", 1, &[(0, &[(Some(99), 1)])])),
        "task 0 depends on task 99:1, but job 99 does not exist; `kestrel job list` shows the jobs"
    );
    let (spec, tasks) = files_job("bad", 1, &[], &[]);
    let bad = submit(&mut s, (spec, tasks)).unwrap();
    let mut now = 0;
    run(&mut s, w, &mut now, |_, _| false);
    assert_eq!(
        refused(&mut s, deps_job("after-bad", 1, &[(0, &[(Some(bad), 1)])])),
        format!("task 0 depends on task {bad}:1, which has failed, so it could never start; `kestrel job retry {bad}` first")
    );
    assert_eq!(
        refused(
            &mut s,
            deps_job("no-such-task", 1, &[(0, &[(Some(bad), 4)])])
        ),
        format!("task 0 depends on task {bad}:4, but job {bad} has no task 4")
    );
    // Nothing of the refused jobs is left.
    assert_eq!(s.jobs().count(), 1);
}

#[test]
fn a_replayed_journal_keeps_the_deps() {
    let mut s = Scheduler::new(Config::default());
    let (spec, tasks) = deps_job("chain", 3, &[(1, &[(None, 0)]), (2, &[(None, 1)])]);
    s.restore_submit(1, 0, spec, tasks, false).unwrap();
    s.restore_task_end(Finished::at_once(1, 0, 5, RunEnd::Success), 1);
    s.restore_done();
    let j = s.job(1).unwrap();
    assert_eq!(
        (0..3).map(|i| j.record(i).state).collect::<Vec<_>>(),
        vec![TaskState::Finished, TaskState::Ready, TaskState::Waiting]
    );
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}

#[test]
fn tasks_with_ids_of_their_own_are_named_by_them() {
    let (mut s, w) = setup(2);
    // HyperQueue's example: ids 1, 3 and 5, the last waiting for the other two.
    let (mut spec, tasks) = deps_job("ids", 3, &[(5, &[(None, 1), (None, 3)])]);
    spec.task_ids = Some(IdRanges::parse("1,3,5").unwrap());
    let job = submit(&mut s, (spec.clone(), tasks.clone())).unwrap();
    let j = s.job(job).unwrap();
    assert_eq!(
        (j.task_id(2), j.index_of(5), j.index_of(2)),
        (5, Some(2), None)
    );
    assert_eq!(state(&s, job, 5), TaskState::Waiting);
    let mut now = 0;
    let ran = run(&mut s, w, &mut now, |_, _| true);
    assert_eq!(ran, vec![(job, 1), (job, 3), (job, 5)]);
    // One id per task, sorted; only for a list.
    let mut short = spec.clone();
    short.task_ids = Some(IdRanges::parse("1,3").unwrap());
    assert_eq!(
        submit(&mut s, (short, tasks.clone())),
        Err(SchedError::Spec(SpecError::TaskIds(
            "2 ids for 3 tasks; give one id per task".into()
        )))
    );
    let mut array = spec;
    array.template.argv = vec!["x".into()];
    assert!(matches!(
        submit(&mut s, (array, TaskSet::Array(IdRanges::span(1, 3)))),
        Err(SchedError::Spec(SpecError::TaskIds(_)))
    ));
}

#[test]
fn a_retried_job_runs_its_tasks_in_the_order_of_their_deps_again() {
    let (mut s, w) = setup(4);
    let job = submit(
        &mut s,
        deps_job("chain", 3, &[(1, &[(None, 0)]), (2, &[(None, 1)])]),
    )
    .unwrap();
    let mut now = 0;
    let first = std::cell::Cell::new(true);
    // Task 0 fails the first time only.
    let ran = run(&mut s, w, &mut now, |_, id| {
        id != 0 || !first.replace(false)
    });
    assert_eq!(ran, vec![(job, 0)]);
    assert_eq!(s.job(job).unwrap().counts.canceled, 2);
    s.handle(
        now,
        Event::Retry {
            job,
            failed_only: false,
        },
    )
    .unwrap();
    // 1 and 2 wait again for what they depend on, instead of running at once beside 0.
    assert_eq!(state(&s, job, 1), TaskState::Waiting);
    assert_eq!(state(&s, job, 2), TaskState::Waiting);
    let ran = run(&mut s, w, &mut now, |_, _| true);
    assert_eq!(ran, vec![(job, 0), (job, 1), (job, 2)]);
    assert_eq!(s.job(job).unwrap().counts.finished, 3);
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}
