//! A small process per worker that kills the worker's task process groups when the worker dies.
//!
//! Every task runs in its own process group, so that a timeout or a cancel kills everything the
//! task started; the flip side is that nothing kills those groups when the worker itself dies
//! (`kill -9`, OOM killer, a crash): they were adopted by init and ran on while the server ran
//! the same tasks again elsewhere. The worker cannot set `PR_SET_PDEATHSIG` on its tasks without
//! `pre_exec`, which would push std off its posix_spawn fast path (see [`crate::exec`]).
//!
//! Instead the worker starts a reaper when it starts. The reaper holds the read end of a pipe whose write end only the worker holds (close-on-exec, so tasks never inherit
//! it). The worker writes each task's process group id when it has spawned it, and its negation
//! once the group leader has exited but *before* reaping it: until then the pid, and so the
//! group id, cannot be reused, so a recorded id never names a stranger's group. When the pipe
//! reaches end-of-file (the worker exited or was killed, whatever the signal), the reaper
//! SIGKILLs every group still recorded and exits. Each message is one 4-byte `write`, atomic
//! because it is below `PIPE_BUF`, so executor threads share the pipe without a lock; the
//! reaper reads them in batches every 10 ms, so it costs the worker no wake-ups per task.
//!
//! The reaper leaves the worker's process group (a Ctrl-C at the terminal must not kill it
//! before it can do its job), ignores the signals a user or a terminal sends to stop a
//! program, and closes every inherited descriptor but its pipe (it must not keep the worker's
//! sockets, such as an embedded server's listening socket, or its output pipes open).
//!
//! A program that calls [`serve_if_reaper`] first thing in `main` (the `kestrel` binary does)
//! gets reapers that are fresh runs of its own executable, started through posix_spawn: about
//! 1 MiB each. Otherwise the worker forks the reaper without exec; such a child keeps a copy of
//! every page the worker later changes or frees (a `kestrel run` that had read a million-line
//! list before starting its workers kept 200 MB alive that way). Being the child of `fork()`
//! in a multi-threaded process, it may only make async-signal-safe calls: its table is
//! allocated before forking, and the reaper makes nothing but raw system calls either way.
//!
//! A reaper started from the executable says it is ready (after it has checked that it was
//! started by its worker, and named itself) on a second pipe, and [`Reaper::start`] waits for
//! that: the worker starts no task before its reaper can kill it. Without the wait, a worker
//! killed while its reaper was still being loaded (tens of milliseconds on a busy machine)
//! left a reaper whose parent was no longer the worker it named; it refused to serve, and the
//! worker's tasks ran on.
//!
//! Limits: a task spawned in the instant between `posix_spawn` returning and its group being
//! written to the pipe is not covered (an instant that, on a machine with more runnable threads
//! than cores, can last as long as a task takes to start: the executor thread waits for a core
//! while the task runs; closing it needs `PR_SET_PDEATHSIG` in the child, see above); a task that moves itself to another process group or
//! session escapes, as do background processes left behind by a task whose leader has exited.

use std::ffi::OsStr;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Set in a reaper's environment to `WORKER_PID:CAPACITY` by the worker that starts it.
const REAPER_ENV: &str = "KESTREL_REAPER";

/// Set by [`serve_if_reaper`]: this program's executable can be started as a reaper.
static EXECUTABLE_SERVES: AtomicBool = AtomicBool::new(false);

/// Runs the reaper and exits if this process was started as one; otherwise returns at once,
/// and from then on workers in this process start their reapers by running this program's
/// executable. Call it first thing in `main`: a reaper must do nothing else.
pub fn serve_if_reaper() {
    if let Some(capacity) = std::env::var_os(REAPER_ENV).and_then(|v| reaper_request(&v)) {
        let mut table = Vec::with_capacity(capacity);
        // SAFETY: a fresh process with the pipe as standard input and the worker's end of
        // the readiness pipe as standard output; reaper_main never returns.
        unsafe { reaper_main(0, &mut table, open_files_limit(), true) }
    }
    EXECUTABLE_SERVES.store(true, Ordering::Relaxed);
}

