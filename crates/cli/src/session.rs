//! Connections to the server that ride out a restart: every client command connects through
//! here, and while `--reconnect-for` lasts, a server that cannot be reached or goes away is
//! tried again (re-reading the access file, since a restarted server may listen elsewhere)
//! instead of failing the script or workflow that called the command.
//!
//! Without the option, a server that is not there at the start fails the command at once
//! (it was probably never started, or another directory was meant), while a server that goes
//! away during `job wait` or `submit` is waited for (it is probably being restarted).

use crate::args::Global;
use crate::exit::{self, Unreachable};
use anyhow::{Context, Result};
use kestrel_proto::messages::{Answer, Ask};
use kestrel_proto::{default_server_dir, Access, Client, ACCESS_FILE};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `--reconnect-for` of the commands that only ask or change something once, and of every
/// command's first connection.
pub const ONE_SHOT: Duration = Duration::ZERO;
/// `--reconnect-for` of the commands that follow jobs to their end (`job wait`, `submit --wait`).
pub const WAITING: Duration = Duration::from_secs(5 * 60);
/// `--reconnect-for` of `worker start`.
pub const WORKER: Duration = Duration::from_secs(2 * 60);

/// The `--reconnect-for` in force: the option (or `KESTREL_RECONNECT_FOR`), else `default`.
pub fn reconnect_for(g: &Global, default: Duration) -> Result<Duration> {
    match g.reconnect_for.as_deref().map(str::trim) {
        None => Ok(default),
        Some("0") => Ok(Duration::ZERO),
        Some(s) => crate::jobs::parse_duration(s).context("--reconnect-for"),
    }
}

/// The access file the global options point to.
pub fn access_path(g: &Global) -> PathBuf {
    match &g.access {
        Some(a) => a.clone(),
        None => g
            .server_dir
            .clone()
            .unwrap_or_else(default_server_dir)
            .join(ACCESS_FILE),
    }
}

pub fn read_access(g: &Global) -> Result<Access> {
    Ok(Access::read(&access_path(g))?)
}

/// One attempt: read the access file and connect (errors keep their type for the exit status).
async fn connect_once(g: &Global) -> Result<Client> {
    let access = read_access(g)?;
    Ok(Client::connect(&access).await?)
}

/// Whether an error means the server is not there (worth trying again).
pub fn unreachable(e: &anyhow::Error) -> bool {
    exit::code_of(e) == exit::UNREACHABLE
}

/// Connects, trying again for up to `within` while the server cannot be reached.
pub async fn connect(g: &Global, within: Duration) -> Result<Client> {
    match connect_once(g).await {
        Err(e) if unreachable(&e) && !within.is_zero() => {
            eprintln!(
                "{e:#} (trying again for up to {})",
                humantime::format_duration(within)
            );
            retry(g, within).await
        }
        done => done,
    }
}

/// Reconnects after the server went away (`cause`), trying for up to `within`; with `within`
/// zero, fails at once with `cause`.
pub async fn reconnect(g: &Global, within: Duration, cause: anyhow::Error) -> Result<Client> {
    if within.is_zero() {
        return Err(cause);
    }
    eprintln!(
        "lost the server ({cause:#}); reconnecting for up to {}",
        humantime::format_duration(within)
    );
    retry(g, within).await
}

/// Tries to connect with backoff until `within` has passed.
async fn retry(g: &Global, within: Duration) -> Result<Client> {
    let deadline = Instant::now() + within;
    let mut delay = Duration::from_millis(100);
    loop {
        tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
        delay = (delay * 2).min(Duration::from_secs(2));
        match connect_once(g).await {
            Ok(c) => {
                eprintln!("reconnected to the server");
                return Ok(c);
            }
            Err(e) if !unreachable(&e) => return Err(e),
            Err(e) if Instant::now() >= deadline => {
                return Err(Unreachable(format!(
                    "could not reach the server within {} (last try: {e:#}); check it with `kestrel server info`, start it with `kestrel server start` if it is down, then run this command again",
                    humantime::format_duration(within)
                ))
                .into())
            }
            Err(_) => {}
        }
    }
}

/// A connection for requests that may be sent again after a reconnect (queries, and changes
/// that do nothing twice: cancel, retry, forget, stop).
pub struct Session<'g> {
    g: &'g Global,
    within: Duration,
    client: Client,
}

impl<'g> Session<'g> {
    /// Connects, then reconnects for the `--reconnect-for` in force (`default` if none was
    /// given) whenever the server goes away.
    pub async fn open(g: &'g Global, default: Duration) -> Result<Session<'g>> {
        let client = connect(g, reconnect_for(g, ONE_SHOT)?).await?;
        let within = reconnect_for(g, default)?;
        Ok(Session { g, within, client })
    }

    /// Asks, reconnecting and asking again if the server goes away meanwhile.
    pub async fn call(&mut self, ask: Ask) -> Result<Answer> {
        loop {
            match self.client.call(ask.clone()).await {
                Ok(a) => return Ok(a),
                Err(e) if exit::lost_or_unreachable(&e) => {
                    self.client = reconnect(self.g, self.within, e.into()).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The error for an answer of another kind than the request's: a server of another version.
pub fn unexpected() -> anyhow::Error {
    anyhow::anyhow!("the server sent an unexpected answer; use the same kestrel version for the server and this command")
}
