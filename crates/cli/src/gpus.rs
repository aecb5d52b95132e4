//! The GPUs a worker offers: those found on this machine (`kestrel_worker::gpu`), or as many
//! as `--gpus N` says, and each local worker's share of them under `kestrel run`.

use anyhow::{bail, Result};
use kestrel_worker::gpu::{self, Gpu, Probe};

/// The GPUs to offer for `--gpus` (`auto` or absent: every GPU found; `N`: the first N found,
/// or N numbered ones where none is found), and how they were found, to say.
pub fn choose(asked: Option<&str>, probe: &Probe) -> Result<(Vec<Gpu>, Vec<String>)> {
    let asked = asked.map(str::trim).filter(|a| *a != "auto");
    let count = match asked {
        None => None,
        Some(n) => Some(n.parse::<u32>().map_err(|_| {
            anyhow::anyhow!("--gpus {n:?} is not a number of GPUs nor `auto`; give e.g. --gpus 2, or --gpus auto for those found on this machine")
        })?),
    };
    if count == Some(0) {
        return Ok((Vec::new(), Vec::new()));
    }
    let found = gpu::detect(probe);
    Ok(match count {
        None => (found.gpus, found.how),
        Some(n) if found.gpus.is_empty() => (Gpu::numbered(n), Vec::new()),
        Some(n) if n as usize <= found.gpus.len() => {
            let mut gpus = found.gpus;
            gpus.truncate(n as usize);
            (gpus, found.how)
        }
        Some(n) => bail!(
            "--gpus {n}: this machine has {} GPUs ({}); give --gpus {} or fewer, or set CUDA_VISIBLE_DEVICES (ROCR_VISIBLE_DEVICES for AMD) to the GPUs to use",
            found.gpus.len(),
            found.how.join("; "),
            found.gpus.len()
        ),
    })
}

/// Worker `i`'s share of `gpus` among `workers` local workers: every `workers`-th one from the
/// `i`-th, so that shares differ by one GPU at most and no two workers hand out the same GPU.
pub fn share(gpus: &[Gpu], workers: u32, i: u32) -> Vec<Gpu> {
    gpus.iter()
        .skip(i as usize)
        .step_by(workers.max(1) as usize)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_worker::gpu::Vendor;
    use std::path::Path;

    fn probe(root: &Path, cuda: Option<&'static str>) -> Probe {
        Probe {
            env: Box::new(move |name| {
                (name == "CUDA_VISIBLE_DEVICES")
                    .then_some(cuda)
                    .flatten()
                    .map(String::from)
            }),
            root: root.to_path_buf(),
            path: None,
        }
    }

    #[test]
    fn gpus_found_are_offered_unless_told_otherwise() {
        let root = tempfile::tempdir().unwrap();
        let (gpus, how) = choose(None, &probe(root.path(), Some("1,3,5"))).unwrap();
        assert_eq!(gpus.len(), 3);
        assert_eq!(how, ["NVIDIA 1,3,5 from CUDA_VISIBLE_DEVICES"]);
        let (two, _) = choose(Some("2"), &probe(root.path(), Some("1,3,5"))).unwrap();
        let ids: Vec<&str> = two.iter().map(|g| g.id.as_str()).collect();
        assert_eq!(ids, ["1", "3"]);
        assert!(choose(Some("0"), &probe(root.path(), Some("1")))
            .unwrap()
            .0
            .is_empty());
        let err = choose(Some("4"), &probe(root.path(), Some("1,3,5")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("this machine has 3 GPUs") && err.contains("--gpus 3"),
            "{err}"
        );
        // None found: as many as asked, numbered, as before detection.
        let (plain, how) = choose(Some("2"), &probe(root.path(), None)).unwrap();
        assert_eq!(plain, Gpu::numbered(2));
        assert!(how.is_empty());
        assert!(choose(None, &probe(root.path(), None))
            .unwrap()
            .0
            .is_empty());
        let err = choose(Some("two"), &probe(root.path(), None))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--gpus \"two\""), "{err}");
    }

    #[test]
    fn local_workers_share_the_gpus_without_handing_one_out_twice() {
        let gpus: Vec<Gpu> = (0..5)
            .map(|i| Gpu {
                vendor: Vendor::Nvidia,
                id: i.to_string(),
            })
            .collect();
        let ids = |i| -> Vec<String> { share(&gpus, 2, i).into_iter().map(|g| g.id).collect() };
        assert_eq!(ids(0), ["0", "2", "4"]);
        assert_eq!(ids(1), ["1", "3"]);
        assert_eq!(share(&gpus[..1], 3, 2), Vec::<Gpu>::new());
    }
}
