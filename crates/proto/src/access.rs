//! The access file: where a server listens and the secret to prove to it.
//!
//! The server writes `access.json` into its directory (mode 0600); workers and clients read it.
//! Anyone who can read the file can use the server, so it is never made readable by others.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::ops::RangeInclusive;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The file name inside a server directory.
pub const ACCESS_FILE: &str = "access.json";

/// Contents of an access file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    /// Host name or address that workers and clients connect to.
    pub host: String,
    pub port: u16,
    /// Hex-encoded shared secret.
    pub secret: String,
    /// Process id of the server that wrote it (for `server stop` and stale-file messages).
    pub pid: u32,
    /// The protocol version the server speaks.
    pub protocol: u32,
    /// The server's TLS certificate (PEM) when it runs with TLS. Connectors then speak TLS and
    /// trust exactly this certificate. Absent in plain-TCP servers' (and older) access files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<String>,
}

/// Why an access file could not be used, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("no access file at {0}: no server has been started there; start one with `kestrel server start` (or point to it with --server-dir / --access)")]
    Missing(PathBuf),
    #[error("cannot read access file {path}: {err}")]
    Unreadable { path: PathBuf, err: std::io::Error },
    #[error("access file {path} is malformed ({err}); start the server again to write a new one")]
    Malformed { path: PathBuf, err: String },
    #[error("cannot write access file {path}: {err}")]
    Write { path: PathBuf, err: std::io::Error },
    #[error("{path} is {how} by other users (mode {mode:04o}); run `chmod 600 {path}` or delete it (whoever can read it can use the server: if someone may have read it, delete it and restart the server with `kestrel server start --new-secret`, which makes the old secret worthless)")]
    Exposed {
        path: PathBuf,
        how: &'static str,
        mode: u32,
    },
}

/// Refuses an access file that other users can read or change: the secret in it is the only
/// thing standing between them and running commands as this user.
pub fn check_private(path: &Path, meta: &std::fs::Metadata) -> Result<(), AccessError> {
    let mode = meta.permissions().mode() & 0o7777;
    let how = if mode & 0o044 != 0 {
        "readable"
    } else if mode & 0o022 != 0 {
        "writable"
    } else if mode & 0o011 != 0 {
        "executable"
    } else {
        return Ok(());
    };
    Err(AccessError::Exposed {
        path: path.to_owned(),
        how,
        mode,
    })
}

/// Checks the access file at `path`, if there is one (a server checks its directory's file
/// before starting).
pub fn check_existing(path: &Path) -> Result<(), AccessError> {
    match std::fs::metadata(path) {
        Ok(meta) => check_private(path, &meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(AccessError::Unreadable {
            path: path.to_owned(),
            err,
        }),
    }
}

impl Access {
    /// A fresh access record with a new random 256-bit secret.
    pub fn generate(host: String, port: u16) -> Access {
        use rand::RngCore;
        let mut secret = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut secret);
        Access {
            host,
            port,
            secret: hex::encode(secret),
            pid: std::process::id(),
            protocol: crate::auth::PROTOCOL_VERSION,
            tls_cert: None,
        }
    }

    /// The versions to offer this access file's server in the handshake: those of `spoken`
    /// up to the newest it speaks (`protocol`). A server before version 7 cannot read a hello
    /// that offers a range and closes the connection without a word, which a connector would
    /// take for a server that is away; offered its own version alone, it is served.
    /// - A server older than all of `spoken`: the oldest alone, in a hello it can read, so it
    ///   refuses with a reason that names both versions.
    /// - A server newer than all of `spoken`: all of them (it reads a range).
    pub fn versions_for(&self, spoken: RangeInclusive<u32>) -> RangeInclusive<u32> {
        let (oldest, newest) = (*spoken.start(), *spoken.end());
        if self.protocol < oldest {
            oldest..=oldest
        } else {
            oldest..=newest.min(self.protocol)
        }
    }

    /// The secret as bytes.
    pub fn secret_bytes(&self) -> Vec<u8> {
        hex::decode(&self.secret).unwrap_or_else(|_| self.secret.as_bytes().to_vec())
    }

    /// `host:port`.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Writes the file atomically with mode 0600 (a reader never sees half a file).
    pub fn write(&self, path: &Path) -> Result<(), AccessError> {
        let werr = |err| AccessError::Write {
            path: path.to_owned(),
            err,
        };
        let tmp = path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(werr)?;
        let body = serde_json::to_vec_pretty(self).expect("access serializes");
        f.write_all(&body)
            .and_then(|_| f.sync_all())
            .map_err(werr)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(werr)?;
        std::fs::rename(&tmp, path).map_err(werr)
    }

    /// Reads an access file, refusing one that other users can read (see [`check_private`]).
    pub fn read(path: &Path) -> Result<Access, AccessError> {
        use std::io::Read;
        let unreadable = |err: std::io::Error| {
            if err.kind() == std::io::ErrorKind::NotFound {
                AccessError::Missing(path.to_owned())
            } else {
                AccessError::Unreadable {
                    path: path.to_owned(),
                    err,
                }
            }
        };
        let mut f = std::fs::File::open(path).map_err(unreadable)?;
        // The mode of the file actually opened, so a swap between check and read is no gap.
        check_private(path, &f.metadata().map_err(unreadable)?)?;
        let mut body = Vec::new();
        f.read_to_end(&mut body).map_err(unreadable)?;
        serde_json::from_slice(&body).map_err(|e| AccessError::Malformed {
            path: path.to_owned(),
            err: e.to_string(),
        })
    }
}

