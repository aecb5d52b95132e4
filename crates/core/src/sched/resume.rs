//! A worker that reconnects with tasks it still runs and results it got meanwhile.

use super::worker::holder;
use super::{Accepted, Scheduler};
use crate::outcome::{Command, Finished};
use crate::spec::{JobId, TaskIndex, TaskState, WorkerId};
use rustc_hash::FxHashSet;

/// How a resumed worker's task relates to the server's view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claim {
    /// The task is now assigned to the worker.
    Taken,
    /// Another worker has it too.
    Duplicate,
    /// The task already ended, or does not exist.
    Ended,
}

/// What [`super::Event::WorkerResumed`] did with a reconnected worker's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resumed {
    /// Running tasks taken back by the worker instead of being run again.
    pub taken: u32,
    /// Running tasks already assigned to another worker: both runs go on, the first success
    /// is kept.
    pub duplicates: u32,
    /// Results recorded (each also as a [`crate::Record::Ended`]).
    pub recorded: u32,
    /// Results and running tasks ignored (task already ended, unknown job or task).
    pub ignored: u32,
}

impl Scheduler {
    /// A worker that lost its connection registered again (as `worker`: its old id back, or
    /// a new one) and reports the tasks it still runs and the results it got while
    /// disconnected. `previous` is its id before, if it was registered with this scheduler
    /// (its connection may not have been noticed dead yet): that registration is dropped
    /// without counting crashes.
    ///
    /// - A result of a task not yet ended is recorded, once: a task that already ended ignores
    ///   it. A result of a task now assigned to another worker is recorded too if it is a
    ///   success (the other run is canceled); a failure there is ignored (the other run decides).
    /// - A running task that is ready again (re-queued after the loss) or was assigned to
    ///   `previous` is taken back by `worker` instead of being run again.
    /// - A running task already assigned to another worker keeps both runs; the first
    ///   success to arrive is kept, the other report is ignored.
    pub(crate) fn worker_resumed(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        previous: Option<WorkerId>,
        running: Vec<(JobId, TaskIndex)>,
        finished: Vec<Finished>,
    ) -> Resumed {
        let mut out = Resumed::default();
        if !self.workers.contains_key(&worker) {
            out.ignored = (running.len() + finished.len()) as u32;
            return out;
        }
        let keep = || -> FxHashSet<(JobId, TaskIndex)> {
            running
                .iter()
                .copied()
                .chain(finished.iter().map(|f| (f.job, f.index)))
                .collect()
        };
        match previous {
            Some(p) if p == worker => {
                // Its id came back (see `worker_rejoined`); a registration it replaced hands
                // over what the worker still runs or has results for.
                if let Some(old) = self.superseded.take_if(|w| w.id == p) {
                    let keep = keep();
                    let moved = self.held_of(&old, &keep);
                    self.requeue_held(now_us, old, false, &keep);
                    self.hold_moved(worker, moved);
                }
            }
            Some(p) if self.workers.contains_key(&p) => {
                // Registered under a new id while the old one is still held (its connection
                // not yet noticed dead): tasks it still runs or has results for move over;
                // the rest go back to the queue.
                let keep = keep();
                let moved = self.held_of(&self.workers[&p], &keep);
                self.drop_worker(now_us, p, false, &keep);
                self.node_moved(p, worker);
                self.hold_moved(worker, moved);
            }
            _ => {}
        }
        // A quarantine outlives the connection (the previous registration was dropped above
        // or when its loss was noticed).
        if let Some(reason) = previous.and_then(|p| self.quarantined_gone.remove(&p)) {
            if let Some(w) = self.workers.get_mut(&worker) {
                w.quarantined = Some(reason.clone());
                self.open.insert(worker);
            }
            self.commands.push(Command::Quarantined { worker, reason });
        }
        self.note_templates(worker, &running);
        let mut stale = Vec::new();
        for (job, index) in running {
            match self.claim(now_us, worker, job, index, true) {
                Claim::Taken => out.taken += 1,
                Claim::Duplicate => out.duplicates += 1,
                Claim::Ended => {
                    // Its result is no longer wanted: stop the run and free the slot.
                    out.ignored += 1;
                    stale.push((job, index));
                }
            }
        }
        if !stale.is_empty() {
            self.commands.push(Command::Cancel {
                worker,
                tasks: stale,
            });
        }
        for f in finished {
            if self.claim(now_us, worker, f.job, f.index, false) == Claim::Ended {
                out.ignored += 1;
                continue;
            }
            match self.task_finished(now_us, worker, f) {
                Accepted::Recorded => out.recorded += 1,
                Accepted::Ignored => out.ignored += 1,
            }
        }
        out
    }

