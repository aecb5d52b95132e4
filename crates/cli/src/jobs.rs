//! Turning what a user typed (flags, or a TOML job file) into job specifications.
//!
//! `kestrel submit`, `kestrel run` and job files share [`TaskOptions`], so an option means the
//! same thing wherever it is written.

use crate::{output, sizes};
use anyhow::{anyhow, bail, Context, Result};
use kestrel_core::placeholders;
use kestrel_core::{
    After, IdRanges, JobSpec, Keep, LineList, Placement, PolicyName, Resources, Sink, TaskDeps,
    TaskFiles, TaskRef, TaskSet, TaskTemplate, DEFAULT_STREAM_LIMIT, MAX_STREAM_LIMIT,
};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Where a task's output goes unless the job says otherwise: a directory per job in the
/// task's working directory.
pub const DEFAULT_STDOUT: &str = "job-{job}/{task}.out";
pub const DEFAULT_STDERR: &str = "job-{job}/{task}.err";

/// Options of a job's tasks, from flags or from a job file.
#[derive(clap::Args, Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskOptions {
    /// A name for the job, shown by `kestrel job list` [default: the program name]
    #[arg(long)]
    pub name: Option<String>,
    /// Slots (cores) each task holds while it runs
    #[arg(long, value_name = "N")]
    pub cpus: Option<u32>,
    /// GPUs each task holds (its worker sets CUDA_VISIBLE_DEVICES, or ROCR_VISIBLE_DEVICES
    /// for AMD GPUs, to them)
    #[arg(long, value_name = "N")]
    pub gpus: Option<u32>,
    /// Memory each task holds, e.g. 500M or 2G, against what its worker offers (its
    /// machine's memory unless `worker start --mem` says otherwise)
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
    /// A named countable resource each task holds, e.g. licenses=1, against what workers
    /// offer with `worker start --resource licenses=4` (repeat for more)
    #[arg(long = "resource", value_name = "NAME=N")]
    #[serde(default, rename = "resources", deserialize_with = "resource_entries")]
    pub resource: Vec<String>,
    /// Give each task N whole workers (an MPI run): it runs on the first of them and nothing
    /// else runs on any of them until it ends. The task finds them in KESTREL_NODE_LIST
    /// (host names, comma-separated), KESTREL_NODE_FILE (a host file, one per line, for
    /// `mpirun --hostfile`), KESTREL_NUM_NODES and KESTREL_NODE_WORKERS (worker ids). The
    /// workers come from one allocation (or one `worker start --group`); --cpus, --gpus and
    /// --mem say what each must have at least. E.g. `kestrel submit --nodes 4 -- sh -c
    /// 'mpirun --hostfile "$KESTREL_NODE_FILE" ./sim'`
    #[arg(long, value_name = "N")]
    pub nodes: Option<u32>,
    /// Higher-priority jobs' tasks are dispatched first (may be negative)
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    pub priority: Option<i32>,
    /// Run a failed task again up to N more times
    #[arg(long, value_name = "N")]
    pub retries: Option<u32>,
    /// Kill a task's whole process group after this long, e.g. 90s, 10m, 2h. Also its
    /// declared length: a worker whose allocation ends sooner is not given it
    /// (`--time-limit` is the same option, as HyperQueue's `--time-request`)
    #[arg(
        long,
        visible_alias = "time-limit",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub timeout: Option<String>,
    /// Where each task's stdout goes: `none`; `stream`, kept by the server with the job (no
    /// file per task; read it with `kestrel job cat`), the first 1M of each task's output, or
    /// up to SIZE with `stream:SIZE` (at most 4M); or a path with placeholders (see below),
    /// relative to the task's directory (`./stream` for a file named so)
    /// [default: job-{job}/{task}.out]. A path without {task} or {line} (all.txt,
    /// by-{line:1}.txt) is shared by the job's tasks and gets each task's output whole, never
    /// two tasks' lines mixed: `kestrel run` writes it afresh in task order when the run ends
    /// (GNU parallel's --keep-order); on a server each task adds its output to the end of the
    /// file as it ends, after what the file held (remove it first to start afresh; a task run
    /// again adds its output again). A file the task leaves empty is removed if its path names
    /// both {job} and {task} (the default does), as no other task can be writing it, and so is
    /// the job's directory of them once the job has ended, if nothing is left in it
    #[arg(long, value_name = "none|stream[:SIZE]|PATH")]
    pub stdout: Option<String>,
    /// Where each task's stderr goes, like --stdout [default: job-{job}/{task}.err]
    #[arg(long, value_name = "none|stream[:SIZE]|PATH")]
    pub stderr: Option<String>,
    /// Directory tasks run in (placeholders allowed) [default: the current directory]
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Set an environment variable for each task (repeat for more); tasks start from the
    /// worker's own environment
    #[arg(long = "env", value_name = "KEY=VALUE")]
    #[serde(default, deserialize_with = "env_entries")]
    pub env: Vec<String>,
    /// Pass this shell's whole environment to the tasks (an activated venv or conda env), like
    /// `sbatch --export=ALL`; --env entries win [in job files: env_all = true]
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub env_all: Option<bool>,
    /// A logical file each task reads, by its name in the store, placeholders allowed (e.g.
    /// raw/{task}.fits; repeat for more). The worker stages it into its cache (from its own
    /// cache, a peer's or the store) before the task starts; the task finds it at
    /// {input:NAME}, {inputs} (all, space-separated) or in KESTREL_INPUTS [in job files:
    /// inputs = [...]]
    #[arg(long = "input", value_name = "NAME")]
    #[serde(default, rename = "inputs")]
    pub input: Vec<String>,
    /// A logical file each task writes into its directory under this name, placeholders
    /// allowed (repeat for more); the worker keeps it in its cache and writes it to the store.
    /// A task that does not write it fails. A task that reads a file another task writes
    /// waits for that task. `local:NAME` keeps it only in the caches (read from there by the
    /// tasks that need it, deleted when the workflow ends; AME's intermediate data);
    /// `persist:NAME` always writes it to the store; plain NAME is local when a task already
    /// submitted (or a later job of the same job file) reads it, else persisted. (`--output`
    /// is the format of what kestrel prints, so this is `--output-file`) [in job files:
    /// outputs = [...]]
    #[arg(long = "output-file", value_name = "NAME")]
    #[serde(default, rename = "outputs")]
    pub output_files: Vec<String>,
    /// A file every task reads (a program, a database), staged like an input but kept in
    /// the worker's cache for the worker's life (never evicted), so fetched once per worker;
    /// it does not steer placement [in job files: inputs_static = [...]]
    #[arg(long = "input-static", value_name = "NAME")]
    #[serde(default, rename = "inputs_static")]
    pub input_static: Vec<String>,
    /// Keep each `local` output on N different workers (the writer's and N-1 copies made as
    /// it finishes), so a worker lost takes no file its readers need: worth it where
    /// re-running the writer is dear (by default the one copy is made again if lost)
    #[arg(long, value_name = "N")]
    pub replicas: Option<u8>,
    /// Start only after these tasks have all finished successfully: JOB (every task of job
    /// JOB) or JOB:TASKS (e.g. 7:1-10); if one fails for good this job's tasks are canceled,
    /// each saying why (repeat for more) [in job files: after = [7, "7:1-10", "NAME"],
    /// NAME an earlier job of the same file]
    #[arg(long, value_name = "JOB[:TASKS]")]
    #[serde(default, deserialize_with = "after_entries")]
    pub after: Vec<String>,
    /// The shared store the job's files are in: a directory on a shared file system or an
    /// http(s):// URL prefix [default: the server's --store]
    #[arg(long, value_name = "DIR|URL")]
    pub store: Option<String>,
    /// How tasks that read files are placed: first-available, first-cache-available,
    /// max-cache-hit, max-compute-util or good-cache-compute (or fa, fca, mch, mcu, gcc)
    /// [default: the server's --policy]
    #[arg(long, value_name = "POLICY")]
    pub policy: Option<String>,
    /// good-cache-compute's threshold: above this fraction of busy cpus tasks wait for the
    /// worker holding their data, below it any free worker takes them [default: the server's]
    #[arg(long, value_name = "FRACTION")]
    pub util_threshold: Option<f64>,
}

