//! A client that stops reading its replies is dropped after the write timeout, and the server
//! goes on answering everyone else.

use kestrel_core::{IdRanges, JobSpec, TaskSet};
use kestrel_proto::client::{connect_as, Client};
use kestrel_proto::messages::{Answer, Ask, Request};
use kestrel_proto::{Role, SPOKEN_VERSIONS};
use kestrel_server::{start, ServerConfig};
use std::time::Duration;

/// Whatever the machine's load, every wait of the test ends within this.
const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn a_client_that_stops_reading_is_dropped_and_the_others_are_still_answered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let config = ServerConfig {
            write_timeout: Duration::from_millis(300),
            ..ServerConfig::local(dir.path().to_path_buf())
        };
        let server = start(config).await.expect("server");
        let mut other = Client::connect(&server.access).await.expect("connected");
        let submit = Ask::Submit {
            spec: JobSpec::command("many", vec!["true".into()]),
            tasks: TaskSet::Array(IdRanges::parse("1-10000").expect("ids")),
            open: false,
            key: None,
        };
        let job = match other.call(submit).await.expect("submitted") {
            Answer::Submitted { job, .. } => job,
            a => panic!("submit answered {a:?}"),
        };

        // Asks for far more than the sockets' buffers hold (each page is a few hundred KiB),
        // and reads none of it.
        let (mut reader, mut writer, _) = connect_as(&server.access, Role::Client, SPOKEN_VERSIONS)
            .await
            .expect("connected");
        for id in 1..=200 {
            let ask = Ask::TaskList {
                job,
                state: None,
                limit: 10_000,
            };
            let frame = kestrel_proto::encode(&Request { id, body: ask }).expect("encoded");
            writer.feed(frame).await.expect("sent");
        }
        writer.flush().await.expect("sent");

        // Everyone else is answered meanwhile, and after.
        for _ in 0..5 {
            let info = tokio::time::timeout(LIMIT, other.call(Ask::JobInfo { job })).await;
            assert!(matches!(info, Ok(Ok(Answer::Job(_)))), "{info:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // The server gave up on the reader that stalled: what reached its socket before is
        // there to read, then the connection ends (without the timeout it would stay open,
        // and the rest of the 200 pages would follow).
        let ended = tokio::time::timeout(LIMIT, async {
            let mut frames = 0u32;
            loop {
                match reader.next_frame().await {
                    Ok(Some(_)) => frames += 1,
                    Ok(None) | Err(_) => return frames,
                }
            }
        })
        .await;
        let frames =
            ended.expect("the server closed the connection of a client that stopped reading");
        assert!(
            frames < 200,
            "all {frames} pages came: the writer never stalled"
        );
        let info = tokio::time::timeout(LIMIT, other.call(Ask::JobInfo { job })).await;
        assert!(matches!(info, Ok(Ok(Answer::Job(_)))), "{info:?}");
        server.stop().await;
    });
}
