//! Peer transfers: each worker serves its cache over HTTP to the other workers of its cluster,
//! and fetches a missing input from the peers the server names as holding it before it falls
//! back to the store.
//!
//! - Serving ([`serve`]): `GET /files/KEY/NAME` answers the cached file with its size and its
//!   BLAKE3 digest (`x-kestrel-blake3`), to a request signed with the cluster secret (below);
//!   at most [`MAX_SERVING`] transfers at once (TaskVine's bound), a request waiting longer than
//!   [`PERMIT_WAIT`] for one is answered 503 and its asker goes elsewhere. The open file is
//!   streamed, so a file evicted meanwhile is still served whole.
//! - Bounds ([`PeerLimits`]), so that no one, without the secret or with it, can make the
//!   worker's tasks fail or its peers wait: connections are counted in all and, until one
//!   has made a signed request, by source address ([`kestrel_proto::gate`]: a full table
//!   closes the oldest unproven connection of the address holding the most); a connection
//!   whose descriptor is in the last quarter of the process's open-file limit is closed at
//!   once (that quarter is the tasks'); a request's header must arrive within
//!   [`HEADER_TIMEOUT`] (which also ends an idle connection), and an answer whose writing
//!   makes no progress for [`WRITE_STALL`] (an asker that stopped reading) is cut off,
//!   giving its transfer's place back.
//! - Fetching ([`Peers::fetch`]): runs on the executor thread staging a task's inputs; the
//!   answer is written to a partial file and checked against the announced size and digest.
//!   A peer that cannot be reached is skipped for [`UNREACHABLE_FOR`] (a worker that is
//!   alive but cut off from its peers costs each asker one connect timeout, not a hang); a
//!   peer that sends a file failing the check is reported to the server
//!   (`CacheChange::unheld`) so that its index stops naming it. One that has no such file is
//!   not: it reports its own evictions (a file gone from its disk too, when asked for), and
//!   an asker's report could arrive after the peer had the file again, and drop a holder.
//!
//! Authentication: a request carries `x-kestrel-peer: EXPIRES.MAC`, an HMAC-SHA256 keyed by
//! the server's secret (which every worker read from the access file) over the path and an
//! expiry [`SIGNED_FOR_S`] ahead; the serving peer rejects a wrong one, or one whose expiry
//! passed more than [`CLOCK_SLACK_S`] ago or lies more than a minute ahead (401), before it
//! looks at the cache. So a captured signature is good for a minute at most, by the clock of
//! the worker that made it, and the clocks of a cluster's nodes may differ by up to
//! [`CLOCK_SLACK_S`]. Written here rather than taken from a library because no maintained
//! crate signs plain HTTP requests with a shared key in one header; the MAC itself is `hmac`'s.

