//! Workers coming and going: joining (and coming back under their ids), heartbeats, loss and
//! its crash counts.

use super::worker::{holder, MAX_DEPARTED};
use super::{Scheduler, Worker, WorkerOffer};
use crate::outcome::{Command, Failure, Record};
use crate::queue::Span;
use crate::spec::{JobId, TaskIndex, TaskState, WorkerId, MAX_NAMED};
use rustc_hash::FxHashSet;

impl Scheduler {
    /// A worker connects. Returns its id: the next one never given out.
    pub(crate) fn worker_joined(&mut self, now_us: u64, offer: WorkerOffer) -> WorkerId {
        let id = self.next_worker;
        self.next_worker += 1;
        self.admit(now_us, id, offer);
        id
    }

    /// A worker that was registered as `previous` (with this scheduler, or with the same
    /// server before a restart) connects again. It gets its id back when no other worker has
    /// it: after a loss the id is free; when `previous` is still registered (its lost
    /// connection was not noticed yet), `same_start` says the id was given in this start, so
    /// the registration can only be this worker's own, and the new one takes its place (its
    /// tasks wait for [`super::Event::WorkerResumed`] to say which it still runs). An id
    /// never given out, or one held by another start's registration, is not taken: the
    /// worker gets a new id. Its counts and quarantine go on.
    pub(crate) fn worker_rejoined(
        &mut self,
        now_us: u64,
        offer: WorkerOffer,
        previous: WorkerId,
        same_start: bool,
    ) -> WorkerId {
        if let Some(left) = self.superseded.take() {
            // Its worker never resumed: what it held goes back to the queue.
            self.requeue_held(now_us, left, false, &FxHashSet::default());
        }
        let given = previous != 0 && previous < self.next_worker;
        let live = self.workers.contains_key(&previous);
        if !given || (live && !same_start) {
            return self.worker_joined(now_us, offer);
        }
        let old = self.workers.remove(&previous);
        self.forget_worker_sets(previous);
        let (finished, failed, quarantined) = match &old {
            Some(o) => (o.tasks_finished, o.tasks_failed, o.quarantined.clone()),
            None => match self.departed.remove(&previous) {
                // A quarantine that outlived the connection is in `quarantined_gone`, taken
                // up with the resume.
                Some(d) => (d.tasks_finished, d.tasks_failed, None),
                // Back after a server restart: what the journal says it ran.
                None => {
                    let (finished, failed) =
                        self.restored_runs.remove(&previous).unwrap_or_default();
                    (finished, failed, None)
                }
            },
        };
        let w = self.admit(now_us, previous, offer);
        w.tasks_finished = finished;
        w.tasks_failed = failed;
        if let Some(reason) = quarantined {
            w.quarantined = Some(reason.clone());
            self.commands.push(Command::Quarantined {
                worker: previous,
                reason,
            });
        }
        self.superseded = old;
        // It keeps its place in a multi-node task's set.
        self.node_moved(previous, previous);
        previous
    }

    /// Takes a worker that left out of the sets a pass looks at.
    fn forget_worker_sets(&mut self, id: WorkerId) {
        self.open.remove(&id);
        self.prefetching.remove(&id);
        self.ending.remove(&id);
    }

    /// Registers worker `id` with `offer` (its named resources numbered).
    fn admit(&mut self, now_us: u64, id: WorkerId, mut offer: WorkerOffer) -> &mut Worker {
        // A name past the most the server tells apart cannot be asked for by any job either.
        let named: Vec<_> = offer
            .named
            .iter()
            .filter(|(n, _)| self.names.contains(n) || self.names.len() < MAX_NAMED)
            .cloned()
            .collect();
        offer.resources.named = self.number(&named).unwrap_or([0; MAX_NAMED]);
        self.open.insert(id);
        if offer.prefetch > 0 {
            self.prefetching.insert(id);
        }
        self.workers
            .entry(id)
            .insert_entry(Worker::new(id, offer, now_us))
            .into_mut()
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
        self.forget_worker_sets(worker);
        // Intermediate files it may have held alone: made again if a task still needs them.
        let held: Vec<_> = if self.graph_has_files() {
            self.files.held_by(worker).collect()
        } else {
            Vec::new()
        };
        self.files.worker_gone(worker);
        if let Some(reason) = &w.quarantined {
            self.quarantined_gone.insert(worker, reason.clone());
        }
        self.departed.insert(worker, w.departed(now_us));
        while self.departed.len() > MAX_DEPARTED {
            self.departed.pop_first();
        }
        self.requeue_held(now_us, w, crashed, keep);
        if !held.is_empty() {
            self.files_lost(&held);
        }
    }

    /// Re-queues the tasks `w` (no longer registered) held, except those in `keep`.
    /// Each that ran there counts one crash (and one attempt) if `crashed`, and a task that
    /// was on [`Config::max_crashes`] lost workers fails; tasks that only waited there for a
    /// slot count nothing.
    pub(super) fn requeue_held(
        &mut self,
        now_us: u64,
        w: Worker,
        crashed: bool,
        keep: &FxHashSet<(JobId, TaskIndex)>,
    ) {
        let worker = w.id;
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
