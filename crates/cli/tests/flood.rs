//! Floods and oversized fields (issue 30): bounded floods of idle and slow connections from
//! other loopback addresses against the server's port and a worker's peer port while a real
//! client submits and its work finishes; requests whose size fields are at their maximum; an
//! array with step 0. Everything on 127.0.0.x; a few hundred descriptors at most.

mod common;

use common::*;
use kestrel_proto::messages::{Ask, Request, ToClient};
use kestrel_proto::{Access, Role, SPOKEN_VERSIONS};
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use tokio::io::AsyncWriteExt;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `n` connections to `127.0.0.1:port` from the loopback address `from`, each sent `first`.
fn flood(
    rt: &tokio::runtime::Runtime,
    from: &str,
    port: u16,
    n: usize,
    first: &[u8],
) -> Vec<TcpStream> {
    let from: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
    (0..n)
        .map(|_| {
            let mut s = rt
                .block_on(async {
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.bind(from)?;
                    socket
                        .connect(([127, 0, 0, 1], port).into())
                        .await?
                        .into_std()
                })
                .expect("connect");
            s.set_nonblocking(false).unwrap();
            let _ = s.write_all(first);
            s
        })
        .collect()
}

/// Room for the floods in this process too (a default soft limit may be 1,024).
fn enough_descriptors() {
    kestrel_proto::fds::raise_open_file_limit();
}

/// Issue 30: 2,000 idle connections from one process made 16 of 30 real submits fail: the
/// 512 handshake places were global, and the flood held them all.
#[test]
fn idle_and_slow_connections_from_other_addresses_do_not_lock_a_client_out() {
    enough_descriptors();
    // Handshake deadlines far longer than the flood takes to open (on a loaded machine it took
    // over 2 s, the default crowded deadline): the client must get in by taking a flooded
    // place, not because the flood timed out first.
    let mut c = Cluster::with_server_args(&["--handshake-timeout", "300s"]);
    c.add_worker(2);
    c.wait_workers(1);
    let port = c.port();
    let rt = runtime();
    // One address takes the half of the places it may hold, another tries to take more; with
    // that every place is taken. A third address sends half a frame.
    let idle_a = flood(&rt, "127.0.0.3", port, 256, b"");
    let idle_b = flood(&rt, "127.0.0.2", port, 300, b"");
    let slow = flood(&rt, "127.0.0.4", port, 20, &[0, 0, 0, 100, 1, 2, 3]);
    // A real client gets in (the oldest idle connection of the address holding the most gives
    // way), and so does its work.
    let out = c.run(&[
        "submit", "--array", "1-20", "--wait", "--stdout", "none", "--stderr", "none", "--", "true",
    ]);
    out.ok();
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!(info["counts"]["finished"], 20, "{info}");
    c.assert_serves();
    // Places were taken from the flood, and no flooded connection timed out.
    let log = poll("the server to log the flood", STARTUP, || {
        let log = c.server_log();
        log.contains("closed to make room").then_some(log)
    });
    assert!(
        log.contains("256 connections from 127.0.0.2 are already waiting to prove the secret"),
        "{log}"
    );
    assert!(!log.contains("not finished within"), "{log}");
    drop((idle_a, idle_b, slow));
}

/// A handshake deadline no peer could meet is refused before the server starts.
#[test]
fn a_handshake_timeout_too_short_to_prove_the_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server_dir = dir.path().join("server");
    let out = run_bounded(
        {
            let mut c = kestrel();
            c.args(["server", "start", "--host", "127.0.0.1", "--dir"])
                .arg(&server_dir)
                .args(["--handshake-timeout", "5ms"]);
            c
        },
        STARTUP,
    );
    let err = out.failed().one_line_error();
    assert!(
        err.contains("--handshake-timeout 5ms is too short"),
        "{err}"
    );
    assert!(!server_dir.join("access.json").exists());
}

/// Issue 30: 1,100 idle connections to a worker's peer port used up its descriptors, and
/// every task then failed with "Too many open files". The worker here may open 256 files.
#[test]
fn a_flooded_peer_port_leaves_the_workers_tasks_their_descriptors() {
    enough_descriptors();
    let mut c = Cluster::new();
    let peer_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut worker = kestrel();
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        worker.pre_exec(|| {
            let l = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let listen = format!("127.0.0.1:{peer_port}");
    c.add_worker_as(worker, 2, &["--peer-listen", &listen]);
    c.wait_workers(1);
    poll("the peer port to listen", STARTUP, || {
        TcpStream::connect(("127.0.0.1", peer_port)).ok()
    });
    let rt = runtime();
    // More connections than the worker may open files, idle and slow (half a header).
    let idle = flood(&rt, "127.0.0.2", peer_port, 300, b"");
    let slow = flood(
        &rt,
        "127.0.0.3",
        peer_port,
        30,
        b"GET /files/k/x HTTP/1.1\r\nx-a: ",
    );
    let out = c.run(&[
        "submit",
        "--array",
        "1-40",
        "--wait",
        "--stdout",
        "none",
        "--stderr",
        "none",
        "--",
        "sh",
        "-c",
        "echo {task} > /dev/null",
    ]);
    let info = c.run(&["job", "info", "1", "--output", "json"]).ok().json();
    assert_eq!(info["counts"]["finished"], 40, "{info} {out:#?}");
    out.ok();
    drop((idle, slow));
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
