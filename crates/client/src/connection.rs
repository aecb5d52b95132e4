//! A connection that rides out a server restart.
//!
//! While the reconnection window lasts, a server that cannot be reached or goes away is tried
//! again with backoff, re-reading the access file (a restarted server may listen elsewhere),
//! instead of failing the script or workflow that called. What happens meanwhile is told to
//! the connection's notice function ([`Connection::with_notices`]), for the caller to show.

use crate::error::{lost_or_unreachable, Error};
use kestrel_core::JobId;
use kestrel_proto::messages::{Answer, Ask, WaitProgress};
use kestrel_proto::{Access, Client};
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Where the server is.
#[derive(Clone, Debug)]
pub enum Target {
    /// Its access file, read again at each reconnection.
    File(PathBuf),
    /// An access record known in memory (an embedded server that does not move).
    Fixed(Access),
}

impl Target {
    /// The server whose access file is `path`.
    pub fn file(path: impl Into<PathBuf>) -> Target {
        Target::File(path.into())
    }

    fn access(&self) -> Result<Access, Error> {
        match self {
            Target::File(path) => Ok(Access::read(path)?),
            Target::Fixed(access) => Ok(access.clone()),
        }
    }
}

/// How long to keep trying when the server cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconnect {
    /// At the first connection: a server not there at the start was probably never started
    /// (or another was meant), so by default this is zero and the call fails at once.
    pub at_start: Duration,
    /// After a connection was lost: the server is probably being restarted.
    pub after_loss: Duration,
}

impl Reconnect {
    /// Fail at once whenever the server cannot be reached.
    pub const NEVER: Reconnect = Reconnect {
        at_start: Duration::ZERO,
        after_loss: Duration::ZERO,
    };

    /// What commands that follow jobs to their end use (`job wait`, `submit --wait`): no
    /// retry at the start, five minutes after a loss.
    pub fn for_waiting() -> Reconnect {
        Reconnect {
            at_start: Duration::ZERO,
            after_loss: Duration::from_secs(5 * 60),
        }
    }

    /// The same window at the start and after a loss.
    pub fn within(window: Duration) -> Reconnect {
        Reconnect {
            at_start: window,
            after_loss: window,
        }
    }
}

/// What a connection tells its caller while it retries.
#[derive(Debug)]
pub enum Notice<'a> {
    /// The server could not be reached at the start; trying again.
    Retrying {
        /// Why the first try failed.
        error: &'a Error,
        /// How long it keeps trying.
        within: Duration,
    },
    /// The connection was lost; reconnecting.
    Lost {
        /// How it was lost.
        cause: &'a Error,
        /// How long it keeps trying.
        within: Duration,
    },
    /// Connected again.
    Reconnected,
}

impl fmt::Display for Notice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Retrying { error, within } => write!(
                f,
                "{error} (trying again for up to {})",
                humantime::format_duration(*within)
            ),
            Notice::Lost { cause, within } => write!(
                f,
                "lost the server ({cause}); reconnecting for up to {}",
                humantime::format_duration(*within)
            ),
            Notice::Reconnected => f.write_str("reconnected to the server"),
        }
    }
}

