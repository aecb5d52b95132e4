//! The pilot scripts and batch-system commands as text, and the parsers on captured output.
//! The `#PBS` directives are checked against the PBS Professional reference (`qsub`:
//! `-l select=N:mpiprocs=1`, `-l place=scatter:excl`, `-l walltime=HH:MM:SS`, `-N` of at most
//! 15 characters starting with a letter) and Torque's (`-l nodes=N:ppn=1`, `pbsdsh -u` to run
//! once per node).

use kestrel_alloc::backend::{pbs, shell_quote, slurm, walltime, BatchState, Pilot};
use std::process::Command;

fn pilot(nodes: u32) -> Pilot {
    Pilot {
        job_name: "kestrel-a1b2c3-7".into(),
        nodes,
        time_limit_us: 3_600_000_000,
        kestrel: "/shared/bin/kestrel".into(),
        access: "/home/me/my server/access.json".into(),
        alloc: 7,
        worker_args: vec![
            "--slots".into(),
            "4".into(),
            "--label".into(),
            "it's".into(),
        ],
        stdout: "/home/me/srv/alloc/7/stdout".into(),
        stderr: "/home/me/srv/alloc/7/stderr".into(),
    }
}

fn lines_starting<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

/// `sh -n`: the script parses as a POSIX shell script.
fn parses(script: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pilot.sh");
    std::fs::write(&path, script).expect("script");
    let out = Command::new("sh")
        .arg("-n")
        .arg(&path)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_slurm_pilot_asks_for_whole_nodes_and_starts_one_worker_on_each() {
    let s = slurm::script(&pilot(2));
    assert!(s.starts_with("#!/bin/sh\n"));
    assert_eq!(
        lines_starting(&s, "#SBATCH"),
        vec![
            "#SBATCH --job-name=kestrel-a1b2c3-7",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --exclusive",
            "#SBATCH --time=01:00:00",
            "#SBATCH --output=/home/me/srv/alloc/7/stdout",
            "#SBATCH --error=/home/me/srv/alloc/7/stderr",
        ]
    );
    assert!(s.contains("KESTREL_ALLOC_END=$(( $(date +%s) + 3600 ))"));
    let launch = s
        .lines()
        .find(|l| l.starts_with("srun "))
        .expect("srun line");
    assert!(
        launch.contains("--nodes=2 --ntasks=2 --ntasks-per-node=1"),
        "{launch}"
    );
    assert!(
        launch.ends_with(
            "/shared/bin/kestrel worker start --access '/home/me/my server/access.json' --alloc 7 --ends-at \"$KESTREL_ALLOC_END\" --slots 4 --label 'it'\\''s' &"
        ),
        "{launch}"
    );
    // Waited for, so the batch system's kill reaches the workers.
    assert!(s.contains("wait $!"));
    parses(&s);
}

#[test]
fn the_pbs_pilots_use_each_flavors_own_directives() {
    let pro = pbs::script(&pilot(3), pbs::Flavor::Pro);
    assert_eq!(
        lines_starting(&pro, "#PBS"),
        vec![
            "#PBS -N kestrel-a1b2c3-",
            "#PBS -l select=3:mpiprocs=1",
            "#PBS -l place=scatter:excl",
            "#PBS -l walltime=01:00:00",
            "#PBS -o /home/me/srv/alloc/7/stdout",
            "#PBS -e /home/me/srv/alloc/7/stderr",
        ]
    );
    assert!(pro.contains("KESTREL_LAUNCH=\"pbsdsh --\""));
    parses(&pro);
    let torque = pbs::script(&pilot(3), pbs::Flavor::Torque);
    let directives = lines_starting(&torque, "#PBS");
    assert!(
        directives.contains(&"#PBS -l nodes=3:ppn=1"),
        "{directives:?}"
    );
    assert!(torque.contains("KESTREL_LAUNCH=\"pbsdsh -u\""));
    // Where the PBS commands drive Slurm, srun starts the workers.
    assert!(torque.contains("srun --nodes=3 --ntasks=3 --ntasks-per-node=1"));
    parses(&torque);
    // A name that starts with a digit gets a letter first, and stays within 15 characters.
    let mut p = pilot(1);
    p.job_name = "7-kestrel-queue-name".into();
    let s = pbs::script(&p, pbs::Flavor::Pro);
    assert!(s.contains("#PBS -N k7-kestrel-queu\n"), "{s}");
}

#[test]
fn submit_commands_put_the_users_arguments_before_the_script() {
    let user = vec!["--partition".to_string(), "gpu".to_string()];
    assert_eq!(
        slurm::submit("/s/pilot.sh", &user),
        vec!["sbatch", "--parsable", "--partition", "gpu", "/s/pilot.sh"]
    );
    assert_eq!(
        slurm::test_only("/s/pilot.sh", &user),
        vec!["sbatch", "--test-only", "--partition", "gpu", "/s/pilot.sh"]
    );
    let p = pilot(1);
    let argv = pbs::submit(&p, "/s/pilot.sh", &["-q".into(), "short".into()], false);
    assert_eq!(argv[0], "qsub");
    assert_eq!(&argv[1..5], ["-o", &p.stdout, "-e", &p.stderr]);
    assert_eq!(&argv[5..], ["-q", "short", "/s/pilot.sh"]);
    assert_eq!(slurm::query(&["4", "5"]).last().unwrap(), "4,5");
    assert_eq!(slurm::cancel(&["4", "5"]), vec!["scancel", "4", "5"]);
    assert_eq!(pbs::cancel(&["4.pbs"]), vec!["qdel", "4.pbs"]);
}

#[test]
fn walltimes_and_shell_words() {
    assert_eq!(walltime(90_000_000), "00:01:30");
    assert_eq!(walltime(1_500_000), "00:00:02");
    assert_eq!(walltime(25 * 3_600_000_000), "25:00:00");
    assert_eq!(shell_quote("plain/path-1.txt"), "plain/path-1.txt");
    assert_eq!(shell_quote("a b"), "'a b'");
    assert_eq!(shell_quote(""), "''");
    assert_eq!(shell_quote("$HOME"), "'$HOME'");
}

#[test]
fn batch_answers_are_parsed_and_nonsense_is_refused() {
    assert_eq!(slurm::parse_submit("1234\n"), Ok("1234".into()));
    assert_eq!(slurm::parse_submit("1234;cluster2\n"), Ok("1234".into()));
    let err = slurm::parse_submit("Submitted batch job 12\n").unwrap_err();
    assert!(err.contains("no job id"), "{err}");
    assert_eq!(pbs::parse_submit("3\n"), Ok("3".into()));
    assert_eq!(
        pbs::parse_submit("118.pbs-server\n"),
        Ok("118.pbs-server".into())
    );
    assert!(pbs::parse_submit("qsub: error\n").is_err());

    // Captured from the test cluster (Slurm 22.05).
    let squeue = "1|COMPLETED|None\n2|CANCELLED|JobHeldUser\n3|PENDING|Resources\n4|RUNNING|None\n5|TIMEOUT|None\n";
    assert_eq!(
        slurm::parse_query(squeue),
        vec![
            ("1".into(), BatchState::Finished),
            (
                "2".into(),
                BatchState::Failed("CANCELLED (JobHeldUser)".into())
            ),
            ("3".into(), BatchState::Queued),
            ("4".into(), BatchState::Running),
            ("5".into(), BatchState::Failed("TIMEOUT".into())),
        ]
    );
    assert!(slurm::query_knows_none(
        "slurm_load_jobs error: Invalid job id specified\n"
    ));
    // Captured from Debian's slurm-wlm-torque qstat.
    let qstat = "Job id              Name             Username        Time Use S Queue          \n------------------- ---------------- --------------- -------- - ---------------\n3                   kestrel-1-2      root            00:00:00 Q debug          \n4                   kestrel-1-3      root            00:01:10 R debug          \n";
    assert_eq!(
        pbs::parse_query(qstat),
        vec![
            ("3".into(), BatchState::Queued),
            ("4".into(), BatchState::Running)
        ]
    );
    assert!(pbs::same_id("118", "118.pbs-server"));
    assert!(!pbs::same_id("118", "1180.pbs-server"));
}
