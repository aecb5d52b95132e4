//! The journal's writer: a thread of its own that commits what the engine gathered, so that
//! the engine's loop neither encodes the batch's task ends nor waits for SQLite and the disk
//! (issue 32: the commit on the loop cost a third of the dispatch rate).
//!
//! The engine hands over a whole [`Pending`] and goes on; the thread seals it (the task ends'
//! encoding), writes it in one transaction and sends back a [`Done`], in the order the commits
//! were handed over, waking the engine through a [`Notify`]. The engine may also wait for the
//! commits it handed over (a submission must be durable before its tasks go out). The thread
//! owns its own connection to the journal file; the engine keeps another for reads.

use super::{Journal, Pending};
use std::sync::mpsc;
use std::sync::Arc;
use tokio::sync::Notify;

/// What the engine asks of the writer.
enum Work {
    /// Write this in one transaction.
    Commit(Box<Pending>),
    /// Give back a step of the room forgotten jobs left (see [`Journal::compact_step`]).
    Compact,
    /// Say when everything handed over before is done (tests).
    #[cfg(test)]
    Barrier(mpsc::Sender<()>),
}

/// A commit carried out, in the order they were handed over.
pub struct Done {
    /// What failed, if the commit did.
    pub result: Result<(), Failed>,
    /// Rows in the log after it.
    pub rows: u64,
    /// The emptied batch, for the engine to gather the next one in (its buffers kept).
    pub pending: Box<Pending>,
}

/// A commit that failed.
pub struct Failed {
    /// What it means for the user, and what to do (see [`Journal::explain`]).
    pub msg: String,
    /// The journal was full, and the batch's inputs were written without its task ends.
    pub inputs_kept: bool,
}

/// The writer thread, and the channels to it and back.
pub struct Writer {
    work: Option<mpsc::Sender<Work>>,
    done: mpsc::Receiver<Done>,
    wake: Arc<Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread on `journal` (a connection of its own); `dir` names the server
    /// directory in error messages.
    pub fn start(journal: Journal, dir: String) -> std::io::Result<Writer> {
        let (work_tx, work_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let wake = Arc::new(Notify::new());
        let woken = Arc::clone(&wake);
        let thread = std::thread::Builder::new()
            .name("kestrel-journal".into())
            .spawn(move || write_loop(journal, &dir, work_rx, done_tx, woken))?;
        Ok(Writer {
            work: Some(work_tx),
            done: done_rx,
            wake,
            thread: Some(thread),
        })
    }

    /// Hands over `pending` to be committed. False if the thread is gone (it panicked): the
    /// batch is then lost, and the caller says so.
    pub fn commit(&self, pending: Box<Pending>) -> bool {
        self.send(Work::Commit(pending))
    }

    /// Asks for a step of compaction (nothing if none is due).
    pub fn compact(&self) {
        self.send(Work::Compact);
    }

    /// Waits until everything handed over before is done (compaction steps included).
    #[cfg(test)]
    pub fn barrier(&self) {
        let (tx, rx) = mpsc::channel();
        if self.send(Work::Barrier(tx)) {
            let _ = rx.recv();
        }
    }

    fn send(&self, work: Work) -> bool {
        self.work.as_ref().is_some_and(|w| w.send(work).is_ok())
    }

    /// The next commit carried out, if one is.
    pub fn try_done(&self) -> Option<Done> {
        self.done.try_recv().ok()
    }

    /// Waits for the next commit carried out; `None` if the thread is gone. Blocks the calling
    /// thread, as a commit on it would.
    pub fn wait_done(&self) -> Option<Done> {
        self.done.recv().ok()
    }

    /// Notified whenever a commit is carried out.
    pub fn wake(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }
}

impl Drop for Writer {
    /// What was handed over is written before the thread ends.
    fn drop(&mut self) {
        self.work = None;
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the journal's writer thread panicked");
            }
        }
    }
}

fn write_loop(
    mut journal: Journal,
    dir: &str,
    work: mpsc::Receiver<Work>,
    done: mpsc::Sender<Done>,
    wake: Arc<Notify>,
) {
    while let Ok(w) = work.recv() {
        match w {
            Work::Commit(mut pending) => {
                let result = journal.commit(&mut pending).map_err(|e| Failed {
                    msg: journal.explain(&e.err, dir),
                    inputs_kept: e.inputs_kept,
                });
                let rows = journal.rows();
                if done
                    .send(Done {
                        result,
                        rows,
                        pending,
                    })
                    .is_err()
                {
                    return;
                }
                wake.notify_one();
            }
            Work::Compact => {
                if journal.compaction_due() {
                    journal.compact_step();
                }
            }
            #[cfg(test)]
            Work::Barrier(said) => {
                let _ = said.send(());
            }
        }
    }
}
