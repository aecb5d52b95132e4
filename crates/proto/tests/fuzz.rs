//! Bad input against the frame decoder and both sides of the handshake: the corpus in
//! `tests/corpus` (see its README) is replayed, and proptest generates more (random bytes,
//! truncated frames, oversized length prefixes, valid frames with mutated bodies, hellos with
//! wrong versions or garbage). Properties: no panic, an error that names what was wrong, no
//! waiting for a body that is over the limit, and no allocation anywhere near the frame limit
//! for a refused frame (checked with a counting allocator).

use kestrel_proto::messages::{Ask, FromWorker, Request, Started, ToClient, ToWorker};
use kestrel_proto::{
    accept_handshake, connect_handshake, decode, encode, FrameReader, FrameWriter, Handshake,
    ProtoError, Role, MAX_FRAME_BYTES, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, SPOKEN_VERSIONS,
};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Records the largest single allocation, so a test can show that a frame announcing more
/// than the limit is refused before its buffer is made.
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const SECRET: &[u8] = b"fuzzing-secret-fuzzing-secret-32";
/// Every replay is over well within this; a hang is a failure.
const LIMIT: Duration = Duration::from_secs(5);

/// The server's error for each corpus file, as a piece of its message.
const EXPECTED: &[(&str, &str)] = &[
    ("http-get.bin", "larger than the limit"),
    ("tls-client-hello.bin", "larger than the limit"),
    ("length-max-u32.bin", "larger than the limit"),
    ("length-just-over-limit.bin", "larger than the limit"),
    ("empty-frame.bin", "not a Kestrel endpoint"),
    ("truncated-frame.bin", "connection error"),
    ("truncated-header.bin", "connection error"),
    ("not-msgpack.bin", "not a Kestrel endpoint"),
    ("msgpack-string.bin", "not a Kestrel endpoint"),
    ("hello-wrong-magic.bin", "unknown magic"),
    ("hello-wrong-version.bin", "version mismatch"),
    ("hello-version-max.bin", "version mismatch"),
    ("hello-short-nonce.bin", "bad nonce length"),
    ("hello-unknown-role.bin", "not a Kestrel endpoint"),
    ("hello-then-garbage-proof.bin", "malformed message"),
    ("hello-then-wrong-proof.bin", "authentication failed"),
    ("hello-then-empty-proof.bin", "authentication failed"),
    ("deep-nesting.bin", "not a Kestrel endpoint"),
    ("huge-array-count.bin", "not a Kestrel endpoint"),
    ("huge-map-count.bin", "not a Kestrel endpoint"),
    ("huge-bin-length.bin", "not a Kestrel endpoint"),
];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs the server side of the handshake against a peer that sends `bytes` and then, if
/// `close`, ends its stream (otherwise stays silent and open).
async fn server_sees(bytes: &[u8], close: bool) -> Result<Handshake, ProtoError> {
    let (peer, server) = tokio::io::duplex(1 << 16);
    let (_peer_r, mut peer_w) = tokio::io::split(peer);
    let (sr, sw) = tokio::io::split(server);
    let (mut reader, mut writer) = (FrameReader::new(sr), FrameWriter::new(sw));
    // The server's answers go to `_peer_r`, which is never read: 64 KiB of buffer is plenty.
    // The peer writes concurrently, as input can be larger than the pipe's buffer; without
    // `close` it then stays open and silent.
    let send = async {
        let _ = peer_w.write_all(bytes).await;
        if close {
            let _ = peer_w.shutdown().await;
            drop(peer_w);
        }
        std::future::pending::<std::convert::Infallible>().await
    };
    let handshake = tokio::time::timeout(LIMIT, accept_handshake(&mut reader, &mut writer, SECRET));
    tokio::select! {
        r = handshake => r.expect("the handshake ended within the limit"),
        never = send => match never {},
    }
}

/// Runs the connecting side against a "server" that answers with `bytes` and closes.
async fn client_sees(bytes: &[u8]) -> Result<u32, ProtoError> {
    let (client, server) = tokio::io::duplex(1 << 16);
    let (cr, cw) = tokio::io::split(client);
    let (_sr, mut sw) = tokio::io::split(server);
    let send = async {
        let _ = sw.write_all(bytes).await;
        let _ = sw.shutdown().await;
        drop(sw);
        std::future::pending::<std::convert::Infallible>().await
    };
    let (mut reader, mut writer) = (FrameReader::new(cr), FrameWriter::new(cw));
    let handshake = tokio::time::timeout(
        LIMIT,
        connect_handshake(&mut reader, &mut writer, Role::Worker, SECRET),
    );
    tokio::select! {
        r = handshake => r.expect("the handshake ended within the limit"),
        never = send => match never {},
    }
}

