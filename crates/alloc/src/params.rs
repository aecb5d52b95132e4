//! What a queue is told when it is added: its sizes, bounds and policies.

use serde::{Deserialize, Serialize};

/// Microseconds, the unit of every time here (virtual or not: the caller's clock).
pub type Micros = u64;

/// How big the next allocation asked for is (Falkon §5.2.1, "acquisition policies"): the
/// number of nodes of the `round`-th request since work started to wait, never more than the
/// nodes the waiting work needs nor the queue's `--nodes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Acquire {
    /// One node per request.
    One,
    /// The i-th request asks for i nodes.
    Additive,
    /// The i-th request asks for 2^(i-1) nodes.
    Exponential,
    /// One request for everything the waiting work needs.
    All,
}

impl Acquire {
    /// The nodes of request `round` (0 for the first) when `need` nodes' worth of work waits.
    pub fn nodes(self, round: u32, need: u64) -> u64 {
        let wanted = match self {
            Acquire::One => 1,
            Acquire::Additive => u64::from(round) + 1,
            Acquire::Exponential => 1u64 << round.min(62),
            Acquire::All => need,
        };
        wanted.min(need).max(1)
    }

    /// The name `--acquire` takes.
    pub fn name(self) -> &'static str {
        match self {
            Acquire::One => "one",
            Acquire::Additive => "additive",
            Acquire::Exponential => "exponential",
            Acquire::All => "all",
        }
    }

    /// The policy named `name`, as `--acquire` takes it.
    pub fn parse(name: &str) -> Option<Acquire> {
        [
            Acquire::One,
            Acquire::Additive,
            Acquire::Exponential,
            Acquire::All,
        ]
        .into_iter()
        .find(|a| a.name() == name)
    }
}

/// A queue's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueParams {
    /// Nodes of one allocation, at most (fewer when less work waits, or as `acquire` says).
    pub nodes: u32,
    /// Task slots a worker offers on one node: waiting work is turned into nodes with it.
    pub slots_per_node: u32,
    /// The allocations' time limit.
    pub time_limit_us: Micros,
    /// Allocations that have not ended, at most.
    pub max_allocs: Option<u32>,
    /// Nodes (one worker each) of allocations that have not ended, at most.
    pub max_workers: Option<u32>,
    /// Allocations submitted and waiting in the batch queue, at most.
    pub backlog: u32,
    /// Distributed release: an allocation whose workers have all been idle this long leaves
    /// (all its workers together). `None`: never.
    pub idle_timeout_us: Option<Micros>,
    /// Centralized release: while fewer tasks than this wait (and free slots take them), one
    /// allocation at a time is released (its workers finish what they run and leave). `None`:
    /// off.
    pub release_below: Option<u64>,
    /// The size of each request.
    pub acquire: Acquire,
    /// Submissions that failed in a row (or allocations that ended before a worker of theirs
    /// connected) after which the queue pauses itself.
    pub max_failures: u32,
}

impl QueueParams {
    /// A queue of one-node allocations of `time_limit_us`, with the defaults of `alloc add`.
    pub fn new(time_limit_us: Micros, slots_per_node: u32) -> QueueParams {
        QueueParams {
            nodes: 1,
            slots_per_node,
            time_limit_us,
            max_allocs: None,
            max_workers: None,
            backlog: 1,
            idle_timeout_us: Some(120_000_000),
            release_below: None,
            acquire: Acquire::All,
            max_failures: 3,
        }
    }

    /// Why these settings cannot work, if so.
    pub fn check(&self) -> Result<(), ParamsError> {
        if self.nodes == 0 {
            return Err(ParamsError("--nodes must be at least 1".into()));
        }
        if self.slots_per_node == 0 {
            return Err(ParamsError(
                "a worker must offer at least one slot per node".into(),
            ));
        }
        if self.time_limit_us < 60_000_000 {
            return Err(ParamsError(
                "--time-limit must be at least 1m: a worker needs time to start and run tasks"
                    .into(),
            ));
        }
        if self.backlog == 0 {
            return Err(ParamsError(
                "--backlog must be at least 1: it bounds the allocations waiting in the batch queue"
                    .into(),
            ));
        }
        if self.max_allocs == Some(0) || self.max_workers == Some(0) {
            return Err(ParamsError(
                "--max-allocs and --max-workers must be at least 1 (pause the queue to stop it)"
                    .into(),
            ));
        }
        if self.release_below == Some(0) {
            return Err(ParamsError(
                "--release-below must be at least 1: it releases while fewer tasks than it wait"
                    .into(),
            ));
        }
        if self.max_failures == 0 {
            return Err(ParamsError("the failure limit must be at least 1".into()));
        }
        Ok(())
    }
}

/// The slots each worker of a `local` queue offers when its worker arguments name none: the
/// machine's `cpus` shared by the most workers the queue runs at once (`max_workers`, else
/// `max_allocs` allocations of `nodes` workers, else one allocation's `nodes`), at least one.
/// A local queue's workers share one machine: each offering every core ran twice as many
/// tasks as there were cores with two workers.
pub fn local_slots(
    cpus: u32,
    nodes: u32,
    max_workers: Option<u32>,
    max_allocs: Option<u32>,
) -> u32 {
    let workers = max_workers
        .or_else(|| max_allocs.map(|a| a.saturating_mul(nodes)))
        .unwrap_or(nodes)
        .max(1);
    (cpus / workers).max(1)
}

/// Settings that cannot work, with what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParamsError(pub String);

#[cfg(test)]
mod tests {
    use super::local_slots;

    #[test]
    fn a_local_queue_divides_the_machine_among_its_workers() {
        // `run --alloc "local --max-workers 2"` on 2 cores: one slot each, not two.
        assert_eq!(local_slots(2, 1, Some(2), None), 1);
        assert_eq!(local_slots(16, 1, Some(4), None), 4);
        assert_eq!(
            local_slots(16, 2, None, Some(2)),
            4,
            "2 allocations of 2 workers"
        );
        assert_eq!(
            local_slots(16, 2, None, None),
            8,
            "one allocation's 2 workers"
        );
        assert_eq!(local_slots(8, 1, None, None), 8);
        // More workers than cores: one slot each, never none.
        assert_eq!(local_slots(2, 1, Some(8), None), 1);
        assert_eq!(local_slots(0, 1, None, None), 1);
    }
}
