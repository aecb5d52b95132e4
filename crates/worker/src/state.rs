//! What a worker keeps from its start to its end, across connections: [`WorkerState`].

use crate::executor::{Executor, Noop};
use crate::ledger::Ledger;
use crate::pool::Pool;
use crate::staging::Staging;
use crate::{ExecMode, WorkerConfig, WorkerError};
use kestrel_core::WorkerId;

/// Everything of a worker that outlives its connections; a session (`session::serve`) borrows
/// it for one connection's life.
///
/// The worker's data cache (files kept for later tasks, served to peers) and its Python
/// runners (processes that keep an interpreter warm between function tasks) will live here
/// too: the cache beside `staging`, which fills it; the runners inside an executor.
pub(crate) struct WorkerState {
    /// Runs the tasks; chosen once, from [`WorkerConfig::exec`].
    pub(crate) exec: Box<dyn Executor>,
    /// The step between "assigned" and "queued for a slot".
    pub(crate) staging: Staging,
    /// What the next registration hands over.
    pub(crate) carry: Carry,
}

/// What outlives a dropped connection: templates, running tasks and their buffered results,
/// so the next registration hands them over instead of the server running them again.
pub(crate) struct Carry {
    pub(crate) ledger: Ledger,
    /// Worker id, server id and epoch of the last registration.
    pub(crate) prev: Option<(WorkerId, String, u64)>,
}

impl Carry {
    /// Whether the worker has registered with a server at least once.
    pub(crate) fn registered(&self) -> bool {
        self.prev.is_some()
    }
}

impl WorkerState {
    /// A worker's state before its first connection, with the executor its `config` asks for.
    pub(crate) fn new(config: &WorkerConfig) -> Result<WorkerState, WorkerError> {
        let exec: Box<dyn Executor> = match config.exec {
            ExecMode::Process => Box::new(Pool::new(config.slots.max(1))?),
            ExecMode::Noop => Box::new(Noop),
        };
        Ok(WorkerState::with_executor(config, exec))
    }

    /// A worker's state before its first connection, running tasks with `exec`.
    pub(crate) fn with_executor(config: &WorkerConfig, exec: Box<dyn Executor>) -> WorkerState {
        WorkerState {
            exec,
            staging: Staging::default(),
            carry: Carry {
                ledger: Ledger::new(config),
                prev: None,
            },
        }
    }

    /// The connection is gone for good: stops the tasks and waits until they are reaped.
    pub(crate) async fn abandon(&mut self) {
        crate::executor::abandon(&mut self.carry.ledger, self.exec.as_mut()).await;
    }

    /// Ends the executor. Every task has ended by now: its threads are idle, and the reaper
    /// exits.
    pub(crate) fn close(self) {
        self.exec.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exec_mode_chooses_the_executor_once() {
        let mut config = WorkerConfig::new(1);
        config.exec = ExecMode::Noop;
        let noop = WorkerState::new(&config).unwrap();
        assert_eq!(noop.exec.kind(), "noop");
        assert!(!noop.carry.registered());
        noop.close();
        config.exec = ExecMode::Process;
        let process = WorkerState::new(&config).unwrap();
        assert_eq!(process.exec.kind(), "process");
        process.close();
    }
}
