//! Framing: each message is a 4-byte big-endian length followed by that many bytes of
//! MessagePack. Frames above [`MAX_FRAME_BYTES`] are refused before any byte of them is buffered.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Decoder, FramedRead, FramedWrite, LengthDelimitedCodec};

/// The largest frame either side accepts (16 MiB). Larger submissions are sent in pieces.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// The largest frame a server reads before the peer has proven the secret: handshake messages
/// are tiny, and an unauthenticated peer must not make the server reserve 16 MiB.
pub const HANDSHAKE_MAX_FRAME_BYTES: usize = 64 << 10;

/// What can go wrong on a connection, each with a message a person can act on.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {size} bytes is larger than the limit of {max} bytes; the peer is not speaking Kestrel's protocol or sent too much at once")]
    FrameTooLarge { size: usize, max: usize },
    #[error("malformed message: {0}")]
    Decode(String),
    #[error("the peer closed the connection")]
    Closed,
    #[error("protocol version mismatch: this side speaks {ours}, the peer speaks {theirs}; use kestrel of the same release on both sides, or at most one release apart")]
    Version {
        /// The versions this side speaks ("6 to 7").
        ours: String,
        /// The versions the peer speaks, or chose.
        theirs: String,
    },
    #[error("the peer is not a Kestrel endpoint ({0})")]
    NotKestrel(String),
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("refused by the server: {0}")]
    Refused(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("TLS: {0}")]
    Tls(String),
}

/// Bytes of a frame's header: the body's length, a big-endian `u32`.
const HEADER_BYTES: usize = 4;

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(HEADER_BYTES)
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

fn map_io(e: std::io::Error) -> ProtoError {
    ProtoError::Io(e)
}

/// The reading half of the framing. Not tokio-util's `LengthDelimitedCodec`, whose error for
/// an oversized frame does not say the length announced (a 4 GiB header was logged as a
/// "frame of 0 bytes"); like it, a frame's room is reserved only once its header passed the
/// limit.
struct FrameDecoder {
    max: usize,
    /// The length of the frame whose header was read, while its body is awaited.
    body: Option<usize>,
}

impl Decoder for FrameDecoder {
    type Item = BytesMut;
    type Error = ProtoError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, ProtoError> {
        let len = match self.body {
            Some(len) => len,
            None => {
                if src.len() < HEADER_BYTES {
                    return Ok(None);
                }
                let mut header = [0u8; HEADER_BYTES];
                header.copy_from_slice(&src[..HEADER_BYTES]);
                let len = u32::from_be_bytes(header) as usize;
                if len > self.max {
                    return Err(ProtoError::FrameTooLarge {
                        size: len,
                        max: self.max,
                    });
                }
                src.advance(HEADER_BYTES);
                self.body = Some(len);
                len
            }
        };
        if src.len() < len {
            src.reserve(len - src.len());
            return Ok(None);
        }
        self.body = None;
        Ok(Some(src.split_to(len)))
    }
}

/// Encodes a message as one frame body.
pub fn encode<T: Serialize>(msg: &T) -> Result<Bytes, ProtoError> {
    let mut body = BytesMut::new();
    encode_onto(&mut body, msg)?;
    Ok(body.freeze())
}

/// Appends a message's encoding to `buf` and returns its size; if it cannot be encoded or is
/// bigger than a frame, `buf` is left as it was and the error says why.
fn encode_onto<T: Serialize>(buf: &mut BytesMut, msg: &T) -> Result<usize, ProtoError> {
    let start = buf.len();
    let encoded = rmp_serde::encode::write(&mut (&mut *buf).writer(), msg);
    let size = buf.len() - start;
    let failed = match encoded {
        Err(e) => ProtoError::Decode(e.to_string()),
        Ok(()) if size > MAX_FRAME_BYTES => ProtoError::FrameTooLarge {
            size,
            max: MAX_FRAME_BYTES,
        },
        Ok(()) => return Ok(size),
    };
    buf.truncate(start);
    Err(failed)
}

/// Decodes one frame body.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtoError> {
    rmp_serde::from_slice(body).map_err(|e| ProtoError::Decode(e.to_string()))
}

