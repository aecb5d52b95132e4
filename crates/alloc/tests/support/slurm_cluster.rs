//! The shared Slurm test cluster for integration tests (`../shared/slurm/test-cluster`):
//! started if it is not running and this runs as root, and Debian's PBS commands
//! (`slurm-wlm-torque`) installed on demand. Used by the tests of `kestrel-alloc` and of the
//! CLI (included with `#[path]`, so both start it the same way).

use std::path::Path;
use std::process::Command;

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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/slurm/test-cluster");
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
