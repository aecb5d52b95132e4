//! Connections: accept, optionally wrap in TLS, authenticate, then pump frames between the
//! socket and the engine.
//!
//! A bad peer (wrong secret, other protocol, malformed or oversized frame, plain TCP at a TLS
//! server) costs only its own connection: the failure is logged with the peer's address and
//! the server goes on. A flood of failures from one address is summarised, not logged line by
//! line (see [`Failures`]). Connections that have not proven the secret are bounded in all and
//! per address, and a full table makes room by closing the oldest of the address holding the
//! most ([`kestrel_proto::gate`]): idle connections from one address cannot lock out another.

use crate::engine::Inbound;
use crate::outbox::Outbox;
use crate::traffic::TrafficCounters;
use bytes::Bytes;
use kestrel_proto::auth::refuse_hello;
use kestrel_proto::gate::{Evicted, Gate, Limits, Pass};
use kestrel_proto::messages::{FromWorker, Request};
use kestrel_proto::tls::{split_plain, split_tls, TlsAcceptor};
use kestrel_proto::{
    accept_handshake, ConnRead, ConnWrite, FrameReader, FrameWriter, ProtoError, Role,
};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// A peer has this long to finish the handshake (`server start --handshake-timeout`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// And this part of it when half the handshake places or more are taken as it comes in: a real
/// worker or client finishes in milliseconds, an idle connection is made to give way sooner.
const CROWDED_HANDSHAKE_DIVISOR: u32 = 5;
/// Connections allowed in their handshake at once. Each holds buffers until it proves the
/// secret (or times out), so without a bound a flood of idle connections grows memory; 512 is
/// well above a few hundred workers reconnecting together, and those retry with backoff.
const MAX_HANDSHAKES: usize = 512;
/// Of those, from one address (an IPv6 /64): half, so one address never holds them all, and
/// still more than the workers of one machine or one NAT gateway connecting at once.
const MAX_HANDSHAKES_PER_SOURCE: usize = MAX_HANDSHAKES / 2;
/// How long one burst of writes to an authenticated peer (the frames queued for it, up to
/// [`BURST_BYTES`] and one more frame of at most 16 MiB, then a flush) may take before its
/// connection is dropped: a client or worker that stops reading would otherwise hold its queued
/// frames (and the memory they take) for ever. Generous, so a paused laptop or a link down to
/// about 0.6 MiB/s (the largest burst in 30 s) rides it out.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// A burst stops taking queued frames once this much is taken, so that its timeout bounds a
/// known amount of data. One timer per burst, not per frame: with hundreds of workers the
/// server writes many small bursts, and a timer for each frame showed in its CPU time.
const BURST_BYTES: usize = 1 << 20;
/// Failed handshakes are counted per address over this window.
const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Failures from one address logged one by one per window; the rest are only counted.
const FAILURE_BURST: u32 = 10;

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// Failed handshakes per peer address, so that a flood (a scanner, a misconfigured worker
/// farm) gives one summary line per address and window instead of one line per connection.
#[derive(Debug)]
pub struct Failures {
    window: Duration,
    burst: u32,
    by_ip: HashMap<IpAddr, Window>,
}

#[derive(Debug)]
struct Window {
    since: Instant,
    count: u32,
}

/// What to log for one failed handshake.
#[derive(Debug, PartialEq, Eq)]
pub struct Noted {
    /// Log this failure on its own line.
    pub log: bool,
    /// This failure is the last one logged individually in its window.
    pub burst_reached: bool,
    /// The address's previous window ended with this many failures, some not logged.
    pub ended: Option<u32>,
}

impl Failures {
    pub fn new(window: Duration, burst: u32) -> Failures {
        Failures {
            window,
            burst,
            by_ip: HashMap::new(),
        }
    }

    /// Records a failure from `ip` at `now`.
    pub fn record(&mut self, ip: IpAddr, now: Instant) -> Noted {
        let mut ended = None;
        let w = self.by_ip.entry(ip).or_insert(Window {
            since: now,
            count: 0,
        });
        if now.duration_since(w.since) >= self.window {
            if w.count > self.burst {
                ended = Some(w.count);
            }
            *w = Window {
                since: now,
                count: 0,
            };
        }
        w.count += 1;
        Noted {
            log: w.count <= self.burst,
            burst_reached: w.count == self.burst,
            ended,
        }
    }

