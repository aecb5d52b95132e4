//! A scenario: the simulated cluster, store, scheduler settings, workload and failures, read
//! from TOML, with any number of runs that each change some of it.
//!
//! A run is the top-level document with its own `[[runs]]` entry laid over it, key by key
//! (`[runs.scheduler] policy = "fa"` changes only the policy). Every merged run is then
//! checked whole, so an unknown key or an impossible value is refused naming the run, the key
//! and what is allowed.

use crate::units::{Bandwidth, Bytes, Span};
use kestrel_core::PolicyName;
use serde::{de, Deserialize, Deserializer};
use std::path::{Path, PathBuf};

/// One run's whole setting.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    /// The run's name (`[[runs]] name`; `main` for a document without runs).
    #[serde(skip)]
    pub name: String,
    /// What the scenario reproduces, for the report.
    #[serde(default)]
    pub description: Option<String>,
    /// The seed of every random choice (file picks, task lengths, failures); `--seed`
    /// replaces it.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Simulated time after which a run that has not ended stops and says why.
    #[serde(default = "default_time_limit")]
    pub time_limit: Span,
    /// How often the timeline samples the cluster.
    #[serde(default = "default_sample")]
    pub sample: Span,
    /// The nodes.
    pub cluster: Cluster,
    /// The shared store that inputs come from.
    #[serde(default)]
    pub store: Store,
    /// How tasks are placed.
    #[serde(default)]
    pub scheduler: SchedulerSetup,
    /// The tasks.
    pub workload: Workload,
    /// What goes wrong.
    #[serde(default)]
    pub failures: Failures,
}

fn default_seed() -> u64 {
    1
}
fn default_time_limit() -> Span {
    Span(7 * 86_400_000_000)
}
fn default_sample() -> Span {
    Span(10_000_000)
}

/// The simulated nodes: one worker each.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    /// How many nodes there are from the start.
    pub nodes: u32,
    /// Cpus (slots) per node.
    #[serde(default = "one")]
    pub cpus: u32,
    /// One-way latency between the server and a node.
    #[serde(default)]
    pub latency: Span,
    /// Each node's network link, which peers' copies from its cache cross; none: instant.
    #[serde(default)]
    pub link: Option<Bandwidth>,
    /// Each node's local disk, which its cache hits are read from; none: instant.
    #[serde(default)]
    pub disk: Option<Bandwidth>,
    /// Each node's cache of input files (LRU); 0: none, every input from the store.
    #[serde(default)]
    pub cache: Bytes,
    /// Tasks a node may hold beyond its free cpus, as a worker's `--prefetch` does.
    #[serde(default)]
    pub prefetch: u32,
    /// A slot's time per task beyond staging and computing: the executor taking the task,
    /// launching it and reporting it (a fork and exec for Kestrel's worker; tens of
    /// milliseconds for the seeds' Java executors).
    #[serde(default)]
    pub task_overhead: Span,
}

fn default_submit_every() -> Span {
    Span(1_000_000)
}

fn one() -> u32 {
    1
}

/// The shared store (GPFS in the seeds).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    /// Its aggregate read bandwidth, shared by all readers; none: instant.
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
    /// How many I/O servers share that bandwidth: one read goes at most at
    /// `bandwidth / servers`, and up to `servers` reads go at once.
    #[serde(default = "one")]
    pub servers: u32,
    /// Added to every read.
    #[serde(default)]
    pub latency: Span,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            bandwidth: None,
            servers: 1,
            latency: Span(0),
        }
    }
}

/// How the scheduler places tasks: Kestrel's own scheduler, with these settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSetup {
    /// The dispatch policy of tasks that read files.
    #[serde(default, deserialize_with = "policy")]
    pub policy: PolicyName,
    /// How many ready tasks data-aware placement looks at (Falkon's W); none: 100 per node.
    #[serde(default)]
    pub window: Option<usize>,
    /// Good-cache-compute's threshold of busy cpus (0 to 1).
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// Server time spent per task dispatched: assignments leave the server one after another,
    /// this long apart per task (a dispatcher's limit, such as Falkon's ~3,000 tasks/s); 0
    /// leaves only the scheduler's own decisions, which take no simulated time.
    #[serde(default)]
    pub dispatch_cost: Span,
}

