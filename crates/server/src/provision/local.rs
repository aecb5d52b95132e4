//! The `local` backend: an allocation is `nodes` worker processes on this machine, started by
//! the server itself (`kestrel worker start --alloc A --ends-at T ...`), their output kept in
//! `DIR/alloc/A/`. For a laptop, for tests, and for the same policies as on a cluster.
//! A restarted server adopts the processes an earlier run started (named in the allocation's
//! "batch id", `local:PID,PID`): they are not its children, so they are watched by pid.

use kestrel_alloc::AllocId;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The worker processes of each local allocation.
pub(super) struct Local {
    access: PathBuf,
    dir: PathBuf,
    running: BTreeMap<AllocId, Vec<Child>>,
    /// Processes an earlier run of the server started, by allocation.
    adopted: BTreeMap<AllocId, Vec<libc::pid_t>>,
}

impl Local {
    pub(super) fn new(access: PathBuf, dir: PathBuf) -> Local {
        Local {
            access,
            dir,
            running: BTreeMap::new(),
            adopted: BTreeMap::new(),
        }
    }

    /// Watches the processes of allocation `alloc` that an earlier run of the server started,
    /// named by its batch id; false if none of them is alive.
    pub(super) fn adopt(&mut self, alloc: AllocId, batch_id: &str) -> bool {
        let pids: Vec<libc::pid_t> = batch_id
            .strip_prefix("local:")
            .unwrap_or("")
            .split(',')
            .filter_map(|p| p.parse().ok())
            .filter(|&p| runs_worker_of(p, alloc))
            .collect();
        if pids.is_empty() {
            return false;
        }
        self.adopted.insert(alloc, pids);
        true
    }

    /// Starts allocation `alloc`: `nodes` workers. Its "batch id" names the first process.
    pub(super) fn start(
        &mut self,
        alloc: AllocId,
        nodes: u32,
        ends_at_s: u64,
        worker_args: &[String],
    ) -> Result<String, String> {
        // The server runs as `kestrel server start` or `kestrel run`, of a binary or of the
        // Python package.
        let exe = super::kestrel_exe().map_err(|e| format!("cannot start workers: {e}"))?;
        let dir = self.dir.join(alloc.to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut children = Vec::new();
        for node in 0..nodes {
            let log = dir.join(format!("worker-{node}.log"));
            let files = File::create(&log).and_then(|out| Ok((out.try_clone()?, out)));
            let (out, err) = match files {
                Ok(f) => f,
                Err(e) => {
                    stop_and_reap(&mut children);
                    return Err(format!("{}: {e}", log.display()));
                }
            };
            let spawned = Command::new(&exe)
                .args(["worker", "start", "--access"])
                .arg(&self.access)
                .args(["--alloc", &alloc.to_string()])
                .args(["--ends-at", &ends_at_s.to_string()])
                .args(worker_args)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn();
            match spawned {
                Ok(child) => children.push(child),
                Err(e) => {
                    stop_and_reap(&mut children);
                    return Err(format!("cannot start {}: {e}", exe.display()));
                }
            }
        }
        let pids: Vec<String> = children.iter().map(|c| c.id().to_string()).collect();
        let id = format!("local:{}", pids.join(","));
        self.running.insert(alloc, children);
        Ok(id)
    }

    /// Allocations all of whose processes have exited, each with why it failed if one did not
    /// exit cleanly.
    pub(super) fn reap(&mut self) -> Vec<(AllocId, Option<String>)> {
        let mut ended = Vec::new();
        for (&alloc, children) in &mut self.running {
            let mut failed = None;
            let mut all = true;
            for (node, c) in children.iter_mut().enumerate() {
                match c.try_wait() {
                    Ok(Some(status)) if !status.success() => {
                        let log = self.dir.join(format!("{alloc}/worker-{node}.log"));
                        failed.get_or_insert(format!(
                            "worker process {} {status}; see {}",
                            c.id(),
                            log.display()
                        ));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => all = false,
                    Err(e) => {
                        failed.get_or_insert(format!("cannot wait for worker {}: {e}", c.id()));
                    }
                }
            }
            if all {
                ended.push((alloc, failed));
            }
        }
        for (alloc, _) in &ended {
            self.running.remove(alloc);
        }
        // Adopted processes are not this server's children: their exit status is unknown.
        self.adopted.retain(|&alloc, pids| {
            pids.retain(|&p| runs_worker_of(p, alloc));
            if pids.is_empty() {
                ended.push((alloc, None));
            }
            !pids.is_empty()
        });
        ended
    }

    /// Stops an allocation's processes at once (SIGINT: a worker gives its tasks back and
    /// exits; SIGTERM would let it finish them first).
    pub(super) fn cancel(&mut self, alloc: AllocId) {
        for c in self.running.get(&alloc).into_iter().flatten() {
            interrupt(c);
        }
        for &pid in self.adopted.get(&alloc).into_iter().flatten() {
            signal(pid, libc::SIGINT);
        }
    }

    /// Stops every process and reaps it (the server is stopping): SIGINT, then SIGKILL for
    /// those still there after a few seconds.
    pub(super) fn stop_all(&mut self) {
        for c in self.running.values().flatten() {
            interrupt(c);
        }
        for &pid in self.adopted.values().flatten() {
            signal(pid, libc::SIGINT);
        }
        self.adopted.clear();
        let deadline = Instant::now() + STOP_WAIT;
        for c in self.running.values_mut().flatten() {
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        self.running.clear();
    }
}

/// How long stopping waits for workers to exit on SIGINT.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Kills and reaps processes of an allocation that could not start whole.
fn stop_and_reap(children: &mut Vec<Child>) {
    for mut c in children.drain(..) {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn interrupt(c: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(c.id()) {
        signal(pid, libc::SIGINT);
    }
}

fn signal(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill(2) takes any pid; a positive one names a single process.
    if pid > 0 {
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Whether process `pid` is a worker of allocation `alloc` (`kestrel worker start ... --alloc
/// A`), so that a pid reused since (after a reboot, or by the time an adopted worker exited)
/// is neither watched nor signalled. Where `/proc` cannot tell, that the process exists.
fn runs_worker_of(pid: libc::pid_t, alloc: AllocId) -> bool {
    if !alive(pid) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return !std::path::Path::new("/proc/self/cmdline").exists();
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let alloc = alloc.to_string();
    args.contains(&b"worker".as_slice())
        && args
            .windows(2)
            .any(|w| w[0] == b"--alloc" && w[1] == alloc.as_bytes())
}

/// Whether process `pid` exists (and is not a zombie of ours, which adopted ones never are).
fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_worker_of_the_allocation_is_adopted() {
        // A process whose arguments are those of a worker of allocation 3.
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30", "worker", "--alloc", "3"])
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        std::thread::sleep(Duration::from_millis(100));
        assert!(runs_worker_of(pid, 3));
        assert!(!runs_worker_of(pid, 4), "another allocation's");
        // This test process exists but is no worker: a reused pid is not adopted.
        assert!(!runs_worker_of(std::process::id() as libc::pid_t, 3));
        let mut local = Local::new(PathBuf::from("access"), PathBuf::from("dir"));
        assert!(local.adopt(3, &format!("local:{pid},999999999")));
        assert!(!local.adopt(5, &format!("local:{pid}")));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            local.reap(),
            vec![(3, None)],
            "over once its worker is gone"
        );
    }
}
