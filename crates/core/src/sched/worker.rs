//! A worker as the scheduler holds it: what it offers, holds and has been sent.

use super::Job;
use crate::ledger::Ledger;
use crate::quarantine::Tally;
use crate::spec::{JobId, Resources, TaskIndex, TaskState, WorkerId};
use rustc_hash::FxHashSet;
use std::collections::BTreeMap;

/// How long before its allocation's end a worker takes no more tasks: what it still runs then
/// may be killed with it by the batch system, and goes back to the queue as a lost worker's
/// tasks do.
pub const END_MARGIN_US: u64 = 30_000_000;

/// What a worker offers when it joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerOffer {
    /// The worker's host name.
    pub hostname: String,
    /// Slots (cpus) and gpus it runs tasks on.
    pub resources: Resources,
    /// Extra cpus' worth of tasks it accepts ahead of free slots, so no slot waits a round trip.
    pub prefetch: u32,
    /// Named countable resources it has (`kestrel worker start --resource licenses=4`).
    pub named: Vec<(String, u32)>,
    /// Whether it has a cache and stages files: only such a worker takes tasks of jobs that
    /// declare files (a worker of protocol 7 or older has none).
    pub stages_files: bool,
    /// Whether it keeps Python runners: only such a worker takes function tasks
    /// ([`crate::TaskKind::Function`]).
    pub runs_functions: bool,
}

/// What the scheduler keeps of a worker that left (see [`super::Scheduler::departed`]): what
/// it offered, when it came and went, what it ran. A worker that comes back under its id
/// (after a lost connection, or a server restart) takes up its counts again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Departed {
    /// What it offered.
    pub offer: WorkerOffer,
    /// When it joined.
    pub joined_us: u64,
    /// When a message from it last came.
    pub last_seen_us: u64,
    /// When the scheduler let it go.
    pub left_us: u64,
    /// Tasks it ran to success.
    pub tasks_finished: u64,
    /// Tasks it ran that failed.
    pub tasks_failed: u64,
    /// Why it got no new tasks, if it was quarantined when it left.
    pub quarantined: Option<String>,
}

/// How many departed workers the scheduler remembers (the newest ids): enough for every
/// worker of a long run of allocations to be shown and to come back under its id, bounded
/// so that churn never grows the server.
pub const MAX_DEPARTED: usize = 1024;

/// A worker as the scheduler holds it.
#[derive(Debug)]
pub struct Worker {
    /// The worker's id.
    pub id: WorkerId,
    /// What it offered when it joined.
    pub offer: WorkerOffer,
    /// When it joined.
    pub joined_us: u64,
    /// When a message from it last came.
    pub last_seen_us: u64,
    /// Resources held by tasks assigned to it and not yet finished (prefetched ones included).
    pub used: Resources,
    /// Cpus held by those of its tasks known to be running (the rest wait for a slot there,
    /// or are on their way).
    pub(super) running_cpus: u32,
    /// How many tasks it holds: assigned to it and not yet finished.
    pub(super) held: u32,
    /// Where to find the tasks it holds (see [`holds`]).
    pub(super) ledger: Ledger,
    /// Jobs whose template it has been sent.
    pub(super) known_jobs: FxHashSet<JobId>,
    /// Tasks it ran to success.
    pub tasks_finished: u64,
    /// Tasks it ran that failed.
    pub tasks_failed: u64,
    /// Why it gets no new tasks, if quarantined (see [`super::Event::LiftQuarantine`]).
    pub quarantined: Option<String>,
    /// How its recent tasks ended, per job (what quarantine judges).
    pub(super) tally: Tally,
    /// Waiting tasks it was asked to give back (at most one request at a time), and their cpus.
    pub(super) revoking: Vec<(JobId, TaskIndex)>,
    pub(super) revoking_cpus: u32,
    /// Tasks it reported running when it resumed that were already assigned to another worker:
    /// the first successful result of either run is kept.
    pub(super) duplicates: FxHashSet<(JobId, TaskIndex)>,
    /// When its allocation ends (see [`super::Event::WorkerEnds`]), on the scheduler's clock.
    pub ends_at_us: Option<u64>,
    /// The group it may be one node of a multi-node task in (see [`super::Event::WorkerNodes`]);
    /// `None` for a worker that cannot (an older one).
    pub group: Option<String>,
    /// The multi-node task it is held for, as one of its nodes or while it drains for it: it
    /// takes no other task meanwhile.
    pub node_of: Option<(JobId, TaskIndex)>,
}

impl Worker {
    /// A worker that has just joined with `offer`, holding nothing.
    pub(super) fn new(id: WorkerId, offer: WorkerOffer, now_us: u64) -> Worker {
        Worker {
            id,
            offer,
            joined_us: now_us,
            last_seen_us: now_us,
            used: Resources::NONE,
            running_cpus: 0,
            held: 0,
            ledger: Ledger::default(),
            known_jobs: FxHashSet::default(),
            tasks_finished: 0,
            tasks_failed: 0,
            quarantined: None,
            tally: Tally::default(),
            revoking: Vec::new(),
            revoking_cpus: 0,
            duplicates: FxHashSet::default(),
            ends_at_us: None,
            group: None,
            node_of: None,
        }
    }

    /// What the scheduler keeps of it if it leaves at `now_us` (also what a view of it shows,
    /// but for the tasks it holds).
    pub fn departed(&self, now_us: u64) -> Departed {
        Departed {
            offer: self.offer.clone(),
            joined_us: self.joined_us,
            last_seen_us: self.last_seen_us,
            left_us: now_us,
            tasks_finished: self.tasks_finished,
            tasks_failed: self.tasks_failed,
            quarantined: self.quarantined.clone(),
        }
    }

