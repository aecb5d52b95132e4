//! The GPUs of this machine, found as HyperQueue finds them, and the environment that gives a
//! task the GPUs it holds.
//!
//! NVIDIA GPUs are those `CUDA_VISIBLE_DEVICES` names when it is set (a batch system sets it to
//! the GPUs of the job), else one per entry of `/proc/driver/nvidia/gpus`, else those
//! `nvidia-smi` lists. AMD GPUs are those `ROCR_VISIBLE_DEVICES` names, else one per node of
//! `/sys/class/kfd/kfd/topology/nodes` whose `gpu_id` is not 0 (the others are CPUs), else
//! those `rocm-smi` lists. Each source is read through a [`Probe`], so that tests give fake
//! trees and programs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Who made a GPU: which variables select it for a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// Selected with `CUDA_VISIBLE_DEVICES`.
    Nvidia,
    /// Selected with `ROCR_VISIBLE_DEVICES`.
    Amd,
    /// Given by number (`worker start --gpus N` on a machine where none was found): selected
    /// with `CUDA_VISIBLE_DEVICES`, as before GPUs were detected.
    Unknown,
}

/// One GPU a worker offers: its vendor and its id as the vendor's variable names it (an
/// index, or a UUID such as `GPU-8f6c...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub vendor: Vendor,
    pub id: String,
}

impl Gpu {
    /// `count` GPUs of no known vendor, numbered from 0.
    pub fn numbered(count: u32) -> Vec<Gpu> {
        (0..count)
            .map(|i| Gpu {
                vendor: Vendor::Unknown,
                id: i.to_string(),
            })
            .collect()
    }
}

/// `NVIDIA 0,1`, `AMD 0`, `0,1,2`: GPUs for a person, by vendor.
pub fn describe(gpus: &[Gpu]) -> String {
    let mut parts = Vec::new();
    for (vendor, name) in [
        (Vendor::Nvidia, "NVIDIA "),
        (Vendor::Amd, "AMD "),
        (Vendor::Unknown, ""),
    ] {
        let ids: Vec<&str> = gpus
            .iter()
            .filter(|g| g.vendor == vendor)
            .map(|g| g.id.as_str())
            .collect();
        if !ids.is_empty() {
            parts.push(format!("{name}{}", ids.join(",")));
        }
    }
    parts.join(", ")
}

/// The variables that give a task `gpus` (and no other): `CUDA_VISIBLE_DEVICES` (with
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so that CUDA numbers GPUs as `nvidia-smi` and the driver
/// do) for NVIDIA ones; `ROCR_VISIBLE_DEVICES` for AMD ones, and `HIP_VISIBLE_DEVICES`
/// numbering them from 0 within that selection (HIP's numbering applies on top of ROCR's, so a
/// `HIP_VISIBLE_DEVICES` the worker inherited would otherwise hide them). A job's own `--env`
/// comes after these and wins.
pub fn task_env(gpus: &[&Gpu], env: &mut Vec<(String, String)>) {
    let ids = |vendors: &[Vendor]| -> Vec<&str> {
        gpus.iter()
            .filter(|g| vendors.contains(&g.vendor))
            .map(|g| g.id.as_str())
            .collect()
    };
    let cuda = ids(&[Vendor::Nvidia, Vendor::Unknown]);
    if !cuda.is_empty() {
        env.push(("CUDA_VISIBLE_DEVICES".into(), cuda.join(",")));
        if gpus.iter().any(|g| g.vendor == Vendor::Nvidia) {
            env.push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
        }
    }
    let rocr = ids(&[Vendor::Amd]);
    if !rocr.is_empty() {
        let within: Vec<String> = (0..rocr.len()).map(|i| i.to_string()).collect();
        env.push(("ROCR_VISIBLE_DEVICES".into(), rocr.join(",")));
        env.push(("HIP_VISIBLE_DEVICES".into(), within.join(",")));
    }
}

/// The value of an environment variable, by name.
pub type Env = Box<dyn Fn(&str) -> Option<String>>;

