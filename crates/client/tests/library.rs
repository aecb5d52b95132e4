//! The client library against a real server in this process: keyed submission in pieces,
//! a repeated key, and a connection that rides out a server restart.

use kestrel_client::{keyed, Connection, Error, Reconnect, Submission, Target};
use kestrel_core::{JobSpec, TaskSet};
use kestrel_proto::messages::{Answer, Ask};
use kestrel_server::{start, ServerConfig};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A list whose command lines add up to about 9 MiB: three pieces of at most 4 MiB.
fn big_list() -> Submission {
    let argv = |i: usize| vec!["echo".to_string(), format!("{i}-{}", "x".repeat(1000))];
    Submission::new(
        JobSpec::command("big", Vec::new()),
        TaskSet::List((0..9_000).map(argv).collect()),
    )
}

async fn job_len(conn: &mut Connection, job: u32) -> u64 {
    match conn.call(Ask::JobInfo { job }).await.expect("job info") {
        Answer::Job(d) => d.summary.counts.total(),
        other => panic!("job info answered {other:?}"),
    }
}

#[test]
fn a_list_too_big_for_a_message_goes_in_pieces_and_a_repeated_key_adds_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    rt().block_on(async {
        let server = start(ServerConfig::local(dir.path().to_path_buf()))
            .await
            .expect("server");
        let mut conn = Connection::open(Target::file(&server.access_path), Reconnect::NEVER)
            .await
            .expect("connected");
        let subs = keyed(vec![big_list()], Some(("big-1", false)));
        let first = conn.submit(&subs).await.expect("submitted");
        assert_eq!(first.len(), 1);
        assert!(!first[0].repeated);
        assert_eq!(job_len(&mut conn, first[0].job).await, 9_000);

        // The same key again: the same job, nothing added.
        let again = conn.submit(&subs).await.expect("submitted again");
        assert_eq!(again[0].job, first[0].job);
        assert!(again[0].repeated);
        assert_eq!(job_len(&mut conn, first[0].job).await, 9_000);
        let Answer::Jobs(jobs) = conn.call(Ask::JobList).await.expect("job list") else {
            panic!("not a job list");
        };
        assert_eq!(jobs.len(), 1, "one job for one key");
        server.stop().await;
    });
}

static NOTICES: AtomicUsize = AtomicUsize::new(0);

#[test]
fn a_connection_rides_out_a_server_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    rt().block_on(async {
        let config = ServerConfig {
            journal: true,
            ..ServerConfig::local(dir.path().to_path_buf())
        };
        let server = start(config.clone()).await.expect("server");
        let target = Target::file(&server.access_path);
        let reconnect = Reconnect::within(Duration::from_secs(20));
        let mut conn = Connection::open_telling(target, reconnect, |_| {
            NOTICES.fetch_add(1, Ordering::Relaxed);
        })
        .await
        .expect("connected");
        let subs = keyed(
            vec![Submission::new(
                JobSpec::command("a", vec!["true".into()]),
                TaskSet::Array(kestrel_core::IdRanges::span(1, 3)),
            )],
            None,
        );
        let job = conn.submit(&subs).await.expect("submitted")[0].job;

        // The server goes away and comes back (on another port, in a new access file).
        server.stop().await;
        let server = start(config).await.expect("server again");
        assert_eq!(
            job_len(&mut conn, job).await,
            3,
            "the job survived, the call went on"
        );
        assert_eq!(NOTICES.load(Ordering::Relaxed), 2, "lost, then reconnected");
        let access = server.access.clone();
        server.stop().await;

        // Without a window, a server that is not there fails at once, as unreachable.
        let once = Connection::open(Target::Fixed(access), Reconnect::NEVER).await;
        let Err(err) = once else {
            panic!("connected to a stopped server");
        };
        assert!(err.is_unreachable(), "{err}");
        assert!(
            !matches!(err, Error::GaveUp(_)),
            "no window, no retrying: {err}"
        );
    });
}