/// The capacity asked for by a worker that started this process as its reaper. A variable
/// merely left in a user's environment does not qualify: the parent must be the pid it names
/// and standard input a pipe.
fn reaper_request(value: &OsStr) -> Option<usize> {
    let (worker, capacity) = value.to_str()?.split_once(':')?;
    let worker: libc::pid_t = worker.parse().ok()?;
    let capacity: usize = capacity.parse().ok()?;
    // SAFETY: plain syscalls; fstat fills the struct we pass.
    let piped = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(0, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO
    };
    // SAFETY: plain syscall.
    (piped && unsafe { libc::getppid() } == worker).then_some(capacity.clamp(1, 1 << 20))
}

/// The worker's end of a running reaper. Dropping it closes the pipe, which makes the reaper
/// kill the groups still recorded (none after a clean shutdown) and exit, and then reaps it.
#[derive(Debug)]
pub struct Reaper {
    /// Write end of the pipe; closed explicitly in `drop` before waiting for the reaper.
    pipe: ManuallyDrop<OwnedFd>,
    pid: libc::pid_t,
    /// Set once a write failed, so the warning is logged once.
    broken: AtomicBool,
}

/// What a reaper started from the executable writes on its standard output once it serves.
const READY: &[u8] = b"kestrel-reaper ready\n";

/// How long [`Reaper::start`] waits for a reaper started from the executable to be ready.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// Bytes per message: a process group id, negated to forget it.
const MESSAGE: usize = std::mem::size_of::<libc::pid_t>();

/// How long the reaper pauses after each read: it notices the worker's death at most this
/// late, and the pipe (64 KiB, 16384 messages) does not fill at any spawn rate a worker
/// reaches.
const BATCH_PAUSE: libc::timespec = libc::timespec {
    tv_sec: 0,
    tv_nsec: 10_000_000,
};

impl Reaper {
    /// Starts a reaper that can record up to `capacity` process groups at once (the number
    /// of tasks that can run at once; a group beyond that is not recorded): this program's
    /// executable if it serves as one (see [`serve_if_reaper`]), else a fork. Returns once the
    /// reaper serves: if this process dies from then on, the reaper kills what it recorded.
    pub fn start(capacity: usize) -> io::Result<Reaper> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are fresh descriptors that nothing else owns.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let capacity = capacity.max(1);
        let spawned = if EXECUTABLE_SERVES.load(Ordering::Relaxed) {
            spawn_executable(read.try_clone()?, capacity)
                .inspect_err(|e| {
                    tracing::warn!("the reaper could not be started from the executable ({e}); forking it instead")
                })
                .ok()
        } else {
            None
        };
        let pid = match spawned {
            Some(pid) => pid,
            None => fork(read, capacity)?,
        };
        Ok(Reaper {
            pipe: ManuallyDrop::new(write),
            pid,
            broken: AtomicBool::new(false),
        })
    }

    /// The reaper's process id.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Records a task's process group (call right after spawning its leader).
    pub fn record(&self, pgid: libc::pid_t) {
        self.send(pgid);
    }

    /// Forgets a task's process group: call when its leader has exited (or was killed) and
    /// before it is reaped, so the reaper never holds an id that may be reused.
    pub fn forget(&self, pgid: libc::pid_t) {
        self.send(-pgid);
    }

    fn send(&self, message: libc::pid_t) {
        let bytes = message.to_ne_bytes();
        loop {
            // SAFETY: writes MESSAGE bytes from a local array to a descriptor we own.
            let n = unsafe { libc::write(self.pipe.as_raw_fd(), bytes.as_ptr().cast(), MESSAGE) };
            if n == MESSAGE as isize {
                return;
            }
            let err = io::Error::last_os_error();
            if n < 0 && err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // A pipe write below PIPE_BUF is all or nothing, so this is an error, typically
            // EPIPE because someone killed the reaper.
            if !self.broken.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    reaper = self.pid,
                    error = %err,
                    "the worker's reaper process is gone: if this worker is killed, its tasks will keep running"
                );
            }
            return;
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here; the field is not used afterwards.
        drop(unsafe { ManuallyDrop::take(&mut self.pipe) });
        // The reaper exits as soon as it reads end-of-file: reap it so no zombie is left.
        let mut status = 0;
        // SAFETY: plain syscall on our own child.
        while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
    }
}

