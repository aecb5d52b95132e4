//! Connections to the server that ride out a restart: every client command connects through
//! here, and while `--reconnect-for` lasts, a server that cannot be reached or goes away is
//! tried again (re-reading the access file, since a restarted server may listen elsewhere)
//! instead of failing the script or workflow that called the command.
//!
//! Without the option, a server that is not there at the start fails the command at once
//! (it was probably never started, or another directory was meant), while a server that goes
//! away during `job wait` or `submit` is waited for (it is probably being restarted).

use crate::args::Global;
use anyhow::{Context, Result};
use kestrel_client::{Connection, Notice, Reconnect, Target};
use kestrel_proto::{default_server_dir, Access, ACCESS_FILE};
use std::path::{Path, PathBuf};
use std::sync::PoisonError;
use std::time::Duration;

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

/// A connection for requests that may be sent again after a reconnect (queries, and changes
/// that do nothing twice: cancel, retry, forget, stop), and for submissions and waits, which
/// the client library makes safe to resend.
pub type Session = Connection;

/// Connects, trying again only if `--reconnect-for` was given; once connected, reconnects for
/// the `--reconnect-for` in force (`default` if none was given) whenever the server goes
/// away. Says on stderr what it does meanwhile.
pub async fn open(g: &Global, default: Duration) -> Result<Connection> {
    if let Some(dir) = finished_run(g) {
        return open_record(&dir).await;
    }
    let reconnect = Reconnect {
        at_start: reconnect_for(g, ONE_SHOT)?,
        after_loss: reconnect_for(g, default)?,
    };
    let target = Target::File(access_path(g));
    Ok(Connection::open_telling(target, reconnect, tell).await?)
}

/// The directory of a `kestrel run` that has ended, if the options point to one: it holds
/// the run's record (`run --server-dir`) and its server is gone.
fn finished_run(g: &Global) -> Option<PathBuf> {
    if g.access.is_some() {
        return None;
    }
    let dir = g.server_dir.clone().unwrap_or_else(default_server_dir);
    kestrel_server::record::has_ended_run(&dir).then_some(dir)
}

/// The server reading a finished run's record, kept for as long as this command runs.
static RECORD: std::sync::Mutex<Option<kestrel_server::RunningServer>> =
    std::sync::Mutex::new(None);

/// Reads the record of the run that ended in `dir` through a server of this process (see
/// `kestrel_server::record`); a request to change it is refused with a message saying why.
async fn open_record(dir: &Path) -> Result<Connection> {
    let server = kestrel_server::record::open(dir)
        .await
        .with_context(|| format!("cannot read the record of the run in {}", dir.display()))?;
    let access = server.access.clone();
    *RECORD.lock().unwrap_or_else(PoisonError::into_inner) = Some(server);
    Ok(Connection::open(Target::Fixed(access), Reconnect::NEVER).await?)
}

/// The global options a command needs to reach the same server as this one (`--server-dir
/// DIR `, `--access FILE `, or nothing for the default), for the commands that hints print.
pub fn reach(g: &Global) -> String {
    let quote = |p: &Path| {
        let p = p.display().to_string();
        shlex::try_quote(&p).map_or(p.clone(), |q| q.into_owned())
    };
    match (&g.access, &g.server_dir) {
        (Some(a), _) => format!("--access {} ", quote(a)),
        (None, Some(d)) => format!("--server-dir {} ", quote(d)),
        (None, None) => String::new(),
    }
}

/// Prints a connection's notice, above a progress display if one is shown.
fn tell(notice: &Notice<'_>) {
    crate::output::note(&notice.to_string());
}

/// The error for an answer of another kind than the request's: a server of another version.
pub fn unexpected() -> anyhow::Error {
    anyhow::anyhow!("the server sent an unexpected answer; use the same kestrel version for the server and this command")
}