impl TaskOptions {
    /// Fills options left unset from `defaults`.
    pub fn or(mut self, defaults: &TaskOptions) -> TaskOptions {
        macro_rules! fill {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = defaults.$f.clone(); } )* };
        }
        fill!(
            name,
            nodes,
            cpus,
            gpus,
            mem,
            priority,
            retries,
            timeout,
            stdout,
            stderr,
            cwd,
            env_all,
            store,
            policy,
            util_threshold,
            replicas
        );
        for (mine, theirs) in [
            (&mut self.resource, &defaults.resource),
            (&mut self.input, &defaults.input),
            (&mut self.output_files, &defaults.output_files),
            (&mut self.input_static, &defaults.input_static),
        ] {
            if mine.is_empty() {
                mine.clone_from(theirs);
            }
        }
        let mut env = defaults.env.clone();
        env.append(&mut self.env);
        self.env = env;
        self
    }

    /// With `--env-all`, puts the submitter's environment under the job's own `--env` entries
    /// (which win). Variables a worker sets for each task are left to the worker.
    pub fn add_env_all(&self, spec: &mut JobSpec) {
        if self.env_all != Some(true) {
            return;
        }
        let own = std::mem::take(&mut spec.template.env);
        let mut env = submitter_env();
        env.retain(|(k, _)| !own.iter().any(|(o, _)| o == k));
        env.extend(own);
        spec.template.env = env;
    }

    /// The job specification for tasks running `argv` (empty for list jobs).
    pub fn spec(&self, argv: Vec<String>, default_name: &str, base_dir: &Path) -> Result<JobSpec> {
        let timeout_ms = match &self.timeout {
            None => None,
            Some(t) => Some(parse_duration(t).context("--timeout")?.as_millis().max(1) as u64),
        };
        let env = self
            .env
            .iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
                _ => Err(anyhow!(
                    "--env {kv:?} must look like KEY=VALUE, e.g. --env OMP_NUM_THREADS=1"
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        let cwd = match &self.cwd {
            Some(c) => absolute(base_dir, c),
            None => base_dir.display().to_string(),
        };
        warn_missing_program(&argv, &cwd);
        let sink = |s: &Option<String>, which: &str, default: &str| match s.as_deref() {
            Some("none") | Some("null") => Ok(Sink::Null),
            Some(p) if p == "stream" || p.starts_with("stream:") => stream_sink(p, which),
            Some(p) => Ok(Sink::File(p.to_string())),
            None => Ok(Sink::File(default.to_string())),
        };
        let cpus = self.cpus.unwrap_or(1);
        if cpus == 0 {
            bail!("--cpus must be at least 1");
        }
        if self.nodes == Some(0) {
            bail!("--nodes must be at least 1 (leave it out for tasks that share a worker)");
        }
        let files = output_modes(TaskFiles {
            inputs: self.input.clone(),
            outputs: self.output_files.clone(),
            statics: self.input_static.clone(),
            keep: Vec::new(),
            replicas: self.replicas.unwrap_or(1),
        });
        // Here too, not only at the server: a job without files does not send `replicas`.
        files.validate().map_err(|e| anyhow!("{e}"))?;
        let spec = JobSpec {
            name: self
                .name
                .clone()
                .unwrap_or_else(|| default_name.to_string()),
            template: TaskTemplate {
                argv,
                env,
                cwd: Some(cwd),
                stdout: sink(&self.stdout, "stdout", DEFAULT_STDOUT)?,
                stderr: sink(&self.stderr, "stderr", DEFAULT_STDERR)?,
                timeout_ms,
                files,
                kind: Default::default(),
            },
            resources: Resources {
                cpus,
                gpus: self.gpus.unwrap_or(0),
                mem: match &self.mem {
                    Some(m) => parse_size(m).with_context(|| format!("--mem {m:?}"))?,
                    None => 0,
                },
                ..Resources::NONE
            },
            priority: self.priority.unwrap_or(0),
            retries: self.retries.unwrap_or(0),
            named: parse_named(&self.resource)?,
            placement: Placement {
                store: match &self.store {
                    Some(s) => Some(store_location(base_dir, s)?),
                    None => None,
                },
                policy: match &self.policy {
                    Some(p) => Some(parse_policy(p)?),
                    None => None,
                },
                util_threshold_permille: match self.util_threshold {
                    Some(t) => Some(util_threshold(t)?),
                    None => None,
                },
            },
            after: self
                .after
                .iter()
                .filter(|a| !is_earlier_job(a))
                .map(|a| After::parse(a).map_err(|e| anyhow!(e)))
                .collect::<Result<_>>()?,
            parent: None,
            nodes: self.nodes.unwrap_or(0),
            deps: Vec::new(),
            task_ids: None,
        };
        // What the server checks too, said before anything is sent (--nodes with files).
        spec.validate_spec().map_err(|e| anyhow!("{e}"))?;
        Ok(spec)
    }
}

/// Says at once, on stderr, when the program is a path (`./sim`, `bin/sim`) that does not
/// exist where the tasks will run it: a typo then fails every task only once they run. A
/// warning, not a refusal: an earlier job may build it, or the workers see another file system.
fn warn_missing_program(argv: &[String], cwd: &str) {
    let Some(program) = argv.first() else {
        return;
    };
    if !program.contains('/') || program.contains('{') {
        return;
    }
    let path = Path::new(cwd).join(program);
    if !path.exists() {
        crate::output::note(&format!(
            "warning: {program} does not exist in {cwd}: the tasks fail unless it is there when they run; check the path"
        ));
    }
}

/// Whether an `after` entry names an earlier job of the same job file (by its name) rather
/// than a job id.
pub fn is_earlier_job(entry: &str) -> bool {
    entry
        .split(':')
        .next()
        .is_some_and(|j| !j.is_empty() && !j.trim().bytes().all(|b| b.is_ascii_digit()))
}

/// Takes `local:` and `persist:` off output names into the files' modes.
fn output_modes(mut files: TaskFiles) -> TaskFiles {
    let mut keep = Vec::with_capacity(files.outputs.len());
    for name in &mut files.outputs {
        let (mode, rest) = match name.split_once(':') {
            Some(("local", rest)) => (Keep::Local, rest.to_string()),
            Some(("persist", rest)) => (Keep::Persist, rest.to_string()),
            _ => (Keep::Auto, name.clone()),
        };
        *name = rest;
        keep.push(mode);
    }
    if keep.iter().any(|k| *k != Keep::Auto) {
        files.keep = keep;
    }
    files
}

/// `after = [7, "7:1-10", "prep"]`: numbers or strings.
fn after_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Entry {
        Id(u32),
        Text(String),
    }
    Ok(Vec::<Entry>::deserialize(d)?
        .into_iter()
        .map(|e| match e {
            Entry::Id(n) => n.to_string(),
            Entry::Text(t) => t,
        })
        .collect())
}

