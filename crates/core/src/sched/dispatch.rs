//! Dispatch: handing ready tasks to workers, and taking waiting ones back (work stealing).

use super::worker::{holder, JobMemo};
use super::Scheduler;
use crate::outcome::{Command, IndexRun};
use crate::policy::Offer;
use crate::queue::Span;
use crate::spec::{JobId, Resources, TaskIndex, TaskState, WorkerId};

/// How deep one pass of [`Scheduler::schedule`] fills workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Depth {
    /// Only free slots: tasks that start at once.
    Slots,
    /// Slots and the prefetch window.
    Prefetch,
}

impl Depth {
    /// How much of the prefetch window `depth` lets worker `w` fill beyond its free slots,
    /// for tasks whose useful depth there is `deepest`.
    pub(super) fn prefetch(self, deepest: u32) -> u32 {
        match self {
            Depth::Slots => 0,
            Depth::Prefetch => deepest,
        }
    }
}

impl Scheduler {
    /// Hands ready tasks to workers with free credit. Call after a batch of events.
    ///
    /// Free slots everywhere are filled before any prefetch window, so a few long tasks spread
    /// over the workers instead of queueing on the first one; then windows are filled as deep
    /// as each job's run time makes useful; then idle workers take back tasks waiting on busy
    /// ones ([`Self::steal`]).
    pub(crate) fn schedule(&mut self, now_us: u64) {
        self.release_due(now_us);
        // Set again by this pass if a retry still keeps away from a worker.
        self.kept_until = None;
        if self.workers.is_empty() {
            return;
        }
        // Multi-node tasks first: the workers they take or hold take nothing else below.
        self.schedule_nodes(now_us);
        if !self.ready.is_empty() || !self.window.is_empty() {
            // Only workers that may have room: the others would take nothing.
            let mut ids: Vec<WorkerId> = self.open.iter().copied().collect();
            self.policy.order_workers(&mut ids);
            self.pack_allocations(&mut ids);
            // With more queued than all workers can hold, every window fills whatever the
            // order: one pass does it.
            let room: u64 = ids
                .iter()
                .filter_map(|id| self.workers.get(id))
                .map(|w| {
                    u64::from(
                        w.capacity(w.offer.prefetch)
                            .cpus
                            .saturating_sub(w.used.cpus),
                    )
                })
                .sum();
            let depths: &[Depth] = if self.ready.len() >= room {
                &[Depth::Prefetch]
            } else {
                &[Depth::Slots, Depth::Prefetch]
            };
            // A failed task's retry keeps away from the worker it failed on for a while, if
            // another worker is there to take it (a second one not quarantined: found at once).
            let elsewhere_us = self.elsewhere_us();
            // Each worker's runs of both passes go out as one assignment.
            let mut given: Vec<Vec<IndexRun>> = vec![Vec::new(); ids.len()];
            for &depth in depths {
                // Data-aware placement too fills free slots before prefetch windows: a task
                // queued behind a busy holder of its data, while another worker idles, would
                // wait (against max-compute-util) and be stolen back and forth.
                if !self.windowed_jobs.is_empty() {
                    self.dispatch_window(now_us, &ids, &mut given, depth);
                }
                for (&id, runs) in ids.iter().zip(&mut given) {
                    if self.ready.is_empty() {
                        break;
                    }
                    self.fill_worker(now_us, id, depth, runs, elsewhere_us);
                }
            }
            for (&id, runs) in ids.iter().zip(given) {
                if !runs.is_empty() {
                    self.commands.push(Command::Assign { worker: id, runs });
                }
            }
            // Those left with no room sit out the passes until they free some.
            for id in ids {
                let full = self.workers.get(&id).is_some_and(|w| {
                    w.quarantined.is_none() && w.room_for(Resources::ONE_CPU, w.offer.prefetch) == 0
                });
                if full {
                    self.open.remove(&id);
                }
            }
        }
        self.steal(now_us);
        self.reclaim_from_ending(now_us);
    }

