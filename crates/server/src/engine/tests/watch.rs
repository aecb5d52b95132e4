//! Watches (protocol 13): each task end of a watched job pushed to its watchers with its kept
//! output, after the commit that makes it durable; ends no record names (a cancel, a
//! cascade), snapshots, forgotten jobs, duplicates and connections that close.

use super::*;
use kestrel_core::{Failure, Sink, TaskDeps, TaskId, TaskRef, TaskState};

/// A job of `n` array tasks whose stdout and stderr are streamed to the server.
fn streamed(n: u32) -> (JobSpec, TaskSet) {
    let mut spec = JobSpec::command("f", vec!["python".into()]);
    spec.template.stdout = Sink::Stream { limit: 1 << 20 };
    spec.template.stderr = Sink::Stream { limit: 1 << 20 };
    (spec, TaskSet::Array(IdRanges::span(1, n)))
}

fn kept(data: &[u8]) -> Kept {
    Kept {
        data: data.to_vec(),
        total: data.len() as u64,
    }
}

impl Server {
    /// Submits `spec` with `tasks` from `client`; returns the job's id.
    pub(super) fn submit_job(&mut self, client: &mut Peer, spec: JobSpec, tasks: TaskSet) -> JobId {
        let submit = Ask::Submit {
            spec,
            tasks,
            open: false,
            key: None,
        };
        match &self.ask(client, 100, submit)[..] {
            [ToClient::Reply {
                result: Ok(Answer::Submitted { job, .. }),
                ..
            }] => *job,
            other => panic!("submission answered with {other:?}"),
        }
    }

    /// `client` watches `jobs` (and with `submitted` what it submits); returns the jobs
    /// missing and what came after the answer.
    fn watch(
        &mut self,
        client: &mut Peer,
        jobs: Vec<JobId>,
        submitted: bool,
    ) -> (Vec<JobId>, Vec<ToClient>) {
        let mut got = self.ask(client, 50, Ask::Watch { jobs, submitted });
        assert!(!got.is_empty(), "the watch was not answered");
        match got.remove(0) {
            ToClient::Reply {
                id: 50,
                result: Ok(Answer::Watching { missing }),
            } => (missing, got),
            other => panic!("the watch was answered with {other:?}"),
        }
    }

    /// The update in which `worker` reports `ends` (each started and ended now) with
    /// `outputs`.
    fn report(
        worker: WorkerId,
        ends: Vec<(JobId, u32, RunEnd)>,
        outputs: Vec<TaskOutput>,
    ) -> Inbound {
        let now = test_clock();
        let started = ends
            .iter()
            .map(|&(job, index, _)| Started {
                job,
                index,
                at_us: now,
            })
            .collect();
        let finished = ends
            .into_iter()
            .map(|(job, index, end)| Finished {
                job,
                index,
                started_us: now,
                finished_us: now,
                end,
            })
            .collect();
        let msg = FromWorker::Update {
            started,
            finished,
            outputs,
            waited: Vec::new(),
            cache: Default::default(),
        };
        Inbound::FromWorker { worker, msg }
    }
}

fn failed(reason: &str) -> RunEnd {
    RunEnd::Failed(Box::new(Failure {
        exit_code: Some(1),
        signal: None,
        reason: reason.into(),
        stderr_tail: String::new(),
        permanent: false,
    }))
}

/// The ends of every `Ended` among `got`, frame by frame.
fn ended_frames(got: &[ToClient]) -> Vec<Vec<TaskEnded>> {
    got.iter()
        .filter_map(|m| match m {
            ToClient::Ended { ends } => Some(ends.clone()),
            _ => None,
        })
        .collect()
}

/// (id, state) of each end.
fn ids(ends: &[TaskEnded]) -> Vec<(TaskId, TaskState)> {
    ends.iter().map(|e| (e.id, e.state)).collect()
}

