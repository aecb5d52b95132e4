//! Kestrel's worker: connects out to the server, runs assigned tasks on its slots, reports.
//!
//! - [`exec`] runs one task as a process in its own process group (spawn, wait, timeout, kill).
//! - [`capture`] reads a task's streamed stdout/stderr from a pipe while `exec` waits.
//! - [`local`] keeps templates, the local queue and free resources, and builds launches.
//! - [`reaper`] is a process that kills the worker's tasks if the worker dies.
//! - `executor` is the `Executor` trait, the seam between a session and the way tasks run,
//!   and its no-op implementation (benchmarks); `pool` is the other: the executor threads,
//!   one per slot, and the deck of tasks ready to follow a running task of the same job on
//!   the thread that ends it.
//! - `ledger` is the worker's account of its tasks (queued, running, ended but not reported),
//!   which the session reports and the executor starts tasks from.
//! - `staging` is the step between "assigned" and "queued for a slot", where input files
//!   will be fetched.
//! - `state` is what outlives connections (`WorkerState`: the executor, staging, the carry);
//!   `session` is one connection's life; [`run`] reconnects with backoff when it drops, and
//!   running tasks survive the drop: the next registration hands them and their results over.
//! - [`connected`] describes each registration, for a caller that wants to tell its user.
//! - `config`, `error` and `host` hold [`WorkerConfig`], [`WorkerError`], and what the worker
//!   reads about its machine ([`hostname`], [`memory`]); [`gpu`] finds its GPUs and sets the
//!   variables that give a task those it holds.

pub mod cache;
pub mod capture;
mod config;
pub mod connected;
mod error;
pub mod exec;
mod executor;
pub mod files;
pub mod gpu;
mod host;
mod ledger;
pub mod local;
mod outputs;
pub mod peer;
mod pool;
mod prefetch;
pub mod reaper;
mod runner;
mod sandbox;
mod session;
mod sinks;
mod staging;
mod state;
pub mod store;
pub mod values;

pub use config::{CacheConfig, ExecMode, PeerListen, StopAsk, WorkerConfig};
pub use connected::{Connected, Handover};
pub use error::WorkerError;
pub use host::{hostname, memory};
pub use runner::{probe as probe_python, RunnerInfo};

use kestrel_proto::Access;
use state::WorkerState;
use std::time::{Duration, Instant};

/// Runs a worker until the server tells it to stop, or the server stays unreachable for
/// `reconnect_for` after a drop. The first connection must succeed (a wrong address or secret
/// is reported at once).
pub async fn run(config: WorkerConfig, access: Access) -> Result<(), WorkerError> {
    // Tasks and peer connections draw on the same descriptors: all the system allows.
    if let Some((from, to)) = kestrel_proto::fds::raise_open_file_limit() {
        tracing::debug!("raised the open-file limit from {from} to {to}");
    }
    // Starting the executor blocks (its threads, and waiting for the reaper to be ready): off
    // the async threads, which an embedded server shares in `kestrel run`.
    let setup = config.clone();
    let mut state = tokio::task::spawn_blocking(move || WorkerState::new(&setup))
        .await
        .map_err(|e| WorkerError::Setup(format!("the worker's set-up failed: {e}")))??;
    let peer_server = serve_peers(&config, &access, state.carry.ledger.files.clone()).await;
    let result = serve_until_done(&config, access, &mut state).await;
    if let Some(server) = peer_server {
        server.abort();
    }
    // Every task has ended by now.
    state.close();
    result
}

/// Starts serving the worker's cache to its peers, where its configuration says (see
/// [`PeerListen`]); a worker that cannot still runs tasks, and peers fetch nothing from it.
async fn serve_peers(
    config: &WorkerConfig,
    access: &Access,
    files: Option<files::SharedFiles>,
) -> Option<tokio::task::JoinHandle<()>> {
    let files = files?;
    let listen = config.cache.as_ref()?.peers;
    if listen == PeerListen::Off {
        return None;
    }
    // The address peers reach this worker at: the one it reaches the server from.
    let toward = local_ip_toward(access).await;
    let addr = match (listen, &toward) {
        (PeerListen::At(addr), _) => addr,
        (_, Ok(ip)) => std::net::SocketAddr::new(*ip, 0),
        (_, Err(e)) => {
            tracing::warn!("cannot tell which address peers reach this worker at ({e}); its cache is not served to them (give one with --peer-listen)");
            return None;
        }
    };
    match tokio::net::TcpListener::bind(addr)
        .await
        .and_then(|l| peer::serve(files, l, toward.ok()))
    {
        Ok(serving) => Some(tokio::spawn(async move {
            if let Err(e) = serving.await {
                tracing::warn!("serving the cache to peers stopped: {e}");
            }
        })),
        Err(e) => {
            tracing::warn!("cannot serve the cache to peers at {addr}: {e}; peers will read from the store instead (give another address with --peer-listen)");
            None
        }
    }
}

/// The local address this machine reaches the server from: the interface its peers, which
/// reach the same server, most likely reach it on.
async fn local_ip_toward(access: &Access) -> std::io::Result<std::net::IpAddr> {
    let server = tokio::net::lookup_host(access.address())
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other("the server's name resolves to nothing"))?;
    let unspecified: std::net::SocketAddr = if server.is_ipv6() {
        "[::]:0".parse().expect("a literal address")
    } else {
        "0.0.0.0:0".parse().expect("a literal address")
    };
    // Connecting a UDP socket sends nothing: it only asks the kernel for the route.
    let probe = tokio::net::UdpSocket::bind(unspecified).await?;
    probe.connect(server).await?;
    Ok(probe.local_addr()?.ip())
}

