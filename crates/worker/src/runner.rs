//! Python runners: the processes in which a worker calls function tasks, one per executor
//! thread (so one per slot), started with the first function task the thread runs and kept
//! for the next ones, never an interpreter per task.
//!
//! A runner is `python/kestrel/_runner.py`, embedded in this binary (so the worker's Python
//! needs only cloudpickle) and given to `python -c` through its stdin (see [`BOOT`]). The two speak length-prefixed frames over the
//! runner's stdin and stdout (the format is in the script's docstring). A job's function is
//! sent to a runner once, before its first call there; each call then carries only the task's
//! id and its argument line.
//!
//! A call that reads values (`kestrel_core::values`) is sent with the paths they were staged
//! at; a result larger than the job's inline limit is pickled by the runner into the cache's
//! `partial` directory and kept in the cache as the task's result value
//! ([`crate::values::keep_result`]), its end carrying a reference to it.
//!
//! A call is waited for as a process is ([`crate::exec::wait_readable`]): a timeout or a
//! cancel kills the runner's process group, and a runner that dies (a segfault, `os._exit`,
//! killed for memory) fails its task with how it ended. Either way the thread's slot is left
//! empty and the next function task starts a fresh runner.

use crate::capture::Captured;
use crate::exec::{exit_kind, tail_of, wait_readable, CancelHandle, ExitKind, Outcome, Woken};
use crate::files::{lock, SharedFiles};
use crate::reaper::Reaper;
use kestrel_core::{FunctionSpec, JobId};
use serde::Deserialize;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The runner's source, embedded so that a worker's Python needs no Kestrel package.
const SOURCE: &str = include_str!("../../../python/kestrel/_runner.py");

/// What `python -c` runs: it reads the runner's source as the first frame on stdin and runs
/// it, so that the command line `ps` shows is this line, not the whole source. (The worker
/// sends nothing else until the runner greets it, so nothing past the source is read here.)
const BOOT: &str = r#"import os, struct
def take(n):
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            raise SystemExit(1)
        b += c
    return b
exec(compile(take(struct.unpack("<I", take(4))[0]), "kestrel-runner", "exec"))
"#;

/// How long a runner may take to start (an interpreter, cloudpickle's import) on a loaded
/// machine with a cold disk.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest frame a runner may send: a result is at most the job's inline limit (4 MiB at
/// most), its traceback and what it printed come beside it.
const MAX_FRAME: usize = 16 << 20;

/// Functions a runner keeps defined at most; past it, the oldest is forgotten (and sent
/// again if its job calls once more).
const DEFINED: usize = 32;

/// What a runner says of itself when it starts.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct RunnerInfo {
    /// `major.minor.micro` of its interpreter.
    pub python: String,
    /// cloudpickle's version, empty if it has none.
    pub cloudpickle: String,
    /// The interpreter's path (`sys.executable`).
    pub executable: String,
}

/// A job's function as runners are given it: the body of the frame that defines it, built
/// once per job on this worker.
#[derive(Debug)]
pub(crate) struct FunctionDef {
    pub(crate) job: JobId,
    pub(crate) name: String,
    /// `D`, the job, the header's length, the header, the pickle.
    frame: Vec<u8>,
}

impl FunctionDef {
    /// The definition of job `job`'s function `f`, whose calls see `env` added to theirs.
    pub(crate) fn new(job: JobId, f: &FunctionSpec, env: &[(String, String)]) -> FunctionDef {
        let header = serde_json::json!({
            "name": f.name,
            "python": f.env.python,
            "cloudpickle": f.env.cloudpickle,
            "modules": f.env.modules,
            "path": f.path,
            "env": env,
            "inline_limit": f.inline_limit,
        })
        .to_string();
        let mut frame = Vec::with_capacity(9 + header.len() + f.pickled.len());
        frame.push(b'D');
        frame.extend_from_slice(&job.to_le_bytes());
        frame.extend_from_slice(&(header.len() as u32).to_le_bytes());
        frame.extend_from_slice(header.as_bytes());
        frame.extend_from_slice(&f.pickled);
        FunctionDef {
            job,
            name: f.name.clone(),
            frame,
        }
    }
}