/// Decodes every frame in `bytes` as each message type; returns how many frames there were.
async fn decode_all(bytes: &[u8]) -> usize {
    let mut reader = FrameReader::new(bytes);
    let mut frames = 0;
    while let Ok(Some(frame)) = reader.next_frame().await {
        frames += 1;
        let _ = decode::<Request>(&frame);
        let _ = decode::<FromWorker>(&frame);
        let _ = decode::<ToWorker>(&frame);
        let _ = decode::<ToClient>(&frame);
    }
    frames
}

/// An error a person can act on: a known kind with a non-empty message.
fn assert_clear(e: &ProtoError, input: &str) {
    let text = e.to_string();
    assert!(text.len() > 10, "{input}: vague error {text:?}");
    assert!(
        !matches!(e, ProtoError::Refused(_) | ProtoError::Timeout(_)),
        "{input}: unexpected kind {e:?}"
    );
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("the corpus directory")
        .filter_map(|e| {
            let path = e.ok()?.path();
            (path.extension()? == "bin").then(|| {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&path).expect("a corpus file"))
            })
        })
        .collect();
    files.sort();
    files
}

#[test]
fn corpus_inputs_fail_with_their_expected_errors() {
    let files = corpus();
    assert!(files.len() >= EXPECTED.len(), "corpus files are missing");
    let rt = rt();
    for (name, bytes) in &files {
        let err = rt
            .block_on(server_sees(bytes, true))
            .expect_err("bad input is refused");
        assert_clear(&err, name);
        if let Some((_, want)) = EXPECTED.iter().find(|(f, _)| f == name) {
            assert!(
                err.to_string().contains(want),
                "{name}: expected an error containing {want:?}, got: {err}"
            );
        }
        // The same bytes as a server's answer, and through the plain decoder.
        let err = rt.block_on(client_sees(bytes)).expect_err("not a server");
        assert_clear(&err, name);
        rt.block_on(decode_all(bytes));
    }
    for (name, _) in EXPECTED {
        assert!(
            files.iter().any(|(f, _)| f == name),
            "{name} is listed but not in the corpus"
        );
    }
}

#[test]
fn an_oversized_prefix_is_refused_without_waiting_or_allocating() {
    let rt = rt();
    for len in [MAX_FRAME_BYTES as u32 + 1, 100 << 20, u32::MAX] {
        LARGEST.store(0, Ordering::Relaxed);
        // The peer stays open: the refusal must come from the header alone.
        let err = rt
            .block_on(server_sees(&len.to_be_bytes(), false))
            .expect_err("refused");
        // The length announced is what the error (and so the log) says.
        assert!(
            matches!(err, ProtoError::FrameTooLarge { size, .. } if size == len as usize),
            "{err:?}"
        );
        assert!(
            err.to_string().contains(&format!("frame of {len} bytes")),
            "{err}"
        );
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest < MAX_FRAME_BYTES / 4,
            "an allocation of {largest} bytes for a refused frame of {len}"
        );
    }
}

fn hello_bytes(magic: &str, version: u32, role: &str, nonce: Vec<u8>) -> Vec<u8> {
    /// MessagePack `bin`, as the handshake's nonce is encoded.
    struct Bin(Vec<u8>);
    impl serde::Serialize for Bin {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0)
        }
    }
    let body = encode(&(magic, version, role, Bin(nonce))).expect("encodes");
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

