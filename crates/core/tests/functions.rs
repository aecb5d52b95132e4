//! Function tasks (Python functions called in a worker's runner): routed only to workers that
//! run Python, whichever path places them, and refused at submission when malformed.

mod common;

use common::{offer, Events};
use kestrel_core::*;

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