    /// How long a failed task's retry keeps away from the worker it failed on (see
    /// [`super::Config::retry_elsewhere_us`]): not at all when no other worker is there to take
    /// it (a second one not quarantined: found at once).
    pub(super) fn elsewhere_us(&self) -> u64 {
        let others = self.workers.values().filter(|w| w.quarantined.is_none());
        if others.take(2).count() == 2 {
            self.config.retry_elsewhere_us
        } else {
            0
        }
    }

    /// Workers of allocations (those that know their end) come after the others, the latest
    /// end first; the policy's order stays within each group. Work left over by the workers
    /// that cost nothing more to keep thus packs onto the fewest allocations, the newest first,
    /// and the others idle until their queue's `--idle-timeout` gives them back whole: spread
    /// over all of them (the policy's rotation), a few tasks a stage kept every node busy, and
    /// none was ever released. Those ending soonest idle first, as they would leave first.
    fn pack_allocations(&self, ids: &mut [WorkerId]) {
        let end = |id: &WorkerId| self.workers.get(id).and_then(|w| w.ends_at_us);
        if ids.iter().any(|id| end(id).is_some()) {
            // Stable: equal keys (no end, or one allocation's workers) keep the policy's order.
            ids.sort_by_key(|id| std::cmp::Reverse(end(id).unwrap_or(u64::MAX)));
        }
    }

    /// A worker within its end margin drains: tasks it holds that have not started (waiting
    /// there for a slot) are asked back ([`Command::Revoke`]) rather than left to start in the
    /// last seconds and die with the allocation. What it runs, it finishes.
    fn reclaim_from_ending(&mut self, now_us: u64) {
        let ending: Vec<WorkerId> = self
            .ending
            .iter()
            .filter_map(|id| self.workers.get(id))
            .filter(|w| {
                !w.before_end_margin(now_us) && w.revoking.is_empty() && w.waiting_cpus() > 0
            })
            .map(|w| w.id)
            .collect();
        for id in ending {
            self.revoke_waiting(id);
        }
    }

    /// Asks worker `id` back every task it holds that has not started ([`Command::Revoke`]),
    /// if it holds any and has no request out already.
    pub(super) fn revoke_waiting(&mut self, id: WorkerId) {
        let Some(w) = self.workers.get(&id) else {
            return;
        };
        if !w.revoking.is_empty() || w.waiting_cpus() == 0 {
            return;
        }
        let jobs = &self.jobs;
        let mut holds = holder(jobs, id);
        let tasks: Vec<(JobId, TaskIndex)> = w.ledger.held_of(
            |_| true,
            |job, index| {
                holds(job, index)
                    && jobs
                        .get(&job)
                        .is_some_and(|j| j.table.get(index).state == TaskState::Assigned)
            },
        );
        if tasks.is_empty() {
            return;
        }
        let cpus = tasks
            .iter()
            .map(|(job, _)| jobs.get(job).map_or(0, |j| j.need.cpus))
            .sum();
        let w = self
            .workers
            .get_mut(&id)
            .expect("a worker asked for its tasks is a worker");
        w.revoking = tasks.clone();
        w.revoking_cpus = cpus;
        self.commands.push(Command::Revoke { worker: id, tasks });
    }

