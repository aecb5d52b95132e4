//! Kestrel's client library: what every client of a server needs, so the `kestrel` command,
//! the Python SDK, a relay and the allocator's pilots share one implementation.
//!
//! - [`Connection`] is a connection that rides out a server restart: requests that may be
//!   sent twice (queries, cancel, retry, forget) are sent again on a new connection, and the
//!   access file is read again, since a restarted server may listen elsewhere.
//! - [`Connection::submit`] sends jobs with idempotency keys ([`keyed`]), lists too big for
//!   one message in pieces, and after a lost connection goes on where it stopped: a retried
//!   submission never adds a task twice.
//! - [`Connection::wait`] follows jobs to their end, through restarts.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kestrel_client::Error> {
//! use kestrel_client::{keyed, Connection, Reconnect, Submission, Target};
//! use kestrel_core::{IdRanges, JobSpec, TaskSet};
//! use std::time::Duration;
//!
//! let target = Target::file("/home/me/.kestrel/server/access.json");
//! let mut conn = Connection::open(target, Reconnect::for_waiting()).await?;
//! let sub = Submission::new(
//!     JobSpec::command("sweep", vec!["./sim".into(), "{task}".into()]),
//!     TaskSet::Array(IdRanges::span(1, 1000)),
//! );
//! let jobs = conn.submit(&keyed(vec![sub], None)).await?;
//! let done = conn.wait(jobs.iter().map(|j| j.job).collect(), Duration::from_secs(1), |_| {}).await?;
//! println!("{} finished", done.counts.finished);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod connection;
mod error;
mod pieces;
mod submit;

pub use connection::{Connection, Notice, Notify, Reconnect, Target};
pub use error::{lost_or_unreachable, no_server_there, Error};
pub use pieces::{argv_bytes, piece_ranges, string_bytes};
pub use submit::{keyed, Keyed, Submission, Submitted, PIECE_BYTES};