/// The policy named `text`, or an error listing the names.
pub fn parse_policy(text: &str) -> Result<PolicyName> {
    PolicyName::parse(text).ok_or_else(|| {
        let names: Vec<&str> = PolicyName::ALL.iter().map(|p| p.name()).collect();
        anyhow!(
            "--policy {text:?} is not a policy; use one of {} (or fa, fca, mch, mcu, gcc)",
            names.join(", ")
        )
    })
}

/// A utilisation threshold given as a fraction, in thousandths.
pub fn util_threshold(fraction: f64) -> Result<u16> {
    if !(0.0..=1.0).contains(&fraction) {
        bail!("--util-threshold {fraction} must be a fraction from 0 to 1, e.g. 0.9");
    }
    Ok((fraction * 1000.0).round() as u16)
}

/// A store as the workers will reach it: an http(s):// URL as given, a directory made
/// absolute against `base_dir` (workers do not share the submitter's directory).
pub fn store_location(base_dir: &Path, text: &str) -> Result<String> {
    let lower = text.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Ok(text.trim_end_matches('/').to_string() + "/");
    }
    if lower.contains("://") {
        bail!("--store {text:?}: a store is a directory or an http:// or https:// URL prefix");
    }
    Ok(absolute(base_dir, text))
}

/// `NAME=N` pairs of named resources, e.g. `licenses=1`, summed per name.
pub fn parse_named(entries: &[String]) -> Result<Vec<(String, u32)>> {
    let mut out: Vec<(String, u32)> = Vec::new();
    for e in entries {
        let (name, n) = e
            .split_once('=')
            .ok_or_else(|| anyhow!("--resource {e:?} must look like NAME=N, e.g. licenses=1"))?;
        let name = name.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            bail!("--resource {e:?}: a name is letters, digits, '_', '-' or '.', e.g. licenses=1");
        }
        let n: u32 = n
            .trim()
            .parse()
            .map_err(|_| anyhow!("--resource {e:?}: {n:?} is not a whole number"))?;
        match out.iter_mut().find(|(k, _)| k == name) {
            Some((_, total)) => *total = total.saturating_add(n),
            None => out.push((name.to_string(), n)),
        }
    }
    Ok(out)
}

/// `NAME=N` strings from a TOML table `{ licenses = 1 }` or a list `["licenses=1"]`.
fn resource_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Named {
        Table(std::collections::BTreeMap<String, u32>),
        List(Vec<String>),
    }
    Ok(match Named::deserialize(d)? {
        Named::Table(t) => t.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        Named::List(l) => l,
    })
}

/// Variables a worker sets for each task itself: `--env-all` leaves them out, or a task would
/// see the submitter's (a task submitting tasks would pass on its own job and task ids).
const PER_TASK_VARIABLES: [&str; 6] = [
    "KESTREL_JOB_ID",
    "KESTREL_TASK_ID",
    "KESTREL_WORKER_ID",
    "KESTREL_SERVER",
    "KESTREL_SERVER_DIR",
    "CUDA_VISIBLE_DEVICES",
];

/// This process's environment for `--env-all`, sorted by name, without [`PER_TASK_VARIABLES`].
fn submitter_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| match (k.into_string(), v.into_string()) {
            (Ok(k), Ok(v)) => Some((k, v)),
            (k, _) => {
                let name = k.unwrap_or_else(|k| k.to_string_lossy().into_owned());
                eprintln!("warning: --env-all: {name} is not valid UTF-8 and is not passed; set it with --env if the tasks need it");
                None
            }
        })
        .filter(|(k, _)| !PER_TASK_VARIABLES.contains(&k.as_str()))
        .collect();
    env.sort();
    env
}

