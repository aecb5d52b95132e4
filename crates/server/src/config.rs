//! How a server is configured: what `kestrel server start` and `kestrel run` fill in.

use kestrel_core::PolicyName;
use std::path::PathBuf;
use std::time::Duration;

/// How to run a server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Directory holding the access file and the journal.
    pub dir: PathBuf,
    /// Address to listen on.
    pub bind_host: String,
    /// 0 picks a free port.
    pub port: u16,
    /// Host name written into the access file for workers and clients to connect to.
    pub advertise_host: String,
    /// How often workers send a heartbeat; a worker silent for 4 intervals is lost.
    pub heartbeat: Duration,
    /// Keep a journal (`DIR/journal.sqlite`) so the server's state survives a crash.
    pub journal: bool,
    /// Cap on the journal's size in bytes (mostly for tests of a full disk).
    pub journal_limit: Option<u64>,
    /// TLS for every connection, or plain TCP when `None`.
    pub tls: Option<TlsConfig>,
    /// Quarantine workers whose tasks fail far more often than on the others.
    pub quarantine: bool,
    /// The id of the first job (a journal's restored jobs continue after their own).
    pub first_job: u32,
    /// The shared store of jobs' files, for jobs that name none (`--store`).
    pub store: Option<String>,
    /// How tasks that read files are placed, for jobs that name no policy (`--policy`).
    pub policy: PolicyName,
    /// Good-cache-compute's threshold of busy cpus, in thousandths.
    pub util_threshold_permille: u16,
    /// How many ready tasks data-aware placement looks at; `None` is 100 per worker.
    pub window: Option<usize>,
    /// The server of one `kestrel run` that keeps its record (with `journal`): the directory
    /// is marked as a run's, an earlier run's record there is replaced, and a server's journal
    /// there is refused (see [`crate::record`]).
    pub run_record: bool,
    /// Make a new secret rather than keep the journal's (`server start --new-secret`): access
    /// files written before are refused from now on.
    pub new_secret: bool,
    /// How long a burst of writes to an authenticated client or worker may take before its
    /// connection is dropped ([`crate::WRITE_TIMEOUT`]; shorter only in tests).
    pub write_timeout: Duration,
    /// How long a peer has to finish the handshake ([`crate::HANDSHAKE_TIMEOUT`]); a fifth of
    /// it when half the handshake places or more are taken as it comes in.
    pub handshake_timeout: Duration,
}

/// Where the server's TLS certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsConfig {
    /// Self-signed, generated on first use and kept in the server directory
    /// (`tls-cert.pem`, `tls-key.pem`), so restarts keep the same certificate.
    SelfSigned,
    /// PEM files the user provides.
    Files {
        /// The certificate chain.
        cert: PathBuf,
        /// Its private key.
        key: PathBuf,
    },
}

impl ServerConfig {
    /// The time limits of the server's connections.
    pub(crate) fn timeouts(&self) -> crate::conn::Timeouts {
        crate::conn::Timeouts {
            write: self.write_timeout,
            handshake: self.handshake_timeout,
        }
    }

    /// A server on loopback with a free port, for embedded use and tests.
    pub fn local(dir: PathBuf) -> ServerConfig {
        ServerConfig {
            dir,
            bind_host: "127.0.0.1".into(),
            port: 0,
            advertise_host: "127.0.0.1".into(),
            heartbeat: Duration::from_secs(5),
            journal: false,
            journal_limit: None,
            tls: None,
            quarantine: true,
            first_job: 1,
            store: None,
            policy: PolicyName::FirstAvailable,
            util_threshold_permille: kestrel_core::policy::DEFAULT_UTIL_THRESHOLD_PERMILLE,
            window: None,
            run_record: false,
            new_secret: false,
            write_timeout: crate::WRITE_TIMEOUT,
            handshake_timeout: crate::HANDSHAKE_TIMEOUT,
        }
    }
}