/// A server that lets each client in and then closes the connection on its first request,
/// counting the connections it took.
async fn server_that_drops_every_request(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::sync::Arc<AtomicUsize>) {
    use kestrel_proto::{accept_handshake, Access, FrameReader, FrameWriter};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let access = Access::generate(
        "127.0.0.1".into(),
        listener.local_addr().expect("addr").port(),
    );
    let path = dir.join("access.json");
    access.write(&path).expect("access file");
    let taken = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = taken.clone();
    tokio::spawn(async move {
        let secret = access.secret_bytes();
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let (r, w) = stream.into_split();
            let (mut r, mut w) = (FrameReader::new(r), FrameWriter::new(w));
            if accept_handshake(&mut r, &mut w, &secret).await.is_ok() {
                let _ = r.recv::<kestrel_proto::messages::Request>().await;
            }
        }
    });
    (path, taken)
}

#[test]
fn a_request_the_server_always_drops_gives_up_when_the_window_has_passed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (gave_up, connections) = rt().block_on(async {
        let (path, taken) = server_that_drops_every_request(dir.path()).await;
        let window = Reconnect {
            at_start: Duration::ZERO,
            after_loss: Duration::from_secs(2),
        };
        let mut conn = Connection::open(Target::file(&path), window)
            .await
            .expect("connected");
        let call = conn.call(Ask::JobList);
        // Bounded: before the window counted from the first loss, this asked forever.
        let answer = tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .expect("the call ended");
        (answer, taken.load(Ordering::SeqCst))
    });
    match gave_up {
        Err(Error::GaveUp(msg)) => assert!(msg.contains("times in 2s"), "{msg}"),
        other => panic!("expected to give up, got {other:?}"),
    }
    assert!(
        connections >= 2,
        "it reconnected and asked again ({connections} connections)"
    );
}

/// The states of `job`'s tasks, by task id.
async fn task_states(conn: &mut Connection, job: u32) -> Vec<(u32, kestrel_core::TaskState)> {
    let ask = Ask::TaskList {
        job,
        state: None,
        limit: 100,
    };
    match conn.call(ask).await.expect("task list") {
        Answer::Tasks(page) => page.rows.iter().map(|r| (r.id, r.state)).collect(),
        other => panic!("task list answered {other:?}"),
    }
}

/// A job of lines reading `inputs` and writing `outputs`, patterns over `{line}`.
fn lines_job(inputs: &[&str], outputs: &[&str], lines: &[&str]) -> Submission {
    let mut spec = JobSpec::command("graph", vec!["true".into()]);
    spec.template.files.inputs = inputs.iter().map(|s| s.to_string()).collect();
    spec.template.files.outputs = outputs.iter().map(|s| s.to_string()).collect();
    Submission::new(spec, TaskSet::Lines(lines.iter().copied().collect()))
}

#[test]
fn a_graph_job_sent_in_pieces_is_linked_whole_or_withdrawn_whole() {
    use kestrel_core::TaskState::{Ready, Waiting};
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    std::fs::create_dir(&store).expect("store");
    for name in ["x", "q", "q.o.o.o"] {
        std::fs::write(store.join(name), "in").expect("store file");
    }
    rt().block_on(async {
        let config = ServerConfig {
            store: Some(store.display().to_string()),
            ..ServerConfig::local(dir.path().join("server"))
        };
        let server = start(config).await.expect("server");
        let conn = Connection::open(Target::file(&server.access_path), Reconnect::NEVER)
            .await
            .expect("connected");
        // One line a piece.
        let mut conn = conn.with_piece_bytes(1);

        // Each line reads the file the next one writes: the first piece's task reads what
        // the last piece's writes (it was refused as reading a file nobody writes, or ran
        // at once and failed).
        let chain = lines_job(&["{line}"], &["{line}.o"], &["x.o.o", "x.o", "x"]);
        let job = conn.submit(&keyed(vec![chain], None)).await.expect("taken")[0].job;
        assert_eq!(
            task_states(&mut conn, job).await,
            vec![(0, Waiting), (1, Waiting), (2, Ready)]
        );

        // A cycle across pieces: refused at the last, and nothing of the job is left.
        let cycle = lines_job(&["{line}", "{line}.o.o"], &["{line}.o"], &["q.o", "q"]);
        let err = conn.submit(&keyed(vec![cycle], None)).await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Refused(_)), "{err:?}");
        assert!(
            text.contains("cycle") && text.contains("is withdrawn"),
            "{text}"
        );

        // An input in no piece's outputs and not in the store: the same.
        let missing = lines_job(&["{line}"], &["{line}.o"], &["m.o", "m"]);
        let err = conn.submit(&keyed(vec![missing], None)).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("task 1 reads m, which no task writes") && text.contains("is withdrawn"),
            "{text}"
        );
        let Answer::Jobs(jobs) = conn.call(Ask::JobList).await.expect("job list") else {
            panic!("not a job list");
        };
        let ids: Vec<u32> = jobs.iter().map(|j| j.id).collect();
        assert_eq!(ids, vec![job], "the refused jobs were withdrawn");
        server.stop().await;
    });
}