impl Default for SchedulerSetup {
    fn default() -> Self {
        SchedulerSetup {
            policy: PolicyName::FirstAvailable,
            window: None,
            threshold: default_threshold(),
            dispatch_cost: Span(0),
        }
    }
}

fn default_threshold() -> f64 {
    0.9
}

fn policy<'de, D: Deserializer<'de>>(d: D) -> Result<PolicyName, D::Error> {
    let name = String::deserialize(d)?;
    PolicyName::parse(&name).ok_or_else(|| {
        de::Error::custom(format!(
            "unknown policy {name:?}, expected one of fa, fca, mch, mcu, gcc (or first-available, \
             first-cache-available, max-cache-hit, max-compute-util, good-cache-compute)"
        ))
    })
}

/// The tasks.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// How many tasks.
    pub tasks: u32,
    /// How long each computes (after staging its inputs).
    pub compute: Length,
    /// Cpus each task takes.
    #[serde(default = "one")]
    pub cpus: u32,
    /// How many distinct input files there are (the working set); 0: tasks read nothing.
    #[serde(default)]
    pub files: u32,
    /// The size of each file.
    #[serde(default)]
    pub file_size: Bytes,
    /// How many files each task reads, picked uniformly at random.
    #[serde(default = "one")]
    pub inputs: u32,
    /// When tasks arrive.
    #[serde(default)]
    pub arrival: Arrival,
    /// Tasks that arrive are submitted together this often, as one job, at the end of each
    /// interval (a client submitting what came in); 0 submits each arrival instant alone.
    #[serde(default = "default_submit_every")]
    pub submit_every: Span,
    /// How many times a failed task runs again.
    #[serde(default)]
    pub retries: u32,
}

/// How long a task computes.
#[derive(Clone, Debug)]
pub enum Length {
    /// Always this long (`compute = "10ms"`).
    Fixed(Span),
    /// Gamma-distributed with this mean and shape (`{ dist = "gamma", mean = "10s", shape = 2 }`).
    Gamma {
        /// The mean.
        mean: Span,
        /// The shape (k); the spread falls as it grows.
        shape: f64,
    },
    /// Normal with this mean and standard deviation, cut at 0.
    Normal {
        /// The mean.
        mean: Span,
        /// The standard deviation.
        sd: Span,
    },
    /// The run times of a real run, in order (`{ trace = "tasks.json" }`: what
    /// `kestrel task list --output json` printed; task i takes the i-th run time, the trace
    /// repeated if it is shorter than the workload).
    Trace {
        /// The file.
        file: PathBuf,
        /// Its run times, in microseconds.
        run_us: Vec<u64>,
    },
}

#[derive(Deserialize)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
enum LengthTable {
    Fixed { value: Span },
    Gamma { mean: Span, shape: f64 },
    Normal { mean: Span, sd: Span },
    Trace { file: PathBuf },
}

impl<'de> Deserialize<'de> for Length {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = toml::Value::deserialize(d)?;
        match value {
            toml::Value::String(s) => crate::units::parse_span(&s)
                .map(Length::Fixed)
                .map_err(de::Error::custom),
            toml::Value::Table(mut t) => {
                // `{ trace = "file" }` is short for `{ dist = "trace", file = "file" }`.
                if let Some(file) = t.remove("trace") {
                    t.insert("dist".into(), "trace".into());
                    t.insert("file".into(), file);
                }
                if !t.contains_key("dist") {
                    return Err(de::Error::custom(
                        "a task length is a duration (\"10ms\") or a table with `dist`, one of \
                         fixed, gamma, normal, trace",
                    ));
                }
                Ok(
                    match LengthTable::deserialize(toml::Value::Table(t))
                        .map_err(de::Error::custom)?
                    {
                        LengthTable::Fixed { value } => Length::Fixed(value),
                        LengthTable::Gamma { mean, shape } => Length::Gamma { mean, shape },
                        LengthTable::Normal { mean, sd } => Length::Normal { mean, sd },
                        LengthTable::Trace { file } => Length::Trace {
                            file,
                            run_us: Vec::new(),
                        },
                    },
                )
            }
            other => Err(de::Error::custom(format!(
                "a task length is a duration (\"10ms\") or a table with `dist`, not {other}"
            ))),
        }
    }
}

