//! Values on a worker (see [`kestrel_core::values`]): Python results too large to travel with
//! their task's end, and arguments a client put here, kept in the cache until the server says
//! they may go ([`crate::files`]' `DropFiles`), served to peers and clients like any cached
//! file.
//!
//! - A runner spills a large result into the cache's `partial` directory; [`keep_result`]
//!   moves it into the cache under the task's result name, and the task's end carries a
//!   reference to it instead of the value ([`kestrel_core::values::reference`]).
//! - A client puts an argument here with a `PUT` to the peer port ([`receive`]), signed with
//!   the cluster's secret over the body's size and digest; only argument and scattered values
//!   are taken, whole and checked, at most the cache's capacity.
//! - [`fetch`] and [`upload`] are the client's side of those transfers (the Python package's
//!   native module calls them), over the same signed HTTP as peers use.

use crate::cache::{CacheError, Digest};
use crate::capture::Captured;
use crate::exec::ExitKind;
use crate::files::{lock, WorkerFiles};
use crate::peer::{
    file_url, now_s, refuse, refuse_unproven, sign_now, sign_upload, verify_upload, OnConnection,
    Serving, AUTH_HEADER, DIGEST_HEADER, PERMIT_WAIT,
};
use axum::body::Body;
use axum::extract::{Extension, Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::Response;
use futures::StreamExt;
use kestrel_core::values::{self, ValueKind};
use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// How long an upload's body may pause before the upload is given up.
const BODY_STALL: Duration = Duration::from_secs(30);

/// The slowest rate a client's transfer is given time for: its time limit is a base plus its
/// size at this rate, so a large value is not cut off, nor a stalled peer waited for forever.
const SLOWEST_BYTES_PER_S: u64 = 1 << 20;

/// Why a task cannot read value `name`: no cache holds it, and no store ever does. Worded
/// `input NAME is in no cache: ...`, which the scheduler reads to make a lost result again
/// (lineage) rather than fail the task.
pub(crate) fn lost(name: &str) -> String {
    match values::kind_of(name) {
        Some(ValueKind::Result { job, index }) => format!(
            "input {name} is in no cache: the result of task {job}:{index}, which this call reads, is held by no worker any more (lost with the worker that held it, or dropped)"
        ),
        _ => format!(
            "input {name} is in no cache: a value this call reads is held by no worker any more (lost with the worker that held it, or dropped); submit the call again"
        ),
    }
}

/// Keeps the result a runner spilled at `spilled` as value `name` in the cache, until the
/// server drops it: what the task's end carries instead (a reference). A cache that cannot
/// hold it fails the task, saying what to do instead. `function` names the function, for
/// that message.
pub(crate) fn keep_result(
    cache: &WorkerFiles,
    name: &str,
    spilled: &Path,
    function: &str,
) -> Result<Captured, ExitKind> {
    let failed = |why: String| {
        let _ = fs::remove_file(spilled);
        Err(ExitKind::Unrunnable(why))
    };
    let digested = fs::File::open(spilled).and_then(|f| {
        let size = f.metadata()?.len();
        let mut hasher = blake3::Hasher::new();
        hasher.update_reader(f)?;
        Ok((size, *hasher.finalize().as_bytes()))
    });
    let (size, digest) = match digested {
        Ok(d) => d,
        Err(e) => {
            return failed(format!(
                "the result of {function} could not be read back: {e}"
            ))
        }
    };
    let mut c = lock(cache);
    match c.insert(name, spilled, size, Some(digest)) {
        Ok(_) => {
            c.unpin(name);
            c.keep(name);
        }
        Err(e @ (CacheError::TooLarge { .. } | CacheError::Pinned { .. })) => {
            drop(c);
            return failed(format!(
                "the result of {function} is {size} bytes, and this worker's cache cannot keep it ({e}); return a smaller value, or write the data to a file declared as an output (outputs=[...]), or give the worker a larger --cache-size"
            ));
        }
        Err(CacheError::Io(e)) => {
            drop(c);
            return failed(format!(
                "the result of {function} could not be kept in the cache: {e}"
            ));
        }
    }
    drop(c);
    // The server learns of it with the task's end, before the client can ask where it is.
    cache.report_now.notify_one();
    let data = values::reference(name, size);
    Ok(Captured {
        total: data.len() as u64,
        data,
    })
}

/// `PUT /files/NAME`: a client puts an argument or scattered value here.
pub(crate) async fn receive(
    State(s): State<Serving>,
    UrlPath(name): UrlPath<String>,
    Extension(on): Extension<OnConnection>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let text = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    let size = text(header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse::<u64>().ok());
    let digest = text(DIGEST_HEADER).filter(|d| d.len() == 64);
    let (Some(size), Some(digest)) = (size, digest) else {
        return refuse_unproven(
            StatusCode::BAD_REQUEST,
            "an upload needs its Content-Length and its digest",
        );
    };
    let key = s.files.peers.key();
    let signed = text(AUTH_HEADER)
        .is_some_and(|sig| verify_upload(&key, uri.path(), size, digest, sig, now_s()));
    if !signed {
        return refuse_unproven(
            StatusCode::UNAUTHORIZED,
            "not signed with this cluster's secret (or the signature expired)",
        );
    }
    on.0.prove();
    if !matches!(
        values::kind_of(&name),
        Some(ValueKind::Argument | ValueKind::Scattered)
    ) {
        return refuse(
            StatusCode::FORBIDDEN,
            "only a client's values (kestrel-values/a/ID, kestrel-values/s/ID) are put here",
        );
    }
    let Ok(digest) = hex::decode(digest).map(|d| Digest::try_from(d).ok()) else {
        return refuse(StatusCode::BAD_REQUEST, "the digest is not hex");
    };
    let Some(digest) = digest else {
        return refuse(StatusCode::BAD_REQUEST, "the digest is not 32 bytes");
    };
    let (held, capacity, partial) = {
        let c = lock(&s.files);
        (c.has(&name), c.capacity(), c.partial_dir())
    };
    if held {
        // Write-once, and the same name is the same value: nothing to take.
        return closing(StatusCode::OK, "already held");
    }
    if size > capacity {
        return closing(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("{size} bytes is more than this worker's cache holds ({capacity})"),
        );
    }
    let Ok(Ok(_permit)) =
        tokio::time::timeout(PERMIT_WAIT, s.permits.clone().acquire_owned()).await
    else {
        return closing(StatusCode::SERVICE_UNAVAILABLE, "busy with other transfers");
    };
    let path = partial.join(format!(
        "upload-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    ));
    match take_body(body, &path, size).await {
        Ok(got) if got == digest => {}
        Ok(_) => {
            let _ = fs::remove_file(&path);
            return refuse(
                StatusCode::BAD_REQUEST,
                "the body does not match its digest",
            );
        }
        Err(why) => {
            let _ = fs::remove_file(&path);
            return closing(StatusCode::BAD_REQUEST, &why);
        }
    }
    let mut c = lock(&s.files);
    match c.insert(&name, &path, size, Some(digest)) {
        Ok(_) => {
            c.unpin(&name);
            c.keep(&name);
            drop(c);
            s.files.report_now.notify_one();
            refuse(StatusCode::CREATED, "kept")
        }
        Err(e) => {
            drop(c);
            let _ = fs::remove_file(&path);
            refuse(StatusCode::INSUFFICIENT_STORAGE, &e.to_string())
        }
    }
}

/// [`refuse`], closing the connection: a body was not read.
fn closing(status: StatusCode, why: &str) -> Response {
    let mut r = refuse(status, why);
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// Writes `body` to a new file at `path`, `size` bytes exactly, and returns its digest. The
/// file is written and digested on a blocking thread, so a large upload does not hold up the
/// worker's connection to its server.
async fn take_body(body: Body, path: &Path, size: u64) -> Result<Digest, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot write the value here: {e}"))?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<axum::body::Bytes>(8);
    let writer = tokio::task::spawn_blocking(move || {
        let mut hasher = blake3::Hasher::new();
        while let Some(chunk) = rx.blocking_recv() {
            file.write_all(&chunk)
                .map_err(|e| format!("cannot write the value here: {e}"))?;
            hasher.update(&chunk);
        }
        Ok::<Digest, String>(*hasher.finalize().as_bytes())
    });
    let mut stream = body.into_data_stream();
    let mut got = 0u64;
    let read = loop {
        match tokio::time::timeout(BODY_STALL, stream.next()).await {
            Err(_) => break Err(format!("the upload stalled for {BODY_STALL:?}")),
            Ok(None) => break Ok(()),
            Ok(Some(Err(e))) => break Err(format!("the upload broke: {e}")),
            Ok(Some(Ok(chunk))) => {
                got += chunk.len() as u64;
                if got > size {
                    break Err(format!("the body is longer than its {size} bytes"));
                }
                if tx.send(chunk).await.is_err() {
                    break Ok(());
                }
            }
        }
    };
    drop(tx);
    let written = writer
        .await
        .map_err(|e| format!("the writer failed: {e}"))?;
    read?;
    let digest = written?;
    if got != size {
        return Err(format!("the body is {got} bytes, not {size}"));
    }
    Ok(digest)
}

/// The time a transfer of `size` bytes is given.
fn time_for(size: u64) -> Duration {
    Duration::from_secs(30 + size / SLOWEST_BYTES_PER_S)
}

/// One HTTP client for the transfers of a process's values (the Python package's).
fn client() -> &'static reqwest::blocking::Client {
    static CLIENT: std::sync::OnceLock<reqwest::blocking::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .no_proxy()
            .build()
            .unwrap_or_else(|_| reqwest::blocking::Client::new())
    })
}