use crate::cache::{is_plain_name, Digest};
use crate::files::{lock, SharedFiles};
use crate::store::{write_file_digesting, CopyError, WriteFailed};
use axum::body::Body;
use axum::extract::{Extension, Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hmac::{Hmac, Mac};
use kestrel_proto::gate::{self, Gate, Pass};
use kestrel_proto::messages::{FileSources, Unheld};
use rustc_hash::FxHashMap;
use sha2::Sha256;
use std::fs;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;

/// Transfers a worker serves at once (TaskVine's default).
pub const MAX_SERVING: usize = 10;
/// How long a request waits for one of those before it is told the peer is busy.
pub const PERMIT_WAIT: Duration = Duration::from_secs(5);
/// How long a peer that could not be reached is skipped as a source.
pub const UNREACHABLE_FOR: Duration = Duration::from_secs(60);
/// The header carrying a request's signature, and the one carrying a file's digest.
pub(crate) const AUTH_HEADER: &str = "x-kestrel-peer";
pub(crate) const DIGEST_HEADER: &str = "x-kestrel-blake3";
/// How far ahead of its maker's clock a signature expires, and how far the clocks of a
/// cluster's nodes may differ: a signature is taken up to `CLOCK_SLACK_S` after its expiry, so
/// it is good for `SIGNED_FOR_S + CLOCK_SLACK_S` (a minute, as docs/security.md says) at most.
pub const SIGNED_FOR_S: u64 = 30;
pub const CLOCK_SLACK_S: u64 = 30;
/// How long a connection has to send a request's header, from its start or the end of the
/// answer before: a slow header or an idle connection is closed then. Above the fetchers'
/// pool idle timeout, so that a fetcher never reuses a connection this side is closing.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the writing of an answer may make no progress before the connection is closed.
pub const WRITE_STALL: Duration = Duration::from_secs(10);
/// The most a request's header may take (a path and a few headers).
const MAX_REQUEST_BYTES: usize = 16 << 10;
/// Refused connections are told at most this often.
const TELL_REFUSALS_EVERY: Duration = Duration::from_secs(60);
/// Why a peer that answered 404 did not serve a file.
const NO_SUCH_FILE: &str = "it has no such file";
/// At most this many files' sources are kept: they are hints, dropped when there are more.
const MAX_SOURCES: usize = 100_000;

/// What a worker knows of its peers: the key its requests are signed with, where it serves
/// its own cache, which peers hold what, and which could not be reached.
#[derive(Debug, Default)]
pub struct Peers {
    key: RwLock<Vec<u8>>,
    url: OnceLock<String>,
    sources: Mutex<FxHashMap<String, Vec<String>>>,
    unreachable: Mutex<FxHashMap<String, Instant>>,
    unheld: Mutex<Vec<Unheld>>,
}

/// How a fetch from one peer ended.
#[derive(Debug)]
pub enum Fetched {
    /// The whole file, checked: its size and digest.
    Got(u64, Digest),
    /// The peer does not have it (any more), or sent something that failed the check.
    Unheld(String),
    /// The peer could not be reached, or stalled.
    Unreachable(String),
    /// The peer answered but could not serve now (busy, refused): try another.
    Declined(String),
    /// This worker could not write the file (its disk is full, say): no peer is to blame.
    Local(WriteFailed),
}

impl Peers {
    /// Sets the secret requests are signed with (each time the worker connects: a restarted
    /// server has a new one).
    pub fn set_key(&self, key: Vec<u8>) {
        *self.key.write().unwrap_or_else(PoisonError::into_inner) = key;
    }

    /// Where this worker serves its cache, once it does.
    pub fn url(&self) -> Option<&str> {
        self.url.get().map(String::as_str)
    }

    /// Notes where the inputs of the tasks assigned next are held.
    pub fn note_sources(&self, files: Vec<FileSources>) {
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        if sources.len() + files.len() > MAX_SOURCES {
            sources.clear();
        }
        for f in files {
            sources.insert(f.file, f.peers);
        }
    }

    /// The peers to try for `file`, in the server's order, without this worker and those
    /// found unreachable lately.
    pub fn sources_of(&self, file: &str) -> Vec<String> {
        let named = self
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(file)
            .cloned()
            .unwrap_or_default();
        let mut unreachable = self
            .unreachable
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        unreachable.retain(|_, until| *until > now);
        named
            .into_iter()
            .filter(|p| Some(p.as_str()) != self.url() && !unreachable.contains_key(p))
            .collect()
    }

    /// `file` is here now: its sources are not needed any more.
    pub fn forget_sources(&self, file: &str) {
        self.sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(file);
    }

    /// Files peers did not serve whole since the last call, for the next update.
    pub fn take_unheld(&self) -> Vec<Unheld> {
        std::mem::take(&mut *self.unheld.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Fetches `file` from `peer` into `to` (a fresh path), checking it. Notes a peer that
    /// cannot be reached or does not hold the file whole.
    pub fn fetch(&self, peer: &str, file: &str, to: &Path) -> Fetched {
        let fetched = self.try_fetch(peer, file, to);
        match &fetched {
            Fetched::Got(..) => {}
            // Evicted since the server named it: routine when caches are tight, and the peer's
            // own report of it corrects the index.
            Fetched::Unheld(why) if why == NO_SUCH_FILE => {
                tracing::debug!(peer, file, "peer did not serve the file: {why}");
            }
            Fetched::Unheld(why) => {
                tracing::warn!(peer, file, "peer did not serve the file whole: {why}");
                self.unheld
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Unheld {
                        file: file.to_string(),
                        peer: peer.to_string(),
                    });
            }
            Fetched::Unreachable(why) => {
                tracing::warn!(
                    peer,
                    "peer unreachable ({why}); skipped as a source for {}s",
                    UNREACHABLE_FOR.as_secs()
                );
                self.unreachable
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(peer.to_string(), Instant::now() + UNREACHABLE_FOR);
            }
            Fetched::Declined(why) => tracing::debug!(peer, file, "peer declined: {why}"),
            Fetched::Local(_) => {}
        }
        if !matches!(fetched, Fetched::Got(..)) {
            let _ = fs::remove_file(to);
        }
        fetched
    }

    fn try_fetch(&self, peer: &str, file: &str, to: &Path) -> Fetched {
        let url = match file_url(peer, file) {
            Ok(u) => u,
            Err(e) => return Fetched::Declined(e),
        };
        let auth = sign_now(&self.key(), url.path(), now_s());
        let sent = http().get(url).header(AUTH_HEADER, auth).send();
        let mut resp = match sent {
            Ok(r) => r,
            Err(e) => return Fetched::Unreachable(e.to_string()),
        };
        match resp.status() {
            s if s.is_success() => {}
            StatusCode::NOT_FOUND => return Fetched::Unheld(NO_SUCH_FILE.into()),
            s => return Fetched::Declined(format!("it answered {s}")),
        }
        let announced = resp.content_length();
        let digest = resp
            .headers()
            .get(DIGEST_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| hex::decode(v).ok())
            .and_then(|v| Digest::try_from(v).ok());
        let Some(digest) = digest else {
            return Fetched::Declined(format!("no valid {DIGEST_HEADER} header"));
        };
        let (size, got) = match write_file_digesting(&mut resp, to, announced) {
            Ok(copied) => copied,
            // Stalled or cut off mid-file: what came is not the file.
            Err(e @ CopyError::Read(_)) => return Fetched::Unreachable(e.to_string()),
            Err(CopyError::Local(w)) => return Fetched::Local(w),
        };
        if announced.is_some_and(|a| a != size) {
            return Fetched::Unheld(format!(
                "truncated: {size} of {} bytes",
                announced.unwrap_or_default()
            ));
        }
        if got != digest {
            return Fetched::Unheld("its bytes do not match its digest (corrupt)".into());
        }
        Fetched::Got(size, digest)
    }

    #[cfg(test)]
    fn sources_of_peer_skipped(&self, peer: &str) -> bool {
        self.unreachable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(peer)
    }

    pub(crate) fn key(&self) -> Vec<u8> {
        self.key
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The URL of `file` on `peer`, each part of the name percent-encoded.
pub(crate) fn file_url(peer: &str, file: &str) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(peer).map_err(|e| format!("bad peer URL {peer}: {e}"))?;
    url.path_segments_mut()
        .map_err(|()| format!("peer URL {peer} cannot take a path"))?
        .pop_if_empty()
        .push("files")
        .extend(file.split('/'));
    Ok(url)
}

/// One client for fetches from peers: short connect timeout (a cut-off peer is found fast),
/// and a bound on each read (a peer that stalls mid-file is given up on). An idle connection
/// is dropped well before the serving peer would close it ([`HEADER_TIMEOUT`]).
fn http() -> &'static reqwest::blocking::Client {
    static CLIENT: OnceLock<reqwest::blocking::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(PERMIT_WAIT + Duration::from_secs(10))
            .pool_idle_timeout(HEADER_TIMEOUT / 2)
            .no_proxy()
            .build()
            .unwrap_or_else(|_| reqwest::blocking::Client::new())
    })
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn mac(key: &[u8], path: &str, expires: u64) -> Hmac<Sha256> {
    mac_of(key, &format!("kestrel-peer-v1 {expires} {path}"))
}

fn mac_of(key: &[u8], text: &str) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(text.as_bytes());
    mac
}

