//! The shared store a job's logical files live in: a directory on a shared file system, or
//! an HTTP(S) URL prefix (GET to read, PUT to write, as nginx's WebDAV module or an object
//! store's HTTP endpoint serve them).
//!
//! Reads and writes are blocking: they run on the executor thread of the task they serve.
//! Every read is checked against the size the store announced, so a truncated transfer is an
//! error, never a short file in the cache.

use crate::cache::Digest;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Where a job's files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    /// A directory on a file system the workers share.
    Dir(PathBuf),
    /// A URL prefix ending in `/`; a file's URL is the prefix and its name.
    Http(String),
}

/// Why a read from the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store has no such file (not worth retrying).
    #[error("not found in {0}")]
    NotFound(String),
    /// The store is down, slow, or the transfer broke (worth retrying later).
    #[error("{0}")]
    Failed(String),
    /// The file could not be written here: the worker's own disk failed, not the store.
    #[error(transparent)]
    Local(WriteFailed),
}

/// A file could not be written on this worker's disk: its source is not to blame.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {error}", path.display())]
pub struct WriteFailed {
    /// Where it was being written.
    pub path: PathBuf,
    pub error: io::Error,
    /// The file's whole size, when its source announced it.
    pub size: Option<u64>,
    /// How much of it was written before the write failed.
    pub written: u64,
}

impl WriteFailed {
    /// Whether the disk is full (or the user's quota spent): evicting may make room.
    pub fn is_no_space(&self) -> bool {
        matches!(
            self.error.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        ) || matches!(self.error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
    }
}

impl Store {
    /// The store `text` names: a URL if it starts with `http://` or `https://`, else a
    /// directory.
    pub fn parse(text: &str) -> Store {
        let lower = text.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            Store::Http(format!("{}/", text.trim_end_matches('/')))
        } else {
            Store::Dir(PathBuf::from(text))
        }
    }

    /// The store as users named it, for messages.
    pub fn describe(&self) -> String {
        match self {
            Store::Dir(d) => d.display().to_string(),
            Store::Http(u) => u.clone(),
        }
    }

    /// Copies file `name` to `to` (a fresh path); returns its size and digest.
    pub fn read_into(&self, name: &str, to: &Path) -> Result<(u64, Digest), StoreError> {
        let failed =
            |e: String| StoreError::Failed(format!("reading {name} from {}: {e}", self.describe()));
        let from_copy = |e| match e {
            CopyError::Read(e) => failed(e.to_string()),
            CopyError::Local(w) => StoreError::Local(w),
        };
        match self {
            Store::Dir(dir) => {
                let from = dir.join(name);
                let mut source = match fs::File::open(&from) {
                    Ok(f) => f,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        // A typo in `--store` says so, not only that the file is missing.
                        let store = if dir.is_dir() {
                            self.describe()
                        } else {
                            format!("{} (no such directory: check --store)", self.describe())
                        };
                        return Err(StoreError::NotFound(store));
                    }
                    Err(e) => return Err(failed(e.to_string())),
                };
                let size = match source.metadata() {
                    Ok(m) if m.is_file() => m.len(),
                    Ok(_) => return Err(failed("not a file".into())),
                    Err(e) => return Err(failed(e.to_string())),
                };
                // Copied through this process rather than by the kernel (`fs::copy`): the
                // digest is taken on the way, and a full local disk is told from a failing
                // store.
                let (copied, digest) =
                    write_file_digesting(&mut source, to, Some(size)).map_err(from_copy)?;
                if copied != size {
                    let _ = fs::remove_file(to);
                    return Err(failed(format!(
                        "it changed while read ({size} bytes, then {copied})"
                    )));
                }
                Ok((size, digest))
            }
            Store::Http(prefix) => {
                let url = url_of(prefix, name).map_err(failed)?;
                let mut resp = http().get(url).send().map_err(|e| failed(e.to_string()))?;
                let status = resp.status();
                if status == reqwest::StatusCode::NOT_FOUND {
                    return Err(StoreError::NotFound(self.describe()));
                }
                if !status.is_success() {
                    return Err(failed(format!("the store answered {status}")));
                }
                let announced = resp.content_length();
                let (copied, digest) =
                    write_file_digesting(&mut resp, to, announced).map_err(from_copy)?;
                if announced.is_some_and(|n| n != copied) {
                    let _ = fs::remove_file(to);
                    return Err(failed(format!(
                        "truncated: {copied} of {} bytes",
                        announced.unwrap_or_default()
                    )));
                }
                Ok((copied, digest))
            }
        }
    }

    /// Writes the open file `from` (read from where it is to its end) to the store as `name`,
    /// whole: a directory store gets it through a hidden partial file renamed into place, with
    /// the mode of `from`.
    pub fn write_from(&self, name: &str, from: &mut fs::File) -> Result<(), String> {
        let failed = |e: String| format!("writing output {name} to {}: {e}", self.describe());
        match self {
            Store::Dir(dir) => {
                let to = dir.join(name);
                let parent = to.parent().unwrap_or(dir);
                fs::create_dir_all(parent).map_err(|e| failed(e.to_string()))?;
                let file = to.file_name().and_then(|f| f.to_str()).unwrap_or("output");
                // Unique per write: two runs may write one name at once (the last one wins).
                static WRITES: AtomicU64 = AtomicU64::new(0);
                let n = WRITES.fetch_add(1, Ordering::Relaxed);
                let partial = parent.join(format!(".{file}.kestrel-{}-{n}", std::process::id()));
                // From the open file, not its path: a path could have become a link since.
                let placed = fs::File::create(&partial)
                    .and_then(|mut out| {
                        io::copy(from, &mut out)?;
                        out.set_permissions(from.metadata()?.permissions())
                    })
                    .and_then(|()| fs::rename(&partial, &to));
                placed.map_err(|e| {
                    let _ = fs::remove_file(&partial);
                    failed(e.to_string())
                })
            }
            Store::Http(prefix) => {
                let url = url_of(prefix, name).map_err(failed)?;
                let body = from.try_clone().map_err(|e| failed(e.to_string()))?;
                let resp = http()
                    .put(url)
                    .body(reqwest::blocking::Body::from(body))
                    .send()
                    .map_err(|e| failed(e.to_string()))?;
                if resp.status().is_success() {
                    Ok(())
                } else {
                    Err(failed(format!("the store answered {}", resp.status())))
                }
            }
        }
    }
}