fn message_strategy() -> impl Strategy<Value = Vec<u8>> {
    let argvs = proptest::collection::vec(proptest::collection::vec(".{0,8}", 0..3), 0..4);
    prop_oneof![
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            argvs,
            any::<bool>()
        )
            .prop_map(|(id, job, at, argvs, close)| {
                encode(&Request {
                    id,
                    body: Ask::Extend {
                        job,
                        at,
                        argvs,
                        close,
                    },
                })
                .expect("encodes")
                .to_vec()
            }),
        (any::<u64>(), proptest::collection::vec(any::<u32>(), 0..8)).prop_map(|(id, jobs)| {
            encode(&Request {
                id,
                body: Ask::Cancel { jobs },
            })
            .expect("encodes")
            .to_vec()
        }),
        proptest::collection::vec((any::<u32>(), any::<u32>(), any::<u64>()), 0..8).prop_map(|s| {
            let started = s
                .into_iter()
                .map(|(job, index, at_us)| Started { job, index, at_us })
                .collect();
            encode(&FromWorker::Update {
                started,
                finished: vec![],
                outputs: vec![],
                waited: vec![],
                cache: Default::default(),
            })
            .expect("encodes")
            .to_vec()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Any bytes at all: the server refuses with a clear error, never hangs or panics.
    #[test]
    fn random_bytes_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let rt = rt();
        match rt.block_on(server_sees(&bytes, true)) {
            Ok(role) => prop_assert!(false, "random bytes were welcomed as {role:?}"),
            Err(ProtoError::Closed) => prop_assert!(bytes.is_empty()),
            Err(e) => assert_clear(&e, "random bytes"),
        }
        if let Err(e) = rt.block_on(client_sees(&bytes)) {
            assert_clear(&e, "random bytes as a server");
        }
        rt.block_on(decode_all(&bytes));
    }

    /// A valid frame cut anywhere: an error, not a hang waiting for the rest.
    #[test]
    fn truncated_frames_are_errors(body in message_strategy(), cut in any::<prop::sample::Index>()) {
        let whole = framed(&body);
        let cut = cut.index(whole.len());
        let frames = rt().block_on(decode_all(&whole[..cut]));
        prop_assert_eq!(frames, 0);
        let err = rt().block_on(server_sees(&whole[..cut], true)).expect_err("refused");
        assert_clear(&err, "a truncated frame");
    }

    /// Any length prefix over the limit, followed by anything: refused from the header.
    #[test]
    fn oversized_prefixes_are_refused(
        len in (MAX_FRAME_BYTES as u32 + 1)..=u32::MAX,
        tail in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut bytes = len.to_be_bytes().to_vec();
        bytes.extend_from_slice(&tail);
        let err = rt().block_on(server_sees(&bytes, false)).expect_err("refused");
        prop_assert!(matches!(err, ProtoError::FrameTooLarge { size, .. } if size == len as usize), "{}", err);
    }

    /// Valid messages with bytes overwritten, inserted or removed: they decode to something or
    /// fail; the framing around them stays intact.
    #[test]
    fn mutated_bodies_never_panic(
        body in message_strategy(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let mut body = body;
        for (at, byte, kind) in edits {
            match kind {
                0 if !body.is_empty() => { let i = at.index(body.len()); body[i] = byte; }
                1 => { let i = at.index(body.len() + 1); body.insert(i, byte); }
                _ if !body.is_empty() => { body.remove(at.index(body.len())); }
                _ => {}
            }
        }
        let mut two = framed(&body);
        two.extend(framed(&body));
        prop_assert_eq!(rt().block_on(decode_all(&two)), 2);
        let err = rt().block_on(server_sees(&framed(&body), true)).expect_err("refused");
        assert_clear(&err, "a mutated frame");
    }

    /// Hellos with any magic, version, role and nonce: only the exact protocol gets a
    /// challenge, everything else a specific error.
    #[test]
    fn hellos_with_wrong_fields_are_refused_for_that_field(
        magic in prop_oneof![Just("kestrel".to_string()), ".{0,12}"],
        version in prop_oneof![Just(PROTOCOL_VERSION), Just(OLDEST_PROTOCOL_VERSION), any::<u32>()],
        role in prop_oneof![Just("Worker".to_string()), Just("Client".to_string()), "[A-Za-z]{0,8}"],
        nonce in prop_oneof![Just(vec![7u8; 32]), proptest::collection::vec(any::<u8>(), 0..64)],
        proof in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = hello_bytes(&magic, version, &role, nonce.clone());
        // A proof frame in the shape the server expects, but made without the secret.
        bytes.extend(framed(&encode(&(serde_bytes::ByteBuf::from(proof),)).expect("encodes")));
        let err = rt().block_on(server_sees(&bytes, true)).expect_err("no secret, no entry");
        assert_clear(&err, "a hello");
        let text = err.to_string();
        let role_ok = role == "Worker" || role == "Client";
        if !role_ok {
            prop_assert!(text.contains("not a Kestrel endpoint"), "{}", text);
        } else if magic != "kestrel" {
            prop_assert!(text.contains("unknown magic"), "{}", text);
        } else if !SPOKEN_VERSIONS.contains(&version) {
            prop_assert!(matches!(err, ProtoError::Version { ref theirs, .. } if *theirs == version.to_string()), "{}", text);
        } else if nonce.len() != 32 {
            prop_assert!(text.contains("bad nonce length"), "{}", text);
        } else {
            prop_assert!(matches!(err, ProtoError::Auth(_)), "{}", text);
        }
    }
}