/// Where detection looks.
pub struct Probe {
    /// The environment variables (the process's own, or a test's).
    pub env: Env,
    /// Where `/proc` and `/sys` are (`/`, or a test's fake tree).
    pub root: PathBuf,
    /// The directories searched for `nvidia-smi` and `rocm-smi` (the process's `PATH`).
    pub path: Option<OsString>,
}

impl Probe {
    /// This machine, as this process sees it.
    pub fn machine() -> Probe {
        Probe {
            env: Box::new(|name| std::env::var(name).ok()),
            root: PathBuf::from("/"),
            path: std::env::var_os("PATH"),
        }
    }
}

/// The GPUs found, each vendor's with how they were found (for the worker to say).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub gpus: Vec<Gpu>,
    /// `NVIDIA 0,1 from CUDA_VISIBLE_DEVICES`, ...
    pub how: Vec<String>,
}

/// How long `nvidia-smi` or `rocm-smi` may take to answer (a hung driver must not hang the
/// worker's start).
const SMI_LIMIT: Duration = Duration::from_secs(10);

/// A place GPUs may be named: their ids and the place's name, if it answers.
type Source<'a> = Box<dyn Fn() -> Option<(Vec<String>, String)> + 'a>;

/// Finds the GPUs of the machine `probe` describes. Each vendor's places are asked in order
/// until one answers (so `nvidia-smi` runs only where nothing else says).
pub fn detect(probe: &Probe) -> Found {
    let nvidia: [Source; 3] = [
        Box::new(|| from_env(probe, "CUDA_VISIBLE_DEVICES")),
        Box::new(|| {
            let n = count_entries(&probe.root.join("proc/driver/nvidia/gpus"))?;
            Some((numbered(n), "/proc/driver/nvidia/gpus".into()))
        }),
        Box::new(|| {
            let args = ["--query-gpu=index", "--format=csv,noheader"];
            let out = run_smi(probe, "nvidia-smi", &args)?;
            Some((
                smi_lines(&out, |l| Some(l.to_string())),
                "nvidia-smi".into(),
            ))
        }),
    ];
    let amd: [Source; 3] = [
        Box::new(|| from_env(probe, "ROCR_VISIBLE_DEVICES")),
        Box::new(|| {
            let n = kfd_gpus(&probe.root.join("sys/class/kfd/kfd/topology/nodes"))?;
            Some((numbered(n), "/sys/class/kfd/kfd/topology/nodes".into()))
        }),
        Box::new(|| {
            let out = run_smi(probe, "rocm-smi", &["--showid", "--csv"])?;
            // `device,...` then one `cardN,...` line per GPU.
            let ids = smi_lines(&out, |l| {
                let card = l.split(',').next()?.strip_prefix("card")?;
                card.parse::<u32>().ok().map(|n| n.to_string())
            });
            Some((ids, "rocm-smi".into()))
        }),
    ];
    let mut found = Found::default();
    for (vendor, name, sources) in [
        (Vendor::Nvidia, "NVIDIA", nvidia),
        (Vendor::Amd, "AMD", amd),
    ] {
        // The first place that answers decides, even with no GPU (an empty
        // CUDA_VISIBLE_DEVICES hides them all).
        let Some((ids, source)) = sources.iter().find_map(|s| s()) else {
            continue;
        };
        if ids.is_empty() {
            continue;
        }
        found
            .how
            .push(format!("{name} {} from {source}", ids.join(",")));
        found
            .gpus
            .extend(ids.into_iter().map(|id| Gpu { vendor, id }));
    }
    found
}

