//! The ways a worker runs tasks, behind one trait: [`Executor`]. Each worker has one, chosen
//! once from its [`ExecMode`](crate::ExecMode) (see `WorkerState::new`): the process pool
//! (`pool.rs`: executor threads, the deck, the reaper; each thread runs a task's [`Body`], a
//! process or a call in its Python runner, `runner.rs`) or [`Noop`] (benchmarks).
//!
//! The session calls its executor through `&mut dyn Executor` once per event it handles (a
//! message, a batch of ended runs, a heartbeat), not once per task it starts:
//! [`Executor::start`] takes every task that can start from the [`Ledger`] in a loop of its
//! own, which the compiler sees whole. The no-op path, where the worker's cost per task is the
//! benchmark, stays one loop over the queue with no call through the trait, allocation or
//! clock read per task. Only ended runs come back one call each, and only from an executor
//! that runs something (a process takes a thousand times longer than the call).

use crate::exec::{Launch, Outcome};
use crate::ledger::{micros, now_us, Follower, Key, Ledger};
use crate::local::LocalTask;
use kestrel_core::JobId;
use std::task::{Context, Poll};
use std::time::Duration;

/// A way of running tasks. The session owns the queue, the resources and the reports (the
/// [`Ledger`]); an executor starts tasks from it, and reports how each run ended.
pub(crate) trait Executor: Send {
    /// Its name in the worker's registration (`process`, `noop`).
    fn kind(&self) -> &'static str;

    /// The Python its runners call function tasks in, if it calls them.
    fn python(&self) -> Option<&crate::runner::RunnerInfo> {
        None
    }

    /// Starts the queued tasks whose resources are free (taking them from
    /// `ledger.local.next_startable()`), recording each in `ledger` as started
    /// ([`Ledger::start_running`]) or already ended. It may also take tasks from the head of
    /// the queue to start the moment a running task of their job ends (the pool's deck); the
    /// session can take those back until they start. Called after every event the session
    /// handles, so it must cost nothing when nothing can start.
    fn start(&mut self, ledger: &mut Ledger);

    /// The next ended run of a task [`start`](Executor::start) reported started: `Pending`
    /// while none has ended, `Ready(None)` once none ever will (the session then stops asking).
    /// An executor whose runs all end inside `start` (noop) may stay `Pending` for good.
    fn poll_done(&mut self, cx: &mut Context<'_>) -> Poll<Option<Done>>;

    /// The next ended run, if one is waiting.
    fn try_done(&mut self) -> Option<Done>;

    /// Gives back the tasks among `keys` that it took from the queue and has not started.
    fn take_back(&mut self, _keys: &[Key]) -> Vec<LocalTask> {
        Vec::new()
    }

    /// Gives back every task it took from the queue and has not started (the connection
    /// dropped: the server queues them again).
    fn take_back_all(&mut self) -> Vec<LocalTask> {
        Vec::new()
    }

    /// Cancels the tasks among `keys` it took from the queue: gives back those it has not
    /// started; those it started but not reported yet end as canceled.
    fn cancel(&mut self, _keys: &[Key]) -> Vec<LocalTask> {
        Vec::new()
    }

    /// [`cancel`](Executor::cancel) for every task it took from the queue; drops what it gives back.
    fn cancel_all(&mut self) {}

    /// After a run of `job` ended with no task following it: gives back the tasks of `job`
    /// it took from the queue that none of its `running` runs can follow any more.
    fn unfollowed(&mut self, _job: JobId, _running: usize) -> Vec<LocalTask> {
        Vec::new()
    }

    /// Ends the executor (threads, helper processes). Called once no task runs.
    fn close(self: Box<Self>) {}
}

/// What a task runs: a process, or a call of its job's function in a Python runner.
#[derive(Clone, Debug)]
pub(crate) enum Body {
    Process(Launch),
    Call(crate::runner::Call),
}

impl Body {
    /// How long it may run.
    pub(crate) fn timeout(&self) -> Option<Duration> {
        match self {
            Body::Process(l) => l.timeout,
            Body::Call(c) => c.timeout,
        }
    }
}

/// A task's run ended.
pub(crate) struct Done {
    pub(crate) key: Key,
    pub(crate) outcome: Outcome,
    /// The run's timeout, to say how long it ran if it timed out.
    pub(crate) timeout: Option<Duration>,
    /// The task the executor started in its place, holding what this one held.
    pub(crate) next: Option<Follower>,
}

/// The next ended run of `exec`, waiting for one.
pub(crate) async fn next_done(exec: &mut dyn Executor) -> Option<Done> {
    std::future::poll_fn(|cx| exec.poll_done(cx)).await
}

/// The connection is gone for good: stops the tasks of `ledger`, waits until `exec` reports
/// each ended, and drops everything there was to report of them (ends, outputs, starts,
/// waits).
pub(crate) async fn abandon(ledger: &mut Ledger, exec: &mut dyn Executor) {
    // Those it has not started were only queued there; the others end at once.
    exec.cancel_all();
    for r in ledger.running.values() {
        r.cancel.cancel();
    }
    while !ledger.running.is_empty() {
        let Some(done) = next_done(exec).await else {
            break;
        };
        let held = ledger.running.remove(&done.key).map(|r| r.held);
        // A follower was canceled above: it ends at once, and is waited for like the rest.
        let finished_us = micros(done.outcome.finished);
        let _ = ledger.hand_on(done.next, finished_us, held.unwrap_or_default());
    }
    ledger.finished.clear();
    ledger.outputs.clear();
    // Starts of followers that began meanwhile too.
    ledger.started.clear();
    ledger.waited.clear();
}

/// Benchmark mode: every task succeeds the moment its resources are free, and nothing runs.
pub(crate) struct Noop;

impl Executor for Noop {
    fn kind(&self) -> &'static str {
        "noop"
    }