/// `stream` or `stream:SIZE` (of `--stdout`/`--stderr`).
fn stream_sink(text: &str, which: &str) -> Result<Sink> {
    let limit = match text.strip_prefix("stream:") {
        None => DEFAULT_STREAM_LIMIT as u64,
        Some(size) => parse_size(size).with_context(|| format!("--{which} {text}"))?,
    };
    match u32::try_from(limit) {
        Ok(limit) if limit <= MAX_STREAM_LIMIT => Ok(Sink::Stream { limit }),
        _ => bail!(
            "--{which} {text}: a task's streamed output keeps at most 4M; write bigger outputs to files (--{which} PATH)"
        ),
    }
}

/// `KEY=VALUE` strings from a TOML table `{ KEY = "VALUE" }` or a list `["KEY=VALUE"]`.
fn env_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Env {
        Table(std::collections::BTreeMap<String, String>),
        List(Vec<String>),
    }
    Ok(match Env::deserialize(d)? {
        Env::Table(t) => t.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        Env::List(l) => l,
    })
}

/// Parses `500ms`, `30s`, `10m`, `2h`, `1d`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs > 0.0 {
            return Ok(std::time::Duration::from_secs_f64(secs));
        }
        bail!("{s:?}: a duration must be positive; write e.g. 500ms, 30s, 10m or 2h");
    }
    // humantime's own reasons ("expected number at 0") say little to a person.
    humantime::parse_duration(s)
        .map_err(|_| anyhow!("{s:?} is not a duration; write e.g. 500ms, 30s, 10m or 2h"))
}

/// A size in bytes: `4096`, `64K`, `512M`, `2G` (powers of 1024; a trailing `B`/`iB` is fine).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.trim_end_matches("IB").trim_end_matches('B');
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow!("{s:?} is not a size; write e.g. 4096, 64K, 512M or 2G"))?;
    n.checked_mul(mult)
        .filter(|&b| b > 0)
        .ok_or_else(|| anyhow!("{s:?} is not a usable size; write e.g. 64K, 512M or 2G"))
}

fn absolute(base: &Path, p: &str) -> String {
    let path = Path::new(p);
    if path.is_absolute() {
        p.to_string()
    } else {
        base.join(path).display().to_string()
    }
}

/// The program name of an argv, for default job names.
pub fn program_name(argv: &[String]) -> String {
    argv.first()
        .map(|p| {
            Path::new(p)
                .file_name()
                .map_or(p.clone(), |f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "job".into())
}

pub use kestrel_client::Submission;

/// How the tasks of a job from the command line are given.
pub struct TaskShape<'a> {
    pub array: Option<&'a str>,
    pub each: Option<&'a Path>,
}

/// Refuses `--after NAME` on the command line: names of earlier jobs mean something only in a
/// job file (which resolves them), and [`TaskOptions::spec`] leaves them out.
pub fn check_after_flags(opts: &TaskOptions) -> Result<()> {
    match opts.after.iter().find(|a| is_earlier_job(a)) {
        Some(a) => bail!("--after {a}: give a job id, JOB or JOB:TASKS (e.g. 7 or 7:1-10); jobs go by name only in job files (`after = [\"prep\"]`)"),
        None => Ok(()),
    }
}

/// Builds the job for `kestrel submit`/`kestrel run` flags.
pub fn from_flags(
    opts: &TaskOptions,
    shape: TaskShape<'_>,
    argv: Vec<String>,
    base_dir: &Path,
) -> Result<Submission> {
    if argv.is_empty() {
        bail!("no command given: put the program and its arguments after `--`, e.g. `kestrel submit --array 1-10 -- ./sim --seed {{task}}`");
    }
    let name = program_name(&argv);
    match (shape.array, shape.each) {
        (Some(_), Some(_)) => bail!("--array and --each cannot be combined; pick one"),
        (None, Some(file)) => {
            let mut spec = opts.spec(argv, &name, base_dir)?;
            placeholders::check_template(&spec.template, true)?;
            if !placeholders::uses_line(&spec.template) {
                eprintln!("warning: --each: {{line}} appears nowhere in the command, paths, files or --env values, so every task runs the same command; put {{line}} where each task's line goes (GNU parallel's {{}} is {{line}} here)");
            }
            opts.add_env_all(&mut spec);
            let fields = placeholders::fields_needed(&spec.template);
            let lines = each_lines(file, sizes::task_room(&spec)?, fields)?;
            Ok(Submission::new(spec, TaskSet::Lines(lines)))
        }
        (array, None) => {
            let ids = match array {
                Some(a) => IdRanges::parse(a).map_err(|e| anyhow!("--array {a:?}: {e}"))?,
                None => IdRanges::span(0, 0),
            };
            let mut spec = opts.spec(argv, &name, base_dir)?;
            placeholders::check_template(&spec.template, false)?;
            opts.add_env_all(&mut spec);
            sizes::task_room(&spec)?;
            Ok(Submission::new(spec, TaskSet::Array(ids)))
        }
    }
}

/// Where `--each` reads: a file, or standard input for `-`.
fn each_source(file: &Path) -> (String, bool) {
    if file == Path::new("-") {
        ("standard input".into(), true)
    } else {
        (format!("file {}", file.display()), false)
    }
}

/// Reads the text of an `--each` file (or standard input), saying what to do when it cannot.
fn read_each(file: &Path) -> Result<Vec<u8>> {
    use std::io::{IsTerminal, Read};
    let (what, stdin) = each_source(file);
    if stdin {
        if std::io::stdin().is_terminal() {
            eprintln!("reading one input per line from the terminal; end with Ctrl-D");
        }
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read --each {what}"))?;
        return Ok(bytes);
    }
    if file.is_dir() {
        bail!("--each {what} is a directory; give a file with one input per line (e.g. `ls {} > inputs.txt`)", file.display());
    }
    std::fs::read(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow!(
            "--each {what} does not exist; give a file with one input per line, or - to read them from standard input"
        ),
        _ => anyhow!("cannot read --each {what}: {e}"),
    })
}

