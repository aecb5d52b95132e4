//! The command line: every command, option and its help text.

use crate::jobs::TaskOptions;
use crate::output::Format;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

const ABOUT: &str =
    "Kestrel runs many short tasks (thousands to millions of command lines) on the \
cores of a laptop, a batch allocation or a cluster, with millisecond overheads.";

const EXAMPLES: &str = "\
Quick start (no daemon, everything in one process):
  kestrel run --array 1-1000 -- echo hello from task {task}

A server and workers that outlive one command:
  kestrel server start &                        # writes ~/.kestrel/server/access.json
  kestrel worker start --slots 4 &              # one per node; connects out to the server
  kestrel submit --array 1-100000 -- ./sim --seed {task}
  kestrel job wait 1                            # progress bar; exit code 1 if a task failed
  kestrel task list 1 --state failed           # exit codes and the tail of stderr
  kestrel job state 1 2 3                       # one `id state` line per job, for scripts
  kestrel server stop

Exit status:
  0  success
  1  a task of the job(s) failed or was canceled (run, submit --wait, job wait)
  2  error: bad arguments, or a request the server refused
  3  not found: a job, task or worker id the server does not have
  4  server unreachable: no access file, nobody listening, or the connection was lost and
     did not come back within --reconnect-for
  130, 143  stopped by Ctrl-C or SIGTERM: `run` stops its tasks; `submit --wait` and `job wait`
     leave the jobs running and say how to wait for them again or cancel them

Shell completion: kestrel completions bash|zsh|fish (see `kestrel completions --help`).";

#[derive(Parser, Debug)]
#[command(name = "kestrel", version, about = ABOUT, after_help = EXAMPLES, arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: Global,
}

/// Options every command takes.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Server directory holding access.json [env: KESTREL_SERVER_DIR; default: ~/.kestrel/server]
    #[arg(long, global = true, value_name = "DIR")]
    pub server_dir: Option<PathBuf>,
    /// Access file to use instead of DIR/access.json
    #[arg(long, global = true, value_name = "FILE")]
    pub access: Option<PathBuf>,
    /// Output format
    #[arg(long, global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// More log output (-v info, -vv debug); also RUST_LOG
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// When the server cannot be reached or goes away, keep trying this long before giving up
    /// with exit status 4 (0 = give up at once) [default: 0, except that job wait and submit
    /// keep trying 5m, and worker start 2m, after losing a server they were connected to]
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        env = "KESTREL_RECONNECT_FOR"
    )]
    pub reconnect_for: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run tasks on an embedded server and local workers, then exit (no daemon needed)
    #[command(
        after_help = "Stdout carries only what tasks stream (--stdout stream; also of jobs the tasks submit);\nthe summary and the failed tasks go to stderr. With --server-dir DIR the run keeps its\nrecord there: after it, `kestrel --server-dir DIR task list 1 --state failed` (job list,\njob cat, task info, ...) reads it; the next run in DIR replaces it.\n\nExamples:\n  kestrel run ./analyze input.dat\n  kestrel run --workers 2 --slots 1 --array 1-500 ./sim --seed {task}\n  kestrel run --server-dir sweep-1 --array 1-100 --stdout stream ./sim {task} > results.txt\n  kestrel run --file sweep.toml"
    )]
    Run(RunArgs),
    /// Submit a job to a running server
    #[command(after_help = SUBMIT_HELP)]
    Submit(SubmitArgs),
    /// Start, stop or inspect the server
    #[command(subcommand)]
    Server(ServerCommand),
    /// Start, list, inspect or stop workers
    #[command(subcommand)]
    Worker(WorkerCommand),
    /// List, inspect, wait for or cancel jobs
    #[command(subcommand)]
    Job(JobCommand),
    /// List the tasks of a job, show one in full, or print one's output
    #[command(subcommand)]
    Task(TaskCommand),
    /// Allocation queues: workers that come when work waits and leave when it is done
    #[command(subcommand)]
    Alloc(crate::alloc::AllocCommand),
    /// Simulate a scenario in virtual time: Kestrel's scheduler on simulated nodes, store and network
    #[command(after_help = SIM_HELP)]
    Sim(crate::sim::SimArgs),
    /// Print a shell completion script
    #[command(
        after_help = "Examples:\n  kestrel completions bash > ~/.local/share/bash-completion/completions/kestrel\n  kestrel completions zsh > ~/.zfunc/_kestrel        # with fpath+=~/.zfunc before compinit\n  kestrel completions fish > ~/.config/fish/completions/kestrel.fish"
    )]
    Completions {
        /// The shell to complete in
        shell: clap_complete::Shell,
    },
}