    /// Forgets windows that ended by `now`; returns the addresses whose window had failures
    /// not logged one by one, with the window's total.
    pub fn expire(&mut self, now: Instant) -> Vec<(IpAddr, u32)> {
        let mut out = Vec::new();
        let (window, burst) = (self.window, self.burst);
        self.by_ip.retain(|ip, w| {
            if now.duration_since(w.since) < window {
                return true;
            }
            if w.count > burst {
                out.push((*ip, w.count));
            }
            false
        });
        out.sort();
        out
    }
}

type SharedFailures = Arc<Mutex<Failures>>;

fn summary(ip: IpAddr, count: u32) {
    tracing::warn!(%ip, "{count} failed handshakes from {ip} in the last minute");
}

/// Logs a failed handshake with the peer and the reason, within the per-address budget.
fn handshake_failed(failures: &SharedFailures, peer: SocketAddr, reason: &str) {
    let noted = match failures.lock() {
        Ok(mut f) => f.record(peer.ip(), Instant::now()),
        Err(_) => Noted {
            log: true,
            burst_reached: false,
            ended: None,
        },
    };
    if let Some(n) = noted.ended {
        summary(peer.ip(), n);
    }
    if noted.log {
        tracing::warn!(%peer, "handshake failed, connection closed: {reason}");
    }
    if noted.burst_reached {
        tracing::warn!(
            %peer,
            "{FAILURE_BURST} failed handshakes from {} within a minute; further ones are counted and summarised",
            peer.ip()
        );
    }
}

/// The time limits of a listener's connections.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// See [`WRITE_TIMEOUT`].
    pub write: Duration,
    /// See [`HANDSHAKE_TIMEOUT`].
    pub handshake: Duration,
}

/// What every connection of a listener shares.
struct Listening {
    secret: Arc<[u8]>,
    tls: Option<TlsAcceptor>,
    failures: SharedFailures,
    timeouts: Timeouts,
    traffic: Arc<TrafficCounters>,
}

/// Accepts connections until aborted. With `tls`, every connection is TLS before the handshake.
/// What the connections carry is counted in `traffic`.
pub async fn accept_loop(
    listener: TcpListener,
    secret: Vec<u8>,
    tls: Option<TlsAcceptor>,
    timeouts: Timeouts,
    traffic: Arc<TrafficCounters>,
    engine: mpsc::UnboundedSender<Inbound>,
) {
    let failures: SharedFailures =
        Arc::new(Mutex::new(Failures::new(FAILURE_WINDOW, FAILURE_BURST)));
    let listening = Arc::new(Listening {
        secret: secret.into(),
        tls,
        failures: failures.clone(),
        timeouts,
        traffic,
    });
    let gate = Gate::new(Limits {
        total: MAX_HANDSHAKES,
        unproven: MAX_HANDSHAKES,
        per_source: MAX_HANDSHAKES_PER_SOURCE,
    });
    let mut tick = tokio::time::interval(FAILURE_WINDOW / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let (pass, evicted) = match gate.admit(peer.ip()) {
                        Ok(admitted) => admitted,
                        Err(refused) => {
                            let reason = format!("{refused} (a worker retries by itself)");
                            handshake_failed(&failures, peer, &reason);
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(serve(
                        (pass, evicted),
                        stream,
                        peer,
                        Arc::clone(&listening),
                        engine.clone(),
                    ));
                }
                Err(e) => {
                    // Out of file descriptors and the like: say so, back off, keep serving.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = tick.tick() => {
                let ended = match failures.lock() {
                    Ok(mut f) => f.expire(Instant::now()),
                    Err(_) => Vec::new(),
                };
                for (ip, n) in ended {
                    summary(ip, n);
                }
            }
        }
    }
}

/// A reader for a peer that has not proven the secret: small frames only, so a peer cannot
/// make the server reserve a big buffer by announcing a big frame.
fn pre_auth_reader(r: ConnRead) -> FrameReader<ConnRead> {
    let mut reader = FrameReader::new(r);
    reader.set_max_frame(kestrel_proto::frame::HANDSHAKE_MAX_FRAME_BYTES);
    reader
}

/// TLS (when configured) and the handshake.
/// An authenticated connection: its halves, who connected, and the version it speaks.
type Opened = (FrameReader<ConnRead>, FrameWriter<ConnWrite>, Role, u32);