    /// Gives worker `id` ready tasks up to `depth`, adding them to `runs` (the caller sends
    /// them); the worker's first task of a job is preceded by a [`Command::DefineJob`]. A
    /// retry of a task that failed on it waits up to `elsewhere_us` for another worker (see
    /// [`Job::kept_from`](super::Job)): the walk passes it by.
    fn fill_worker(
        &mut self,
        now_us: u64,
        id: WorkerId,
        depth: Depth,
        runs: &mut Vec<IndexRun>,
        elsewhere_us: u64,
    ) {
        let Some(w) = self.workers.get_mut(&id) else {
            return;
        };
        if w.quarantined.is_some() || w.node_of.is_some() || !w.before_end_margin(now_us) {
            return;
        }
        let horizon = self.config.prefetch_horizon_us;
        let most_prefetch = match depth {
            Depth::Slots => 0,
            Depth::Prefetch => w.offer.prefetch,
        };
        let jobs = &mut self.jobs;
        let policy = &mut self.policy;
        let config = &self.config;
        let mut kept_until = self.kept_until;
        let mut mine: Vec<IndexRun> = Vec::new();
        let mut defines: Vec<JobId> = Vec::new();
        self.ready.take_front(policy.window(), |span| {
            let Some(j) = jobs.get_mut(&span.job) else {
                return Some(0);
            };
            let need = j.need;
            // Windowed jobs are placed from the window; a job with files needs a cache.
            // Multi-node tasks are placed by `schedule_nodes`.
            if !w.can_ever_run(need)
                || j.windowed
                || j.spec.nodes > 0
                || !j.runs_on(&w.offer)
                || !w.fits_time(j, now_us)
            {
                return Some(0);
            }
            let prefetch = match depth {
                Depth::Slots => 0,
                Depth::Prefetch => j.prefetch_for(w, horizon),
            };
            let room = w.room_for(need, prefetch);
            if room == 0 {
                // Out of credit for this shape; smaller tasks further down may still fit.
                return if w.room_for(Resources::ONE_CPU, most_prefetch) == 0 {
                    None
                } else {
                    Some(0)
                };
            }
            let offer = Offer {
                worker: id,
                job: span.job,
                first: span.next,
                len: span.len(),
                room: room.min(span.len()),
            };
            let n = policy.take(&offer).min(offer.room);
            let mut given = 0;
            // Entries of tasks that are no longer ready (taken back by a resumed worker, or
            // canceled one by one) are passed over without counting against the room.
            let end = span.next + span.len();
            let mut index = span.next;
            while index < end && given < n {
                let rec = j.table.get(index);
                if rec.state != TaskState::Ready {
                    index += 1;
                    continue;
                }
                if let Some(until) = j.kept_from(index, &rec, id, now_us, config, elsewhere_us) {
                    // It and what follows it in the span stay queued for another worker.
                    kept_until = Some(kept_until.map_or(until, |k| k.min(until)));
                    break;
                }
                j.assign(index, id, now_us);
                given += 1;
                let run = IndexRun {
                    job: span.job,
                    first: index,
                    count: 1,
                };
                IndexRun::append(&mut mine, run);
                index += 1;
            }
            let taken = index - span.next;
            w.held += given;
            w.used = w.used.plus(&need, given);
            if given > 0 && w.known_jobs.insert(span.job) {
                defines.push(span.job);
            }
            Some(taken)
        });
        self.kept_until = kept_until;
        for r in mine {
            w.ledger.push_run(r);
            // A run that continues one of the first pass joins it.
            IndexRun::append(runs, r);
        }
        for job in defines {
            self.commands.push(Command::DefineJob { worker: id, job });
        }
    }