fn numbered(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

/// The ids a `*_VISIBLE_DEVICES` variable names, if it is set: comma-separated, none for an
/// empty value or CUDA's "no device" values; a value naming one GPU twice is not trusted.
fn from_env(probe: &Probe, name: &str) -> Option<(Vec<String>, String)> {
    let value = (probe.env)(name)?;
    let value = value.trim();
    let ids: Vec<String> = if value.is_empty() || value == "NoDevFiles" || value == "-1" {
        Vec::new()
    } else {
        value.split(',').map(|s| s.trim().to_string()).collect()
    };
    let mut seen = ids.clone();
    seen.sort();
    seen.dedup();
    if seen.len() != ids.len() || ids.iter().any(String::is_empty) {
        tracing::warn!("{name}={value:?} names a GPU twice or an empty one; not used to find GPUs");
        return None;
    }
    Some((ids, name.to_string()))
}

/// How many entries a directory has, if it exists.
fn count_entries(dir: &Path) -> Option<usize> {
    Some(std::fs::read_dir(dir).ok()?.flatten().count())
}

/// How many nodes of the KFD topology are GPUs (`gpu_id` not 0 in their `properties`), if
/// the topology exists.
fn kfd_gpus(nodes: &Path) -> Option<usize> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(nodes)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let gpu = |dir: &PathBuf| {
        let props = std::fs::read_to_string(dir.join("properties")).unwrap_or_default();
        props.lines().any(|l| {
            let mut words = l.split_whitespace();
            words.next() == Some("gpu_id") && words.next().is_some_and(|v| v != "0")
        })
    };
    Some(dirs.iter().filter(|d| gpu(d)).count())
}

/// The ids in a program's output, one per line that `id` reads one from.
fn smi_lines(out: &str, id: impl Fn(&str) -> Option<String>) -> Vec<String> {
    out.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter_map(id)
        .collect()
}