async fn open(
    stream: TcpStream,
    secret: &[u8],
    tls: Option<TlsAcceptor>,
) -> Result<Opened, ProtoError> {
    let (r, w) = match tls {
        None => split_plain(stream),
        Some(acceptor) => {
            let mut first = [0u8; 1];
            if stream.peek(&mut first).await? == 0 {
                return Err(ProtoError::Closed);
            }
            // Every TLS connection opens with a handshake record (0x16); a Kestrel frame of a
            // plain connector starts with the high byte of its length, 0.
            if first[0] != 0x16 {
                let (r, w) = split_plain(stream);
                let (mut reader, mut writer) = (pre_auth_reader(r), FrameWriter::new(w));
                // Read the hello first, so closing does not reset the connection under the reply.
                let _ = reader.next_frame().await;
                let reason = "this server requires TLS, but the access file used has no certificate (stale, or from before the server used TLS); use the server's current access file".to_string();
                let _ = refuse_hello(&mut writer, reason).await;
                let _ = writer.into_inner().shutdown().await;
                return Err(ProtoError::Tls(
                    "the peer did not start TLS (its access file has no certificate)".into(),
                ));
            }
            let tls = acceptor
                .accept(stream)
                .await
                .map_err(|e| ProtoError::Tls(e.to_string()))?;
            split_tls(tls)
        }
    };
    let mut reader = pre_auth_reader(r);
    let mut writer = FrameWriter::new(w);
    // Versions 6 and 7 encode every message alike; 8 adds fields that answers to an older
    // client leave out (see `Outbox::reply`).
    let hs = accept_handshake(&mut reader, &mut writer, secret).await?;
    reader.set_max_frame(kestrel_proto::MAX_FRAME_BYTES);
    Ok((reader, writer, hs.role, hs.version))
}

async fn serve(
    (pass, evicted): (Pass, Evicted),
    stream: TcpStream,
    peer: SocketAddr,
    listening: Arc<Listening>,
    engine: mpsc::UnboundedSender<Inbound>,
) {
    let failures = &listening.failures;
    let full = listening.timeouts.handshake;
    let deadline = if pass.crowded {
        full / CROWDED_HANDSHAKE_DIVISOR
    } else {
        full
    };
    let tls = listening.tls.clone();
    let hs = tokio::time::timeout(deadline, open(stream, &listening.secret, tls));
    let hs = tokio::select! {
        hs = hs => hs,
        () = evicted.wait() => {
            let reason = "closed to make room: the handshake places were full, and this address held the most of them";
            return handshake_failed(failures, peer, reason);
        }
    };
    // Returning drops the halves, which closes the connection.
    let (reader, writer, role, version) = match hs {
        Ok(Ok(opened)) => opened,
        // Connected and left without a word: a port probe (workers do this when reconnecting).
        Ok(Err(ProtoError::Closed)) => return,
        Ok(Err(e)) => return handshake_failed(failures, peer, &e.to_string()),
        Err(_) => {
            let reason = format!("not finished within {deadline:?}");
            return handshake_failed(failures, peer, &reason);
        }
    };
    // Proven: its place is another's now.
    drop(pass);
    let conn = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Bytes>();
    // Told when the peer stopped reading, so its reader ends too and the engine forgets it.
    let (stalled_tx, stalled) = oneshot::channel();
    let traffic = Arc::clone(&listening.traffic);
    let writer_task = tokio::spawn(write_loop(
        writer,
        out_rx,
        (peer, role),
        listening.timeouts.write,
        Arc::clone(&traffic),
        stalled_tx,
    ));
    let outbox = Outbox {
        conn,
        tx: out_tx,
        version,
    };
    match role {
        Role::Worker => serve_worker(reader, peer, outbox, stalled, &traffic, engine).await,
        Role::Client => serve_client(reader, peer, outbox, stalled, &traffic, engine).await,
    }
    // The engine drops its sender when it forgets the connection; the writer then drains
    // what is queued and ends.
    let _ = writer_task.await;
}