#[test]
fn a_watch_of_submitted_jobs_is_told_their_ends_with_outputs_after_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::journaled(dir.path(), None);
    let (worker, mut peer) = s.worker(3);
    let mut client = s.client();
    let (missing, after) = s.watch(&mut client, vec![], true);
    assert_eq!((missing, after), (vec![], vec![]));
    let (spec, tasks) = streamed(3);
    let job = s.submit_job(&mut client, spec, tasks);
    assert_eq!(assigned(&peer.sent()), vec![run(job, 0, 3)]);

    // No time passes: only the watch makes this commit due at once.
    let outputs = vec![
        TaskOutput {
            job,
            index: 0,
            stdout: Some(kept(b"\x80\x05K*.")),
            stderr: Some(kept(b"a warning\n")),
            files: 0,
        },
        TaskOutput {
            job,
            index: 1,
            stdout: None,
            stderr: Some(kept(b"Traceback (most recent call last):\n")),
            files: 0,
        },
    ];
    let ends = vec![(job, 0, RunEnd::Success), (job, 1, failed("exit code 1"))];
    s.batch([Server::report(worker, ends, outputs)]);
    assert!(
        s.engine.durable.pending.is_empty(),
        "the ends were committed before they were told"
    );
    let got = client.sent();
    let frames = ended_frames(&got);
    assert_eq!(frames.len(), 1, "one frame for the pass: {got:?}");
    let e = &frames[0];
    assert_eq!(
        ids(e),
        vec![(1, TaskState::Finished), (2, TaskState::Failed)]
    );
    assert!(e.iter().all(|e| e.job == job));
    let host = format!("node-{}", peer.conn);
    assert_eq!(e[0].worker.as_deref(), Some(host.as_str()));
    assert_eq!(e[0].stdout, Some(kept(b"\x80\x05K*.")));
    assert_eq!(e[0].stderr, None, "a success's stderr is not sent");
    assert_eq!(e[0].reason, None);
    assert_eq!(e[1].stdout, None);
    assert_eq!(
        e[1].stderr,
        Some(kept(b"Traceback (most recent call last):\n"))
    );
    assert_eq!(e[1].reason.as_deref(), Some("exit code 1"));

    // Beside it, the end of a job nobody watches waits for the next due commit.
    let mut other = s.client();
    let unwatched = s.submit(&mut other, 1);
    assert_eq!(assigned(&peer.sent()), vec![run(unwatched, 0, 1)]);
    s.batch([Server::report(
        worker,
        vec![(unwatched, 0, RunEnd::Success)],
        vec![],
    )]);
    assert!(!s.engine.durable.pending.is_empty(), "gathered, not synced");
    assert_eq!(ended_frames(&client.sent()), Vec::<Vec<TaskEnded>>::new());

    // Durable: a restarted engine has both ends.
    drop(s);
    let s = Server::journaled(dir.path(), None);
    let c = s.engine.core.job(job).expect("the job is back").counts;
    assert_eq!((c.finished, c.failed), (1, 1));
}

#[test]
fn without_a_journal_the_ends_go_at_the_end_of_the_pass() {
    let mut s = Server::new();
    let (worker, _peer) = s.worker(1);
    let mut client = s.client();
    s.watch(&mut client, vec![], true);
    let job = s.submit(&mut client, 1);
    s.batch([Server::report(
        worker,
        vec![(job, 0, RunEnd::Success)],
        vec![],
    )]);
    let frames = ended_frames(&client.sent());
    assert_eq!(frames.len(), 1);
    assert_eq!(ids(&frames[0]), vec![(1, TaskState::Finished)]);
    assert_eq!(
        s.engine.watch.sizes(),
        (0, 1),
        "a job done and fully told is dropped; the connection still watches what it submits"
    );
}

#[test]
fn a_canceled_watched_job_tells_its_queued_tasks_canceled_then_its_running_one() {
    let mut s = Server::new();
    let (worker, mut peer) = s.worker(1);
    let mut client = s.client();
    s.watch(&mut client, vec![], true);
    let job = s.submit(&mut client, 3);
    assert_eq!(assigned(&peer.sent()), vec![run(job, 0, 1)]);

    let got = s.ask(&mut client, 7, Ask::Cancel { jobs: vec![job] });
    let frames = ended_frames(&got);
    assert_eq!(frames.len(), 1, "{got:?}");
    assert_eq!(
        ids(&frames[0]),
        vec![(2, TaskState::Canceled), (3, TaskState::Canceled)]
    );
    assert!(frames[0]
        .iter()
        .all(|e| e.reason.is_none() && e.worker.is_none() && e.stdout.is_none()));
    assert!(
        matches!(got.first(), Some(ToClient::Reply { id: 7, .. })),
        "the cancel's answer comes first: {got:?}"
    );

    // The running task, killed, ends canceled as its worker says.
    let cancels: Vec<ToWorker> = peer.sent();
    assert!(
        cancels
            .iter()
            .any(|m| matches!(m, ToWorker::Cancel { tasks } if tasks == &vec![(job, 0)])),
        "{cancels:?}"
    );
    s.batch([Server::report(
        worker,
        vec![(job, 0, RunEnd::Canceled)],
        vec![],
    )]);
    let frames = ended_frames(&client.sent());
    assert_eq!(frames.len(), 1);
    assert_eq!(ids(&frames[0]), vec![(1, TaskState::Canceled)]);
    assert_eq!(s.engine.watch.sizes().0, 0, "the job is done and told");
}

