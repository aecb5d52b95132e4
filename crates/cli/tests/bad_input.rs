//! Bad input of every kind: each gives a one-line error that says what is wrong and what to do,
//! a non-zero exit code, and the server goes on serving everyone else.

mod common;

use common::*;
use kestrel_proto::{FrameReader, FrameWriter, Role};
use serde::de::IgnoredAny;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Writes an access file for `port` with `secret` into `dir`.
fn write_access(dir: &Path, port: u16, secret: &str) {
    fs::create_dir_all(dir).unwrap();
    let access = serde_json::json!({
        "host": "127.0.0.1",
        "port": port,
        "secret": secret,
        "pid": std::process::id(),
        "protocol": 1,
    });
    let path = dir.join("access.json");
    fs::write(&path, access.to_string()).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn unknown_server_dir_says_how_to_start_one() {
    let c = Cluster::with_workers(&[1]);
    let empty = c.root().join("empty");
    fs::create_dir_all(&empty).unwrap();
    for args in [
        &["job", "list"][..],
        &["submit", "--", "true"],
        &["worker", "list"],
    ] {
        let out = c.run_with_dir(&empty, args);
        let err = out.one_line_error();
        assert!(err.contains("kestrel server start"), "{err}");
        assert!(err.contains("no access file"), "{err}");
    }
    c.assert_serves();
}

#[test]
fn unreachable_server_is_named() {
    let c = Cluster::with_workers(&[1]);
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = c.root().join("closed-port");
    write_access(&dir, port, &"ab".repeat(32));
    let started = Instant::now();
    let out = c.run_with_dir(&dir, &["job", "list"]);
    let err = out.one_line_error();
    assert!(err.contains("cannot reach the server"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );
    c.assert_serves();
}

#[test]
fn wrong_secret_is_refused_and_the_server_goes_on() {
    let c = Cluster::with_workers(&[1]);
    let access = c.access();
    let real = access["secret"].as_str().unwrap();
    let wrong: String = real
        .chars()
        .map(|ch| if ch == 'a' { 'b' } else { 'a' })
        .collect();
    assert_eq!(wrong.len(), 64);
    let dir = c.root().join("wrong-secret");
    write_access(&dir, c.port(), &wrong);
    for args in [&["job", "list"][..], &["submit", "--", "true"]] {
        let out = c.run_with_dir(&dir, args);
        let err = out.one_line_error();
        assert!(err.contains("secret"), "{err}");
        assert!(err.contains("stale"), "{err}");
        assert!(err.contains("access file"), "{err}");
    }
    // Nothing was submitted through the wrong door.
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    assert_eq!(jobs["jobs"], serde_json::json!([]));
    c.assert_serves();
}

#[test]
fn stale_access_file_of_a_stopped_server() {
    let mut c = Cluster::new();
    let old = c.root().join("old");
    fs::create_dir_all(&old).unwrap();
    fs::copy(c.server_dir.join("access.json"), old.join("access.json")).unwrap();
    c.run(&["server", "stop"]).ok();
    c.wait_server_exit(Duration::from_secs(10));
    // Without its journal the new server has a new secret and port (with it, both are kept and
    // the old file stays valid: see durability.rs).
    c.start_server_with(&["--no-journal"]);
    c.add_worker(1);
    c.wait_workers(1);
    let out = c.run_with_dir(&old, &["job", "list"]);
    let err = out.one_line_error();
    // The old port is closed (or, if reused by the new server, the secret is wrong): either
    // way the message says the access file is stale.
    assert!(err.contains("stale"), "{err}");
    assert!(
        err.contains("cannot reach the server") || err.contains("secret"),
        "{err}"
    );
    c.assert_serves();
}

/// Sends `bytes` on a fresh connection and asserts the server closes it promptly (well
/// before its 10 s handshake timeout) without answering.
fn assert_closed_after(port: u16, bytes: &[u8]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    // The server may close before reading everything; a reset here is fine.
    let _ = s.write_all(bytes);
    let mut buf = [0u8; 256];
    let mut got = Vec::new();
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!(
                "the server did not close the connection after {:?} ({e}); sent {bytes:?}",
                started.elapsed()
            ),
        }
    }
    assert!(got.is_empty(), "the server answered garbage with {got:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn malformed_frames_cost_only_their_connection() {
    let c = Cluster::with_workers(&[1]);
    let port = c.port();
    // An HTTP request: "GET " read as a length is about 1.2 GB, far over the limit.
    assert_closed_after(port, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    // A well-framed body that is not MessagePack (0xc1 is never used).
    assert_closed_after(port, &[0, 0, 0, 4, 0xc1, 0xc1, 0xc1, 0xc1]);
    // An empty frame.
    assert_closed_after(port, &[0, 0, 0, 0]);
    // Valid MessagePack that is not a hello: the string "hello".
    assert_closed_after(port, &[0, 0, 0, 6, 0xa5, b'h', b'e', b'l', b'l', b'o']);
    // A hello-shaped array with the wrong magic.
    let mut body = vec![0x94, 0xa4];
    body.extend_from_slice(b"http");
    body.extend_from_slice(&[0x01, 0xa6]);
    body.extend_from_slice(b"Client");
    body.extend_from_slice(&[0xc4, 32]);
    body.extend_from_slice(&[7; 32]);
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    assert_closed_after(port, &frame);
    // A connection that closes half way through a frame.
    {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&[0, 0, 0, 100, 1, 2, 3]).unwrap();
    }
    c.assert_serves();
    assert!(c
        .run(&["server", "info"])
        .ok()
        .stdout
        .contains("workers   1"));
    // Each bad peer is logged with what was wrong.
    let log = poll(
        "the server to log the bad peers",
        Duration::from_secs(5),
        || {
            let log = c.server_log();
            (log.matches("handshake failed").count() >= 5).then_some(log)
        },
    );
    assert!(log.contains("larger than the limit"), "{log}");
    assert!(log.contains("not a Kestrel endpoint"), "{log}");
    assert!(log.contains("unknown magic"), "{log}");
}

#[test]
fn oversized_frame_is_refused_from_its_header() {
    let c = Cluster::with_workers(&[1]);
    // 100 MiB announced. The server must refuse on the header alone: it closes at once instead
    // of waiting for (and buffering) the body, which never comes.
    let header = (100u32 << 20).to_be_bytes();
    assert_closed_after(c.port(), &header);
    // Same with part of a body following.
    let mut frame = header.to_vec();
    frame.extend(std::iter::repeat_n(0x90u8, 64 << 10));
    assert_closed_after(c.port(), &frame);
    c.assert_serves();
}

/// A byte string that MessagePack encodes as `bin`, as the handshake's nonce is.
struct Bin(Vec<u8>);

impl serde::Serialize for Bin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

/// The server's first answer to a hello (mirrors the private `HelloReply` in proto/src/auth.rs).
#[derive(serde::Deserialize, Debug)]
#[allow(dead_code)]
enum HelloReply {
    Challenge {
        version: u32,
        nonce: IgnoredAny,
        proof: IgnoredAny,
    },
    Refused {
        reason: String,
    },
}

/// Sends the hello of protocol `version` and returns the server's reply and whether the server
/// then closed the connection (rather than waiting for more).
fn hello(port: u16, version: u32) -> (HelloReply, bool) {
    // The private `Hello { magic, version, role, nonce }` is encoded positionally.
    let msg = ("kestrel", version, Role::Client, Bin(vec![7; 32]));
    let body = kestrel_proto::encode(&msg).unwrap();
    let mut expected = vec![0x94, 0xa7];
    expected.extend_from_slice(b"kestrel");
    expected.push(version as u8); // a positive fixint for the versions used here
    expected.push(0xa6);
    expected.extend_from_slice(b"Client");
    expected.extend_from_slice(&[0xc4, 32]);
    expected.extend_from_slice(&[7; 32]);
    assert_eq!(&body[..], &expected[..], "hello encoding");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let limit = Duration::from_secs(5);
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let (r, w) = stream.into_split();
        let (mut reader, mut writer) = (FrameReader::new(r), FrameWriter::new(w));
        writer.send(&msg).await.unwrap();
        let reply: HelloReply = tokio::time::timeout(limit, reader.recv())
            .await
            .expect("an answer to the hello")
            .expect("a hello reply");
        let closed = match tokio::time::timeout(Duration::from_secs(2), reader.next_frame()).await {
            Ok(Ok(None)) | Ok(Err(_)) => true,
            Ok(Ok(Some(f))) => panic!("unexpected frame after the reply: {f:?}"),
            Err(_) => false,
        };
        (reply, closed)
    })
}

