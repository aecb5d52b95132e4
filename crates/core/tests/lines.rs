//! Jobs of lines (`--each`): submitted open, extended in pieces of lines, each task's line
//! kept for the worker.

mod common;

use common::Events;
use kestrel_core::{Config, JobSpec, LineList, SchedError, Scheduler, TaskSet};

fn spec() -> JobSpec {
    JobSpec::command("each", vec!["echo".into(), "{line}".into()])
}

fn lines(l: &[&str]) -> LineList {
    l.iter().copied().collect()
}

#[test]
fn a_job_of_lines_takes_lines_in_pieces_and_nothing_twice() {
    let mut s = Scheduler::new(Config::default());
    let job = s
        .submit(0, spec(), TaskSet::Lines(lines(&["a", "b"])), true)
        .unwrap();
    s.extend_with(0, job, 2, TaskSet::Lines(lines(&["c"])), false)
        .unwrap();
    // A piece sent again after a lost connection: the lines held are skipped.
    s.extend_with(0, job, 2, TaskSet::Lines(lines(&["c", "d"])), false)
        .unwrap();
    // Argvs do not go into a job of lines.
    let e = s
        .extend_with(0, job, 4, TaskSet::List(vec![vec!["x".into()]]), false)
        .unwrap_err();
    assert!(matches!(e, SchedError::ExtendKind { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!("job {job} is a list of lines; it cannot take a list of commands")
    );
    s.extend_with(0, job, 4, TaskSet::Lines(lines(&[])), true)
        .unwrap();
    let j = s.job(job).unwrap();
    assert_eq!(j.tasks, TaskSet::Lines(lines(&["a", "b", "c", "d"])));
    assert_eq!((j.len(), j.counts.ready, j.open), (4, 4, false));
    assert_eq!(j.tasks.line(2), Some("c"));
    assert_eq!(
        (j.task_id(3), j.index_of(3), j.index_of(4)),
        (3, Some(3), None)
    );
    assert_eq!(j.task_argv(0), None, "the template's command applies");
}

#[test]
fn an_open_job_of_lines_may_start_empty_but_a_closed_one_may_not() {
    let mut s = Scheduler::new(Config::default());
    assert!(s
        .submit(0, spec(), TaskSet::Lines(LineList::new()), true)
        .is_ok());
    assert!(s
        .submit(0, spec(), TaskSet::Lines(LineList::new()), false)
        .is_err());
}
