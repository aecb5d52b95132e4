//! Runs one task as a child process on the calling thread, as fast as Linux allows.
//!
//! Kestrel must start `/bin/true` at close to `xargs -P` speed, so this module keeps the
//! per-task cost to the unavoidable system calls:
//!
//! * **Spawn** goes through `std::process::Command`, which on Linux/glibc uses
//!   `posix_spawn` (a `CLONE_VFORK` clone, no page-table copy). Nothing here may force std
//!   onto its slower fork path: no `pre_exec`, no uid/gid changes, and no `PATH` override
//!   combined with a bare program name (we resolve such a name ourselves instead). The
//!   child gets its own process group via `process_group(0)`, which posix_spawn supports.
//! * **Waiting** uses a pidfd (`pidfd_open`, Linux >= 5.3) polled together with a per-thread
//!   eventfd that [`CancelHandle::cancel`] writes to. One `poll` covers exit, timeout and
//!   cancel without races and without helper threads; the pipes of captured (streamed) output
//!   join it too (see [`crate::capture`]).
//! * **Killing** (timeout/cancel) happens only on the waiting thread, which owns the
//!   unreaped child: a pid cannot be reused before it is reaped, so `killpg(pid, SIGKILL)`
//!   can never hit a stranger. [`CancelHandle`] itself never sends signals.
//!
//! * **Death of the worker**: [`run_with`] tells the worker's [`Reaper`] each task's process
//!   group after spawning it and again before reaping its leader, so a killed worker's tasks
//!   die with it. That is one 4-byte pipe write each, not a `pre_exec` hook.
//!
//! On kernels without `pidfd_open` the child is waited for with a plain blocking wait and
//! timeouts/cancellation are not enforced (a warning is logged once); captured output is then
//! read until every process holding its pipe has closed it.

use crate::capture::{Capture, Captured, Captures};
use crate::reaper::Reaper;
use crate::sinks::{open_creating_dirs, Outputs};
use std::cell::OnceCell;
use std::ffi::{CString, OsStr};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// How many trailing bytes of a failed task's stderr file are returned in
/// [`Outcome::stderr_tail`]; enough for an error message, small enough for a status report.
pub const STDERR_TAIL_BYTES: u64 = 1024;

/// Everything needed to start one task; built by the caller after placeholder substitution,
/// so this module never interprets the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launch {
    /// Command line; `argv[0]` is the program, looked up in `PATH` like `execvp` when it
    /// contains no `/` (using the `PATH` from [`Launch::env`] if it sets one).
    pub argv: Vec<String>,
    /// Variables added to (overriding) the worker's own environment, so tasks inherit the
    /// worker's setup while still getting per-task settings.
    pub env: Vec<(String, String)>,
    /// Working directory of the child; `None` keeps the worker's.
    pub cwd: Option<PathBuf>,
    /// Where the child's standard output goes.
    pub stdout: Sink,
    /// Where the child's standard error goes; a file here also feeds
    /// [`Outcome::stderr_tail`] when the task fails.
    pub stderr: Sink,
    /// Kill the whole process group after this long; `None` waits forever.
    /// Needs Linux >= 5.3 (pidfd); see the module docs.
    pub timeout: Option<Duration>,
    /// Output files that belong to this task alone and are removed when it ends with them
    /// still empty. Leave a file that other tasks may be writing unmarked.
    pub remove_if_empty: RemoveIfEmpty,
    /// A multi-node task's host file: written before the task starts, removed when it ends.
    pub node_file: Option<NodeFile>,
}

/// A file the worker writes for a task and removes after it (a multi-node task's hosts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFile {
    /// Where it goes.
    pub path: PathBuf,
    /// What it holds.
    pub text: String,
}

/// Removes a [`NodeFile`] when dropped: when its task has ended, whichever way.
struct Written<'a>(&'a Path);

impl Drop for Written<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Which of a task's output files the worker removes if the task leaves them empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoveIfEmpty {
    pub stdout: bool,
    pub stderr: bool,
}

/// Destination of a child's output stream; files let users inspect output after the run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Sink {
    /// Discard the output (`/dev/null`), the cheapest choice.
    #[default]
    Null,
    /// Write to this file: missing parent directories are created and the file is
    /// created or truncated. If stdout and stderr name the same path, they share one
    /// open file so their output interleaves instead of overwriting each other.
    File(PathBuf),
    /// Add to the end of this file, which other tasks write too: what the task writes is
    /// added whole when it ends, under a lock, after what is there (see `sinks`). Missing
    /// parent directories and the file are created, never truncated. Stdout and stderr
    /// naming the same path share one open file, as for [`Sink::File`].
    Shared(PathBuf),
    /// Capture in memory through a pipe, keeping the first N bytes ([`Outcome::stdout`] /
    /// [`Outcome::stderr`]); see `capture` for how it is read.
    Capture(u32),
}

/// What happened to one task, reported back to the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Wall-clock time just before the task was launched (sink files opened, then spawned).
    pub started: SystemTime,
    /// Wall-clock time after the process (group leader) was reaped or the launch failed.
    pub finished: SystemTime,
    /// How the task ended.
    pub status: ExitKind,
    /// For a failed run (not [`ExitKind::SpawnFailed`]) whose stderr went to a file: the
    /// last <= [`STDERR_TAIL_BYTES`] bytes of that file as lossy UTF-8, so failures can be
    /// explained without fetching the file. `None` otherwise, or if the file is empty or
    /// unreadable. A captured stderr gives the end of what was kept of it.
    pub stderr_tail: Option<String>,
    /// What was captured of stdout, when it went to [`Sink::Capture`].
    pub stdout: Option<Captured>,
    /// What was captured of stderr, when it went to [`Sink::Capture`].
    pub stderr: Option<Captured>,
    /// For stdout and stderr, if its file was the task's own ([`Launch::remove_if_empty`]):
    /// whether it held output (kept) or was left empty (removed).
    pub own_files: [Option<bool>; 2],
}

impl Outcome {
    /// A run that started at `started` and ended now with `status`, nothing captured.
    pub fn ended(started: SystemTime, status: ExitKind) -> Outcome {
        Outcome {
            started,
            finished: SystemTime::now(),
            status,
            stderr_tail: None,
            stdout: None,
            stderr: None,
            own_files: [None; 2],
        }
    }
}

/// How a task ended; distinguishes the user's failures from the engine's interventions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitKind {
    /// The program exited with this code (0 = success).
    Exited(i32),
    /// The program was killed by signal N, not by Kestrel.
    Signaled(i32),
    /// Kestrel killed the process group because [`Launch::timeout`] elapsed.
    TimedOut,
    /// Kestrel killed the process group (or never started it) because of
    /// [`CancelHandle::cancel`].
    Canceled,
    /// The task could not be started (or, in the rare case that the worker lost track of
    /// the child, e.g. because `SIGCHLD` is ignored, could not be waited for). The text is
    /// a one-line message naming the program or path and what to do.
    SpawnFailed(String),
    /// The task cannot run as given, however often it is tried (an input missing from its
    /// store): it fails without retries.
    Unrunnable(String),
    /// A function task raised: the exception's last line (`ValueError: bad input`).
    Raised(String),
    /// The Python runner calling a function task died (a segfault, `os._exit`, killed for
    /// memory): how it ended, as [`ExitKind::Exited`] or [`ExitKind::Signaled`] would say.
    RunnerDied(Box<ExitKind>),
}

