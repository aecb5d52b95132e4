//! The Slurm test cluster for integration tests (the repository's
//! `testsupport/slurm/test-cluster`): started if no Slurm answers and this runs as root, and Debian's PBS commands
//! (`slurm-wlm-torque`) installed on demand. Used by the tests of `kestrel-alloc` and of the
//! CLI (included with `#[path]`, so both start it the same way).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The lock file of the test cluster's nodes: held by a test while it uses them, and by the
/// benchmarks (`bench/provisioning.py`) for their whole run, so that neither finds the
/// other's jobs on the nodes.
const LOCK: &str = "/tmp/kestrel-slurm.lock";

/// How long a test waits for the cluster before it gives up.
const LOCK_WAIT: Duration = Duration::from_secs(3600);

/// The test cluster's nodes to oneself while it lives (an exclusive `flock`).
pub struct ClusterLock(#[allow(dead_code)] std::fs::File);

/// Whether a Slurm answers here (see [`slurm_here`]), with its nodes to oneself: waits for
/// whoever holds them (a benchmark, a test of another binary), saying so, at most
/// [`LOCK_WAIT`].
pub fn take_cluster() -> Result<ClusterLock, String> {
    slurm_here()?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(LOCK)
        .map_err(|e| format!("cannot open {LOCK}: {e}"))?;
    let start = Instant::now();
    let mut said = false;
    loop {
        // SAFETY: flock on a descriptor this function owns; it only returns a status.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            clear_leftovers();
            return Ok(ClusterLock(file));
        }
        if start.elapsed() >= LOCK_WAIT {
            return Err(format!(
                "the Slurm test cluster was held by another process ({LOCK}) for {} min",
                LOCK_WAIT.as_secs() / 60
            ));
        }
        if !said {
            eprintln!(
                "waiting for the Slurm test cluster: {LOCK} is held by another test or a benchmark"
            );
            said = true;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// How long the jobs an earlier holder left behind may take to leave by themselves.
const LEFTOVERS_WAIT: Duration = Duration::from_secs(60);

/// Frees the nodes of jobs that an earlier holder of the lock left behind (a test whose
/// server was killed when it failed, a benchmark stopped midway): their pilots hold nodes
/// until their workers give up on the lost server, and a test counting on four free nodes
/// found three. Only jobs Kestrel's tests and benchmarks name (`k<tag>-a<n>`, `kestrel-test-*`,
/// `kbench-*`, HyperQueue's `hq-*`) are waited for and then canceled, never another job of the user.
fn clear_leftovers() {
    let start = Instant::now();
    let mut canceled = false;
    loop {
        let left = leftover_jobs();
        if left.is_empty() {
            return;
        }
        if start.elapsed() >= LEFTOVERS_WAIT {
            eprintln!("the Slurm test cluster still runs jobs of earlier tests: {left:?}");
            return;
        }
        if !canceled && start.elapsed() >= Duration::from_secs(5) {
            eprintln!("canceling jobs that earlier tests left on the Slurm test cluster: {left:?}");
            let _ = Command::new("scancel").args(&left).output();
            canceled = true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The ids of this user's jobs in the queue named by Kestrel's tests or benchmarks.
fn leftover_jobs() -> Vec<String> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() }.to_string();
    let Ok(out) = Command::new("squeue")
        .args(["-h", "-u", &uid, "-o", "%i %j"])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (id, name) = line.trim().split_once(' ')?;
            ours(name).then(|| id.to_string())
        })
        .collect()
}

/// Whether a job name is one Kestrel's tests or benchmarks give.
fn ours(name: &str) -> bool {
    let pilot = name
        .strip_prefix('k')
        .and_then(|rest| rest.split_once("-a"))
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    pilot
        || ["kestrel-test-", "kbench-", "hq-"]
            .iter()
            .any(|p| name.starts_with(p))
}

/// Whether a Slurm answers here, starting the test cluster if need be (once per test binary).
pub fn slurm_here() -> Result<(), String> {
    static HERE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    HERE.get_or_init(start_slurm).clone()
}

fn start_slurm() -> Result<(), String> {
    let answers = || {
        Command::new("sinfo")
            .arg("-h")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if answers() {
        return Ok(());
    }
    // Both crates that include this are at crates/NAME.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testsupport/slurm/test-cluster");
    if !script.exists() {
        return Err(format!("no Slurm here and no {}", script.display()));
    }
    if !root() {
        return Err("no Slurm here, and starting the test cluster needs root".into());
    }
    let out = Command::new(&script)
        .arg("start")
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() && answers() {
        Ok(())
    } else {
        Err(format!(
            "the test cluster did not start: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `qsub` is here, installing Debian's `slurm-wlm-torque` (PBS commands that drive
/// Slurm) if it is not and this runs as root.
pub fn qsub_here() -> Result<(), String> {
    let here = || Command::new("qsub").arg("--help").output().is_ok();
    if here() {
        return Ok(());
    }
    if !root() {
        return Err("no qsub, and installing slurm-wlm-torque needs root".into());
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "slurm-wlm-torque"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !install() {
        let _ = Command::new("apt-get").args(["update", "-qq"]).output();
        install();
    }
    if here() {
        Ok(())
    } else {
        Err("no qsub: `apt-get install slurm-wlm-torque` failed".into())
    }
}
