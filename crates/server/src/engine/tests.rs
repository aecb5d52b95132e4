//! The engine without sockets or a clock: each connection is a plain channel whose frames the
//! test decodes, and time is what the test sets.

use super::*;
use bytes::Bytes;
use kestrel_core::{Finished, IdRanges, IndexRun, JobSpec, RunEnd, Started, TaskSet};
use kestrel_proto::decode;
use kestrel_proto::messages::*;
use serde::de::DeserializeOwned;
use std::cell::Cell;
use std::path::Path;
use tokio::sync::mpsc;

/// Workers' identity and control: ids kept across reconnections and restarts, `worker stop`,
/// departures.
mod workers;

/// Watches of jobs (protocol 13): task ends pushed to their watchers.
mod watch;

/// Values (protocol 14), single tasks canceled, the server's traffic.
mod values;

thread_local! {
    /// The test's clock, in microseconds (each test runs on a thread of its own).
    static NOW: Cell<u64> = const { Cell::new(1_000_000_000) };
}

fn test_clock() -> u64 {
    NOW.with(Cell::get)
}

/// A connection's far end: what the engine sent it.
struct Peer {
    conn: ConnId,
    rx: mpsc::UnboundedReceiver<Bytes>,
}

impl Peer {
    /// Every message sent since the last look, decoded.
    fn sent<T: DeserializeOwned>(&mut self) -> Vec<T> {
        let mut out = Vec::new();
        while let Ok(frame) = self.rx.try_recv() {
            out.push(decode(&frame).expect("the engine sends frames that decode"));
        }
        out
    }

    /// Whether the engine dropped its side of the connection (and nothing is left to read).
    fn closed(&mut self) -> bool {
        matches!(
            self.rx.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        )
    }
}

/// An engine and the connections the test opened to it.
struct Server {
    engine: Engine,
    next_conn: ConnId,
}

impl Server {
    /// A server without journal.
    fn new() -> Server {
        Server::open(ServerConfig::local(std::env::temp_dir()))
    }

    /// A server whose journal is in `dir`, restored from what is there.
    fn journaled(dir: &Path, limit: Option<u64>) -> Server {
        let config = ServerConfig {
            journal: true,
            journal_limit: limit,
            ..ServerConfig::local(dir.to_path_buf())
        };
        let mut s = Server::open(config);
        let journal = Journal::open(dir, limit).expect("journal opens");
        s.engine.attach_journal(journal).expect("journal replays");
        s
    }

    fn open(config: ServerConfig) -> Server {
        let access = Access::generate("127.0.0.1".into(), 1);
        let mut engine = Engine::new(&config, &access);
        engine.clock = test_clock;
        Server {
            engine,
            next_conn: 1,
        }
    }

    /// Moves the clock on by `us`.
    fn advance(&mut self, us: u64) {
        NOW.with(|n| n.set(n.get() + us));
    }

    /// One batch of `events`, with its scheduling pass and commits.
    fn batch(&mut self, events: impl IntoIterator<Item = Inbound>) {
        self.engine.apply(test_clock(), events);
        self.engine.settle();
        self.engine.sync_journal();
    }