impl ExitKind {
    /// True only for exit code 0: the scheduler needs one unambiguous success test.
    pub fn is_success(&self) -> bool {
        matches!(self, ExitKind::Exited(0))
    }
}

impl fmt::Display for ExitKind {
    /// Short human wording for logs and CLI output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitKind::Exited(code) => write!(f, "exited with code {code}"),
            ExitKind::Signaled(sig) => write!(f, "killed by signal {sig}"),
            ExitKind::TimedOut => f.write_str("timed out"),
            ExitKind::Canceled => f.write_str("canceled"),
            ExitKind::SpawnFailed(msg) => write!(f, "failed to start: {msg}"),
            ExitKind::Unrunnable(msg) => write!(f, "cannot run: {msg}"),
            ExitKind::Raised(what) => write!(f, "raised {what}"),
            ExitKind::RunnerDied(how) => write!(f, "its Python runner {how}"),
        }
    }
}

/// Cancels a running task from another thread.
///
/// Clone it freely: all clones share one state. A handle serves one [`run`] at a time and
/// stays canceled once [`cancel`](CancelHandle::cancel) was called (later runs with it
/// return [`ExitKind::Canceled`] without spawning). For pid-reuse safety the handle never
/// signals a process itself: it only wakes the thread waiting in [`run`], which still owns
/// the unreaped child and does the killing.
#[derive(Debug, Clone, Default)]
pub struct CancelHandle {
    inner: Arc<Mutex<CancelState>>,
}

#[derive(Debug, Default)]
struct CancelState {
    canceled: bool,
    /// Eventfd of the thread currently inside `run` with this handle. It is only written
    /// while registered, and registration ends (under this mutex) before `run` returns,
    /// so the fd is always open when written.
    waker: Option<RawFd>,
}

impl CancelHandle {
    /// Creates a handle that is not canceled; same as `Default`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests cancellation: if a task is running with this handle, its whole process
    /// group is killed with SIGKILL and [`run`] returns [`ExitKind::Canceled`]; if [`run`]
    /// has not started the process yet, it returns `Canceled` without spawning.
    pub fn cancel(&self) {
        let mut state = lock(&self.inner);
        state.canceled = true;
        if let Some(fd) = state.waker {
            eventfd_signal(fd);
        }
    }

    /// Whether [`cancel`](CancelHandle::cancel) has been called, for callers that want to
    /// skip work early.
    pub fn is_canceled(&self) -> bool {
        lock(&self.inner).canceled
    }
}

/// Locks the cancel state, ignoring poisoning: the state is two plain fields that are
/// always consistent, and cancellation must keep working after an unrelated panic.
fn lock(m: &Mutex<CancelState>) -> MutexGuard<'_, CancelState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registration of this thread's eventfd in a [`CancelHandle`] for the duration of a run.
/// Dropping it deregisters and drains any wake-up, so the reused eventfd never carries a
/// stale cancel into the next task.
struct Registration<'a> {
    handle: &'a CancelHandle,
    waker: RawFd,
}

impl<'a> Registration<'a> {
    /// Registers `waker`, or returns `None` if the handle is already canceled.
    fn new(handle: &'a CancelHandle, waker: RawFd) -> Option<Self> {
        let mut state = lock(&handle.inner);
        if state.canceled {
            return None;
        }
        state.waker = Some(waker);
        Some(Registration { handle, waker })
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.handle.inner);
        if state.waker == Some(self.waker) {
            state.waker = None;
        }
        if state.canceled {
            // cancel() may have written after we stopped polling; drain it (EAGAIN if not).
            eventfd_drain(self.waker);
        }
    }
}

thread_local! {
    /// One eventfd per executor thread, created on first use and reused for every task,
    /// so cancellation support costs no system calls per task.
    static WAKER: OnceCell<OwnedFd> = const { OnceCell::new() };
}

/// Returns this thread's eventfd (non-blocking, close-on-exec), creating it once.
fn thread_waker() -> io::Result<RawFd> {
    WAKER
        .try_with(|cell| {
            if let Some(fd) = cell.get() {
                return Ok(fd.as_raw_fd());
            }
            // SAFETY: plain syscall wrapper; the result is checked before use.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            Ok(cell.get_or_init(|| owned).as_raw_fd())
        })
        .map_err(|_| io::Error::other("thread is shutting down"))?
}

fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64; `fd` is open while registered (see
    // CancelState::waker). Failure (counter overflow) still leaves the fd readable.
    unsafe {
        libc::write(fd, (&one as *const u64).cast(), std::mem::size_of::<u64>());
    }
}

fn eventfd_drain(fd: RawFd) {
    let mut buf: u64 = 0;
    // SAFETY: reads at most 8 bytes into a valid u64; non-blocking fd, EAGAIN is fine.
    unsafe {
        libc::read(
            fd,
            (&mut buf as *mut u64).cast(),
            std::mem::size_of::<u64>(),
        );
    }
}

/// Runs one task to completion on the current thread and reports how it ended.
///
/// Blocks until the process group leader exits, the timeout elapses, or `cancel` fires;
/// on timeout/cancel the whole process group is killed with SIGKILL before the leader is
/// reaped. Background processes left behind by a task that exits by itself are not
/// touched. Never panics on OS errors: launch problems become [`ExitKind::SpawnFailed`].
pub fn run(launch: &Launch, cancel: &CancelHandle) -> Outcome {
    run_with(launch, cancel, None)
}

/// [`run`], recording the task's process group with `reaper` while it runs, so the group is
/// killed if this process dies before the task ends.
pub fn run_with(launch: &Launch, cancel: &CancelHandle, reaper: Option<&Reaper>) -> Outcome {
    let started = SystemTime::now();
    let mut captures = Captures::default();
    let mut outputs = Outputs::default();
    let mut status = run_inner(launch, cancel, &mut captures, &mut outputs, reaper);
    let finished = SystemTime::now();
    let (stdout, stderr) = captures.finish();
    let stderr_tail = match (&status, &launch.stderr) {
        (ExitKind::SpawnFailed(_) | ExitKind::Unrunnable(_), _) | (_, Sink::Null) => None,
        (s, _) if s.is_success() => None,
        (_, Sink::File(path)) => read_tail(path, STDERR_TAIL_BYTES),
        (_, Sink::Shared(path)) => {
            let slot = usize::from(!matches!(&launch.stdout, Sink::Shared(p) if p == path));
            outputs
                .part(slot)
                .and_then(|part| read_tail_of(part, STDERR_TAIL_BYTES))
        }
        (_, Sink::Capture(_)) => stderr
            .as_ref()
            .and_then(|c| tail_of(&c.data, STDERR_TAIL_BYTES as usize)),
    };
    // After the tail was read: a shared stderr's part is copied out and closed here.
    let closed = outputs.close();
    if let Some(lost) = closed.lost {
        tracing::warn!("{lost}");
        if status.is_success() {
            status = ExitKind::SpawnFailed(lost);
        }
    }
    Outcome {
        started,
        finished,
        status,
        stderr_tail,
        stdout,
        stderr,
        own_files: closed.own,
    }
}