/// The receiving half of a connection.
pub struct FrameReader<R> {
    inner: FramedRead<R, FrameDecoder>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(r: R) -> Self {
        let decoder = FrameDecoder {
            max: MAX_FRAME_BYTES,
            body: None,
        };
        FrameReader {
            inner: FramedRead::new(r, decoder),
        }
    }

    /// Changes the largest frame accepted from now on (a frame's announced length is reserved
    /// as soon as its header arrives, so a small limit bounds what a peer can make us
    /// allocate).
    pub fn set_max_frame(&mut self, bytes: usize) {
        self.inner.decoder_mut().max = bytes;
    }

    /// The next raw frame, or `None` at a clean end of stream.
    pub async fn next_frame(&mut self) -> Result<Option<BytesMut>, ProtoError> {
        self.inner.next().await.transpose()
    }

    /// The next message; a closed connection is an error.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<T, ProtoError> {
        match self.next_frame().await? {
            Some(b) => decode(&b),
            None => Err(ProtoError::Closed),
        }
    }

    /// The next message, or `None` at a clean end of stream.
    pub async fn try_recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ProtoError> {
        match self.next_frame().await? {
            Some(b) => decode(&b).map(Some),
            None => Ok(None),
        }
    }

    pub fn into_inner(self) -> R {
        self.inner.into_inner()
    }
}

/// The sending half of a connection. `feed` queues without flushing, so a burst of messages
/// leaves in one write.
pub struct FrameWriter<W> {
    inner: FramedWrite<W, LengthDelimitedCodec>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(w: W) -> Self {
        FrameWriter {
            inner: FramedWrite::new(w, codec()),
        }
    }

