//! Workers' identity and control through the engine (issue 29): a task names the worker that
//! ran it after a restart, a worker keeps its id when it reconnects (to the same server or a
//! restarted one), `worker stop` drains or stops at once, and departures are kept with why.

use super::*;

/// Registers a worker that was registered before as `previous` with the server `server_id`
/// in the start `epoch`, still running `running`; returns its id and connection.
fn rejoin(
    s: &mut Server,
    previous: WorkerId,
    server_id: &str,
    epoch: u64,
    running: Vec<(JobId, u32)>,
) -> (WorkerId, Peer) {
    let (mut peer, outbox) = s.connect();
    let (reply, mut id) = oneshot::channel();
    let registration = Registration {
        hostname: "node-back".into(),
        slots: 2,
        gpus: 0,
        prefetch: 0,
        exec: "noop".into(),
        resume: Some(Resume {
            server_id: server_id.into(),
            previous_worker: previous,
            epoch,
            running,
            finished: Vec::new(),
            outputs: Vec::new(),
        }),
        mem: 0,
        named: Vec::new(),
        cache: None,
        alloc: None,
        ends_at_s: None,
        group: None,
        python: None,
    };
    s.batch([Inbound::WorkerJoin {
        registration,
        peer: "127.0.0.1:9".parse().expect("an address"),
        outbox,
        reply,
    }]);
    let worker = id.try_recv().expect("the worker was given an id");
    let _: Vec<ToWorker> = peer.sent();
    (worker, peer)
}

/// The worker of each task of `job`, in task order, as `task list` shows it.
fn workers_of(s: &mut Server, client: &mut Peer, job: JobId) -> Vec<Option<WorkerId>> {
    let ask = Ask::TaskList {
        job,
        state: None,
        limit: 100,
    };
    match &s.ask(client, 1, ask)[..] {
        [ToClient::Reply {
            result: Ok(Answer::Tasks(page)),
            ..
        }] => page.rows.iter().map(|r| r.worker).collect(),
        other => panic!("task list answered with {other:?}"),
    }
}

fn listing(s: &mut Server, client: &mut Peer) -> WorkerListing {
    match s.ask(client, 2, Ask::Workers { departed: true }).pop() {
        Some(ToClient::Reply {
            result: Ok(Answer::WorkerList(l)),
            ..
        }) => l,
        other => panic!("worker list answered with {other:?}"),
    }
}

fn info(s: &mut Server, client: &mut Peer, worker: WorkerId) -> WorkerDetail {
    match s.ask(client, 4, Ask::WorkerInfo { worker }).pop() {
        Some(ToClient::Reply {
            result: Ok(Answer::WorkerDetail(d)),
            ..
        }) => *d,
        other => panic!("worker info answered with {other:?}"),
    }
}

fn stop(s: &mut Server, client: &mut Peer, workers: Vec<WorkerId>, now: bool) -> Vec<StopResult> {
    let ask = Ask::WorkerStop {
        workers,
        all: false,
        now,
    };
    match s.ask(client, 3, ask).pop() {
        Some(ToClient::Reply {
            result: Ok(Answer::WorkersStopped(r)),
            ..
        }) => r,
        other => panic!("worker stop answered with {other:?}"),
    }
}

/// Issue 29, defect 7: after a restart every task showed worker 0, and a worker that came
/// back got a new id (so two reconnecting workers could swap theirs).
#[test]
fn after_a_restart_tasks_name_their_workers_and_workers_get_their_ids_back() {
    let dir = tempfile::tempdir().unwrap();
    let (server_id, epoch, job, first, second) = {
        let mut s = Server::journaled(dir.path(), None);
        let (first, _p1) = s.worker(1);
        let (second, _p2) = s.worker(1);
        // A worker that runs nothing: its id is kept all the same.
        let (idle, _p3) = s.worker(0);
        assert_eq!((first, second, idle), (1, 2, 3));
        let mut client = s.client();
        let job = s.submit(&mut client, 2);
        s.finish(first, &[run(job, 0, 1)]);
        s.finish(second, &[run(job, 1, 1)]);
        s.engine.commit(true);
        let server_id = s.engine.server_id.clone();
        (server_id, s.engine.epoch, job, first, second)
    };
    let mut s = Server::journaled(dir.path(), None);
    assert_eq!(
        s.engine.server_id, server_id,
        "the journal keeps the server's id"
    );
    let mut client = s.client();
    assert_eq!(
        workers_of(&mut s, &mut client, job),
        vec![Some(first), Some(second)],
        "each task names the worker that ran it"
    );
    // The workers come back in the other order, naming the ids of the previous start.
    let (back2, _q2) = rejoin(&mut s, second, &server_id, epoch, vec![]);
    let (back1, _q1) = rejoin(&mut s, first, &server_id, epoch, vec![]);
    assert_eq!((back1, back2), (first, second), "no swap");
    // A new worker gets an id no worker of the previous start had.
    let (new, _q4) = s.worker(1);
    assert_eq!(new, 4);
    // A worker of another server (another journal) does not take an id.
    let (stranger, _q5) = rejoin(&mut s, 3, "another server", epoch, vec![]);
    assert_eq!(stranger, 5);
}