/// Runs the task; the pipes of captured streams are left in `captures`.
fn run_inner<'a>(
    launch: &'a Launch,
    cancel: &CancelHandle,
    captures: &mut Captures,
    outputs: &mut Outputs<'a>,
    reaper: Option<&Reaper>,
) -> ExitKind {
    if cancel.is_canceled() {
        return ExitKind::Canceled;
    }
    let Some(program) = launch.argv.first() else {
        return ExitKind::SpawnFailed("empty command line: no program given".to_string());
    };
    let waker = match thread_waker() {
        Ok(fd) => fd,
        Err(e) => {
            return ExitKind::SpawnFailed(format!(
                "cannot create eventfd to run '{program}': {e}; the worker may be out of file descriptors (raise `ulimit -n`)"
            ))
        }
    };
    let Some(registration) = Registration::new(cancel, waker) else {
        return ExitKind::Canceled;
    };

    // The output files stay open in `outputs` until the caller closes them, after the child
    // is reaped, whichever way the task ended.
    let mut cmd = match build_command(launch, program, captures, outputs) {
        Ok(cmd) => cmd,
        Err(msg) => return ExitKind::SpawnFailed(msg),
    };
    // Removed after the child is reaped, like the output files.
    let _node_file = match &launch.node_file {
        Some(f) => match std::fs::write(&f.path, &f.text) {
            Ok(()) => Some(Written(&f.path)),
            Err(e) => {
                return ExitKind::SpawnFailed(format!(
                    "cannot write the list of the task's nodes to {}: {e}",
                    f.path.display()
                ))
            }
        },
        None => None,
    };
    // A cancel may have arrived while the sinks were opened; don't start a doomed task.
    if cancel.is_canceled() {
        return ExitKind::Canceled;
    }
    let spawned = cmd.spawn();
    // Close our copies of the sink files (and pipes' write ends) right away.
    drop(cmd);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return ExitKind::SpawnFailed(describe_spawn_error(launch, program, &e)),
    };

    if let Some(r) = reaper {
        // Process group id = leader's pid (`process_group(0)`).
        let pgid = child.id() as libc::pid_t;
        r.record(pgid);
        // From here on the task dies with the worker (what tests wait for before a kill).
        tracing::debug!(pgid, "the reaper records the task's process group");
    }
    let status = wait_child(&mut child, launch.timeout, cancel, waker, captures, reaper);
    drop(registration);
    status
}

/// Builds the `Command` without doing anything that would make std leave its posix_spawn
/// fast path; the pipes of captured streams go into `captures`, and the task's own and shared
/// output files into `outputs`. Errors are ready-made `SpawnFailed` messages.
fn build_command<'a>(
    launch: &'a Launch,
    program: &str,
    captures: &mut Captures,
    outputs: &mut Outputs<'a>,
) -> Result<Command, String> {
    let path_override = launch
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let mut cmd = match path_override {
        // std falls back to fork+execvp when PATH is overridden and the program is a bare
        // name; resolving it here keeps posix_spawn (argv[0] stays as the user wrote it).
        Some(path) if !program.contains('/') => {
            match lookup_in_path(program, OsStr::new(path), launch.cwd.as_deref()) {
                Lookup::Found(full) => {
                    let mut cmd = Command::new(full);
                    cmd.arg0(program);
                    cmd
                }
                Lookup::NotExecutable(p) => {
                    return Err(format!(
                        "program '{program}' found at '{}' is not executable (permission denied); run `chmod +x` on it",
                        p.display()
                    ))
                }
                Lookup::Missing => {
                    return Err(format!(
                        "program '{program}' not found in PATH '{path}' (set by the task's environment); check the name or give a full path"
                    ))
                }
            }
        }
        _ => Command::new(program),
    };
    cmd.args(&launch.argv[1..]);
    cmd.envs(launch.env.iter().map(|(k, v)| (k, v)));
    if let Some(cwd) = &launch.cwd {
        cmd.current_dir(cwd);
    }
    cmd.stdin(Stdio::null());
    cmd.process_group(0);

    let cwd = launch.cwd.as_deref();
    let out_file = match &launch.stdout {
        Sink::Null => None,
        Sink::File(path) => {
            let file = open_sink(path, "stdout", cwd)?;
            if launch.remove_if_empty.stdout {
                outputs.keep_own(0, &file, path);
            }
            Some(file)
        }
        Sink::Shared(path) => Some(outputs.open_shared(0, path, "stdout", cwd)?),
        Sink::Capture(limit) => Some(capture(*limit, "stdout", &mut captures.stdout)?),
    };
    let same_file = match (&launch.stdout, &launch.stderr) {
        (Sink::File(a), Sink::File(b)) | (Sink::Shared(a), Sink::Shared(b)) => a == b,
        _ => false,
    };
    let err_stdio = match (&launch.stderr, &out_file) {
        (Sink::Null, _) => Stdio::null(),
        (Sink::Capture(limit), _) => Stdio::from(capture(*limit, "stderr", &mut captures.stderr)?),
        // One file for both streams: it is the task's own only if both say so.
        (Sink::File(path) | Sink::Shared(path), Some(out)) if same_file => {
            outputs.stderr_in_stdout(launch.remove_if_empty.stderr);
            Stdio::from(
                out.try_clone()
                    .map_err(|e| format!("cannot open stderr file '{}': {e}", path.display()))?,
            )
        }
        (Sink::File(path), _) => {
            let file = open_sink(path, "stderr", cwd)?;
            if launch.remove_if_empty.stderr {
                outputs.keep_own(1, &file, path);
            }
            Stdio::from(file)
        }
        (Sink::Shared(path), _) => Stdio::from(outputs.open_shared(1, path, "stderr", cwd)?),
    };
    cmd.stdout(match out_file {
        Some(f) => Stdio::from(f),
        None => Stdio::null(),
    });
    cmd.stderr(err_stdio);
    Ok(cmd)
}

/// Opens the pipe of a captured stream; returns the write end for the child as a `File`.
fn capture(limit: u32, which: &str, slot: &mut Option<Capture>) -> Result<File, String> {
    let (capture, write) = Capture::open(limit).map_err(|e| {
        format!("cannot create a pipe for the task's {which}: {e}; the worker may be out of file descriptors (raise `ulimit -n`)")
    })?;
    *slot = Some(capture);
    Ok(File::from(write))
}

