//! The executor threads that run task processes, one per slot, and their deck: tasks the
//! session has prepared to follow a running task of the same job.
//!
//! Without the deck, a slot stays empty from the moment its task ends until the session loop
//! has heard of it, picked the next task and handed it back: two thread wake-ups, about a
//! fifth of a millisecond on a loaded machine, and a sixth of the time of a millisecond task.
//! With it, the thread whose task ended takes the next one of the same job itself and starts
//! it at once; that task inherits the ended one's resources (same job, same needs) and the
//! session learns of both in one [`Done`]. Until a thread takes a decked task, the session
//! can take it back (revoke, cancel, a lost connection), so decked tasks stay queued tasks.
//!
//! The pool is the worker's [`Executor`] in `process` mode.

use crate::exec::{self, CancelHandle, ExitKind, Outcome};
use crate::executor::{Body, Done, Executor};
use crate::files::{FilesPlan, SharedFiles};
use crate::ledger::Follower;
use crate::ledger::{now_us, Key, Ledger, Running};
use crate::local::{Held, LocalTask};
use crate::reaper::Reaper;
use crate::runner::{RunnerInfo, RunnerSlot};
use crate::sandbox::{run_with_files, with_files};
use crate::WorkerError;
use kestrel_core::JobId;
use rustc_hash::FxHashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::mpsc;

/// A task handed to an executor thread.
struct Work {
    key: Key,
    body: Body,
    cancel: CancelHandle,
    /// Its files, if its job declares any (staged and collected on the thread).
    files: Option<Box<FilesPlan>>,
}

/// A task's run ended on an executor thread.
struct Ran {
    key: Key,
    outcome: Outcome,
    timeout: Option<Duration>,
    /// The decked task the thread started right after, holding what this one held.
    next: Option<Key>,
}

/// A task on the deck, or taken from it by a thread that has not reported it yet.
struct Decked {
    /// The task as it was queued, to queue it again if it is taken back.
    task: LocalTask,
    cancel: CancelHandle,
}

type Deck = Arc<Mutex<Vec<Work>>>;

/// Threads that run task processes; one per slot, so a blocking wait never delays another task.
pub(crate) struct Pool {
    tx: crossbeam_channel::Sender<Work>,
    done: mpsc::UnboundedReceiver<Ran>,
    /// Shared with the threads, which take from it.
    deck: Deck,
    /// The session's view of the deck: what it put there and has not seen started or taken
    /// back. An entry missing from `deck` was taken by a thread; its [`Done::next`] follows.
    decked: FxHashMap<Key, Decked>,
    threads: Vec<JoinHandle<()>>,
    /// Kills the tasks' process groups if this process dies; each thread records its task's.
    reaper: Option<Arc<Reaper>>,
    /// The Python its runners call functions in, if it has one.
    python: Option<RunnerInfo>,
}

/// Runs `work` on an executor thread: its process, or its call in the thread's runner
/// (`runner`: `None` on a worker without Python), inside its files if it has any.
fn run_body(
    work: &Work,
    cache: Option<&SharedFiles>,
    runner: &mut Option<RunnerSlot>,
    reaper: Option<&Reaper>,
) -> Outcome {
    match (&work.body, &work.files, cache) {
        (Body::Process(launch), Some(plan), Some(cache)) => {
            run_with_files(work.key, launch, plan, cache, &work.cancel, reaper)
        }
        (Body::Process(launch), _, _) => exec::run_with(launch, &work.cancel, reaper),
        (Body::Call(call), files, cache) => {
            let Some(slot) = runner else {
                return Outcome::ended(
                    std::time::SystemTime::now(),
                    ExitKind::Unrunnable(
                        "this worker runs no Python: start it with `--python PATH`".into(),
                    ),
                );
            };
            match (files, cache) {
                (Some(plan), Some(cache)) => {
                    with_files(work.key, plan, cache, &work.cancel, |paths| {
                        // The values among its inputs, which its arguments refer to.
                        let values: Vec<(String, PathBuf)> = paths
                            .iter()
                            .filter(|(name, _)| kestrel_core::values::is_value(name))
                            .cloned()
                            .collect();
                        slot.call(call, &values, &work.cancel, reaper)
                    })
                }
                _ => slot.call(call, &[], &work.cancel, reaper),
            }
        }
    }
}