/// The URL of file `name` under `prefix`, each part of the name percent-encoded (a `#` or
/// `?` in a name is part of the name, not of the URL).
fn url_of(prefix: &str, name: &str) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(prefix).map_err(|e| format!("bad store URL: {e}"))?;
    url.path_segments_mut()
        .map_err(|()| "the store URL cannot take a path".to_string())?
        .pop_if_empty()
        .extend(name.split('/'));
    Ok(url)
}

/// One HTTP client for the process: connections to the store are reused across tasks.
fn http() -> &'static reqwest::blocking::Client {
    static CLIENT: OnceLock<reqwest::blocking::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .tcp_keepalive(Duration::from_secs(30))
            // The blocking client bounds a whole transfer only: generous, so a large file on a
            // slow store still comes, yet a store that stalls does not hold a slot for ever.
            .timeout(Duration::from_secs(1800))
            .build()
            .unwrap_or_else(|_| reqwest::blocking::Client::new())
    })
}

/// Why a copy of a whole file into a new file stopped: the side that failed matters (a
/// source that breaks off is the store's or the peer's doing; a full local disk is not).
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the transfer broke: {0}")]
    Read(io::Error),
    #[error(transparent)]
    Local(WriteFailed),
}

/// Copies `from` to its end into a new file at `to` (removed again if the copy fails),
/// digesting what passes: the bytes copied and their BLAKE3 digest, taken on the way instead
/// of by reading the file again. `size` is what the source announced, for the error. The one
/// copy loop of the store's reads, the peers' transfers and the outputs kept in the cache.
pub fn write_file_digesting(
    from: &mut impl Read,
    to: &Path,
    size: Option<u64>,
) -> Result<(u64, Digest), CopyError> {
    let local = |error, written| {
        CopyError::Local(WriteFailed {
            path: to.to_path_buf(),
            error,
            size,
            written,
        })
    };
    // Owner-only: a store's private file stays private in a cache or a task's directory.
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| local(e, 0))?;
    // A buffer for whole files (megabytes each).
    let mut buf = vec![0u8; 256 << 10];
    let mut hasher = blake3::Hasher::new();
    let mut n = 0u64;
    let failed = loop {
        let got = match from.read(&mut buf) {
            Ok(0) => return Ok((n, *hasher.finalize().as_bytes())),
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => break CopyError::Read(e),
        };
        if let Err(e) = file.write_all(&buf[..got]) {
            break local(e, n);
        }
        hasher.update(&buf[..got]);
        n += got as u64;
    };
    let _ = fs::remove_file(to);
    Err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_are_named_as_users_give_them() {
        assert_eq!(
            Store::parse("http://10.0.0.2:8080"),
            Store::Http("http://10.0.0.2:8080/".into())
        );
        assert_eq!(
            Store::parse("HTTPS://s/x/"),
            Store::Http("HTTPS://s/x/".into())
        );
        assert_eq!(
            Store::parse("/data/store"),
            Store::Dir("/data/store".into())
        );
    }

    #[test]
    fn names_are_encoded_into_urls_part_by_part() {
        let u = url_of("http://s:8080/data/", "raw/a b#1?.fits").unwrap();
        assert_eq!(u.as_str(), "http://s:8080/data/raw/a%20b%231%3F.fits");
    }

    #[test]
    fn a_directory_store_reads_whole_files_and_says_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("raw")).unwrap();
        fs::write(dir.path().join("raw/a"), b"12345").unwrap();
        let store = Store::Dir(dir.path().to_path_buf());
        let to = dir.path().join("copy");
        let digest = *blake3::hash(b"12345").as_bytes();
        assert_eq!(store.read_into("raw/a", &to).unwrap(), (5, digest));
        // Owner-only, whatever the store's file allowed.
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&to).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(matches!(
            store.read_into("raw/b", &to),
            Err(StoreError::NotFound(_))
        ));
        // A store directory that does not exist (a typo in --store) is named as such.
        let typo = Store::Dir(dir.path().join("stor"));
        match typo.read_into("raw/a", &to) {
            Err(StoreError::NotFound(s)) => {
                assert!(s.ends_with("(no such directory: check --store)"), "{s}")
            }
            other => panic!("{other:?}"),
        }
        store
            .write_from("out/x/y", &mut fs::File::open(&to).unwrap())
            .unwrap();
        assert_eq!(fs::read(dir.path().join("out/x/y")).unwrap(), b"12345");
    }
}