    /// How much it takes at most, with `prefetch` cpus' worth held beyond its slots. Beyond
    /// cpus, a prefetch window holds one more of everything it has (GPUs, memory, named
    /// resources): tasks wait there for what frees up.
    pub(super) fn capacity(&self, prefetch: u32) -> Resources {
        let r = self.offer.resources;
        if prefetch == 0 {
            return r;
        }
        let mut cap = Resources::NONE.plus(&r, 2);
        cap.cpus = r.cpus + prefetch;
        cap
    }

    /// Takes a task (resumed or moved over from a previous registration) with what it holds;
    /// the caller makes the task's record name this worker and says whether it is running.
    pub(super) fn hold(&mut self, job: JobId, index: TaskIndex, need: Resources, running: bool) {
        self.ledger.push(job, index);
        self.held += 1;
        self.used = self.used.plus(&need, 1);
        if running {
            self.running_cpus += need.cpus;
        }
        self.known_jobs.insert(job);
    }

    /// Gives back what a task it holds held; the caller has checked with [`Job::held_by`]
    /// that it holds the task, passes the task's state, and then moves the task's record on.
    /// Returns whether its ledger is now due for [`Scheduler::prune_ledger`].
    #[must_use]
    pub(super) fn release(&mut self, need: Resources, state: TaskState) -> bool {
        self.held -= 1;
        self.used = self.used.less_held(&need);
        if state == TaskState::Running {
            self.running_cpus = self.running_cpus.saturating_sub(need.cpus);
        }
        self.ledger.needs_pruning(self.held)
    }

    /// Cpus free for tasks that would start at once (no task of its own waits for them).
    pub(super) fn idle_cpus(&self) -> u32 {
        self.offer.resources.cpus.saturating_sub(self.used.cpus)
    }

    /// Cpus' worth of tasks it holds beyond its slots: tasks waiting there for a slot.
    pub fn waiting_cpus(&self) -> u32 {
        self.used.cpus.saturating_sub(self.offer.resources.cpus)
    }

    /// How many tasks needing `need` still fit, holding `prefetch` cpus' worth beyond its slots.
    pub(super) fn room_for(&self, need: Resources, prefetch: u32) -> u32 {
        self.capacity(prefetch).minus(&self.used).times_fits(&need)
    }

    /// Whether a task of `job` started at `now_us` ends before this worker's allocation does:
    /// a task that declares its longest run (`--timeout`) must fit in the time left; one that
    /// declares none starts only until [`END_MARGIN_US`] before the end (the worker drains).
    pub(super) fn fits_time(&self, job: &Job, now_us: u64) -> bool {
        let Some(end) = self.ends_at_us else {
            return true;
        };
        if job.spec.template.timeout_ms.is_none() {
            return self.before_end_margin(now_us);
        }
        let longest = job
            .spec
            .template
            .timeout_ms
            .map_or(0, |ms| ms.saturating_mul(1000));
        now_us.saturating_add(longest).saturating_add(END_MARGIN_US) <= end
    }

    /// Whether it still takes tasks at `now_us`: it is not within [`END_MARGIN_US`] of its
    /// allocation's end. One that does not is left out of scheduling passes and of work
    /// stealing altogether, not asked job by job.
    pub fn before_end_margin(&self, now_us: u64) -> bool {
        self.ends_at_us
            .is_none_or(|end| now_us.saturating_add(END_MARGIN_US) <= end)
    }

    /// Whether it may be given new single-node tasks at `now_us`: not quarantined, not held
    /// for a multi-node task, not within its end margin.
    pub(super) fn takes_tasks(&self, now_us: u64) -> bool {
        self.quarantined.is_none() && self.node_of.is_none() && self.before_end_margin(now_us)
    }

    /// Whether a task needing `need` could ever run here.
    pub(super) fn can_ever_run(&self, need: Resources) -> bool {
        need.fits_in(&self.offer.resources)
    }

    /// Tasks assigned to it and not finished; a worker that is one of the nodes of another's
    /// multi-node task counts that task (it is busy with it, though it holds nothing itself).
    pub fn outstanding(&self) -> usize {
        self.held as usize + usize::from(self.held == 0 && self.node_of.is_some())
    }
}

/// Answers of a per-job question, asked once per job however many ledger runs name it (a
/// handful of live jobs: a short list beats a map).
#[derive(Default)]
pub(super) struct JobMemo(Vec<(JobId, bool)>);

impl JobMemo {
    pub(super) fn memo(&mut self, job: JobId, ask: impl FnOnce() -> bool) -> bool {
        if let Some(&(_, answer)) = self.0.iter().find(|(j, _)| *j == job) {
            return answer;
        }
        let answer = ask();
        self.0.push((job, answer));
        answer
    }
}

/// The test of whether `worker` holds a task (see [`Job::held_by`]; the records are the
/// truth, a worker's [`Ledger`] says where to look). A ledger lists runs of one job at a
/// time, so the job is looked up once per run, not once per task.
pub(super) fn holder(
    jobs: &BTreeMap<JobId, Job>,
    worker: WorkerId,
) -> impl FnMut(JobId, TaskIndex) -> bool + '_ {
    let mut last: Option<(JobId, Option<&Job>)> = None;
    move |job, index| {
        let j = match last {
            Some((id, j)) if id == job => j,
            _ => last.insert((job, jobs.get(&job))).1,
        };
        j.is_some_and(|j| j.held_by(index, worker))
    }
}
