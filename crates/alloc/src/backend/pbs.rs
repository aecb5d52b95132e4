//! PBS: `qsub`, `qstat`, `qdel`, for PBS Professional (and OpenPBS) and for Torque, whose
//! resource requests differ (`-l select=` against `-l nodes=`).

use super::{body, walltime, BatchState, Pilot};

/// Which PBS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// PBS Professional and OpenPBS: `-l select=N:ncpus=..:mpiprocs=1`, `-l place=scatter:excl`.
    Pro,
    /// Torque: `-l nodes=N:ppn=1`.
    Torque,
}

/// The batch script of `p`: one worker per node, started with `pbsdsh` (or `srun`, where the
/// PBS commands drive Slurm, as Debian's `slurm-wlm-torque` does), and waited for.
pub fn script(p: &Pilot, flavor: Flavor) -> String {
    let select = match flavor {
        // One chunk per node (scatter), whole nodes (excl), one entry per chunk in the node
        // file (mpiprocs=1), so pbsdsh starts one worker per node.
        Flavor::Pro => format!(
            "#PBS -l select={}:mpiprocs=1\n#PBS -l place=scatter:excl\n",
            p.nodes
        ),
        // The node file lists each node once per processor asked (ppn=1: once). Not `-n`
        // (node-exclusive): qsub wrappers over other batch systems refuse it; give it with
        // the queue's qsub arguments where the nodes must be the job's alone.
        Flavor::Torque => format!("#PBS -l nodes={}:ppn=1\n", p.nodes),
    };
    let one_per_node = match flavor {
        Flavor::Pro => "pbsdsh --",
        // -u: once per distinct node of the node file.
        Flavor::Torque => "pbsdsh -u",
    };
    let launch = format!(
        "if [ -n \"${{SLURM_JOB_ID:-}}\" ] && command -v srun >/dev/null 2>&1; then\n\
         \x20 KESTREL_LAUNCH=\"srun --nodes={n} --ntasks={n} --ntasks-per-node=1 --kill-on-bad-exit=0\"\n\
         elif command -v pbsdsh >/dev/null 2>&1; then\n\
         \x20 KESTREL_LAUNCH=\"{one_per_node}\"\n\
         else\n\
         \x20 KESTREL_LAUNCH=\"\"\n\
         fi\n",
        n = p.nodes
    );
    format!(
        "#!/bin/sh\n\
         #PBS -N {name}\n\
         {select}\
         #PBS -l walltime={time}\n\
         #PBS -o {out}\n\
         #PBS -e {err}\n\
         KESTREL_BATCH_ID=\"${{PBS_JOBID:-${{SLURM_JOB_ID:-}}}}\"\n\
         {launch}\
         {body}",
        name = pbs_name(&p.job_name),
        time = walltime(p.time_limit_us),
        out = p.stdout,
        err = p.stderr,
        body = body(p, "$KESTREL_LAUNCH"),
    )
}

/// PBS job names: at most 15 characters in older PBS and Torque, starting with a letter.
fn pbs_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(15)
        .collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic()) {
        s.insert(0, 'k');
        s.truncate(15);
    }
    s
}

/// The submit command: `qsub -o OUT -e ERR [-h] ARGS SCRIPT` (`-h`: held, for the dry run).
/// The output paths are given on the command line too: a qsub that wraps another batch system
/// (Debian's `slurm-wlm-torque`) puts its own there and ignores the script's `#PBS -o`.
pub fn submit(p: &Pilot, script_path: &str, user_args: &[String], hold: bool) -> Vec<String> {
    let mut argv = vec!["qsub".to_string()];
    argv.extend(["-o".into(), p.stdout.clone(), "-e".into(), p.stderr.clone()]);
    if hold {
        argv.push("-h".into());
    }
    argv.extend(user_args.iter().cloned());
    argv.push(script_path.to_string());
    argv
}

/// The job id `qsub` prints (`123.server`, or a bare number).
pub fn parse_submit(stdout: &str) -> Result<String, String> {
    let id = stdout
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if id.starts_with(|c: char| c.is_ascii_digit()) && !id.contains(char::is_whitespace) {
        Ok(id.to_string())
    } else {
        Err(format!(
            "qsub printed no job id (it printed {:?})",
            stdout.trim()
        ))
    }
}

/// One query for all of a queue's allocations: `qstat IDS`. Not `-x` (ended jobs too): Torque
/// and `slurm-wlm-torque` refuse it; a job no longer listed has ended.
pub fn query(ids: &[&str]) -> Vec<String> {
    let mut argv = vec!["qstat".to_string()];
    argv.extend(ids.iter().map(|s| s.to_string()));
    argv
}

/// Whether a failed `qstat` failed only because some of its ids are no longer known (a job
/// that has finished): its table still lists the others, and the missing ones have ended.
/// PBS Professional says "Job has finished", Torque "Unknown Job Id".
pub fn query_knows_some_not(stderr: &str) -> bool {
    let lower = stderr.to_ascii_lowercase();
    lower.contains("unknown job id") || lower.contains("job has finished")
}

/// The states in `qstat`'s default table (`Job id  Name  User  Time Use  S  Queue`): the
/// rows after the `---` line; ids it does not list have ended.
pub fn parse_query(stdout: &str) -> Vec<(String, BatchState)> {
    let mut rows = Vec::new();
    let mut past_header = false;
    for line in stdout.lines() {
        if line.trim_start().starts_with("---") {
            past_header = true;
            continue;
        }
        if !past_header {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 {
            continue;
        }
        // The state is the column before the queue's, counted from the end: a job's name
        // never has spaces, but its "Time Use" may be "0".
        let state = f[f.len() - 2];
        rows.push((f[0].to_string(), state_of(state)));
    }
    rows
}

fn state_of(s: &str) -> BatchState {
    match s {
        "Q" | "H" | "W" | "T" | "S" | "U" => BatchState::Queued,
        "R" | "E" | "B" => BatchState::Running,
        "C" | "F" | "X" => BatchState::Finished,
        other => BatchState::Failed(format!("qstat state {other}")),
    }
}

/// Whether two ids name the same job: `qstat` may print `123.server` for `123`, or cut a long
/// id short.
pub fn same_id(ours: &str, listed: &str) -> bool {
    let base = |s: &str| s.split('.').next().unwrap_or(s).to_string();
    ours == listed || base(ours) == base(listed)
}

/// The query that finds an allocation whose batch id was never learned (a crash between
/// journaling it and `qsub`'s answer), by its job name: `qselect -N NAME`, one id a line.
pub fn find_by_name(name: &str) -> Vec<String> {
    vec!["qselect".into(), "-N".into(), pbs_name(name)]
}

/// The cancel command for the given batch ids.
pub fn cancel(ids: &[&str]) -> Vec<String> {
    let mut argv = vec!["qdel".to_string()];
    argv.extend(ids.iter().map(|s| s.to_string()));
    argv
}
