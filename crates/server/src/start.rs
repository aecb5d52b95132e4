//! Start-up: lock the directory, restore the journal, bind, write the access file, and serve.

use crate::config::{ServerConfig, TlsConfig};
use crate::{conn, engine, journal, lock};
use kestrel_proto::{Access, ACCESS_FILE};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A started server.
pub struct RunningServer {
    /// What clients and workers need to connect (also written to `access_path`).
    pub access: Access,
    /// The access file, removed when the server stops.
    pub access_path: PathBuf,
    /// The address the listener is bound to.
    pub local_addr: SocketAddr,
    /// What the journal gave back at start (`None` without a journal or when it was empty),
    /// and how long the replay took.
    pub restored: Option<(journal::Restored, Duration)>,
    /// Held until the server is dropped, so no second server uses the directory (none for the
    /// reader of a run's record, which writes nothing there).
    _lock: Option<lock::DirLock>,
    /// Whether this server wrote `access_path` (and so removes it when it stops).
    wrote_access: bool,
    stop: mpsc::UnboundedSender<engine::Inbound>,
    done: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// Waits until the server stops (a `kestrel server stop`, or [`Self::stop`]).
    pub async fn wait(self) {
        let _ = self.done.await;
        if self.wrote_access {
            let _ = std::fs::remove_file(&self.access_path);
        }
    }

    /// A handle that can ask the server to stop from elsewhere.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stop.clone())
    }

    /// Asks the server to stop and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(engine::Inbound::Stop);
        self.wait().await;
    }
}

/// Asks a running server to stop (as `kestrel server stop` does).
#[derive(Clone)]
pub struct StopHandle(mpsc::UnboundedSender<engine::Inbound>);