const SIM_HELP: &str = "\
The scenario names the cluster ([cluster] nodes, cpus, latency, link, disk, cache), the shared
store ([store] bandwidth, servers, latency), the scheduler ([scheduler] policy, window,
threshold, dispatch_cost), the workload ([workload] tasks, compute, files, file_size, inputs,
arrival, retries) and failures ([failures] task, kill, return_after); each [[runs]] entry
changes some of it. Every task is placed by Kestrel's own scheduler; nodes, store and network
are simulated in virtual time, so a run of hours takes seconds and repeats with its seed.
docs/simulation.md describes every key, with the seeds' experiments reproduced.

Exit status: 0 when every run ended with every task finished, 1 when a run stopped at its
time bound (or could not go on) or tasks failed, 2 for a scenario it refuses.

Examples:
  kestrel sim examples/sim/falkon-mi.toml
  kestrel sim examples/sim/falkon-mi.toml --run fa,gcc-2g --seed 7
  kestrel sim examples/sim/sc08-1m.toml --output json | jq '.runs[] | {name, makespan_s}'";

const SUBMIT_HELP: &str = "\
Placeholders, replaced in the command, --stdout, --stderr, --cwd and --env values:
  {job}    the job's id
  {task}   the task's id (the array id, or the position in a list, from 0)
  {line}   with --each: the task's line, as it is
  {line:N} with --each: the Nth whitespace-separated field of the line, from 1
           (All-Pairs: a line `a.fits b.fits` gives --input {line:1} --input {line:2});
           a line with fewer than N fields is refused at submission, naming it
  {line:q}, {line:N:q}  the same, quoted for a shell, as GNU parallel quotes {}:
           sh -c 'wc -l {line:q}' counts a file named `my data.txt`
A {name} preceded by $ is left alone (${HOME}, ${line} belong to the shell), and so is any
other text in braces (awk '{print $1}', find -exec ... {} +). A placeholder that does not
apply ({line} without --each), that looks mistyped ({tsk}, {TASK}, {lines}: a letter off,
or another case) or that is HyperQueue's (%{TASK_ID}, $HQ_TASK_ID) is refused at
submission, naming Kestrel's. Doubled braces keep a placeholder for a command the task
runs: {{task}} is the text {task} (sh -c 'kestrel submit --array 1-3 -- echo {{task}}').

A --stdout or --stderr path without {task} or {line} is shared by the job's tasks: each
task's output goes into it whole, in task order under `kestrel run`, in the order the tasks
end on a server (see --stdout).

Tasks see KESTREL_JOB_ID, KESTREL_TASK_ID, KESTREL_WORKER_ID, KESTREL_SERVER and
KESTREL_SERVER_DIR in their environment (so a task can `kestrel submit` more), on top of the
worker's own (or of this shell's with --env-all).