/// One task per non-blank line of `file`; each line must fit in `room` bytes and have at least
/// `fields` whitespace-separated fields (the highest `{line:N}` used).
fn each_lines(file: &Path, room: usize, fields: usize) -> Result<LineList> {
    let (what, _) = each_source(file);
    let bytes = read_each(file)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        let line = bytes[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count() + 1;
        anyhow!("--each {what} is not text (line {line} is not UTF-8; is it a binary file?); give a text file with one input per line")
    })?;
    let mut lines = LineList::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if line.contains('\0') {
            bail!("--each {what}: line {} holds a NUL byte, which no command line can carry (is it a binary file?); give a text file with one input per line", n + 1);
        }
        sizes::check_task(
            &format!("line {} of --each {what}", n + 1),
            sizes::string_bytes(line),
            room,
        )?;
        let has = line.split_whitespace().count();
        if has < fields {
            bail!(
                "--each {what}: line {} ({:?}) has {} but {{line:{fields}}} needs {fields}; give every line at least {fields} whitespace-separated fields, or remove that line",
                n + 1,
                line,
                output::plural(has as u64, "field"),
            );
        }
        lines.push(line);
    }
    if lines.is_empty() {
        bail!("--each {what} has no non-empty lines, so there would be no tasks; give one input per line");
    }
    Ok(lines)
}

/// A command in a job file: a list of words, or a string split like a shell would.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum CommandLine {
    Words(Vec<String>),
    Line(String),
}

impl CommandLine {
    fn words(&self) -> Result<Vec<String>> {
        match self {
            CommandLine::Words(w) => Ok(w.clone()),
            CommandLine::Line(l) => {
                shlex::split(l).ok_or_else(|| anyhow!("cannot split {l:?}: unbalanced quotes"))
            }
        }
    }
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct JobFile {
    #[serde(default)]
    defaults: TaskOptions,
    #[serde(default)]
    job: Vec<JobEntry>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct JobEntry {
    array: Option<String>,
    command: Option<CommandLine>,
    tasks: Option<Vec<CommandLine>>,
    each: Option<PathBuf>,
    name: Option<String>,
    nodes: Option<u32>,
    cpus: Option<u32>,
    gpus: Option<u32>,
    mem: Option<String>,
    #[serde(default, deserialize_with = "resource_entries")]
    resources: Vec<String>,
    priority: Option<i32>,
    retries: Option<u32>,
    timeout: Option<String>,
    stdout: Option<String>,
    stderr: Option<String>,
    cwd: Option<String>,
    #[serde(default, deserialize_with = "env_entries")]
    env: Vec<String>,
    env_all: Option<bool>,
    #[serde(default)]
    inputs: Vec<String>,
    #[serde(default)]
    outputs: Vec<String>,
    #[serde(default)]
    inputs_static: Vec<String>,
    #[serde(default, deserialize_with = "after_entries")]
    after: Vec<String>,
    store: Option<String>,
    policy: Option<String>,
    util_threshold: Option<f64>,
    replicas: Option<u8>,
    /// Its tasks one by one (`[[job.task]]`), as HyperQueue's job files give them.
    #[serde(default)]
    task: Vec<TaskEntry>,
}

/// One task of a job given task by task: `[[job.task]] id = 3 command = "..." deps = [1, 2]`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct TaskEntry {
    /// Its id (all of a job's tasks have one, or none: then 0, 1, 2, ... in order).
    id: Option<u32>,
    command: CommandLine,
    /// Tasks it waits for: ids of its job's tasks, `"NAME:ID"` of an earlier job of the file,
    /// `"JOB:ID"` of a job submitted before.
    #[serde(default, deserialize_with = "after_entries")]
    deps: Vec<String>,
}

/// A dependency on a task of an earlier job of the same file, by the job's name: its
/// `spec.deps` entry and place in `on`, to be given the job's id once it is submitted.
struct NamedDep {
    dep: usize,
    on: usize,
    name: String,
    task: u32,
    /// The dependency as written, for messages.
    text: String,
}

/// Reads a TOML job file: `[defaults]` options and one `[[job]]` table per job.
pub fn from_file(path: &Path) -> Result<Vec<Submission>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read job file {}", path.display()))?;
    let file: JobFile = toml::from_str(&text).map_err(|e| {
        // One line: toml's Display adds a multi-line source excerpt; keep the line number.
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                format!(" at line {line}")
            })
            .unwrap_or_default();
        let msg = e.message().trim().replace('\n', "; ");
        anyhow!("job file {} is not valid{at}: {msg}", path.display())
    })?;
    if file.job.is_empty() {
        bail!(
            "job file {} has no [[job]] entries; see `kestrel submit --help`",
            path.display()
        );
    }
    if !file.defaults.after.is_empty() {
        bail!(
            "job file {}: `after` goes in a [[job]], not in [defaults] (each job waits for its own)",
            path.display()
        );
    }
    // Relative paths in a job file are relative to the file.
    let base = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf());
    let mut subs: Vec<Submission> = Vec::with_capacity(file.job.len());
    for (i, e) in file.job.into_iter().enumerate() {
        let after = e.after.clone();
        let at = || format!("job file {}, job #{}", path.display(), i + 1);
        let (mut sub, named) = entry(e, &file.defaults, &base).with_context(at)?;
        for n in named {
            let Some(pos) = subs.iter().position(|s| s.spec.name == n.name) else {
                return Err(anyhow!(
                    "deps = [{:?}]: no job named {:?} comes before it in the file (a job's name is its `name`, else its program's)",
                    n.text,
                    n.name
                ))
                .with_context(at);
            };
            let earlier = &subs[pos];
            if !has_task(earlier, n.task) {
                return Err(anyhow!(
                    "deps = [{:?}]: job {:?} (job #{} of the file) has no task {}",
                    n.text,
                    n.name,
                    pos + 1,
                    n.task
                ))
                .with_context(at);
            }
            sub.earlier_tasks.push((n.dep, n.on, pos));
        }
        for a in after.iter().filter(|a| is_earlier_job(a)) {
            let (name, tasks) = match a.split_once(':') {
                Some((n, t)) => (n, Some(t)),
                None => (a.as_str(), None),
            };
            let Some(pos) = subs.iter().position(|s| s.spec.name == name) else {
                return Err(anyhow!(
                    "after = [{a:?}]: no job named {name:?} comes before it in the file (a job's name is its `name`, else its program's)"
                ))
                .with_context(at);
            };
            let tasks = tasks
                .map(|t| IdRanges::parse(t).map_err(|e| anyhow!("after = [{a:?}]: {e}")))
                .transpose()
                .with_context(at)?;
            sub.earlier.push((pos, tasks));
        }
        subs.push(sub);
    }
    crate::graph_file::check(&mut subs).with_context(|| format!("job file {}", path.display()))?;
    Ok(subs)
}