/// The deck, also when a thread panicked holding it (its vector is still whole).
fn lock(deck: &Mutex<Vec<Work>>) -> MutexGuard<'_, Vec<Work>> {
    deck.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Pool {
    /// `threads` executor threads; tasks with files go through `cache`; function tasks call
    /// their functions in runners of the Python `python` (described by `info`, as it said
    /// when probed), one per thread.
    pub(crate) fn new(
        threads: u32,
        cache: Option<SharedFiles>,
        python: Option<(PathBuf, RunnerInfo)>,
    ) -> Result<Pool, WorkerError> {
        let (tx, rx) = crossbeam_channel::unbounded::<Work>();
        let (done_tx, done) = mpsc::unbounded_channel();
        // One thread runs one task at a time, and may keep a runner besides: that many groups
        // at most are recorded at once.
        let groups = threads as usize * if python.is_some() { 2 } else { 1 };
        let reaper = match Reaper::start(groups) {
            Ok(r) => Some(Arc::new(r)),
            Err(e) => {
                tracing::warn!(
                    "cannot start the reaper process ({e}): if this worker is killed, its running tasks will keep running"
                );
                None
            }
        };
        let deck: Deck = Arc::default();
        let mut handles = Vec::with_capacity(threads as usize);
        let program = python.as_ref().map(|(p, _)| p.clone());
        for i in 0..threads {
            let (rx, done_tx) = (rx.clone(), done_tx.clone());
            let (reaper, deck, cache) = (reaper.clone(), deck.clone(), cache.clone());
            let mut runner = program.clone().map(|p| RunnerSlot::new(p, cache.clone()));
            let handle = std::thread::Builder::new()
                .name(format!("kestrel-exec-{i}"))
                .spawn(move || {
                    while let Ok(first) = rx.recv() {
                        let mut work = first;
                        loop {
                            let outcome =
                                run_body(&work, cache.as_ref(), &mut runner, reaper.as_deref());
                            let next = take_follower(&deck, work.key.0);
                            let done = Ran {
                                key: work.key,
                                outcome,
                                timeout: work.body.timeout(),
                                next: next.as_ref().map(|n| n.key),
                            };
                            if done_tx.send(done).is_err() {
                                break;
                            }
                            match next {
                                Some(n) => work = n,
                                None => break,
                            }
                        }
                    }
                    if let Some(r) = &mut runner {
                        r.close(reaper.as_deref());
                    }
                })
                .map_err(|e| WorkerError::Setup(format!("cannot start executor thread: {e}")))?;
            handles.push(handle);
        }
        Ok(Pool {
            tx,
            done,
            deck,
            decked: FxHashMap::default(),
            threads: handles,
            reaper,
            python: python.map(|(_, info)| info),
        })
    }

    /// Runs a task on a free thread.
    fn run(&self, key: Key, body: Body, files: Option<Box<FilesPlan>>, cancel: CancelHandle) {
        let _ = self.tx.send(Work {
            key,
            body,
            cancel,
            files,
        });
    }

    /// Hands a task to a thread, or reports it failed if it cannot be launched.
    fn launch(&self, ledger: &mut Ledger, task: LocalTask, held: Held) {
        let now = now_us();
        let waited_us = now.saturating_sub(task.arrived_us);
        match ledger.local.body(&task, &held.gpus, &ledger.me) {
            Ok((body, files)) => {
                let key = (task.job, task.index);
                let cancel = CancelHandle::new();
                let run = Running {
                    cancel: cancel.clone(),
                    held,
                    waited_us,
                };
                ledger.start_running(key, run, now);
                self.run(key, body, files, cancel);
            }
            Err(reason) => {
                ledger.local.release(held);
                ledger.cannot_launch(&task, now, reason);
            }
        }
    }

    /// Whether the head of the queue may be decked: not a GPU task, and its job has fewer
    /// decked than running tasks.
    fn deckable(&self, ledger: &Ledger) -> bool {
        let Some(head) = ledger.local.queue.front() else {
            return false;
        };
        let job = head.job;
        ledger.local.jobs.get(&job).is_some_and(|def| {
            def.resources.gpus == 0 && self.decked_of(job) < ledger.running_of(job)
        })
    }

    /// Decks tasks from the head of the queue while its job has fewer decked than running
    /// tasks, so that each running task of the job can be followed by one. GPU tasks are
    /// never decked: their device list is the slot's they start on.
    fn fill_deck(&mut self, ledger: &mut Ledger) {
        loop {
            // Only a head that could be decked is worth passing (a scan after every event
            // otherwise, while the head's fetch lasts).
            if !self.deckable(ledger) {
                return;
            }
            if ledger.prefer_staged(false) && !self.deckable(ledger) {
                return;
            }
            let Some(task) = ledger.local.queue.pop_front() else {
                return;
            };
            match ledger.local.body(&task, &[], &ledger.me) {
                Ok((body, files)) => self.put_on_deck(task, body, files, CancelHandle::new()),
                Err(reason) => ledger.cannot_launch(&task, now_us(), reason),
            }
        }
    }

    /// How many tasks of `job` are decked.
    fn decked_of(&self, job: JobId) -> usize {
        self.decked.keys().filter(|(j, _)| *j == job).count()
    }

    /// Puts `task` on the deck, to follow the next task of its job that ends.
    fn put_on_deck(
        &mut self,
        task: LocalTask,
        body: Body,
        files: Option<Box<FilesPlan>>,
        cancel: CancelHandle,
    ) {
        let key = (task.job, task.index);
        lock(&self.deck).push(Work {
            key,
            body,
            cancel: cancel.clone(),
            files,
        });
        self.decked.insert(key, Decked { task, cancel });
    }

    /// A thread's report, with the session's record of the decked task it went on to (now a
    /// running task).
    fn resolve(&mut self, ran: Ran) -> Done {
        let next = ran.next.and_then(|key| {
            let d = self.decked.remove(&key)?;
            Some(Follower {
                key,
                cancel: d.cancel,
                arrived_us: d.task.arrived_us,
            })
        });
        Done {
            key: ran.key,
            outcome: ran.outcome,
            timeout: ran.timeout,
            next,
        }
    }

    fn take_back_where(&mut self, mut pick: impl FnMut(&Key) -> bool) -> Vec<LocalTask> {
        let mut deck = lock(&self.deck);
        let mut back = Vec::new();
        deck.retain(|w| {
            if !pick(&w.key) {
                return true;
            }
            if let Some(d) = self.decked.remove(&w.key) {
                back.push(d.task);
            }
            false
        });
        back
    }

    /// Cancels the decked tasks `pick` chooses (those taken by a thread end as canceled).
    fn cancel_decked(&self, pick: impl Fn(&Key) -> bool) {
        for (key, d) in &self.decked {
            if pick(key) {
                d.cancel.cancel();
            }
        }
    }
}