/// One call of a function task.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub(crate) function: Arc<FunctionDef>,
    /// The task's user-visible id.
    pub(crate) task_id: u32,
    /// Its argument line: base64 of the pickled `(args, kwargs)`.
    pub(crate) line: String,
    pub(crate) timeout: Option<Duration>,
    /// Bytes kept of the result (the job's streamed stdout), `None` if it is not kept.
    pub(crate) result_limit: Option<u32>,
    /// Bytes kept of what the call printed (the job's streamed stderr), `None` if not kept.
    pub(crate) output_limit: Option<u32>,
    /// The name its result goes by if it is kept as a value (larger than the inline limit).
    pub(crate) value: String,
}

/// A runner process.
pub(crate) struct Runner {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    /// The functions it has been sent, oldest first.
    defined: Vec<Arc<FunctionDef>>,
}

/// Starts a runner with `program`, waits for it to say it is ready, and ends it: what a
/// worker started with `--python` checks before it registers, so that a wrong interpreter
/// is refused at start rather than task by task.
pub fn probe(program: &Path) -> Result<RunnerInfo, String> {
    let (runner, info) = Runner::start(program, None, None)?;
    runner.end(None);
    Ok(info)
}

impl Runner {
    /// Starts a runner with `program` and reads its greeting; large results go to `spill`.
    fn start(
        program: &Path,
        spill: Option<&Path>,
        reaper: Option<&Reaper>,
    ) -> Result<(Runner, RunnerInfo), String> {
        let mut cmd = Command::new(program);
        if let Some(dir) = spill {
            cmd.env("KESTREL_SPILL_DIR", dir);
        }
        cmd.args(["-u", "-c", BOOT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start the Python runner '{}': {e}; give `--python PATH` an interpreter that exists",
                program.display()
            )
        })?;
        if let Some(r) = reaper {
            r.record(child.id() as libc::pid_t);
        }
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            unreachable!("both were asked to be piped");
        };
        let mut runner = Runner {
            child,
            stdin,
            stdout,
            defined: Vec::new(),
        };
        // Its source first (see BOOT); an interpreter that died at once is told by the reply.
        let _ = runner.send(SOURCE.as_bytes());
        let hello = match runner.reply(&CancelHandle::new(), Some(Instant::now() + START_TIMEOUT)) {
            Ok(frame) => frame,
            Err(why) => {
                let how = runner.end(reaper);
                return Err(format!(
                    "the Python runner '{}' did not start ({why}; it {how}): check that it runs `{} -c pass`",
                    program.display(),
                    program.display()
                ));
            }
        };
        let info = hello
            .strip_prefix(b"H")
            .and_then(|json| serde_json::from_slice::<RunnerInfo>(json).ok());
        match info {
            Some(info) => Ok((runner, info)),
            None => {
                runner.end(reaper);
                Err(format!(
                    "the Python runner '{}' answered something else than its greeting",
                    program.display()
                ))
            }
        }
    }

    fn send(&mut self, body: &[u8]) -> io::Result<()> {
        self.stdin.write_all(&(body.len() as u32).to_le_bytes())?;
        self.stdin.write_all(body)
    }

    /// The next frame, waiting until `deadline`; an error says why none came.
    fn reply(&mut self, cancel: &CancelHandle, deadline: Option<Instant>) -> Result<Vec<u8>, Stop> {
        match wait_readable(self.stdout.as_raw_fd(), cancel, deadline) {
            Ok(Woken::Readable) => {}
            Ok(Woken::Canceled) => return Err(Stop::Canceled),
            Ok(Woken::TimedOut) => return Err(Stop::TimedOut),
            Err(e) => return Err(Stop::Broken(format!("cannot wait for the runner: {e}"))),
        }
        let mut len = [0u8; 4];
        self.stdout
            .read_exact(&mut len)
            .map_err(|_| Stop::Broken("it closed its output".into()))?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(Stop::Broken(format!("it sent a frame of {len} bytes")));
        }
        let mut body = vec![0u8; len];
        self.stdout
            .read_exact(&mut body)
            .map_err(|_| Stop::Broken("it closed its output mid-frame".into()))?;
        Ok(body)
    }

    /// Makes sure the runner holds `f`, sending it if not.
    fn define(&mut self, f: &Arc<FunctionDef>) -> io::Result<()> {
        if let Some(i) = self.defined.iter().position(|d| Arc::ptr_eq(d, f)) {
            // The most recently used go last.
            let d = self.defined.remove(i);
            self.defined.push(d);
            return Ok(());
        }
        if self.defined.len() >= DEFINED {
            let old = self.defined.remove(0);
            let mut forget = vec![b'F'];
            forget.extend_from_slice(&old.job.to_le_bytes());
            self.send(&forget)?;
        }
        // A function of another job with the same number (another server's) is replaced.
        self.defined.retain(|d| d.job != f.job);
        self.send(&f.frame)?;
        self.defined.push(f.clone());
        Ok(())
    }

    /// Kills the runner's group and reaps it: how it ended. A runner that died (closed its
    /// output) keeps the status it died with: a dying process's exit status is set before
    /// its descriptors close, and the kill only ends one that closed its output and lives on.
    fn end(mut self, reaper: Option<&Reaper>) -> ExitKind {
        let pid = self.child.id() as libc::pid_t;
        // Closing its input ends an idle runner by itself; a busy one is killed.
        drop(self.stdin);
        // SAFETY: plain syscalls on our own unreaped child (and its group): the pid cannot
        // have been reused; errors (ESRCH) are harmless.
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
        }
        if let Some(r) = reaper {
            r.forget(pid);
        }
        match self.child.wait() {
            Ok(status) => exit_kind(status),
            Err(e) => ExitKind::SpawnFailed(format!("cannot wait for the runner: {e}")),
        }
    }
}

