//! What a simulated run reports: the figures a seed's table gives, and a timeline to plot.

use serde::Serialize;

/// One run's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// The run's name in the scenario.
    pub name: String,
    /// The seed it ran with.
    pub seed: u64,
    /// Tasks in the workload.
    pub tasks: u32,
    /// Tasks that finished.
    pub finished: u32,
    /// Tasks that failed for good (after their retries).
    pub failed: u32,
    /// Simulated seconds from the start to the end of the last task (or to where the run
    /// stopped, see `stopped`).
    pub makespan_s: f64,
    /// The shortest the workload could take: the last arrival plus a mean task, or all the
    /// compute spread over every cpu, whichever is longer.
    pub ideal_s: f64,
    /// `ideal_s / makespan_s`; `null` when the ideal is under a millisecond (tasks of no
    /// length: only the dispatch rate counts).
    pub efficiency: Option<f64>,
    /// The share of cpu time (every node's cpus over the makespan) spent running tasks,
    /// staging their inputs included.
    pub cpu_utilisation: f64,
    /// Nodes at the start, and cpus each.
    pub nodes: u32,
    /// Cpus per node.
    pub cpus_per_node: u32,
    /// Where inputs came from.
    pub data: DataReport,
    /// Nodes killed, and runs lost with them (they ran again elsewhere).
    pub nodes_killed: u32,
    /// Runs lost with killed nodes.
    pub runs_lost: u64,
    /// Runs that failed (each spends a retry).
    pub runs_failed: u64,
    /// Tasks dispatched per second of simulated time, at the peak second.
    pub peak_dispatch_per_s: u64,
    /// Simulated events processed (arrivals, deliveries, run ends, reports, kills).
    pub events: u64,
    /// Wall-clock seconds the simulation took.
    pub wall_s: f64,
    /// `events / wall_s`.
    pub events_per_s: f64,
    /// Why the run stopped before every task ended; `null` when it ended.
    pub stopped: Option<String>,
    /// The cluster sampled every `sample` of simulated time.
    pub timeline: Vec<Sample>,
}

/// Where the tasks' inputs came from, over the whole run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DataReport {
    /// Inputs found in the node's own cache.
    pub local_hits: u64,
    /// Inputs copied from another node's cache.
    pub peer_hits: u64,
    /// Inputs read from the shared store.
    pub store_reads: u64,
    /// Bytes read from the store.
    pub store_bytes: u64,
    /// Bytes copied between nodes.
    pub peer_bytes: u64,
    /// Bytes read from the nodes' own caches.
    pub local_bytes: u64,
    /// Cache hits (own or a peer's) over all inputs read; `null` when none was read.
    pub hit_ratio: Option<f64>,
}

impl DataReport {
    /// Inputs staged, from anywhere.
    pub fn inputs(&self) -> u64 {
        self.local_hits + self.peer_hits + self.store_reads
    }

    /// Inputs found in some cache (the node's own or a peer's).
    pub fn hits(&self) -> u64 {
        self.local_hits + self.peer_hits
    }

    /// Bytes of inputs staged, from anywhere.
    pub fn staged_bytes(&self) -> u64 {
        self.local_bytes + self.peer_bytes + self.store_bytes
    }
}

/// The cluster at one moment (the rates are over the interval that ends there).
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Simulated seconds from the start.
    pub t_s: f64,
    /// Tasks arrived and not yet handed to a node.
    pub queued: u64,
    /// Cpus running a task (staging or computing).
    pub busy_cpus: u64,
    /// Cpus of live nodes.
    pub cpus: u64,
    /// Tasks finished so far.
    pub finished: u64,
    /// Bytes per second read from the store over the interval.
    pub store_bytes_per_s: f64,
    /// Bytes per second of inputs staged (from anywhere) over the interval.
    pub staged_bytes_per_s: f64,
    /// Cache hits over inputs staged in the interval; `null` when none was.
    pub hit_ratio: Option<f64>,
}
