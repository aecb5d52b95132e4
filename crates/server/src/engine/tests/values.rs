//! Values (protocol 14): where one is cached, which worker to put one on, those a client put
//! there and those it drops; single tasks canceled; the bytes through the server.

use super::*;
use kestrel_core::{FunctionSpec, TaskKind};

const VALUE: &str = "kestrel-values/s/0f3c";

impl Server {
    /// A worker of one slot that runs Python and serves a cache of `capacity` bytes at
    /// `url`.
    fn python_worker(&mut self, url: &str, capacity: u64) -> (WorkerId, Peer) {
        let (mut peer, outbox) = self.connect();
        let (reply, mut id) = oneshot::channel();
        let registration = Registration {
            hostname: format!("node-{}", peer.conn),
            slots: 1,
            gpus: 0,
            prefetch: 0,
            exec: "process".into(),
            resume: None,
            mem: 0,
            named: Vec::new(),
            cache: Some(CacheInfo {
                serves: url.into(),
                capacity,
                held: Vec::new(),
            }),
            alloc: None,
            ends_at_s: None,
            group: None,
            python: Some(PythonRunner::default()),
        };
        self.batch([Inbound::WorkerJoin {
            registration,
            peer: "127.0.0.1:9".parse().expect("an address"),
            outbox,
            reply,
        }]);
        let worker = id.try_recv().expect("the worker was given an id");
        let _welcome: Vec<ToWorker> = peer.sent();
        (worker, peer)
    }
}

fn answer(got: &[ToClient], id: u64) -> Result<Answer, Refusal> {
    reply(got, id).clone()
}

/// A function job of one call that reads `value`.
fn reader(value: &str) -> (JobSpec, TaskSet) {
    let mut spec = JobSpec::command("f", Vec::new());
    spec.template.kind = TaskKind::Function(Box::new(FunctionSpec {
        name: "f".into(),
        pickled: vec![0x80, 0x05, b'.'],
        inline_limit: 1 << 20,
        ..FunctionSpec::default()
    }));
    spec.template.files.inputs = vec![value.into()];
    // As the Python client asks for a call reading values.
    spec.placement.policy = Some(kestrel_core::PolicyName::MaxComputeUtil);
    (spec, TaskSet::Lines(["@x"].into_iter().collect()))
}

#[test]
fn a_value_is_placed_on_a_python_worker_located_read_and_dropped() {
    let mut s = Server::new();
    let mut client = s.client();
    // No Python worker: nowhere to put it, and the refusal says what to start.
    let none = answer(&s.ask(&mut client, 1, Ask::Place { bytes: 10 }), 1);
    assert!(
        matches!(&none, Err(r) if r.message.contains("--python")),
        "{none:?}"
    );
    let (plain, _p) = s.worker(1);
    let (small, _s) = s.python_worker("http://127.0.0.1:7101/", 100);
    let (big, mut big_peer) = s.python_worker("http://127.0.0.1:7102/", 1 << 20);
    // Only a Python worker whose cache holds it.
    let placed = answer(&s.ask(&mut client, 2, Ask::Place { bytes: 1000 }), 2);
    assert_eq!(
        placed,
        Ok(Answer::Place {
            worker: big,
            url: "http://127.0.0.1:7102/".into()
        })
    );
    let too_big = answer(&s.ask(&mut client, 3, Ask::Place { bytes: 1 << 30 }), 3);
    assert!(
        matches!(&too_big, Err(r) if r.message.contains("--cache-size")),
        "{too_big:?}"
    );
    // Only a client's own kinds of values may be said placed.
    let result = "kestrel-values/r/ab/1/0".to_string();
    let refused = s.ask(
        &mut client,
        4,
        Ask::Placed {
            worker: big,
            files: vec![(result, 10)],
        },
    );
    assert!(answer(&refused, 4).is_err());
    let ok = s.ask(
        &mut client,
        5,
        Ask::Placed {
            worker: big,
            files: vec![(VALUE.into(), 1000)],
        },
    );
    assert_eq!(answer(&ok, 5), Ok(Answer::Placed));
    let located = answer(
        &s.ask(
            &mut client,
            6,
            Ask::Locate {
                files: vec![VALUE.into(), "kestrel-values/s/nowhere".into()],
            },
        ),
        6,
    );
    assert_eq!(
        located,
        Ok(Answer::Located(vec![FileSources {
            file: VALUE.into(),
            peers: vec!["http://127.0.0.1:7102/".into()],
        }]))
    );
    // A job reading it needs no store, and goes where it is.
    let (spec, tasks) = reader(VALUE);
    let job = s.submit_job(&mut client, spec, tasks);
    let sent: Vec<ToWorker> = big_peer.sent();
    assert_eq!(assigned(&sent), vec![run(job, 0, 1)], "{sent:?}");
    assert_ne!((plain, small), (big, big));
    // Dropped: its holder deletes it, and it is nowhere any more.
    let dropped = s.ask(
        &mut client,
        7,
        Ask::DropValues {
            files: vec![VALUE.into()],
        },
    );
    assert_eq!(answer(&dropped, 7), Ok(Answer::ValuesDropped { held: 1 }));
    let sent: Vec<ToWorker> = big_peer.sent();
    assert!(
        sent.iter()
            .any(|m| matches!(m, ToWorker::DropFiles { files } if files == &[VALUE.to_string()])),
        "{sent:?}"
    );
    // A call reading it now could never run: refused at once.
    let (spec, tasks) = reader(VALUE);
    let again = s.ask(
        &mut client,
        8,
        Ask::Submit {
            spec,
            tasks,
            open: false,
            key: None,
        },
    );
    assert!(
        matches!(&answer(&again, 8), Err(r) if r.message.contains("no worker holds any more")),
        "{again:?}"
    );
}

