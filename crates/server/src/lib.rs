//! Kestrel's server: the tokio driver around the scheduler core.
//!
//! - `start` locks the server directory, restores the [`journal`], binds the listener, writes
//!   the access file and starts the engine and the accept loop.
//! - `conn` accepts connections, runs the handshake and turns frames into the engine's inbound
//!   events; each connection decodes on its own task, so decoding scales with cores.
//! - `engine` owns the [`kestrel_core::Scheduler`], applies events in batches, runs one
//!   scheduling pass per batch and sends the resulting commands as coalesced frames (`outbox`).
//! - `views` renders scheduler state into the protocol's answers.
//! - `outputs` keeps the streamed output of tasks (`--stdout stream`), in the journal or in
//!   memory.
//! - `record` keeps a finished `kestrel run`'s journal readable: a read-only server of it.

mod clock;
mod config;
mod conn;
mod engine;
mod file_marks;
pub mod journal;
mod lock;
mod outbox;
mod outputs;
mod provision;
pub mod record;
mod start;
mod traffic;
mod views;

pub use clock::now_us;
pub use config::{ServerConfig, TlsConfig};
pub use conn::{HANDSHAKE_TIMEOUT, WRITE_TIMEOUT};
pub use lock::LockError;
pub use start::{start, RunningServer, StartError, StopHandle};
