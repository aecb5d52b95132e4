//! Peer transfers: each worker serves its cache over HTTP to the other workers of its cluster,
//! and fetches a missing input from the peers the server names as holding it before it falls
//! back to the store.
//!
//! - Serving ([`serve`]): `GET /files/KEY/NAME` answers the cached file with its size and its
//!   BLAKE3 digest (`x-kestrel-blake3`), to a request signed with the cluster secret (below);
//!   at most [`MAX_SERVING`] transfers at once (TaskVine's bound), a request waiting longer than
//!   [`PERMIT_WAIT`] for one is answered 503 and its asker goes elsewhere. The open file is
//!   streamed, so a file evicted meanwhile is still served whole.
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
//! expiry a minute ahead; the server rejects an expired or wrong one (401) before it looks at
//! the cache. Written here rather than taken from a library because no maintained crate
//! signs plain HTTP requests with a shared key in one header; the MAC itself is `hmac`'s.

use crate::cache::{is_plain_name, Digest};
use crate::files::{lock, SharedFiles};
use crate::store::{write_file_digesting, CopyError, WriteFailed};
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hmac::{Hmac, Mac};
use kestrel_proto::messages::{FileSources, Unheld};
use rustc_hash::FxHashMap;
use sha2::Sha256;
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;

/// Transfers a worker serves at once (TaskVine's default).
pub const MAX_SERVING: usize = 10;
/// How long a request waits for one of those before it is told the peer is busy.
pub const PERMIT_WAIT: Duration = Duration::from_secs(5);
/// How long a peer that could not be reached is skipped as a source.
pub const UNREACHABLE_FOR: Duration = Duration::from_secs(60);
/// The header carrying a request's signature, and the one carrying a file's digest.
const AUTH_HEADER: &str = "x-kestrel-peer";
const DIGEST_HEADER: &str = "x-kestrel-blake3";
/// How long a signature is good for, and how far ahead of the serving peer's clock an
/// expiry may be (clocks of a cluster's nodes differ a little).
const SIGNED_FOR_S: u64 = 60;
const CLOCK_SLACK_S: u64 = 300;
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
        let auth = sign(&self.key(), url.path(), now_s() + SIGNED_FOR_S);
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

    fn key(&self) -> Vec<u8> {
        self.key
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The URL of `file` on `peer`, each part of the name percent-encoded.
fn file_url(peer: &str, file: &str) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(peer).map_err(|e| format!("bad peer URL {peer}: {e}"))?;
    url.path_segments_mut()
        .map_err(|()| format!("peer URL {peer} cannot take a path"))?
        .pop_if_empty()
        .push("files")
        .extend(file.split('/'));
    Ok(url)
}

/// One client for fetches from peers: short connect timeout (a cut-off peer is found fast),
/// and a bound on each read (a peer that stalls mid-file is given up on).
fn http() -> &'static reqwest::blocking::Client {
    static CLIENT: OnceLock<reqwest::blocking::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(PERMIT_WAIT + Duration::from_secs(10))
            .no_proxy()
            .build()
            .unwrap_or_else(|_| reqwest::blocking::Client::new())
    })
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn mac(key: &[u8], path: &str, expires: u64) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(format!("kestrel-peer-v1 {expires} {path}").as_bytes());
    mac
}

/// The signature of a request for `path`, good until `expires` (seconds since the epoch).
pub fn sign(key: &[u8], path: &str, expires: u64) -> String {
    let tag = mac(key, path, expires).finalize().into_bytes();
    format!("{expires}.{}", hex::encode(tag))
}

/// Whether `signature` signs `path` with `key` and has not expired at `now` (seconds).
pub fn verify(key: &[u8], path: &str, signature: &str, now: u64) -> bool {
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
    mac(key, path, expires).verify_slice(&tag).is_ok()
}

#[derive(Clone)]
struct Serving {
    files: SharedFiles,
    permits: Arc<Semaphore>,
}

/// Serves `files`' cache to peers on `listener` until the task is aborted. Records the URL
/// it serves at (`http://ADDR/`) at once, before the first poll, so that a registration sent
/// right after names it: the listener's address, or `advertise` with its port when it listens
/// on every interface (`0.0.0.0`, which no peer can dial).
pub fn serve(
    files: SharedFiles,
    listener: tokio::net::TcpListener,
    advertise: Option<std::net::IpAddr>,
) -> std::io::Result<impl std::future::Future<Output = std::io::Result<()>>> {
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
    Ok(serve_on(files, listener))
}

async fn serve_on(files: SharedFiles, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let state = Serving {
        files,
        permits: Arc::new(Semaphore::new(MAX_SERVING)),
    };
    let app = axum::Router::new()
        .route("/files/{*name}", axum::routing::get(serve_file))
        .with_state(state);
    // Without TCP_NODELAY a small file's body, written after its header, waits for the
    // asker's delayed ACK (~40 ms on Linux): most intermediates between tasks are small.
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY on a peer connection: {e}");
        }
    });
    axum::serve(listener, app).await
}

/// `http://ADDR/`, an IPv6 address in brackets.
pub fn url_of(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, format!("{why}\n")).into_response()
}

async fn serve_file(
    State(s): State<Serving>,
    UrlPath(name): UrlPath<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let signed = headers.get(AUTH_HEADER).and_then(|v| v.to_str().ok());
    let key = s.files.peers.key();
    if !signed.is_some_and(|sig| verify(&key, uri.path(), sig, now_s())) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "not signed with this cluster's secret (or the signature expired)",
        );
    }
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
        let dir = tempfile::tempdir().unwrap();
        let mut cache = Cache::open(dir.path(), 1 << 20, EvictionPolicy::Lru).unwrap();
        let p = cache.partial_path();
        fs::write(&p, vec![b'a'; 4096]).unwrap();
        let digest = *blake3::hash(&[b'a'; 4096]).as_bytes();
        cache.insert("k/raw/a", &p, 4096, Some(digest)).unwrap();
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
        rt.spawn(serve(files.clone(), listener, None).unwrap());
        (dir, files, url, rt)
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