#[test]
fn single_tasks_are_canceled_queued_at_once_and_running_on_their_worker() {
    let mut s = Server::new();
    let mut client = s.client();
    let (worker, mut peer) = s.worker(1);
    let job = s.submit(&mut client, 4);
    let sent: Vec<ToWorker> = peer.sent();
    assert_eq!(assigned(&sent), vec![run(job, 0, 1)]);
    // Tasks 1 (on the worker) and 3 (queued), by id; 9 is not the job's.
    let tasks = IdRanges::parse("1,3,9").unwrap();
    let got = s.ask(&mut client, 9, Ask::CancelTasks { job, tasks });
    let Ok(Answer::Canceled(results)) = answer(&got, 9) else {
        panic!("{got:?}");
    };
    // Task 0 was sent to the worker and had not started yet: not counted running.
    assert_eq!(results[0].result, Ok((2, 0)));
    let sent: Vec<ToWorker> = peer.sent();
    assert!(
        sent.iter()
            .any(|m| matches!(m, ToWorker::Cancel { tasks } if tasks == &[(job, 0)])),
        "{sent:?}"
    );
    // The worker ends its one canceled; the other two run.
    let now = test_clock();
    let canceled = FromWorker::Update {
        started: Vec::new(),
        finished: vec![Finished::at_once(job, 0, now, RunEnd::Canceled)],
        outputs: Vec::new(),
        waited: Vec::new(),
        cache: Default::default(),
    };
    s.batch([Inbound::FromWorker {
        worker,
        msg: canceled,
    }]);
    let sent: Vec<ToWorker> = peer.sent();
    assert_eq!(assigned(&sent), vec![run(job, 1, 1)]);
    s.finish(worker, &[run(job, 1, 1)]);
    let sent: Vec<ToWorker> = peer.sent();
    assert_eq!(assigned(&sent), vec![run(job, 3, 1)]);
    s.finish(worker, &[run(job, 3, 1)]);
    let j = s.engine.core.job(job).expect("the job");
    assert!(j.is_done());
    assert_eq!((j.counts.finished, j.counts.canceled), (2, 2));
}

#[test]
fn the_server_counts_what_goes_through_it_for_clients_that_read_it() {
    let mut s = Server::new();
    let mut client = s.client();
    let Ok(Answer::Info(info)) = answer(&s.ask(&mut client, 1, Ask::ServerInfo), 1) else {
        panic!("no info");
    };
    assert!(info.traffic.is_some() && info.values_deleted == Some((0, 0)));
    // What a client of version 13 is sent leaves them out (it could not read them).
    let (mut old, mut outbox) = s.connect();
    outbox.version = kestrel_proto::WATCH_VERSION;
    s.batch([Inbound::ClientJoin { outbox }]);
    let Ok(Answer::Info(info)) = answer(&s.ask(&mut old, 2, Ask::ServerInfo), 2) else {
        panic!("no info");
    };
    assert_eq!((info.traffic, info.values_deleted), (None, None));
}