    fn connect(&mut self) -> (Peer, Outbox) {
        let conn = self.next_conn;
        self.next_conn += 1;
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Peer { conn, rx },
            Outbox {
                conn,
                tx,
                version: kestrel_proto::PROTOCOL_VERSION,
            },
        )
    }

    /// A worker with `slots` slots and no prefetch, registered; its welcome is read.
    fn worker(&mut self, slots: u32) -> (WorkerId, Peer) {
        let (mut peer, outbox) = self.connect();
        let (reply, mut id) = oneshot::channel();
        let registration = Registration {
            hostname: format!("node-{}", peer.conn),
            slots,
            gpus: 0,
            prefetch: 0,
            exec: "noop".into(),
            resume: None,
            mem: 0,
            named: Vec::new(),
            cache: None,
            alloc: None,
            ends_at_s: None,
            group: None,
            python: None,
        };
        self.batch([Inbound::WorkerJoin {
            registration,
            peer: "127.0.0.1:9".parse().expect("an address"),
            outbox,
            reply,
        }]);
        let worker = id.try_recv().expect("the worker was given an id");
        // The welcome comes first; tasks may follow at once.
        let welcome: ToWorker = decode(&peer.rx.try_recv().expect("a welcome")).expect("decodes");
        assert!(
            matches!(welcome, ToWorker::Registered { worker: w, .. } if w == worker),
            "{welcome:?}"
        );
        (worker, peer)
    }

    fn client(&mut self) -> Peer {
        let (peer, outbox) = self.connect();
        self.batch([Inbound::ClientJoin { outbox }]);
        peer
    }

    /// Sends request `body` from `client` in a batch of its own; returns what the client got.
    fn ask(&mut self, client: &mut Peer, id: u64, body: Ask) -> Vec<ToClient> {
        let request = Request { id, body };
        let conn = client.conn;
        let request = Box::new(request);
        self.batch([Inbound::Client { conn, request }]);
        client.sent()
    }

    /// Submits an array job of tasks `1..=n`; returns its id.
    fn submit(&mut self, client: &mut Peer, n: u32) -> JobId {
        let submit = Ask::Submit {
            spec: JobSpec::command("t", vec!["true".into()]),
            tasks: TaskSet::Array(IdRanges::span(1, n)),
            open: false,
            key: None,
        };
        match &self.ask(client, 100, submit)[..] {
            [ToClient::Reply {
                id: 100,
                result: Ok(Answer::Submitted { job, .. }),
            }] => *job,
            other => panic!("submission answered with {other:?}"),
        }
    }

    /// `worker` reports the tasks of `runs` started and ended successfully.
    fn finish(&mut self, worker: WorkerId, runs: &[IndexRun]) {
        let now = test_clock();
        let tasks = runs
            .iter()
            .flat_map(|r| (r.first..r.first + r.count).map(move |i| (r.job, i)));
        let started = tasks
            .clone()
            .map(|(job, index)| Started {
                job,
                index,
                at_us: now,
            })
            .collect();
        let finished = tasks
            .map(|(job, index)| Finished {
                job,
                index,
                started_us: now,
                finished_us: now,
                end: RunEnd::Success,
            })
            .collect();
        let msg = FromWorker::Update {
            started,
            finished,
            outputs: Vec::new(),
            waited: Vec::new(),
            cache: Default::default(),
        };
        self.batch([Inbound::FromWorker { worker, msg }]);
    }
}

/// The runs of every `Assign` among `msgs`.
fn assigned(msgs: &[ToWorker]) -> Vec<IndexRun> {
    msgs.iter()
        .filter_map(|m| match m {
            ToWorker::Assign { tasks } => Some(tasks.iter().map(|a| a.run)),
            _ => None,
        })
        .flatten()
        .collect()
}

fn run(job: JobId, first: u32, count: u32) -> IndexRun {
    IndexRun { job, first, count }
}

/// A server with one worker of `n` slots holding every task of an `n`-task array job, and the
/// client that submitted it.
struct Running {
    s: Server,
    worker: WorkerId,
    peer: Peer,
    client: Peer,
    job: JobId,
}

fn running(n: u32) -> Running {
    let mut s = Server::new();
    let (worker, mut peer) = s.worker(n);
    let mut client = s.client();
    let job = s.submit(&mut client, n);
    assert_eq!(assigned(&peer.sent()), vec![run(job, 0, n)]);
    Running {
        s,
        worker,
        peer,
        client,
        job,
    }
}

#[test]
fn a_submitted_array_is_defined_then_assigned_to_the_registered_worker() {
    let mut s = Server::new();
    let (_, mut worker) = s.worker(4);
    let mut client = s.client();
    let job = s.submit(&mut client, 3);
    let sent: Vec<ToWorker> = worker.sent();
    assert!(
        matches!(
            &sent[..],
            [ToWorker::DefineJob { job: j, ids: JobIds::Array(ids), .. }, ToWorker::Assign { .. }]
                if *j == job && *ids == IdRanges::span(1, 3)
        ),
        "{sent:?}"
    );
    assert_eq!(assigned(&sent), vec![run(job, 0, 3)], "one run, one frame");
}

