//! What the scheduler tests share: a plain job and an array of tasks.

#![allow(dead_code)]

use kestrel_core::*;

/// A job named `name` of `/bin/true` tasks, one cpu each, no retries, output discarded.
pub fn spec(name: &str) -> JobSpec {
    JobSpec::command(name, vec!["/bin/true".into()])
}

/// The tasks of an array with ids `1..=n`.
pub fn array(n: u32) -> TaskSet {
    TaskSet::Array(IdRanges::span(1, n))
}

/// Runs one scheduling pass at `now` and returns the runs of tasks it assigned (the other
/// commands are dropped).
pub fn assigned_runs(s: &mut Scheduler, now: u64) -> Vec<IndexRun> {
    s.handle(now, Event::Schedule).unwrap();
    s.take_commands()
        .into_iter()
        .flat_map(|c| match c {
            Command::Assign { runs, .. } => runs,
            _ => Vec::new(),
        })
        .collect()
}

/// Runs one scheduling pass at `now` and returns its assignments as `(worker, job, tasks)`,
/// sorted.
pub fn assignments(s: &mut Scheduler, now: u64) -> Vec<(WorkerId, JobId, u32)> {
    s.handle(now, Event::Schedule).expect("schedules");
    let mut got: Vec<_> = s
        .take_commands()
        .into_iter()
        .filter_map(|c| match c {
            Command::Assign { worker, runs } => Some(
                runs.into_iter()
                    .map(move |r| (worker, r.job, r.count))
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect();
    got.sort_unstable();
    got
}

/// A worker of 2 slots, no prefetch, with a cache if `stages_files`, with Python runners if
/// `runs_functions`.
pub fn offer(stages_files: bool, runs_functions: bool) -> WorkerOffer {
    WorkerOffer {
        hostname: "w".into(),
        resources: Resources {
            cpus: 2,
            ..Resources::NONE
        },
        prefetch: 0,
        named: Vec::new(),
        stages_files,
        runs_functions,
    }
}

/// Joins a worker of `slots` slots, no prefetch, that stages files, to `s`.
pub fn staging_worker(s: &mut Scheduler, slots: u32) -> WorkerId {
    s.worker_joined(
        0,
        WorkerOffer {
            hostname: "w".into(),
            resources: Resources {
                cpus: slots,
                ..Resources::NONE
            },
            prefetch: 0,
            named: vec![],
            stages_files: true,
            runs_functions: false,
        },
    )
}

/// The scheduler's events as methods, each handing one [`Event`] to [`Scheduler::handle`]: tests
/// read as the steps they take, and the replies come back typed.
pub trait Events {
    fn call(&mut self, now: u64, ev: Event) -> Result<Reply, SchedError>;

    fn submit(
        &mut self,
        now: u64,
        spec: JobSpec,
        tasks: TaskSet,
        open: bool,
    ) -> Result<JobId, SchedError> {
        let ev = Event::Submit {
            spec: Box::new(spec),
            tasks,
            open,
            key: None,
        };
        match self.call(now, ev)? {
            Reply::Submitted(job) => Ok(job),
            other => panic!("a submission answered {other:?}"),
        }
    }

    fn extend_with(
        &mut self,
        now: u64,
        job: JobId,
        at: u32,
        more: TaskSet,
        close: bool,
    ) -> Result<(), SchedError> {
        let ev = Event::Extend {
            job,
            at,
            more,
            close,
        };
        self.call(now, ev).map(|_| ())
    }

    /// [`Self::extend_with`] for a list of commands.
    fn extend(
        &mut self,
        now: u64,
        job: JobId,
        at: u32,
        argvs: Vec<Vec<String>>,
        close: bool,
    ) -> Result<(), SchedError> {
        self.extend_with(now, job, at, TaskSet::List(argvs), close)
    }

    fn cancel_job(&mut self, now: u64, job: JobId) -> Result<(u32, u32), SchedError> {
        match self.call(now, Event::Cancel { job })? {
            Reply::Canceled { queued, running } => Ok((queued, running)),
            other => panic!("a cancel answered {other:?}"),
        }
    }

    fn retry_job(&mut self, job: JobId, failed_only: bool) -> Result<(u32, u32), SchedError> {
        match self.call(0, Event::Retry { job, failed_only })? {
            Reply::Retried { failed, canceled } => Ok((failed, canceled)),
            other => panic!("a retry answered {other:?}"),
        }
    }

    fn forget_job(&mut self, job: JobId) -> Result<(), SchedError> {
        self.call(0, Event::Forget { job }).map(|_| ())
    }

    fn worker_joined(&mut self, now: u64, offer: WorkerOffer) -> WorkerId {
        match self.call(now, Event::WorkerJoined { offer }) {
            Ok(Reply::Joined(worker)) => worker,
            other => panic!("a joining worker answered {other:?}"),
        }
    }

    fn worker_seen(&mut self, now: u64, worker: WorkerId) {
        self.call(now, Event::WorkerSeen { worker })
            .expect("never refused");
    }

    fn worker_lost(&mut self, now: u64, worker: WorkerId) {
        self.call(now, Event::WorkerLost { worker })
            .expect("never refused");
    }

    fn worker_resumed(
        &mut self,
        now: u64,
        worker: WorkerId,
        previous: Option<WorkerId>,
        running: Vec<(JobId, TaskIndex)>,
        finished: Vec<Finished>,
    ) -> Resumed {
        let ev = Event::WorkerResumed {
            worker,
            previous,
            running,
            finished,
        };
        match self.call(now, ev) {
            Ok(Reply::Resumed(r)) => r,
            other => panic!("a resumed worker answered {other:?}"),
        }
    }

    fn resume_worker(&mut self, worker: WorkerId) -> Result<bool, SchedError> {
        match self.call(0, Event::LiftQuarantine { worker })? {
            Reply::Lifted { was_quarantined } => Ok(was_quarantined),
            other => panic!("a lifted quarantine answered {other:?}"),
        }
    }

    fn task_started(
        &mut self,
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        at_us: u64,
    ) -> Accepted {
        let started = vec![Started { job, index, at_us }];
        reports(self.call(at_us, Event::TasksStarted { worker, started }))
    }

    fn task_finished(&mut self, now: u64, worker: WorkerId, f: Finished) -> Accepted {
        reports(self.call(
            now,
            Event::TasksEnded {
                worker,
                ends: vec![f],
            },
        ))
    }

    /// The ends of one update; returns how many were ignored.
    fn tasks_finished(&mut self, now: u64, worker: WorkerId, ends: Vec<Finished>) -> u32 {
        match self.call(now, Event::TasksEnded { worker, ends }) {
            Ok(Reply::Reports { ignored, .. }) => ignored,
            other => panic!("an update answered {other:?}"),
        }
    }

    fn add_slot_wait(&mut self, job: JobId, waited_us: u64) {
        self.call(0, Event::SlotWait { job, waited_us })
            .expect("never refused");
    }

    fn task_undeliverable(
        &mut self,
        now: u64,
        worker: WorkerId,
        job: JobId,
        index: TaskIndex,
        failure: Failure,
    ) {
        let ev = Event::Undeliverable {
            worker,
            job,
            index,
            failure,
        };
        self.call(now, ev).expect("never refused");
    }

    fn tasks_revoked(&mut self, now: u64, worker: WorkerId, tasks: Vec<(JobId, TaskIndex)>) {
        self.call(now, Event::TasksRevoked { worker, tasks })
            .expect("never refused");
    }

    fn tick(&mut self, now: u64) {
        self.call(now, Event::Tick).expect("never refused");
    }

    fn schedule(&mut self, now: u64) {
        self.call(now, Event::Schedule).expect("never refused");
    }
}

impl Events for Scheduler {
    fn call(&mut self, now: u64, ev: Event) -> Result<Reply, SchedError> {
        self.handle(now, ev)
    }
}

/// A report's reply as the one report it was about.
fn reports(reply: Result<Reply, SchedError>) -> Accepted {
    match reply {
        Ok(Reply::Reports { recorded: 1, .. }) => Accepted::Recorded,
        Ok(Reply::Reports { .. }) => Accepted::Ignored,
        other => panic!("a report answered {other:?}"),
    }
}