/// A client does not send what a server of protocol 10 cannot read (multi-node tasks, task
/// dependencies): it says to upgrade the server, and submits nothing.
#[test]
fn nodes_and_task_deps_are_not_sent_to_a_server_of_protocol_10() {
    let dir = tempfile::tempdir().expect("temp dir");
    rt().block_on(async {
        let server = start(ServerConfig::local(dir.path().to_path_buf()))
            .await
            .expect("server");
        // A server of 10 as its access file says: the client speaks 10 to it.
        let mut access = server.access.clone();
        access.protocol = 10;
        let mut conn = Connection::open(Target::Fixed(access), Reconnect::NEVER)
            .await
            .expect("connected");
        let mut mpi = JobSpec::command("mpi", vec!["true".into()]);
        mpi.nodes = 2;
        let mut deps = JobSpec::command("deps", Vec::new());
        deps.deps = vec![kestrel_core::TaskDeps {
            task: 1,
            on: vec![kestrel_core::TaskRef { job: None, task: 0 }],
        }];
        let list = TaskSet::List(vec![vec!["true".into()]; 2]);
        for (spec, tasks, what) in [
            (mpi, TaskSet::Array(kestrel_core::IdRanges::span(1, 2)), "takes whole workers per task (--nodes)"),
            (deps, list, "has tasks that wait for other tasks (deps in a job file)"),
        ] {
            let name = spec.name.clone();
            let err = conn
                .submit(&keyed(vec![Submission::new(spec, tasks)], None))
                .await
                .expect_err("refused");
            let Error::TooOld(msg) = err else {
                panic!("{err:?}");
            };
            assert_eq!(
                msg,
                format!("job {name:?} {what} (protocol 11), but the server speaks protocol 10: upgrade the server (`kestrel server info` shows its version)")
            );
        }
        let Answer::Jobs(jobs) = conn.call(Ask::JobList).await.expect("job list") else {
            panic!("not a job list");
        };
        assert!(jobs.is_empty(), "nothing submitted: {jobs:?}");
        server.stop().await;
    });
}

#[test]
fn a_watch_goes_only_to_a_server_of_version_13_and_its_connection_splits() {
    let dir = tempfile::tempdir().expect("temp dir");
    rt().block_on(async {
        let server = start(ServerConfig::local(dir.path().to_path_buf()))
            .await
            .expect("server");
        // A client of version 12 does not ask.
        let old = kestrel_proto::WATCH_VERSION - 1;
        let mut client = kestrel_proto::Client::connect_speaking(&server.access, 6..=old)
            .await
            .expect("connected");
        let refused = client.watch(Vec::new(), true).await;
        assert!(
            matches!(&refused, Err(kestrel_proto::ClientError::Server(m)) if m.contains("upgrade")),
            "{refused:?}"
        );

        // A current one watches, then takes its connection apart to read the pushes itself.
        let conn = Connection::open(Target::file(&server.access_path), Reconnect::NEVER)
            .await
            .expect("connected");
        let mut client = conn.into_client();
        assert_eq!(
            client.watch(vec![42], false).await.expect("watching"),
            vec![42]
        );
        let (_reader, _writer, version, next_id) = client.into_parts();
        assert_eq!((version, next_id), (kestrel_proto::PROTOCOL_VERSION, 2));
        server.stop().await;
    });
}