/// Starts this program's executable as a reaper reading `pipe` (see [`serve_if_reaper`]).
/// Returns once the reaper says it is ready.
fn spawn_executable(pipe: OwnedFd, capacity: usize) -> io::Result<libc::pid_t> {
    let mut child = Command::new("/proc/self/exe")
        .arg0("kestrel-reaper")
        .env(REAPER_ENV, format!("{}:{capacity}", std::process::id()))
        .stdin(Stdio::from(pipe))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let ready = match child.stdout.take() {
        Some(out) => wait_ready(out.into(), READY_LIMIT),
        None => Err(io::Error::other("no pipe to the reaper's standard output")),
    };
    match ready {
        // Reaped by `Reaper::drop`.
        Ok(()) => Ok(child.id() as libc::pid_t),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// Reads [`READY`] from a starting reaper's standard output, for at most `limit`.
fn wait_ready(out: OwnedFd, limit: Duration) -> io::Result<()> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::with_capacity(READY.len());
    let mut buf = [0u8; 64];
    while got.len() < READY.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the reaper process was not ready within {limit:?}"),
            ));
        }
        let mut pfd = libc::pollfd {
            fd: out.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = crate::exec::poll_timeout_ms(left);
        // SAFETY: polls one descriptor we own, described by a local struct.
        if unsafe { libc::poll(&mut pfd, 1, ms) } < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if pfd.revents == 0 {
            continue;
        }
        // SAFETY: reads into a local buffer from a descriptor we own.
        let n = unsafe { libc::read(out.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match n {
            0 => break,
            n if n < 0 => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
            n => got.extend_from_slice(&buf[..n as usize]),
        }
    }
    if got == READY {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "the reaper process exited or said something else than that it was ready: {:?}",
            String::from_utf8_lossy(&got)
        )))
    }
}

/// Forks a reaper reading `pipe`; the child never returns.
fn fork(pipe: OwnedFd, capacity: usize) -> io::Result<libc::pid_t> {
    // Everything the child needs is prepared here: after fork it must not allocate.
    let mut table: Vec<libc::pid_t> = Vec::with_capacity(capacity);
    let fd_limit = open_files_limit();
    // SAFETY: the child runs only `reaper_main`, which makes raw system calls, touches
    // memory allocated before the fork, and never returns (it ends with `_exit`).
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        // A forked reaper needs no readiness: it holds the pipe, both ends, from the start.
        0 => unsafe { reaper_main(pipe.as_raw_fd(), &mut table, fd_limit, false) },
        pid => Ok(pid),
    }
}

/// The soft limit on open files: the highest descriptor the child may have to close if the
/// kernel lacks `close_range` (Linux < 5.9).
fn open_files_limit() -> libc::c_int {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    libc::c_int::try_from(limit.rlim_cur).unwrap_or(libc::c_int::MAX)
}

