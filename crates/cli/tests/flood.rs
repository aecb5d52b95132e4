//! Oversized fields (issue 30): requests whose size fields are at their maximum, and an array
//! with step 0. Everything on 127.0.0.1.

mod common;

use common::*;
use kestrel_proto::messages::{Ask, Request, ToClient};
use kestrel_proto::{Access, Role, SPOKEN_VERSIONS};
use std::io::Write;
use std::net::TcpStream;
use tokio::io::AsyncWriteExt;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Frames announcing 4 GiB before and after the handshake, a request claiming 4 billion
/// fields, and an array with step 0: each is refused with what it was, and the server goes on.
#[test]
fn requests_with_size_fields_at_their_maximum_are_refused_and_the_server_goes_on() {
    let c = Cluster::with_workers(&[1]);
    let port = c.port();
    // Before the handshake.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    let access = Access::read(&c.server_dir.join("access.json")).unwrap();
    let rt = runtime();
    let connect = || {
        rt.block_on(kestrel_proto::client::connect_as(
            &access,
            Role::Client,
            SPOKEN_VERSIONS,
        ))
        .expect("connect")
    };
    // After it: a frame header at its maximum, then a body claiming 2^32 - 1 fields.
    for frame in [
        u32::MAX.to_be_bytes().to_vec(),
        vec![0, 0, 0, 5, 0xdd, 0xff, 0xff, 0xff, 0xff],
    ] {
        let (mut reader, writer, _) = connect();
        let mut w = writer.into_inner();
        rt.block_on(async {
            w.write_all(&frame).await.unwrap();
            w.flush().await.unwrap();
        });
        let end =
            rt.block_on(async { tokio::time::timeout(COMMAND_LIMIT, reader.next_frame()).await });
        assert!(
            matches!(end, Ok(Ok(None)) | Ok(Err(_))),
            "the connection stays open: {end:?}"
        );
    }
    // An array with step 0 (which `--array` never sends): refused by its number, in words,
    // and the connection still answers.
    let spec = kestrel_core::JobSpec::command("zero", vec!["true".into()]);
    let ids = kestrel_core::IdRanges::parse("1-29:7").unwrap();
    let submit = Request {
        id: 1,
        body: Ask::Submit {
            spec,
            tasks: kestrel_core::TaskSet::Array(ids),
            open: false,
            key: None,
        },
    };
    let mut bytes = kestrel_proto::encode(&submit).unwrap().to_vec();
    let run = [0x93, 1, 5, 7];
    let at: Vec<usize> = (0..bytes.len() - 3)
        .filter(|&i| bytes[i..i + 4] == run)
        .collect();
    assert_eq!(at.len(), 1, "the run [1, 5, 7] once in {bytes:?}");
    bytes[at[0] + 3] = 0;
    let (mut reader, mut writer, _) = connect();
    let reply = rt.block_on(async {
        writer.feed(bytes.into()).await.unwrap();
        writer.flush().await.unwrap();
        reader.recv::<ToClient>().await.unwrap()
    });
    let refusal = match reply {
        ToClient::Reply {
            id: 1,
            result: Err(refusal),
        } => refusal,
        other => panic!("not a refusal of request 1: {other:?}"),
    };
    assert!(
        refusal
            .message
            .contains("step in '[first 1, count 5, step 0]' must be at least 1"),
        "{refusal}"
    );
    let again = rt.block_on(async {
        writer
            .send(&Request {
                id: 2,
                body: Ask::JobList,
            })
            .await
            .unwrap();
        reader.recv::<ToClient>().await.unwrap()
    });
    assert!(
        matches!(
            again,
            ToClient::Reply {
                id: 2,
                result: Ok(_)
            }
        ),
        "{again:?}"
    );
    c.assert_serves();
    let log = poll("the server to log the refusals", STARTUP, || {
        let log = c.server_log();
        log.contains("refused a request it cannot read")
            .then_some(log)
    });
    assert!(
        log.contains("frame of 4294967295 bytes is larger than the limit of 65536 bytes"),
        "{log}"
    );
    assert!(
        log.contains("frame of 4294967295 bytes is larger than the limit of 16777216 bytes"),
        "{log}"
    );
    drop(s);
}