#[test]
fn a_finished_report_answers_the_client_waiting_for_the_job() {
    let Running {
        mut s,
        worker,
        mut client,
        job,
        ..
    } = running(2);
    let wait = Ask::Wait {
        jobs: vec![job],
        progress_ms: 60_000,
    };
    assert_eq!(
        s.ask(&mut client, 7, wait),
        vec![],
        "the job is not done yet"
    );
    s.finish(worker, &[run(job, 0, 2)]);
    let got = client.sent();
    let [ToClient::Reply {
        id: 7,
        result: Ok(Answer::WaitDone(p)),
    }] = &got[..]
    else {
        panic!("the wait was answered with {got:?}");
    };
    assert_eq!((p.jobs, p.jobs_done, p.counts.finished), (1, 1, 2));
}

#[test]
fn a_lost_workers_tasks_are_assigned_to_another() {
    let Running {
        mut s,
        worker,
        job,
        peer,
        ..
    } = running(2);
    let (_, mut second) = s.worker(2);
    assert_eq!(second.sent::<ToWorker>(), vec![], "nothing is queued");
    s.batch([Inbound::WorkerGone {
        worker,
        conn: peer.conn,
        reason: "connection closed".into(),
    }]);
    let sent: Vec<ToWorker> = second.sent();
    assert!(
        matches!(sent.first(), Some(ToWorker::DefineJob { .. })),
        "{sent:?}"
    );
    assert_eq!(assigned(&sent), vec![run(job, 0, 2)]);
}

#[test]
fn a_silent_worker_is_dropped_at_the_tick_after_four_heartbeats_and_its_tasks_move() {
    let Running {
        mut s,
        mut peer,
        job,
        ..
    } = running(1);
    // ServerConfig::local has 5 s heartbeats: silent for 25 s is lost.
    s.advance(25_000_000);
    let (_, mut second) = s.worker(1);
    s.engine.tick(test_clock());
    s.engine.settle();
    s.engine.sync_journal();
    assert_eq!(assigned(&second.sent()), vec![run(job, 0, 1)]);
    assert!(peer.closed(), "the lost worker's connection is dropped");
}

#[test]
fn an_ended_job_is_forgotten_only_by_the_workers_that_were_sent_it() {
    let mut s = Server::new();
    let (a, mut first) = s.worker(1);
    let (b, mut second) = s.worker(1);
    let mut client = s.client();
    let job = s.submit(&mut client, 1);
    let (to_a, to_b) = (assigned(&first.sent()), assigned(&second.sent()));
    let (holder, runs, mut holder_peer, mut other) = match (to_a.is_empty(), to_b.is_empty()) {
        (false, true) => (a, to_a, first, second),
        (true, false) => (b, to_b, second, first),
        _ => panic!("one task went to {to_a:?} and {to_b:?}"),
    };
    s.finish(holder, &runs);
    let told: Vec<ToWorker> = holder_peer.sent();
    assert_eq!(told, vec![ToWorker::ForgetJob { job }]);
    assert_eq!(other.sent::<ToWorker>(), vec![], "the other never had it");
}

#[test]
fn a_submission_is_kept_by_the_journal_and_a_restarted_engine_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::journaled(dir.path(), None);
    let mut client = s.client();
    let job = s.submit(&mut client, 5);
    drop(s);
    let mut s = Server::journaled(dir.path(), None);
    let j = s.engine.core.job(job).expect("the job is back");
    assert_eq!((j.len(), j.counts.ready), (5, 5));
    let (_, mut worker) = s.worker(8);
    assert_eq!(assigned(&worker.sent()), vec![run(job, 0, 5)]);
}

