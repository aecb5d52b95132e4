//! Function tasks (Python functions called in a worker's runner): routed only to workers that
//! run Python, whichever path places them, and refused at submission when malformed.

mod common;

use common::{offer, Events};
use kestrel_core::*;
use kestrel_core::{files, values};

/// A job calling `mod.f` once per argument line.
fn function_job() -> JobSpec {
    let mut spec = JobSpec::command("f", Vec::new());
    spec.template.kind = TaskKind::Function(Box::new(FunctionSpec {
        name: "mod.f".into(),
        pickled: vec![0x80, 0x05, b'.'],
        inline_limit: DEFAULT_INLINE_LIMIT,
        ..FunctionSpec::default()
    }));
    spec
}

fn lines(n: usize) -> TaskSet {
    TaskSet::Lines(
        (0..n)
            .map(|i| format!("arg{i}"))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
    )
}

#[test]
fn function_tasks_go_only_to_workers_that_run_python() {
    let mut s = Scheduler::default();
    let plain = s.worker_joined(0, offer(true, false));
    let python = s.worker_joined(0, offer(true, true));
    let calls = s
        .submit(0, function_job(), lines(4), false)
        .expect("submits");
    let commands = s
        .submit(0, common::spec("cmd"), common::array(4), false)
        .expect("submits");
    // The runner's worker takes only the function's tasks (its 2 slots), the other worker
    // the commands; the 2 calls left wait for the runner's slots.
    assert_eq!(
        common::assignments(&mut s, 1),
        vec![(plain, commands, 2), (python, calls, 2)]
    );
    assert_eq!(
        s.stall(calls),
        None,
        "they wait for busy slots, nothing more"
    );
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}

#[test]
fn a_function_job_without_a_runner_says_how_to_start_one() {
    let mut s = Scheduler::default();
    s.worker_joined(0, offer(true, false));
    let calls = s
        .submit(0, function_job(), lines(2), false)
        .expect("submits");
    assert!(
        common::assignments(&mut s, 1).is_empty(),
        "a worker without Python took a call"
    );
    let stall = s.stall(calls).expect("the job says why it does not move");
    assert_eq!(stall, Stall::NoRunner);
    assert!(
        stall.to_string().contains("kestrel worker start --python"),
        "{stall}"
    );
}

#[test]
fn function_tasks_with_files_need_a_runner_with_a_cache() {
    let mut s = Scheduler::default();
    let runner_no_cache = s.worker_joined(0, offer(false, true));
    let cache_no_runner = s.worker_joined(0, offer(true, false));
    let mut spec = function_job();
    spec.template.files.inputs = vec!["in/{task}".into()];
    spec.placement.policy = Some(PolicyName::MaxComputeUtil);
    let calls = s.submit(0, spec, lines(2), false).expect("submits");
    assert!(
        common::assignments(&mut s, 1).is_empty(),
        "placed on a worker that cannot run it"
    );
    // A worker with both takes them through the data-aware window.
    let both = s.worker_joined(2, offer(true, true));
    assert_eq!(common::assignments(&mut s, 3), vec![(both, calls, 2)]);
    assert_ne!(both, runner_no_cache);
    assert_ne!(both, cache_no_runner);
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}

#[test]
fn malformed_function_jobs_are_refused_with_what_to_change() {
    let mut s = Scheduler::default();
    let err = s
        .submit(0, function_job(), common::array(3), false)
        .unwrap_err();
    assert!(
        matches!(&err, SchedError::Spec(SpecError::FunctionNotLines { name, .. }) if name == "mod.f"),
        "{err}"
    );
    let mut both = function_job();
    both.template.argv = vec!["echo".into()];
    let err = s.submit(0, both, lines(1), false).unwrap_err();
    assert!(
        matches!(err, SchedError::Spec(SpecError::FunctionWithCommand(_))),
        "{err}"
    );
    let mut wide = function_job();
    wide.nodes = 2;
    let err = s.submit(0, wide, lines(1), false).unwrap_err();
    assert!(
        matches!(err, SchedError::Spec(SpecError::NodesWithFunction(2))),
        "{err}"
    );
    let mut big = function_job();
    if let TaskKind::Function(f) = &mut big.template.kind {
        f.inline_limit = MAX_STREAM_LIMIT + 1;
    }
    let err = s.submit(0, big, lines(1), false).unwrap_err();
    assert!(
        matches!(err, SchedError::Spec(SpecError::InlineLimit(_))),
        "{err}"
    );
    assert_eq!(s.jobs().count(), 0, "nothing half-submitted");
}

