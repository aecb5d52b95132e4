//! The bytes that go through the server: counted by the connections, read by the engine for
//! `server info`, so that data moved worker to worker (values, intermediate files) can be
//! told from data moved through the server.

use kestrel_proto::messages::Traffic;
use kestrel_proto::Role;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes through the server's authenticated connections, frames whole with their length
/// prefixes (handshakes are not counted): what `server info` reports as the server's traffic,
/// so that data moved worker to worker can be told from data moved through the server.
#[derive(Debug, Default)]
pub struct TrafficCounters {
    from_clients: AtomicU64,
    to_clients: AtomicU64,
    from_workers: AtomicU64,
    to_workers: AtomicU64,
}

impl TrafficCounters {
    /// The counts so far.
    pub fn snapshot(&self) -> Traffic {
        Traffic {
            from_clients: self.from_clients.load(Ordering::Relaxed),
            to_clients: self.to_clients.load(Ordering::Relaxed),
            from_workers: self.from_workers.load(Ordering::Relaxed),
            to_workers: self.to_workers.load(Ordering::Relaxed),
        }
    }

    /// A frame of `body` bytes came from a peer of `role`.
    pub(crate) fn came(&self, role: Role, body: usize) {
        let counter = match role {
            Role::Client => &self.from_clients,
            Role::Worker => &self.from_workers,
        };
        counter.fetch_add(framed(body), Ordering::Relaxed);
    }

    /// `frames` frames of `bodies` bytes in all went to a peer of `role`.
    pub(crate) fn went(&self, role: Role, bodies: usize, frames: usize) {
        let counter = match role {
            Role::Client => &self.to_clients,
            Role::Worker => &self.to_workers,
        };
        counter.fetch_add(bodies as u64 + 4 * frames as u64, Ordering::Relaxed);
    }
}

/// The bytes of a frame of `body` bytes on the wire, its length prefix included.
fn framed(body: usize) -> u64 {
    body as u64 + 4
}