#[test]
fn a_journal_that_cannot_be_written_withdraws_the_job_and_refuses_new_work() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::journaled(dir.path(), Some(64 * 1024));
    let (_, mut worker) = s.worker(4);
    let mut client = s.client();
    let list: Vec<Vec<String>> = (0..20_000).map(|i| vec![format!("task-{i:08}")]).collect();
    let submit = Ask::Submit {
        spec: JobSpec::command("t", vec!["true".into()]),
        tasks: TaskSet::List(list),
        open: false,
        key: None,
    };
    let got = s.ask(&mut client, 1, submit);
    let [ToClient::Reply {
        id: 1,
        result: Err(e),
    }] = &got[..]
    else {
        panic!("a submission the journal could not keep was answered with {got:?}");
    };
    assert!(
        e.message
            .contains("reached its limit of 64K set by --journal-limit"),
        "{}",
        e.message
    );
    assert!(e.message.contains("job 1 was not kept"), "{}", e.message);
    assert_eq!(
        worker.sent::<ToWorker>(),
        vec![],
        "none of its tasks went out"
    );
    assert!(s.engine.core.job(1).is_none(), "no job is left behind");
    let got = s.ask(
        &mut client,
        2,
        Ask::Retry {
            job: 1,
            failed_only: true,
        },
    );
    assert!(
        matches!(&got[..], [ToClient::Reply { id: 2, result: Err(e) }] if e.message.contains("--journal-limit")),
        "{got:?}"
    );
}

/// A list of `n` commands, `echo task-I`.
fn commands(n: usize) -> TaskSet {
    TaskSet::List((0..n).map(|i| vec![format!("task-{i:08}")]).collect())
}

/// The one reply `got` holds to request `id`.
fn reply(got: &[ToClient], id: u64) -> &Result<Answer, Refusal> {
    match got {
        [ToClient::Reply { id: i, result }] if *i == id => result,
        other => panic!("request {id} was answered with {other:?}"),
    }
}

#[test]
fn a_half_submitted_job_the_full_journal_canceled_stays_forgotten_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let limit = Some(64 * 1024);
    let mut s = Server::journaled(dir.path(), limit);
    let mut client = s.client();
    // Job 1's first piece fits; its next one does not.
    let first = Ask::Submit {
        spec: JobSpec::command("t", vec!["true".into()]),
        tasks: commands(1),
        open: true,
        key: None,
    };
    let got = s.ask(&mut client, 1, first);
    assert!(
        matches!(reply(&got, 1), Ok(Answer::Submitted { job: 1, .. })),
        "{got:?}"
    );
    let TaskSet::List(more) = commands(20_000) else {
        unreachable!()
    };
    let piece = Ask::Extend {
        job: 1,
        at: 1,
        argvs: more,
        close: true,
    };
    let got = s.ask(&mut client, 2, piece);
    let Err(e) = reply(&got, 2) else {
        panic!("a piece the journal could not keep was answered with {got:?}");
    };
    assert!(
        e.message.contains("reached its limit of 64K"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("job 1, sent in pieces, is canceled"),
        "{}",
        e.message
    );
    assert!(s.engine.core.job(1).is_some_and(|j| j.canceled));
    let forget = Ask::Forget {
        jobs: vec![1],
        all_ended: false,
    };
    let got = s.ask(&mut client, 3, forget);
    assert!(
        matches!(reply(&got, 3), Ok(Answer::Forgotten(r)) if r.iter().all(|r| r.result.is_ok())),
        "{got:?}"
    );
    drop(s);
    let mut s = Server::journaled(dir.path(), limit);
    assert!(s.engine.core.job(1).is_none(), "job 1 came back");
    // The journal has room again, and job 1's id is not given out again.
    let mut client = s.client();
    assert_eq!(s.submit(&mut client, 2), 2);
}

#[test]
fn a_withdrawn_submissions_id_is_not_given_out_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let limit = Some(64 * 1024);
    let mut s = Server::journaled(dir.path(), limit);
    let mut client = s.client();
    let big = Ask::Submit {
        spec: JobSpec::command("t", vec!["true".into()]),
        tasks: commands(20_000),
        open: false,
        key: None,
    };
    let got = s.ask(&mut client, 1, big);
    assert!(
        matches!(reply(&got, 1), Err(e) if e.message.contains("job 1 was not kept")),
        "{got:?}"
    );
    // A submission that fits is taken: the journal works again from its commit on.
    assert_eq!(s.submit(&mut client, 1), 2);
    assert!(s.engine.durable.error.is_none());
    drop(s);
    let mut s = Server::journaled(dir.path(), limit);
    let mut client = s.client();
    assert_eq!(s.submit(&mut client, 1), 3, "ids 1 and 2 were given out");
}

