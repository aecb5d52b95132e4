//! The exit statuses of `kestrel`, one per kind of outcome a script must tell apart. Listed in
//! `kestrel --help`, the README and docs/json.md; they follow grep's convention (0 yes, 1 no,
//! 2 trouble) with two kinds of trouble of their own that a workflow manager reacts to
//! differently: a job it asks about does not exist (3), or the server cannot be reached (4).

use kestrel_proto::messages::{Refusal, RefusalKind};
use kestrel_proto::{AccessError, ClientError};
use std::process::ExitCode;

// 0: everything asked for was done (`ExitCode::SUCCESS`).
/// The jobs ended, and some task failed or was canceled (`run`, `submit --wait`, `job wait`).
pub const TASKS_FAILED: u8 = 1;
/// Bad arguments (clap's usage errors use 2 too), or a request the server refused.
pub const ERROR: u8 = 2;
/// A job, task or worker id the server does not have.
pub const NOT_FOUND: u8 = 3;
/// No access file, nobody listening, or the server went away and did not come back within
/// `--reconnect-for`.
pub const UNREACHABLE: u8 = 4;

/// A signal that ended a command before its work ended: Ctrl-C (SIGINT) or SIGTERM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Interrupt,
    Terminate,
}

impl Stop {
    /// The status a shell gives a command this signal ended: 128 + the signal's number.
    pub fn code(self) -> ExitCode {
        ExitCode::from(match self {
            Stop::Interrupt => 130,
            Stop::Terminate => 143,
        })
    }

    /// How the signal is said to the user.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Interrupt => "interrupted",
            Stop::Terminate => "terminated",
        }
    }
}

/// Ends at the first SIGINT or SIGTERM, saying which. Waiting for it keeps the process from
/// dying of it where it stands, so that the command can say or clean up what it must.
pub async fn stopped() -> Stop {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let terminated = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Stop::Interrupt,
        _ = terminated => Stop::Terminate,
    }
}

/// Some id a command named does not exist; what to print was printed already.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotFound(pub String);

/// The exit status for an error, from its type (never from its text).
pub fn code_of(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.is::<NotFound>() {
            return NOT_FOUND;
        }
        if let Some(e) = cause.downcast_ref::<kestrel_client::Error>() {
            return client_code(e);
        }
        if let Some(c) = cause.downcast_ref::<ClientError>() {
            return connection_code(c);
        }
        if let Some(a) = cause.downcast_ref::<AccessError>() {
            return access_code(a);
        }
    }
    ERROR
}

/// The exit status of a client library error, as the library classifies it.
fn client_code(e: &kestrel_client::Error) -> u8 {
    if e.is_not_found() {
        NOT_FOUND
    } else if e.is_unreachable() {
        UNREACHABLE
    } else {
        ERROR
    }
}

/// The exit status of a connection's error: the server is not there (or went away), or it
/// does not have what was named, or it said no.
fn connection_code(c: &ClientError) -> u8 {
    match c {
        ClientError::NotFound(_) => NOT_FOUND,
        c if kestrel_client::lost_or_unreachable(c) => UNREACHABLE,
        _ => ERROR,
    }
}

/// An access file that is missing or unreadable means no server is there.
fn access_code(a: &AccessError) -> u8 {
    if kestrel_client::no_server_there(a) {
        UNREACHABLE
    } else {
        ERROR
    }
}

/// An exit status as the process returns it.
pub fn code(status: u8) -> ExitCode {
    ExitCode::from(status)
}

/// Prints each refusal of a command on several jobs as one `error:` line; returns the exit
/// status they call for: 3 if some job did not exist, else 2 (`None` if nothing was refused).
pub fn refused_jobs<'a>(refusals: impl Iterator<Item = &'a Refusal>) -> Option<u8> {
    let mut status = None;
    for r in refusals {
        eprintln!("error: {}", crate::output::clean(&r.to_string()));
        let code = match r.kind {
            RefusalKind::NotFound => NOT_FOUND,
            RefusalKind::Refused => ERROR,
        };
        status = Some(status.map_or(code, |s: u8| s.max(code)));
    }
    status
}