The program comes after the options, as with sbatch: `kestrel submit ./job.sh` (every word
from the program on is the task's, `--seed 3` in `./sim --seed 3` too); a `--` before it
works as well.

Examples:
  kestrel submit ./one-task
  job=$(kestrel submit --parsable ./job.sh)      # as Snakemake's cluster-generic executor does
  kestrel submit --array 1-1000 --cpus 2 --retries 2 -- ./sim --seed {task}
  kestrel submit --each inputs.txt --stdout sums/{line}.sha -- sha1sum {line}
  kestrel submit --each files.txt --stdout counts.txt -- sh -c 'wc -l {line:q}'
  find data -name '*.fits' | kestrel submit --each - -- ./process {line}
  kestrel submit --each pairs.txt --input {line:1} --input {line:2} -- ./cmp {input:0} {input:1}
  kestrel submit --array 0-98:2 --timeout 10m --wait -- ./step {task}
  kestrel submit --file sweep.toml --wait
  job=$(kestrel submit --parsable --key nightly-$(date +%F) --env-all -- ./report)

Job file (TOML):
  [defaults]                 # options for every job below
  retries = 1
  env_all = true             # like --env-all
  [[job]]
  name = \"sim\"
  array = \"1-100\"
  command = [\"./sim\", \"--seed\", \"{task}\"]   # or a string, split like a shell
  cpus = 2
  [[job]]
  each = \"inputs.txt\"                         # relative to the job file
  command = \"./process {line}\"
  [[job]]
  tasks = [\"./post a\", \"./post b\"]            # a list of commands
  [[job]]                    # tasks one by one, as HyperQueue's job files give them
  name = \"pipeline\"
  nodes = 2                  # like --nodes: two whole workers per task
  [[job.task]]
  id = 1                     # ids of their own (all or none; else 0, 1, 2, ...)
  command = \"./prep\"
  [[job.task]]
  id = 3
  command = \"./solve\"
  deps = [1, \"sim:7\"]       # after task 1, and after task 7 of the earlier job sim";

/// How the tasks of a job are given.
#[derive(Args, Debug, Clone, Default)]
pub struct Shape {
    /// Task ids: 1-100, 0-98:2 (step), 1,5,9-12. As in Slurm, ranges that overlap are
    /// merged: each id runs once, in increasing order
    #[arg(long, value_name = "RANGE", conflicts_with_all = ["each", "file"])]
    pub array: Option<String>,
    /// One task per non-blank line of FILE (- reads standard input); {line} is the line
    #[arg(long, value_name = "FILE", conflicts_with = "file")]
    pub each: Option<PathBuf>,
    /// Submit the jobs of a TOML job file (see below)
    #[arg(long, value_name = "JOBFILE")]
    pub file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub shape: Shape,
    #[command(flatten)]
    pub options: TaskOptions,
    /// Wait until the job ends (progress bar; exit code 1 if any task failed)
    #[arg(long)]
    pub wait: bool,
    /// Submit at most once under KEY: run again with the same KEY, it answers with the job
    /// the first run made (jobs of a --file get KEY#1, KEY#2, ...)
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// Print only the job id(s) on stdout, one a line (like sbatch --parsable)
    #[arg(long)]
    pub parsable: bool,
    /// The program and its arguments: everything from the first one on belongs to the task,
    /// even what looks like an option (`-- PROGRAM ARGS` works too)
    #[arg(trailing_var_arg = true, value_name = "PROGRAM [ARGS]")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Local workers to start [default: 1, or none with --alloc]
    #[arg(long, value_name = "N")]
    pub workers: Option<u32>,
    /// Workers that come and go with the work, from an allocation queue: the arguments of
    /// `kestrel alloc add`, e.g. --alloc "local --time-limit 30m --max-workers 4 --idle-timeout
    /// 5s --worker-args '--slots 2'" or --alloc "slurm --time-limit 1h --max-workers 16
    /// --worker-args '--slots 32' -- --partition debug"
    #[arg(long, value_name = "QUEUE")]
    pub alloc: Option<String>,
    /// Slots per worker [default: the number of CPUs divided among the workers]
    #[arg(long, value_name = "N")]
    pub slots: Option<u32>,
    /// Tasks each worker keeps queued beyond its free slots [default: slots]
    #[arg(long, value_name = "N")]
    pub prefetch: Option<u32>,
    /// How workers execute tasks; `noop` is for benchmarks only
    #[arg(long, value_enum, default_value_t = Exec::Process)]
    pub exec: Exec,
    /// Quarantine a worker whose tasks fail far more often than on the others (see
    /// `kestrel worker resume --help`)
    #[arg(long, value_enum, default_value_t = Switch::On, value_name = "on|off")]
    pub quarantine: Switch,
    /// No progress display
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub shape: Shape,
    #[command(flatten)]
    pub options: TaskOptions,
    /// The program and its arguments: everything from the first one on belongs to the task,
    /// even what looks like an option (`-- PROGRAM ARGS` works too)
    #[arg(trailing_var_arg = true, value_name = "PROGRAM [ARGS]")]
    pub command: Vec<String>,
}

/// An option that is on or off.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    On,
    Off,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exec {
    /// Run each task as a process (the normal mode)
    Process,
    /// BENCHMARK ONLY: complete tasks without running them, to measure dispatch alone
    Noop,
}

impl From<Exec> for kestrel_worker::ExecMode {
    fn from(e: Exec) -> Self {
        match e {
            Exec::Process => kestrel_worker::ExecMode::Process,
            Exec::Noop => kestrel_worker::ExecMode::Noop,
        }
    }
}

/// When `server start` encrypts its connections.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// Encrypt unless --host is a loopback address, where no traffic leaves the machine
    #[default]
    Auto,
    /// Always encrypt, loopback included
    On,
    /// Never encrypt, even beyond loopback (only on a network you trust)
    Off,
}

/// TLS options of `server start`.
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Encrypt worker and client connections with TLS: `auto` (the default) does whenever the
    /// server listens beyond loopback (the default --host 0.0.0.0 included), `--tls` alone
    /// means `on`. Without --tls-cert, a self-signed certificate is made on first use and kept
    /// as DIR/tls-cert.pem and DIR/tls-key.pem; the access file pins it
    #[arg(
        long,
        value_enum,
        num_args = 0..=1,
        default_value_t = TlsMode::Auto,
        default_missing_value = "on",
        value_name = "auto|on|off"
    )]
    pub tls: TlsMode,
    /// PEM certificate to present (implies --tls on; needs --tls-key)
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum ServerCommand {
    /// Start a server in the foreground; it writes DIR/access.json for workers and clients
    #[command(
        after_help = "Examples:\n  kestrel server start &\n  kestrel server start --server-dir /shared/kestrel --port 9800"
    )]
    Start(Box<ServerStartArgs>),
    /// Stop the server (its workers exit too)
    Stop,
    /// Show the server's address, version and load
    Info,
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum WorkerCommand {
    /// Start a worker in the foreground; it connects out to the server and runs tasks
    #[command(
        after_help = "Examples:\n  kestrel worker start --slots 8\n  kestrel worker start --access /shared/kestrel/access.json --gpus 2\n  CUDA_VISIBLE_DEVICES=2,3 kestrel worker start   # offers GPUs 2 and 3"
    )]
    Start {
        /// Task slots (cores) [default: number of CPUs]
        #[arg(long, value_name = "N")]
        slots: Option<u32>,
        /// GPUs to hand to tasks: `auto`, those found on this machine (CUDA_VISIBLE_DEVICES,
        /// /proc/driver/nvidia/gpus or nvidia-smi; ROCR_VISIBLE_DEVICES, the KFD topology or
        /// rocm-smi for AMD), or N: the first N found (N numbered ones if none is found).
        /// Each task gets CUDA_VISIBLE_DEVICES (ROCR_VISIBLE_DEVICES for AMD) set to its own
        /// [default: auto]
        #[arg(long, value_name = "N|auto")]
        gpus: Option<String>,
        /// Memory tasks may hold in all, e.g. 64G (their `--mem` adds up to at most this)
        /// [default: this machine's memory, or its cgroup's limit]
        #[arg(long, value_name = "SIZE")]
        mem: Option<String>,
        /// A named countable resource tasks may hold, e.g. licenses=4 (repeat for more);
        /// tasks ask for it with `submit --resource licenses=1`
        #[arg(long = "resource", value_name = "NAME=N")]
        resource: Vec<String>,
        /// Tasks kept queued beyond free slots, so no slot waits a round trip, for a job whose
        /// task length is not known yet; a job known to be short gets up to 100 ms of run time
        /// a slot (at most 32 tasks a slot), one known to be long none; 0 turns it off
        /// [default: slots]
        #[arg(long, value_name = "N")]
        prefetch: Option<u32>,
        /// How tasks are executed; `noop` is for benchmarks only and never the default
        #[arg(long, value_enum, default_value_t = Exec::Process)]
        exec: Exec,
        /// The directory of its file cache (data diffusion), kept across restarts: the files
        /// found there are reported to the server at start. One directory per worker
        /// [default: a fresh temporary directory, removed when the worker stops]
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        /// How much the file cache may hold, e.g. 500M, 20G; a file larger than this is
        /// streamed to its task, not cached (0 caches nothing) [default: 1G]
        #[arg(long, value_name = "SIZE")]
        cache_size: Option<String>,
        /// Which file leaves a full cache first: lru, fifo, lfu or random
        #[arg(long, default_value = "lru", value_name = "POLICY")]
        cache_policy: String,
        /// How many files this worker reads from a job's store at once (others wait), so that
        /// many workers starting together do not stampede a shared store
        #[arg(long, default_value_t = 1, value_name = "N")]
        store_readers: u32,
        /// Where this worker serves its cache to the other workers (who fetch inputs from it
        /// rather than from the store): HOST:PORT, or `off` [default: the address it reaches
        /// the server from, on a port the system picks]. Requests are signed with the
        /// server's secret; at most 10 are served at once, and connections are bounded so
        /// that a flood cannot take the tasks' file descriptors (docs/security.md)
        #[arg(long, value_name = "HOST:PORT|off")]
        peer_listen: Option<String>,
        /// When the allocation this worker runs in ends, in seconds since the epoch
        /// (`date +%s`): from 30 s before then it takes no new task, and before then only
        /// tasks whose `--timeout` ends in time. Kestrel's pilot scripts set it
        #[arg(long, value_name = "SECONDS")]
        ends_at: Option<u64>,
        /// The allocation this worker runs in, as Kestrel's pilot scripts number it
        #[arg(long, value_name = "ID")]
        alloc: Option<u32>,
        /// The workers a multi-node task (`submit --nodes`) may span with this one: those
        /// started with the same --group (nodes that reach each other, e.g. one rack)
        /// [default: those of its allocation, or those of none]
        #[arg(long, value_name = "NAME")]
        group: Option<String>,
        /// The Python interpreter that calls function tasks (those submitted from the
        /// `kestrel` Python package), one runner per slot, kept between tasks. It needs
        /// cloudpickle, and the client's Python version and packages; it is checked at start.
        /// Without it the worker takes no function task
        #[arg(long, value_name = "PATH")]
        python: Option<PathBuf>,
    },
    /// List connected workers (quarantined ones with the reason); --all adds those that left
    #[command(
        after_help = "A worker keeps its id when it reconnects, to the same server or to one restarted on\nits journal. The server keeps the last 1024 workers that left, with when and why:\nheartbeat lost, connection closed, allocation ended, stopped by `kestrel worker stop`\nor SIGTERM (and whether it was quarantined).\n\nExamples:\n  kestrel worker list\n  kestrel worker list --all\n  kestrel worker list --all --output json | jq '.departed[] | {id, reason}'"
    )]
    List {
        /// Also the workers that left lately, with when and why
        #[arg(long)]
        all: bool,
    },
    /// Show one worker in full: what it offers, what it runs, its counts, and why it left
    #[command(after_help = "Examples:
  kestrel worker info 3
  kestrel worker info 3 --output json")]
    Info {
        /// The worker, as `kestrel worker list --all` shows it
        worker: u32,
    },
    /// Stop workers: each takes no new task, finishes what it runs, then exits
    #[command(
        after_help = "Tasks that only wait on a stopping worker (prefetched) go back to the queue for other\nworkers. With --now the worker kills its tasks at once; they go back to the queue\nwithout spending a retry. SIGTERM to a worker process drains it the same way (a second\nSIGTERM or Ctrl-C stops it at once).\n\nExamples:\n  kestrel worker stop 3\n  kestrel worker stop 3 4 --now\n  kestrel worker stop --all"
    )]
    Stop {
        /// The workers to stop, as `kestrel worker list` shows them
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        workers: Vec<u32>,
        /// Every connected worker
        #[arg(long)]
        all: bool,
        /// Kill their tasks now instead of letting them finish (the tasks go back to the queue)
        #[arg(long)]
        now: bool,
    },
    /// Lift a worker's quarantine so it gets tasks again
    #[command(
        after_help = "A worker is quarantined when it fails a job's tasks far more often than the other\nworkers do, judged by rates with enough evidence on each side:\n  - at least 10 of its recent tasks of a job failed, more than half of them, while the\n    other workers failed at most a third as often, and so unevenly that chance would do\n    it less than once in a thousand (a few successes elsewhere can be enough); or\n  - 20 of its runs of a job failed in a row, and at least 10 of those tasks then succeeded\n    on other workers (three times as many as failed there too).\nA task that fails wherever it runs is the task's fault, not the worker's: a sweep whose\nevery fifth point fails, or a job that fails everywhere, quarantines nobody. A failed\ntask's retry goes to another worker than the one it failed on (or back to it after 10 s\nif no other takes it). A quarantined worker keeps running what it has but gets no new\ntasks; `kestrel worker list` says why. The last worker able to run a job is never\nquarantined. `--quarantine off` on `server start` or `run` turns it off; `kestrel job\ninfo` says when a job waits for a quarantined worker.\n\nExample:\n  kestrel worker resume 3"
    )]
    Resume { worker: u32 },
}

