//! Kestrel's wire protocol, shared by every process.
//!
//! - [`frame`]: length-delimited MessagePack frames with a size limit.
//! - [`auth`]: the versioned handshake with challenge–response on the shared secret.
//! - [`messages`]: what workers, clients and the server say to each other, in batches.
//! - [`wire`]: the wire form of core's types (core itself has no serde).
//! - [`client`]: a client connection for the CLI, tests and tools.
//! - [`access`]: the access file that tells a worker or client where the server is.
//! - [`tls`]: optional TLS, with the server's certificate pinned through the access file.
//! - [`gate`]: admission of connections that have not proven the secret, by source address.
//! - [`fds`]: the limit on open files, raised at start.

pub mod access;
pub mod auth;
pub mod client;
pub mod fds;
pub mod frame;
pub mod gate;
pub mod messages;
pub mod tls;
pub mod wire;

pub use access::{check_existing, default_server_dir, Access, AccessError, ACCESS_FILE};
pub use auth::{
    accept_handshake, connect_handshake, connect_handshake_speaking, negotiate, Handshake, Role,
    ALLOC_VERSION, FILES_VERSION, FUNCTIONS_VERSION, GRAPH_VERSION, NODES_VERSION,
    OLDEST_PROTOCOL_VERSION, OUTPUT_FILES_VERSION, PROTOCOL_VERSION, SPOKEN_VERSIONS,
    TASK_DEPS_VERSION, VALUES_VERSION, WAITING_FOR_VERSION, WATCH_VERSION, WORKERS_VERSION,
};
pub use client::{Client, ClientError};
pub use frame::{decode, encode, FrameReader, FrameWriter, ProtoError, MAX_FRAME_BYTES};
pub use tls::{ConnRead, ConnWrite};
