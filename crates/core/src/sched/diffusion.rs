//! Data diffusion in the scheduler: jobs' input files numbered in the file index, workers'
//! cache reports applied to it, and data-aware placement through the scheduling window
//! (Falkon's algorithm of Figs 39–40).
//!
//! A job whose tasks read files and whose policy is data-aware ([`DispatchPolicy::data_aware`])
//! has its ready tasks moved from the queue into the window ([`Window`]), up to W. Each pass
//! then serves workers with room: first the workers holding the inputs of the window's front
//! task (Falkon's step 1: "which executor to notify"), then the rest in the policy's order.
//! For each, the tasks whose inputs it holds come first, most data first (step 2), then tasks
//! from the front of the window it holds nothing of; the job's policy says which it may take
//! ([`DispatchPolicy::accepts`]): max-cache-hit only those it holds the most of, max-compute-
//! util any, good-cache-compute as one or the other by the share of busy cpus.

use super::dispatch::Depth;
use super::{Job, Scheduler};
use crate::files::{cached_name, CacheDelta, FileId, FileIndex, Hits};
use crate::outcome::{Command, IndexRun};
use crate::placeholders::try_each_name;
use crate::policy::{self, DispatchPolicy};
use crate::spec::{JobId, Resources, TaskIndex, TaskState, WorkerId};
use crate::window::Seq;
use rustc_hash::FxHashSet;

impl Job {
    /// The inputs of task `index`, numbered by the scheduler's file index (empty for a job
    /// without inputs).
    pub fn inputs_of(&self, index: TaskIndex) -> &[FileId] {
        let k = self.inputs_per_task();
        let from = index as usize * k;
        self.inputs.get(from..from + k).unwrap_or(&[])
    }

    /// The policy that places this job's tasks: its own, or the scheduler's `default`.
    pub(super) fn policy<'a>(&'a self, default: &'a dyn DispatchPolicy) -> &'a dyn DispatchPolicy {
        self.policy.as_deref().unwrap_or(default)
    }

    /// Whether a ready task of this job may be handed out (a canceled job's untouched tasks
    /// still read `Ready` in the table).
    fn ready(&self, index: TaskIndex) -> bool {
        !self.canceled && index < self.len() && self.table.get(index).state == TaskState::Ready
    }
}

/// The store a job with `placement` keeps its files in: its own, or the scheduler's.
pub(super) fn store_of<'a>(
    placement: &'a crate::spec::Placement,
    config: &'a super::Config,
) -> Option<&'a str> {
    placement.store.as_deref().or(config.store.as_deref())
}

impl Scheduler {
    /// The index of which workers cache which files.
    pub fn files(&self) -> &FileIndex {
        &self.files
    }

    /// The policy that places `job`'s tasks (the scheduler's unless the job names one).
    pub fn policy_of<'a>(&'a self, job: &'a Job) -> &'a dyn DispatchPolicy {
        job.policy(&*self.policy)
    }

    /// Sets up a new or restored job's files: its own policy if it names one, whether its
    /// tasks go through the window, and its tasks' inputs numbered.
    pub(super) fn admit_files(&mut self, job: JobId) {
        let default_threshold = self.config.util_threshold_permille;
        let skips = self.config.max_queue_skips;
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let p = &j.spec.placement;
        if p.policy.is_some() || p.util_threshold_permille.is_some() {
            let name = p.policy.unwrap_or(self.policy.name());
            let threshold = p.util_threshold_permille.unwrap_or(default_threshold);
            j.policy = Some(policy::by_name(name, threshold, skips));
        }
        self.number_inputs(job, 0);
        self.mark_windowed(job);
    }

    /// Whether `job`'s tasks go through the window, now that its policy is known.
    fn mark_windowed(&mut self, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.windowed = j.inputs_per_task() > 0 && j.policy(&*self.policy).data_aware();
        if j.windowed && !j.is_done() {
            self.windowed_jobs.insert(job);
        } else {
            self.windowed_jobs.remove(&job);
        }
    }

