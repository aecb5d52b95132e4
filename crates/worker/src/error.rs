//! Why a worker stopped.

use kestrel_proto::{ClientError, ProtoError};
use std::time::Duration;

/// Why a worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Connect(#[from] ClientError),
    /// Transparent: shown once, not again as its own cause (`error: X: X`).
    #[error(transparent)]
    Proto(#[from] ProtoError),
    #[error("{0}")]
    Setup(String),
    #[error("could not reach the server within {0:?}: {1}")]
    GaveUp(Duration, String),
}

impl WorkerError {
    /// Whether trying again later might help (the server may be restarting).
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            WorkerError::Connect(ClientError::Unreachable { .. } | ClientError::ConnectTimeout(_))
                | WorkerError::Proto(ProtoError::Io(_) | ProtoError::Closed)
        )
    }
}