#[test]
fn a_worker_back_before_its_loss_is_noticed_keeps_its_id_and_its_old_connection_is_forgotten() {
    let Running {
        mut s,
        worker,
        mut peer,
        mut client,
        job,
    } = running(2);
    let (server_id, epoch) = (s.engine.server_id.clone(), s.engine.epoch);
    // It still runs task 0; task 1 only waited there and went with the connection.
    let (back, _again) = rejoin(&mut s, worker, &server_id, epoch, vec![(job, 0)]);
    assert_eq!(back, worker);
    assert!(peer.closed(), "the replaced connection is dropped");
    // The old connection's end comes through late: it changes nothing.
    s.batch([Inbound::WorkerGone {
        worker,
        conn: peer.conn,
        reason: "connection closed".into(),
    }]);
    let l = listing(&mut s, &mut client);
    assert_eq!(l.workers.len(), 1, "{l:?}");
    assert_eq!(l.workers[0].id, worker);
    assert!(l.departed.is_empty(), "{l:?}");
    assert_eq!(workers_of(&mut s, &mut client, job)[0], Some(worker));
    let j = s.engine.core.job(job).unwrap();
    assert_eq!(j.record(0).state, kestrel_core::TaskState::Running);
    assert_eq!(j.record(0).lost, 0);
}

#[test]
fn worker_stop_drains_a_worker_then_sends_it_off_and_keeps_why() {
    let Running {
        mut s,
        worker,
        mut peer,
        mut client,
        job,
    } = running(2);
    let r = stop(&mut s, &mut client, vec![worker, 99], false);
    assert_eq!(r[0].result, Ok(2), "{r:?}");
    let missing = r[1].result.as_ref().unwrap_err();
    assert_eq!(missing.kind, RefusalKind::NotFound);
    let l = listing(&mut s, &mut client);
    assert_eq!(l.stopping.len(), 1, "{l:?}");
    assert_eq!(l.stopping[0].0, worker);
    // Nothing new goes to it while it finishes what it runs.
    let more = s.submit(&mut client, 1);
    let sent: Vec<ToWorker> = peer.sent();
    assert!(assigned(&sent).is_empty(), "{sent:?}");
    s.finish(worker, &[run(job, 0, 2)]);
    let sent: Vec<ToWorker> = peer.sent();
    assert!(
        sent.iter().any(
            |m| matches!(m, ToWorker::Shutdown { reason } if reason.contains("kestrel worker stop"))
        ),
        "{sent:?}"
    );
    s.batch([Inbound::WorkerGone {
        worker,
        conn: peer.conn,
        reason: "connection closed".into(),
    }]);
    let l = listing(&mut s, &mut client);
    assert!(l.workers.is_empty());
    let [d] = &l.departed[..] else {
        panic!("{l:?}")
    };
    assert_eq!((d.worker.id, d.worker.finished), (worker, 2));
    assert!(
        d.reason == "stopped by `kestrel worker stop`, once its tasks were done",
        "{}",
        d.reason
    );
    // The job submitted meanwhile waits for another worker.
    let (_, mut other) = s.worker(1);
    assert_eq!(assigned(&other.sent()), vec![run(more, 0, 1)]);
}

#[test]
fn worker_stop_now_gives_its_tasks_back_without_a_crash_or_a_retry() {
    let Running {
        mut s,
        worker,
        mut peer,
        mut client,
        job,
    } = running(2);
    let r = stop(&mut s, &mut client, vec![worker], true);
    assert_eq!(r[0].result, Ok(2));
    let sent: Vec<ToWorker> = peer.sent();
    assert!(matches!(&sent[..], [ToWorker::Shutdown { .. }]), "{sent:?}");
    assert!(peer.closed());
    let j = s.engine.core.job(job).unwrap();
    assert_eq!(j.counts.ready, 2);
    assert_eq!((j.record(0).lost, j.record(0).failures), (0, 0));
    let d = info(&mut s, &mut client, worker);
    let (_, why) = d.left.as_ref().expect("it left");
    assert!(why.contains("--now"), "{why}");
    // Stopping it again says it has left.
    let again = stop(&mut s, &mut client, vec![worker], true);
    assert!(
        again[0]
            .result
            .as_ref()
            .unwrap_err()
            .message
            .contains("has left already"),
        "{again:?}"
    );
    let (_, mut other) = s.worker(2);
    assert_eq!(assigned(&other.sent()), vec![run(job, 0, 2)]);
}

#[test]
fn a_worker_that_says_it_leaves_finishes_its_tasks_first() {
    let Running {
        mut s,
        worker,
        mut peer,
        mut client,
        job,
    } = running(1);
    let msg = FromWorker::Leaving {
        now: false,
        reason: "the worker got SIGTERM".into(),
    };
    s.batch([Inbound::FromWorker { worker, msg }]);
    let d = info(&mut s, &mut client, worker);
    assert_eq!(d.stopping.as_deref(), Some("the worker got SIGTERM"));
    assert_eq!(d.tasks.len(), 1);
    assert_eq!((d.tasks[0].job, d.tasks[0].task), (job, 1));
    assert!(peer.sent::<ToWorker>().is_empty(), "not sent off yet");
    s.finish(worker, &[run(job, 0, 1)]);
    let sent: Vec<ToWorker> = peer.sent();
    assert!(
        matches!(sent.last(), Some(ToWorker::Shutdown { reason }) if reason == "the worker got SIGTERM"),
        "{sent:?}"
    );
}

#[test]
fn a_worker_lost_to_its_heartbeat_is_listed_as_departed_with_why() {
    let Running {
        mut s, mut client, ..
    } = running(1);
    s.advance(25_000_000);
    s.engine.tick(test_clock());
    s.engine.settle();
    s.engine.sync_journal();
    let l = listing(&mut s, &mut client);
    let [d] = &l.departed[..] else {
        panic!("{l:?}")
    };
    assert!(d.reason.contains("heartbeat timeout"), "{}", d.reason);
    assert_eq!(d.left_us, test_clock());
    assert_eq!(d.worker.hostname, "node-1");
}
