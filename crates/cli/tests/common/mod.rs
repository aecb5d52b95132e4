//! Shared helpers for the integration tests: a real `kestrel server` and real `kestrel worker`s
//! as child processes on loopback, client commands with bounded run times, and polling with
//! deadlines. Every process a [`Cluster`] starts is SIGKILLed when it is dropped, together with
//! the task process groups its workers still run, so a failing test leaks nothing.

#![allow(dead_code)]

#[path = "../../../alloc/tests/support/trials.rs"]
pub mod trials;

use serde_json::Value;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// The `kestrel` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_kestrel");
/// How long a server may take to write its access file.
pub const STARTUP: Duration = Duration::from_secs(10);
/// How long any one client command may take.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// Calls `f` until it returns `Some`, sleeping `every` in between; panics naming `what` once
/// `limit` has passed.
pub fn poll_every<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(every);
    }
}

/// [`poll_every`] with a short interval, for cheap checks (files, /proc).
pub fn poll<T>(what: &str, limit: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll_every(what, limit, Duration::from_millis(10), f)
}

/// A `kestrel` command with a clean environment (no server dir or log filter from the caller).
pub fn kestrel() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("KESTREL_SERVER_DIR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

/// What a finished client command did.
#[derive(Debug)]
pub struct Out {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Asserts exit code 0.
    #[track_caller]
    pub fn ok(&self) -> &Out {
        assert_eq!(self.code(), Some(0), "`{}` failed: {self:#?}", self.what);
        self
    }

    /// Asserts a non-zero exit code (not a signal).
    #[track_caller]
    pub fn failed(&self) -> &Out {
        let code = self.code();
        assert!(
            code.is_some_and(|c| c != 0),
            "`{}` should have failed: {self:#?}",
            self.what
        );
        self
    }

    /// The single JSON document on stdout.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("`{}` printed no JSON ({e}): {self:#?}", self.what))
    }

    /// All JSON documents on stdout, in order (e.g. `submit --wait --output json`).
    #[track_caller]
    pub fn json_docs(&self) -> Vec<Value> {
        serde_json::Deserializer::from_str(&self.stdout)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("`{}` printed bad JSON ({e}): {self:#?}", self.what))
    }

    /// Asserts a failure reported as exactly one `error: ...` line on stderr; returns it.
    #[track_caller]
    pub fn one_line_error(&self) -> &str {
        self.failed();
        let err = self.stderr.trim_end();
        assert!(
            err.starts_with("error: ") && !err.contains('\n'),
            "`{}` should print a one-line error, got stderr:\n{}",
            self.what,
            self.stderr
        );
        err
    }
}

/// Runs a command to completion with a deadline (killed and reported if it overruns).
/// Output goes through files, so a chatty child can never block on a full pipe.
#[track_caller]
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Out {
    let what = format!("{cmd:?}");
    let mut out = tempfile::tempfile().expect("temp file");
    let mut err = tempfile::tempfile().expect("temp file");
    cmd.stdout(out.try_clone().expect("dup"))
        .stderr(err.try_clone().expect("dup"));
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {limit:?}; stderr so far:\n{}",
                read_all(&mut err)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Out {
        what,
        status,
        stdout: read_all(&mut out),
        stderr: read_all(&mut err),
    }
}

fn read_all(f: &mut File) -> String {
    let mut s = String::new();
    let _ = f.seek(SeekFrom::Start(0));
    let _ = f.read_to_string(&mut s);
    s
}

/// Runs `kestrel --server-dir DIR ARGS...` in `cwd`.
#[track_caller]
pub fn client(server_dir: &Path, cwd: &Path, args: &[&str]) -> Out {
    let mut c = kestrel();
    c.arg("--server-dir")
        .arg(server_dir)
        .args(args)
        .current_dir(cwd);
    run_bounded(c, COMMAND_LIMIT)
}