    /// The tasks `from` holds that are in `keep`.
    fn held_of(
        &self,
        from: &super::Worker,
        keep: &FxHashSet<(JobId, TaskIndex)>,
    ) -> Vec<(JobId, TaskIndex)> {
        let mut holds = holder(&self.jobs, from.id);
        from.ledger
            .held(|job, index| keep.contains(&(job, index)) && holds(job, index))
    }

    /// Makes `worker` hold `moved`, tasks its previous registration held: their records
    /// name it from now on; their states stay as they were.
    fn hold_moved(&mut self, worker: WorkerId, moved: Vec<(JobId, TaskIndex)>) {
        for (job, index) in moved {
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            let need = j.need;
            let rec = j.table.get_mut(index);
            rec.worker = worker;
            let running = rec.state == TaskState::Running;
            if let Some(w) = self.workers.get_mut(&worker) {
                w.hold(job, index, need, running);
            }
        }
    }

    /// A resumed worker keeps the templates of the jobs it still runs tasks of (and only
    /// those): it is told to forget each when its job ends, at once if it has ended already.
    fn note_templates(&mut self, worker: WorkerId, running: &[(JobId, TaskIndex)]) {
        let mut seen: Vec<JobId> = Vec::new();
        for &(job, _) in running {
            if seen.contains(&job) {
                continue;
            }
            seen.push(job);
            let live = self.jobs.get(&job).is_some_and(|j| j.finished_us.is_none());
            match self.workers.get_mut(&worker) {
                Some(w) if live => {
                    w.known_jobs.insert(job);
                }
                Some(_) => self.commands.push(Command::ForgetJob { worker, job }),
                None => {}
            }
        }
    }

    /// Makes a task a resumed worker runs (or ran) its own if it is ready again; notes it as a
    /// duplicate run if another worker has it.
    fn claim(
        &mut self,
        now_us: u64,
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        running: bool,
    ) -> Claim {
        let Some(j) = self.jobs.get_mut(&job) else {
            return Claim::Ended;
        };
        if index >= j.len() {
            return Claim::Ended;
        }
        let rec = j.table.get(index);
        let shown = j.record(index).state;
        if shown.is_terminal() {
            return Claim::Ended;
        }
        if j.spec.nodes > 0 && rec.worker != worker {
            // A multi-node run is its set's: without it (lost, or run elsewhere), it stops.
            return Claim::Ended;
        }
        if rec.state != TaskState::Ready {
            if rec.worker == worker {
                // Moved over from its previous registration.
                if running && rec.state == TaskState::Assigned {
                    let cpus = j.need.cpus;
                    let rec = j.set_state(index, TaskState::Running);
                    rec.runs = rec.runs.saturating_add(1);
                    if let Some(w) = self.workers.get_mut(&worker) {
                        w.running_cpus += cpus;
                    }
                }
                return Claim::Taken;
            }
            let Some(w) = self.workers.get_mut(&worker) else {
                return Claim::Ended;
            };
            w.duplicates.insert((job, index));
            return Claim::Duplicate;
        }
        // Ready: re-queued after the loss. Its queue entry is skipped when reached.
        if let Some(due) = self.delayed_at.remove(&(job, index)) {
            self.delayed.remove(&(due, job, index));
        }
        let Some(w) = self.workers.get_mut(&worker) else {
            return Claim::Ended;
        };
        let need = j.need;
        let rec = j.set_state(index, TaskState::Running);
        rec.worker = worker;
        rec.assigned_us = now_us;
        rec.started_us = now_us;
        rec.finished_us = 0;
        w.hold(job, index, need, true);
        Claim::Taken
    }
}
