//! The scheduler's tunables.

use crate::spec::JobId;

/// Tunables of the scheduler.
#[derive(Clone, Debug)]
pub struct Config {
    /// A worker silent for longer than this is lost.
    pub heartbeat_timeout_us: u64,
    /// How many queue entries that fit no worker one assignment pass may look past: the
    /// window of the default policy ([`crate::FirstAvailable`]); a policy installed with
    /// `Scheduler::set_dispatch_policy` has its own.
    pub max_queue_skips: usize,
    /// Wait before a failed task runs again; doubles with each failure of that task.
    pub retry_backoff_us: u64,
    /// The longest wait before a retry.
    pub retry_backoff_max_us: u64,
    /// How long a failed task's retry, once due, waits for a worker other than the one it
    /// failed on before that one may take it again (HTCondor's and Slurm's requeues avoid the
    /// node that failed too); 0 lets any worker take it at once.
    pub retry_elsewhere_us: u64,
    /// A task that was on this many lost workers is failed: it probably kills its worker.
    pub max_crashes: u8,
    /// A worker gets no new tasks when at least this many of its recent tasks of a job
    /// failed, more than half of them, while the other workers failed at most a third as
    /// often and the difference is not chance; or when twice this many of its runs of a job
    /// failed in a row and at least this many of those tasks then succeeded on other workers
    /// (see the core's `quarantine` module); 0 turns quarantine off.
    pub quarantine_failures: u32,
    /// How fast the counts behind quarantine fade: they are halved every window.
    pub quarantine_window_us: u64,
    /// Tasks queued on a worker beyond its free slots should cover about this much run time
    /// per slot: a job whose tasks take longer gets a shallower prefetch, down to none (a
    /// long task waiting behind another on a busy worker while another worker idles doubles
    /// the makespan).
    pub prefetch_horizon_us: u64,
    /// A worker with free slots and nothing to take from the queue takes back tasks waiting
    /// in another worker's prefetch window, for jobs whose tasks run at least this long (or
    /// whose run time is not known yet); shorter ones will start sooner than a round trip.
    pub steal_min_run_us: u64,
    /// The id of the first job submitted (later ones count up from it).
    pub first_job: JobId,
    /// How many ready tasks data-aware placement looks at (Falkon's W); `None` is 100 per
    /// connected worker, as in the dissertation.
    pub window: Option<usize>,
    /// Good-cache-compute's threshold of busy cpus, in thousandths, for jobs that name the
    /// policy without one.
    pub util_threshold_permille: u16,
    /// The store of jobs that name none (files are known by store and name, see
    /// [`crate::files::cached_name`]).
    pub store: Option<String>,
}

impl Config {
    /// The wait before the retry after a task's `failures`-th failure: doubling from
    /// `retry_backoff_us`, at most `retry_backoff_max_us`.
    pub fn backoff_us(&self, failures: u8) -> u64 {
        let shift = u32::from(failures.saturating_sub(1)).min(40);
        self.retry_backoff_us
            .saturating_mul(1u64 << shift)
            .min(self.retry_backoff_max_us)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_timeout_us: 30_000_000,
            max_queue_skips: 64,
            retry_backoff_us: 500_000,
            retry_backoff_max_us: 60_000_000,
            retry_elsewhere_us: 10_000_000,
            max_crashes: 5,
            quarantine_failures: 10,
            quarantine_window_us: 60_000_000,
            prefetch_horizon_us: 100_000,
            steal_min_run_us: 50_000,
            first_job: 1,
            window: None,
            util_threshold_permille: crate::policy::DEFAULT_UTIL_THRESHOLD_PERMILLE,
            store: None,
        }
    }
}