async fn serve_worker(
    mut reader: FrameReader<ConnRead>,
    peer: SocketAddr,
    outbox: Outbox,
    mut stalled: oneshot::Receiver<Stalled>,
    traffic: &TrafficCounters,
    engine: mpsc::UnboundedSender<Inbound>,
) {
    let registration = match reader.recv::<FromWorker>().await {
        Ok(FromWorker::Register(r)) => r,
        Ok(other) => {
            tracing::warn!(%peer, "worker sent {other:?} before registering; connection closed");
            return;
        }
        Err(e) => {
            tracing::warn!(%peer, "worker registration failed: {e}");
            return;
        }
    };
    let (id_tx, id_rx) = oneshot::channel();
    let conn = outbox.conn;
    if engine
        .send(Inbound::WorkerJoin {
            registration,
            peer,
            outbox,
            reply: id_tx,
        })
        .is_err()
    {
        return;
    }
    let Ok(worker) = id_rx.await else { return };
    let reason = loop {
        let next = tokio::select! {
            next = reader.next_frame() => next,
            Ok(Stalled) = &mut stalled => break stalled_reason(),
        };
        let next = next.and_then(|frame| match frame {
            Some(frame) => {
                traffic.came(Role::Worker, frame.len());
                kestrel_proto::decode::<FromWorker>(&frame).map(Some)
            }
            None => Ok(None),
        });
        match next {
            Ok(Some(msg)) => {
                if engine.send(Inbound::FromWorker { worker, msg }).is_err() {
                    return;
                }
            }
            Ok(None) => break "connection closed".to_string(),
            // The engine says what a worker's end means ("worker left", its tasks elsewhere).
            // A reset or a TLS stream cut short is a worker that exited or was killed, as a
            // clean close is: said the same way (the transport's words only in the log).
            Err(e) if peer_went_away(&e) => {
                tracing::debug!(%peer, worker, "worker connection ended: {e}");
                break "connection closed".to_string();
            }
            Err(e) => {
                tracing::warn!(%peer, worker, "closing worker connection: {e}");
                break e.to_string();
            }
        }
    };
    let _ = engine.send(Inbound::WorkerGone {
        worker,
        conn,
        reason,
    });
}

