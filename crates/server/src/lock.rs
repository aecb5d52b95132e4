//! The server directory lock: one live server per directory.
//!
//! `DIR/server.lock` holds an exclusive `flock` for the server's lifetime and the holder's pid.
//! The kernel drops the lock when the process dies, even by `kill -9`, so a crashed server never
//! leaves a stale lock behind.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The file name inside a server directory.
pub const LOCK_FILE: &str = "server.lock";

/// Held while the server runs; dropping it releases the directory.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("server directory {dir} is in use by a running server (pid {pid}); stop it with `kestrel --server-dir {dir} server stop` or pick another directory")]
    Held { dir: PathBuf, pid: String },
    #[error("cannot lock {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
}

impl DirLock {
    /// Takes the lock of `dir` without waiting, or says who holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |err| LockError::Io {
            path: path.clone(),
            err,
        };
        // No truncation on open: the pid inside belongs to the holder until we hold the lock.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // SAFETY: flock on a file descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(LockError::Held {
                    dir: dir.to_owned(),
                    pid: if pid.is_empty() {
                        "unknown".into()
                    } else {
                        pid.to_string()
                    },
                });
            }
            return Err(io(err));
        }
        file.set_len(0)
            .and_then(|_| file.seek(SeekFrom::Start(0)))
            .and_then(|_| writeln!(file, "{}", std::process::id()))
            .map_err(io)?;
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let e = DirLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(e.contains(&format!("(pid {})", std::process::id())), "{e}");
        assert!(e.contains("server stop` or pick another directory"), "{e}");
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }
}