impl Executor for Pool {
    fn kind(&self) -> &'static str {
        "process"
    }

    fn python(&self) -> Option<&RunnerInfo> {
        self.python.as_ref()
    }

    /// Starts queued tasks while slots are free, then decks the next ones to follow running
    /// tasks of their job.
    fn start(&mut self, ledger: &mut Ledger) {
        loop {
            ledger.prefer_staged(true);
            let Some((task, held)) = ledger.local.next_startable() else {
                break;
            };
            self.launch(ledger, task, held);
        }
        self.fill_deck(ledger);
    }

    fn poll_done(&mut self, cx: &mut Context<'_>) -> Poll<Option<Done>> {
        self.done
            .poll_recv(cx)
            .map(|ran| ran.map(|ran| self.resolve(ran)))
    }

    fn try_done(&mut self) -> Option<Done> {
        let ran = self.done.try_recv().ok()?;
        Some(self.resolve(ran))
    }

    /// Takes back the decked tasks among `keys` that no thread has taken, in deck order.
    fn take_back(&mut self, keys: &[Key]) -> Vec<LocalTask> {
        self.take_back_where(|k| keys.contains(k))
    }

    /// Takes back every decked task no thread has taken, in deck order.
    fn take_back_all(&mut self) -> Vec<LocalTask> {
        self.take_back_where(|_| true)
    }

    fn cancel(&mut self, keys: &[Key]) -> Vec<LocalTask> {
        let back = self.take_back(keys);
        self.cancel_decked(|k| keys.contains(k));
        back
    }

    fn cancel_all(&mut self) {
        self.take_back_all();
        self.cancel_decked(|_| true);
    }

    /// Takes back the decked tasks of `job` that no running task of it can follow: beyond
    /// the first `running` of them (in deck order), those no thread has taken.
    ///
    /// A thread whose task ended looks at the deck once, and the session counts that task as
    /// running until it hears of the end: a task it decked in between would wait for a
    /// follower that never comes (the last task of a sweep waited forever this way).
    fn unfollowed(&mut self, job: JobId, running: usize) -> Vec<LocalTask> {
        let mut seen = 0;
        self.take_back_where(|k| {
            if k.0 != job {
                return false;
            }
            seen += 1;
            seen > running
        })
    }

    /// Ends the executor threads once their tasks have ended (call it when none runs, or it
    /// waits for them), then closes the reaper's pipe and reaps it, leaving no process behind.
    fn close(mut self: Box<Self>) {
        self.take_back_all();
        let Pool {
            tx,
            done,
            threads,
            reaper,
            ..
        } = *self;
        drop(tx);
        drop(done);
        for t in threads {
            let _ = t.join();
        }
        // The threads' references are gone: this drop closes the pipe.
        drop(reaper);
    }
}