/// Runs `program` found on the probe's `PATH` with `args`, if it is there, and returns what it
/// printed if it succeeded within [`SMI_LIMIT`].
fn run_smi(probe: &Probe, program: &str, args: &[&str]) -> Option<String> {
    let path = probe.path.as_ref()?;
    let exe = std::env::split_paths(path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())?;
    let mut child = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + SMI_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if Instant::now() >= deadline => {
                tracing::warn!(
                    "{} did not answer within {SMI_LIMIT:?}; its GPUs are not counted",
                    exe.display()
                );
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;

    /// A probe of a fake machine under `root`, with `vars` as its environment and `bin` as its
    /// `PATH`.
    fn probe(root: &Path, vars: &[(&str, &str)], bin: Option<&Path>) -> Probe {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Probe {
            env: Box::new(move |name| vars.get(name).cloned()),
            root: root.to_path_buf(),
            path: bin.map(|b| b.as_os_str().to_owned()),
        }
    }

    fn ids(found: &Found) -> Vec<(Vendor, &str)> {
        found
            .gpus
            .iter()
            .map(|g| (g.vendor, g.id.as_str()))
            .collect()
    }

    /// Writes an executable shell script `name` into `dir`.
    fn script(dir: &Path, name: &str, body: &str) {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn a_machine_without_gpus_has_none() {
        let root = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let found = detect(&probe(root.path(), &[], Some(bin.path())));
        assert_eq!(found, Found::default());
    }

    #[test]
    fn nvidia_gpus_come_from_the_environment_first_then_proc_then_nvidia_smi() {
        let root = tempfile::tempdir().unwrap();
        let gpus = root.path().join("proc/driver/nvidia/gpus");
        for bus in ["0000:3b:00.0", "0000:5e:00.0", "0000:af:00.0"] {
            std::fs::create_dir_all(gpus.join(bus)).unwrap();
        }
        let bin = tempfile::tempdir().unwrap();
        script(bin.path(), "nvidia-smi", "echo 0; echo 1");
        // A batch system gave the job GPUs 2 and 3: those, by their ids.
        let found = detect(&probe(
            root.path(),
            &[("CUDA_VISIBLE_DEVICES", "2,3")],
            Some(bin.path()),
        ));
        assert_eq!(ids(&found), [(Vendor::Nvidia, "2"), (Vendor::Nvidia, "3")]);
        assert_eq!(found.how, ["NVIDIA 2,3 from CUDA_VISIBLE_DEVICES"]);
        // An empty variable hides every GPU.
        let hidden = detect(&probe(
            root.path(),
            &[("CUDA_VISIBLE_DEVICES", "")],
            Some(bin.path()),
        ));
        assert!(hidden.gpus.is_empty(), "{hidden:?}");
        // Without it: the driver's list.
        let found = detect(&probe(root.path(), &[], Some(bin.path())));
        assert_eq!(found.gpus.len(), 3);
        assert_eq!(found.how, ["NVIDIA 0,1,2 from /proc/driver/nvidia/gpus"]);
        // Without the driver's list (a container): nvidia-smi.
        let bare = tempfile::tempdir().unwrap();
        let found = detect(&probe(bare.path(), &[], Some(bin.path())));
        assert_eq!(ids(&found), [(Vendor::Nvidia, "0"), (Vendor::Nvidia, "1")]);
        assert_eq!(found.how, ["NVIDIA 0,1 from nvidia-smi"]);
        // A variable that names a GPU twice is not trusted: the next source decides.
        let found = detect(&probe(
            root.path(),
            &[("CUDA_VISIBLE_DEVICES", "1,1")],
            None,
        ));
        assert_eq!(found.gpus.len(), 3);
    }

    #[test]
    fn a_failing_nvidia_smi_finds_nothing() {
        let bare = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        script(
            bin.path(),
            "nvidia-smi",
            "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver' >&2; exit 9",
        );
        let found = detect(&probe(bare.path(), &[], Some(bin.path())));
        assert!(found.gpus.is_empty(), "{found:?}");
    }

    #[test]
    fn amd_gpus_come_from_rocr_visible_devices_then_the_kfd_topology_then_rocm_smi() {
        let root = tempfile::tempdir().unwrap();
        let nodes = root.path().join("sys/class/kfd/kfd/topology/nodes");
        // Node 0 is the CPU (gpu_id 0); nodes 1 and 2 are GPUs.
        for (node, gpu_id) in [(0, 0), (1, 53_255), (2, 1_822)] {
            let dir = nodes.join(node.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join("properties"),
                format!("cpu_cores_count 0\nsimd_count 256\ngpu_id {gpu_id}\n"),
            )
            .unwrap();
        }
        let found = detect(&probe(root.path(), &[], None));
        assert_eq!(ids(&found), [(Vendor::Amd, "0"), (Vendor::Amd, "1")]);
        assert_eq!(
            found.how,
            ["AMD 0,1 from /sys/class/kfd/kfd/topology/nodes"]
        );
        let found = detect(&probe(root.path(), &[("ROCR_VISIBLE_DEVICES", "1")], None));
        assert_eq!(ids(&found), [(Vendor::Amd, "1")]);
        let bare = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        script(
            bin.path(),
            "rocm-smi",
            "echo 'device,Device ID'; echo 'card0,0x740f'; echo 'card1,0x740f'; echo 'card2,0x740f'",
        );
        let found = detect(&probe(bare.path(), &[], Some(bin.path())));
        assert_eq!(found.gpus.len(), 3);
        assert_eq!(found.how, ["AMD 0,1,2 from rocm-smi"]);
    }

    #[test]
    fn a_task_gets_its_gpus_in_the_variables_of_their_vendor() {
        let nvidia = |id: &str| Gpu {
            vendor: Vendor::Nvidia,
            id: id.into(),
        };
        let amd = |id: &str| Gpu {
            vendor: Vendor::Amd,
            id: id.into(),
        };
        let mut env = Vec::new();
        task_env(&[&nvidia("2"), &nvidia("3")], &mut env);
        assert_eq!(
            env,
            [
                ("CUDA_VISIBLE_DEVICES".to_string(), "2,3".to_string()),
                ("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()),
            ]
        );
        let mut env = Vec::new();
        task_env(&[&amd("4"), &amd("6")], &mut env);
        assert_eq!(
            env,
            [
                ("ROCR_VISIBLE_DEVICES".to_string(), "4,6".to_string()),
                ("HIP_VISIBLE_DEVICES".into(), "0,1".into()),
            ]
        );
        let mut env = Vec::new();
        let plain = Gpu::numbered(2);
        task_env(&[&plain[1]], &mut env);
        assert_eq!(env, [("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string())]);
        assert_eq!(
            describe(&[nvidia("0"), amd("1"), plain[0].clone()]),
            "NVIDIA 0, AMD 1, 0"
        );
    }
}
