//! What the batch systems are told and what they answer, as text: the pilot scripts, the
//! command lines of submit, query and cancel, and the parsing of their output. Running the
//! commands (with timeouts and retries) is the server's; everything here is pure, so the
//! scripts are tested as text and the parsers on captured output.

pub mod pbs;
pub mod slurm;

use crate::params::Micros;

/// What a pilot script needs to start the workers of one allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pilot {
    /// The batch job's name: finds the allocation again after a crash between journaling it
    /// and learning its batch id.
    pub job_name: String,
    /// Nodes, one worker each.
    pub nodes: u32,
    /// The allocation's time limit.
    pub time_limit_us: Micros,
    /// The `kestrel` binary the nodes run (an absolute path on the shared file system).
    pub kestrel: String,
    /// The server's access file the workers connect with.
    pub access: String,
    /// The allocation's number, which its workers give the server.
    pub alloc: u32,
    /// More `kestrel worker start` arguments, as the user gave them (split like a shell).
    pub worker_args: Vec<String>,
    /// Where the batch system writes the script's stdout and stderr.
    pub stdout: String,
    pub stderr: String,
}

/// What the batch system says of an allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchState {
    /// Waiting for nodes (or held).
    Queued,
    /// Its nodes are given.
    Running,
    /// Over, normally.
    Finished,
    /// Over, not normally: the batch system's word for it.
    Failed(String),
}

/// `HH:MM:SS` (hours past 24 allowed), rounded up to the minute's next second: what both
/// Slurm's `--time` and PBS's `walltime` take.
pub fn walltime(us: Micros) -> String {
    let s = us.div_ceil(1_000_000);
    format!("{:02}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// `word` quoted for a POSIX shell: as it is if it needs no quotes, else in single quotes.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The `kestrel worker start` command line of a pilot, quoted for the shell, with the
/// allocation's end time in `$KESTREL_ALLOC_END` (seconds since the epoch, set by the script).
fn worker_command(p: &Pilot) -> String {
    let mut words = vec![
        shell_quote(&p.kestrel),
        "worker".into(),
        "start".into(),
        "--access".into(),
        shell_quote(&p.access),
        "--alloc".into(),
        p.alloc.to_string(),
        "--ends-at".into(),
        "\"$KESTREL_ALLOC_END\"".into(),
    ];
    words.extend(p.worker_args.iter().map(|w| shell_quote(w)));
    words.join(" ")
}

/// The body every pilot shares: the end time, then `launch` (which starts one worker per node
/// and returns when they have all ended), waited for so the batch system's kill reaches them.
fn body(p: &Pilot, launch: &str) -> String {
    let limit = p.time_limit_us / 1_000_000;
    format!(
        "set -u\n\
         # The allocation ends {limit} s after it started: the workers drain before then.\n\
         KESTREL_ALLOC_END=$(( $(date +%s) + {limit} ))\n\
         export KESTREL_ALLOC_END\n\
         echo \"kestrel pilot: allocation {alloc}, batch job ${{KESTREL_BATCH_ID:-?}}, {nodes} node(s), ends at $KESTREL_ALLOC_END\"\n\
         {launch} {cmd} &\n\
         wait $!\n\
         status=$?\n\
         echo \"kestrel pilot: the workers ended with status $status\"\n\
         exit $status\n",
        alloc = p.alloc,
        nodes = p.nodes,
        cmd = worker_command(p),
    )
}