/// The reaper's whole life, in the child of `fork()` or in a fresh process. Only
/// async-signal-safe system calls; `table` was allocated before and never grows. With
/// `says_ready`, it says on descriptor 1 that it serves, and closes it.
unsafe fn reaper_main(
    pipe: RawFd,
    table: &mut Vec<libc::pid_t>,
    fd_limit: libc::c_int,
    says_ready: bool,
) -> ! {
    // The pipe becomes descriptor 0 and every other inherited descriptor is closed (but the
    // readiness pipe, descriptor 1, until it has been written).
    if pipe != 0 && libc::dup2(pipe, 0) != 0 {
        libc::_exit(1);
    }
    let first_closed: libc::c_int = if says_ready { 2 } else { 1 };
    if libc::syscall(libc::SYS_close_range, first_closed as u32, u32::MAX, 0u32) != 0 {
        for fd in first_closed..fd_limit {
            libc::close(fd);
        }
    }
    // Its own process group: a Ctrl-C (or a kill of the worker's group) does not reach it.
    libc::setpgid(0, 0);
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGPIPE,
    ] {
        libc::signal(sig, libc::SIG_IGN);
    }
    // A name that says what it is in `ps` and `top` (at most 15 bytes).
    libc::prctl(
        libc::PR_SET_NAME,
        c"kestrel-reaper".as_ptr() as libc::c_ulong,
        0,
        0,
        0,
    );
    if says_ready {
        // One write below PIPE_BUF: whole or not at all. If the worker is already gone, the
        // write fails (SIGPIPE is ignored) and the pipe's end-of-file below ends the reaper.
        libc::write(1, READY.as_ptr().cast(), READY.len());
        libc::close(1);
    }

    let mut buf = [0u8; 4096];
    // Bytes of an incomplete message kept at the start of `buf` (never expected: every
    // message is written whole, but reading must not depend on it).
    let mut kept = 0usize;
    loop {
        let n = libc::read(0, buf.as_mut_ptr().add(kept).cast(), buf.len() - kept);
        if n == 0 {
            break;
        }
        if n < 0 {
            if *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break;
        }
        let end = kept + n as usize;
        let whole = end - end % MESSAGE;
        let mut at = 0;
        while at < whole {
            let mut bytes = [0u8; MESSAGE];
            bytes.copy_from_slice(&buf[at..at + MESSAGE]);
            apply(table, libc::pid_t::from_ne_bytes(bytes));
            at += MESSAGE;
        }
        buf.copy_within(whole..end, 0);
        kept = end - whole;
        // Read in batches: waking for every message cost more than the messages (two per
        // task); the pipe holds thousands of them, and a dead worker is noticed this late.
        libc::nanosleep(&BATCH_PAUSE, std::ptr::null_mut());
    }
    // The worker is gone: nothing else will stop its tasks.
    for &pgid in table.iter() {
        libc::killpg(pgid, libc::SIGKILL);
    }
    libc::_exit(0)
}