    /// Work stealing of prefetch windows: while workers have free slots that nothing in the
    /// queue fills, asks busy workers to give back tasks waiting there for a slot
    /// ([`Command::Revoke`]); what they give back ([`Self::tasks_revoked`]) goes to the front
    /// of the queue and from there to the idle slots. Only one request per worker is out at a
    /// time, and no more is asked back than the idle slots can take.
    fn steal(&mut self, now_us: u64) {
        let min_run = self.config.steal_min_run_us;
        // Only workers with a prefetch window hold tasks waiting for a slot, and only they and
        // draining ones (their end known) are ever asked for tasks back: looked at first, as
        // there are usually none, and the idle cpus are counted only if there are.
        let askable = || {
            self.prefetching
                .iter()
                .chain(
                    self.ending
                        .iter()
                        .filter(|id| !self.prefetching.contains(id)),
                )
                .filter_map(|id| self.workers.get(id))
        };
        // The busiest first: the most tasks waiting for a slot.
        let mut victims: Vec<(u32, WorkerId)> = askable()
            .filter(|w| w.revoking.is_empty() && w.waiting_cpus() > 0)
            .map(|w| (w.waiting_cpus(), w.id))
            .collect();
        if victims.is_empty() {
            return;
        }
        // Idle cpus are on open workers only (the others have no room at all).
        let idle: u32 = self
            .open
            .iter()
            .filter_map(|id| self.workers.get(id))
            .filter(|w| w.takes_tasks(now_us))
            .map(|w| w.idle_cpus())
            .sum();
        let on_the_way: u32 = askable().map(|w| w.revoking_cpus).sum();
        let mut wanted = idle.saturating_sub(on_the_way);
        if wanted == 0 {
            return;
        }
        victims.sort_unstable_by(|a, b| b.cmp(a));
        let mut worth = JobMemo::default();
        let policy = &*self.policy;
        let thieves: Vec<(WorkerId, Resources)> = self
            .workers
            .values()
            .filter(|w| w.takes_tasks(now_us) && w.idle_cpus() > 0)
            .map(|w| (w.id, w.offer.resources))
            .collect();
        let (config, elsewhere_us) = (&self.config, self.elsewhere_us());
        for (waiting, victim) in victims {
            if wanted == 0 {
                break;
            }
            let jobs = &self.jobs;
            let w = &self.workers[&victim];
            let mut holds = holder(jobs, victim);
            // Tasks it holds that have not started, of jobs long enough to be worth moving and
            // small enough for an idle worker. The job test comes first and once per listed
            // run: short jobs (the common case) cost no walk of the ledger's tasks.
            let candidates = w.ledger.held_of(
                |job| {
                    worth.memo(job, || {
                        jobs.get(&job).is_some_and(|j| {
                            // A data-aware policy keeps home only the tasks it placed by their
                            // data (the others are first-available's whatever the policy);
                            // any other policy says for all its jobs.
                            let p = j.policy(policy);
                            let steals = if p.data_aware() {
                                !j.windowed || p.steals()
                            } else {
                                p.steals()
                            };
                            steals
                                && j.worth_stealing(min_run)
                                && thieves.iter().any(|(_, t)| j.need.fits_in(t))
                        })
                    })
                },
                |job, index| {
                    holds(job, index)
                        && jobs.get(&job).is_some_and(|j| {
                            let rec = j.table.get(index);
                            // A retry kept away from every idle worker would only come back.
                            rec.state == TaskState::Assigned
                                && thieves.iter().any(|&(id, _)| {
                                    j.kept_from(index, &rec, id, now_us, config, elsewhere_us)
                                        .is_none()
                                })
                        })
                },
            );
            // The last handed out wait the longest there.
            let mut budget = waiting.min(wanted);
            let mut tasks = Vec::new();
            let mut cpus = 0;
            for (job, index) in candidates.into_iter().rev() {
                let need = jobs[&job].need.cpus;
                if need > budget {
                    continue;
                }
                budget -= need;
                cpus += need;
                tasks.push((job, index));
                if budget == 0 {
                    break;
                }
            }
            if tasks.is_empty() {
                continue;
            }
            wanted = wanted.saturating_sub(cpus);
            let w = self.workers.get_mut(&victim).expect("victim is a worker");
            w.revoking = tasks.clone();
            w.revoking_cpus = cpus;
            self.commands.push(Command::Revoke {
                worker: victim,
                tasks,
            });
        }
    }

    /// A worker answers a [`Command::Revoke`]: `tasks` are those it still had waiting and has
    /// dropped; they go back to the front of the queue, counting no attempt. Tasks it was asked
    /// for and does not list had started (their reports follow).
    pub(crate) fn tasks_revoked(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        tasks: Vec<(JobId, TaskIndex)>,
    ) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        let asked = std::mem::take(&mut w.revoking);
        w.revoking_cpus = 0;
        let mut prune = false;
        for (job, index) in tasks {
            if !asked.contains(&(job, index)) {
                continue;
            }
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            if !j.held_by(index, worker) || j.table.get(index).state != TaskState::Assigned {
                continue;
            }
            let need = j.need;
            if let Some(w) = self.workers.get_mut(&worker) {
                self.open.insert(worker);
                prune |= w.release(need, TaskState::Assigned);
            }
            if j.canceled {
                j.set_state(index, TaskState::Canceled).finished_us = now_us;
                self.check_job_done(now_us, job);
                continue;
            }
            j.set_state(index, TaskState::Ready);
            self.ready
                .push_requeued(j.spec.priority, Span::one(job, index));
        }
        if prune {
            self.prune_ledger(worker);
        }
    }
}