#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// List jobs, oldest first (the server filters, so long histories answer quickly)
    #[command(
        after_help = "Examples:\n  kestrel job list --state running,queued\n  kestrel job list --name 'sweep-*' --last 10\n  kestrel job list --last 0 --output json      # every job"
    )]
    List {
        /// Only jobs in these states (comma-separated)
        #[arg(
            long,
            alias = "status",
            value_enum,
            value_delimiter = ',',
            value_name = "STATE"
        )]
        state: Vec<JobStateArg>,
        /// Only jobs whose name matches this pattern (`*` and `?` as in the shell)
        #[arg(long, value_name = "PATTERN")]
        name: Option<String>,
        /// Only the newest N matching jobs (0 = all)
        #[arg(long, default_value_t = 1000, value_name = "N")]
        last: u32,
    },
    /// Show a job's options, task counts and timing (queue, dispatch and run time)
    Info { job: u32 },
    /// Print the graph of the workflow a job belongs to (Graphviz DOT): its tasks colored by
    /// state, and what joins them (files, `--after`, jobs submitted by a task)
    #[command(
        after_help = "A workflow is the set of jobs joined by a file one writes and another reads, an `--after`,
or a task that submitted a job. Tasks are grouped by job; a failed task is red, a canceled
one grey (its tooltip says why), a waiting one blue, a finished one green. Past 5,000 tasks,
or with --by-job, jobs are drawn instead of tasks.