#[test]
fn forgetting_jobs_shrinks_the_journal_and_replays_give_them_back_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::journaled(dir.path(), None);
    let mut client = s.client();
    let big = Ask::Submit {
        spec: JobSpec::command("t", vec!["true".into()]),
        tasks: commands(100_000),
        open: false,
        key: None,
    };
    let got = s.ask(&mut client, 1, big);
    assert!(matches!(
        reply(&got, 1),
        Ok(Answer::Submitted { job: 1, .. })
    ));
    // Canceled before any worker took a task: it has ended.
    let cancel = Ask::Cancel { jobs: vec![1] };
    s.ask(&mut client, 2, cancel);
    let (worker, _peer) = s.worker(4);
    let small = s.submit(&mut client, 1);
    s.finish(worker, &[run(small, 0, 1)]);
    let before = s.engine.durable.journal.as_ref().unwrap().bytes();
    let forget = Ask::Forget {
        jobs: vec![1],
        all_ended: false,
    };
    s.ask(&mut client, 3, forget);
    // A few ticks give its room back, 16 MiB each.
    for _ in 0..10 {
        s.engine.tick(test_clock());
    }
    s.engine.sync_journal();
    let after = s.engine.durable.journal.as_ref().unwrap().bytes();
    assert!(after * 4 < before, "{before} bytes before, {after} after");
    drop(s);
    let s = Server::journaled(dir.path(), None);
    assert!(s.engine.core.job(1).is_none());
    assert_eq!(s.engine.core.job(small).map(|j| j.counts.finished), Some(1));
}

#[test]
fn a_page_of_queued_tasks_skips_untouched_ones_as_ranges_and_finds_what_a_walk_finds() {
    let mut s = Server::new();
    let mut client = s.client();
    let job = s.submit(&mut client, 60);
    // Tasks 0-9 go to a worker; 0, 2, 4, 6, 8 finish: touched tasks among untouched ones.
    let (worker, mut peer) = s.worker(10);
    assert_eq!(assigned(&peer.sent()), vec![run(job, 0, 10)]);
    for i in (0..10).step_by(2) {
        s.finish(worker, &[run(job, i, 1)]);
    }
    check_pages_of(&s, job);
    // Canceled: untouched tasks show canceled.
    let cancel = Ask::Cancel { jobs: vec![job] };
    s.ask(&mut client, 9, cancel);
    check_pages_of(&s, job);
}

/// Every page of every state of `job` holds what a walk over all its tasks finds.
fn check_pages_of(s: &Server, job: JobId) {
    use kestrel_core::TaskState;
    let j = s.engine.core.job(job).unwrap();
    for state in [
        TaskState::Ready,
        TaskState::Canceled,
        TaskState::Finished,
        TaskState::Assigned,
    ] {
        let all: Vec<u32> = (0..j.len())
            .filter(|&i| j.record(i).state == state)
            .map(|i| j.task_id(i))
            .collect();
        for offset in 0..62u32 {
            for limit in [0u32, 1, 3, 7, 100] {
                let page = crate::views::task_range(j, Some(state), offset, limit);
                let ids: Vec<u32> = page.rows.iter().map(|r| r.id).collect();
                let want: Vec<u32> = all
                    .iter()
                    .copied()
                    .skip(offset as usize)
                    .take(limit as usize)
                    .collect();
                assert_eq!(ids, want, "{state:?} from {offset}, at most {limit}");
            }
        }
    }
}

#[test]
fn pages_asked_all_at_once_are_answered_a_bounded_share_per_pass_in_their_order() {
    let mut s = Server::new();
    let mut client = s.client();
    let job = s.submit(&mut client, 100_000);
    // Eight pages of 10,000 rows in one batch: 40,000 rows a pass.
    let asks = (0..8u64).map(|i| Inbound::Client {
        conn: client.conn,
        request: Box::new(Request {
            id: i,
            body: Ask::TaskPage {
                job,
                state: None,
                offset: (i * 10_000) as u32,
                limit: u32::MAX,
            },
        }),
    });
    s.batch(asks);
    let ids = |got: Vec<ToClient>| -> Vec<u64> {
        got.iter()
            .map(|m| match m {
                ToClient::Reply {
                    id,
                    result: Ok(Answer::TaskRange(p)),
                } => {
                    assert_eq!(p.rows.len(), 10_000);
                    *id
                }
                other => panic!("a page was answered with {other:?}"),
            })
            .collect()
    };
    assert_eq!(ids(client.sent()), vec![0, 1, 2, 3]);
    // The next pass answers the rest, first.
    s.batch([]);
    assert_eq!(ids(client.sent()), vec![4, 5, 6, 7]);
    s.batch([]);
    assert_eq!(client.sent::<ToClient>(), vec![]);
}