/// When tasks arrive.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(tag = "pattern", rename_all = "lowercase", deny_unknown_fields)]
pub enum Arrival {
    /// All at the start.
    #[default]
    All,
    /// At a steady rate (tasks/s).
    Rate {
        /// Tasks per second.
        rate: f64,
    },
    /// Falkon's MI: `start` tasks/s, multiplied by `factor` (rounded up) every `every`, at
    /// most `max`.
    Steps {
        /// The first interval's rate.
        start: f64,
        /// The growth per interval.
        factor: f64,
        /// The interval.
        every: Span,
        /// The highest rate.
        max: f64,
    },
    /// A sine wave: `mean + amplitude · sin(2πt / period)` tasks/s.
    Sine {
        /// The mean rate.
        mean: f64,
        /// The swing around it (at most `mean`).
        amplitude: f64,
        /// The period.
        period: Span,
    },
}

/// What goes wrong.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failures {
    /// The chance that a run fails (0 to 1); a failed task runs again up to
    /// `workload.retries` times.
    #[serde(default)]
    pub task: f64,
    /// Nodes killed at given times: `[{ at = "100s", nodes = 10 }]`.
    #[serde(default)]
    pub kill: Vec<Kill>,
    /// A killed node comes back (empty cache, new worker) this long after; none: never.
    #[serde(default)]
    pub return_after: Option<Span>,
}

/// Nodes killed at once.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kill {
    /// When.
    pub at: Span,
    /// How many (the live nodes with the lowest numbers).
    pub nodes: u32,
}

/// A scenario's runs, in the order written.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Every run, merged and checked.
    pub runs: Vec<Setup>,
}

impl Scenario {
    /// Reads a scenario file; traces are read relative to its directory.
    pub fn load(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the scenario {}: {e}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Scenario::parse(&text, dir).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Reads a scenario from `text`; traces are read relative to `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<Scenario, String> {
        let mut base: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        // Without [[runs]], the document is one run, named `main`.
        let implicit = !base.contains_key("runs");
        let runs = match base.remove("runs") {
            None => vec![toml::Table::new()],
            Some(toml::Value::Array(runs)) => runs
                .into_iter()
                .map(|r| match r {
                    toml::Value::Table(t) => Ok(t),
                    _ => Err("each [[runs]] entry is a table".to_string()),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("`runs` is a list of tables: write [[runs]] entries".into()),
        };
        if runs.is_empty() {
            return Err("`runs` is empty: give at least one [[runs]] entry, or none at all".into());
        }
        let mut setups = Vec::new();
        for (i, mut over) in runs.into_iter().enumerate() {
            let name = match over.remove("name") {
                None if implicit => "main".into(),
                None => return Err(format!("run {} of [[runs]] has no `name`", i + 1)),
                Some(toml::Value::String(s)) if !s.trim().is_empty() => s,
                Some(_) => return Err(format!("run {}: `name` is a non-empty string", i + 1)),
            };
            if setups.iter().any(|s: &Setup| s.name == name) {
                return Err(format!(
                    "two runs are named {name:?}: give each its own name"
                ));
            }
            let mut merged = base.clone();
            merge(&mut merged, over);
            let mut setup = Setup::deserialize(toml::Value::Table(merged))
                .map_err(|e| format!("run {name:?}: {}", e.message().trim()))?;
            setup.name = name;
            setup
                .check(dir)
                .map_err(|e| format!("run {:?}: {e}", setup.name))?;
            setups.push(setup);
        }
        Ok(Scenario { runs: setups })
    }
}

/// Lays `over` on `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// The most nodes a scenario may ask for: ten times the seeds' largest machine (163,840
/// cores), a few hundred bytes of memory each.
const MAX_NODES: u32 = 2_000_000;

fn fraction(key: &str, v: f64) -> Result<(), String> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(format!("{key} = {v}: a share, from 0 to 1"))
    }
}