/// Fetches value `name` (of `size` bytes, as its reference said) from the worker serving its
/// cache at `peer`, signing with `key` (the cluster's secret): its bytes, checked against the
/// size and digest the worker announces.
pub fn fetch(peer: &str, name: &str, size: u64, key: &[u8]) -> Result<Vec<u8>, String> {
    let url = file_url(peer, name)?;
    let auth = sign_now(key, url.path(), now_s());
    let resp = client()
        .get(url)
        .header(AUTH_HEADER, auth)
        .timeout(time_for(size))
        .send()
        .map_err(|e| format!("cannot reach {peer}: {e}"))?;
    if resp.status() == StatusCode::NOT_FOUND {
        return Err(format!("{peer} no longer holds it"));
    }
    if !resp.status().is_success() {
        let status = resp.status();
        let why = resp.text().unwrap_or_default();
        return Err(format!("{peer} answered {status}: {}", why.trim()));
    }
    let announced: Option<Digest> = resp
        .headers()
        .get(DIGEST_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| hex::decode(v).ok())
        .and_then(|v| Digest::try_from(v).ok());
    let Some(announced) = announced else {
        return Err(format!("{peer} sent no valid {DIGEST_HEADER} header"));
    };
    let data = resp
        .bytes()
        .map_err(|e| format!("the transfer from {peer} broke: {e}"))?;
    if data.len() as u64 != size || *blake3::hash(&data).as_bytes() != announced {
        return Err(format!(
            "{peer} sent {} bytes that are not the value ({size} bytes expected, or a digest that does not match)",
            data.len()
        ));
    }
    Ok(data.to_vec())
}

