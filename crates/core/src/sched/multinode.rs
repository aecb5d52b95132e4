//! Multi-node tasks (`--nodes N`, HyperQueue's): a task that takes N whole workers of one
//! group, runs its process on the first of them (the root, told every worker of the set) and
//! keeps the others idle for it until it ends.
//!
//! Ready tasks of multi-node jobs leave the ready queue for a queue of their own (as the
//! tasks of data-aware jobs leave it for the window), which each pass serves before ordinary
//! work, front to back (priority, re-queued work, first come):
//! - a task starts when a group has N free workers (holding nothing); they are its nodes
//!   ([`Worker::node_of`]) until its record leaves the root: an end, a cancel, a lost root;
//! - the first task that cannot start, unless ordinary work of a higher priority waits, has
//!   N workers of a group big enough held for it as they drain (the free ones first, then
//!   the least busy): they take no new task and give back those waiting there for a slot.
//!   One task at a time holds workers, so single-node work keeps all the others, and the
//!   held workers go to it as soon as they are all free, so it never waits forever;
//! - tasks behind it start on free workers it does not hold.
//!
//! Workers of one group are those of one allocation, or those started with one `--group`
//! (HyperQueue's rule: an MPI run spans nodes that can reach each other). A worker of a set
//! that is lost breaks the run: the root is told to stop it, and its end counts as a lost
//! worker's (one crash, back to the queue ahead of new work, failed after `max_crashes`).
//!
//! Nothing here is journaled: which workers run a task is not kept across a restart, and a
//! task that was running is ready again like any other.

use super::graph::TaskKey;
use super::{Job, Scheduler, Stall, Worker};
use crate::outcome::{Command, Finished, IndexRun, Record, RunEnd};
use crate::queue::ReadyQueue;
use crate::spec::{JobId, TaskState, WorkerId};
use rustc_hash::FxHashSet;
use std::collections::{BTreeMap, BTreeSet};

/// The state of multi-node tasks, beside the scheduler's.
#[derive(Debug, Default)]
pub(super) struct Nodes {
    /// Live jobs of multi-node tasks: a pass looks for their tasks only while there are some.
    jobs: FxHashSet<JobId>,
    /// Their ready tasks, moved from the ready queue, in its order.
    pub(super) queue: ReadyQueue,
    /// Multi-node tasks assigned or running, with their workers, the root first.
    sets: BTreeMap<TaskKey, Vec<WorkerId>>,
    /// The task workers are held for as they drain, and those workers.
    holding: Option<(TaskKey, Vec<WorkerId>)>,
    /// Tasks whose set lost a worker: their root was told to stop them, and their end is
    /// taken as a lost worker's.
    broken: FxHashSet<TaskKey>,
}

impl Nodes {
    fn idle(&self) -> bool {
        self.jobs.is_empty() && self.sets.is_empty() && self.holding.is_none()
    }
}

/// What a pass decided, carried out once the walk of the queue is over.
#[derive(Default)]
struct Plan {
    starts: Vec<(TaskKey, Vec<WorkerId>)>,
    holding: Option<(TaskKey, Vec<WorkerId>)>,
    /// Workers started on or held this pass.
    taken: BTreeSet<WorkerId>,
}

/// Whether `w` could be one node of a task of `j` at `now_us`, busy or not.
fn able(w: &Worker, j: &Job, now_us: u64) -> bool {
    w.group.is_some()
        && w.quarantined.is_none()
        && w.before_end_margin(now_us)
        && w.fits_time(j, now_us)
        && w.can_ever_run(j.need)
}

/// Whether `w` holds nothing and waits for nothing, so a set may take it now.
fn free(w: &Worker) -> bool {
    w.held == 0 && w.revoking.is_empty() && w.node_of.is_none()
}

impl Scheduler {
    /// Notes a new (or restored) job whose tasks take several workers.
    pub(super) fn note_nodes(&mut self, job: JobId) {
        if self.jobs.get(&job).is_some_and(|j| j.spec.nodes > 0) {
            self.nodes.jobs.insert(job);
        }
    }

    /// Ready tasks of multi-node jobs waiting for their workers.
    pub(super) fn nodes_queued(&self) -> u64 {
        self.nodes.queue.len()
    }