/// Why a call got no reply.
enum Stop {
    Canceled,
    TimedOut,
    Broken(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Canceled => f.write_str("canceled"),
            Stop::TimedOut => f.write_str("no greeting in time"),
            Stop::Broken(why) => f.write_str(why),
        }
    }
}

/// Where a thread's runner lives between its calls, and how to start one.
pub(crate) struct RunnerSlot {
    program: PathBuf,
    runner: Option<Runner>,
    /// The worker's cache, where results larger than their job's inline limit are kept.
    cache: Option<SharedFiles>,
}

impl RunnerSlot {
    pub(crate) fn new(program: PathBuf, cache: Option<SharedFiles>) -> RunnerSlot {
        RunnerSlot {
            program,
            runner: None,
            cache,
        }
    }

    /// Calls `call` in this slot's runner, starting one if there is none; `values` are the
    /// values it reads, by name, and where they were staged.
    pub(crate) fn call(
        &mut self,
        call: &Call,
        values: &[(String, PathBuf)],
        cancel: &CancelHandle,
        reaper: Option<&Reaper>,
    ) -> Outcome {
        let started = SystemTime::now();
        match self.call_inner(call, values, cancel, reaper) {
            Ok(reply) => {
                let mut outcome = Outcome::ended(started, ExitKind::Exited(0));
                reply.into_outcome(call, self.cache.as_ref(), &mut outcome);
                outcome
            }
            Err(status) => Outcome::ended(started, status),
        }
    }