impl StopHandle {
    /// Asks for the stop and returns at once (a stopped server ignores it).
    pub fn stop(&self) {
        let _ = self.0.send(engine::Inbound::Stop);
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot create server directory {path}: {err}")]
    Dir { path: PathBuf, err: std::io::Error },
    #[error("cannot listen on {addr}: {err}; pick another --host/--port")]
    Bind { addr: String, err: std::io::Error },
    #[error(transparent)]
    Access(#[from] kestrel_proto::AccessError),
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error("TLS: {0}")]
    Tls(#[from] kestrel_proto::tls::TlsError),
    #[error("{dir} holds the journal of a `kestrel server` (its jobs); `kestrel run` keeps a record of its own: give it another --server-dir, or submit to that server with `kestrel server start` and `kestrel submit`", dir = dir.display())]
    ServerJournal { dir: PathBuf },
}

/// Loads or makes the TLS certificate, and puts it into the access file for connectors to pin.
fn setup_tls(
    config: &ServerConfig,
    access: &mut Access,
) -> Result<Option<kestrel_proto::tls::TlsAcceptor>, StartError> {
    use kestrel_proto::tls::Identity;
    let identity = match &config.tls {
        None => return Ok(None),
        Some(TlsConfig::Files { cert, key }) => Identity::from_files(cert, key)?,
        Some(TlsConfig::SelfSigned) => {
            let names: Vec<String> = [
                config.advertise_host.as_str(),
                config.bind_host.as_str(),
                "localhost",
                "127.0.0.1",
            ]
            .iter()
            .filter(|h| !matches!(**h, "0.0.0.0" | "::" | ""))
            .map(|h| h.to_string())
            .collect();
            Identity::self_signed_in(&config.dir, &names)?
        }
    };
    let acceptor = identity.acceptor()?;
    access.tls_cert = Some(identity.cert_pem);
    Ok(Some(acceptor))
}

/// Locks the directory, restores the journal, binds, writes the access file and starts serving
/// on the current tokio runtime.
pub async fn start(config: ServerConfig) -> Result<RunningServer, StartError> {
    // Every connection is a descriptor: all the system allows, so that connections waiting
    // for their handshake (bounded) leave room for the workers and clients that proved the secret.
    if let Some((from, to)) = kestrel_proto::fds::raise_open_file_limit() {
        tracing::debug!("raised the open-file limit from {from} to {to}");
    }
    std::fs::create_dir_all(&config.dir).map_err(|err| StartError::Dir {
        path: config.dir.clone(),
        err,
    })?;
    let lock = lock::DirLock::acquire(&config.dir)?;
    if config.run_record {
        crate::record::prepare(&config.dir)?;
    }
    let journal = if config.journal {
        Some(journal::Journal::open(&config.dir, config.journal_limit)?)
    } else {
        None
    };
    let meta = match &journal {
        Some(j) => j.meta()?,
        None => journal::Meta::default(),
    };
    // The previous server's port first, so workers and clients holding the old address find us.
    let mut listener = None;
    if let (0, Some(port)) = (config.port, meta.port) {
        listener = TcpListener::bind(format!("{}:{port}", config.bind_host))
            .await
            .ok();
    }
    // A secret others can read is no secret: refuse before serving with it.
    kestrel_proto::check_existing(&config.dir.join(ACCESS_FILE))?;
    let addr = format!("{}:{}", config.bind_host, config.port);
    let listener = match listener {
        Some(l) => l,
        None => TcpListener::bind(&addr)
            .await
            .map_err(|err| StartError::Bind {
                addr: addr.clone(),
                err,
            })?,
    };
    let local_addr = listener
        .local_addr()
        .map_err(|err| StartError::Bind { addr, err })?;
    let mut access = Access::generate(config.advertise_host.clone(), local_addr.port());
    // The journal's secret, so access files handed out before stay valid; unless the user
    // rotates it, and then the journal keeps the new one (below) and the old one is gone.
    match meta.secret.filter(|s| !s.is_empty()) {
        Some(_) if config.new_secret => {
            tracing::warn!("a new secret (--new-secret): workers and clients holding an access file written before are refused until they read the new one");
        }
        Some(secret) => access.secret = secret,
        None => {}
    }
    let tls = setup_tls(&config, &mut access)?;
    let access_path = config.dir.join(ACCESS_FILE);
    let mut engine = engine::Engine::new(&config, &access);
    let mut restored = None;
    if let Some(mut j) = journal {
        j.set_access(&access.secret, local_addr.port())?;
        let t0 = std::time::Instant::now();
        let r = engine.attach_journal(j)?;
        if r.rows > 0 {
            tracing::info!(
                rows = r.rows,
                jobs = r.jobs,
                task_ends = r.task_ends,
                "restored from the journal in {:.2?}",
                t0.elapsed()
            );
            restored = Some((r, t0.elapsed()));
        }
    }
    access.write(&access_path)?;
    tracing::info!(address = %access.address(), dir = %config.dir.display(), "server listening");
    let placed = Some((lock, access_path));
    let mut server = serve(engine, listener, access, tls, config.timeouts(), placed);
    server.restored = restored;
    Ok(server)
}

/// Serves `engine` on `listener`: starts the accept loop and the engine on the current tokio
/// runtime. `placed` is the directory's lock and the access file written there, if any.
pub(crate) fn serve(
    engine: engine::Engine,
    listener: TcpListener,
    access: Access,
    tls: Option<kestrel_proto::tls::TlsAcceptor>,
    timeouts: conn::Timeouts,
    placed: Option<(lock::DirLock, PathBuf)>,
) -> RunningServer {
    let (tx, rx) = mpsc::unbounded_channel();
    let local_addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], access.port)));
    let accept = tokio::spawn(conn::accept_loop(
        listener,
        access.secret_bytes(),
        tls,
        timeouts,
        engine.traffic(),
        tx.clone(),
    ));
    let done = tokio::spawn(async move {
        engine.run(rx).await;
        accept.abort();
    });
    let (lock, access_path) = match placed {
        Some((lock, path)) => (Some(lock), Some(path)),
        None => (None, None),
    };
    RunningServer {
        access,
        wrote_access: access_path.is_some(),
        access_path: access_path.unwrap_or_default(),
        local_addr,
        restored: None,
        _lock: lock,
        stop: tx,
        done,
    }
}