/// Takes the first decked task of `job`, the one queued earliest.
fn take_follower(deck: &Mutex<Vec<Work>>, job: JobId) -> Option<Work> {
    let mut deck = lock(deck);
    let at = deck.iter().position(|w| w.key.0 == job)?;
    Some(deck.remove(at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Launch;
    use crate::executor::next_done;
    use kestrel_core::TaskIndex;

    fn task(job: JobId, index: TaskIndex) -> LocalTask {
        LocalTask::of_template(job, index, 0)
    }

    fn launch(argv: &[&str]) -> Body {
        Body::Process(Launch {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..Launch::default()
        })
    }

    fn recv(pool: &mut Pool) -> Done {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(next_done(pool)).expect("a run ends")
    }

    fn close(pool: Pool) {
        Box::new(pool).close();
    }

    #[test]
    fn an_ended_task_is_followed_by_the_decked_task_of_its_job_only() {
        let mut pool = Pool::new(1, None, None).unwrap();
        pool.put_on_deck(task(2, 1), launch(&["true"]), None, CancelHandle::new());
        pool.put_on_deck(task(1, 7), launch(&["false"]), None, CancelHandle::new());
        assert_eq!((pool.decked_of(1), pool.decked_of(2)), (1, 1));
        pool.run((1, 1), launch(&["true"]), None, CancelHandle::new());

        let first = recv(&mut pool);
        let next = first.next.as_ref().map(|f| f.key);
        assert_eq!((first.key, next), ((1, 1), Some((1, 7))));
        assert_eq!(first.outcome.status, ExitKind::Exited(0));
        assert_eq!(pool.decked_of(1), 0, "the follower runs: no longer decked");
        let second = recv(&mut pool);
        assert_eq!((second.key, second.next.is_none()), ((1, 7), true));
        assert_eq!(second.outcome.status, ExitKind::Exited(1));

        // The other job's task was never taken: it goes back as it was queued.
        assert_eq!(pool.take_back_all(), vec![task(2, 1)]);
        assert_eq!(pool.decked_of(2), 0);
        close(pool);
    }

    #[test]
    fn a_task_decked_after_its_job_last_ran_is_taken_back() {
        let mut pool = Pool::new(1, None, None).unwrap();
        pool.run((1, 1), launch(&["true"]), None, CancelHandle::new());
        let first = recv(&mut pool);
        assert!(first.next.is_none(), "nothing was decked when it ended");
        // The session decks two tasks of the job before it hears of that end (it still counts
        // one task running), and one of another job.
        pool.put_on_deck(task(1, 2), launch(&["true"]), None, CancelHandle::new());
        pool.put_on_deck(task(2, 9), launch(&["true"]), None, CancelHandle::new());
        pool.put_on_deck(task(1, 3), launch(&["true"]), None, CancelHandle::new());
        // No task of job 1 runs now: both would wait for ever; with one running, the second.
        assert_eq!(pool.unfollowed(1, 1), vec![task(1, 3)]);
        assert_eq!(pool.unfollowed(1, 0), vec![task(1, 2)]);
        assert_eq!((pool.decked_of(1), pool.decked_of(2)), (0, 1));
        close(pool);
    }

    #[test]
    fn taken_back_tasks_never_run_and_canceled_ones_end_canceled() {
        let mut pool = Pool::new(1, None, None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let touch = launch(&["touch", marker.to_str().unwrap()]);
        pool.put_on_deck(task(1, 2), touch.clone(), None, CancelHandle::new());
        pool.put_on_deck(task(1, 3), touch.clone(), None, CancelHandle::new());
        pool.put_on_deck(task(1, 4), touch, None, CancelHandle::new());
        assert_eq!(pool.take_back(&[(1, 2)]), vec![task(1, 2)]);
        pool.cancel_decked(|k| *k == (1, 3));
        // A thread has not taken it: a cancel gives it back.
        assert_eq!(pool.cancel(&[(1, 4)]), vec![task(1, 4)]);
        pool.run((1, 1), launch(&["true"]), None, CancelHandle::new());

        let first = recv(&mut pool);
        assert_eq!(first.next.as_ref().map(|f| f.key), Some((1, 3)));
        let second = recv(&mut pool);
        assert_eq!(
            (second.key, second.outcome.status),
            ((1, 3), ExitKind::Canceled)
        );
        assert!(!marker.exists(), "no decked task started a process");
        close(pool);
    }
}
