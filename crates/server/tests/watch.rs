//! A watch over loopback (protocol 13): a client watches what it submits, a worker (the
//! protocol spoken by hand) reports two ends with their streamed output, and the client is
//! pushed both in one frame, once the journal holds them.

use kestrel_core::{Failure, Finished, IdRanges, JobSpec, RunEnd, Sink, TaskSet, TaskState};
use kestrel_proto::client::{connect_as, Client};
use kestrel_proto::messages::{
    Answer, Ask, FromWorker, Kept, Registration, Request, TaskOutput, ToClient, ToWorker,
};
use kestrel_proto::{Role, SPOKEN_VERSIONS};
use kestrel_server::{start, ServerConfig};
use std::time::{Duration, Instant};

/// Whatever the machine's load, every wait of the test ends within this.
const LIMIT: Duration = Duration::from_secs(20);

fn kept(data: &[u8]) -> Kept {
    Kept {
        data: data.to_vec(),
        total: data.len() as u64,
    }
}

#[test]
fn a_watching_client_is_pushed_the_ends_a_worker_reports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let config = ServerConfig {
            journal: true,
            ..ServerConfig::local(dir.path().to_path_buf())
        };
        let server = start(config).await.expect("server");

        // A worker of two slots.
        let (mut wr, mut ww, _) = connect_as(&server.access, Role::Worker, SPOKEN_VERSIONS)
            .await
            .expect("worker connected");
        let registration = Registration {
            hostname: "loop-node".into(),
            slots: 2,
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
        ww.send(&FromWorker::Register(registration))
            .await
            .expect("registered");
        let welcome: ToWorker = wr.recv().await.expect("welcome");
        assert!(matches!(welcome, ToWorker::Registered { .. }), "{welcome:?}");

        // The client watches what it submits, then submits.
        let mut client = Client::connect(&server.access).await.expect("client");
        let missing = client.watch(vec![7], true).await.expect("watching");
        assert_eq!(missing, vec![7], "no job 7 yet");
        let mut spec = JobSpec::command("f", vec!["python".into()]);
        spec.template.stdout = Sink::Stream { limit: 1 << 20 };
        spec.template.stderr = Sink::Stream { limit: 1 << 20 };
        let submitted = client
            .call(Ask::Submit {
                spec,
                tasks: TaskSet::Array(IdRanges::span(1, 2)),
                open: false,
                key: None,
            })
            .await
            .expect("submitted");
        let Answer::Submitted { job, .. } = submitted else {
            panic!("submit answered {submitted:?}");
        };
        let (mut reader, mut writer, version, next_id) = client.into_parts();
        assert_eq!(version, kestrel_proto::PROTOCOL_VERSION);
        assert!(next_id > 2, "two requests were sent");

        // The worker gets both tasks and reports them: a success and a failure.
        let mut held = 0;
        while held < 2 {
            match tokio::time::timeout(LIMIT, wr.recv::<ToWorker>()).await {
                Ok(Ok(ToWorker::Assign { tasks })) => {
                    held += tasks.iter().map(|a| a.run.count).sum::<u32>();
                }
                Ok(Ok(_)) => {}
                other => panic!("the worker got {other:?}"),
            }
        }
        let now = 1_700_000_000_000_000;
        let failure = Failure {
            exit_code: Some(1),
            signal: None,
            reason: "exit code 1".into(),
            stderr_tail: String::new(),
            permanent: false,
        };
        let update = FromWorker::Update {
            started: Vec::new(),
            finished: vec![
                Finished::at_once(job, 0, now, RunEnd::Success),
                Finished::at_once(job, 1, now, RunEnd::Failed(Box::new(failure))),
            ],
            outputs: vec![
                TaskOutput {
                    job,
                    index: 0,
                    stdout: Some(kept(b"\x80\x05K*.")),
                    stderr: None,
                    files: 0,
                },
                TaskOutput {
                    job,
                    index: 1,
                    stdout: None,
                    stderr: Some(kept(b"Traceback\n")),
                    files: 0,
                },
            ],
            waited: Vec::new(),
            cache: Default::default(),
        };
        let sent = Instant::now();
        ww.send(&update).await.expect("update sent");
        let pushed = tokio::time::timeout(LIMIT, reader.recv::<ToClient>())
            .await
            .expect("pushed in time")
            .expect("a frame");
        let took = sent.elapsed();
        eprintln!("report to push, with a journal commit: {took:?}");
        let ToClient::Ended { ends } = pushed else {
            panic!("the client was pushed {pushed:?}");
        };
        let got: Vec<_> = ends.iter().map(|e| (e.id, e.state)).collect();
        assert_eq!(got, vec![(1, TaskState::Finished), (2, TaskState::Failed)]);
        assert_eq!(ends[0].stdout, Some(kept(b"\x80\x05K*.")));
        assert_eq!(ends[0].worker.as_deref(), Some("loop-node"));
        assert_eq!(ends[1].stderr, Some(kept(b"Traceback\n")));
        assert_eq!(ends[1].reason.as_deref(), Some("exit code 1"));

        // The connection goes on serving requests by the ids it continues.
        let ask = Request {
            id: next_id,
            body: Ask::JobStates { jobs: vec![job] },
        };
        writer.send(&ask).await.expect("asked");
        let reply = tokio::time::timeout(LIMIT, reader.recv::<ToClient>())
            .await
            .expect("answered in time")
            .expect("a frame");
        assert!(
            matches!(&reply, ToClient::Reply { id, result: Ok(Answer::JobStates(_)) } if *id == next_id),
            "{reply:?}"
        );
        server.stop().await;
    });
}