/// The drops `s` has commanded since the last look, by worker.
fn drops(s: &mut Scheduler) -> Vec<(WorkerId, Vec<String>)> {
    s.take_commands()
        .into_iter()
        .filter_map(|c| match c {
            Command::DropFiles { worker, files } => Some((worker, files)),
            _ => None,
        })
        .collect()
}

fn cached(s: &mut Scheduler, worker: WorkerId, names: &[&str]) {
    let added = names.iter().map(|n| (n.to_string(), 1000)).collect();
    s.call(
        0,
        Event::CacheChanged {
            worker,
            added,
            evicted: vec![],
        },
    )
    .expect("a known worker");
}

#[test]
fn a_result_kept_as_a_value_leaves_every_cache_when_its_job_is_forgotten() {
    let mut s = Scheduler::default();
    let runner = s.worker_joined(0, offer(true, true));
    let other = s.worker_joined(0, offer(true, true));
    let job = s.submit(0, function_job(), lines(1), false).unwrap();
    assert_eq!(common::assignments(&mut s, 1), vec![(runner, job, 1)]);
    let result = values::result_name("ab12", job, 0);
    // The worker reports the value with the task's end; a consumer's worker fetched a copy.
    cached(&mut s, runner, &[&result]);
    s.task_finished(2, runner, Finished::at_once(job, 0, 2, RunEnd::Success));
    cached(&mut s, other, &[&result]);
    assert_eq!(s.holders_of(&result), [runner, other]);
    s.take_commands();
    s.forget_job(job).unwrap();
    assert_eq!(
        drops(&mut s),
        vec![
            (runner, vec![result.clone()]),
            (other, vec![result.clone()])
        ]
    );
    assert!(s.holders_of(&result).is_empty(), "no longer named as held");
    assert_eq!(s.values_freed(), (2, 2000));
}

#[test]
fn a_client_drops_values_and_nothing_else() {
    let mut s = Scheduler::default();
    let w = s.worker_joined(0, offer(true, true));
    let scattered = "kestrel-values/s/0f3c";
    let intermediate = files::cached_name(Some("/store"), "mid/1");
    cached(&mut s, w, &[scattered, &intermediate]);
    s.take_commands();
    let reply = s
        .call(
            1,
            Event::DropValues {
                files: vec![
                    scattered.into(),
                    intermediate.clone(),
                    "kestrel-values/s/never-held".into(),
                ],
            },
        )
        .unwrap();
    assert_eq!(reply, Reply::Dropped(1));
    assert_eq!(drops(&mut s), vec![(w, vec![scattered.to_string()])]);
    assert_eq!(s.holders_of(&intermediate), [w], "not a value: kept");
}

#[test]
fn an_argument_value_is_read_where_it_is_and_goes_with_its_job() {
    let mut s = Scheduler::default();
    let far = s.worker_joined(0, offer(true, true));
    let near = s.worker_joined(0, offer(true, true));
    let argument = "kestrel-values/a/77aa";
    // Named alike whatever the job's store: a value belongs to none.
    assert_eq!(files::cached_name(Some("/data"), argument), argument);
    cached(&mut s, near, &[argument]);
    let mut spec = function_job();
    spec.template.files.inputs = vec![argument.into()];
    spec.placement.policy = Some(PolicyName::MaxCacheHit);
    let job = s.submit(0, spec, lines(1), false).unwrap();
    assert_eq!(common::assignments(&mut s, 1), vec![(near, job, 1)]);
    assert_ne!(near, far);
    s.task_finished(2, near, Finished::at_once(job, 0, 2, RunEnd::Success));
    s.take_commands();
    s.forget_job(job).unwrap();
    assert_eq!(drops(&mut s), vec![(near, vec![argument.to_string()])]);
}

