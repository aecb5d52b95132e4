//! One connection to a server, multiplexed for every thread of a Python client.
//!
//! A reader task on the module's runtime takes every frame the server sends: a reply goes to
//! the request that waits for it (by id), a pushed task end or a forgotten job goes to the
//! event queue that the package's dispatcher thread drains with [`Session::next_events`].
//! When the connection ends, every waiting request fails. With a reconnection window (a
//! server with a journal, restarted), the reader then tries the access file again with backoff
//! and, once back, says `reconnected` (the client watches its jobs again and hears the ends it
//! missed); otherwise, or once the window has passed, a `lost` event says why: no future waits
//! for an answer that cannot come.

use crate::specs;
use crate::{ConnectionLost, KestrelError, NoServer, ServerError, ValueLost};
use kestrel_core::{JobId, LineList, TaskState};
use kestrel_proto::auth::Role;
use kestrel_proto::messages::{Answer, Ask, Refusal, Request, TaskEnded, ToClient};
use kestrel_proto::{Access, ConnWrite, FrameReader, FrameWriter, SPOKEN_VERSIONS};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What the reader task hands over to Python.
enum Event {
    Ended(TaskEnded),
    Gone {
        job: JobId,
        why: String,
    },
    /// The connection is back after a loss (why it was lost).
    Reconnected(String),
    Lost(String),
}

/// What the reader task and the callers share.
struct Shared {
    /// Requests waiting for their reply, by id.
    waiting: Mutex<FxHashMap<u64, oneshot::Sender<Result<Answer, Refusal>>>>,
    events: Mutex<VecDeque<Event>>,
    /// Signalled when `events` gets something.
    arrived: Condvar,
    /// Why the connection ended, once it has.
    ended: Mutex<Option<String>>,
    /// The connection's writing half; `None` while it is being made again, or once closed.
    writer: tokio::sync::Mutex<Option<FrameWriter<ConnWrite>>>,
    /// Read again at each reconnection: a restarted server may listen elsewhere.
    access_file: PathBuf,
    /// How long to keep trying after a loss (zero: the first loss is the end).
    reconnect_for: Duration,
    /// Set by `close`: a connection closed here is not made again.
    closing: AtomicBool,
    /// How many times the connection was made again; signalled with `back`, and when it ends.
    generation: Mutex<u64>,
    back: Condvar,
    /// Whether the client watches what it submits: said again first on a new connection.
    watches_submitted: AtomicBool,
    /// The cluster's secret, which signs transfers of values to and from workers (read again
    /// with the access file at each reconnection).
    secret: Mutex<Vec<u8>>,
}

impl Shared {
    fn push(&self, e: Event) {
        lock(&self.events).push_back(e);
        self.arrived.notify_all();
    }

    /// The connection ended: every waiting request fails (its sender dropped) and the
    /// dispatcher hears why.
    fn end(&self, why: String) {
        *lock(&self.ended) = Some(why.clone());
        lock(&self.waiting).clear();
        {
            // Under the lock `wait_back` checks `ended` with, so no waiter misses it.
            let _generation = lock(&self.generation);
            self.back.notify_all();
        }
        self.push(Event::Lost(why));
    }

    /// The connection is back: calls that failed on the lost one are sent again.
    fn reconnected(&self, why: String) {
        *lock(&self.generation) += 1;
        self.back.notify_all();
        self.push(Event::Reconnected(why));
    }