Examples:
  kestrel job graph 3 | dot -Tsvg > workflow.svg
  kestrel job graph 3 --by-job
  kestrel job graph 3 --output json"
    )]
    Graph {
        job: u32,
        /// One node per job instead of one per task
        #[arg(long)]
        by_job: bool,
    },
    /// Print `ID STATE` for each job, one line each, in one request (for scripts and workflow
    /// managers); exit status 3 if some id is unknown
    #[command(
        after_help = "States: queued, running, finished, failed, canceled; `unknown` for an id the server does\nnot have (never submitted, or forgotten).\n\nExamples:\n  $ kestrel job state 4 5 99\n  4 finished\n  5 running\n  99 unknown\n  $ snakemake --executor cluster-generic --cluster-generic-submit-cmd 'kestrel submit --parsable' \\\n      --cluster-generic-status-cmd 'kestrel job state --snakemake' \\\n      --cluster-generic-cancel-cmd 'kestrel job cancel' --jobs 100"
    )]
    State {
        #[arg(required = true)]
        jobs: Vec<u32>,
        /// Print only `running`, `success` or `failed` per job, as the status command of
        /// Snakemake's cluster-generic executor must (an unknown id is `failed`, with status 0)
        #[arg(long)]
        snakemake: bool,
    },
    /// Wait for jobs to end (all unfinished jobs if none given); exit code 1 if a task failed
    Wait {
        jobs: Vec<u32>,
        /// No progress display
        #[arg(long, short)]
        quiet: bool,
    },
    /// Cancel jobs: queued tasks at once, running ones are killed
    Cancel {
        #[arg(required = true)]
        jobs: Vec<u32>,
    },
    /// Run a job's failed tasks again, with fresh retry counts
    #[command(
        after_help = "Examples:\n  kestrel job retry 4            # its failed tasks\n  kestrel job retry 4 --all      # failed and canceled tasks (also of a canceled job)"
    )]
    Retry {
        job: u32,
        /// Only failed tasks (the default)
        #[arg(long)]
        failed: bool,
        /// Failed and canceled tasks
        #[arg(long, conflicts_with = "failed")]
        all: bool,
    },
    /// Print the output of a job's tasks in task order (files or streamed output)
    #[command(after_help = CAT_HELP)]
    Cat(CatArgs),
    /// Drop ended jobs from the server for good (their tasks' records too); the journal
    /// remembers it, so a restarted server does not bring them back
    #[command(
        after_help = "A job that still has queued or running tasks is refused: wait for it or cancel it first.\n\nExamples:\n  kestrel job forget 3 4\n  kestrel job forget --all-finished"
    )]
    Forget {
        /// The jobs to forget (each must have ended)
        #[arg(required_unless_present = "all_finished")]
        jobs: Vec<u32>,
        /// Every job that has ended: finished, failed or canceled
        #[arg(long)]
        all_finished: bool,
    },
}