/// Puts `data` as value `name` on the worker serving its cache at `peer`, signing with `key`.
pub fn upload(peer: &str, name: &str, data: Vec<u8>, key: &[u8]) -> Result<(), String> {
    let url = file_url(peer, name)?;
    let size = data.len() as u64;
    let digest = blake3::hash(&data).to_hex().to_string();
    let auth = sign_upload(key, url.path(), size, &digest, now_s());
    let resp = client()
        .put(url)
        .header(AUTH_HEADER, auth)
        .header(DIGEST_HEADER, digest)
        .timeout(time_for(size))
        .body(data)
        .send()
        .map_err(|e| format!("cannot put the value on {peer}: {e}"))?;
    if resp.status().is_success() {
        return Ok(());
    }
    let status = resp.status();
    let why = resp.text().unwrap_or_default();
    Err(format!(
        "{peer} refused the value ({status}): {}",
        why.trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Cache, EvictionPolicy};
    use crate::peer::{serve_within, url_of, PeerLimits};
    use std::sync::Arc;

    /// A worker's files with a cache of `capacity` bytes, served on loopback by a runtime of
    /// its own: the files, the URL, and the runtime (serving while it lives).
    fn serving(
        capacity: u64,
    ) -> (
        tempfile::TempDir,
        crate::files::SharedFiles,
        String,
        tokio::runtime::Runtime,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), capacity, EvictionPolicy::Lru).unwrap();
        let files = Arc::new(WorkerFiles::new(cache, 1));
        files.peers.set_key(b"secret".to_vec());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = url_of(listener.local_addr().unwrap());
        let limits = PeerLimits::for_open_files(1024);
        rt.spawn(serve_within(files.clone(), listener, None, limits).unwrap());
        (dir, files, url, rt)
    }

    #[test]
    fn a_value_put_on_a_worker_is_kept_there_and_fetched_back_whole() {
        let (_dir, files, url, _rt) = serving(1 << 20);
        let name = "kestrel-values/s/0a1b";
        let data: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        upload(&url, name, data.clone(), b"secret").expect("taken");
        assert!(lock(&files).has(name));
        // Kept: reported to the server as held, and not evicted by what comes after.
        assert!(lock(&files)
            .take_delta()
            .added
            .iter()
            .any(|(n, _)| n == name));
        let back = fetch(&url, name, data.len() as u64, b"secret").expect("fetched");
        assert_eq!(back, data);
        // The same name again is the same value: nothing to take.
        upload(&url, name, vec![1, 2, 3], b"secret").expect("already held");
        assert_eq!(
            fetch(&url, name, data.len() as u64, b"secret").unwrap(),
            data
        );
    }

    #[test]
    fn uploads_that_are_not_a_clients_values_or_not_whole_are_refused() {
        let (_dir, files, url, _rt) = serving(1000);
        let wrong_key = upload(&url, "kestrel-values/s/1", vec![0; 10], b"other").unwrap_err();
        assert!(wrong_key.contains("401"), "{wrong_key}");
        let not_a_value = upload(&url, "k/raw/a", vec![0; 10], b"secret").unwrap_err();
        assert!(not_a_value.contains("403"), "{not_a_value}");
        let result = upload(&url, "kestrel-values/r/ab/1/0", vec![0; 10], b"secret").unwrap_err();
        assert!(
            result.contains("403"),
            "a result is the worker's own: {result}"
        );
        let too_big = upload(&url, "kestrel-values/s/2", vec![0; 2000], b"secret").unwrap_err();
        assert!(too_big.contains("413"), "{too_big}");
        // Signed for one body, sent with another: the digest does not match what came.
        let name = "kestrel-values/a/3";
        let target = file_url(&url, name).unwrap();
        let signed_for = blake3::hash(b"good").to_hex().to_string();
        let auth = sign_upload(b"secret", target.path(), 4, &signed_for, now_s());
        let resp = client()
            .put(target)
            .header(AUTH_HEADER, auth)
            .header(DIGEST_HEADER, signed_for)
            .body(b"evil".to_vec())
            .send()
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let c = lock(&files);
        for n in ["kestrel-values/s/1", "k/raw/a", "kestrel-values/s/2", name] {
            assert!(!c.has(n), "{n} was taken");
        }
        drop(c);
        let missing = fetch(&url, "kestrel-values/s/9", 10, b"secret").unwrap_err();
        assert!(missing.contains("no longer holds it"), "{missing}");
    }
}
