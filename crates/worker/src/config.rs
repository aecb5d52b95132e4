//! How to run a worker: what it offers and how it executes tasks.

use crate::cache::EvictionPolicy;
use crate::gpu::Gpu;
use crate::host::{hostname, memory};
use crate::{local, Connected};
use std::path::PathBuf;
use std::time::Duration;

/// How tasks are executed: a configuration value, mapped once per worker to an executor
/// (see `WorkerState::new`).
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
    /// The GPUs it hands to tasks (see [`crate::gpu`]).
    pub gpus: Vec<Gpu>,
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
    /// Its file cache (data diffusion); `None` gives it none, and it takes no task of a job
    /// that declares files.
    pub cache: Option<CacheConfig>,
    /// The allocation it runs in, if a pilot script started it.
    pub alloc: Option<u32>,
    /// When its allocation ends, in seconds since the epoch.
    pub ends_at_s: Option<u64>,
    /// What the process running it asks of it (SIGTERM: drain; again, or SIGINT: stop now);
    /// `None` for workers nothing asks (those inside `kestrel run`).
    pub stop: Option<tokio::sync::watch::Receiver<StopAsk>>,
    /// Called with the reason when the worker stops because the server told it to, or because
    /// it was asked to ([`StopAsk`]); `None` for workers that should not say so.
    pub on_stop: Option<fn(&str)>,
    /// The workers it may be one node of a multi-node task with (`--group`); `None`: those of
    /// its allocation, or those of none.
    pub group: Option<String>,
    /// The Python interpreter its runners call function tasks in (`--python`); `None`: it
    /// takes no function task.
    pub python: Option<PathBuf>,
}

/// What the process running a worker asks of it (see [`WorkerConfig::stop`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StopAsk {
    /// Run.
    #[default]
    Run,
    /// Take no new task, give back those not started, finish the running ones, then exit
    /// (the server says when): why, for the server's record.
    Drain(String),
    /// Kill the tasks (they go back to the queue without spending a retry) and exit now.
    Now(String),
}

/// Where and how big a worker's file cache is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// The cache directory; `None` is a fresh one in the temporary directory, removed when
    /// the worker ends (give a directory to keep the cache across restarts).
    pub dir: Option<PathBuf>,
    /// Bytes it may hold.
    pub capacity: u64,
    /// Which file leaves a full cache first.
    pub policy: EvictionPolicy,
    /// How many files it reads from stores at once, so that many workers do not stampede a
    /// shared store.
    pub store_readers: u32,
    /// Where it serves its cache to peers.
    pub peers: PeerListen,
}

/// Where a worker serves its cache to the other workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerListen {
    /// On the address it reaches the server from (the network its peers share), on a port
    /// the system picks.
    #[default]
    Auto,
    /// Not at all: peers fetch nothing from it (it still fetches from them).
    Off,
    /// On this address and port.
    At(std::net::SocketAddr),
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        CacheConfig {
            dir: None,
            capacity: 1 << 30,
            policy: EvictionPolicy::Lru,
            store_readers: 1,
            peers: PeerListen::Auto,
        }
    }
}

impl WorkerConfig {
    /// A worker with `slots` slots, defaults elsewhere.
    pub fn new(slots: u32) -> WorkerConfig {
        WorkerConfig {
            access_file: None,
            slots,
            gpus: Vec::new(),
            mem: memory().unwrap_or(0),
            named: Vec::new(),
            prefetch: slots,
            exec: ExecMode::Process,
            hostname: hostname(),
            server_dir: None,
            reconnect_for: Duration::from_secs(120),
            on_connect: None,
            cache: Some(CacheConfig::default()),
            alloc: None,
            ends_at_s: None,
            stop: None,
            on_stop: None,
            group: None,
            python: None,
        }
    }

    /// Fresh bookkeeping of what this worker has.
    pub(crate) fn local(&self) -> local::Local {
        local::Local::new(self.slots, &self.gpus, self.mem, &self.named)
    }
}