#[test]
fn readers_of_one_value_fill_idle_workers_before_queueing_behind_its_busy_holder() {
    let mut s = Scheduler::default();
    // Workers of one slot and a prefetch window of one, as `kestrel worker start --slots 1`.
    let one_slot = || WorkerOffer {
        resources: Resources {
            cpus: 1,
            ..Resources::NONE
        },
        prefetch: 1,
        ..offer(true, true)
    };
    let workers: Vec<WorkerId> = (0..5).map(|_| s.worker_joined(0, one_slot())).collect();
    let value = "kestrel-values/r/ab/1/0";
    cached(&mut s, workers[2], &[value]);
    let reader = || {
        let mut spec = function_job();
        spec.template.files.inputs = vec![value.into()];
        spec.placement.policy = Some(PolicyName::MaxComputeUtil);
        spec
    };
    // One call at a time, as a client submits them: the holder takes the first, and each
    // other goes to an idle worker rather than into the busy holder's prefetch window.
    let mut placed = Vec::new();
    for t in 1..=5 {
        s.submit(t, reader(), lines(1), false).unwrap();
        placed.extend(
            common::assignments(&mut s, t)
                .into_iter()
                .map(|(w, _, _)| w),
        );
    }
    assert_eq!(placed[0], workers[2], "the holder first");
    let mut sorted = placed.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, workers, "one each: {placed:?}");
    // Nothing waits anywhere, so nothing is asked back.
    s.handle(6, Event::Schedule).unwrap();
    let revokes = s
        .take_commands()
        .into_iter()
        .filter(|c| matches!(c, Command::Revoke { .. }))
        .count();
    assert_eq!(revokes, 0);
}

#[test]
fn a_result_lost_with_its_worker_is_made_again_for_the_call_that_reads_it() {
    let mut s = Scheduler::default();
    let a = s.worker_joined(0, offer(true, true));
    let job = s.submit(0, function_job(), lines(1), false).unwrap();
    assert_eq!(common::assignments(&mut s, 1), vec![(a, job, 1)]);
    let value = values::result_name("ab12", job, 0);
    cached(&mut s, a, &[&value]);
    s.task_finished(2, a, Finished::at_once(job, 0, 2, RunEnd::Success));
    // Its only holder goes; another worker comes.
    s.worker_lost(3, a);
    let b = s.worker_joined(4, offer(true, true));
    assert!(s.holders_of(&value).is_empty());
    assert!(s.value_readable(&value), "its task can run again");
    // A call reading it: the task that made it runs again first, the call waits for it.
    let mut spec = function_job();
    spec.template.files.inputs = vec![value.clone()];
    spec.placement.policy = Some(PolicyName::MaxComputeUtil);
    let reader = s.submit(5, spec, lines(1), false).unwrap();
    assert_eq!(
        s.job(reader).map(|j| j.record(0).state),
        Some(TaskState::Waiting)
    );
    assert_eq!(common::assignments(&mut s, 6), vec![(b, job, 1)]);
    cached(&mut s, b, &[&value]);
    s.task_finished(7, b, Finished::at_once(job, 0, 7, RunEnd::Success));
    assert_eq!(common::assignments(&mut s, 8), vec![(b, reader, 1)]);
    assert_eq!(s.reruns(), 1);
    // Dropped by its client, it is nobody's to make again.
    s.call(
        9,
        Event::DropValues {
            files: vec![value.clone()],
        },
    )
    .unwrap();
    assert!(!s.value_readable(&value));
    assert!(s.audit().is_empty(), "{:?}", s.audit());
}
