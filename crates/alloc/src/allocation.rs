//! One allocation: a batch job that runs a worker on each of its nodes.

use crate::params::Micros;
use serde::{Deserialize, Serialize};

/// An allocation's number, unique in the server (never given out twice).
pub type AllocId = u32;

/// A worker's number, as the server gives them.
pub type WorkerId = u32;

/// Where an allocation is in its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocState {
    /// Decided and journaled; the submit command has not answered yet.
    Submitting,
    /// In the batch queue, waiting for nodes.
    Queued,
    /// Its nodes are given (the batch system says so, or a worker of it connected).
    Running,
    /// Its workers were told to finish what they run and leave, all together.
    Draining,
    /// Cancel asked of the batch system; waiting for it to end.
    Canceling,
    /// Over.
    Ended(Ending),
}

impl AllocState {
    /// Whether it is over.
    pub fn is_ended(&self) -> bool {
        matches!(self, AllocState::Ended(_))
    }

    /// Whether it waits for nodes (decided, or in the batch queue).
    pub fn is_pending(&self) -> bool {
        matches!(self, AllocState::Submitting | AllocState::Queued)
    }

    /// A word for tables: queued, running, finished, failed...
    pub fn word(&self) -> &'static str {
        match self {
            AllocState::Submitting => "submitting",
            AllocState::Queued => "queued",
            AllocState::Running => "running",
            AllocState::Draining => "draining",
            AllocState::Canceling => "canceling",
            AllocState::Ended(Ending::Finished) => "finished",
            AllocState::Ended(Ending::Canceled) => "canceled",
            AllocState::Ended(Ending::Failed(_)) => "failed",
            AllocState::Ended(Ending::SubmitFailed(_)) => "not submitted",
        }
    }
}

/// How an allocation ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ending {
    /// It ran and ended (its workers left, or its time was up).
    Finished,
    /// Canceled by the allocator (work gone, released) or the user.
    Canceled,
    /// The batch system says it failed, or it ended before any worker of it connected: why.
    Failed(String),
    /// The submit command failed: its message.
    SubmitFailed(String),
}

/// An allocation and what the allocator knows of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub id: AllocId,
    /// Nodes asked for (one worker each).
    pub nodes: u32,
    /// The batch system's id for it, once submitted.
    pub batch_id: Option<String>,
    pub state: AllocState,
    /// When it was decided.
    pub submitted_us: Micros,
    /// When its nodes were given.
    pub started_us: Option<Micros>,
    /// When it ended.
    pub ended_us: Option<Micros>,
    /// Its workers connected now.
    pub workers: Vec<WorkerId>,
    /// Workers of it that ever connected.
    pub workers_seen: u32,
    /// CPU-microseconds its workers spent running tasks.
    #[serde(default)]
    pub busy_cpu_us: Micros,
    /// Why the allocator canceled it, if it counts as failed (its workers never came).
    #[serde(default)]
    pub cancel_reason: Option<String>,
    /// When a restarted server took it back: its workers' [`WORKER_START_LIMIT_US`] counts
    /// from then too, not across the server's downtime. Not kept.
    #[serde(skip)]
    pub restored_us: Micros,
}

/// How long after its nodes are given an allocation's workers may take to connect. Until
/// then the nodes of those not connected yet count as coming (a worker can take a while to
/// start: a binary on a shared file system, a module load, a server restarting, which it
/// waits 2 min for); an allocation none of whose workers came by then is canceled as failed.
pub const WORKER_START_LIMIT_US: Micros = 300_000_000;

impl Allocation {
    pub(crate) fn new(id: AllocId, nodes: u32, now: Micros) -> Allocation {
        Allocation {
            id,
            nodes,
            batch_id: None,
            state: AllocState::Submitting,
            submitted_us: now,
            started_us: None,
            ended_us: None,
            workers: Vec::new(),
            workers_seen: 0,
            busy_cpu_us: 0,
            cancel_reason: None,
            restored_us: 0,
        }
    }

    /// Whether it counts against its queue's `--max-allocs` and `--max-workers`: not over,
    /// and not being canceled with no worker of it connected. A released allocation whose
    /// workers have left ends by itself within moments (its pilot exits with them), and one
    /// canceled while it waited brings no worker (one that comes anyway is told to leave):
    /// counted until the batch system confirms their end, they held back the allocations
    /// that new work needed.
    pub fn holds_nodes(&self) -> bool {
        let gone = self.state == AllocState::Canceling && self.workers.is_empty();
        !(self.state.is_ended() || gone)
    }

    /// Nodes whose workers are still to come at `now`: all of them while it waits in the
    /// batch queue; once it runs, those without a connected worker, for
    /// [`WORKER_START_LIMIT_US`]. Not asked for again meanwhile: with slow-starting workers,
    /// a queue that saw its allocation run and no worker yet asked for another, and another.
    /// (Connected, not ever seen: a worker that reconnects comes back under a new id.)
    pub fn nodes_to_come(&self, now: Micros) -> u32 {
        match self.state {
            AllocState::Submitting | AllocState::Queued => self.nodes,
            AllocState::Running if !self.past_start_limit(now) => {
                let connected = u32::try_from(self.workers.len()).unwrap_or(u32::MAX);
                self.nodes.saturating_sub(connected)
            }
            _ => 0,
        }
    }

    /// Whether its nodes were given (or it was taken back by a restarted server) more than
    /// [`WORKER_START_LIMIT_US`] before `now`.
    pub fn past_start_limit(&self, now: Micros) -> bool {
        self.started_us
            .is_some_and(|s| now.saturating_sub(s.max(self.restored_us)) >= WORKER_START_LIMIT_US)
    }

    /// When its time limit ends it, once it runs.
    pub fn ends_at(&self, time_limit_us: Micros) -> Option<Micros> {
        self.started_us.map(|s| s.saturating_add(time_limit_us))
    }

    /// CPU-microseconds its slots were held, `slots` a node, from its start to its end (or to
    /// `now`).
    pub fn held_cpu_us(&self, slots: u32, now: Micros) -> Micros {
        let Some(start) = self.started_us else {
            return 0;
        };
        let end = self.ended_us.unwrap_or(now);
        end.saturating_sub(start)
            .saturating_mul(u64::from(self.nodes) * u64::from(slots))
    }

    /// How long it waited in the batch queue (so far, if it still waits).
    pub fn queue_wait_us(&self, now: Micros) -> Micros {
        self.started_us
            .or(self.ended_us)
            .unwrap_or(now)
            .saturating_sub(self.submitted_us)
    }
}