fn positive(key: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(format!("{key} = {v}: must be a positive number"))
    }
}

impl Setup {
    /// Refuses values no simulation can use, and reads traces.
    fn check(&mut self, dir: &Path) -> Result<(), String> {
        let c = &self.cluster;
        if c.nodes == 0 {
            return Err("cluster.nodes = 0: a cluster needs at least one node".into());
        }
        if c.nodes > MAX_NODES {
            return Err(format!(
                "cluster.nodes = {}: at most {MAX_NODES} (each simulated node is kept in memory)",
                c.nodes
            ));
        }
        if c.cpus == 0 {
            return Err("cluster.cpus = 0: a node needs at least one cpu".into());
        }
        if self.store.servers == 0 {
            return Err("store.servers = 0: a store needs at least one I/O server".into());
        }
        fraction("scheduler.threshold", self.scheduler.threshold)?;
        fraction("failures.task", self.failures.task)?;
        if self.sample.0 == 0 {
            return Err("sample = 0: give the timeline's interval, e.g. \"10s\"".into());
        }
        if self.time_limit.0 == 0 {
            return Err(
                "time_limit = 0: give the simulated time a run may take, e.g. \"4h\"".into(),
            );
        }
        let w = &mut self.workload;
        if w.tasks == 0 {
            return Err("workload.tasks = 0: give at least one task".into());
        }
        if w.cpus == 0 {
            return Err("workload.cpus = 0: a task needs at least one cpu".into());
        }
        if w.files > 0 {
            if w.inputs == 0 {
                return Err("workload.inputs = 0 with workload.files set: give 1 or more".into());
            }
            if w.inputs > w.files {
                return Err(format!(
                    "workload.inputs = {}: more than the {} files there are",
                    w.inputs, w.files
                ));
            }
            if w.file_size.0 == 0 {
                return Err(
                    "workload.file_size is needed with workload.files, e.g. \"10MB\"".into(),
                );
            }
            let cache = self.cluster.cache.0;
            if cache > 0 && cache < w.file_size.0 * u64::from(w.inputs) {
                return Err(format!(
                    "cluster.cache = {cache} bytes cannot hold one task's inputs ({} × {} bytes): \
                     give 0 (no cache) or at least {} bytes",
                    w.inputs,
                    w.file_size.0,
                    w.file_size.0 * u64::from(w.inputs)
                ));
            }
        }
        match &mut w.compute {
            Length::Fixed(_) => {}
            Length::Gamma { mean, shape } => {
                positive("workload.compute.shape", *shape)?;
                positive("workload.compute.mean", mean.0 as f64)?;
            }
            Length::Normal { .. } => {}
            Length::Trace { file, run_us } => {
                let path = dir.join(&*file);
                *run_us = crate::model::read_trace(&path)?;
            }
        }
        match self.workload.arrival {
            Arrival::All => {}
            Arrival::Rate { rate } => positive("workload.arrival.rate", rate)?,
            Arrival::Steps {
                start,
                factor,
                every,
                max,
            } => {
                positive("workload.arrival.start", start)?;
                positive("workload.arrival.max", max)?;
                if !(factor.is_finite() && factor >= 1.0) {
                    return Err(format!("workload.arrival.factor = {factor}: at least 1"));
                }
                if every.0 == 0 {
                    return Err("workload.arrival.every = 0: give the step, e.g. \"60s\"".into());
                }
            }
            Arrival::Sine {
                mean,
                amplitude,
                period,
            } => {
                positive("workload.arrival.mean", mean)?;
                if !(amplitude.is_finite() && (0.0..=mean).contains(&amplitude)) {
                    return Err(format!(
                        "workload.arrival.amplitude = {amplitude}: from 0 to the mean ({mean}), \
                         so the rate never goes below 0"
                    ));
                }
                if period.0 == 0 {
                    return Err("workload.arrival.period = 0: give the wave's period".into());
                }
            }
        }
        Ok(())
    }
}
