//! The scheduler's invariants, checked against its whole state: what tests and the simulator
//! assert after every event. O(tasks), so never called on a driver's hot path.

use super::worker::holder;
use super::Scheduler;
use crate::spec::{JobId, Resources, TaskIndex, TaskState, WorkerId};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeSet;

impl Scheduler {
    /// Every violation of the scheduler's invariants, as one line each; none in a correct
    /// scheduler:
    /// - each job's counts are the recount of its tasks' states (so they add up to its tasks);
    /// - a task whose record names a worker (assigned or running) is listed in that worker's
    ///   ledger, and the worker is connected (the ledger's listing is read through the
    ///   records, so the converse holds by construction);
    /// - each worker's held count, resources in use and running cpus are those of the tasks
    ///   it holds;
    /// - each ready task is in the ready queue or waiting out a retry backoff (no task is
    ///   lost);
    /// - the queue's task count is that of its entries;
    /// - the file index's two maps mirror each other and name only connected workers, and the
    ///   window's counts and map agree with its entries;
    /// - a waiting task waits for something (its job's `after`, or writers of its inputs),
    ///   and a job's count of tasks canceled for a dependency is theirs;
    /// - each job's inputs are numbered, one set per task;
    /// - a worker the passes skip has no room, and the passes look at no worker that left.
    pub fn audit(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let queued = self.queued_tasks();
        // Held tasks per worker, as the task records say.
        let mut held: FxHashMap<WorkerId, BTreeSet<(JobId, TaskIndex)>> = FxHashMap::default();
        for (&id, j) in &self.jobs {
            let mut counts = super::Counts::default();
            let mut canceled_for_deps = 0;
            for index in 0..j.len() {
                // Untouched tasks of a canceled job read as canceled (a cancel does not walk
                // them).
                let rec = j.record(index);
                *counts.slot(rec.state) += 1;
                match rec.state {
                    TaskState::Assigned | TaskState::Running => {
                        held.entry(rec.worker).or_default().insert((id, index));
                    }
                    TaskState::Waiting
                        if !j.held && j.gate == 0 && !j.unmet.contains_key(&index) =>
                    {
                        bad.push(format!("job {id} task {index} waits for nothing"));
                    }
                    TaskState::Canceled if j.canceled_for_deps(index) => canceled_for_deps += 1,
                    TaskState::Ready
                        if !queued.contains(&(id, index))
                            && !self.delayed_at.contains_key(&(id, index)) =>
                    {
                        bad.push(format!(
                            "job {id} task {index} is ready but neither queued nor delayed"
                        ));
                    }
                    _ => {}
                }
            }
            if !j.canceled && canceled_for_deps != j.canceled_by_deps {
                bad.push(format!(
                    "job {id}: {} tasks counted canceled for a dependency, {canceled_for_deps} are",
                    j.canceled_by_deps
                ));
            }
            if counts != j.counts {
                bad.push(format!(
                    "job {id}: counts {:?}, its tasks' states {counts:?}",
                    j.counts
                ));
            }
        }
        for (worker, tasks) in &held {
            if !self.workers.contains_key(worker) {
                bad.push(format!(
                    "{} tasks are held by worker {worker}, which is not connected (first: {:?})",
                    tasks.len(),
                    tasks.first()
                ));
            }
        }
        let none = BTreeSet::new();
        for (&id, w) in &self.workers {
            let records = held.get(&id).unwrap_or(&none);
            let listed: BTreeSet<(JobId, TaskIndex)> =
                w.ledger.held(holder(&self.jobs, id)).into_iter().collect();
            if &listed != records {
                let missing: Vec<_> = records.difference(&listed).take(3).collect();
                bad.push(format!(
                    "worker {id}: its ledger lists {} held tasks, the records {} (not listed: {missing:?})",
                    listed.len(),
                    records.len()
                ));
            }
            let mut used = Resources::NONE;
            let mut running_cpus = 0;
            for (job, index) in records {
                let j = &self.jobs[job];
                used = used.plus(&j.need, 1);
                if j.table.get(*index).state == TaskState::Running {
                    running_cpus += j.need.cpus;
                }
            }
            if w.held as usize != records.len() {
                bad.push(format!(
                    "worker {id}: held {}, but it holds {} tasks",
                    w.held,
                    records.len()
                ));
            }
            if w.used != used {
                bad.push(format!(
                    "worker {id}: in use {:?}, its tasks hold {used:?}",
                    w.used
                ));
            }
            if w.running_cpus != running_cpus {
                bad.push(format!(
                    "worker {id}: {} running cpus, its running tasks hold {running_cpus}",
                    w.running_cpus
                ));
            }
        }
        let entries: u64 = self.ready.spans().map(|s| u64::from(s.len())).sum();
        if entries != self.ready.len() {
            bad.push(format!(
                "the queue counts {} tasks, its entries hold {entries}",
                self.ready.len()
            ));
        }
        // A worker the passes skip has no room.
        for (id, w) in &self.workers {
            if !self.open.contains(id) && w.room_for(Resources::ONE_CPU, w.offer.prefetch) > 0 {
                bad.push(format!("worker {id} has room but the passes skip it"));
            }
        }
        if let Some(id) = self.open.iter().find(|id| !self.workers.contains_key(id)) {
            bad.push(format!("worker {id} is gone but the passes look at it"));
        }
        // Stealing and draining look only at these: every worker holding tasks that wait for a
        // slot must be among them, and none gone.
        for (id, w) in &self.workers {
            let askable = self.prefetching.contains(id) || self.ending.contains(id);
            if w.waiting_cpus() > 0 && !askable {
                bad.push(format!(
                    "worker {id} holds waiting tasks but stealing skips it"
                ));
            }
        }
        let mut sets = self.prefetching.iter().chain(&self.ending);
        if let Some(id) = sets.find(|id| !self.workers.contains_key(id)) {
            bad.push(format!(
                "worker {id} is gone but stealing or draining looks at it"
            ));
        }
        bad.extend(self.files.audit());
        bad.extend(self.window.audit());
        for w in self.files.workers() {
            if !self.workers.contains_key(&w) {
                bad.push(format!(
                    "the file index lists worker {w}, which is not connected"
                ));
            }
        }
        for (&id, j) in &self.jobs {
            let want = j.len() as usize * j.inputs_per_task();
            if j.inputs.len() != want {
                bad.push(format!(
                    "job {id}: {} inputs numbered, its tasks have {want}",
                    j.inputs.len()
                ));
            }
        }
        bad
    }

    /// Every (job, index) the ready queue's entries or the window cover.
    fn queued_tasks(&self) -> FxHashSet<(JobId, TaskIndex)> {
        self.ready
            .spans()
            .flat_map(|s| (s.next..s.end).map(move |i| (s.job, i)))
            .chain(self.window.iter().map(|(_, e)| (e.job, e.index)))
            .chain(
                self.nodes_spans()
                    .flat_map(|s| (s.next..s.end).map(move |i| (s.job, i))),
            )
            .collect()
    }
}