/// What an upload's signature covers: its method, expiry and path, and the size and digest
/// of its body, so that a signature seen on the wire puts those bytes there and nothing else.
fn upload_text(expires: u64, path: &str, size: u64, digest: &str) -> String {
    format!("kestrel-peer-v1 PUT {expires} {path} {size} {digest}")
}

/// The signature a fetcher sends at `now` (seconds since the epoch) for `path`.
pub fn sign_now(key: &[u8], path: &str, now: u64) -> String {
    sign(key, path, now + SIGNED_FOR_S)
}

/// The signature of a request for `path`, good until `expires` (seconds since the epoch).
pub fn sign(key: &[u8], path: &str, expires: u64) -> String {
    let tag = mac(key, path, expires).finalize().into_bytes();
    format!("{expires}.{}", hex::encode(tag))
}

/// The signature of an upload to `path` of `size` bytes whose BLAKE3 digest is `digest`
/// (hex), made at `now`.
pub fn sign_upload(key: &[u8], path: &str, size: u64, digest: &str, now: u64) -> String {
    let expires = now + SIGNED_FOR_S;
    let tag = mac_of(key, &upload_text(expires, path, size, digest))
        .finalize()
        .into_bytes();
    format!("{expires}.{}", hex::encode(tag))
}

/// Whether `signature` signs `path` with `key` and has not expired at `now` (seconds).
pub fn verify(key: &[u8], path: &str, signature: &str, now: u64) -> bool {
    verify_with(key, signature, now, |expires| mac(key, path, expires))
}

/// Whether `signature` signs an upload of `size` bytes of digest `digest` to `path`.
pub fn verify_upload(
    key: &[u8],
    path: &str,
    size: u64,
    digest: &str,
    signature: &str,
    now: u64,
) -> bool {
    verify_with(key, signature, now, |expires| {
        mac_of(key, &upload_text(expires, path, size, digest))
    })
}