/// Creates/truncates a sink file (see [`open_creating_dirs`]).
fn open_sink(path: &Path, which: &str, cwd: Option<&Path>) -> Result<File, String> {
    let mut create = OpenOptions::new();
    create.write(true).create(true).truncate(true);
    open_creating_dirs(path, which, cwd, &create)
}

/// Waits for the child's exit, the timeout or a cancel, whichever comes first, and reaps it
/// (after the reaper has forgotten its group); reads captured streams meanwhile.
fn wait_child(
    child: &mut Child,
    timeout: Option<Duration>,
    cancel: &CancelHandle,
    waker: RawFd,
    captures: &mut Captures,
    reaper: Option<&Reaper>,
) -> ExitKind {
    // Pids fit in pid_t; the kernel never hands out larger ones.
    let pid = child.id() as libc::pid_t;
    // SAFETY: plain syscall; `pid` is our unreaped child, so it cannot name another process.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        let err = io::Error::last_os_error();
        warn_no_pidfd(&err);
        captures.read_until_closed();
        return reap_when_exited(child, reaper);
    }
    // SAFETY: pidfd_open returned a new descriptor (close-on-exec) that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };

    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    // The exit, a cancel, and the pipes of captured streams (-1, skipped by poll, if none).
    let [out, err] = captures.poll_fds();
    let mut fds = [pidfd.as_raw_fd(), waker, out, err].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let kill_reason = loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => poll_timeout_ms(left),
                _ => break ExitKind::TimedOut,
            },
        };
        // SAFETY: `fds` is a valid array of pollfds for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::warn!(pid, error = %err, "poll on pidfd failed; waiting without timeout");
            captures.read_until_closed();
            return reap_when_exited(child, reaper);
        }
        for which in 0..2 {
            if fds[2 + which].revents != 0 {
                captures.read_ready(which);
                fds[2 + which].fd = captures.poll_fds()[which];
            }
        }
        if fds[0].revents != 0 {
            // The leader exited (or the pidfd is in an error state, which should not happen):
            // what it wrote is in the pipes; read it and reap.
            captures.drain();
            return if fds[0].revents & libc::POLLIN != 0 {
                reap(child, reaper)
            } else {
                reap_when_exited(child, reaper)
            };
        }
        if fds[1].revents != 0 {
            if fds[1].revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
                // Should not happen; stop polling the waker rather than spin.
                fds[1].fd = -1;
            } else {
                eventfd_drain(waker);
            }
            if cancel.is_canceled() {
                break ExitKind::Canceled;
            }
        }
        // Otherwise: timeout (re-checked at the top) or a stale wake-up.
    };

    // The leader is not reaped yet, so `pid` (and the group id equal to it) still belong
    // to our child. Kill the group, and the leader directly in case it left the group.
    // SAFETY: plain syscalls on our own unreaped child; errors (ESRCH) are harmless.
    unsafe {
        libc::killpg(pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
    captures.drain();
    match reap(child, reaper) {
        ExitKind::SpawnFailed(lost) => ExitKind::SpawnFailed(lost),
        _ => kill_reason,
    }
}

/// What ended a [`wait_readable`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The descriptor has data (or its other end closed).
    Readable,
    /// The run was canceled.
    Canceled,
    /// The deadline passed.
    TimedOut,
}

/// Waits on the calling thread until `fd` is readable, `cancel` fires or `deadline` passes,
/// as [`run`] waits for a process: with the thread's eventfd, so a cancel wakes it at once.
pub(crate) fn wait_readable(
    fd: RawFd,
    cancel: &CancelHandle,
    deadline: Option<Instant>,
) -> io::Result<Woken> {
    let waker = thread_waker()?;
    let Some(_registration) = Registration::new(cancel, waker) else {
        return Ok(Woken::Canceled);
    };
    let mut fds = [fd, waker].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => poll_timeout_ms(left),
                _ => return Ok(Woken::TimedOut),
            },
        };
        // SAFETY: `fds` is a valid array of pollfds for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if fds[0].revents != 0 {
            return Ok(Woken::Readable);
        }
        if fds[1].revents != 0 {
            eventfd_drain(waker);
            if cancel.is_canceled() {
                return Ok(Woken::Canceled);
            }
        }
    }
}

/// Rounds up to whole milliseconds so `poll` never returns before the deadline.
pub(crate) fn poll_timeout_ms(left: Duration) -> libc::c_int {
    libc::c_int::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX)
}

/// Reaps a child whose leader has exited or was killed; the reaper forgets its group first,
/// while the pid cannot have been reused.
fn reap(child: &mut Child, reaper: Option<&Reaper>) -> ExitKind {
    if let Some(r) = reaper {
        r.forget(child.id() as libc::pid_t);
    }
    match child.wait() {
        Ok(status) => exit_kind(status),
        Err(e) => lost_child(child.id() as libc::pid_t, &e),
    }
}

/// Reaps a child that may still run: with a reaper, waits for its exit without reaping it
/// first, so the group is forgotten before its id can be reused.
fn reap_when_exited(child: &mut Child, reaper: Option<&Reaper>) -> ExitKind {
    if reaper.is_some() {
        // SAFETY: waitid fills `info`; WNOWAIT leaves the child unreaped.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        while unsafe {
            libc::waitid(
                libc::P_PID,
                child.id() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
    }
    reap(child, reaper)
}

pub(crate) fn exit_kind(status: ExitStatus) -> ExitKind {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitKind::Exited(code),
        (None, Some(sig)) => ExitKind::Signaled(sig),
        // Unreachable for a blocking waitpid without WUNTRACED; keep the raw value.
        (None, None) => ExitKind::Exited(status.into_raw()),
    }
}

fn lost_child(pid: libc::pid_t, err: &io::Error) -> ExitKind {
    ExitKind::SpawnFailed(format!(
        "cannot wait for process {pid}: {err}; make sure the worker does not ignore SIGCHLD"
    ))
}

fn warn_no_pidfd(err: &io::Error) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if err.raw_os_error() != Some(libc::ENOSYS) {
        tracing::warn!(error = %err, "pidfd_open failed; this task's timeout and cancel are not enforced");
    } else if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!("pidfd_open is not available (Linux < 5.3): task timeouts and cancellation are not enforced");
    }
}

/// Result of an execvp-style search.
enum Lookup {
    Found(PathBuf),
    /// A matching regular file exists but lacks execute permission.
    NotExecutable(PathBuf),
    Missing,
}

