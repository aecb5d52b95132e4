//! The journal: an embedded SQLite database in the server directory that makes the server's
//! state survive a crash.
//!
//! It records the accepted *inputs* of the scheduler, not its state: submissions, extensions,
//! cancels and batches of accepted task reports, appended to `log` as MessagePack bodies.
//! Replaying them in order into a fresh scheduler gives back every job and every recorded task
//! end (see core's `sched/restore.rs`). The engine writes everything one batch of events produced
//! in one transaction (group commit), so a million task ends cost a few hundred syncs, not a
//! million. WAL mode with `synchronous=FULL`: a committed transaction survives power loss.
//!
//! - `encoding`: entries as bytes ([`Pending`] gathers a batch's, encoded), and back.
//! - `store`: the SQLite file ([`Journal`]): open, `meta`, append a batch in one transaction,
//!   delete a forgotten job's rows (every row names its job) and give their room back.
//! - `replay`: reading the log back into the scheduler at start.
//! - `writer`: the thread that commits the engine's batches, off the engine's loop.

mod encoding;
mod replay;
mod store;
mod writer;

pub use encoding::Pending;
pub use replay::Restored;
pub(crate) use store::new_server_id;
pub use store::{CommitError, Journal, JournalError, Meta, JOURNAL_FILE};
pub use writer::{Done, Failed, Writer};
