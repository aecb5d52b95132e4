//! Slurm: `sbatch`, `squeue`, `scancel`.

use super::{body, walltime, BatchState, Pilot};

/// The batch script of `p`: whole nodes (`--exclusive`), one `srun` task per node, each
/// running one worker with all the node's CPUs, waited for so that Slurm's kill at the time
/// limit reaches every worker.
pub fn script(p: &Pilot) -> String {
    let launch = format!(
        "srun --nodes={n} --ntasks={n} --ntasks-per-node=1 --cpus-per-task=\"${{SLURM_CPUS_ON_NODE:-1}}\" --kill-on-bad-exit=0",
        n = p.nodes
    );
    format!(
        "#!/bin/sh\n\
         #SBATCH --job-name={name}\n\
         #SBATCH --nodes={nodes}\n\
         #SBATCH --ntasks-per-node=1\n\
         #SBATCH --exclusive\n\
         #SBATCH --time={time}\n\
         #SBATCH --output={out}\n\
         #SBATCH --error={err}\n\
         KESTREL_BATCH_ID=\"${{SLURM_JOB_ID:-}}\"\n\
         {body}",
        name = p.job_name,
        nodes = p.nodes,
        time = walltime(p.time_limit_us),
        out = p.stdout,
        err = p.stderr,
        body = body(p, &launch),
    )
}

/// The submit command: `sbatch --parsable ARGS SCRIPT` (the user's arguments before the
/// script, so a wrong partition is sbatch's to refuse).
pub fn submit(script_path: &str, user_args: &[String]) -> Vec<String> {
    let mut argv = vec!["sbatch".to_string(), "--parsable".to_string()];
    argv.extend(user_args.iter().cloned());
    argv.push(script_path.to_string());
    argv
}

/// The dry run of `alloc add`: `sbatch --test-only ARGS SCRIPT`. Slurm checks the job as it
/// would a submission (partition, account, QOS, node counts) and says when it would start,
/// but takes no job: one command, and nothing to cancel or to leave behind if the server
/// stops meanwhile (a held job needs a second command to go away).
pub fn test_only(script_path: &str, user_args: &[String]) -> Vec<String> {
    let mut argv = vec!["sbatch".to_string(), "--test-only".to_string()];
    argv.extend(user_args.iter().cloned());
    argv.push(script_path.to_string());
    argv
}

/// The job id in `sbatch --parsable`'s output (`ID` or `ID;CLUSTER`).
pub fn parse_submit(stdout: &str) -> Result<String, String> {
    let line = stdout.lines().map(str::trim).find(|l| !l.is_empty());
    let id = line.and_then(|l| l.split(';').next()).unwrap_or("");
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        Ok(id.to_string())
    } else {
        Err(format!(
            "sbatch printed no job id (it printed {:?})",
            stdout.trim()
        ))
    }
}

/// One query for all of a queue's allocations: `squeue -h -o %i|%T|%r --states=all -j A,B,C`.
pub fn query(ids: &[&str]) -> Vec<String> {
    vec![
        "squeue".into(),
        "-h".into(),
        "-o".into(),
        "%i|%T|%r".into(),
        "--states=all".into(),
        "-j".into(),
        ids.join(","),
    ]
}

/// Whether a failed `squeue` only says that none of the ids is known any more (Slurm forgets
/// ended jobs after `MinJobAge`): then they have all ended.
pub fn query_knows_none(stderr: &str) -> bool {
    stderr.contains("Invalid job id specified")
}

/// The states in `squeue`'s output of [`query`]; ids it does not list have ended.
pub fn parse_query(stdout: &str) -> Vec<(String, BatchState)> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut f = line.trim().split('|');
            let (id, state) = (f.next()?, f.next()?);
            let reason = f.next().unwrap_or("").trim();
            Some((id.trim().to_string(), state_of(state.trim(), reason)))
        })
        .filter(|(id, _)| !id.is_empty())
        .collect()
}

fn state_of(state: &str, reason: &str) -> BatchState {
    match state {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESIZING"
        | "SUSPENDED" => BatchState::Queued,
        "RUNNING" | "COMPLETING" | "STAGE_OUT" | "SIGNALING" => BatchState::Running,
        "COMPLETED" => BatchState::Finished,
        other => {
            let why = if reason.is_empty() || reason == "None" {
                other.to_string()
            } else {
                format!("{other} ({reason})")
            };
            BatchState::Failed(why)
        }
    }
}

/// The cancel command for the given batch ids.
pub fn cancel(ids: &[&str]) -> Vec<String> {
    let mut argv = vec!["scancel".to_string()];
    argv.extend(ids.iter().map(|s| s.to_string()));
    argv
}

/// The query that finds an allocation whose batch id was never learned (a crash between
/// journaling it and `sbatch`'s answer), by its job name: `squeue -h -o %i -n NAME`.
pub fn find_by_name(name: &str) -> Vec<String> {
    vec![
        "squeue".into(),
        "-h".into(),
        "-o".into(),
        "%i".into(),
        "-n".into(),
        name.to_string(),
    ]
}