#[test]
fn tasks_canceled_because_what_they_depend_on_failed_are_told_with_why() {
    let mut s = Server::new();
    let (worker, mut peer) = s.worker(1);
    let mut client = s.client();
    s.watch(&mut client, vec![], true);
    let mut spec = JobSpec::command("t", vec!["true".into()]);
    spec.deps = vec![TaskDeps {
        task: 2,
        on: vec![TaskRef { job: None, task: 1 }],
    }];
    let job = s.submit_job(&mut client, spec, TaskSet::Array(IdRanges::span(1, 2)));
    assert_eq!(assigned(&peer.sent()), vec![run(job, 0, 1)]);
    s.batch([Server::report(
        worker,
        vec![(job, 0, failed("exit code 1"))],
        vec![],
    )]);
    let frames = ended_frames(&client.sent());
    assert_eq!(frames.len(), 1);
    let e = &frames[0];
    assert_eq!(
        ids(e),
        vec![(1, TaskState::Failed), (2, TaskState::Canceled)]
    );
    assert_eq!(e[0].reason.as_deref(), Some("exit code 1"));
    let why = e[1].reason.as_deref().unwrap_or_default();
    assert!(
        why.contains("task 1"),
        "a task canceled for its dependency says why: {why}"
    );
}

#[test]
fn a_watch_of_a_job_already_running_gets_a_snapshot_then_what_follows() {
    let mut s = Server::new();
    let (worker, _peer) = s.worker(3);
    let mut submitter = s.client();
    let (spec, tasks) = streamed(3);
    let job = s.submit_job(&mut submitter, spec, tasks);
    let out = |index, data: &[u8]| TaskOutput {
        job,
        index,
        stdout: Some(kept(data)),
        stderr: None,
        files: 0,
    };
    s.batch([Server::report(
        worker,
        vec![(job, 0, RunEnd::Success)],
        vec![out(0, b"zero")],
    )]);

    // The first watch is told the end before it, with its output from the server's log.
    let mut a = s.client();
    let (missing, after) = s.watch(&mut a, vec![job, 99], false);
    assert_eq!(missing, vec![99], "a job the server lacks is listed");
    let frames = ended_frames(&after);
    assert_eq!(frames.len(), 1, "{after:?}");
    assert_eq!(ids(&frames[0]), vec![(1, TaskState::Finished)]);
    assert_eq!(frames[0][0].stdout, Some(kept(b"zero")));

    s.batch([Server::report(
        worker,
        vec![(job, 1, RunEnd::Success)],
        vec![out(1, b"one")],
    )]);
    let frames = ended_frames(&a.sent());
    assert_eq!(ids(&frames[0]), vec![(2, TaskState::Finished)]);

    // A second watch of the same job: a snapshot of both, and nothing again for the first.
    let mut b = s.client();
    let (_, after) = s.watch(&mut b, vec![job], false);
    let frames = ended_frames(&after);
    assert_eq!(
        ids(&frames[0]),
        vec![(1, TaskState::Finished), (2, TaskState::Finished)]
    );
    assert_eq!(frames[0][1].stdout, Some(kept(b"one")));
    assert_eq!(a.sent::<ToClient>(), vec![]);

    // The last end goes to both.
    s.batch([Server::report(
        worker,
        vec![(job, 2, RunEnd::Success)],
        vec![out(2, b"two")],
    )]);
    for peer in [&mut a, &mut b] {
        let frames = ended_frames(&peer.sent());
        assert_eq!(frames.len(), 1);
        assert_eq!(ids(&frames[0]), vec![(3, TaskState::Finished)]);
        assert_eq!(frames[0][0].stdout, Some(kept(b"two")));
    }
    assert_eq!(s.engine.watch.sizes().0, 0, "the job is done and told");
}

#[test]
fn a_watch_of_an_ended_job_is_told_it_whole_then_dropped() {
    let Running {
        mut s, worker, job, ..
    } = running(2);
    s.finish(worker, &[run(job, 0, 2)]);
    let mut client = s.client();
    let (_, after) = s.watch(&mut client, vec![job], false);
    let frames = ended_frames(&after);
    assert_eq!(
        ids(&frames[0]),
        vec![(1, TaskState::Finished), (2, TaskState::Finished)]
    );
    assert_eq!(s.engine.watch.sizes().0, 0);
}

