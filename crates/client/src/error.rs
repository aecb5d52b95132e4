//! What a client call can fail with.

use kestrel_core::JobId;
use kestrel_proto::{AccessError, ClientError, ProtoError};

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The access file is missing or unreadable.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// The connection or the server said no.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The server could not be reached within the time given for reconnecting.
    #[error("{0}")]
    GaveUp(String),
    /// A submission was refused (the message says why).
    #[error("submission refused: {0}")]
    Refused(ClientError),
    /// A submission of several jobs was refused at job `at` (counted from 0), after the
    /// jobs before it were taken: the caller withdraws them (see `kestrel submit --file`).
    #[error("job #{} refused: {source}", at + 1)]
    RefusedAfter {
        /// The jobs the server took before the refusal.
        submitted: Vec<JobId>,
        /// The position of the refused one.
        at: usize,
        /// Why it was refused.
        source: ClientError,
    },
    /// Adding the pieces of a job failed halfway: the job holds only part of its tasks.
    #[error("adding tasks to job {job} (it holds only part of them: cancel it with `kestrel job cancel {job}` and submit again): {cause}")]
    Partial {
        /// The job left with part of its tasks.
        job: JobId,
        /// Why the next piece was not taken (not named `source`: the message holds it
        /// already, and a chain of causes would say it twice).
        cause: ClientError,
    },
    /// The server speaks a protocol too old for what was asked.
    #[error("{0}")]
    TooOld(String),
    /// The server answered a request with an answer of another kind.
    #[error("the server sent an unexpected answer ({0}); use the same kestrel version for the server and this client")]
    Unexpected(String),
}

impl Error {
    /// Whether the server is not there, or went away: worth trying again while a
    /// reconnection window lasts.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::Client(c) | Error::Partial { cause: c, .. } => lost_or_unreachable(c),
            Error::Access(a) => no_server_there(a),
            Error::GaveUp(_) => true,
            Error::Refused(_)
            | Error::RefusedAfter { .. }
            | Error::Unexpected(_)
            | Error::TooOld(_) => false,
        }
    }

    /// Whether the request named a job, task or worker the server does not have.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Error::Client(ClientError::NotFound(_))
                | Error::Partial {
                    cause: ClientError::NotFound(_),
                    ..
                }
        )
    }
}

/// Whether an access file's trouble means no server is there (none was started, or it is
/// being written): worth trying again, unlike a file that is there but wrong.
pub fn no_server_there(a: &AccessError) -> bool {
    matches!(
        a,
        AccessError::Missing(_) | AccessError::Unreadable { .. } | AccessError::Malformed { .. }
    )
}

/// Whether a connection error means the server is not there or went away: worth trying
/// again while a reconnection window lasts.
pub fn lost_or_unreachable(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Unreachable { .. }
            | ClientError::ConnectTimeout(_)
            | ClientError::Proto(ProtoError::Io(_) | ProtoError::Closed | ProtoError::Timeout(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_submission_is_classified_by_what_stopped_it() {
        let gone = Error::Partial {
            job: 4,
            cause: ClientError::NotFound("job 4 does not exist".into()),
        };
        assert!(gone.is_not_found() && !gone.is_unreachable());
        let lost = Error::Partial {
            job: 4,
            cause: ClientError::Proto(ProtoError::Closed),
        };
        assert!(lost.is_unreachable() && !lost.is_not_found());
        let refused = Error::Refused(ClientError::Server("no".into()));
        assert!(!refused.is_unreachable() && !refused.is_not_found());
    }

    #[test]
    fn a_partial_submission_says_why_once() {
        let e = Error::Partial {
            job: 3,
            cause: ClientError::Server("the journal reached its limit".into()),
        };
        // The message holds the cause; a cause chain as well would print it twice
        // (`error: ...: the journal reached its limit: the journal reached its limit`).
        assert!(std::error::Error::source(&e).is_none());
        assert_eq!(e.to_string().matches("reached its limit").count(), 1, "{e}");
    }
}