const CAT_HELP: &str = "\
Outputs written to files (the default) are read by this command from the file system, so run it
where the workers' files can be seen; streamed outputs (--stdout stream) come from the server.
Tasks that have not ended are left out (a note says how many). Notes go to stderr.

Examples:
  kestrel job cat 4                  # the stdout of every task, in task order
  kestrel job cat 4 --tasks 1-10     # tasks 1 to 10
  kestrel job cat 4 --stderr > errors.txt";

/// Options of `kestrel job cat`.
#[derive(Args, Debug)]
pub struct CatArgs {
    /// The job's id
    pub job: u32,
    /// Only the tasks with these ids: 1-10, 0-98:2, 3,7,9
    #[arg(long, value_name = "RANGE")]
    pub tasks: Option<String>,
    /// Their stderr instead of their stdout
    #[arg(long)]
    pub stderr: bool,
}

/// Options of `kestrel task output`.
#[derive(Args, Debug)]
pub struct TaskOutputArgs {
    /// The job's id
    pub job: u32,
    /// The task's id (its array value, or its position in a list from 0)
    pub task: u32,
    /// Its stderr instead of its stdout
    #[arg(long)]
    pub stderr: bool,
}

/// A job state, as `job list --state` takes it.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStateArg {
    Queued,
    Running,
    Finished,
    Failed,
    Canceled,
}