    fn call_inner(
        &mut self,
        call: &Call,
        values: &[(String, PathBuf)],
        cancel: &CancelHandle,
        reaper: Option<&Reaper>,
    ) -> Result<Reply, ExitKind> {
        if cancel.is_canceled() {
            return Err(ExitKind::Canceled);
        }
        let mut runner = match self.runner.take() {
            Some(r) => r,
            None => {
                let spill = self.cache.as_ref().map(|c| lock(c).partial_dir());
                Runner::start(&self.program, spill.as_deref(), reaper)
                    .map(|(r, _)| r)
                    .map_err(ExitKind::SpawnFailed)?
            }
        };
        let frame = call_frame(call, values);
        if runner.define(&call.function).is_err() || runner.send(&frame).is_err() {
            return Err(ExitKind::RunnerDied(Box::new(runner.end(reaper))));
        }
        let deadline = call.timeout.and_then(|t| Instant::now().checked_add(t));
        match runner.reply(cancel, deadline) {
            Ok(body) => match Reply::parse(&body) {
                Some(reply) => {
                    self.runner = Some(runner);
                    Ok(reply)
                }
                None => {
                    runner.end(reaper);
                    Err(ExitKind::SpawnFailed(
                        "the Python runner sent a malformed reply; it was restarted".into(),
                    ))
                }
            },
            Err(Stop::Canceled) => {
                runner.end(reaper);
                Err(ExitKind::Canceled)
            }
            Err(Stop::TimedOut) => {
                runner.end(reaper);
                Err(ExitKind::TimedOut)
            }
            Err(Stop::Broken(_)) => Err(ExitKind::RunnerDied(Box::new(runner.end(reaper)))),
        }
    }

    /// Ends the slot's runner, if it has one.
    pub(crate) fn close(&mut self, reaper: Option<&Reaper>) {
        if let Some(r) = self.runner.take() {
            r.end(reaper);
        }
    }
}

/// The frame that calls `call`: `C`, or `V` with the values it reads and their paths.
fn call_frame(call: &Call, values: &[(String, PathBuf)]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(13 + call.line.len());
    frame.push(if values.is_empty() { b'C' } else { b'V' });
    frame.extend_from_slice(&call.function.job.to_le_bytes());
    frame.extend_from_slice(&call.task_id.to_le_bytes());
    if !values.is_empty() {
        frame.extend_from_slice(&(values.len() as u32).to_le_bytes());
        for (name, path) in values {
            let path = path.as_os_str().as_encoded_bytes();
            for part in [name.as_bytes(), path] {
                frame.extend_from_slice(&(part.len() as u32).to_le_bytes());
                frame.extend_from_slice(part);
            }
        }
    }
    frame.extend_from_slice(call.line.as_bytes());
    frame
}

/// A call's end, as the runner sent it.
struct Reply {
    status: u8,
    result: Vec<u8>,
    text: String,
    output: Vec<u8>,
}

impl Reply {
    /// `R`, status, result length, text length, result, text, output.
    fn parse(body: &[u8]) -> Option<Reply> {
        let rest = body.strip_prefix(b"R")?;
        let status = *rest.first()?;
        let n1 = u32::from_le_bytes(rest.get(1..5)?.try_into().ok()?) as usize;
        let n2 = u32::from_le_bytes(rest.get(5..9)?.try_into().ok()?) as usize;
        let rest = rest.get(9..)?;
        let result = rest.get(..n1)?.to_vec();
        let text = String::from_utf8_lossy(rest.get(n1..n1.checked_add(n2)?)?).into_owned();
        let output = rest.get(n1 + n2..)?.to_vec();
        Some(Reply {
            status,
            result,
            text,
            output,
        })
    }