    /// Waits until the connection has been made again since `generation`, or has ended;
    /// true if it is back.
    fn wait_back(&self, generation: u64) -> bool {
        let mut g = lock(&self.generation);
        while *g == generation && lock(&self.ended).is_none() {
            g = self.back.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        lock(&self.ended).is_none()
    }
}

/// A poisoned lock only means a thread panicked while holding it; what it guards stays usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection to a Kestrel server (`kestrel._native.Session(access_file, reconnect_for)`).
#[pyclass(frozen)]
pub struct Session {
    runtime: tokio::runtime::Runtime,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    /// When it was made (ns since the epoch): with the process id, what makes its
    /// submissions' keys unique.
    started_ns: u128,
    version: u32,
    address: String,
}

#[pymethods]
impl Session {
    /// Connects to the server whose access file is `access_file` and authenticates with the
    /// secret it holds; after a lost connection, tries again for `reconnect_for` seconds.
    #[new]
    #[pyo3(signature = (access_file, reconnect_for=0.0))]
    fn new(py: Python<'_>, access_file: PathBuf, reconnect_for: f64) -> PyResult<Session> {
        let access = Access::read(&access_file).map_err(|e| {
            NoServer::new_err(format!(
                "no Kestrel server at {}: {e}; start one with `kestrel server start --dir DIR` (or use kestrel.LocalCluster())",
                access_file.display()
            ))
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kestrel-client")
            .enable_all()
            .build()
            .map_err(|e| {
                KestrelError::new_err(format!("cannot start the client's runtime: {e}"))
            })?;
        let address = access.address();
        let connected = py.detach(|| {
            runtime.block_on(kestrel_proto::client::connect_as(
                &access,
                Role::Client,
                SPOKEN_VERSIONS,
            ))
        });
        let (reader, writer, version) = connected.map_err(|e| {
            NoServer::new_err(format!(
                "cannot connect to the Kestrel server at {address} (from {}): {e}; is it running? `kestrel server info --dir DIR` tells",
                access_file.display()
            ))
        })?;
        if version < kestrel_proto::WATCH_VERSION {
            return Err(KestrelError::new_err(format!(
                "the server at {address} speaks protocol {version}, and this Python package (Kestrel {}) needs {} or later: upgrade the server's kestrel to the package's version",
                env!("CARGO_PKG_VERSION"),
                kestrel_proto::WATCH_VERSION
            )));
        }
        let shared = Arc::new(Shared {
            waiting: Mutex::default(),
            events: Mutex::default(),
            arrived: Condvar::new(),
            ended: Mutex::default(),
            writer: tokio::sync::Mutex::new(Some(writer)),
            access_file,
            // At most a day; NaN or less than nothing is no reconnection.
            reconnect_for: Duration::from_secs_f64(if reconnect_for > 0.0 {
                reconnect_for.min(86_400.0)
            } else {
                0.0
            }),
            closing: AtomicBool::new(false),
            generation: Mutex::new(0),
            back: Condvar::new(),
            watches_submitted: AtomicBool::new(false),
            secret: Mutex::new(access.secret_bytes()),
        });
        runtime.spawn(read_frames(reader, shared.clone()));
        Ok(Session {
            runtime,
            shared,
            next_id: AtomicU64::new(1),
            started_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            version,
            address,
        })
    }

    /// The protocol version the connection speaks.
    #[getter]
    fn protocol(&self) -> u32 {
        self.version
    }

    /// The server's address.
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// Why the connection ended, or `None` while it is up.
    #[getter]
    fn ended(&self) -> Option<String> {
        lock(&self.shared.ended).clone()
    }

    /// Whether the connection is up now (not ended, not being made again).
    #[getter]
    fn is_up(&self) -> bool {
        lock(&self.shared.ended).is_none()
            && self.shared.writer.try_lock().map_or(true, |w| w.is_some())
    }

    /// Watches `jobs` (their ends already reached are pushed at once) and, with `submitted`,
    /// every job submitted on this connection from now on. Returns the jobs the server lacks.
    fn watch(&self, py: Python<'_>, jobs: Vec<JobId>, submitted: bool) -> PyResult<Vec<JobId>> {
        if submitted {
            self.shared.watches_submitted.store(true, Ordering::SeqCst);
        }
        match self.call(py, Ask::Watch { jobs, submitted })? {
            Answer::Watching { missing } => Ok(missing),
            other => Err(unexpected(&other)),
        }
    }

    /// Submits a job of calls of a pickled function, one per line (base64 of the pickled
    /// `(args, kwargs)`, or `@NAME` for a call that is value NAME); with `open`, more lines
    /// follow with [`Session::extend_lines`]. `values` names the values its calls read (kept
    /// in workers' caches, staged like inputs). Returns the job's id.
    #[pyo3(signature = (function, lines, open=false, options=None, values=Vec::new()))]
    fn submit_function(
        &self,
        py: Python<'_>,
        function: &Bound<'_, PyDict>,
        lines: Vec<String>,
        open: bool,
        options: Option<&Bound<'_, PyDict>>,
        values: Vec<String>,
    ) -> PyResult<JobId> {
        if !values.is_empty() {
            self.needs_values()?;
        }
        let spec = specs::function_job(function, options, values)?;
        let tasks = kestrel_core::TaskSet::Lines(lines.iter().map(String::as_str).collect());
        self.submit(py, spec, tasks, open)
    }

    /// Submits a job of command lines, one task each; with `open`, more follow with
    /// [`Session::extend_commands`]. Returns the job's id.
    #[pyo3(signature = (name, argvs, open=false, options=None))]
    fn submit_commands(
        &self,
        py: Python<'_>,
        name: String,
        argvs: Vec<Vec<String>>,
        open: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<JobId> {
        let spec = specs::command_job(name, options)?;
        self.submit(py, spec, kestrel_core::TaskSet::List(argvs), open)
    }

    /// Adds lines (tasks `at`, `at + 1`, ...) to open job `job`; `close` ends it.
    fn extend_lines(
        &self,
        py: Python<'_>,
        job: JobId,
        at: u32,
        lines: Vec<String>,
        close: bool,
    ) -> PyResult<()> {
        let lines: LineList = lines.iter().map(String::as_str).collect();
        let ask = Ask::ExtendLines {
            job,
            at,
            lines,
            close,
        };
        match self.call(py, ask)? {
            Answer::Extended => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Adds command lines (tasks `at`, ...) to open job `job`; `close` ends it.
    fn extend_commands(
        &self,
        py: Python<'_>,
        job: JobId,
        at: u32,
        argvs: Vec<Vec<String>>,
        close: bool,
    ) -> PyResult<()> {
        match self.call(
            py,
            Ask::Extend {
                job,
                at,
                argvs,
                close,
            },
        )? {
            Answer::Extended => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Cancels jobs; returns `(job, error or None)` for each.
    fn cancel(&self, py: Python<'_>, jobs: Vec<JobId>) -> PyResult<Vec<(JobId, Option<String>)>> {
        match self.call(py, Ask::Cancel { jobs })? {
            Answer::Canceled(results) => Ok(results
                .into_iter()
                .map(|r| (r.job, r.result.err().map(|e| e.message)))
                .collect()),
            other => Err(unexpected(&other)),
        }
    }

    /// Cancels tasks `ids` of `job` (those not ended): returns how many had not started and
    /// how many were running.
    fn cancel_tasks(&self, py: Python<'_>, job: JobId, ids: Vec<u32>) -> PyResult<(u32, u32)> {
        if self.version < kestrel_proto::VALUES_VERSION {
            // An older server cancels whole jobs only: the task is left to end.
            return Ok((0, 0));
        }
        let tasks = kestrel_core::IdRanges::from_ids(ids);
        match self.call(py, Ask::CancelTasks { job, tasks })? {
            Answer::Canceled(mut results) => match results.pop().map(|r| r.result) {
                Some(Ok(counts)) => Ok(counts),
                Some(Err(refusal)) => Err(ServerError::new_err(refusal.message)),
                None => Err(KestrelError::new_err(
                    "the server answered a cancel with nothing",
                )),
            },
            other => Err(unexpected(&other)),
        }
    }

    /// Drops ended jobs from the server; returns `(job, error or None)` for each.
    fn forget(&self, py: Python<'_>, jobs: Vec<JobId>) -> PyResult<Vec<(JobId, Option<String>)>> {
        match self.call(
            py,
            Ask::Forget {
                jobs,
                all_ended: false,
            },
        )? {
            Answer::Forgotten(results) => Ok(results
                .into_iter()
                .map(|r| (r.job, r.result.err().map(|e| e.message)))
                .collect()),
            other => Err(unexpected(&other)),
        }
    }

    /// The connected workers, as dicts (`id`, `host`, `slots`, `exec`, `tasks`, `finished`,
    /// `failed`, `quarantined`).
    fn workers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let Answer::Workers(rows) = self.call(py, Ask::WorkerList)? else {
            return Err(KestrelError::new_err(
                "the server answered the worker list oddly",
            ));
        };
        let list = PyList::empty(py);
        for w in rows {
            let d = PyDict::new(py);
            d.set_item("id", w.id)?;
            d.set_item("host", w.hostname)?;
            d.set_item("slots", w.slots)?;
            d.set_item("exec", w.exec)?;
            d.set_item("tasks", w.tasks)?;
            d.set_item("finished", w.finished)?;
            d.set_item("failed", w.failed)?;
            d.set_item("quarantined", w.quarantined)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// The server's version, protocol, directory and process id, as a dict.
    fn server_info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let Answer::Info(info) = self.call(py, Ask::ServerInfo)? else {
            return Err(KestrelError::new_err(
                "the server answered `server info` oddly",
            ));
        };
        let d = PyDict::new(py);
        d.set_item("version", info.version)?;
        d.set_item("protocol", info.protocol)?;
        d.set_item("address", info.address)?;
        d.set_item("dir", info.dir)?;
        d.set_item("pid", info.pid)?;
        d.set_item("workers", info.workers)?;
        d.set_item("jobs", info.jobs)?;
        if let Some(t) = info.traffic {
            let traffic = PyDict::new(py);
            traffic.set_item("from_clients", t.from_clients)?;
            traffic.set_item("to_clients", t.to_clients)?;
            traffic.set_item("from_workers", t.from_workers)?;
            traffic.set_item("to_workers", t.to_workers)?;
            d.set_item("traffic", traffic)?;
        }
        if let Some((files, bytes)) = info.values_deleted {
            d.set_item("values_deleted", (files, bytes))?;
        }
        Ok(d)
    }

    /// The bytes of value `name` (`size` bytes, as its reference said), fetched from a worker
    /// whose cache holds it, never through the server.
    fn fetch_value<'py>(
        &self,
        py: Python<'py>,
        name: String,
        size: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.needs_values()?;
        let located = match self.call(
            py,
            Ask::Locate {
                files: vec![name.clone()],
            },
        )? {
            Answer::Located(files) => files,
            other => return Err(unexpected(&other)),
        };
        let peers: Vec<String> = located.into_iter().flat_map(|f| f.peers).collect();
        if peers.is_empty() {
            return Err(ValueLost::new_err(lost(&name)));
        }
        let key = lock(&self.shared.secret).clone();
        let fetched = py.detach(|| {
            let mut tried = Vec::new();
            for peer in &peers {
                match kestrel_worker::values::fetch(peer, &name, size, &key) {
                    Ok(data) => return Ok(data),
                    Err(why) => tried.push(why),
                }
            }
            Err(tried.join("; "))
        });
        match fetched {
            Ok(data) => Ok(PyBytes::new(py, &data)),
            Err(why) => Err(ValueLost::new_err(format!("{} ({why})", lost(&name)))),
        }
    }

    /// Puts `data` on a worker as value `name` (an argument or scattered value): uploaded
    /// straight to the worker the server chooses, which the server then names as its holder.
    /// Returns the worker's id.
    fn place_value(&self, py: Python<'_>, name: String, data: Vec<u8>) -> PyResult<u32> {
        self.needs_values()?;
        let size = data.len() as u64;
        let (worker, url) = match self.call(py, Ask::Place { bytes: size })? {
            Answer::Place { worker, url } => (worker, url),
            other => return Err(unexpected(&other)),
        };
        let key = lock(&self.shared.secret).clone();
        py.detach(|| kestrel_worker::values::upload(&url, &name, data, &key))
            .map_err(|why| {
                KestrelError::new_err(format!("cannot put a value on worker {worker}: {why}"))
            })?;
        let placed = Ask::Placed {
            worker,
            files: vec![(name, size)],
        };
        match self.call(py, placed)? {
            Answer::Placed => Ok(worker),
            other => Err(unexpected(&other)),
        }
    }

    /// Drops values the client no longer needs: the workers holding them delete them.
    /// Returns how many some worker held.
    fn drop_values(&self, py: Python<'_>, names: Vec<String>) -> PyResult<u32> {
        if names.is_empty() || self.version < kestrel_proto::VALUES_VERSION {
            return Ok(0);
        }
        match self.call(py, Ask::DropValues { files: names })? {
            Answer::ValuesDropped { held } => Ok(held),
            other => Err(unexpected(&other)),
        }
    }

    /// Stops the server (its workers are told to exit).
    fn stop_server(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, Ask::Stop).map(|_| ())
    }

    /// Waits up to `timeout` seconds for events and returns those there are, oldest first:
    /// `("end", job, task, state, reason, worker, stdout, stdout_total, stderr)` for a task
    /// that ended (`state` is `finished`, `failed` or `canceled`; outputs are bytes or
    /// `None`), `("gone", job, why)` for a forgotten job, `("lost", why)` when the connection
    /// ended (nothing comes after it).
    fn next_events<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyList>> {
        let got: Vec<Event> = py.detach(|| {
            let deadline = Instant::now() + Duration::from_secs_f64(timeout.clamp(0.0, 86_400.0));
            let mut q = lock(&self.shared.events);
            while q.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                q = self
                    .shared
                    .arrived
                    .wait_timeout(q, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            q.drain(..).collect()
        });
        let list = PyList::empty(py);
        for e in got {
            let item = match e {
                Event::Ended(t) => end_tuple(py, t)?,
                Event::Gone { job, why } => ("gone", job, why).into_pyobject(py)?,
                Event::Reconnected(why) => ("reconnected", why).into_pyobject(py)?,
                Event::Lost(why) => ("lost", why).into_pyobject(py)?,
            };
            list.append(item)?;
        }
        Ok(list)
    }

    /// Closes the connection (the server forgets this client's watch).
    fn close(&self, py: Python<'_>) {
        self.shared.closing.store(true, Ordering::SeqCst);
        lock(&self.shared.ended).get_or_insert_with(|| "the client closed the connection".into());
        py.detach(|| {
            self.runtime.block_on(async {
                if let Some(w) = self.shared.writer.lock().await.take() {
                    let mut inner = w.into_inner();
                    let _ = tokio::io::AsyncWriteExt::shutdown(&mut inner).await;
                }
            })
        });
    }
}

impl Session {
    /// Refuses what needs values of a server too old to have them.
    fn needs_values(&self) -> PyResult<()> {
        if self.version >= kestrel_proto::VALUES_VERSION {
            return Ok(());
        }
        Err(KestrelError::new_err(format!(
            "the server at {} speaks protocol {}, and values above the inline limit need {} (Kestrel {}): upgrade the server to the package's version",
            self.address,
            self.version,
            kestrel_proto::VALUES_VERSION,
            env!("CARGO_PKG_VERSION")
        )))
    }

    fn submit(
        &self,
        py: Python<'_>,
        spec: kestrel_core::JobSpec,
        tasks: kestrel_core::TaskSet,
        open: bool,
    ) -> PyResult<JobId> {
        spec.validate(&tasks)
            .map_err(|e| KestrelError::new_err(format!("invalid job: {e}")))?;
        // A key of its own, so that sent again after a lost connection (its reply lost with
        // it) it is answered with the job it made, not made twice.
        let key = format!(
            "python-{}-{}-{}",
            std::process::id(),
            self.started_ns,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let ask = Ask::Submit {
            spec,
            tasks,
            open,
            key: Some(key),
        };
        match self.call(py, ask)? {
            Answer::Submitted { job, .. } => Ok(job),
            other => Err(unexpected(&other)),
        }
    }

    /// Sends `ask` and waits for its reply, the GIL released. A call the connection's loss
    /// cuts short is sent again once it is back (every request of this client may be: a
    /// submission carries its key, an extension its position), while the window lasts.
    fn call(&self, py: Python<'_>, ask: Ask) -> PyResult<Answer> {
        loop {
            let generation = *lock(&self.shared.generation);
            match self.call_once(py, ask.clone()) {
                Err(why) if self.may_retry() => {
                    if !py.detach(|| self.shared.wait_back(generation)) {
                        let ended = lock(&self.shared.ended).clone();
                        return Err(ConnectionLost::new_err(ended.unwrap_or(why)));
                    }
                }
                Err(why) => return Err(ConnectionLost::new_err(why)),
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(refusal)) => return Err(ServerError::new_err(refusal.message)),
            }
        }
    }

    /// Whether a call that failed with the connection waits for it to be made again.
    fn may_retry(&self) -> bool {
        !self.shared.reconnect_for.is_zero()
            && !self.shared.closing.load(Ordering::SeqCst)
            && lock(&self.shared.ended).is_none()
    }

    /// One try: the reply or refusal, or why the connection failed it.
    fn call_once(&self, py: Python<'_>, ask: Ask) -> Result<Result<Answer, Refusal>, String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.waiting).insert(id, tx);
        if let Some(why) = lock(&self.shared.ended).clone() {
            lock(&self.shared.waiting).remove(&id);
            return Err(why);
        }
        let result = py.detach(|| {
            self.runtime.block_on(async {
                let mut writer = self.shared.writer.lock().await;
                let Some(w) = writer.as_mut() else {
                    return Err(if self.shared.closing.load(Ordering::SeqCst) {
                        "the client closed its connection".to_string()
                    } else {
                        "the connection to the server is being made again".to_string()
                    });
                };
                if let Err(e) = w.send(&Request { id, body: ask }).await {
                    return Err(format!("cannot send to the server: {e}"));
                }
                drop(writer);
                rx.await.map_err(|_| {
                    lock(&self.shared.ended)
                        .clone()
                        .unwrap_or_else(|| "the connection to the server ended".into())
                })
            })
        });
        if result.is_err() {
            lock(&self.shared.waiting).remove(&id);
        }
        result
    }
}

/// Takes every frame the server sends until the connection ends for good: after a loss, the
/// connection is made again while the reconnection window lasts.
async fn read_frames(mut reader: FrameReader<kestrel_proto::ConnRead>, shared: Arc<Shared>) {
    loop {
        let why = read_until_lost(&mut reader, &shared).await;
        if shared.closing.load(Ordering::SeqCst) || shared.reconnect_for.is_zero() {
            shared.end(why);
            return;
        }
        // The requests sent on the lost connection get no reply: they fail now.
        lock(&shared.waiting).clear();
        *shared.writer.lock().await = None;
        match reconnect(&shared).await {
            Ok((r, mut w)) => {
                // Before any call can use it: a job submitted on the new connection must be
                // watched from its creation, as on the first. (Its reply, to id 0, which no
                // call uses, is dropped.)
                if shared.watches_submitted.load(Ordering::SeqCst) {
                    let watch = Ask::Watch {
                        jobs: Vec::new(),
                        submitted: true,
                    };
                    // A failure shows as the new connection's loss, at once, and another try.
                    let _ = w.send(&Request { id: 0, body: watch }).await;
                }
                *shared.writer.lock().await = Some(w);
                reader = r;
                shared.reconnected(why);
            }
            Err(last) => {
                let window = shared.reconnect_for.as_secs_f64();
                shared.end(format!(
                    "{why}; the server was not back within {window:.0} s ({last})"
                ));
                return;
            }
        }
    }
}

/// Connects again with backoff, re-reading the access file, until the window closes or the
/// client does; returns the new connection, or the last reason it could not be made.
async fn reconnect(
    shared: &Shared,
) -> Result<(FrameReader<kestrel_proto::ConnRead>, FrameWriter<ConnWrite>), String> {
    let deadline = tokio::time::Instant::now() + shared.reconnect_for;
    let mut pause = Duration::from_millis(100);
    loop {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
        if shared.closing.load(Ordering::SeqCst) {
            return Err("the client was closed".into());
        }
        let last = match Access::read(&shared.access_file) {
            Err(e) => format!("{}: {e}", shared.access_file.display()),
            Ok(access) => {
                match kestrel_proto::client::connect_as(&access, Role::Client, SPOKEN_VERSIONS)
                    .await
                {
                    Ok((r, w, version)) if version >= kestrel_proto::WATCH_VERSION => {
                        *lock(&shared.secret) = access.secret_bytes();
                        return Ok((r, w));
                    }
                    Ok((_, _, version)) => {
                        return Err(format!(
                            "the server came back speaking protocol {version}, older than this package needs"
                        ))
                    }
                    Err(e) => e.to_string(),
                }
            }
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(last);
        }
    }
}

/// Takes frames until the connection ends; returns why it did.
async fn read_until_lost(
    reader: &mut FrameReader<kestrel_proto::ConnRead>,
    shared: &Shared,
) -> String {
    loop {
        match reader.recv::<ToClient>().await {
            Ok(ToClient::Reply { id, result }) => {
                if let Some(tx) = lock(&shared.waiting).remove(&id) {
                    let _ = tx.send(result);
                }
            }
            Ok(ToClient::Ended { ends }) => {
                let mut q = lock(&shared.events);
                q.extend(ends.into_iter().map(Event::Ended));
                drop(q);
                shared.arrived.notify_all();
            }
            Ok(ToClient::Gone { job, why }) => shared.push(Event::Gone { job, why }),
            // A wait's progress: this client sends no wait.
            Ok(ToClient::Progress { .. }) => {}
            Err(e) => return format!("the connection to the server ended: {e}"),
        }
    }
}

fn end_tuple(py: Python<'_>, t: TaskEnded) -> PyResult<Bound<'_, PyTuple>> {
    let state = match t.state {
        TaskState::Finished => "finished",
        TaskState::Failed => "failed",
        _ => "canceled",
    };
    let (stdout, total) = match t.stdout {
        Some(k) => (Some(PyBytes::new(py, &k.data)), k.total),
        None => (None, 0),
    };
    let stderr = t.stderr.map(|k| PyBytes::new(py, &k.data));
    (
        "end", t.job, t.id, state, t.reason, t.worker, stdout, total, stderr,
    )
        .into_pyobject(py)
}

/// Why value `name` cannot be had.
fn lost(name: &str) -> String {
    match kestrel_core::values::kind_of(name) {
        Some(kestrel_core::values::ValueKind::Result { job, index }) => format!(
            "the result of task {job}:{index} is held by no worker any more: the worker that kept it was lost (or the value was dropped); compute it again"
        ),
        _ => format!("value {name} is held by no worker any more (lost with its worker, or dropped)"),
    }
}

fn unexpected(answer: &Answer) -> PyErr {
    KestrelError::new_err(format!(
        "the server answered with {answer:?}, which this package does not expect; are the server and the package the same version?"
    ))
}