#[test]
fn a_job_forgotten_in_the_pass_of_its_last_end_is_told_that_end_then_gone() {
    let Running {
        mut s,
        worker,
        job,
        mut client,
        ..
    } = running(1);
    s.watch(&mut client, vec![job], false);
    let forget = Request {
        id: 8,
        body: Ask::Forget {
            jobs: vec![job],
            all_ended: false,
        },
    };
    s.batch([
        Server::report(worker, vec![(job, 0, RunEnd::Success)], vec![]),
        Inbound::Client {
            conn: client.conn,
            request: Box::new(forget),
        },
    ]);
    let got = client.sent();
    let pushed: Vec<&ToClient> = got
        .iter()
        .filter(|m| !matches!(m, ToClient::Reply { .. }))
        .collect();
    let [ToClient::Ended { ends }, ToClient::Gone { job: gone, why }] = &pushed[..] else {
        panic!("the watch was sent {got:?}");
    };
    assert_eq!(ids(ends), vec![(1, TaskState::Finished)]);
    assert_eq!(*gone, job);
    assert!(why.contains("forgotten"), "{why}");
    assert_eq!(s.engine.watch.sizes().0, 0);
}

#[test]
fn a_task_reported_ended_twice_is_told_once() {
    let Running {
        mut s,
        worker,
        job,
        mut client,
        ..
    } = running(2);
    s.watch(&mut client, vec![job], false);
    let end = || Server::report(worker, vec![(job, 0, RunEnd::Success)], vec![]);
    s.batch([end(), end()]);
    s.batch([end()]);
    let frames = ended_frames(&client.sent());
    let told: Vec<_> = frames.iter().flat_map(|f| ids(f)).collect();
    assert_eq!(told, vec![(1, TaskState::Finished)]);
    assert_eq!(s.engine.watch.sizes().0, 1, "task 2 is still to end");
}

#[test]
fn a_retried_task_is_told_again_when_it_ends_again() {
    let Running {
        mut s,
        worker,
        mut peer,
        job,
        mut client,
    } = running(2);
    s.watch(&mut client, vec![job], false);
    s.batch([Server::report(
        worker,
        vec![(job, 0, failed("exit code 1"))],
        vec![],
    )]);
    assert_eq!(
        ids(&ended_frames(&client.sent())[0]),
        vec![(1, TaskState::Failed)]
    );
    let got = s.ask(
        &mut client,
        9,
        Ask::Retry {
            job,
            failed_only: true,
        },
    );
    assert!(ended_frames(&got).is_empty(), "{got:?}");
    assert_eq!(assigned(&peer.sent()), vec![run(job, 0, 1)]);
    s.batch([Server::report(
        worker,
        vec![(job, 0, RunEnd::Success)],
        vec![],
    )]);
    assert_eq!(
        ids(&ended_frames(&client.sent())[0]),
        vec![(1, TaskState::Finished)]
    );
}

#[test]
fn a_client_that_closes_is_told_nothing_more_and_its_watch_is_freed() {
    let Running {
        mut s,
        worker,
        job,
        mut client,
        ..
    } = running(2);
    s.watch(&mut client, vec![job], true);
    assert_eq!(s.engine.watch.sizes(), (1, 1));
    s.batch([Inbound::ClientGone { conn: client.conn }]);
    assert_eq!(
        s.engine.watch.sizes(),
        (0, 0),
        "nothing of the watch is kept"
    );
    s.finish(worker, &[run(job, 0, 2)]);
    assert_eq!(client.sent::<ToClient>(), vec![]);
}

#[test]
fn a_client_older_than_13_is_refused_a_watch() {
    let mut s = Server::new();
    let (mut client, mut outbox) = s.connect();
    outbox.version = kestrel_proto::WATCH_VERSION - 1;
    s.batch([Inbound::ClientJoin { outbox }]);
    let got = s.ask(
        &mut client,
        3,
        Ask::Watch {
            jobs: vec![],
            submitted: true,
        },
    );
    assert!(
        matches!(&got[..], [ToClient::Reply { id: 3, result: Err(r) }] if r.message.contains("13")),
        "{got:?}"
    );
    assert_eq!(s.engine.watch.sizes(), (0, 0));
}
