//! Admission of connections that have not proven the secret yet, shared by the server's port
//! and a worker's peer port, so that no one without the secret can fill either.
//!
//! A [`Gate`] counts the connections it let in: all of them against `total`, those not proven
//! yet against `unproven` and, by source (an IPv4 address, or an IPv6 /64, which one host
//! usually holds whole), against `per_source`. A newcomer over a bound of its own source is
//! refused. One that finds the unproven (or all) places taken makes room by closing the
//! oldest unproven connection of the source holding the most, if that source holds more than
//! the newcomer's: a flood from one address (or a few) then costs its own connections, never
//! those of another address, and a connection that proves itself at once (a real worker or
//! client, within milliseconds) is not the oldest of anything for long.
//!
//! A connection holds its [`Pass`] for its life; [`Pass::prove`] takes it out of the unproven
//! count (it still counts against `total`), and [`Evicted::wait`] ends when the gate closed
//! it to make room.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::oneshot;

/// The bounds of a [`Gate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections in all, proven or not.
    pub total: usize,
    /// Connections that have not proven the secret yet.
    pub unproven: usize,
    /// Unproven connections from one source.
    pub per_source: usize,
}

/// Where connections come from, for [`Limits::per_source`].
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Why a connection was not let in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{held} connections from {from} are already waiting to prove the secret (the most one address may hold); closed at once")]
    Source { from: IpAddr, held: usize },
    #[error("{held} connections are already waiting to prove the secret, none from an address holding more than this one's; closed at once")]
    Unproven { held: usize },
    #[error("{held} connections are open, every one proven; closed at once")]
    Total { held: usize },
}

#[derive(Debug)]
struct Entry {
    source: IpAddr,
    proven: bool,
    /// Told when the gate closes the connection to make room.
    evict: Option<oneshot::Sender<()>>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    conns: HashMap<u64, Entry>,
    /// Unproven connections by source, oldest first.
    waiting: HashMap<IpAddr, VecDeque<u64>>,
    unproven: usize,
}

impl Inner {
    fn unwait(&mut self, source: IpAddr, id: u64) {
        if let Some(q) = self.waiting.get_mut(&source) {
            q.retain(|&i| i != id);
            if q.is_empty() {
                self.waiting.remove(&source);
            }
        }
        self.unproven -= 1;
    }

    /// Closes the oldest unproven connection of the source holding the most, if it holds more
    /// than `than`; whether it did.
    fn evict_from_largest(&mut self, than: usize) -> bool {
        let victim = self
            .waiting
            .iter()
            .filter_map(|(source, q)| Some((q.len(), std::cmp::Reverse(*q.front()?), *source)))
            .max();
        let Some((held, std::cmp::Reverse(id), source)) = victim else {
            return false;
        };
        if held <= than {
            return false;
        }
        self.unwait(source, id);
        if let Some(mut e) = self.conns.remove(&id) {
            if let Some(tx) = e.evict.take() {
                let _ = tx.send(());
            }
        }
        true
    }
}

/// The connections a port let in; see the module's documentation.
#[derive(Debug, Clone)]
pub struct Gate {
    limits: Limits,
    inner: Arc<Mutex<Inner>>,
}

/// A connection's place in its [`Gate`], given back when dropped.
#[derive(Debug)]
pub struct Pass {
    inner: Arc<Mutex<Inner>>,
    id: u64,
    /// Half the unproven places or more were taken when it came in (itself included).
    pub crowded: bool,
}

/// Ends when the gate closes its connection to make room.
#[derive(Debug)]
pub struct Evicted(oneshot::Receiver<()>);