/// A session shorter than this counts as ended at once (see [`serve_until_done`]).
const QUICK_END: Duration = Duration::from_secs(2);

/// Serves connection after connection until the server says stop or cannot be reached.
async fn serve_until_done(
    config: &WorkerConfig,
    access: Access,
    state: &mut WorkerState,
) -> Result<(), WorkerError> {
    let mut access = access;
    // A session that ends within moments of its start (a server flooded with handshakes
    // closes new connections at once) is tried again after a pause that grows with each such
    // end, not at once; and a worker that never registers gives up after --reconnect-for in
    // all, however often it reached the server.
    let first_try = Instant::now();
    let mut pause = Duration::ZERO;
    loop {
        let started = Instant::now();
        let outcome = session::serve(config, &access, state).await;
        let reason = match outcome {
            Ok(session::SessionEnd::Shutdown(reason)) => {
                tracing::info!("server asked the worker to stop: {reason}");
                if let Some(say) = config.on_stop {
                    say(&reason);
                }
                return Ok(());
            }
            Ok(session::SessionEnd::Stopped(reason)) => {
                tracing::info!("the worker stopped at once: {reason}");
                if let Some(say) = config.on_stop {
                    say(&reason);
                }
                return Ok(());
            }
            Ok(session::SessionEnd::Lost(reason)) => reason,
            // Once registered (a read or a write failed, the server may be restarting), try
            // again with the carried tasks. So does an allocation's worker that has not reached
            // its server yet: the server may be restarting, and a worker that gave up at once
            // would waste the allocation. Otherwise a failure is the user's to fix.
            Err(e) if (state.carry.registered() || config.alloc.is_some()) && e.is_transient() => {
                e.to_string()
            }
            Err(e) => {
                // Tasks carried over from an earlier connection run in their own process
                // groups: stop them rather than leave them behind.
                state.abandon().await;
                return Err(e);
            }
        };
        if !state.carry.registered() && first_try.elapsed() >= config.reconnect_for {
            state.abandon().await;
            return Err(WorkerError::GaveUp(config.reconnect_for, reason));
        }
        // Draining with nothing left to hand over, it has no reason to wait for a server.
        let idle = state.carry.ledger.running.is_empty() && state.carry.ledger.finished.is_empty();
        if leaves_drained(config, idle) {
            return Ok(());
        }
        // Said once for a run of quick ends, not at every try.
        let say = pause.is_zero();
        if started.elapsed() < QUICK_END {
            pause = (pause * 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
            tokio::time::sleep(pause).await;
        } else {
            pause = Duration::ZERO;
        }
        let registered = state.carry.registered();
        if say && registered {
            tracing::warn!(
                "connection to the server lost ({reason}); reconnecting; tasks keep running"
            );
        } else if say {
            tracing::warn!(
                "cannot reach the server yet ({reason}); trying again for up to {} s",
                config.reconnect_for.as_secs()
            );
        }
        access = match reconnect(config, access, &reason, idle).await {
            Ok(a) => a,
            Err(e) => {
                state.abandon().await;
                return Err(e);
            }
        };
        if leaves_drained(config, idle) {
            return Ok(());
        }
        if let Some(why) = stop_now_asked(config) {
            // No server to tell: the tasks stop here, and are lost to it (it re-queues them).
            state.abandon().await;
            if let Some(say) = config.on_stop {
                say(&why);
            }
            return Ok(());
        }
    }
}

/// Why the worker is to stop at once, if it is asked to ([`StopAsk::Now`]).
fn stop_now_asked(config: &WorkerConfig) -> Option<String> {
    match &*config.stop.as_ref()?.borrow() {
        StopAsk::Now(why) => Some(why.clone()),
        _ => None,
    }
}

/// Whether a worker that drains (and is `idle`: it runs nothing and holds no result) leaves
/// now, said as a stop: without a server it has nothing to wait for.
fn leaves_drained(config: &WorkerConfig, idle: bool) -> bool {
    let Some(why) = drain_asked(config).filter(|_| idle) else {
        return false;
    };
    if let Some(say) = config.on_stop {
        say(&why);
    }
    true
}

/// Why the worker is to drain ([`StopAsk::Drain`]), if it is asked to.
pub(crate) fn drain_asked(config: &WorkerConfig) -> Option<String> {
    match &*config.stop.as_ref()?.borrow() {
        StopAsk::Drain(why) => Some(why.clone()),
        _ => None,
    }
}

/// Waits with exponential backoff until the server (maybe restarted, with a new access file)
/// answers a TCP connect, or the worker is asked to stop at once, or (`idle`: it runs nothing
/// and holds no result) to drain.
async fn reconnect(
    config: &WorkerConfig,
    mut access: Access,
    why: &str,
    idle: bool,
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
        if stop_now_asked(config).is_some() || (idle && drain_asked(config).is_some()) {
            return Ok(access);
        }
        // Only a new ask wakes it early (a drain asked before keeps it trying).
        let mut stop = config.stop.clone();
        if let Some(rx) = &mut stop {
            rx.borrow_and_update();
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = session::stop_asked(&mut stop) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