    /// The spans of the multi-node queue (for the audit).
    pub(super) fn nodes_spans(&self) -> impl Iterator<Item = &crate::queue::Span> + '_ {
        self.nodes.queue.spans()
    }

    /// The workers of multi-node task `key`, the root first, while it is assigned or running.
    pub fn nodes_of(&self, key: TaskKey) -> Option<&[WorkerId]> {
        self.nodes.sets.get(&key).map(Vec::as_slice)
    }

    /// The multi-node task workers are held for as they drain, and those workers.
    pub fn nodes_holding(&self) -> Option<(TaskKey, &[WorkerId])> {
        self.nodes
            .holding
            .as_ref()
            .map(|(k, ws)| (*k, ws.as_slice()))
    }

    /// The pass of multi-node tasks (see the module's doc), before ordinary work's.
    pub(super) fn schedule_nodes(&mut self, now_us: u64) {
        if self.nodes.idle() {
            return;
        }
        self.end_node_sets();
        let jobs = &self.jobs;
        self.nodes
            .jobs
            .retain(|id| jobs.get(id).is_some_and(|j| j.finished_us.is_none()));
        if !self.nodes.jobs.is_empty() && !self.ready.is_empty() {
            let mine = &self.nodes.jobs;
            self.ready
                .move_front(&mut self.nodes.queue, self.config.max_queue_skips, |span| {
                    mine.contains(&span.job)
                });
        }
        // Held last pass: free again unless held again now (the same ones come first).
        let before = self.nodes.holding.take();
        if let Some((key, ws)) = &before {
            for id in ws {
                if let Some(w) = self.workers.get_mut(id).filter(|w| w.node_of == Some(*key)) {
                    w.node_of = None;
                    self.open.insert(*id);
                }
            }
        }
        let plan = self.plan_nodes(now_us, before.as_ref());
        for (key, set) in plan.starts {
            self.start_set(now_us, key, set);
        }
        if let Some((key, ws)) = plan.holding {
            for &id in &ws {
                if let Some(w) = self.workers.get_mut(&id).filter(|w| w.node_of.is_none()) {
                    w.node_of = Some(key);
                }
                // What waits there for a slot would only delay the drain.
                self.revoke_waiting(id);
            }
            self.nodes.holding = Some((key, ws));
        }
    }

    /// Walks the multi-node queue: which tasks start on which workers, and which task has
    /// workers held for it.
    fn plan_nodes(&mut self, now_us: u64, before: Option<&(TaskKey, Vec<WorkerId>)>) -> Plan {
        let mut plan = Plan::default();
        let ordinary_front = self.ready.front_priority();
        let (jobs, workers) = (&self.jobs, &self.workers);
        let skips = self.config.max_queue_skips;
        self.nodes.queue.take_front(skips, |span| {
            let Some(j) = jobs.get(&span.job) else {
                // Forgotten: its entries go.
                return Some(span.len());
            };
            let mut n = 0;
            for index in span.next..span.end {
                if j.canceled || j.table.get(index).state != TaskState::Ready {
                    // Canceled, or taken back by a resumed worker: the entry is stale.
                    n += 1;
                    continue;
                }
                let key = (span.job, index);
                let pick = Pick {
                    workers,
                    j,
                    now_us,
                    taken: &plan.taken,
                    before,
                    key,
                };
                if let Some(set) = pick.free() {
                    plan.taken.extend(&set);
                    plan.starts.push((key, set));
                    n += 1;
                    continue;
                }
                let higher_waits = ordinary_front.is_some_and(|p| p > j.spec.priority);
                if plan.holding.is_none() && !higher_waits {
                    if let Some(ws) = pick.held() {
                        plan.taken.extend(&ws);
                        plan.holding = Some((key, ws));
                    }
                }
                // The tasks after it in this span need the same: none starts either.
                break;
            }
            Some(n)
        });
        plan
    }

    /// Hands task `key` to the first of `set`, holding all of them for it.
    fn start_set(&mut self, now_us: u64, key: TaskKey, set: Vec<WorkerId>) {
        let (job, index) = key;
        let (Some(j), Some(&root)) = (self.jobs.get_mut(&job), set.first()) else {
            return;
        };
        let Some(w) = self.workers.get_mut(&root) else {
            return;
        };
        j.assign(index, root, now_us);
        w.held += 1;
        w.used = w.used.plus(&j.need, 1);
        w.ledger.push_run(IndexRun {
            job,
            first: index,
            count: 1,
        });
        if w.known_jobs.insert(job) {
            self.commands.push(Command::DefineJob { worker: root, job });
        }
        for id in &set {
            if let Some(w) = self.workers.get_mut(id) {
                w.node_of = Some(key);
            }
        }
        self.commands.push(Command::AssignNodes {
            worker: root,
            job,
            index,
            nodes: set.clone(),
        });
        self.nodes.sets.insert(key, set);
    }

    /// Frees the workers of sets whose task has left its root (it ended, was canceled, taken
    /// back, or its root was lost); follows a root that came back under a new id.
    fn end_node_sets(&mut self) {
        let mut over = Vec::new();
        for (key, set) in &mut self.nodes.sets {
            let rec = self
                .jobs
                .get(&key.0)
                .filter(|j| key.1 < j.len())
                .map(|j| j.table.get(key.1));
            match rec {
                Some(r) if matches!(r.state, TaskState::Assigned | TaskState::Running) => {
                    if set.first() != Some(&r.worker) {
                        // Its root reconnected under a new id and took the task back.
                        set[0] = r.worker;
                        if let Some(w) = self.workers.get_mut(&r.worker) {
                            w.node_of = Some(*key);
                        }
                    }
                }
                _ => over.push(*key),
            }
        }
        for key in over {
            self.nodes.broken.remove(&key);
            for id in self.nodes.sets.remove(&key).unwrap_or_default() {
                if let Some(w) = self.workers.get_mut(&id).filter(|w| w.node_of == Some(key)) {
                    w.node_of = None;
                    self.open.insert(id);
                }
            }
        }
    }

    /// Worker `id` is being dropped. If it was a node of a running set other than the root
    /// and is lost (`crashed`), the run is broken: the root is told to stop it. (A lost
    /// root's tasks go back to the queue as any lost worker's; a reconnection takes the
    /// worker's place, see [`Self::node_moved`].)
    pub(super) fn node_lost(&mut self, id: WorkerId, crashed: bool) {
        let Some(key) = self.workers.get(&id).and_then(|w| w.node_of) else {
            return;
        };
        let Some(&root) = self.nodes.sets.get(&key).and_then(|s| s.first()) else {
            return;
        };
        if crashed && root != id && self.nodes.broken.insert(key) {
            self.commands.push(Command::Cancel {
                worker: root,
                tasks: vec![key],
            });
        }
    }

    /// A worker that reconnected as `to` was `from`: it keeps its place in a set.
    pub(super) fn node_moved(&mut self, from: WorkerId, to: WorkerId) {
        for (key, set) in &mut self.nodes.sets {
            for id in set.iter_mut().filter(|id| **id == from) {
                *id = to;
                if let Some(w) = self.workers.get_mut(&to) {
                    w.node_of = Some(*key);
                }
            }
        }
    }

    /// Whether some multi-node run broke and its end is awaited.
    pub(super) fn has_broken_runs(&self) -> bool {
        !self.nodes.broken.is_empty()
    }

    /// A worker reports the end of a run of a broken set's task (see [`Self::node_lost`]): a
    /// failure or a cancel there is the lost worker's doing, so the task goes back to the
    /// queue counting a crash, not a failure. Returns whether the end was taken so (a success
    /// is a success).
    pub(super) fn broken_run_ended(&mut self, now_us: u64, worker: WorkerId, f: &Finished) -> bool {
        let key = (f.job, f.index);
        if f.end == RunEnd::Success || !self.nodes.broken.contains(&key) {
            return false;
        }
        let Some(j) = self.jobs.get(&f.job).filter(|j| j.held_by(f.index, worker)) else {
            return false;
        };
        self.nodes.broken.remove(&key);
        let (need, state) = (j.need, j.table.get(f.index).state);
        if let Some(w) = self.workers.get_mut(&worker) {
            self.open.insert(worker);
            if w.release(need, state) {
                self.prune_ledger(worker);
            }
        }
        if self.requeue_lost(now_us, f.job, f.index, true) {
            self.records.push(Record::Lost { tasks: vec![key] });
        }
        true
    }

    /// Why the queued tasks of multi-node job `j` cannot start, if no workers could ever take
    /// them (too few, of no group big enough, or too old to be a node).
    pub(super) fn nodes_stall(&self, j: &Job) -> Option<Stall> {
        let n = j.spec.nodes;
        let plural = |n: usize| if n == 1 { "worker" } else { "workers" };
        if !self.workers.values().any(|w| w.group.is_some()) {
            return Some(Stall::Nodes(format!(
                "each task needs {n} whole {}, and none of the connected workers can be one (they are older than the server); start workers of this version (`kestrel worker start`)",
                plural(n as usize)
            )));
        }
        // Whatever the time: a worker near its allocation's end is replaced by another.
        let could =
            |w: &&Worker| w.group.is_some() && w.quarantined.is_none() && w.can_ever_run(j.need);
        let groups = by_group(self.workers.values().filter(could), |w| w.id);
        if groups.values().any(|ws| ws.len() >= n as usize) {
            return None;
        }
        let (group, largest) = groups
            .iter()
            .max_by_key(|(_, ws)| ws.len())
            .map(|(g, ws)| (*g, ws.clone()))
            .unwrap_or_default();
        let ids: Vec<String> = largest.iter().map(u32::to_string).collect();
        let able_ones = match largest.len() {
            0 => "no worker can take it (all quarantined, too small, or ending)".to_string(),
            k if groups.len() > 1 || !group.is_empty() => format!(
                "the largest group of workers that can ({}) has {k} ({} {})",
                group_name(group),
                plural(k),
                ids.join(", ")
            ),
            k => format!("only {k} can take it ({} {})", plural(k), ids.join(", ")),
        };
        Some(Stall::Nodes(format!(
            "each task needs {n} whole {} of one group, and {able_ones}; start more workers (`kestrel worker start`) or cancel the job",
            plural(n as usize)
        )))
    }
}