/// Whether submission `sub` has a task of id `id`.
fn has_task(sub: &Submission, id: u32) -> bool {
    match (&sub.spec.task_ids, &sub.tasks) {
        (Some(ids), _) | (None, TaskSet::Array(ids)) => ids.index_of(id).is_some(),
        (None, tasks) => id < tasks.len(),
    }
}

/// The job of `argvs`, one task each: a list job, its command lines checked (`what(i)` names
/// the `i`th in messages).
fn list_job(
    opts: &TaskOptions,
    argvs: Vec<Vec<String>>,
    base: &Path,
    what: impl Fn(usize) -> String,
) -> Result<(JobSpec, TaskSet)> {
    let name = argvs
        .first()
        .map(|a| program_name(a))
        .unwrap_or_else(|| "job".into());
    let mut spec = opts.spec(Vec::new(), &name, base)?;
    placeholders::check_template(&spec.template, false)?;
    for (i, argv) in argvs.iter().enumerate() {
        for arg in argv {
            placeholders::check(arg, &what(i), false)?;
        }
    }
    opts.add_env_all(&mut spec);
    let room = sizes::task_room(&spec)?;
    for (i, argv) in argvs.iter().enumerate() {
        sizes::check_task(&what(i), sizes::argv_bytes(argv), room)?;
    }
    Ok((spec, TaskSet::List(argvs)))
}

/// A job given task by task (`[[job.task]]`): its tasks in the order of their ids, those ids
/// when they are not 0, 1, 2, ..., and their `deps`, those on earlier jobs of the file by name
/// returned apart.
fn task_tables(
    opts: &TaskOptions,
    tables: Vec<TaskEntry>,
    base: &Path,
) -> Result<(Submission, Vec<NamedDep>)> {
    let n = tables.len();
    let given = tables.iter().filter(|t| t.id.is_some()).count();
    if given != 0 && given != n {
        bail!("give every [[job.task]] an `id`, or none (they are then numbered 0, 1, 2, ... in order)");
    }
    let mut tables: Vec<(u32, TaskEntry)> = tables
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t.id.unwrap_or(i as u32), t))
        .collect();
    tables.sort_by_key(|(id, _)| *id);
    if let Some(w) = tables.windows(2).find(|w| w[0].0 == w[1].0) {
        bail!("two [[job.task]] have id {}; give each its own", w[0].0);
    }
    let argvs = tables
        .iter()
        .map(|(id, t)| t.command.words().with_context(|| format!("task {id}")))
        .collect::<Result<Vec<_>>>()?;
    let ids: Vec<u32> = tables.iter().map(|(id, _)| *id).collect();
    let (mut spec, tasks) = list_job(opts, argvs, base, |i| format!("task {}", ids[i]))?;
    if ids.iter().enumerate().any(|(i, &id)| id != i as u32) {
        let text: Vec<String> = ids.iter().map(u32::to_string).collect();
        spec.task_ids = Some(IdRanges::parse(&text.join(","))?);
    }
    let mut named = Vec::new();
    for (id, t) in tables.iter().filter(|(_, t)| !t.deps.is_empty()) {
        let mut on = Vec::with_capacity(t.deps.len());
        for text in &t.deps {
            let (job, task) = parse_dep(text).with_context(|| format!("task {id}"))?;
            match job {
                DepJob::Same => on.push(TaskRef { job: None, task }),
                DepJob::Id(j) => on.push(TaskRef { job: Some(j), task }),
                DepJob::Named(name) => {
                    named.push(NamedDep {
                        dep: spec.deps.len(),
                        on: on.len(),
                        name,
                        task,
                        text: text.clone(),
                    });
                    // Named once the earlier job is submitted (see `Submission::earlier_tasks`).
                    on.push(TaskRef { job: None, task });
                }
            }
        }
        spec.deps.push(TaskDeps { task: *id, on });
    }
    spec.validate(&tasks).map_err(|e| anyhow!("{e}"))?;
    Ok((Submission::new(spec, tasks), named))
}

/// The job a `deps` entry names: the task's own, one by its id, or an earlier one of the file
/// by its name.
enum DepJob {
    Same,
    Id(u32),
    Named(String),
}

/// A `deps` entry: `3` (a task of the same job), `"prep:1"` (of the file's earlier job named
/// prep) or `"7:1"` (of job 7).
fn parse_dep(text: &str) -> Result<(DepJob, u32)> {
    let bad = || {
        anyhow!(
            "deps = [{text:?}]: give the id of a task of this job (3), or JOB:ID for a task of another: an earlier job of the file by its name (\"prep:1\") or a job id (\"7:1\")"
        )
    };
    let (job, task) = match text.rsplit_once(':') {
        Some((j, t)) => (Some(j.trim()), t),
        None => (None, text),
    };
    let task: u32 = task.trim().parse().map_err(|_| bad())?;
    let job = match job {
        None => DepJob::Same,
        Some("") => return Err(bad()),
        Some(j) if j.bytes().all(|b| b.is_ascii_digit()) => {
            DepJob::Id(j.parse().map_err(|_| bad())?)
        }
        Some(j) => DepJob::Named(j.to_string()),
    };
    Ok((job, task))
}