fn verify_with(
    key: &[u8],
    signature: &str,
    now: u64,
    mac: impl FnOnce(u64) -> Hmac<Sha256>,
) -> bool {
    let Some((expires, tag)) = signature.split_once('.') else {
        return false;
    };
    let (Ok(expires), Ok(tag)) = (expires.parse::<u64>(), hex::decode(tag)) else {
        return false;
    };
    // Either clock may be off by up to CLOCK_SLACK_S: late or early, within that.
    let expired = expires.saturating_add(CLOCK_SLACK_S) < now;
    let too_far = expires > now + SIGNED_FOR_S + CLOCK_SLACK_S;
    if expired || too_far || key.is_empty() {
        return false;
    }
    // Constant time: `verify_slice` compares without an early exit.
    mac(expires).verify_slice(&tag).is_ok()
}

/// What every request to the peer port shares.
#[derive(Clone)]
pub(crate) struct Serving {
    pub(crate) files: SharedFiles,
    /// Transfers at once, served and received ([`MAX_SERVING`]).
    pub(crate) permits: Arc<Semaphore>,
}

/// The bounds of a worker's peer port (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLimits {
    /// Connections in all, unproven (no signed request yet), and unproven from one address.
    pub connections: gate::Limits,
    /// A connection whose descriptor is this or above is closed at once: the process has at
    /// least that many files open, and the rest are its tasks'.
    pub fd_ceiling: u64,
    /// See [`HEADER_TIMEOUT`].
    pub header_timeout: Duration,
    /// See [`WRITE_STALL`].
    pub write_stall: Duration,
}

impl PeerLimits {
    /// For a process that may have `open_files` files open: a quarter of them for peer
    /// connections (at most 4,096), half of those unproven, an eighth of those (at least 2)
    /// from one address; the last quarter of the descriptors for the tasks.
    pub fn for_open_files(open_files: u64) -> PeerLimits {
        let total = (open_files / 4).clamp(16, 4096) as usize;
        let unproven = total / 2;
        PeerLimits {
            connections: gate::Limits {
                total,
                unproven,
                per_source: (unproven / 8).max(2),
            },
            fd_ceiling: open_files - open_files / 4,
            header_timeout: HEADER_TIMEOUT,
            write_stall: WRITE_STALL,
        }
    }
}

/// Serves `files`' cache to peers on `listener` until the task is aborted. Records the URL
/// it serves at (`http://ADDR/`) at once, before the first poll, so that a registration sent
/// right after names it: the listener's address, or `advertise` with its port when it listens
/// on every interface (`0.0.0.0`, which no peer can dial). Bounded by [`PeerLimits`] for the
/// process's open-file limit.
pub fn serve(
    files: SharedFiles,
    listener: tokio::net::TcpListener,
    advertise: Option<std::net::IpAddr>,
) -> std::io::Result<impl Future<Output = std::io::Result<()>>> {
    let limits = PeerLimits::for_open_files(kestrel_proto::fds::open_file_limit(1024));
    serve_within(files, listener, advertise, limits)
}

/// [`serve`] within `limits`.
pub fn serve_within(
    files: SharedFiles,
    listener: tokio::net::TcpListener,
    advertise: Option<std::net::IpAddr>,
    limits: PeerLimits,
) -> std::io::Result<impl Future<Output = std::io::Result<()>>> {
    let mut addr = listener.local_addr()?;
    if addr.ip().is_unspecified() {
        let ip = advertise.ok_or_else(|| {
            std::io::Error::other(format!(
                "it listens on {addr}, and the address peers reach it at is unknown"
            ))
        })?;
        addr.set_ip(ip);
    }
    let _ = files.peers.url.set(url_of(addr));
    Ok(serve_on(files, listener, limits))
}

/// The connection a request came on, so that a signed request proves it.
#[derive(Clone)]
pub(crate) struct OnConnection(pub(crate) Arc<Pass>);

async fn serve_on(
    files: SharedFiles,
    listener: tokio::net::TcpListener,
    limits: PeerLimits,
) -> std::io::Result<()> {
    use hyper::service::Service as _;
    use std::os::fd::AsRawFd;
    let state = Serving {
        files,
        permits: Arc::new(Semaphore::new(MAX_SERVING)),
    };
    let app = axum::Router::new()
        .route(
            "/files/{*name}",
            axum::routing::get(serve_file).put(crate::values::receive),
        )
        .fallback(|| async { refuse_unproven(StatusCode::NOT_FOUND, "no such path") })
        .with_state(state);
    let app = hyper_util::service::TowerToHyperService::new(app);
    let gate = Gate::new(limits.connections);
    let mut refusals = Refusals::default();
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: the connection waits in the backlog meanwhile.
                refusals.tell(None, &format!("cannot accept a connection: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let fd = tcp.as_raw_fd() as u64;
        if fd >= limits.fd_ceiling {
            let why = format!(
                "this worker has at least {fd} files open, and keeps those above {} for its tasks; closed at once",
                limits.fd_ceiling
            );
            refusals.tell(Some(peer), &why);
            continue;
        }
        let (pass, evicted) = match gate.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                refusals.tell(Some(peer), &refused.to_string());
                continue;
            }
        };
        // Without TCP_NODELAY a small file's body, written after its header, waits for the
        // asker's delayed ACK (~40 ms on Linux): most intermediates between tasks are small.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY on a peer connection: {e}");
        }
        let on = OnConnection(Arc::new(pass));
        let app = app.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(on.clone());
                    app.call(req)
                },
            );
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(MAX_REQUEST_BYTES);
            let io = hyper_util::rt::TokioIo::new(Stalls::new(tcp, limits.write_stall));
            let conn = http.serve_connection(io, service);
            tokio::select! {
                ended = conn => {
                    if let Err(e) = ended {
                        tracing::debug!(%peer, "peer connection ended: {e}");
                    }
                }
                () = evicted.wait() => {
                    tracing::debug!(%peer, "peer connection closed to make room for another address's");
                }
            }
        });
    }
}