/// execvp-style lookup of `name` in `path`; relative entries (empty = ".") are taken
/// relative to `cwd` when given, since that is where the child will run.
fn lookup_in_path(name: &str, path: &OsStr, cwd: Option<&Path>) -> Lookup {
    let mut not_executable = None;
    for entry in path.as_bytes().split(|b| *b == b':') {
        let dir = if entry.is_empty() {
            Path::new(".")
        } else {
            Path::new(OsStr::from_bytes(entry))
        };
        let mut candidate = match cwd {
            Some(cwd) if dir.is_relative() => cwd.join(dir),
            _ => dir.to_path_buf(),
        };
        candidate.push(name);
        if !fs::metadata(&candidate).is_ok_and(|m| m.is_file()) {
            continue;
        }
        if is_executable(&candidate) {
            return Lookup::Found(candidate);
        }
        not_executable.get_or_insert(candidate);
    }
    not_executable.map_or(Lookup::Missing, Lookup::NotExecutable)
}

fn is_executable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string.
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
}

/// Turns a spawn error into a one-line message. Only runs on failure, so the extra
/// `stat`s it does cost nothing on the success path. posix_spawn reports a failed
/// `chdir` with the same errno as a failed exec, so the working directory is checked first.
fn describe_spawn_error(launch: &Launch, program: &str, err: &io::Error) -> String {
    if let Some(problem) = launch.cwd.as_deref().and_then(cwd_problem) {
        return problem;
    }

    let bare = !program.contains('/');
    // Where the program is (or would be), for precise messages.
    let located: Option<PathBuf> = if bare {
        let path = launch
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| OsStr::new(v).to_os_string())
            .or_else(|| std::env::var_os("PATH"))
            .unwrap_or_else(|| "/bin:/usr/bin".into());
        match lookup_in_path(program, &path, launch.cwd.as_deref()) {
            Lookup::Found(p) | Lookup::NotExecutable(p) => Some(p),
            Lookup::Missing => None,
        }
    } else {
        let p = Path::new(program);
        Some(match &launch.cwd {
            Some(cwd) if p.is_relative() => cwd.join(p),
            _ => p.to_path_buf(),
        })
    };
    let shown = match (&located, bare) {
        (Some(p), true) => format!("program '{program}' (at '{}')", p.display()),
        _ => format!("'{program}'"),
    };
    let exists = located.as_deref().is_some_and(|p| p.exists());

    match err.raw_os_error() {
        Some(libc::ENOENT) if bare && !exists => format!(
            "program '{program}' not found in PATH; check the name or give a full path"
        ),
        Some(libc::ENOENT) if !exists => {
            format!("'{program}' does not exist; check the path")
        }
        Some(libc::ENOENT) => format!(
            "{shown} exists but its interpreter (the '#!' line) was not found; fix the '#!' line"
        ),
        Some(libc::EACCES) if located.as_deref().is_some_and(Path::is_dir) => {
            format!("{shown} is a directory, not a program")
        }
        Some(libc::EACCES) => {
            format!("{shown} is not executable (permission denied); run `chmod +x` on it")
        }
        Some(libc::ENOEXEC) => format!(
            "{shown} is not a valid executable (exec format error); add a '#!' line if it is a script"
        ),
        Some(libc::ETXTBSY) => {
            format!("{shown} is being written to (text file busy); retry when it is complete")
        }
        Some(libc::E2BIG) => {
            format!("cannot start {shown}: argument list or environment too long")
        }
        Some(libc::ENOTDIR) => {
            format!("cannot start {shown}: a component of its path is not a directory")
        }
        Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM) => format!(
            "cannot start {shown}: {err}; the worker is out of resources (processes, memory or file descriptors)"
        ),
        _ => format!("cannot start {shown}: {err}"),
    }
}

/// Last `max` bytes of `data` as lossy UTF-8, like [`read_tail`]; `None` if empty.
pub(crate) fn tail_of(data: &[u8], max: usize) -> Option<String> {
    let start = data.len().saturating_sub(max);
    lossy_tail(&data[start..], start > 0)
}

/// Why a task cannot run in `cwd`, if it cannot (a one-line message); `None` if it can.
pub(crate) fn cwd_problem(cwd: &Path) -> Option<String> {
    match fs::metadata(cwd) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Some(format!(
            "working directory '{}' does not exist; create it or fix the task's cwd",
            cwd.display()
        )),
        Err(e) => Some(format!(
            "cannot use working directory '{}': {e}",
            cwd.display()
        )),
        Ok(m) if !m.is_dir() => Some(format!(
            "working directory '{}' is not a directory",
            cwd.display()
        )),
        Ok(_) if !is_executable(cwd) => Some(format!(
            "cannot enter working directory '{}' (permission denied)",
            cwd.display()
        )),
        Ok(_) => None,
    }
}

/// Last `max` bytes of `path` as lossy UTF-8, skipping a character cut in half at the
/// start; `None` if the file is empty or unreadable.
fn read_tail(path: &Path, max: u64) -> Option<String> {
    read_tail_of(&File::open(path).ok()?, max)
}

/// [`read_tail`] of an open file, read where it is (its offset is left alone).
fn read_tail_of(file: &File, max: u64) -> Option<String> {
    let len = file.metadata().ok()?.len();
    if len == 0 {
        return None;
    }
    let start = len.saturating_sub(max);
    let mut buf = vec![0; usize::try_from(len - start).ok()?];
    file.read_exact_at(&mut buf, start).ok()?;
    lossy_tail(&buf, start > 0)
}