/// `workers` by their group, each as `f` makes it.
fn by_group<'a, T>(
    workers: impl Iterator<Item = &'a Worker>,
    f: impl Fn(&'a Worker) -> T,
) -> BTreeMap<&'a str, Vec<T>> {
    let mut groups: BTreeMap<&str, Vec<T>> = BTreeMap::new();
    for w in workers {
        groups
            .entry(w.group.as_deref().unwrap_or_default())
            .or_default()
            .push(f(w));
    }
    groups
}

/// A group's name for people.
fn group_name(group: &str) -> String {
    if group.is_empty() {
        "the workers started without --group".to_string()
    } else {
        format!("group {group}")
    }
}

/// What choosing workers for task `key` of `j` looks at: the workers, those `taken` by tasks
/// ahead of it this pass, and those held `before` (last pass) for some task.
struct Pick<'a> {
    workers: &'a BTreeMap<WorkerId, Worker>,
    j: &'a Job,
    now_us: u64,
    taken: &'a BTreeSet<WorkerId>,
    before: Option<&'a (TaskKey, Vec<WorkerId>)>,
    key: TaskKey,
}

impl Pick<'_> {
    /// The free workers the task starts on now, if a group has enough: those held for it
    /// last pass if they are all free, else the first of the smallest group that has enough
    /// (bigger groups are left to bigger tasks).
    fn free(&self) -> Option<Vec<WorkerId>> {
        let n = self.j.spec.nodes as usize;
        let usable =
            |w: &Worker| !self.taken.contains(&w.id) && free(w) && able(w, self.j, self.now_us);
        if let Some((_, held)) = self.before.filter(|(k, _)| *k == self.key) {
            if held.len() >= n
                && held
                    .iter()
                    .all(|id| self.workers.get(id).is_some_and(&usable))
            {
                return Some(held[..n].to_vec());
            }
        }
        by_group(self.workers.values().filter(|w| usable(w)), |w| w.id)
            .into_values()
            .filter(|ws| ws.len() >= n)
            .min_by_key(Vec::len)
            .map(|mut ws| {
                ws.truncate(n);
                ws
            })
    }

    /// The workers to hold for the task as they drain, if a group has enough that could take
    /// it: the group it was held in last pass if it still has enough, else the one with the
    /// most free workers; in it, those held before, then the free ones, then the least busy.
    fn held(&self) -> Option<Vec<WorkerId>> {
        let n = self.j.spec.nodes as usize;
        let held_before = |id: WorkerId| {
            self.before
                .is_some_and(|(k, ws)| *k == self.key && ws.contains(&id))
        };
        let groups = by_group(
            self.workers
                .values()
                .filter(|w| !self.taken.contains(&w.id) && able(w, self.j, self.now_us)),
            |w| w,
        );
        let score = |ws: &Vec<&Worker>| {
            let before = ws.iter().filter(|w| held_before(w.id)).count();
            let free = ws.iter().filter(|w| free(w)).count();
            (before >= n, free, ws.len())
        };
        let mut ws = groups
            .into_values()
            .filter(|ws| ws.len() >= n)
            .max_by_key(score)?;
        // Held before first; then free; then workers of no other set, least busy first.
        ws.sort_by_key(|w| {
            (
                !held_before(w.id),
                !free(w),
                w.node_of.is_some(),
                w.used.cpus,
                w.id,
            )
        });
        Some(ws.iter().take(n).map(|w| w.id).collect())
    }
}