/// Whether a read error is only the peer's end: a process that exits (or is killed) with data
/// it had not read resets its connections instead of closing them, which is how a worker told
/// to leave by its allocation's end, a `kestrel run --alloc` that ends, or an interrupted client
/// goes. Nothing to warn about: only a peer that broke the protocol is.
fn peer_went_away(e: &ProtoError) -> bool {
    use std::io::ErrorKind;
    match e {
        ProtoError::Closed => true,
        ProtoError::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// The number of a request whose body cannot be read, to refuse it by that number.
#[derive(serde::Deserialize)]
struct RequestId {
    id: u64,
    #[serde(rename = "body")]
    _body: serde::de::IgnoredAny,
}

/// The refusal of a request the server cannot read (an array with step 0, a field of the
/// wrong type), for the client to print instead of a closed connection.
fn unreadable(e: &ProtoError) -> String {
    format!("the server cannot read this request ({e}); the client sent what `kestrel` and its client library never send: fix the client, or use one of the server's release")
}

async fn serve_client(
    mut reader: FrameReader<ConnRead>,
    peer: SocketAddr,
    outbox: Outbox,
    mut stalled: oneshot::Receiver<Stalled>,
    traffic: &TrafficCounters,
    engine: mpsc::UnboundedSender<Inbound>,
) {
    let conn = outbox.conn;
    // Refusals of unreadable requests go straight to the connection's queue (the engine
    // never sees those requests).
    let refusals = Outbox {
        conn,
        tx: outbox.tx.clone(),
        version: outbox.version,
    };
    if engine.send(Inbound::ClientJoin { outbox }).is_err() {
        return;
    }
    loop {
        let next = tokio::select! {
            next = reader.next_frame() => next,
            // Logged by the writer; this side only ends.
            Ok(Stalled) = &mut stalled => break,
        };
        let frame = match next {
            Ok(Some(frame)) => {
                traffic.came(Role::Client, frame.len());
                frame
            }
            Ok(None) => break,
            Err(e) if peer_went_away(&e) => {
                tracing::debug!(%peer, "client connection closed: {e}");
                break;
            }
            Err(e) => {
                tracing::warn!(%peer, "closing client connection: {e}");
                break;
            }
        };
        match kestrel_proto::decode::<Request>(&frame) {
            Ok(request) => {
                let request = Box::new(request);
                if engine.send(Inbound::Client { conn, request }).is_err() {
                    return;
                }
            }
            // The frame was whole, so the next one is read as usual.
            Err(e) => match kestrel_proto::decode::<RequestId>(&frame) {
                Ok(RequestId { id, .. }) => {
                    tracing::warn!(%peer, "refused a request it cannot read: {e}");
                    refusals.reply(id, Err(unreadable(&e).into()));
                }
                Err(_) => {
                    tracing::warn!(%peer, "closing client connection: {e}");
                    break;
                }
            },
        }
    }
    let _ = engine.send(Inbound::ClientGone { conn });
}

/// The writer gave up on a peer that stopped reading (see [`WRITE_TIMEOUT`]).
struct Stalled;

fn stalled_reason() -> String {
    "it stopped reading what the server sends".to_string()
}

/// Writes queued frames, flushing once per burst so a batch of messages leaves in one write.
/// A burst not written within `timeout` ends the connection: the peer is logged,
/// and `stalled` tells its reader to end too (dropping both halves closes the socket).
async fn write_loop(
    mut writer: FrameWriter<ConnWrite>,
    mut rx: mpsc::UnboundedReceiver<Bytes>,
    (peer, role): (SocketAddr, Role),
    timeout: Duration,
    traffic: Arc<TrafficCounters>,
    stalled: oneshot::Sender<Stalled>,
) {
    let result = async {
        while let Some(frame) = rx.recv().await {
            let (bytes, frames) = within(timeout, write_burst(&mut writer, &mut rx, frame)).await?;
            traffic.went(role, bytes, frames);
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            let _ = writer.into_inner().shutdown().await;
        }
        Err(WriteEnd::Stalled) => {
            tracing::warn!(
                %peer,
                "closing the connection: {} (a burst of what it was sent was not read in {timeout:?})",
                stalled_reason()
            );
            let _ = stalled.send(Stalled);
        }
        // The peer went away, which its reader notices.
        Err(WriteEnd::Failed) => {}
    }
}

/// Writes `first` and what else is queued, up to [`BURST_BYTES`], then flushes: the bytes
/// of the frames' bodies written, and how many frames.
async fn write_burst(
    writer: &mut FrameWriter<ConnWrite>,
    rx: &mut mpsc::UnboundedReceiver<Bytes>,
    first: Bytes,
) -> Result<(usize, usize), ProtoError> {
    let mut taken = first.len();
    let mut frames = 1;
    writer.feed(first).await?;
    while taken < BURST_BYTES {
        let Ok(more) = rx.try_recv() else { break };
        taken += more.len();
        frames += 1;
        writer.feed(more).await?;
    }
    writer.flush().await?;
    Ok((taken, frames))
}

/// Why a write loop ended early.
enum WriteEnd {
    /// A write made no progress within the timeout.
    Stalled,
    /// A write failed.
    Failed,
}

/// `write`, within `timeout`.
async fn within<T>(
    timeout: Duration,
    write: impl std::future::Future<Output = Result<T, ProtoError>>,
) -> Result<T, WriteEnd> {
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(_)) => Err(WriteEnd::Failed),
        Err(_) => Err(WriteEnd::Stalled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 29: "Connection reset by peer" was warned about after `kestrel run --alloc` (its
    /// local workers, told to go, reset their connections); only a broken protocol is.
    #[test]
    fn a_peer_that_resets_its_connection_went_away_and_one_that_breaks_the_protocol_did_not() {
        use std::io::{Error, ErrorKind};
        let io = |k: ErrorKind| ProtoError::Io(Error::from(k));
        assert!(peer_went_away(&io(ErrorKind::ConnectionReset)));
        assert!(peer_went_away(&io(ErrorKind::BrokenPipe)));
        assert!(peer_went_away(&io(ErrorKind::UnexpectedEof)));
        assert!(peer_went_away(&ProtoError::Closed));
        assert!(!peer_went_away(&io(ErrorKind::PermissionDenied)));
        assert!(!peer_went_away(&ProtoError::Decode("not msgpack".into())));
        assert!(!peer_went_away(&ProtoError::FrameTooLarge {
            size: 2,
            max: 1
        }));
    }

    #[test]
    fn a_flood_is_logged_up_to_the_burst_then_summarised_per_window() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut f = Failures::new(60 * s, 3);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let logged: Vec<bool> = (0..5).map(|i| f.record(a, t0 + i * s).log).collect();
        assert_eq!(logged, [true, true, true, false, false]);
        assert!(
            f.record(b, t0 + 10 * s).log,
            "another address has its own budget"
        );
        assert_eq!(f.expire(t0 + 59 * s), vec![], "the window has not ended");
        assert_eq!(f.expire(t0 + 60 * s), vec![(a, 5)]);
        // b's window (one failure, logged) ends silently.
        assert_eq!(f.expire(t0 + 70 * s), vec![]);
        // A new window logs one by one again.
        assert!(f.record(a, t0 + 100 * s).log);
    }

    #[test]
    fn a_window_ending_without_a_tick_is_summarised_on_the_next_failure() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut f = Failures::new(60 * s, 2);
        let a: IpAddr = "::1".parse().unwrap();
        let burst: Vec<bool> = (0..4).map(|_| f.record(a, t0).burst_reached).collect();
        assert_eq!(burst, [false, true, false, false]);
        let next = f.record(a, t0 + 61 * s);
        assert_eq!(
            next,
            Noted {
                log: true,
                burst_reached: false,
                ended: Some(4)
            }
        );
    }
}