/// `job list --last 0` over a long history: no answer holds more than a page, and the pages
/// asked with `before` hold every job once, newest page first.
#[test]
fn a_job_list_answer_never_holds_more_than_a_page_and_pages_on_with_before() {
    let mut s = Server::new();
    let mut client = s.client();
    let page = MAX_JOB_PAGE;
    let total = 2 * page + 5;
    for _ in 0..total {
        s.submit(&mut client, 1);
    }
    let mut ask = |s: &mut Server, last: u32, before: Option<JobId>| {
        let filter = JobFilter {
            last,
            before,
            ..JobFilter::default()
        };
        match s.ask(&mut client, 7, Ask::Jobs { filter }).as_slice() {
            [ToClient::Reply {
                result: Ok(Answer::JobsPage(p)),
                ..
            }] => p.clone(),
            other => panic!("job list answered {other:?}"),
        }
    };
    let ids = |p: &JobsPage| p.jobs.iter().map(|j| j.id).collect::<Vec<_>>();
    // Every job, and more than a page asked: a page each time.
    for last in [0, page + 1, u32::MAX] {
        let first = ask(&mut s, last, None);
        assert_eq!(ids(&first), (page + 6..=total).collect::<Vec<_>>());
        assert_eq!(first.more, u64::from(page + 5));
    }
    let second = ask(&mut s, 0, Some(page + 6));
    assert_eq!(ids(&second), (6..=page + 5).collect::<Vec<_>>());
    assert_eq!(second.more, 5);
    let third = ask(&mut s, 0, Some(6));
    assert_eq!(ids(&third), (1..=5).collect::<Vec<_>>());
    assert_eq!(third.more, 0);
    // Within a page, `last` still has its say.
    let three = ask(&mut s, 3, Some(6));
    assert_eq!((ids(&three), three.more), (vec![3, 4, 5], 2));
}

/// A wait whose jobs ended in a batch the full journal could not record is not told they
/// ended as if it were durable (a restart would run those tasks again), nor is a later wait
/// for them; a job whose ends were recorded still is.
#[test]
fn a_wait_is_not_answered_done_when_the_journal_could_not_record_the_ends() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::journaled(dir.path(), Some(64 * 1024));
    let (worker, _peer) = s.worker(20_000);
    let mut client = s.client();
    let small = s.submit(&mut client, 1);
    s.finish(worker, &[run(small, 0, 1)]);
    // 20,000 ends take far more than the room left.
    let job = s.submit(&mut client, 20_000);
    let wait = Ask::Wait {
        jobs: vec![job],
        progress_ms: 60_000,
    };
    assert_eq!(s.ask(&mut client, 7, wait.clone()), vec![]);
    s.finish(worker, &[run(job, 0, 20_000)]);
    assert!(s.engine.durable.error.is_some(), "the ends fitted");
    let got = client.sent();
    let Err(e) = reply(&got, 7) else {
        panic!("the wait was answered with {got:?}");
    };
    assert!(
        e.message.contains("some tasks of job 2 ended"),
        "{}",
        e.message
    );
    assert!(e.message.contains("--journal-limit"), "{}", e.message);
    // Asked again once the job has ended: the same.
    let got = s.ask(&mut client, 8, wait);
    assert!(
        matches!(reply(&got, 8), Err(e) if e.message.contains("job 2")),
        "{got:?}"
    );
    // The small job's end was recorded before.
    let wait = Ask::Wait {
        jobs: vec![small],
        progress_ms: 60_000,
    };
    let got = s.ask(&mut client, 9, wait);
    assert!(matches!(reply(&got, 9), Ok(Answer::WaitDone(_))), "{got:?}");
}