/// Connections the peer port refused, told at most once a [`TELL_REFUSALS_EVERY`] (a flood
/// must not flood the log too).
#[derive(Default)]
struct Refusals {
    told: Option<Instant>,
    untold: u64,
}

impl Refusals {
    fn tell(&mut self, peer: Option<SocketAddr>, why: &str) {
        let now = Instant::now();
        if self
            .told
            .is_some_and(|t| now.duration_since(t) < TELL_REFUSALS_EVERY)
        {
            self.untold += 1;
            tracing::debug!(?peer, "peer connection refused: {why}");
            return;
        }
        let from = peer.map_or(String::new(), |p| format!(" from {p}"));
        let more = match self.untold {
            0 => String::new(),
            n => format!(" ({n} more refused since the last such message)"),
        };
        tracing::warn!(
            "refused a connection to the peer port{from}: {why}{more}; further refusals are told once a minute"
        );
        self.told = Some(now);
        self.untold = 0;
    }
}

/// A connection whose writes fail once one has made no progress for `limit`: an asker that
/// stopped reading would otherwise hold its transfer's place (and a file) for ever.
struct Stalls<T> {
    io: T,
    limit: Duration,
    /// Running while a write waits.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Stalls<T> {
    fn new(io: T, limit: Duration) -> Stalls<T> {
        Stalls {
            io,
            limit,
            timer: None,
        }
    }

    /// `r`, the poll of a write: a wait starts (or goes on with) the timer, anything else stops it.
    fn watch<R>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if r.is_ready() {
            self.timer = None;
            return r;
        }
        let limit = self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the asker read nothing for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Stalls<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Stalls<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, r)
    }
}