    /// After the scheduler's own policy changed: which jobs go through the window.
    pub(super) fn remark_windowed(&mut self) {
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in ids {
            self.mark_windowed(id);
        }
    }

    /// Numbers the inputs of `job`'s tasks from index `from` on (after a submission or an
    /// extension): each name with its placeholders replaced and qualified by the job's store,
    /// as the worker names it in its cache.
    pub(super) fn number_inputs(&mut self, job: JobId, from: TaskIndex) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.inputs_per_task() == 0 {
            return;
        }
        let patterns = &j.spec.template.files.inputs;
        let store = store_of(&j.spec.placement, &self.config);
        let end = j.len();
        j.inputs
            .reserve((end.saturating_sub(from) as usize) * patterns.len());
        let files = &mut self.files;
        let inputs = &mut j.inputs;
        let tasks = j.spec.ids_of(&j.tasks);
        let _ = try_each_name(&tasks, &job.to_string(), from, patterns, |_, _, name| {
            inputs.push(files.intern(&cached_name(store, &name)));
            Ok::<(), ()>(())
        });
    }

    /// A worker's cache gained or lost files (see [`super::Event::CacheChanged`]).
    pub(crate) fn cache_changed(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        added: &[(String, u64)],
        evicted: &[String],
    ) {
        if !self.workers.contains_key(&worker) {
            return;
        }
        let files = &mut self.files;
        let delta = CacheDelta {
            added: added
                .iter()
                .map(|(name, size)| (files.intern(name), *size))
                .collect(),
            evicted: evicted.iter().filter_map(|n| files.id(n)).collect(),
        };
        self.files.apply(worker, &delta);
        self.note_values(&delta.added);
        if self.graph_has_files() {
            // Lineage: an intermediate evicted from its last cache is made again; one back
            // (a worker restarted with its cache) need not be.
            self.files_lost(&delta.evicted);
            self.files_back(now_us, &delta.added);
        }
    }

    /// How many tasks the window holds at most: the configured W, else 100 per worker as in
    /// the dissertation (at least 100).
    fn window_size(&self) -> usize {
        self.config
            .window
            .unwrap_or_else(|| (100 * self.workers.len()).max(100))
            .max(1)
    }

    /// Moves ready tasks of windowed jobs from the queue into the window, in queue order,
    /// until it holds W.
    fn top_up_window(&mut self) {
        self.window.maintain();
        let cap = self.window_size();
        if self.windowed_jobs.is_empty() || self.window.len() >= cap {
            return;
        }
        let jobs = &self.jobs;
        let window = &mut self.window;
        self.ready.take_front(self.config.max_queue_skips, |span| {
            let room = cap.saturating_sub(window.len());
            if room == 0 {
                return None;
            }
            let Some(j) = jobs.get(&span.job).filter(|j| j.windowed) else {
                return Some(0);
            };
            let n = span.len().min(u32::try_from(room).unwrap_or(u32::MAX));
            for index in span.next..span.next + n {
                if j.ready(index) {
                    window.push(span.job, index, j.inputs_of(index));
                }
            }
            Some(n)
        });
    }

    /// Serves workers with room from the window (see the module's doc). `ids` are the
    /// workers in the pass's order and `given` their assignments so far, parallel to it.
    pub(super) fn dispatch_window(
        &mut self,
        now_us: u64,
        ids: &[WorkerId],
        given: &mut [Vec<IndexRun>],
        depth: Depth,
    ) {
        self.top_up_window();
        if self.window.is_empty() {
            return;
        }
        // One walk of the workers: the cluster's busy share, and who has room at all (a
        // pass usually frees a few of many workers: the others cost no more than this).
        let (mut busy, mut total) = (0u64, 0u64);
        let mut free: FxHashSet<WorkerId> = FxHashSet::default();
        for w in self.workers.values().filter(|w| w.quarantined.is_none()) {
            let cpus = w.offer.resources.cpus;
            total += u64::from(cpus);
            busy += u64::from(w.used.cpus.min(cpus));
            if w.offer.stages_files
                && w.node_of.is_none()
                && w.before_end_margin(now_us)
                && w.room_for(Resources::ONE_CPU, depth.prefetch(w.offer.prefetch)) > 0
            {
                free.insert(w.id);
            }
        }
        if free.is_empty() {
            return;
        }
        // Step 1: the free workers holding the front task's inputs first, most of them
        // first; then the other free ones in the pass's order.
        let mut order: Vec<usize> = Vec::with_capacity(free.len());
        let mut front_holders: Vec<WorkerId> = Vec::new();
        if let Some((_, front)) = self.window.iter().next() {
            let mut holders = std::mem::take(&mut self.cand_buf);
            self.files.candidates(&front.files, &mut holders);
            front_holders.extend(holders.iter().map(|(w, _)| *w).filter(|w| free.contains(w)));
            self.cand_buf = holders;
        }
        for w in &front_holders {
            order.extend(ids.iter().position(|i| i == w));
        }
        order.extend(
            (0..ids.len()).filter(|&i| free.contains(&ids[i]) && !front_holders.contains(&ids[i])),
        );
        for i in order {
            if self.window.is_empty() {
                break;
            }
            self.fill_from_window(now_us, ids[i], &mut given[i], (&mut busy, total), depth);
        }
    }

    /// Step 2 for worker `id`: the tasks it holds data of, most first, then the front of the
    /// window, each as its job's policy allows.
    fn fill_from_window(
        &mut self,
        now_us: u64,
        id: WorkerId,
        runs: &mut Vec<IndexRun>,
        (busy, total): (&mut u64, u64),
        depth: Depth,
    ) {
        let Some(w) = self.workers.get(&id) else {
            return;
        };
        if w.quarantined.is_some()
            || !w.offer.stages_files
            || w.room_for(Resources::ONE_CPU, depth.prefetch(w.offer.prefetch)) == 0
        {
            return;
        }
        let mut hits = std::mem::take(&mut self.hit_buf);
        self.window.hits_for(&self.files, id, &mut hits);
        // Whole hits first (nothing to move), then the most bytes, then window order.
        let full = |seq: Seq, h: &Hits, window: &crate::window::Window| {
            window
                .get(seq)
                .is_some_and(|e| h.files as usize == e.files.len())
        };
        hits.sort_by(|a, b| {
            full(b.0, &b.1, &self.window)
                .cmp(&full(a.0, &a.1, &self.window))
                .then(b.1.cmp(&a.1))
                .then(a.0.cmp(&b.0))
        });
        let mut held_seqs: Vec<Seq> = hits.iter().map(|(s, _)| *s).collect();
        held_seqs.sort_unstable();
        let mut full_up = false;
        for &(seq, here) in &hits {
            match self.offer_from_window(now_us, (id, depth), seq, here, runs, busy, total) {
                Offered::Full => {
                    full_up = true;
                    break;
                }
                Offered::Taken | Offered::Declined | Offered::Unfit => {}
            }
        }
        self.hit_buf = hits;
        if full_up {
            return;
        }
        // Then from the front: tasks it holds nothing of. Declined ones are looked past up
        // to the policy's bound on skips (as spans are on the first-available path), so a
        // window of tasks all waiting for their holders costs a pass little.
        let mut declined = 0;
        let mut from: Seq = 0;
        'scan: loop {
            let chunk: Vec<Seq> = self
                .window
                .iter_from(from)
                .map(|(s, _)| s)
                .filter(|s| held_seqs.binary_search(s).is_err())
                .take(32)
                .collect();
            let Some(&last) = chunk.last() else {
                break;
            };
            from = last + 1;
            for seq in chunk {
                let offered = self.offer_from_window(
                    now_us,
                    (id, depth),
                    seq,
                    Hits::default(),
                    runs,
                    busy,
                    total,
                );
                match offered {
                    Offered::Full => break 'scan,
                    Offered::Taken | Offered::Unfit => {}
                    Offered::Declined => {
                        declined += 1;
                        if declined > self.policy.window() {
                            break 'scan;
                        }
                    }
                }
            }
        }
    }

    /// Offers worker `id`, holding `here` of its data, the task at `seq`: hands it out if the
    /// task is still ready, the worker has room for its shape and its policy accepts.
    #[allow(clippy::too_many_arguments)]
    fn offer_from_window(
        &mut self,
        now_us: u64,
        (id, depth): (WorkerId, Depth),
        seq: Seq,
        here: Hits,
        runs: &mut Vec<IndexRun>,
        busy: &mut u64,
        total: u64,
    ) -> Offered {
        let Some(entry) = self.window.get(seq) else {
            return Offered::Declined;
        };
        let (job, index) = (entry.job, entry.index);
        let Some(j) = self.jobs.get(&job).filter(|j| j.ready(index)) else {
            self.window.remove(seq);
            return Offered::Declined;
        };
        let Some(w) = self.workers.get(&id) else {
            return Offered::Full;
        };
        if w.room_for(Resources::ONE_CPU, depth.prefetch(w.offer.prefetch)) == 0 {
            return Offered::Full;
        }
        // A failed task's retry keeps away from the worker it failed on for a while, as on
        // the first-available path (see `Job::kept_from`).
        let rec = j.table.get(index);
        let elsewhere_us = if rec.runs > 0 { self.elsewhere_us() } else { 0 };
        let config = &self.config;
        let kept_from = |w: WorkerId| j.kept_from(index, &rec, w, now_us, config, elsewhere_us);
        if let Some(until) = kept_from(id) {
            self.kept_until = Some(self.kept_until.map_or(until, |k| k.min(until)));
            return Offered::Unfit;
        }
        let need = j.need;
        if !w.can_ever_run(need)
            || !j.runs_on(&w.offer)
            || !w.fits_time(j, now_us)
            || w.room_for(
                need,
                depth.prefetch(j.prefetch_for(w, self.config.prefetch_horizon_us)),
            ) == 0
        {
            return Offered::Unfit;
        }
        let util = if total == 0 {
            1.0
        } else {
            *busy as f64 / total as f64
        };
        let workers = &self.workers;
        let files = &self.files;
        let best = || {
            // The most any worker that could take it holds (a quarantined holder takes
            // nothing, so waiting for it would wait for ever; nor does the holder a retry
            // keeps away from for now).
            entry
                .files
                .iter()
                .flat_map(|&f| files.holders(f).iter().copied())
                .filter(|h| {
                    workers.get(h).is_some_and(|w| {
                        w.quarantined.is_none() && w.can_ever_run(need) && j.runs_on(&w.offer)
                    }) && kept_from(*h).is_none()
                })
                .map(|h| files.hits(h, &entry.files))
                .max()
                .unwrap_or_default()
        };
        // A task that waited while W others left is taken by any worker with room.
        let waited_its_turn = self
            .window
            .age(seq)
            .is_some_and(|a| a >= self.window_size() as u64);
        if !waited_its_turn && !j.policy(&*self.policy).accepts(here, &best, util) {
            return Offered::Declined;
        }
        self.window.remove(seq);
        let j = self.jobs.get_mut(&job).expect("checked above");
        let w = self.workers.get_mut(&id).expect("checked above");
        let free = w.offer.resources.cpus.saturating_sub(w.used.cpus);
        *busy += u64::from(need.cpus.min(free));
        j.assign(index, id, now_us);
        w.held += 1;
        w.used = w.used.plus(&need, 1);
        let run = IndexRun {
            job,
            first: index,
            count: 1,
        };
        w.ledger.push_run(run);
        IndexRun::append(runs, run);
        if w.known_jobs.insert(job) {
            self.commands.push(Command::DefineJob { worker: id, job });
        }
        Offered::Taken
    }
}

/// What became of a task offered to a worker from the window.
enum Offered {
    /// The worker took it.
    Taken,
    /// The policy would not have this worker take it (or it left): the next may do.
    Declined,
    /// The worker cannot run its shape, or has no room for it: not the policy's doing, so not
    /// counted against the scan's bound (a job this worker can never run must not hide the
    /// tasks behind it).
    Unfit,
    /// The worker has no room left for anything.
    Full,
}