fn entry(e: JobEntry, defaults: &TaskOptions, base: &Path) -> Result<(Submission, Vec<NamedDep>)> {
    let opts = TaskOptions {
        name: e.name,
        nodes: e.nodes,
        cpus: e.cpus,
        gpus: e.gpus,
        mem: e.mem,
        resource: e.resources,
        priority: e.priority,
        retries: e.retries,
        timeout: e.timeout,
        stdout: e.stdout,
        stderr: e.stderr,
        cwd: e.cwd,
        env: e.env,
        env_all: e.env_all,
        input: e.inputs,
        output_files: e.outputs,
        input_static: e.inputs_static,
        after: e.after,
        store: e.store,
        policy: e.policy,
        util_threshold: e.util_threshold,
        replicas: e.replicas,
    }
    .or(defaults);
    if !e.task.is_empty() {
        if e.command.is_some() || e.tasks.is_some() || e.array.is_some() || e.each.is_some() {
            bail!("a job of [[job.task]] tables takes no `command`, `tasks`, `array` or `each`: each task has its own command");
        }
        return task_tables(&opts, e.task, base);
    }
    let sub = match (e.command, e.tasks) {
        (Some(_), Some(_)) => {
            bail!("give either `command` (with `array` or `each`) or `tasks`, not both")
        }
        (None, None) => {
            bail!("a job needs `command` (with `array` or `each`), `tasks`, or [[job.task]] tables")
        }
        (None, Some(tasks)) => {
            if e.array.is_some() || e.each.is_some() {
                bail!("`array` and `each` go with `command`, not with `tasks`");
            }
            let argvs = tasks
                .iter()
                .map(CommandLine::words)
                .collect::<Result<Vec<_>>>()?;
            let (spec, tasks) = list_job(&opts, argvs, base, |i| format!("task {i} of `tasks`"))?;
            spec.validate(&tasks).map_err(|e| anyhow!("{e}"))?;
            Submission::new(spec, tasks)
        }
        (Some(cmd), None) => {
            // `each = "-"` reads standard input, like the flag.
            let each = e.each.map(|p| {
                if p.is_relative() && p != Path::new("-") {
                    base.join(p)
                } else {
                    p
                }
            });
            let shape = TaskShape {
                array: e.array.as_deref(),
                each: each.as_deref(),
            };
            from_flags(&opts, shape, cmd.words()?, base)?
        }
    };
    Ok((sub, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("512mb").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert!(parse_size("lots").unwrap_err().to_string().contains("64K"));
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn flags_make_an_array_job() {
        let opts = TaskOptions {
            cpus: Some(2),
            timeout: Some("1m".into()),
            stdout: Some("none".into()),
            env: vec!["A=1".into()],
            ..Default::default()
        };
        let argv = vec!["/bin/echo".to_string(), "{task}".to_string()];
        let s = from_flags(
            &opts,
            TaskShape {
                array: Some("1-10"),
                each: None,
            },
            argv,
            Path::new("/w"),
        )
        .unwrap();
        assert_eq!(s.tasks.len(), 10);
        assert_eq!(s.spec.name, "echo");
        assert_eq!(s.spec.resources.cpus, 2);
        assert_eq!(s.spec.template.timeout_ms, Some(60_000));
        assert_eq!(s.spec.template.stdout, Sink::Null);
        assert_eq!(
            s.spec.template.stderr,
            Sink::File("job-{job}/{task}.err".into())
        );
        assert_eq!(s.spec.template.cwd.as_deref(), Some("/w"));
        assert_eq!(
            s.spec.template.env,
            vec![("A".to_string(), "1".to_string())]
        );
    }

    #[test]
    fn stream_sinks_take_a_limit() {
        let spec = |out: &str, err: &str| {
            TaskOptions {
                stdout: Some(out.into()),
                stderr: Some(err.into()),
                ..Default::default()
            }
            .spec(vec!["x".into()], "x", Path::new("/"))
        };
        let s = spec("stream", "stream:64K").unwrap();
        assert_eq!(s.template.stdout, Sink::Stream { limit: 1 << 20 });
        assert_eq!(s.template.stderr, Sink::Stream { limit: 64 << 10 });
        assert_eq!(
            spec("./stream", "none").unwrap().template.stdout,
            Sink::File("./stream".into())
        );
        let e = format!("{:#}", spec("stream:5M", "none").unwrap_err());
        assert!(e.contains("at most 4M"), "{e}");
        let e = format!("{:#}", spec("none", "stream:lots").unwrap_err());
        assert!(
            e.contains("--stderr stream:lots") && e.contains("64K"),
            "{e}"
        );
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        let argv = || vec!["x".to_string()];
        let arr = |a| TaskShape {
            array: Some(a),
            each: None,
        };
        let e =
            from_flags(&TaskOptions::default(), arr("5-1"), argv(), Path::new("/")).unwrap_err();
        assert!(format!("{e:#}").contains("backwards"), "{e:#}");
        let e =
            from_flags(&TaskOptions::default(), arr("1-3"), vec![], Path::new("/")).unwrap_err();
        assert!(format!("{e:#}").contains("after `--`"), "{e:#}");
        let opts = TaskOptions {
            env: vec!["NOEQUALS".into()],
            ..Default::default()
        };
        let e = from_flags(&opts, arr("1"), argv(), Path::new("/")).unwrap_err();
        assert!(format!("{e:#}").contains("KEY=VALUE"), "{e:#}");
        let opts = TaskOptions {
            timeout: Some("soon".into()),
            ..Default::default()
        };
        assert!(from_flags(&opts, arr("1"), argv(), Path::new("/")).is_err());
    }

    #[test]
    fn each_makes_one_task_per_line() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("inputs.txt");
        std::fs::write(&f, "a.fits\n\nb.fits\n").unwrap();
        let argv = vec![
            "proc".to_string(),
            "{line}".to_string(),
            "{task}".to_string(),
        ];
        let s = from_flags(
            &TaskOptions::default(),
            TaskShape {
                array: None,
                each: Some(&f),
            },
            argv,
            dir.path(),
        )
        .unwrap();
        // The lines alone are kept; the worker puts each into the template.
        assert_eq!(
            s.tasks,
            TaskSet::Lines(["a.fits", "b.fits"].into_iter().collect())
        );
        assert_eq!(s.spec.template.argv, vec!["proc", "{line}", "{task}"]);
    }

    #[test]
    fn job_files_take_defaults_arrays_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("jobs.toml");
        std::fs::write(
            &f,
            r#"
[defaults]
retries = 2
stdout = "none"
env = { MODE = "fast" }

[[job]]
name = "sim"
array = "1-100"
command = ["./sim", "--seed", "{task}"]
cpus = 2

[[job]]
tasks = ["./post 'a b'", ["./post", "c"]]
retries = 0
"#,
        )
        .unwrap();
        let jobs = from_file(&f).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].spec.name, "sim");
        assert_eq!(jobs[0].spec.retries, 2);
        assert_eq!(jobs[0].spec.resources.cpus, 2);
        assert_eq!(jobs[0].tasks.len(), 100);
        assert_eq!(jobs[1].spec.retries, 0);
        assert_eq!(jobs[1].spec.name, "post");
        match &jobs[1].tasks {
            TaskSet::List(l) => assert_eq!(l[0], vec!["./post", "a b"]),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            jobs[1].spec.template.env,
            vec![("MODE".to_string(), "fast".to_string())]
        );
    }

    #[test]
    fn env_all_puts_the_submitters_environment_under_the_jobs_own() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("jobs.toml");
        std::fs::write(
            &f,
            "[defaults]\nenv_all = true\nenv = { PATH = \"/mine\" }\n\n[[job]]\ncommand = \"true\"\n\n[[job]]\ncommand = \"true\"\nenv_all = false\n",
        )
        .unwrap();
        let jobs = from_file(&f).unwrap();
        let env = &jobs[0].spec.template.env;
        // The job's own entry wins over the submitter's PATH, and comes once.
        assert_eq!(env.iter().filter(|(k, _)| k == "PATH").count(), 1);
        assert_eq!(env.last(), Some(&("PATH".to_string(), "/mine".to_string())));
        assert!(env.len() > 1, "the submitter's environment: {env:?}");
        assert!(env
            .iter()
            .all(|(k, _)| !PER_TASK_VARIABLES.contains(&k.as_str())));
        assert_eq!(
            jobs[1].spec.template.env,
            vec![("PATH".into(), "/mine".into())]
        );
    }

    #[test]
    fn job_files_give_tasks_one_by_one_with_ids_and_deps() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("hq.toml");
        std::fs::write(
            &f,
            r#"
[[job]]
name = "prep"
array = "1-2"
command = "./prep {task}"

[[job]]
name = "pipe"
[[job.task]]
id = 5
command = ["./merge"]
deps = [1, 3]
[[job.task]]
id = 1
command = "./a"
[[job.task]]
id = 3
command = "./b"
deps = ["prep:2", "7:4"]
"#,
        )
        .unwrap();
        let jobs = from_file(&f).unwrap();
        let pipe = &jobs[1];
        // In the order of their ids, which are not their positions.
        assert_eq!(
            pipe.tasks,
            TaskSet::List(vec![
                vec!["./a".into()],
                vec!["./b".into()],
                vec!["./merge".into()]
            ])
        );
        assert_eq!(pipe.spec.task_ids, Some(IdRanges::parse("1,3,5").unwrap()));
        let same = |task| TaskRef { job: None, task };
        assert_eq!(
            pipe.spec.deps,
            vec![
                TaskDeps {
                    task: 3,
                    // prep's id is filled in once it is submitted.
                    on: vec![
                        same(2),
                        TaskRef {
                            job: Some(7),
                            task: 4
                        }
                    ],
                },
                TaskDeps {
                    task: 5,
                    on: vec![same(1), same(3)],
                },
            ]
        );
        assert_eq!(pipe.earlier_tasks, vec![(0, 0, 0)]);
        // Without ids, they are 0, 1, 2, ... in order.
        std::fs::write(
            &f,
            "[[job]]\n[[job.task]]\ncommand = \"a\"\n[[job.task]]\ncommand = \"b\"\ndeps = [0]\n",
        )
        .unwrap();
        let jobs = from_file(&f).unwrap();
        assert_eq!(jobs[0].spec.task_ids, None);
        assert_eq!(jobs[0].spec.deps[0].task, 1);
    }

    #[test]
    fn task_table_mistakes_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("bad.toml");
        let err = |text: &str| {
            std::fs::write(&f, text).unwrap();
            format!("{:#}", from_file(&f).unwrap_err())
        };
        let e =
            err("[[job]]\n[[job.task]]\nid = 1\ncommand = \"a\"\n[[job.task]]\ncommand = \"b\"\n");
        assert!(
            e.contains("give every [[job.task]] an `id`, or none"),
            "{e}"
        );
        let e = err("[[job]]\n[[job.task]]\nid = 1\ncommand = \"a\"\n[[job.task]]\nid = 1\ncommand = \"b\"\n");
        assert!(
            e.contains("two [[job.task]] have id 1; give each its own"),
            "{e}"
        );
        let e = err("[[job]]\n[[job.task]]\ncommand = \"a\"\ndeps = [\"x\"]\n");
        assert!(
            e.contains("task 0: deps = [\"x\"]: give the id of a task of this job"),
            "{e}"
        );
        let e = err("[[job]]\n[[job.task]]\ncommand = \"a\"\ndeps = [\"later:1\"]\n\n[[job]]\nname = \"later\"\ncommand = \"b\"\n");
        assert!(
            e.contains(
                "job #1: deps = [\"later:1\"]: no job named \"later\" comes before it in the file"
            ),
            "{e}"
        );
        let e = err("[[job]]\nname = \"p\"\narray = \"1-2\"\ncommand = \"a\"\n\n[[job]]\n[[job.task]]\ncommand = \"b\"\ndeps = [\"p:9\"]\n");
        assert!(
            e.contains("job #2: deps = [\"p:9\"]: job \"p\" (job #1 of the file) has no task 9"),
            "{e}"
        );
        let e = err("[[job]]\ncommand = \"a\"\n[[job.task]]\ncommand = \"b\"\n");
        assert!(e.contains("takes no `command`"), "{e}");
    }

    #[test]
    fn job_file_mistakes_name_the_file_and_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("bad.toml");
        std::fs::write(&f, "[[job]]\narray = \"1-3\"\ncommand = \"x\"\ncpu = 2\n").unwrap();
        let e = format!("{:#}", from_file(&f).unwrap_err());
        assert!(e.contains("bad.toml") && e.contains("cpu"), "{e}");
        std::fs::write(&f, "[[job]]\narray = \"1-3\"\n").unwrap();
        let e = format!("{:#}", from_file(&f).unwrap_err());
        assert!(e.contains("job #1") && e.contains("needs `command`"), "{e}");
    }
}