/// Records (`message > 0`) or forgets (`message < 0`) a process group without allocating.
fn apply(table: &mut Vec<libc::pid_t>, message: libc::pid_t) {
    if message > 0 {
        // Within capacity a push never reallocates; a group beyond it goes unrecorded.
        if table.len() < table.capacity() {
            table.push(message);
        }
    } else if let Some(at) = table.iter().position(|&g| g == message.wrapping_neg()) {
        table.swap_remove(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    /// A process group of two `sleep`s, like a task that started a child. The shell execs
    /// the second, so the group has exactly two members once the first is forked, and
    /// never more: a count taken then cannot grow later.
    fn group() -> (Child, libc::pid_t) {
        let child = Command::new("sh")
            .args(["-c", "sleep 300 & exec sleep 300"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as libc::pid_t;
        (child, pgid)
    }

    /// Live (non-zombie) members of a process group.
    fn members(pgid: libc::pid_t) -> usize {
        fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                    let Some((_, rest)) = s.rsplit_once(')') else {
                        return false;
                    };
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    f.len() > 2 && f[0] != "Z" && f[0] != "X" && f[2] == pgid.to_string()
                })
            })
            .count()
    }

    fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn closing_the_pipe_kills_recorded_groups_only() {
        let reaper = Reaper::start(4).unwrap();
        let reaper_pid = reaper.pid();
        let (mut recorded, recorded_pgid) = group();
        let (mut forgotten, forgotten_pgid) = group();
        reaper.record(recorded_pgid);
        reaper.record(forgotten_pgid);
        reaper.forget(forgotten_pgid);
        wait_until("both groups to start their children", || {
            members(recorded_pgid) == 2 && members(forgotten_pgid) == 2
        });
        // Dropping is what the worker's death does to the pipe; drop also reaps the reaper.
        drop(reaper);
        wait_until("the recorded group to die", || members(recorded_pgid) == 0);
        let _ = recorded.wait();
        assert_eq!(
            members(forgotten_pgid),
            2,
            "a forgotten group must be left alone"
        );
        // SAFETY: our own child's group.
        unsafe { libc::killpg(forgotten_pgid, libc::SIGKILL) };
        let _ = forgotten.wait();
        // The reaper was reaped, not left as a zombie.
        // SAFETY: signal 0 only checks existence.
        assert_ne!(unsafe { libc::kill(reaper_pid, 0) }, 0);
    }

    #[test]
    fn the_reaper_keeps_only_its_pipe_and_leaves_the_process_group() {
        let reaper = Reaper::start(1).unwrap();
        let pid = reaper.pid();
        wait_until("the reaper to set itself up", || {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c == "kestrel-reaper\n")
        });
        let fds: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            fds,
            vec!["0".to_string()],
            "inherited descriptors stay open"
        );
        // SAFETY: plain syscalls.
        let (its_group, ours) = unsafe { (libc::getpgid(pid), libc::getpgid(0)) };
        assert_eq!(its_group, pid);
        assert_ne!(its_group, ours);
    }

    #[test]
    fn a_stray_reaper_variable_does_not_make_a_reaper() {
        // SAFETY: plain syscall.
        let not_parent = unsafe { libc::getppid() } + 1;
        for value in ["", "x", "12", "12:x", &format!("{not_parent}:4")] {
            assert_eq!(reaper_request(OsStr::new(value)), None, "{value:?}");
        }
    }

    #[test]
    fn the_table_adds_forgets_and_stays_within_capacity() {
        let mut table = Vec::with_capacity(2);
        let cap = table.capacity();
        for g in 1..=(cap as i32 + 1) {
            apply(&mut table, g);
        }
        assert_eq!(table.len(), cap);
        apply(&mut table, -1);
        apply(&mut table, -99);
        apply(&mut table, 0);
        assert_eq!(table.len(), cap - 1);
        assert!(!table.contains(&1));
        assert_eq!(table.capacity(), cap);
    }

    /// A pipe whose write end gets `written` and is then closed, or kept open if `keep`.
    fn ready_pipe(written: &[u8], keep: bool) -> (OwnedFd, Option<OwnedFd>) {
        let mut fds = [0 as RawFd; 2];
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let n = unsafe { libc::write(write.as_raw_fd(), written.as_ptr().cast(), written.len()) };
        assert_eq!(n, written.len() as isize);
        (read, keep.then_some(write))
    }

    #[test]
    fn only_the_ready_line_means_ready() {
        let (out, _) = ready_pipe(READY, false);
        wait_ready(out, Duration::from_secs(5)).expect("ready");

        // A kestrel that did not become a reaper prints its usage instead, and exits.
        let (out, _) = ready_pipe(b"Usage: kestrel <COMMAND>\n", false);
        let err = wait_ready(out, Duration::from_secs(5)).unwrap_err();
        assert!(err.to_string().contains("Usage: kestrel"), "{err}");

        let (out, _) = ready_pipe(b"", false);
        let err = wait_ready(out, Duration::from_secs(5)).unwrap_err();
        assert!(err.to_string().contains("exited"), "{err}");

        // Still loading: the wait gives up at its limit.
        let (out, _writer) = ready_pipe(&READY[..3], true);
        let err = wait_ready(out, Duration::from_millis(50)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    }
}