#[derive(Subcommand, Debug)]
pub enum TaskCommand {
    /// List a job's tasks in pages (failed ones with exit code and the tail of stderr)
    #[command(
        after_help = "Pages: a note on stderr after the table says how to get the next one, e.g.\n  kestrel task list 1 --offset 1000 --limit 1000\nThe server sends at most 10000 tasks a page, whatever --limit asks (with --output json,\n`next_offset` says where the next page starts).\n\nExamples:\n  kestrel task list 1 --state failed\n  kestrel task list 1 --offset 5000 --limit 100 --output json"
    )]
    List {
        job: u32,
        /// Only tasks in this state (`--status` is an alias)
        #[arg(long, alias = "status", value_enum, value_name = "STATE")]
        state: Option<Status>,
        /// Skip this many (matching) tasks: where the page starts
        #[arg(long, default_value_t = 0, value_name = "N")]
        offset: u32,
        /// At most this many rows (the server sends at most 10000 a page)
        #[arg(long, default_value_t = 1000, value_name = "N")]
        limit: u32,
    },
    /// Show one task in full: state, worker, runs, times, exit code, reason, the tail of its
    /// stderr, its command line and where its output went
    #[command(after_help = "Example:\n  kestrel task info 1 17")]
    Info {
        job: u32,
        /// The task's id (the array value, or the line number from 0 for lists)
        task: u32,
    },
    /// Print one task's output (its file, or its streamed output)
    #[command(
        after_help = "Examples:\n  kestrel task output 4 17\n  kestrel task output 4 17 --stderr"
    )]
    Output(TaskOutputArgs),
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum Status {
    Queued,
    /// Waiting for the tasks it depends on (the writers of its inputs, `--after`)
    Waiting,
    Assigned,
    Running,
    Finished,
    Failed,
    Canceled,
}