/// `tail` as lossy UTF-8; when it was `cut` from a longer text, without the continuation bytes
/// of a character cut in half at its start. `None` if nothing is left.
fn lossy_tail(tail: &[u8], cut: bool) -> Option<String> {
    let skip = if cut {
        tail.iter()
            .take(3)
            .take_while(|b| **b & 0xC0 == 0x80)
            .count()
    } else {
        0
    };
    (tail.len() > skip).then(|| String::from_utf8_lossy(&tail[skip..]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::thread;

    fn sh(script: &str) -> Launch {
        Launch {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            ..Launch::default()
        }
    }

    fn run_it(launch: &Launch) -> Outcome {
        run(launch, &CancelHandle::new())
    }

    fn spawn_failed(outcome: &Outcome) -> &str {
        match &outcome.status {
            ExitKind::SpawnFailed(msg) => msg,
            other => panic!("expected SpawnFailed, got {other:?}"),
        }
    }

    /// Executes a freshly written file, retrying while another test thread's concurrent
    /// spawn briefly holds our write descriptor (ETXTBSY).
    fn run_retrying_busy(launch: &Launch) -> Outcome {
        for _ in 0..20 {
            let out = run_it(launch);
            match &out.status {
                ExitKind::SpawnFailed(m) if m.contains("text file busy") => {
                    thread::sleep(Duration::from_millis(20))
                }
                _ => return out,
            }
        }
        panic!("file stayed busy");
    }

    /// State letter and process group of `pid` from /proc, or `None` if it is gone.
    fn proc_state(pid: libc::pid_t) -> Option<(char, libc::pid_t)> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        let mut fields = rest.split_whitespace();
        let state = fields.next()?.chars().next()?;
        let pgrp = fields.nth(1)?.parse().ok()?;
        Some((state, pgrp))
    }

    /// True once `pid` no longer runs: gone, or a zombie waiting for init to reap it.
    fn process_dead(pid: libc::pid_t) -> bool {
        // SAFETY: signal 0 only checks for existence.
        if unsafe { libc::kill(pid, 0) } != 0 {
            return true;
        }
        proc_state(pid).is_none_or(|(state, _)| state == 'Z')
    }

    /// Non-zombie processes still in process group `pgid`.
    fn live_group_members(pgid: libc::pid_t) -> Vec<libc::pid_t> {
        fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|pid| proc_state(*pid).is_some_and(|(st, pg)| pg == pgid && st != 'Z'))
            .collect()
    }

    /// Asserts that the background process and every other member of the task's process
    /// group die within a bounded time.
    fn assert_group_dies_soon(group: &GroupScript) {
        let leader = read_pid(&group.leader_file);
        let bg = read_pid(&group.bg_file);
        assert_ne!(leader, bg);
        let until = Instant::now() + Duration::from_secs(3);
        loop {
            let live = live_group_members(leader);
            if process_dead(bg) && live.is_empty() {
                return;
            }
            assert!(
                Instant::now() < until,
                "survivors: bg {bg} dead={}, group {leader} members {live:?}",
                process_dead(bg)
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn read_pid(path: &Path) -> libc::pid_t {
        let text = fs::read_to_string(path).expect("pid file");
        text.trim().parse().expect("pid in pid file")
    }

    /// A task that starts a background `sleep` and then sleeps itself, recording both pids.
    struct GroupScript {
        _dir: tempfile::TempDir,
        leader_file: PathBuf,
        bg_file: PathBuf,
        launch: Launch,
    }

    fn group_script() -> GroupScript {
        let dir = tempfile::tempdir().unwrap();
        let leader_file = dir.path().join("leader.pid");
        let bg_file = dir.path().join("bg.pid");
        let launch = sh(&format!(
            "echo $$ > '{}'; sleep 30 & echo $! > '{}'; sleep 30",
            leader_file.display(),
            bg_file.display()
        ));
        GroupScript {
            _dir: dir,
            leader_file,
            bg_file,
            launch,
        }
    }

    #[test]
    fn a_node_file_is_there_while_the_task_runs_and_gone_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nodes");
        let copy = dir.path().join("copy");
        let mut launch = sh(&format!("cat {} > {}", path.display(), copy.display()));
        launch.node_file = Some(NodeFile {
            path: path.clone(),
            text: "a\nb\n".into(),
        });
        assert!(run_it(&launch).status.is_success());
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), "a\nb\n");
        assert!(!path.exists());
        // One that cannot be written fails the launch, saying where.
        launch.node_file = Some(NodeFile {
            path: dir.path().join("no/such/dir/nodes"),
            text: String::new(),
        });
        let out = run_it(&launch);
        assert!(
            spawn_failed(&out).contains("cannot write the list of the task's nodes"),
            "{out:?}"
        );
    }

    #[test]
    fn exit_code_zero_is_success() {
        let before = SystemTime::now();
        let out = run_it(&Launch {
            argv: vec!["true".into()],
            ..Launch::default()
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        assert!(out.status.is_success());
        assert!(before <= out.started && out.started <= out.finished);
        assert_eq!(out.stderr_tail, None);
    }

    #[test]
    fn exit_code_three_is_failure() {
        let out = run_it(&sh("exit 3"));
        assert_eq!(out.status, ExitKind::Exited(3));
        assert!(!out.status.is_success());
    }

    #[test]
    fn signal_is_reported() {
        let out = run_it(&sh("kill -TERM $$"));
        assert_eq!(out.status, ExitKind::Signaled(libc::SIGTERM));
        assert!(!out.status.is_success());
    }

    #[test]
    fn missing_program() {
        let out = run_it(&Launch {
            argv: vec!["kestrel-no-such-program-xyz".into()],
            ..Launch::default()
        });
        let msg = spawn_failed(&out);
        assert!(
            msg.contains("program 'kestrel-no-such-program-xyz' not found in PATH"),
            "{msg}"
        );
        assert!(out.stderr_tail.is_none());
    }

    #[test]
    fn missing_program_with_path_override() {
        let dir = tempfile::tempdir().unwrap();
        let out = run_it(&Launch {
            argv: vec!["kestrel-no-such-program-xyz".into()],
            env: vec![("PATH".into(), dir.path().display().to_string())],
            ..Launch::default()
        });
        let msg = spawn_failed(&out);
        assert!(msg.contains("not found in PATH"), "{msg}");
    }

    #[test]
    fn missing_absolute_path() {
        let out = run_it(&Launch {
            argv: vec!["/kestrel/no/such/prog".into()],
            ..Launch::default()
        });
        let msg = spawn_failed(&out);
        assert!(
            msg.contains("'/kestrel/no/such/prog' does not exist"),
            "{msg}"
        );
    }

    #[test]
    fn non_executable_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script.sh");
        fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let out = run_retrying_busy(&Launch {
            argv: vec![path.display().to_string()],
            ..Launch::default()
        });
        let msg = spawn_failed(&out);
        assert!(
            msg.contains(&format!(
                "'{}' is not executable (permission denied)",
                path.display()
            )),
            "{msg}"
        );
    }

    #[test]
    fn missing_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().join("nope");
        let out = run_it(&Launch {
            argv: vec!["true".into()],
            cwd: Some(cwd.clone()),
            ..Launch::default()
        });
        let msg = spawn_failed(&out);
        assert!(
            msg.contains(&format!(
                "working directory '{}' does not exist",
                cwd.display()
            )),
            "{msg}"
        );
    }

    #[test]
    fn missing_cwd_is_not_created_by_output_files_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().join("nope");
        let out = run_it(&Launch {
            argv: vec!["true".into()],
            cwd: Some(cwd.clone()),
            stdout: Sink::File(cwd.join("job-1/1.out")),
            stderr: Sink::File(cwd.join("job-1/1.err")),
            ..Launch::default()
        });
        assert_eq!(
            spawn_failed(&out),
            format!(
                "working directory '{}' does not exist; create it or fix the task's cwd",
                cwd.display()
            )
        );
        assert!(!cwd.exists(), "the working directory was created");
    }

    #[test]
    fn own_output_files_left_empty_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let own = RemoveIfEmpty {
            stdout: true,
            stderr: true,
        };
        // Output on stdout only: the empty stderr file goes, stdout stays.
        let out = run_it(&Launch {
            stdout: Sink::File(path("a.out")),
            stderr: Sink::File(path("a.err")),
            remove_if_empty: own,
            ..sh("echo hi")
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        assert_eq!(fs::read_to_string(path("a.out")).unwrap(), "hi\n");
        assert!(!path("a.err").exists());
        // What became of each is told, for the server (see `TaskOutput::files`).
        assert_eq!(out.own_files, [Some(true), Some(false)]);
        // A failed task's stderr stays, with its tail reported.
        let out = run_it(&Launch {
            stdout: Sink::File(path("b.out")),
            stderr: Sink::File(path("b.err")),
            remove_if_empty: own,
            ..sh("echo bad >&2; exit 2")
        });
        assert_eq!(out.stderr_tail.as_deref(), Some("bad\n"));
        assert!(!path("b.out").exists());
        assert!(path("b.err").exists());
        // One file for both streams, left empty.
        let out = run_it(&Launch {
            stdout: Sink::File(path("c.log")),
            stderr: Sink::File(path("c.log")),
            remove_if_empty: own,
            ..sh("true")
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        assert!(!path("c.log").exists());
        assert_eq!(out.own_files, [Some(false), Some(false)]);
        // A task that cannot start leaves nothing either.
        let out = run_it(&Launch {
            argv: vec!["kestrel-no-such-program-xyz".into()],
            stdout: Sink::File(path("d/d.out")),
            stderr: Sink::File(path("d/d.err")),
            remove_if_empty: own,
            ..Launch::default()
        });
        spawn_failed(&out);
        assert!(!path("d/d.out").exists() && !path("d/d.err").exists());
        // Files not marked as the task's own stay, even empty.
        let out = run_it(&Launch {
            stdout: Sink::File(path("shared.out")),
            stderr: Sink::File(path("e.err")),
            remove_if_empty: RemoveIfEmpty {
                stdout: false,
                stderr: true,
            },
            ..sh("true")
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        assert!(path("shared.out").exists());
        assert!(!path("e.err").exists());
        assert_eq!(out.own_files, [None, Some(false)]);
    }

    #[test]
    fn tasks_sharing_a_file_add_their_output_whole() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("logs/all.log");
        let shared = |script: &str| Launch {
            stdout: Sink::Shared(log.clone()),
            stderr: Sink::Shared(log.clone()),
            ..sh(script)
        };
        // Two tasks at once, each writing in several pieces.
        let a = shared("for i in 1 2 3; do echo a$i; sleep 0.05; done");
        let b = shared("for i in 1 2 3; do echo b$i >&2; sleep 0.05; done; exit 3");
        let other = thread::spawn(move || run_it(&a));
        let out = run_it(&b);
        assert_eq!(other.join().unwrap().status, ExitKind::Exited(0));
        assert_eq!(out.status, ExitKind::Exited(3));
        // The failed task's stderr tail is its own, read from its part.
        assert_eq!(out.stderr_tail.as_deref(), Some("b1\nb2\nb3\n"));
        let text = fs::read_to_string(&log).unwrap();
        assert!(
            text == "a1\na2\na3\nb1\nb2\nb3\n" || text == "b1\nb2\nb3\na1\na2\na3\n",
            "{text:?}"
        );
        // What was there stays, and a task that writes nothing adds nothing.
        run_it(&shared("true"));
        run_it(&shared("echo c"));
        assert_eq!(fs::read_to_string(&log).unwrap(), format!("{text}c\n"));
        let names: Vec<_> = fs::read_dir(dir.path().join("logs")).unwrap().collect();
        assert_eq!(names.len(), 1, "no part left: {names:?}");
    }

    /// True if `pid` is gone, a zombie, or has a SIGKILL pending (it is being killed).
    fn killed_or_gone(pid: libc::pid_t) -> bool {
        let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
            return true;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(0)
        };
        let sigkill = 1u64 << (libc::SIGKILL - 1);
        process_dead(pid) || (field("SigPnd:") | field("ShdPnd:")) & sigkill != 0
    }

    #[test]
    fn a_task_is_forgotten_by_the_reaper_once_its_leader_has_exited() {
        let reaper = Reaper::start(2).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bg_file = dir.path().join("bg.pid");
        // The leader exits at once, leaving a background process in its group.
        let launch = sh(&format!("sleep 30 & echo $! > '{}'", bg_file.display()));
        let out = run_with(&launch, &CancelHandle::new(), Some(&reaper));
        assert_eq!(out.status, ExitKind::Exited(0));
        let bg = read_pid(&bg_file);
        // Closing the pipe makes the reaper kill what it still records, before it exits
        // (and drop waits for that): the exited task is not among them.
        drop(reaper);
        assert!(
            !killed_or_gone(bg),
            "the reaper killed a task it should have forgotten"
        );
        // SAFETY: the group of a task this test started.
        unsafe { libc::kill(bg, libc::SIGKILL) };
    }

    #[test]
    fn unwritable_stdout_path() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let target = file.path().join("x.out");
        let out = run_it(&Launch {
            argv: vec!["true".into()],
            stdout: Sink::File(target.clone()),
            ..Launch::default()
        });
        let msg = spawn_failed(&out);
        assert!(
            msg.starts_with(&format!("cannot open stdout file '{}': ", target.display())),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn stdout_and_stderr_to_files_with_parent_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let out_path = dir.path().join("a/b/task.out");
        let err_path = dir.path().join("c/task.err");
        fs::create_dir_all(dir.path().join("c")).unwrap();
        fs::write(&err_path, "old content that must be truncated\n").unwrap();
        let out = run_it(&Launch {
            stdout: Sink::File(out_path.clone()),
            stderr: Sink::File(err_path.clone()),
            ..sh("echo to-out; echo to-err >&2")
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        assert_eq!(fs::read_to_string(&out_path).unwrap(), "to-out\n");
        assert_eq!(fs::read_to_string(&err_path).unwrap(), "to-err\n");
        assert_eq!(out.stderr_tail, None, "no tail for a successful run");
    }

    #[test]
    fn stdout_and_stderr_to_same_file_interleave() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("both.log");
        let out = run_it(&Launch {
            stdout: Sink::File(path.clone()),
            stderr: Sink::File(path.clone()),
            ..sh("echo one; echo two >&2; echo three")
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        assert_eq!(fs::read_to_string(&path).unwrap(), "one\ntwo\nthree\n");
    }

    #[test]
    fn stderr_tail_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let err_path = dir.path().join("task.err");
        let out = run_it(&Launch {
            stderr: Sink::File(err_path.clone()),
            ..sh("i=0; while [ $i -lt 300 ]; do echo line$i >&2; i=$((i+1)); done; exit 1")
        });
        assert_eq!(out.status, ExitKind::Exited(1));
        let tail = out.stderr_tail.expect("tail");
        assert!(tail.len() <= 1024);
        assert!(tail.len() > 1000, "tail too short: {}", tail.len());
        assert!(tail.ends_with("line298\nline299\n"), "{tail}");
        let full = fs::read_to_string(&err_path).unwrap();
        assert!(full.len() > 1024 && full.ends_with(&tail));

        // Failure with stderr discarded: no tail.
        let out = run_it(&sh("echo x >&2; exit 1"));
        assert_eq!(out.status, ExitKind::Exited(1));
        assert_eq!(out.stderr_tail, None);
    }

    #[test]
    fn captured_streams_are_kept_in_memory() {
        let out = run_it(&Launch {
            stdout: Sink::Capture(1 << 20),
            stderr: Sink::Capture(1 << 20),
            ..sh("echo to-out; echo to-err >&2; echo more-out")
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        let stdout = out.stdout.expect("stdout captured");
        assert_eq!(stdout.data, b"to-out\nmore-out\n");
        assert_eq!(stdout.total, 16);
        assert_eq!(out.stderr.expect("stderr captured").data, b"to-err\n");
        assert_eq!(out.stderr_tail, None, "no tail for a successful run");
    }

    #[test]
    fn a_capture_keeps_its_limit_and_never_blocks_the_task() {
        // 3 MiB is far more than a pipe holds: the task would hang if nobody read it.
        let out = run_it(&Launch {
            stdout: Sink::Capture(1000),
            stderr: Sink::Capture(1 << 20),
            timeout: Some(Duration::from_secs(20)),
            ..sh("head -c 3145728 /dev/zero; echo failing >&2; exit 2")
        });
        assert_eq!(out.status, ExitKind::Exited(2));
        let stdout = out.stdout.expect("stdout captured");
        assert_eq!(stdout.data.len(), 1000);
        assert_eq!(stdout.total, 3 << 20);
        assert!(stdout.truncated());
        assert_eq!(out.stderr_tail.as_deref(), Some("failing\n"));
    }

    #[test]
    fn a_background_writer_does_not_hold_up_a_captured_task() {
        let t0 = Instant::now();
        let out = run_it(&Launch {
            stdout: Sink::Capture(100),
            timeout: Some(Duration::from_secs(20)),
            ..sh("echo main; (sleep 5; echo late) & exit 0")
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        assert_eq!(out.stdout.expect("captured").data, b"main\n");
        assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_timed_out_task_keeps_what_it_wrote() {
        let out = run_it(&Launch {
            stdout: Sink::Capture(100),
            timeout: Some(Duration::from_millis(300)),
            ..sh("echo before; sleep 30")
        });
        assert_eq!(out.status, ExitKind::TimedOut);
        assert_eq!(out.stdout.expect("captured").data, b"before\n");
    }

    #[test]
    fn stderr_tail_skips_split_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        // 400 three-byte chars (1200 bytes): the 1024-byte window starts at byte 176,
        // the last byte of a character.
        let text = "€".repeat(400);
        fs::write(&path, &text).unwrap();
        let tail = read_tail(&path, 1024).unwrap();
        assert!(!tail.contains('\u{FFFD}'));
        assert_eq!(tail, "€".repeat(341));
    }

    #[test]
    fn timeout_kills_whole_group() {
        let group = group_script();
        let t0 = Instant::now();
        let out = run_it(&Launch {
            timeout: Some(Duration::from_millis(200)),
            ..group.launch.clone()
        });
        let took = t0.elapsed();
        assert_eq!(out.status, ExitKind::TimedOut);
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert_group_dies_soon(&group);
    }

    #[test]
    fn timeout_not_reached() {
        let out = run_it(&Launch {
            timeout: Some(Duration::from_secs(5)),
            ..sh("exit 7")
        });
        assert_eq!(out.status, ExitKind::Exited(7));
    }

    #[test]
    fn cancel_from_another_thread() {
        let group = group_script();
        let handle = CancelHandle::new();
        let canceler = {
            let handle = handle.clone();
            let bg_file = group.bg_file.clone();
            thread::spawn(move || {
                // Cancel once the task is certainly running (it wrote its pid files).
                let until = Instant::now() + Duration::from_secs(3);
                while fs::read_to_string(&bg_file).map_or(true, |s| !s.ends_with('\n')) {
                    if Instant::now() > until {
                        break;
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                handle.cancel();
            })
        };
        let t0 = Instant::now();
        // The timeout is only a backstop so a broken cancel fails fast instead of hanging.
        let launch = Launch {
            timeout: Some(Duration::from_secs(4)),
            ..group.launch.clone()
        };
        let out = run(&launch, &handle);
        canceler.join().unwrap();
        assert_eq!(out.status, ExitKind::Canceled);
        assert!(t0.elapsed() < Duration::from_secs(3));
        assert_group_dies_soon(&group);

        // The thread's reused eventfd must not leak the cancel into the next task.
        let out = run_it(&Launch {
            timeout: Some(Duration::from_secs(5)),
            ..sh("sleep 0.05; exit 4")
        });
        assert_eq!(out.status, ExitKind::Exited(4));
    }

    #[test]
    fn cancel_before_start_does_not_spawn() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let handle = CancelHandle::new();
        handle.cancel();
        assert!(handle.is_canceled());
        let out = run(
            &sh(&format!("touch '{}'", marker.display())),
            &handle.clone(),
        );
        assert_eq!(out.status, ExitKind::Canceled);
        assert!(!marker.exists());
        assert_eq!(out.stderr_tail, None);
    }

    #[test]
    fn env_and_cwd_applied() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().canonicalize().unwrap();
        let out_path = cwd.join("out.txt");
        let out = run_it(&Launch {
            env: vec![
                ("KESTREL_TEST_VAR".into(), "hello world".into()),
                ("HOME".into(), "/kestrel-home".into()),
            ],
            cwd: Some(cwd.clone()),
            stdout: Sink::File(out_path.clone()),
            ..sh("echo \"$KESTREL_TEST_VAR\"; echo \"$HOME\"; pwd -P")
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        assert_eq!(
            fs::read_to_string(&out_path).unwrap(),
            format!("hello world\n/kestrel-home\n{}\n", cwd.display())
        );
    }

    #[test]
    fn path_override_resolves_program() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("kestrel-tool");
        fs::write(&tool, "#!/bin/sh\necho \"tool:$1\"\n").unwrap();
        fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).unwrap();
        let out_path = dir.path().join("out.txt");
        let path = format!("{}:/usr/bin:/bin", dir.path().display());
        let out = run_retrying_busy(&Launch {
            argv: vec!["kestrel-tool".into(), "arg".into()],
            env: vec![("PATH".into(), path)],
            stdout: Sink::File(out_path.clone()),
            ..Launch::default()
        });
        assert_eq!(out.status, ExitKind::Exited(0));
        assert_eq!(fs::read_to_string(&out_path).unwrap(), "tool:arg\n");
    }

    #[test]
    fn empty_argv_fails_cleanly() {
        let out = run_it(&Launch::default());
        assert!(spawn_failed(&out).contains("empty command line"));
    }

    #[test]
    fn poll_timeout_rounds_up() {
        assert_eq!(poll_timeout_ms(Duration::from_nanos(1)), 1);
        assert_eq!(poll_timeout_ms(Duration::from_millis(200)), 200);
        assert_eq!(poll_timeout_ms(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