/// Where a connection tells what it does while it retries.
pub type Notify = fn(&Notice<'_>);

/// A connection to a server that reconnects as [`Reconnect`] says.
pub struct Connection {
    target: Target,
    reconnect: Reconnect,
    client: Client,
    notify: Notify,
    /// Task bytes per message of a submission in pieces.
    pub(crate) piece_bytes: usize,
}

impl Connection {
    /// Connects, trying again for `reconnect.at_start` while the server cannot be reached;
    /// says nothing while it retries.
    pub async fn open(target: Target, reconnect: Reconnect) -> Result<Connection, Error> {
        Connection::open_telling(target, reconnect, |_| {}).await
    }

    /// [`Connection::open`], telling `notify` what it does while it retries, then and later.
    pub async fn open_telling(
        target: Target,
        reconnect: Reconnect,
        notify: Notify,
    ) -> Result<Connection, Error> {
        let client = match connect_once(&target).await {
            Err(e) if e.is_unreachable() && !reconnect.at_start.is_zero() => {
                notify(&Notice::Retrying {
                    error: &e,
                    within: reconnect.at_start,
                });
                let client = retry(&target, reconnect.at_start, FIRST_RETRY).await?;
                notify(&Notice::Reconnected);
                client
            }
            done => done?,
        };
        Ok(Connection {
            target,
            reconnect,
            client,
            notify,
            piece_bytes: crate::submit::PIECE_BYTES,
        })
    }

    /// Sends a job's tasks in pieces of at most `bytes` of command lines or lines each
    /// (at least one task a piece) instead of [`crate::PIECE_BYTES`]: for tests that
    /// need pieces without megabytes of tasks.
    pub fn with_piece_bytes(mut self, bytes: usize) -> Connection {
        self.piece_bytes = bytes;
        self
    }

    /// The connection itself, for a request that must not be sent twice.
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// The connection itself, given up (it no longer rides out a restart): for a client that
    /// multiplexes its requests and a watch's pushes on it ([`Client::watch`], then
    /// [`Client::into_parts`]).
    pub fn into_client(self) -> Client {
        self.client
    }

    /// Asks, reconnecting and asking again if the server goes away meanwhile: for requests
    /// that do nothing twice (queries, cancel, retry, forget, stop).
    pub async fn call(&mut self, ask: Ask) -> Result<Answer, Error> {
        let mut losses = Losses::default();
        loop {
            match self.client.call(ask.clone()).await {
                Ok(a) => return Ok(a),
                Err(e) if lost_or_unreachable(&e) => self.reconnect(e.into(), &mut losses).await?,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits until every job in `jobs` (every unfinished job if empty) has ended, calling
    /// `progress` with the counts every `every`, through server restarts.
    pub async fn wait(
        &mut self,
        jobs: Vec<JobId>,
        every: Duration,
        mut progress: impl FnMut(&WaitProgress),
    ) -> Result<WaitProgress, Error> {
        let mut losses = Losses::default();
        loop {
            let mut heard = false;
            let done = self
                .client
                .wait(jobs.clone(), every, |p| {
                    heard = true;
                    progress(p)
                })
                .await;
            match done {
                Ok(p) => return Ok(p),
                Err(e) if lost_or_unreachable(&e) => {
                    // Progress came over this connection: a wait of days rides out a restart
                    // every few hours, each with a whole window.
                    if heard {
                        losses = Losses::default();
                    }
                    self.reconnect(e.into(), &mut losses).await?
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Replaces a lost connection (`cause`), trying for what is left of `reconnect.after_loss`
    /// since the request's first loss (`losses`); with no window, fails at once with `cause`.
    pub(crate) async fn reconnect(
        &mut self,
        cause: Error,
        losses: &mut Losses,
    ) -> Result<(), Error> {
        let window = self.reconnect.after_loss;
        if window.is_zero() {
            return Err(cause);
        }
        let first = *losses.first.get_or_insert_with(Instant::now);
        losses.count += 1;
        // Whole seconds: they are shown to people, here and in `retry`'s error.
        let left = window.saturating_sub(first.elapsed());
        let left = Duration::from_secs(left.as_secs_f64().ceil() as u64);
        if left.is_zero() {
            return Err(Error::GaveUp(format!(
                "lost the server {} times in {} while this request was under way (last: {cause}); if the server is up, it may be closing the connection on this request: see its log",
                losses.count,
                humantime::format_duration(window)
            )));
        }
        (self.notify)(&Notice::Lost {
            cause: &cause,
            within: left,
        });
        // A server that takes the connection and drops it again at once is asked ever more
        // slowly, not in a tight loop.
        let first_delay = Duration::from_millis(100) * 2u32.pow(losses.count.min(5) - 1);
        self.client = retry(&self.target, left, first_delay).await?;
        (self.notify)(&Notice::Reconnected);
        Ok(())
    }
}

/// The connections one request lost. The reconnection window runs from the first loss since
/// the request last made progress: a request on which the server closes the connection every
/// time gives up when the window has passed, instead of reconnecting and asking forever.
#[derive(Debug, Default)]
pub(crate) struct Losses {
    first: Option<Instant>,
    count: u32,
}

/// One attempt: read the access file and connect.
async fn connect_once(target: &Target) -> Result<Client, Error> {
    let access = target.access()?;
    Ok(Client::connect(&access).await?)
}

/// The wait before the first try again.
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// Tries to connect with backoff, first after `delay`, until `within` has passed.
async fn retry(target: &Target, within: Duration, mut delay: Duration) -> Result<Client, Error> {
    let deadline = Instant::now() + within;
    loop {
        tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
        delay = (delay * 2).min(Duration::from_secs(2));
        match connect_once(target).await {
            Ok(c) => return Ok(c),
            Err(e) if !e.is_unreachable() => return Err(e),
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::GaveUp(format!(
                    "could not reach the server within {} (last try: {e}); check it with `kestrel server info`, start it with `kestrel server start` if it is down, then run this command again",
                    humantime::format_duration(within)
                )))
            }
            Err(_) => {}
        }
    }
}