/// Command name, parent pid and process group of `pid`, or `None` if it is gone or a zombie.
pub fn proc_info(pid: i32) -> Option<(String, i32, i32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_string();
    let mut fields = stat[close + 1..].split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((comm, ppid, pgrp))
}

/// Whether a process with this pid still runs (zombies count as gone).
pub fn alive(pid: i32) -> bool {
    proc_info(pid).is_some()
}

/// Live children of `parent`.
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| proc_info(*pid).is_some_and(|(_, ppid, _)| ppid == parent))
        .collect()
}

/// SIGKILLs a whole process group.
pub fn kill_group(pgid: i32) {
    if pgid > 1 {
        // SAFETY: plain syscall; only called with groups this test created.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}

/// Reads a pid written by a task (`echo $$ > FILE`), once the line is complete.
pub fn read_pid(path: &Path) -> Option<i32> {
    let s = fs::read_to_string(path).ok()?;
    if !s.ends_with('\n') {
        return None;
    }
    s.trim().parse().ok()
}

/// The rows of `kestrel task list JOB --output json`.
/// The allocations of the server's first allocation queue (`alloc list --output json`).
pub fn allocations(c: &Cluster) -> Vec<Value> {
    let v = c.run(&["alloc", "list", "--output", "json"]).ok().json();
    v["queues"][0]["allocations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

pub fn task_rows(c: &Cluster, job: &str) -> Vec<Value> {
    let page = c
        .run(&["task", "list", job, "--output", "json"])
        .ok()
        .json();
    page["tasks"].as_array().expect("tasks").clone()
}

/// A server, its workers and the directories they use; everything dies with it.
pub struct Cluster {
    root: TempDir,
    /// The server directory (holds access.json).
    pub server_dir: PathBuf,
    /// Where client commands and tasks run.
    pub work: PathBuf,
    logs: PathBuf,
    server: Option<Child>,
    workers: Vec<Option<Child>>,
    /// Task process groups orphaned by a killed worker, to kill at the end.
    orphans: Vec<i32>,
    starts: usize,
    probes: std::cell::Cell<u32>,
    /// Extra arguments of `kestrel server start` (e.g. a short heartbeat).
    server_args: Vec<String>,
    /// Environment variables of the server started next (e.g. a PATH with wrapped commands).
    pub server_env: Vec<(String, String)>,
}

impl Cluster {
    /// A running server with no workers.
    pub fn new() -> Cluster {
        Cluster::with_server_args(&[])
    }

    /// A running server started with extra `kestrel server start` arguments, no workers.
    pub fn with_server_args(args: &[&str]) -> Cluster {
        let root = tempfile::Builder::new()
            .prefix("kestrel-it-")
            .tempdir()
            .expect("temp dir");
        let server_dir = root.path().join("server");
        let work = root.path().join("work");
        let logs = root.path().join("logs");
        fs::create_dir_all(&work).unwrap();
        fs::create_dir_all(&logs).unwrap();
        let mut c = Cluster {
            root,
            server_dir,
            work,
            logs,
            server: None,
            workers: Vec::new(),
            orphans: Vec::new(),
            starts: 0,
            probes: std::cell::Cell::new(0),
            server_args: args.iter().map(|a| a.to_string()).collect(),
            server_env: Vec::new(),
        };
        c.start_server();
        c
    }

    /// A running server and one worker per entry of `slots`, all registered.
    pub fn with_workers(slots: &[u32]) -> Cluster {
        let mut c = Cluster::new();
        for &s in slots {
            c.add_worker(s);
        }
        c.wait_workers(slots.len());
        c
    }

    /// The temporary root, for files that belong to no server.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    fn log_file(&mut self, name: &str) -> File {
        self.starts += 1;
        File::create(self.logs.join(format!("{:02}-{name}.log", self.starts))).expect("log")
    }

    /// Starts a server on loopback in `server_dir` and waits for its access file. Any access
    /// file already there (from a stopped server) is removed first, so the wait is for this one.
    pub fn start_server(&mut self) {
        self.start_server_with(&[]);
    }

    /// [`Self::start_server`] with extra `server start` arguments.
    pub fn start_server_with(&mut self, extra: &[&str]) {
        assert!(self.server.is_none(), "a server is already running");
        let access = self.server_dir.join("access.json");
        let _ = fs::remove_file(&access);
        let log = self.log_file("server");
        let mut c = kestrel();
        c.args(["server", "start", "--host", "127.0.0.1", "--port", "0"])
            .args(extra)
            .arg("--server-dir")
            .arg(&self.server_dir)
            .args(&self.server_args)
            .envs(self.server_env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.work)
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.server = Some(c.spawn().expect("start server"));
        let server = self.server.as_mut().unwrap();
        poll("the server's access file", STARTUP, || {
            if let Some(status) = server.try_wait().unwrap() {
                panic!("the server exited at start with {status}");
            }
            // The file is written atomically (rename), so existing means complete.
            access.exists().then_some(())
        });
    }

    /// Starts a worker with `slots` slots; returns its index for [`Self::kill_worker`].
    pub fn add_worker(&mut self, slots: u32) -> usize {
        self.add_worker_with(slots, &[])
    }

    /// [`Self::add_worker`] with extra `worker start` arguments.
    pub fn add_worker_with(&mut self, slots: u32, extra: &[&str]) -> usize {
        self.add_worker_logging(slots, extra, None)
    }

    /// [`Self::add_worker_with`] logging what `RUST_LOG=filter` selects.
    pub fn add_worker_logging(
        &mut self,
        slots: u32,
        extra: &[&str],
        filter: Option<&str>,
    ) -> usize {
        let mut c = kestrel();
        if let Some(f) = filter {
            c.env("RUST_LOG", f);
        }
        self.add_worker_as(c, slots, extra)
    }

    /// [`Self::add_worker_with`], the worker started by `c` (`kestrel`, or a program that
    /// runs the arguments it is given, such as `unshare`).
    pub fn add_worker_as(&mut self, mut c: Command, slots: u32, extra: &[&str]) -> usize {
        let log = self.log_file("worker");
        c.args(["worker", "start", "--slots", &slots.to_string()])
            .args(extra)
            .arg("--server-dir")
            .arg(&self.server_dir)
            .current_dir(&self.work)
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.workers.push(Some(c.spawn().expect("start worker")));
        self.workers.len() - 1
    }

    /// Waits until the server lists `n` workers; returns the list.
    pub fn wait_workers(&self, n: usize) -> Vec<Value> {
        poll_every(
            &format!("{n} workers to register"),
            STARTUP,
            Duration::from_millis(50),
            || {
                let list = self
                    .run(&["worker", "list", "--output", "json"])
                    .ok()
                    .json();
                let list = list["workers"]
                    .as_array()
                    .expect("worker list has a workers array")
                    .clone();
                (list.len() == n).then_some(list)
            },
        )
    }

    /// Runs `kestrel --server-dir SERVER_DIR ARGS...` in the work directory.
    #[track_caller]
    pub fn run(&self, args: &[&str]) -> Out {
        client(&self.server_dir, &self.work, args)
    }

    /// Like [`Self::run`] with a given server directory (another server, or none).
    #[track_caller]
    pub fn run_with_dir(&self, server_dir: &Path, args: &[&str]) -> Out {
        client(server_dir, &self.work, args)
    }

    /// A path in the work directory, as a string.
    pub fn path(&self, name: &str) -> String {
        self.work.join(name).display().to_string()
    }

    /// A file in the work directory, if it exists.
    pub fn read(&self, name: &str) -> Option<String> {
        fs::read_to_string(self.work.join(name)).ok()
    }

    /// The current access file.
    pub fn access(&self) -> Value {
        let text = fs::read_to_string(self.server_dir.join("access.json")).expect("access file");
        serde_json::from_str(&text).expect("access file is JSON")
    }

    pub fn port(&self) -> u16 {
        self.access()["port"].as_u64().expect("port") as u16
    }

    pub fn server_pid(&self) -> u32 {
        self.server.as_ref().expect("server running").id()
    }

    pub fn worker_pid(&self, i: usize) -> u32 {
        self.workers[i].as_ref().expect("worker running").id()
    }

    /// Whether worker `i` is still running.
    pub fn worker_running(&mut self, i: usize) -> bool {
        match self.workers[i].as_mut() {
            Some(w) => w.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// SIGKILLs worker `i` (its reaper then kills its tasks).
    pub fn kill_worker(&mut self, i: usize) {
        let mut w = self.workers[i].take().expect("worker running");
        let _ = w.kill();
        let _ = w.wait();
    }

    /// SIGKILLs the server: no clean shutdown, its access file and journal stay as they were.
    pub fn kill_server(&mut self) {
        let mut s = self.server.take().expect("server running");
        let _ = s.kill();
        let _ = s.wait();
    }

    /// Remembers a task process group to kill when the cluster is dropped.
    pub fn adopt_group(&mut self, pgid: i32) {
        self.orphans.push(pgid);
    }

    /// Waits (bounded) for the server to exit by itself.
    pub fn wait_server_exit(&mut self, limit: Duration) -> ExitStatus {
        // Stays in `self` until it has exited, so a timeout still kills it on drop.
        let s = self.server.as_mut().expect("server running");
        let status = poll("the server to exit", limit, || s.try_wait().unwrap());
        self.server = None;
        status
    }

    /// Waits (bounded) for worker `i` to exit by itself.
    pub fn wait_worker_exit(&mut self, i: usize, limit: Duration) -> ExitStatus {
        let w = self.workers[i].as_mut().expect("worker running");
        let status = poll("a worker to exit", limit, || w.try_wait().unwrap());
        self.workers[i] = None;
        status
    }

    /// The server's log output so far (all servers started by this cluster).
    pub fn server_log(&self) -> String {
        self.logs_matching("server")
    }

    /// The workers' log output so far (all workers started by this cluster).
    pub fn worker_log(&self) -> String {
        self.logs_matching("worker")
    }

    fn logs_matching(&self, kind: &str) -> String {
        let mut names: Vec<PathBuf> = fs::read_dir(&self.logs)
            .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_default();
        names.sort();
        let mut all = String::new();
        for p in names {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.contains(kind) {
                all += &format!("--- {name}\n{}", fs::read_to_string(&p).unwrap_or_default());
            }
        }
        all
    }

    /// Asserts the server still does normal work: one task submitted with `--wait` runs on a
    /// worker and writes its file.
    #[track_caller]
    pub fn assert_serves(&self) {
        let n = self.probes.get() + 1;
        self.probes.set(n);
        let name = format!("probe-{n}.txt");
        let script = format!("echo served {n} > {name}");
        let out = self.run(&[
            "submit", "--wait", "--stdout", "none", "--stderr", "none", "--", "sh", "-c", &script,
        ]);
        out.ok();
        assert_eq!(
            self.read(&name).as_deref(),
            Some(format!("served {n}\n").as_str()),
            "the probe task did not write its file"
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Task process groups first, while their workers still own (have not reaped) them.
        for w in self.workers.iter().flatten() {
            for child in children_of(w.id() as i32) {
                if proc_info(child).is_some_and(|(_, _, pgrp)| pgrp == child) {
                    kill_group(child);
                }
            }
        }
        for w in self.workers.iter_mut().flatten() {
            let _ = w.kill();
            let _ = w.wait();
        }
        if let Some(s) = self.server.as_mut() {
            let _ = s.kill();
            let _ = s.wait();
        }
        for &g in &self.orphans {
            if proc_info(g).is_some_and(|(_, _, pgrp)| pgrp == g) {
                kill_group(g);
            }
        }
        if std::thread::panicking() && !trials::skipping() {
            eprintln!(
                "==== logs of the failed test's processes ====\n{}",
                self.logs_matching("")
            );
        }
    }
}
