//! The pilot scripts on a real Slurm: the repository's `testsupport/slurm/test-cluster`
//! (started here if no Slurm answers and this runs as root; each test is reported ignored,
//! with the reason, where it cannot be). The "worker"
//! is a stand-in script that records where it ran and with what arguments, so this checks what
//! the batch system does with the pilot: one worker per node of a multi-node allocation, the
//! end time passed, the user's arguments reaching `sbatch`/`qsub`.

#[path = "support/slurm_cluster.rs"]
mod slurm_cluster;
#[path = "support/trials.rs"]
mod trials;

use kestrel_alloc::backend::{pbs, slurm, BatchState, Pilot};
use slurm_cluster::{qsub_here, take_cluster};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn run(argv: &[String]) -> Output {
    Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", argv[0]))
}

fn main() -> std::process::ExitCode {
    trials::run(
        file!(),
        trials![
            a_two_node_slurm_allocation_runs_one_worker_on_each_node,
            a_wrong_partition_is_refused_with_slurms_message_and_a_test_only_dry_run_leaves_nothing,
            the_torque_pilot_through_qsub_runs_one_worker_on_each_node,
        ],
    )
}

/// A stand-in for `kestrel` that appends `NODE ARGS` to `log` and exits.
fn fake_kestrel(dir: &Path, log: &Path) -> PathBuf {
    let path = dir.join("kestrel");
    let body = format!(
        "#!/bin/sh\necho \"${{SLURMD_NODENAME:-?}} $*\" >> {}\n",
        log.display()
    );
    std::fs::write(&path, body).expect("fake kestrel");
    let _ = Command::new("chmod").arg("+x").arg(&path).status();
    path
}

fn pilot(dir: &Path, kestrel: &Path, nodes: u32, name: &str) -> Pilot {
    Pilot {
        job_name: name.into(),
        nodes,
        time_limit_us: 120_000_000,
        kestrel: kestrel.display().to_string(),
        access: dir.join("access.json").display().to_string(),
        alloc: 7,
        worker_args: vec!["--slots".into(), "2".into()],
        stdout: dir.join("pilot.out").display().to_string(),
        stderr: dir.join("pilot.err").display().to_string(),
    }
}

/// Waits (at most 90 s) until `squeue` no longer shows `id` as queued or running.
fn wait_ended(id: &str) -> BatchState {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(90) {
        let out = run(&slurm::query(&[id]));
        let text = String::from_utf8_lossy(&out.stdout);
        let gone =
            !out.status.success() && slurm::query_knows_none(&String::from_utf8_lossy(&out.stderr));
        let state = slurm::parse_query(&text)
            .into_iter()
            .find(|(i, _)| i == id)
            .map(|(_, s)| s);
        match state {
            Some(BatchState::Queued | BatchState::Running) => {}
            Some(s) => return s,
            None if gone || out.status.success() => return BatchState::Finished,
            None => {}
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("batch job {id} did not end within 90 s");
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The stand-in's log: (node, arguments) per worker started.
fn started(log: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut rows: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, a)| (n.to_string(), a.to_string()))
        .collect();
    rows.sort();
    rows
}

fn check_two_workers(log: &Path, dir: &Path, before: u64) {
    let rows = started(log);
    assert_eq!(rows.len(), 2, "one worker per node: {rows:?}");
    assert_ne!(rows[0].0, rows[1].0, "on two nodes: {rows:?}");
    for (_, args) in &rows {
        let want = format!(
            "worker start --access {} --alloc 7 --ends-at ",
            dir.join("access.json").display()
        );
        assert!(args.starts_with(&want), "{args}");
        assert!(args.ends_with(" --slots 2"), "{args}");
        let end: u64 = args[want.len()..]
            .split(' ')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no end time in {args}"));
        assert!(
            end >= before + 120 && end <= now_s() + 120,
            "ends at {end}, started after {before}"
        );
    }
}

fn a_two_node_slurm_allocation_runs_one_worker_on_each_node() {
    let _cluster = trials::need(take_cluster());
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("started");
    let kestrel = fake_kestrel(dir.path(), &log);
    let p = pilot(dir.path(), &kestrel, 2, "kestrel-test-2n");
    let script = dir.path().join("pilot.sh");
    std::fs::write(&script, slurm::script(&p)).expect("script");
    let before = now_s();
    let out = run(&slurm::submit(&script.display().to_string(), &[]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = slurm::parse_submit(&String::from_utf8_lossy(&out.stdout)).expect("job id");
    assert_eq!(wait_ended(&id), BatchState::Finished);
    check_two_workers(&log, dir.path(), before);
    let said = std::fs::read_to_string(dir.path().join("pilot.out")).unwrap_or_default();
    assert!(said.contains("kestrel pilot: allocation 7"), "{said}");
    assert!(said.contains("the workers ended with status 0"), "{said}");
}

fn a_wrong_partition_is_refused_with_slurms_message_and_a_test_only_dry_run_leaves_nothing() {
    let _cluster = trials::need(take_cluster());
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("started");
    let kestrel = fake_kestrel(dir.path(), &log);
    let p = pilot(dir.path(), &kestrel, 1, "kestrel-test-dry");
    let script = dir.path().join("pilot.sh");
    std::fs::write(&script, slurm::script(&p)).expect("script");
    let path = script.display().to_string();
    let wrong = vec!["--partition".to_string(), "no-such-partition".to_string()];
    let out = run(&slurm::test_only(&path, &wrong));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid partition"), "{err}");
    // More nodes than the partition has is refused the same way.
    let too_many = vec!["--nodes".to_string(), "99".to_string()];
    let out = run(&slurm::test_only(&path, &too_many));
    assert!(!out.status.success(), "99 nodes of 4 taken");
    // The dry run of a right one: Slurm says when it would start, and takes no job.
    let out = run(&slurm::test_only(&path, &[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("to start at"), "{err}");
    let listed = run(&slurm::find_by_name("kestrel-test-dry"));
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).trim(),
        "",
        "no job was taken"
    );
    assert!(started(&log).is_empty(), "nothing ran");
}

fn the_torque_pilot_through_qsub_runs_one_worker_on_each_node() {
    let _cluster = trials::need(take_cluster());
    trials::need(qsub_here());
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("started");
    let kestrel = fake_kestrel(dir.path(), &log);
    let p = pilot(dir.path(), &kestrel, 2, "kestrel-test-pbs");
    let script = dir.path().join("pilot.sh");
    std::fs::write(&script, pbs::script(&p, pbs::Flavor::Torque)).expect("script");
    let before = now_s();
    let out = run(&pbs::submit(&p, &script.display().to_string(), &[], false));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let id = pbs::parse_submit(&String::from_utf8_lossy(&out.stdout)).expect("job id");
    // qstat lists it until it ends.
    let start = Instant::now();
    loop {
        let listed = pbs::parse_query(&String::from_utf8_lossy(&run(&pbs::query(&[&id])).stdout));
        let live = listed.iter().any(|(i, s)| {
            pbs::same_id(&id, i) && matches!(s, BatchState::Queued | BatchState::Running)
        });
        if !live {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "job {id} did not end"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    check_two_workers(&log, dir.path(), before);
}