/// Options of `kestrel server start`.
#[derive(clap::Args, Debug)]
pub struct ServerStartArgs {
    /// Address to listen on
    #[arg(long, default_value = "0.0.0.0", value_name = "HOST")]
    pub host: String,
    /// Port to listen on (0 = any free port)
    #[arg(long, default_value_t = 0, value_name = "PORT")]
    pub port: u16,
    /// Host name workers and clients use to reach the server [default: --host, or this machine's name for 0.0.0.0]
    #[arg(long, value_name = "HOST")]
    pub advertise: Option<String>,
    /// How often workers send a heartbeat; a worker silent for 4 of them is lost
    #[arg(long, default_value = "5s", value_name = "DURATION")]
    pub heartbeat: String,
    /// Alias of --server-dir
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Keep no journal: state is in memory only and lost if the server dies
    #[arg(long)]
    pub no_journal: bool,
    /// Cap the journal's size (e.g. 512M); work that does not fit is refused, saying so, until
    /// `kestrel job forget` makes room (a forgotten job's rows are deleted)
    #[arg(long, value_name = "SIZE")]
    pub journal_limit: Option<String>,
    /// Quarantine a worker whose tasks fail far more often than on the others (see
    /// `kestrel worker resume --help`)
    #[arg(long, value_enum, default_value_t = Switch::On, value_name = "on|off")]
    pub quarantine: Switch,
    /// The shared store of jobs' logical files, for jobs that name none (`submit --store`):
    /// a directory on a file system the workers share, or an http(s):// URL prefix (GET to
    /// read, PUT to write outputs)
    #[arg(long, value_name = "DIR|URL")]
    pub store: Option<String>,
    /// How tasks that read files are placed, for jobs that name no policy:
    /// first-available, first-cache-available, max-cache-hit, max-compute-util or
    /// good-cache-compute (Falkon's policies; see `kestrel submit --help`)
    #[arg(long, default_value = "first-available", value_name = "POLICY")]
    pub policy: String,
    /// good-cache-compute's threshold: above this fraction of busy cpus, tasks wait for the
    /// worker caching their inputs
    #[arg(long, default_value_t = 0.9, value_name = "FRACTION")]
    pub util_threshold: f64,
    /// How many ready tasks a data-aware decision looks at (Falkon's W) [default: 100 per
    /// connected worker]
    #[arg(long, value_name = "TASKS")]
    pub window: Option<usize>,
    /// Make a new secret instead of the one the journal keeps (rotation, after an access file
    /// was exposed): access files written before are refused from now on; workers given
    /// --server-dir read the new one when they reconnect, the others must be given it
    #[arg(long)]
    pub new_secret: bool,
    /// How long a connecting worker or client has to prove the secret; a fifth of it once
    /// half the handshake places are taken, so a flood of idle connections gives way sooner.
    /// Longer for links with a high round-trip time
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub handshake_timeout: String,
    #[command(flatten)]
    pub tls: TlsArgs,
}