    /// Sends one message and flushes.
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), ProtoError> {
        self.encode_into_buffer(msg)?;
        SinkExt::<Bytes>::flush(&mut self.inner)
            .await
            .map_err(map_io)
    }

    /// Encodes a message as a frame straight into the connection's write buffer. The codec
    /// would take an encoded body and copy it in; writing here instead saves that copy and a
    /// fresh, growing allocation per message (page faults, for a worker's big updates), since
    /// the buffer keeps its capacity. The header is the codec's ([`HEADER_BYTES`]).
    fn encode_into_buffer<T: Serialize>(&mut self, msg: &T) -> Result<(), ProtoError> {
        let buf = self.inner.write_buffer_mut();
        let start = buf.len();
        buf.put_u32(0);
        match encode_onto(buf, msg) {
            Ok(size) => {
                buf[start..start + HEADER_BYTES].copy_from_slice(&(size as u32).to_be_bytes());
                Ok(())
            }
            Err(e) => {
                buf.truncate(start);
                // A refused giant would otherwise keep its capacity for the connection's life.
                if buf.is_empty() && buf.capacity() > MAX_FRAME_BYTES {
                    *buf = BytesMut::new();
                }
                Err(e)
            }
        }
    }

    /// Queues an encoded frame without flushing.
    pub async fn feed(&mut self, frame: Bytes) -> Result<(), ProtoError> {
        if frame.len() > MAX_FRAME_BYTES {
            return Err(ProtoError::FrameTooLarge {
                size: frame.len(),
                max: MAX_FRAME_BYTES,
            });
        }
        self.inner.feed(frame).await.map_err(map_io)
    }

    pub async fn flush(&mut self) -> Result<(), ProtoError> {
        SinkExt::<Bytes>::flush(&mut self.inner)
            .await
            .map_err(map_io)
    }

    pub fn into_inner(self) -> W {
        self.inner.into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::*;
    use crate::wire::{Own, Ref};
    use kestrel_core::{Failure, Finished, IndexRun, RunEnd};
    use proptest::prelude::*;
    use tokio::io::AsyncWriteExt;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Writes `msgs` into a small in-memory pipe (message `i` with `send` where `sent(i)`, else
    /// pre-encoded with `feed`) while reading them back from the other end.
    fn through_a_stream<T>(msgs: &[T], sent: impl Fn(usize) -> bool) -> Vec<T>
    where
        T: Serialize + DeserializeOwned,
    {
        rt().block_on(async {
            let (a, b) = tokio::io::duplex(1 << 12);
            let sender = async {
                let mut w = FrameWriter::new(a);
                for (i, m) in msgs.iter().enumerate() {
                    if sent(i) {
                        w.send(m).await.unwrap();
                    } else {
                        w.feed(encode(m).unwrap()).await.unwrap();
                    }
                }
                w.flush().await.unwrap();
            };
            let receiver = async {
                let mut r = FrameReader::new(b);
                let mut out = Vec::new();
                for _ in 0..msgs.len() {
                    out.push(r.recv::<T>().await.unwrap());
                }
                out
            };
            tokio::join!(sender, receiver).1
        })
    }

    fn finished_strategy() -> impl Strategy<Value = Finished> {
        (
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            prop_oneof![
                Just(RunEnd::Success),
                Just(RunEnd::Canceled),
                (
                    any::<Option<i32>>(),
                    any::<Option<i32>>(),
                    ".{0,40}",
                    ".{0,200}"
                )
                    .prop_map(|(exit_code, signal, reason, stderr_tail)| {
                        RunEnd::Failed(Box::new(Failure {
                            exit_code,
                            signal,
                            reason,
                            stderr_tail,
                            permanent: false,
                        }))
                    }),
            ],
        )
            .prop_map(|(job, index, started_us, finished_us, end)| Finished {
                job,
                index,
                started_us,
                finished_us,
                end,
            })
    }

    proptest! {
        #[test]
        fn worker_updates_round_trip(
            started in proptest::collection::vec((any::<u32>(), any::<u32>(), any::<u64>()), 0..50),
            finished in proptest::collection::vec(finished_strategy(), 0..50),
        ) {
            let msg = FromWorker::Update {
                started: started.into_iter().map(|(job, index, at_us)| Started { job, index, at_us }).collect(),
                finished,
                outputs: vec![],
                waited: vec![],
                cache: Default::default(),
            };
            let bytes = encode(&msg).unwrap();
            prop_assert_eq!(decode::<FromWorker>(&bytes).unwrap(), msg);
        }

        #[test]
        fn assignments_round_trip_through_a_stream(
            runs in proptest::collection::vec((any::<u32>(), any::<u32>(), 1u32..1000,
                proptest::collection::vec(proptest::collection::vec(".{0,12}", 1..4), 0..3),
                proptest::collection::vec(".{0,12}", 0..3)), 1..20)
        ) {
            let msgs: Vec<ToWorker> = runs.into_iter().map(|(job, first, count, argvs, lines)| ToWorker::Assign {
                tasks: vec![Assigned {
                    run: IndexRun { job, first, count },
                    argvs,
                    lines: lines.iter().map(String::as_str).collect(),
                    nodes: vec![],
                }],
            }).collect();
            prop_assert_eq!(through_a_stream(&msgs, |_| false), msgs);
        }

        /// `send` (encoding into the write buffer) and `feed` (pre-encoded frames) interleave
        /// on one stream and each message arrives whole.
        #[test]
        fn sent_and_fed_messages_arrive_in_order(
            updates in proptest::collection::vec(proptest::collection::vec(finished_strategy(), 0..40), 1..12)
        ) {
            let msgs: Vec<FromWorker> = updates.into_iter()
                .map(|finished| FromWorker::Update { started: vec![], finished, outputs: vec![], waited: vec![], cache: Default::default() })
                .collect();
            prop_assert_eq!(through_a_stream(&msgs, |i| i % 2 == 0), msgs);
        }

        /// Arbitrary bytes never panic the decoder: they decode or give an error.
        #[test]
        fn garbage_bodies_are_errors_not_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<FromWorker>(&body);
            let _ = decode::<Request>(&body);
            let _ = decode::<ToWorker>(&body);
        }
    }

    /// Run endings go on the wire with one-letter names; the full names that journals written
    /// by earlier versions hold still decode.
    #[test]
    fn run_endings_are_short_on_the_wire_and_old_names_still_decode() {
        #[derive(Serialize)]
        enum OldRunEnd {
            Success,
            Failed(#[serde(with = "crate::wire::FailureDef")] Failure),
            Canceled,
        }
        let failure = Failure {
            exit_code: Some(3),
            signal: None,
            reason: "exit code 3".into(),
            stderr_tail: "boom".into(),
            permanent: false,
        };
        let old = [
            (OldRunEnd::Success, RunEnd::Success),
            (OldRunEnd::Canceled, RunEnd::Canceled),
            (
                OldRunEnd::Failed(failure.clone()),
                RunEnd::Failed(Box::new(failure)),
            ),
        ];
        for (old, new) in old {
            let bytes = rmp_serde::to_vec(&old).unwrap();
            assert_eq!(decode::<Own<RunEnd>>(&bytes).unwrap().0, new);
        }
        assert_eq!(encode(&Ref(&RunEnd::Success)).unwrap(), &b"\xa1S"[..]);
    }

    /// An update from a worker that knows nothing of streamed output (no `outputs` field)
    /// still decodes; outputs travel as binary, about their own size.
    #[test]
    fn updates_without_outputs_decode_and_outputs_travel_as_bytes() {
        #[derive(Serialize)]
        enum OldFromWorker {
            Update {
                started: Vec<(u32, u32, u64)>,
                finished: Vec<(u32, u32, u64, i64, Ref<'static, RunEnd>)>,
            },
        }
        let old = OldFromWorker::Update {
            started: vec![],
            finished: vec![(1, 2, 100, 5, Ref(&RunEnd::Success))],
        };
        let decoded: FromWorker = decode(&rmp_serde::to_vec(&old).unwrap()).unwrap();
        let FromWorker::Update {
            finished, outputs, ..
        } = decoded
        else {
            panic!("not an update");
        };
        assert_eq!((finished[0].index, finished[0].finished_us), (2, 105));
        assert!(outputs.is_empty());

        let with = |data: Vec<u8>| FromWorker::Update {
            started: vec![],
            finished: vec![],
            outputs: vec![TaskOutput {
                job: 1,
                index: 2,
                stdout: Some(Kept {
                    total: data.len() as u64,
                    data,
                }),
                stderr: None,
                files: 0,
            }],
            waited: vec![],
            cache: Default::default(),
        };
        let small = encode(&with(vec![0xff; 10])).unwrap().len();
        let big = encode(&with(vec![0xff; 10_010])).unwrap().len();
        // A binary blob, not an array of integers (which would take 2 bytes per 0xff).
        assert!(big - small <= 10_000 + 3, "{}", big - small);
        let msg = with(b"hello\n".to_vec());
        assert_eq!(decode::<FromWorker>(&encode(&msg).unwrap()).unwrap(), msg);
    }

    /// A report of a short successful task sends its end time as an offset from its start.
    #[test]
    fn a_task_end_report_is_small() {
        let update = |n: u32| FromWorker::Update {
            started: vec![],
            finished: (0..n)
                .map(|i| Finished {
                    job: 1,
                    index: 100_000 + i,
                    started_us: 1_790_000_000_000_000,
                    finished_us: 1_790_000_000_000_003,
                    end: RunEnd::Success,
                })
                .collect(),
            outputs: vec![],
            waited: vec![(1, 12_345)],
            cache: Default::default(),
        };
        let per_task = encode(&update(116)).unwrap().len() - encode(&update(16)).unwrap().len();
        // array 1 + job 1 + index 5 + start 9 + offset 1 + a success as nil 1; the wait for a
        // slot travels as one sum per job and update, not per task
        assert_eq!(per_task, 100 * 18);
    }

    #[test]
    fn a_message_too_big_to_send_is_refused_and_the_next_one_still_arrives() {
        let huge = FromWorker::Update {
            started: vec![],
            finished: vec![Finished {
                job: 1,
                index: 0,
                started_us: 0,
                finished_us: 0,
                end: RunEnd::Failed(Box::new(Failure {
                    exit_code: Some(1),
                    signal: None,
                    reason: "x".repeat(MAX_FRAME_BYTES),
                    stderr_tail: String::new(),
                    permanent: false,
                })),
            }],
            outputs: vec![],
            waited: vec![],
            cache: Default::default(),
        };
        let small = FromWorker::Heartbeat;
        let (err, got) = rt().block_on(async {
            let (a, b) = tokio::io::duplex(1 << 16);
            let mut w = FrameWriter::new(a);
            let err = w.send(&huge).await.unwrap_err();
            w.send(&small).await.unwrap();
            let mut r = FrameReader::new(b);
            (err, r.recv::<FromWorker>().await.unwrap())
        });
        assert!(matches!(err, ProtoError::FrameTooLarge { .. }), "{err}");
        assert_eq!(got, small);
    }

    #[test]
    fn oversized_frames_are_refused_before_buffering() {
        let err = rt().block_on(async {
            let (mut a, b) = tokio::io::duplex(1024);
            let header = ((MAX_FRAME_BYTES + 1) as u32).to_be_bytes();
            a.write_all(&header).await.unwrap();
            let mut r = FrameReader::new(b);
            r.recv::<FromWorker>().await.unwrap_err()
        });
        assert!(matches!(err, ProtoError::FrameTooLarge { .. }), "{err}");
    }

    /// Issue 30: a header announcing 4 GiB was logged as "frame of 0 bytes".
    #[test]
    fn an_oversized_frame_is_reported_with_the_length_it_announced() {
        let err = rt().block_on(async {
            let (mut a, b) = tokio::io::duplex(1024);
            a.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
            let mut r = FrameReader::new(b);
            r.recv::<FromWorker>().await.unwrap_err()
        });
        assert!(
            matches!(err, ProtoError::FrameTooLarge { size, max } if size == u32::MAX as usize && max == MAX_FRAME_BYTES),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with(
                "frame of 4294967295 bytes is larger than the limit of 16777216 bytes"
            ),
            "{err}"
        );
    }

    #[test]
    fn frames_split_anywhere_arrive_whole_one_after_another() {
        let bodies: Vec<Vec<u8>> = vec![vec![], vec![7; 3], vec![9; 1000]];
        let mut wire = Vec::new();
        for b in &bodies {
            wire.extend_from_slice(&(b.len() as u32).to_be_bytes());
            wire.extend_from_slice(b);
        }
        for cut in 0..wire.len() {
            let mut d = FrameDecoder {
                max: MAX_FRAME_BYTES,
                body: None,
            };
            let mut buf = BytesMut::from(&wire[..cut]);
            let mut got = Vec::new();
            while let Some(f) = d.decode(&mut buf).unwrap() {
                got.push(f.to_vec());
            }
            buf.extend_from_slice(&wire[cut..]);
            while let Some(f) = d.decode(&mut buf).unwrap() {
                got.push(f.to_vec());
            }
            assert_eq!(got, bodies, "cut at {cut}");
        }
    }

    #[test]
    fn before_the_handshake_a_small_limit_applies() {
        let err = rt().block_on(async {
            let (mut a, b) = tokio::io::duplex(1024);
            let header = ((HANDSHAKE_MAX_FRAME_BYTES + 1) as u32).to_be_bytes();
            a.write_all(&header).await.unwrap();
            let mut r = FrameReader::new(b);
            r.set_max_frame(HANDSHAKE_MAX_FRAME_BYTES);
            r.recv::<FromWorker>().await.unwrap_err()
        });
        match err {
            ProtoError::FrameTooLarge { max, .. } => assert_eq!(max, HANDSHAKE_MAX_FRAME_BYTES),
            other => panic!("expected FrameTooLarge, got {other}"),
        }
    }

    #[test]
    fn a_truncated_stream_is_an_error() {
        let err = rt().block_on(async {
            let (mut a, b) = tokio::io::duplex(1024);
            a.write_all(&[0, 0, 0, 10, 1, 2]).await.unwrap();
            drop(a);
            let mut r = FrameReader::new(b);
            r.recv::<FromWorker>().await.unwrap_err()
        });
        assert!(matches!(err, ProtoError::Io(_)), "{err}");
    }
}
