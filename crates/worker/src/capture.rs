//! A task's stdout or stderr captured in memory, for streamed output (`--stdout stream`).
//!
//! The child writes into a pipe. Its read end joins the `poll` in which the executor thread
//! already waits for the task's exit (see `exec`), so output is read as it is written: no thread
//! per task, and the child still starts through posix_spawn (the pipe is just its stdout).
//! Only the first `limit` bytes are kept; the rest is read and counted, so a chatty task never
//! blocks on a full pipe and the worker never holds more than `limit` bytes of it. What is
//! written after the task's main process exited (by a background process) is not kept: the
//! pipe is read one last time and closed.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// What a task wrote to a captured stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first bytes written, at most the capture's limit.
    pub data: Vec<u8>,
    /// Bytes written in all; more than `data.len()` when the output was cut.
    pub total: u64,
}

impl Captured {
    /// Whether the task wrote more than was kept.
    pub fn truncated(&self) -> bool {
        self.total > self.data.len() as u64
    }
}

/// Bytes read per `read` call: a whole pipe buffer (64 KiB by default) at once.
const READ_BYTES: usize = 64 << 10;
/// How much is still read once the task's main process has exited: what it wrote is in the
/// pipe already (at most a pipe buffer); a background process writing on must not keep the
/// executor thread reading forever.
const DRAIN_BYTES: u64 = 1 << 20;

/// The reading side of one captured stream.
#[derive(Debug)]
pub(crate) struct Capture {
    /// The pipe's read end (non-blocking); `None` once the writers closed it or it was read
    /// for the last time.
    pipe: Option<OwnedFd>,
    captured: Captured,
    limit: usize,
}

impl Capture {
    /// A pipe for one stream of a task: the capture, and the write end to give the child.
    pub(crate) fn open(limit: u32) -> io::Result<(Capture, OwnedFd)> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are new and owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // Only our end is non-blocking: the child's stdout must block as usual when full.
        // SAFETY: plain fcntl on a descriptor we own.
        if unsafe { libc::fcntl(read.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let capture = Capture {
            pipe: Some(read),
            captured: Captured::default(),
            limit: limit as usize,
        };
        Ok((capture, write))
    }

    /// The descriptor to poll, or -1 (which `poll` skips) once closed.
    pub(crate) fn poll_fd(&self) -> RawFd {
        self.pipe.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// Reads what the pipe holds now (after `poll` said it is readable); closes it at the end
    /// of the stream. Stops after a short read: the next `poll` reports whatever comes later.
    pub(crate) fn read_ready(&mut self) {
        self.read_up_to(u64::MAX, true);
    }

    /// Reads what is left once the task's main process is gone, then closes the pipe.
    pub(crate) fn drain(&mut self) {
        self.read_up_to(DRAIN_BYTES, false);
        self.pipe = None;
    }

    /// Reads until `budget` bytes were read, the pipe is empty (or, with `short_stops`, a read
    /// returned less than asked) or at its end (then closes it).
    fn read_up_to(&mut self, mut budget: u64, short_stops: bool) {
        let Some(fd) = self.pipe.as_ref().map(AsRawFd::as_raw_fd) else {
            return;
        };
        let mut buf = [0u8; READ_BYTES];
        while budget > 0 {
            // SAFETY: reads at most `buf.len()` bytes into a valid buffer; `fd` is open.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let err = io::Error::last_os_error();
                match err.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => return,
                    // Not expected from a pipe; keep what was read rather than spin.
                    _ => {
                        self.pipe = None;
                        return;
                    }
                }
            }
            if n == 0 {
                self.pipe = None;
                return;
            }
            let n = n as usize;
            self.keep(&buf[..n]);
            budget = budget.saturating_sub(n as u64);
            if short_stops && n < buf.len() {
                return;
            }
        }
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = self.limit.saturating_sub(self.captured.data.len());
        self.captured
            .data
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.captured.total += bytes.len() as u64;
    }

    /// What was captured.
    pub(crate) fn finish(self) -> Captured {
        self.captured
    }
}

/// The captured streams of one task.
#[derive(Debug, Default)]
pub(crate) struct Captures {
    pub(crate) stdout: Option<Capture>,
    pub(crate) stderr: Option<Capture>,
}

impl Captures {
    /// The descriptors to poll for stdout and stderr (-1 when not captured or closed).
    pub(crate) fn poll_fds(&self) -> [RawFd; 2] {
        [&self.stdout, &self.stderr].map(|c| c.as_ref().map_or(-1, Capture::poll_fd))
    }

    /// Reads stream `which` (0 stdout, 1 stderr) after `poll` reported it.
    pub(crate) fn read_ready(&mut self, which: usize) {
        if let Some(c) = self.get(which) {
            c.read_ready();
        }
    }

    /// Reads what is left in both pipes once the main process is gone, and closes them.
    pub(crate) fn drain(&mut self) {
        for which in 0..2 {
            if let Some(c) = self.get(which) {
                c.drain();
            }
        }
    }

    /// Reads both pipes until every writer closed them (blocking), for when the exit of the
    /// task cannot be polled (kernels without pidfd): the child would block on a full pipe.
    pub(crate) fn read_until_closed(&mut self) {
        loop {
            let fds = self.poll_fds();
            if fds.iter().all(|fd| *fd < 0) {
                return;
            }
            let mut polled = fds.map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            // SAFETY: `polled` is a valid array of two pollfds for the duration of the call.
            let rc = unsafe { libc::poll(polled.as_mut_ptr(), 2, -1) };
            if rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                self.drain();
                return;
            }
            for (which, p) in polled.iter().enumerate() {
                if p.revents != 0 {
                    self.read_ready(which);
                }
            }
        }
    }

    fn get(&mut self, which: usize) -> Option<&mut Capture> {
        match which {
            0 => self.stdout.as_mut(),
            _ => self.stderr.as_mut(),
        }
    }

    /// What was captured of stdout and stderr.
    pub(crate) fn finish(self) -> (Option<Captured>, Option<Captured>) {
        (
            self.stdout.map(Capture::finish),
            self.stderr.map(Capture::finish),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_all(fd: &OwnedFd, bytes: &[u8]) {
        // SAFETY: writes from a valid buffer to a descriptor we own.
        let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(n, bytes.len() as isize);
    }

    #[test]
    fn keeps_the_head_and_counts_the_rest() {
        let (mut c, w) = Capture::open(10).unwrap();
        write_all(&w, b"0123456789abcdef");
        c.read_ready();
        write_all(&w, b"more");
        drop(w);
        c.drain();
        assert_eq!(c.poll_fd(), -1);
        let got = c.finish();
        assert_eq!(got.data, b"0123456789");
        assert_eq!(got.total, 20);
        assert!(got.truncated());
    }

    #[test]
    fn the_end_of_the_stream_closes_the_pipe() {
        let (mut c, w) = Capture::open(100).unwrap();
        write_all(&w, b"hi\n");
        drop(w);
        // One short read, then the end of the stream on the next.
        c.read_ready();
        assert!(c.poll_fd() >= 0);
        c.read_ready();
        assert_eq!(c.poll_fd(), -1);
        assert_eq!(c.finish().data, b"hi\n");
    }

    #[test]
    fn a_drain_stops_when_the_pipe_is_empty_even_if_a_writer_remains() {
        let (mut c, w) = Capture::open(100).unwrap();
        write_all(&w, b"partial");
        c.drain();
        assert_eq!(c.poll_fd(), -1);
        let got = c.finish();
        assert_eq!((got.data.as_slice(), got.total), (&b"partial"[..], 7));
        drop(w);
    }
}