/// `http://ADDR/`, an IPv6 address in brackets.
pub fn url_of(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

pub(crate) fn refuse(status: StatusCode, why: &str) -> Response {
    (status, format!("{why}\n")).into_response()
}

/// [`refuse`], closing the connection after: a request that proves nothing must not keep an
/// unproven connection alive (each new header would restart its header timeout).
pub(crate) fn refuse_unproven(status: StatusCode, why: &str) -> Response {
    let mut r = refuse(status, why);
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

async fn serve_file(
    State(s): State<Serving>,
    UrlPath(name): UrlPath<String>,
    Extension(on): Extension<OnConnection>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let signed = headers.get(AUTH_HEADER).and_then(|v| v.to_str().ok());
    let key = s.files.peers.key();
    if !signed.is_some_and(|sig| verify(&key, uri.path(), sig, now_s())) {
        return refuse_unproven(
            StatusCode::UNAUTHORIZED,
            "not signed with this cluster's secret (or the signature expired)",
        );
    }
    // A peer of the cluster: its connection is no longer one a flood could be made of.
    on.0.prove();
    if !is_plain_name(&name) {
        return refuse(StatusCode::BAD_REQUEST, "not a plain file name");
    }
    let permit = match tokio::time::timeout(PERMIT_WAIT, s.permits.clone().acquire_owned()).await {
        Ok(Ok(p)) => p,
        _ => return refuse(StatusCode::SERVICE_UNAVAILABLE, "busy serving other peers"),
    };
    let files = s.files.clone();
    let opened = tokio::task::spawn_blocking(move || {
        let (file, size, digest) = lock(&files).open_for_peer(&name)?;
        // A file found in the cache at start has no digest yet: taken once, from the open file.
        let digest = match digest {
            Some(d) => d,
            None => {
                let mut hasher = blake3::Hasher::new();
                hasher.update_reader(&file).ok()?;
                let d = *hasher.finalize().as_bytes();
                lock(&files).set_digest(&name, d);
                d
            }
        };
        Some((file, size, digest))
    })
    .await;
    let Ok(Some((file, size, digest))) = opened else {
        return refuse(StatusCode::NOT_FOUND, "no such file in this cache");
    };
    let mut file = tokio::fs::File::from_std(file);
    use tokio::io::AsyncSeekExt;
    if file.seek(std::io::SeekFrom::Start(0)).await.is_err() {
        return refuse(StatusCode::INTERNAL_SERVER_ERROR, "cannot read the file");
    }
    // The permit is held until the last byte has gone.
    let body = tokio_util::io::ReaderStream::with_capacity(file, 256 << 10).map(move |chunk| {
        let _held = &permit;
        chunk
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_LENGTH, size)
        .header(DIGEST_HEADER, hex::encode(digest))
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| refuse(StatusCode::INTERNAL_SERVER_ERROR, "cannot answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_hold_for_their_path_key_and_time_only() {
        let key = b"cluster secret".to_vec();
        let sig = sign(&key, "/files/k/raw/1", 1_000);
        assert!(verify(&key, "/files/k/raw/1", &sig, 990));
        assert!(!verify(&key, "/files/k/raw/2", &sig, 990), "another path");
        assert!(
            !verify(b"other", "/files/k/raw/1", &sig, 990),
            "another key"
        );
        assert!(
            verify(&key, "/files/k/raw/1", &sig, 1_001),
            "a clock a little ahead"
        );
        assert!(
            !verify(&key, "/files/k/raw/1", &sig, 1_000 + CLOCK_SLACK_S + 1),
            "expired"
        );
        assert!(!verify(&key, "/files/k/raw/1", &sig, 1), "too far ahead");
        assert!(!verify(&key, "/files/k/raw/1", "garbage", 990));
        assert!(!verify(
            &[],
            "/files/k/raw/1",
            &sign(&[], "/files/k/raw/1", 1_000),
            990
        ));
    }

    #[test]
    fn peer_urls_encode_each_part_of_the_name() {
        let u = file_url("http://10.0.0.3:7100/", "ab12/raw/a b#1.fits").unwrap();
        assert_eq!(
            u.as_str(),
            "http://10.0.0.3:7100/files/ab12/raw/a%20b%231.fits"
        );
    }

    use crate::cache::{Cache, EvictionPolicy};
    use crate::files::WorkerFiles;
    use std::io::{BufRead, BufReader, Write};

    /// A worker's files holding `k/raw/a` (4096 bytes), served on loopback by a runtime of
    /// its own; the files, the URL, and the runtime (serving while it lives).
    fn serving(
        key: &[u8],
    ) -> (
        tempfile::TempDir,
        SharedFiles,
        String,
        tokio::runtime::Runtime,
    ) {
        serving_within(key, PeerLimits::for_open_files(1024), 4096)
    }

    /// [`serving`] within `limits`, `k/raw/a` being `size` bytes.
    fn serving_within(
        key: &[u8],
        limits: PeerLimits,
        size: usize,
    ) -> (
        tempfile::TempDir,
        SharedFiles,
        String,
        tokio::runtime::Runtime,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = Cache::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
        let p = cache.partial_path();
        fs::write(&p, vec![b'a'; size]).unwrap();
        let digest = *blake3::hash(&vec![b'a'; size]).as_bytes();
        cache
            .insert("k/raw/a", &p, size as u64, Some(digest))
            .unwrap();
        cache.unpin("k/raw/a");
        let files = Arc::new(WorkerFiles::new(cache, 1));
        files.peers.set_key(key.to_vec());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = url_of(listener.local_addr().unwrap());
        rt.spawn(serve_within(files.clone(), listener, None, limits).unwrap());
        (dir, files, url, rt)
    }

    /// A connection to `url`'s port from `from` (a loopback address), with a small receive
    /// buffer so that an answer it does not read stalls soon.
    fn connect_from(rt: &tokio::runtime::Runtime, from: &str, url: &str) -> std::net::TcpStream {
        let to: SocketAddr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .unwrap();
        let stream = rt
            .block_on(async {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.set_recv_buffer_size(4096)?;
                socket.bind(format!("{from}:0").parse().unwrap())?;
                socket.connect(to).await?.into_std()
            })
            .unwrap();
        stream.set_nonblocking(false).unwrap();
        stream
    }

    /// Whether the other end closed `s`, waiting at most `limit` for it.
    fn closed_within(s: &mut std::net::TcpStream, limit: Duration) -> bool {
        use std::io::Read;
        s.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Issue 30: a captured signature stayed good for about 6 minutes (an expiry a minute
    /// ahead, taken 5 minutes late) where the documentation says a minute.
    #[test]
    fn a_signature_is_good_for_a_minute_and_no_longer() {
        let key = b"cluster secret";
        let t0 = 1_800_000_000;
        let sig = sign_now(key, "/files/k/raw/a", t0);
        assert!(verify(key, "/files/k/raw/a", &sig, t0));
        assert!(verify(key, "/files/k/raw/a", &sig, t0 + 60));
        assert!(!verify(key, "/files/k/raw/a", &sig, t0 + 61), "captured");
        // A maker whose clock is 30 s ahead is still heard, and one made for later is not.
        assert!(verify(key, "/files/k/raw/a", &sig, t0 - CLOCK_SLACK_S));
        let later = sign(key, "/files/k/raw/a", t0 + 61);
        assert!(
            !verify(key, "/files/k/raw/a", &later, t0),
            "more than a minute ahead"
        );
    }

    #[test]
    fn a_quarter_of_the_descriptors_is_for_peers_and_the_last_quarter_for_tasks() {
        let l = PeerLimits::for_open_files(1024);
        assert_eq!(
            (
                l.connections.total,
                l.connections.unproven,
                l.connections.per_source
            ),
            (256, 128, 16)
        );
        assert_eq!(l.fd_ceiling, 768);
        let small = PeerLimits::for_open_files(64);
        assert_eq!(small.connections.total, 16);
        assert_eq!(small.connections.per_source, 2);
        assert_eq!(PeerLimits::for_open_files(1 << 20).connections.total, 4096);
    }

    /// Issue 30: idle connections took every descriptor, and tasks could not start.
    #[test]
    fn a_connection_past_the_descriptor_ceiling_is_closed_at_once() {
        let mut limits = PeerLimits::for_open_files(1024);
        limits.fd_ceiling = 0;
        let (dir, _files, url, rt) = serving_within(b"secret", limits, 4096);
        let mut s = connect_from(&rt, "127.0.0.1", &url);
        assert!(closed_within(&mut s, Duration::from_secs(10)));
        let asker = Peers::default();
        asker.set_key(b"secret".to_vec());
        let got = asker.fetch(&url, "k/raw/a", &dir.path().join("fetched"));
        assert!(matches!(got, Fetched::Unreachable(_)), "{got:?}");
    }

    /// Issue 30: 10 signed requests whose askers never read the answer held every transfer
    /// place: every other request was answered 503 for as long as they stayed.
    #[test]
    fn an_asker_that_stops_reading_gives_its_place_back() {
        let mut limits = PeerLimits::for_open_files(1024);
        limits.write_stall = Duration::from_millis(300);
        // Other tests of this process open files too.
        limits.fd_ceiling = u64::MAX;
        // More than the socket buffers hold, so that the writing stalls.
        let (dir, _files, url, rt) = serving_within(b"secret", limits, 16 << 20);
        let path = "/files/k/raw/a";
        let stalled: Vec<_> = (0..MAX_SERVING)
            .map(|_| {
                let mut s = connect_from(&rt, "127.0.0.1", &url);
                let req = format!(
                    "GET {path} HTTP/1.1\r\nhost: x\r\n{AUTH_HEADER}: {}\r\n\r\n",
                    sign_now(b"secret", path, now_s())
                );
                s.write_all(req.as_bytes()).unwrap();
                // The answer has begun, so its transfer holds a place; then nothing is read.
                let mut head = Vec::new();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let mut buf = [0u8; 512];
                    let n = std::io::Read::read(&mut s, &mut buf).unwrap();
                    assert!(n > 0, "closed before answering");
                    head.extend_from_slice(&buf[..n]);
                }
                assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
                s
            })
            .collect();
        let asker = Peers::default();
        asker.set_key(b"secret".to_vec());
        let to = dir.path().join("fetched");
        let got = asker.fetch(&url, "k/raw/a", &to);
        assert!(
            matches!(got, Fetched::Got(n, _) if n == 16 << 20),
            "{got:?}"
        );
        drop(stalled);
    }

    /// Issue 30: idle connections were never closed, so 1,100 of them used up a worker's
    /// descriptors. Idle and slow ones from other addresses neither hold places for long nor
    /// keep a peer of the cluster out.
    #[test]
    fn idle_and_slow_connections_are_closed_and_a_peer_gets_through_meanwhile() {
        let mut limits = PeerLimits::for_open_files(256);
        limits.header_timeout = Duration::from_millis(500);
        limits.fd_ceiling = u64::MAX;
        let (per_source, unproven) = (limits.connections.per_source, limits.connections.unproven);
        let (dir, _files, url, rt) = serving_within(b"secret", limits, 4096);
        // More idle connections from one address than it may hold, and as many slow ones
        // (a header never finished) from each of several others as fill the unproven places.
        let mut flood: Vec<_> = (0..3 * per_source)
            .map(|_| connect_from(&rt, "127.0.0.2", &url))
            .collect();
        for i in 0..unproven / per_source + 1 {
            for _ in 0..per_source {
                let mut s = connect_from(&rt, &format!("127.0.0.{}", 3 + i), &url);
                let _ = s.write_all(b"GET /files/k/raw/a HTTP/1.1\r\nx-slow: ");
                flood.push(s);
            }
        }
        let asker = Peers::default();
        asker.set_key(b"secret".to_vec());
        let to = dir.path().join("fetched");
        for _ in 0..3 {
            let got = asker.fetch(&url, "k/raw/a", &to);
            assert!(matches!(got, Fetched::Got(4096, _)), "{got:?}");
        }
        // Every one of the flood is closed: at once, to make room, or at the header timeout.
        for s in &mut flood {
            assert!(
                closed_within(s, Duration::from_secs(10)),
                "a flood connection stays open"
            );
        }
        // A request with its size field at its maximum is answered, and the port still serves.
        let mut s = connect_from(&rt, "127.0.0.1", &url);
        let req = format!(
            "GET /files/k/raw/a HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n{AUTH_HEADER}: {}\r\n\r\n",
            u64::MAX,
            sign_now(b"secret", "/files/k/raw/a", now_s())
        );
        s.write_all(req.as_bytes()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = [0u8; 12];
        std::io::Read::read_exact(&mut s, &mut head).unwrap();
        assert!(head.starts_with(b"HTTP/1.1 "), "{head:?}");
        let got = asker.fetch(&url, "k/raw/a", &to);
        assert!(matches!(got, Fetched::Got(4096, _)), "{got:?}");
    }

    /// A fake peer on loopback that answers one request with `head` then `body`, and hangs up.
    fn fake_peer(head: String, body: Vec<u8>) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = url_of(listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        });
        url
    }

    #[test]
    fn a_peer_serves_its_cache_to_signed_requests_only() {
        let (dir, _files, url, _rt) = serving(b"secret");
        let to = dir.path().join("fetched");
        let asker = Peers::default();
        asker.set_key(b"secret".to_vec());
        let got = asker.fetch(&url, "k/raw/a", &to);
        assert!(matches!(got, Fetched::Got(4096, _)), "{got:?}");
        assert_eq!(fs::read(&to).unwrap(), vec![b'a'; 4096]);
        // A file it does not hold: not reported by the asker (the holder reports its own
        // evictions).
        let got = asker.fetch(&url, "k/raw/b", &to);
        assert!(matches!(got, Fetched::Unheld(_)), "{got:?}");
        assert!(asker.take_unheld().is_empty());
        assert!(!to.exists(), "nothing is left of a failed fetch");
        // Another cluster's secret: refused before the cache is looked at.
        let stranger = Peers::default();
        stranger.set_key(b"another".to_vec());
        let got = stranger.fetch(&url, "k/raw/a", &to);
        assert!(
            matches!(&got, Fetched::Declined(why) if why.contains("401")),
            "{got:?}"
        );
        let plain = http().get(format!("{url}files/k/raw/a")).send().unwrap();
        assert_eq!(plain.status(), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn a_transfer_cut_off_or_corrupt_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("fetched");
        let asker = Peers::default();
        let digest = hex::encode(blake3::hash(&[b'a'; 100]).as_bytes());
        let head = |len: usize| {
            format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n{DIGEST_HEADER}: {digest}\r\nconnection: close\r\n\r\n")
        };
        // The peer dies after 40 of 100 bytes.
        let cut = fake_peer(head(100), vec![b'a'; 40]);
        let got = asker.fetch(&cut, "k/raw/a", &to);
        assert!(matches!(got, Fetched::Unreachable(_)), "{got:?}");
        assert!(asker.sources_of_peer_skipped(&cut), "skipped from now on");
        // The peer sends 100 bytes that are not the file.
        let rotten = fake_peer(head(100), vec![b'b'; 100]);
        let got = asker.fetch(&rotten, "k/raw/a", &to);
        assert!(
            matches!(&got, Fetched::Unheld(why) if why.contains("corrupt")),
            "{got:?}"
        );
        assert!(!to.exists());
        // Reported, so that the server's index stops naming it for the file.
        let unheld = asker.take_unheld();
        assert_eq!(
            (unheld[0].file.as_str(), &unheld[0].peer),
            ("k/raw/a", &rotten)
        );
        // Nobody listens there at all.
        let gone = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            url_of(l.local_addr().unwrap())
        };
        let got = asker.fetch(&gone, "k/raw/a", &to);
        assert!(matches!(got, Fetched::Unreachable(_)), "{got:?}");
    }

    #[test]
    fn sources_skip_this_worker_and_unreachable_peers() {
        let peers = Peers::default();
        let _ = peers.url.set("http://me:1/".into());
        peers.note_sources(vec![FileSources {
            file: "k/a".into(),
            peers: vec![
                "http://me:1/".into(),
                "http://p:1/".into(),
                "http://q:1/".into(),
            ],
        }]);
        peers
            .unreachable
            .lock()
            .unwrap()
            .insert("http://p:1/".into(), Instant::now() + UNREACHABLE_FOR);
        assert_eq!(peers.sources_of("k/a"), vec!["http://q:1/".to_string()]);
        peers.forget_sources("k/a");
        assert!(peers.sources_of("k/a").is_empty());
    }
}