impl Evicted {
    /// Waits until the gate closes this connection; never ends once the connection proved
    /// itself (or if the gate is gone).
    pub async fn wait(self) {
        if self.0.await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Gate {
    pub fn new(limits: Limits) -> Gate {
        Gate {
            limits,
            inner: Arc::default(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Lets a connection from `ip` in, closing another to make room if need be (see the
    /// module's documentation).
    pub fn admit(&self, ip: IpAddr) -> Result<(Pass, Evicted), Refused> {
        let source = source_of(ip);
        let l = self.limits;
        let mut g = lock(&self.inner);
        let held = g.waiting.get(&source).map_or(0, VecDeque::len);
        if held >= l.per_source {
            return Err(Refused::Source { from: source, held });
        }
        if g.unproven >= l.unproven && !g.evict_from_largest(held) {
            return Err(Refused::Unproven { held: g.unproven });
        }
        if g.conns.len() >= l.total && !g.evict_from_largest(held) {
            return Err(if g.unproven == 0 {
                Refused::Total {
                    held: g.conns.len(),
                }
            } else {
                Refused::Unproven { held: g.unproven }
            });
        }
        let id = g.next;
        g.next += 1;
        let (tx, rx) = oneshot::channel();
        g.conns.insert(
            id,
            Entry {
                source,
                proven: false,
                evict: Some(tx),
            },
        );
        g.waiting.entry(source).or_default().push_back(id);
        g.unproven += 1;
        let crowded = g.unproven >= l.unproven.div_ceil(2);
        drop(g);
        Ok((
            Pass {
                inner: self.inner.clone(),
                id,
                crowded,
            },
            Evicted(rx),
        ))
    }

    /// Connections let in and still open: `(all, unproven)`.
    pub fn held(&self) -> (usize, usize) {
        let g = lock(&self.inner);
        (g.conns.len(), g.unproven)
    }
}

impl Pass {
    /// The connection proved the secret: it no longer counts as unproven, and is not closed
    /// to make room.
    pub fn prove(&self) {
        let mut g = lock(&self.inner);
        let Some(e) = g.conns.get_mut(&self.id) else {
            return;
        };
        if e.proven {
            return;
        }
        e.proven = true;
        e.evict = None;
        let source = e.source;
        g.unwait(source, self.id);
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut g = lock(&self.inner);
        // Gone already if the gate closed it to make room.
        if let Some(e) = g.conns.remove(&self.id) {
            if !e.proven {
                g.unwait(e.source, self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn evicted(e: &mut Evicted) -> bool {
        e.0.try_recv().is_ok()
    }

    const LIMITS: Limits = Limits {
        total: 6,
        unproven: 4,
        per_source: 3,
    };

    #[test]
    fn one_source_cannot_take_more_than_its_share() {
        let gate = Gate::new(LIMITS);
        let a = ip("127.0.0.2");
        let held: Vec<_> = (0..3).map(|_| gate.admit(a).unwrap()).collect();
        assert!(matches!(
            gate.admit(a),
            Err(Refused::Source { held: 3, .. })
        ));
        // Another address gets in.
        let _b = gate.admit(ip("127.0.0.1")).unwrap();
        drop(held);
        assert_eq!(gate.held(), (1, 1));
        assert!(
            gate.admit(a).is_ok(),
            "places come back when connections go"
        );
    }

    #[test]
    fn a_full_gate_closes_the_oldest_of_the_largest_source_for_another_source() {
        let gate = Gate::new(LIMITS);
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let mut a1 = gate.admit(a).unwrap();
        let mut a2 = gate.admit(a).unwrap();
        let mut b1 = gate.admit(b).unwrap();
        let mut c1 = gate.admit(c).unwrap();
        assert!(a2.0.crowded && !a1.0.crowded);
        // Full: a newcomer from b (holding 1) closes a's oldest (a holds 2).
        let mut b2 = gate.admit(b).unwrap();
        assert!(evicted(&mut a1.1));
        assert!(!evicted(&mut a2.1) && !evicted(&mut b1.1) && !evicted(&mut c1.1));
        assert_eq!(gate.held(), (4, 4));
        // a holds 1, b 2, c 1: closing one of b's for b would not make it fairer.
        assert!(matches!(gate.admit(b), Err(Refused::Unproven { held: 4 })));
        // One from a new address closes b's oldest.
        let _d = gate.admit(ip("10.0.0.4")).unwrap();
        assert!(evicted(&mut b1.1) && !evicted(&mut b2.1));
        // The evicted passes going later change nothing.
        drop(a1);
        drop(b1);
        assert_eq!(gate.held(), (4, 4));
    }

    #[test]
    fn proven_connections_are_never_closed_for_others_and_count_against_the_total() {
        let gate = Gate::new(LIMITS);
        let a = ip("10.0.0.1");
        let mut proven: Vec<_> = (0..3).map(|_| gate.admit(a).unwrap()).collect();
        for (p, _) in &proven {
            p.prove();
            p.prove();
        }
        assert_eq!(gate.held(), (3, 0));
        let more: Vec<_> = (0..3).map(|_| gate.admit(a).unwrap()).collect();
        assert_eq!(gate.held(), (6, 3));
        // All 6 places taken: a newcomer from b closes one of a's unproven, not a proven one.
        let b = gate.admit(ip("10.0.0.2")).unwrap();
        assert!(proven.iter_mut().all(|(_, e)| !evicted(e)));
        drop((more, b));
        for _ in 0..3 {
            proven.push(gate.admit(a).unwrap());
        }
        for (p, _) in &proven[3..] {
            p.prove();
        }
        // Every place proven: nothing to close, refused.
        assert_eq!(gate.held(), (6, 0));
        assert!(matches!(
            gate.admit(ip("10.0.0.3")),
            Err(Refused::Total { held: 6 })
        ));
    }

    #[test]
    fn an_ipv6_host_is_one_source() {
        assert_eq!(
            source_of(ip("2001:db8::1")),
            source_of(ip("2001:db8::ffff:1"))
        );
        assert_ne!(source_of(ip("2001:db8::1")), source_of(ip("2001:db9::1")));
        assert_eq!(source_of(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
    }
}