#[test]
fn client_of_another_protocol_version_is_refused() {
    let c = Cluster::with_workers(&[1]);
    // Control: the same hello with the server's version gets a challenge, so the encoding is
    // right and the refusal below is about the version alone.
    match hello(c.port(), kestrel_proto::PROTOCOL_VERSION) {
        (HelloReply::Challenge { version, .. }, false) => {
            assert_eq!(version, kestrel_proto::PROTOCOL_VERSION)
        }
        other => panic!("expected a challenge, got {other:?}"),
    }
    match hello(c.port(), 99) {
        (HelloReply::Refused { reason }, true) => {
            assert!(reason.contains("version 99"), "{reason}");
            let spoken = format!(
                "it speaks {} to {}",
                kestrel_proto::OLDEST_PROTOCOL_VERSION,
                kestrel_proto::PROTOCOL_VERSION
            );
            assert!(reason.contains(&spoken), "{reason}");
            assert!(reason.contains("at most one release apart"), "{reason}");
        }
        other => panic!("expected a refusal and a closed connection, got {other:?}"),
    }
    c.assert_serves();
}

#[test]
fn tasks_that_cannot_start_fail_alone() {
    let mut c = Cluster::with_workers(&[1]);
    let noexec = c.work.join("not-executable.sh");
    fs::write(&noexec, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&noexec, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(c.work.join("plain-file"), "not a directory").unwrap();
    let noexec = noexec.display().to_string();
    let cases: [(&[&str], &[&str]); 3] = [
        (&[], &["kestrel-no-such-program-xyz", "arg"]),
        (&[], &[&noexec]),
        (&["--stdout", "plain-file/{task}.out"], &["true"]),
    ];
    let mut reasons = Vec::new();
    for (job, (opts, command)) in cases.iter().enumerate() {
        let mut args = vec!["submit", "--wait"];
        args.extend_from_slice(opts);
        args.push("--");
        args.extend_from_slice(command);
        let out = c.run(&args);
        assert_eq!(out.code(), Some(1), "{out:#?}");
        assert!(out.stderr.contains("1 failed"), "{out:#?}");
        let page = c
            .run(&["task", "list", &(job + 1).to_string(), "--output", "json"])
            .ok()
            .json();
        let row = &page["tasks"][0];
        assert_eq!(row["state"], "failed", "{page:#}");
        assert_eq!(row["exit_code"], serde_json::Value::Null);
        reasons.push(row["reason"].as_str().expect("a reason").to_string());
    }
    assert!(
        reasons[0].contains("kestrel-no-such-program-xyz") && reasons[0].contains("not found"),
        "{}",
        reasons[0]
    );
    assert!(reasons[1].contains(&noexec), "{}", reasons[1]);
    assert!(
        reasons[1].contains("not executable") && reasons[1].contains("permission"),
        "{}",
        reasons[1]
    );
    let stdout_path = c.work.join("plain-file/0.out").display().to_string();
    assert!(
        reasons[2].contains("stdout file") && reasons[2].contains(&stdout_path),
        "{}",
        reasons[2]
    );
    // The worker survived all three and is still the only one; later tasks succeed on it.
    assert!(c.worker_running(0));
    let workers = c.wait_workers(1);
    assert_eq!(workers[0]["id"], 1);
    assert_eq!(workers[0]["failed"], 3);
    c.assert_serves();
}

#[test]
fn backwards_array_is_rejected_before_submitting() {
    let c = Cluster::with_workers(&[1]);
    let out = c.run(&["submit", "--array", "5-1", "--", "true"]);
    let err = out.one_line_error();
    assert!(matches!(out.code(), Some(1 | 2)), "{out:#?}");
    assert!(err.contains("5-1"), "{err}");
    assert!(err.contains("backwards"), "{err}");
    assert!(err.contains("smaller number first"), "{err}");
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    assert_eq!(jobs["jobs"], serde_json::json!([]), "nothing was submitted");
    c.assert_serves();
}

#[test]
fn job_file_with_an_unknown_key_names_file_and_key() {
    let c = Cluster::with_workers(&[1]);
    fs::write(
        c.work.join("sweep.toml"),
        "[[job]]\narray = \"1-3\"\ncommand = \"true\"\ncpu = 2\n",
    )
    .unwrap();
    fs::write(
        c.work.join("defaults.toml"),
        "[defaults]\nretry = 1\n\n[[job]]\narray = \"1-3\"\ncommand = \"true\"\n",
    )
    .unwrap();
    for (file, key, line) in [("sweep.toml", "cpu", 4), ("defaults.toml", "retry", 2)] {
        let out = c.run(&["submit", "--file", file, "--wait"]);
        let err = out.one_line_error();
        assert!(err.contains(file), "{err}");
        assert!(err.contains(&format!("`{key}`")), "{err}");
        assert!(err.contains(&format!("line {line}")), "{err}");
    }
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    assert_eq!(jobs["jobs"], serde_json::json!([]), "nothing was submitted");
    c.assert_serves();
}

/// A typo in the program's path is said at submission (a warning: the file may appear
/// before the tasks run), and each task then fails naming it.
#[test]
fn a_program_path_that_does_not_exist_is_said_at_submission() {
    let c = Cluster::with_workers(&[1]);
    let out = c.run(&["submit", "--wait", "./nosuch.sh"]);
    out.failed();
    let work = c.work.display();
    assert!(
        out.stderr.contains(&format!(
            "warning: ./nosuch.sh does not exist in {work}: the tasks fail unless it is there when they run; check the path"
        )),
        "{out:#?}"
    );
    let failed = c
        .run(&["task", "list", "1", "--output", "json"])
        .ok()
        .json();
    assert_eq!(
        failed["tasks"][0]["reason"], "'./nosuch.sh' does not exist; check the path",
        "{failed}"
    );
    // A program found on PATH, or one that exists, is not warned about.
    fs::write(c.work.join("there.sh"), "#!/bin/sh\n").unwrap();
    for program in ["true", "./there.sh"] {
        let out = c.run(&["submit", program]);
        out.ok();
        assert!(!out.stderr.contains("warning"), "{out:#?}");
    }
}
