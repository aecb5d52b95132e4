//! Kestrel's worker: connects out to the server, runs assigned tasks on its slots, reports.
//!
//! - [`exec`] runs one task as a process in its own process group (spawn, wait, timeout, kill).
//! - [`capture`] reads a task's streamed stdout/stderr from a pipe while `exec` waits.
//! - [`local`] keeps templates, the local queue and free resources, and builds launches.
//! - [`reaper`] is a process that kills the worker's tasks if the worker dies.
//! - `pool` is the executor threads, one per slot, and the deck of tasks ready to follow
//!   a running task of the same job on the thread that ends it.
//! - `session` is one connection's life; [`run`] reconnects with backoff when it drops, and
//!   running tasks survive the drop: the next registration hands them and their results over.
//! - [`connected`] describes each registration, for a caller that wants to tell its user.

pub mod capture;
pub mod connected;
pub mod exec;
pub mod local;
mod outputs;
mod pool;
pub mod reaper;
mod session;

pub use connected::{Connected, Handover};
use kestrel_proto::{Access, ClientError, ProtoError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How tasks are executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecMode {
    /// Each task is a child process (the normal mode).
    Process,
    /// Benchmark only: tasks complete at once without running anything, to measure dispatch.
    Noop,
}

/// How to run a worker.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Where to re-read the access file when reconnecting (a restarted server writes a new one).
    pub access_file: Option<PathBuf>,
    pub slots: u32,
    pub gpus: u32,
    /// Memory tasks may hold, in bytes (their `--mem` adds up to at most this).
    pub mem: u64,
    /// Named countable resources tasks may hold (`licenses=4`).
    pub named: Vec<(String, u32)>,
    /// Extra cpus' worth of tasks kept queued here so no slot waits a round trip.
    pub prefetch: u32,
    pub exec: ExecMode,
    pub hostname: String,
    /// The server directory, passed to tasks as `KESTREL_SERVER_DIR`.
    pub server_dir: Option<String>,
    /// How long to keep trying to reconnect after the connection drops.
    pub reconnect_for: Duration,
    /// Called each time the worker registers (first and after reconnecting); `None` for
    /// workers that should not announce themselves (those inside `kestrel run`).
    pub on_connect: Option<fn(&Connected<'_>)>,
}

impl WorkerConfig {
    /// A worker with `slots` slots, defaults elsewhere.
    pub fn new(slots: u32) -> WorkerConfig {
        WorkerConfig {
            access_file: None,
            slots,
            gpus: 0,
            mem: memory().unwrap_or(0),
            named: Vec::new(),
            prefetch: slots,
            exec: ExecMode::Process,
            hostname: hostname(),
            server_dir: None,
            reconnect_for: Duration::from_secs(120),
            on_connect: None,
        }
    }
}

impl WorkerConfig {
    /// Fresh bookkeeping of what this worker has.
    pub(crate) fn local(&self) -> local::Local {
        local::Local::new(self.slots, self.gpus, self.mem, &self.named)
    }
}

/// The memory this process may use: the machine's, or its cgroup's limit if lower.
pub fn memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)?;
    // cgroup v2: "max" or a number of bytes.
    let limit = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    Some(limit.map_or(total, |l| l.min(total)))
}

/// Why a worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Connect(#[from] ClientError),
    #[error("{0}")]
    Proto(#[from] ProtoError),
    #[error("{0}")]
    Setup(String),
    #[error("lost the server and could not reconnect within {0:?}: {1}")]
    GaveUp(Duration, String),
}

impl WorkerError {
    fn from_handshake(e: ProtoError) -> WorkerError {
        WorkerError::Proto(e)
    }

    /// Whether trying again later might help (the server may be restarting).
    fn is_transient(&self) -> bool {
        matches!(
            self,
            WorkerError::Connect(ClientError::Unreachable { .. } | ClientError::ConnectTimeout(_))
                | WorkerError::Proto(ProtoError::Io(_) | ProtoError::Closed)
        )
    }
}

/// The machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Runs a worker until the server tells it to stop, or the server stays unreachable for
/// `reconnect_for` after a drop. The first connection must succeed (a wrong address or secret
/// is reported at once).
pub async fn run(config: WorkerConfig, access: Access) -> Result<(), WorkerError> {
    let threads = match config.exec {
        ExecMode::Process => config.slots.max(1),
        ExecMode::Noop => 0,
    };
    let mut pool = if threads > 0 {
        Some(pool::Pool::new(threads)?)
    } else {
        None
    };
    let result = serve_until_done(&config, access, &mut pool).await;
    // Every task has ended by now: the executor threads are idle, and the reaper exits.
    if let Some(p) = pool {
        p.close();
    }
    result
}

/// Serves connection after connection until the server says stop or cannot be reached.
async fn serve_until_done(
    config: &WorkerConfig,
    access: Access,
    pool: &mut Option<pool::Pool>,
) -> Result<(), WorkerError> {
    let mut access = access;
    let mut carry = session::Carry::default();
    loop {
        let outcome = session::serve(config, &access, pool, &mut carry).await;
        let reason = match outcome {
            Ok(session::SessionEnd::Shutdown(reason)) => {
                tracing::info!("server asked the worker to stop: {reason}");
                return Ok(());
            }
            Ok(session::SessionEnd::Lost(reason)) => reason,
            // Once registered (a read or a write failed, the server may be restarting), try
            // again with the carried tasks; before, a failure is the user's to fix.
            Err(e) if carry.registered() && e.is_transient() => e.to_string(),
            Err(e) => {
                // Tasks carried over from an earlier connection run in their own process
                // groups: stop them rather than leave them behind.
                carry.abandon(pool).await;
                return Err(e);
            }
        };
        tracing::warn!(
            "connection to the server lost ({reason}); reconnecting; tasks keep running"
        );
        access = match reconnect(config, access, &reason).await {
            Ok(a) => a,
            Err(e) => {
                carry.abandon(pool).await;
                return Err(e);
            }
        };
    }
}

/// Waits with exponential backoff until the server (maybe restarted, with a new access file)
/// answers a TCP connect.
async fn reconnect(
    config: &WorkerConfig,
    mut access: Access,
    why: &str,
) -> Result<Access, WorkerError> {
    let deadline = Instant::now() + config.reconnect_for;
    let mut delay = Duration::from_millis(100);
    loop {
        if let Some(path) = &config.access_file {
            if let Ok(a) = Access::read(path) {
                access = a;
            }
        }
        if kestrel_proto::client::dial(&access).await.is_ok() {
            return Ok(access);
        }
        if Instant::now() >= deadline {
            return Err(WorkerError::GaveUp(config.reconnect_for, why.to_string()));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
