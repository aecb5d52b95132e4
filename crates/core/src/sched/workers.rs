//! Workers coming and going: joining, heartbeats, loss and its crash counts.

use super::worker::holder;
use super::{Scheduler, Worker, WorkerOffer};
use crate::ledger::Ledger;
use crate::outcome::{Command, Failure, Record};
use crate::quarantine::Tally;
use crate::queue::Span;
use crate::spec::{JobId, Resources, TaskIndex, TaskState, WorkerId, MAX_NAMED};
use rustc_hash::FxHashSet;

impl Scheduler {
    /// A worker connects. Returns its id.
    pub(crate) fn worker_joined(&mut self, now_us: u64, mut offer: WorkerOffer) -> WorkerId {
        // A name past the most the server tells apart cannot be asked for by any job either.
        let named: Vec<_> = offer
            .named
            .iter()
            .filter(|(n, _)| self.names.contains(n) || self.names.len() < MAX_NAMED)
            .cloned()
            .collect();
        offer.resources.named = self.number(&named).unwrap_or([0; MAX_NAMED]);
        let id = self.next_worker;
        self.next_worker += 1;
        self.open.insert(id);
        self.workers.insert(
            id,
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
            },
        );
        id
    }

    /// Any message from a worker shows it is alive.
    pub(crate) fn worker_seen(&mut self, now_us: u64, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.last_seen_us = w.last_seen_us.max(now_us);
        }
    }

    /// A worker is gone (disconnected or silent). Its tasks go back to the queue, ahead of new
    /// work, without spending their retries. Each that ran there counts one crash (and one
    /// attempt), and a task that was on [`Config::max_crashes`] lost workers fails (it
    /// probably kills its worker); tasks that only waited there for a slot count nothing.
    pub(crate) fn worker_lost(&mut self, now_us: u64, worker: WorkerId) {
        self.drop_worker(now_us, worker, true, &FxHashSet::default());
    }

    /// Removes a worker and re-queues its tasks, except those in `keep` (taken over by its
    /// reconnection); `crashed` says whether the re-queued tasks count a crash.
    pub(super) fn drop_worker(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        crashed: bool,
        keep: &FxHashSet<(JobId, TaskIndex)>,
    ) {
        // A node of a multi-node task's set breaks the task's run.
        self.node_lost(worker, crashed);
        let Some(w) = self.workers.remove(&worker) else {
            return;
        };
        self.open.remove(&worker);
        // Intermediate files it may have held alone: made again if a task still needs them.
        let held: Vec<_> = if self.graph_has_files() {
            self.files.held_by(worker).collect()
        } else {
            Vec::new()
        };
        self.files.worker_gone(worker);
        if let Some(reason) = w.quarantined {
            self.quarantined_gone.insert(worker, reason);
        }
        let tasks = {
            let mut holds = holder(&self.jobs, worker);
            w.ledger
                .held(|job, index| !keep.contains(&(job, index)) && holds(job, index))
        };
        // Slots not known to be busy: assigned tasks may have started there unreported (the
        // worker starts them in the order they came, which the index order approximates).
        let mut unreported = w.offer.resources.cpus.saturating_sub(w.running_cpus);
        let mut counted = Vec::new();
        for (job, index) in tasks {
            let Some(j) = self.jobs.get(&job) else {
                continue;
            };
            let need = j.need.cpus;
            let ran = match j.table.get(index).state {
                TaskState::Running => true,
                _ if need <= unreported => {
                    unreported -= need;
                    true
                }
                _ => false,
            };
            if self.requeue_lost(now_us, job, index, crashed && ran) {
                counted.push((job, index));
            }
        }
        if !counted.is_empty() {
            self.records.push(Record::Lost { tasks: counted });
        }
        if !held.is_empty() {
            self.files_lost(&held);
        }
    }

    /// Takes a task its worker no longer holds (the worker was lost, or its multi-node run
    /// broke) back to the queue ahead of new work, without spending its retries; one that ran
    /// there (`crashed`) counts a crash and its run, and fails for good on the
    /// [`Config::max_crashes`]th. A task of a canceled job is canceled instead. Returns
    /// whether a crash was counted (for [`Record::Lost`]).
    ///
    /// [`Config::max_crashes`]: super::Config::max_crashes
    pub(super) fn requeue_lost(
        &mut self,
        now_us: u64,
        job: JobId,
        index: TaskIndex,
        crashed: bool,
    ) -> bool {
        let max_crashes = self.config.max_crashes.max(1);
        let Some(j) = self.jobs.get_mut(&job) else {
            return false;
        };
        if j.canceled {
            j.set_state(index, TaskState::Canceled);
            self.check_job_done(now_us, job);
            return false;
        }
        let was_running = j.table.get(index).state == TaskState::Running;
        let rec = j.set_state(index, TaskState::Ready);
        if crashed {
            rec.lost = rec.lost.saturating_add(1);
            if !was_running {
                // Its start was never reported, but it probably ran (the crash counts it).
                rec.runs = rec.runs.saturating_add(1);
            }
        }
        if rec.lost >= max_crashes {
            let reason = format!("lost with {} workers (it may kill its worker)", rec.lost);
            self.give_up(now_us, job, index, Failure::because(reason));
            return false;
        }
        self.ready
            .push_requeued(j.spec.priority, Span::one(job, index));
        crashed
    }

    /// Time passes: workers silent past the heartbeat timeout are lost, and failed tasks whose
    /// retry backoff has passed are queued.
    pub(crate) fn tick(&mut self, now_us: u64) {
        self.release_due(now_us);
        self.graph_tick(now_us);
        let timeout = self.config.heartbeat_timeout_us;
        let silent: Vec<WorkerId> = self
            .workers
            .values()
            .filter(|w| now_us.saturating_sub(w.last_seen_us) > timeout)
            .map(|w| w.id)
            .collect();
        for id in silent {
            self.commands.push(Command::Disconnect {
                worker: id,
                reason: format!(
                    "no message for {} s (heartbeat timeout)",
                    timeout / 1_000_000
                ),
            });
            self.worker_lost(now_us, id);
        }
    }
}