    fn start(&mut self, ledger: &mut Ledger) {
        // A whole batch ends at one instant: one clock read serves it.
        let now = now_us();
        while let Some((task, held)) = ledger.local.next_startable() {
            ledger.succeeded_at_once(&task, held, now);
        }
    }

    fn poll_done(&mut self, _cx: &mut Context<'_>) -> Poll<Option<Done>> {
        // Nothing ever runs, so nothing ends later; and no waker is kept to wake.
        Poll::Pending
    }

    fn try_done(&mut self) -> Option<Done> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WorkerConfig;
    use kestrel_core::{IndexRun, Resources, RunEnd, TaskTemplate};
    use kestrel_proto::messages::{Assigned, JobIds};

    #[test]
    fn the_noop_executor_ends_every_task_it_can_start_at_once() {
        let mut ledger = Ledger::new(&WorkerConfig::new(2));
        let one_cpu = Resources {
            cpus: 1,
            ..Resources::NONE
        };
        ledger.local.define(
            1,
            TaskTemplate::default(),
            JobIds::List,
            one_cpu,
            vec![],
            None,
        );
        // Three GPUs' worth of a job on a worker without GPUs: those never start.
        let gpus = Resources { gpus: 3, ..one_cpu };
        ledger
            .local
            .define(2, TaskTemplate::default(), JobIds::List, gpus, vec![], None);
        let run = |job, first, count| Assigned::run(IndexRun { job, first, count });
        // Five tasks on two slots: each ends before the next needs its slot.
        ledger.local.enqueue(run(1, 0, 5), 10);
        ledger.local.enqueue(run(2, 0, 1), 10);

        let mut noop = Noop;
        noop.start(&mut ledger);
        let ended: Vec<_> = ledger.finished.iter().map(|f| (f.job, f.index)).collect();
        assert_eq!(ended, [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]);
        assert!(ledger.finished.iter().all(|f| f.end == RunEnd::Success));
        assert!(ledger.running.is_empty() && ledger.started.is_empty());
        assert_eq!(ledger.waited.len(), 1, "one sum for the job");
        assert_eq!(ledger.local.queue.len(), 1, "the GPU task waits");
        assert!(noop.try_done().is_none());

        // The slots were given back: a task assigned later starts too.
        assert_eq!(ledger.local.unqueue(&[(2, 0)]), [(2, 0)]);
        ledger.local.enqueue(run(1, 5, 1), 10);
        noop.start(&mut ledger);
        assert_eq!(ledger.finished.len(), 6);
        assert!(ledger.local.queue.is_empty());
    }
}