    fn into_outcome(self, call: &Call, cache: Option<&SharedFiles>, outcome: &mut Outcome) {
        let kept = |data: Vec<u8>, limit: Option<u32>| {
            let limit = limit? as usize;
            let total = data.len() as u64;
            let mut data = data;
            data.truncate(limit);
            Some(Captured { data, total })
        };
        match self.status {
            0 => {
                outcome.stdout = kept(self.result, call.result_limit);
                outcome.stderr = kept(self.output, call.output_limit);
            }
            1 => {
                // The exception's own line is the traceback's last.
                let what = self
                    .text
                    .trim_end()
                    .lines()
                    .next_back()
                    .unwrap_or("an exception")
                    .to_string();
                outcome.stderr_tail = tail_of(self.text.as_bytes(), 1024);
                outcome.status = ExitKind::Raised(what);
                outcome.stdout = kept(self.result, call.result_limit);
                let mut output = self.output;
                output.extend_from_slice(self.text.as_bytes());
                outcome.stderr = kept(output, call.output_limit);
            }
            3 => {
                // A result larger than the inline limit, spilled into the cache's directory.
                outcome.stderr = kept(self.output, call.output_limit);
                let path = PathBuf::from(String::from_utf8_lossy(&self.result).into_owned());
                let kept = match cache {
                    Some(c) => {
                        crate::values::keep_result(c, &call.value, &path, &call.function.name)
                    }
                    None => {
                        let _ = std::fs::remove_file(&path);
                        Err(ExitKind::SpawnFailed(
                            "the runner spilled a result, and this worker has no cache".into(),
                        ))
                    }
                };
                match kept {
                    Ok(reference) => outcome.stdout = Some(reference),
                    Err(why) => outcome.status = why,
                }
            }
            _ => {
                outcome.status = ExitKind::Unrunnable(self.text);
                outcome.stderr = kept(self.output, call.output_limit);
            }
        }
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;
    use kestrel_core::PythonEnv;

    /// What `python3` makes of `code`, which writes to `out` (the test's pickles and
    /// arguments are made by the interpreter the runner runs in).
    pub(super) fn python(code: &str) -> Vec<u8> {
        let script = format!(
            "import base64, operator, os, pickle, sys, time\nout = sys.stdout.buffer\n{code}"
        );
        let out = Command::new("python3")
            .args(["-c", &script])
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    pub(super) fn function(
        job: JobId,
        expr: &str,
        env: PythonEnv,
        inline_limit: u32,
    ) -> Arc<FunctionDef> {
        let spec = FunctionSpec {
            name: expr.into(),
            pickled: python(&format!("out.write(pickle.dumps({expr}))")),
            env,
            path: vec![],
            inline_limit,
        };
        Arc::new(FunctionDef::new(job, &spec, &[]))
    }

    pub(super) fn call(f: &Arc<FunctionDef>, args: &str, timeout: Option<Duration>) -> Call {
        let line = python(&format!(
            "out.write(base64.b64encode(pickle.dumps(({args}, {{}}))))"
        ));
        Call {
            function: f.clone(),
            task_id: 0,
            line: String::from_utf8(line).unwrap(),
            timeout,
            result_limit: Some(1 << 20),
            output_limit: Some(1 << 16),
            value: "kestrel-values/r/ab/1/0".into(),
        }
    }

    /// The value a result pickles, as Python prints it.
    pub(super) fn shown(result: &[u8]) -> String {
        let code = format!(
            "sys.stdout.write(repr(pickle.loads(bytes.fromhex({:?}))))",
            hex::encode(result)
        );
        String::from_utf8(python(&code)).unwrap()
    }

    pub(super) fn slot() -> RunnerSlot {
        RunnerSlot::new("python3".into(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;
    use kestrel_core::PythonEnv;

    #[test]
    fn calls_return_their_values_from_one_runner_kept_between_them() {
        let mut slot = slot();
        let pid = function(1, "os.getpid", PythonEnv::default(), 0);
        let add = function(2, "operator.add", PythonEnv::default(), 0);
        let cancel = CancelHandle::new();
        let first = slot.call(&call(&pid, "()", None), &[], &cancel, None);
        assert_eq!(first.status, ExitKind::Exited(0));
        let second = slot.call(&call(&pid, "()", None), &[], &cancel, None);
        let (a, b) = (first.stdout.unwrap().data, second.stdout.unwrap().data);
        assert_eq!(shown(&a), shown(&b), "one runner for both calls");
        let sum = slot.call(&call(&add, "(2, 40)", None), &[], &cancel, None);
        assert_eq!(shown(&sum.stdout.unwrap().data), "42");
        slot.close(None);
    }

    #[test]
    fn a_raise_fails_the_task_with_the_exception_and_its_traceback() {
        let mut slot = slot();
        let div = function(1, "operator.truediv", PythonEnv::default(), 0);
        let out = slot.call(&call(&div, "(1, 0)", None), &[], &CancelHandle::new(), None);
        assert_eq!(
            out.status,
            ExitKind::Raised("ZeroDivisionError: division by zero".into())
        );
        let tail = out.stderr_tail.unwrap();
        assert!(tail.starts_with("Traceback"), "{tail}");
        // The exception itself comes back pickled, for the client to raise.
        assert!(shown(&out.stdout.unwrap().data).starts_with("ZeroDivisionError"));
        slot.close(None);
    }

    #[test]
    fn a_runner_that_dies_fails_its_task_and_a_fresh_one_takes_the_next() {
        let mut slot = slot();
        let exit = function(1, "os._exit", PythonEnv::default(), 0);
        let pid = function(2, "os.getpid", PythonEnv::default(), 0);
        let cancel = CancelHandle::new();
        let before = slot.call(&call(&pid, "()", None), &[], &cancel, None);
        let died = slot.call(&call(&exit, "(3,)", None), &[], &cancel, None);
        assert_eq!(
            died.status,
            ExitKind::RunnerDied(Box::new(ExitKind::Exited(3)))
        );
        let after = slot.call(&call(&pid, "()", None), &[], &cancel, None);
        assert_eq!(after.status, ExitKind::Exited(0));
        assert_ne!(
            shown(&before.stdout.unwrap().data),
            shown(&after.stdout.unwrap().data),
            "a new runner"
        );
        slot.close(None);
    }

    #[test]
    fn a_call_past_its_timeout_or_canceled_kills_the_runner() {
        let mut slot = slot();
        let sleep = function(1, "time.sleep", PythonEnv::default(), 0);
        let started = Instant::now();
        let out = slot.call(
            &call(&sleep, "(30,)", Some(Duration::from_millis(300))),
            &[],
            &CancelHandle::new(),
            None,
        );
        assert_eq!(out.status, ExitKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(20));
        let cancel = CancelHandle::new();
        let c = cancel.clone();
        let canceler = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            c.cancel();
        });
        let out = slot.call(&call(&sleep, "(30,)", None), &[], &cancel, None);
        canceler.join().unwrap();
        assert_eq!(out.status, ExitKind::Canceled);
        slot.close(None);
    }

    #[test]
    fn a_client_of_another_python_or_a_large_result_is_refused_with_what_to_do() {
        let mut slot = slot();
        let other = PythonEnv {
            python: "2.7.18".into(),
            ..PythonEnv::default()
        };
        let pid = function(1, "os.getpid", other, 0);
        let out = slot.call(&call(&pid, "()", None), &[], &CancelHandle::new(), None);
        let ExitKind::Unrunnable(why) = out.status else {
            panic!("{:?}", out.status);
        };
        assert!(why.contains("Python 2.7.18 on the client"), "{why}");
        assert!(why.contains("--python"), "{why}");
        let bytes = function(2, "os.urandom", PythonEnv::default(), 1000);
        let out = slot.call(
            &call(&bytes, "(5000,)", None),
            &[],
            &CancelHandle::new(),
            None,
        );
        let ExitKind::Unrunnable(why) = out.status else {
            panic!("{:?}", out.status);
        };
        assert!(why.contains("above the 1000 bytes"), "{why}");
        slot.close(None);
    }

    #[test]
    fn a_missing_interpreter_is_refused_at_probe() {
        let err = probe(Path::new("/nonexistent/python9")).unwrap_err();
        assert!(err.contains("/nonexistent/python9"), "{err}");
        let info = probe(Path::new("python3")).expect("python3 starts a runner");
        assert!(info.python.starts_with('3'), "{info:?}");
    }
}

#[cfg(test)]
mod value_tests {
    use super::tests_support::*;
    use super::*;
    use crate::cache::{Cache, EvictionPolicy};
    use crate::files::WorkerFiles;
    use kestrel_core::PythonEnv;

    /// A slot whose worker has a cache of `capacity` bytes in `dir`.
    fn slot_with_cache(dir: &Path, capacity: u64) -> (RunnerSlot, SharedFiles) {
        let cache = Cache::open(dir, capacity, EvictionPolicy::Lru).unwrap();
        let files = Arc::new(WorkerFiles::new(cache, 1));
        (
            RunnerSlot::new("python3".into(), Some(files.clone())),
            files,
        )
    }

    #[test]
    fn a_result_above_the_inline_limit_is_kept_in_the_cache_and_its_end_refers_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut slot, files) = slot_with_cache(dir.path(), 1 << 20);
        let bytes = function(1, "os.urandom", PythonEnv::default(), 1000);
        let big = call(&bytes, "(50_000,)", None);
        let out = slot.call(&big, &[], &CancelHandle::new(), None);
        assert_eq!(out.status, ExitKind::Exited(0));
        let reference = out.stdout.expect("a reference").data;
        let (name, size) = kestrel_core::values::parse_reference(&reference).expect("parses");
        assert_eq!(name, big.value);
        assert!(size > 50_000, "{size}");
        let mut c = lock(&files);
        assert!(c.has(name));
        // Kept until the server drops it: nothing evicts it.
        assert!(c.release(name).is_some(), "released only when told");
        drop(c);
        // A small result still comes inline.
        let small = slot.call(
            &call(&bytes, "(10,)", None),
            &[],
            &CancelHandle::new(),
            None,
        );
        let small = small.stdout.unwrap().data;
        assert!(kestrel_core::values::parse_reference(&small).is_none());
        assert!(shown(&small).starts_with("b'") || shown(&small).starts_with("b\""));
        // One the cache cannot hold fails, saying what to do instead, and leaves nothing.
        let huge = slot.call(
            &call(&bytes, "(3_000_000,)", None),
            &[],
            &CancelHandle::new(),
            None,
        );
        let ExitKind::Unrunnable(why) = huge.status else {
            panic!("{:?}", huge.status);
        };
        assert!(
            why.contains("cannot keep it") && why.contains("outputs=[...]"),
            "{why}"
        );
        let partial: Vec<_> = fs_entries(&dir.path().join("partial"));
        assert!(partial.is_empty(), "{partial:?}");
        slot.close(None);
    }

    #[test]
    fn a_call_reads_the_values_staged_for_it_by_name_or_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (mut slot, _files) = slot_with_cache(dir.path(), 1 << 20);
        let value = dir.path().join("v1");
        std::fs::write(&value, python("out.write(pickle.dumps(b'hello'))")).unwrap();
        let length = function(1, "len", PythonEnv::default(), 1000);
        // An argument that is a value: a persistent id in the call's pickle.
        let line = python(
            "import io\n\
             class Ref:\n    name = 'kestrel-values/s/v1'\n\
             class P(pickle.Pickler):\n    def persistent_id(self, o):\n        return ('kestrel-value', o.name) if isinstance(o, Ref) else None\n\
             b = io.BytesIO(); P(b, protocol=5).dump(((Ref(),), {})); out.write(base64.b64encode(b.getvalue()))",
        );
        let mut by_ref = call(&length, "()", None);
        by_ref.line = String::from_utf8(line).unwrap();
        let staged = vec![("kestrel-values/s/v1".to_string(), value.clone())];
        let out = slot.call(&by_ref, &staged, &CancelHandle::new(), None);
        assert_eq!(shown(&out.stdout.unwrap().data), "5");
        // A whole call too large for its line: the line names the value holding it.
        let whole = dir.path().join("v2");
        std::fs::write(&whole, python("out.write(pickle.dumps(((b'abc',), {})))")).unwrap();
        let mut by_name = call(&length, "()", None);
        by_name.line = "@kestrel-values/a/v2".into();
        let staged = vec![("kestrel-values/a/v2".to_string(), whole)];
        let out = slot.call(&by_name, &staged, &CancelHandle::new(), None);
        assert_eq!(shown(&out.stdout.unwrap().data), "3");
        // A value the call needs but was not given fails the call, naming it.
        let out = slot.call(&by_name, &[], &CancelHandle::new(), None);
        let ExitKind::Unrunnable(why) = out.status else {
            panic!("{:?}", out.status);
        };
        assert!(why.contains("kestrel-values/a/v2"), "{why}");
        slot.close(None);
    }

    fn fs_entries(dir: &Path) -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }
}