/// The server directory: `$KESTREL_SERVER_DIR`, else `~/.kestrel/server`.
pub fn default_server_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KESTREL_SERVER_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".kestrel").join("server")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connector_offers_what_the_access_files_server_can_read() {
        let with = |protocol| Access {
            protocol,
            ..Access::generate("h".into(), 1)
        };
        assert_eq!(with(7).versions_for(6..=7), 6..=7);
        assert_eq!(
            with(6).versions_for(6..=7),
            6..=6,
            "a v6 server reads no range"
        );
        assert_eq!(
            with(4).versions_for(6..=7),
            6..=6,
            "it refuses one version, saying why"
        );
        assert_eq!(
            with(9).versions_for(6..=7),
            6..=7,
            "a newer server reads a range"
        );
        assert_eq!(with(7).versions_for(6..=6), 6..=6);
    }

    #[test]
    fn written_access_files_are_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ACCESS_FILE);
        let a = Access::generate("127.0.0.1".into(), 4242);
        a.write(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Access::read(&path).unwrap(), a);
        assert_eq!(a.secret_bytes().len(), 32);
        assert_ne!(Access::generate("h".into(), 1).secret, a.secret);
    }

    #[test]
    fn missing_and_malformed_files_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ACCESS_FILE);
        let e = Access::read(&path).unwrap_err().to_string();
        assert!(e.contains("kestrel server start"), "{e}");
        std::fs::write(&path, b"{not json").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Access::read(&path).unwrap_err().to_string();
        assert!(e.contains("malformed"), "{e}");
    }

    #[test]
    fn files_other_users_can_read_are_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ACCESS_FILE);
        check_existing(&path).unwrap();
        Access::generate("127.0.0.1".into(), 1)
            .write(&path)
            .unwrap();
        check_existing(&path).unwrap();
        for (mode, how) in [
            (0o644, "readable"),
            (0o640, "readable"),
            (0o620, "writable"),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = Access::read(&path).unwrap_err().to_string();
            let shown = path.display();
            assert!(
                e.contains(&format!("is {how} by other users (mode {mode:04o})")),
                "{e}"
            );
            assert!(
                e.contains(&format!("run `chmod 600 {shown}` or delete it")),
                "{e}"
            );
            assert!(check_existing(&path).is_err());
        }
    }

    #[test]
    fn old_access_files_without_a_certificate_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ACCESS_FILE);
        let mut a = Access::generate("127.0.0.1".into(), 4242);
        a.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("tls_cert"), "{text}");
        a.tls_cert = Some("-----BEGIN CERTIFICATE-----\n".into());
        a.write(&path).unwrap();
        assert_eq!(Access::read(&path).unwrap(), a);
    }
}
