//! Why a job does not move: the answer `job info` and `job wait` print.

use super::Scheduler;
use crate::spec::{JobId, Resources, TaskIndex, TaskState, WorkerId};
use std::fmt;

/// Why a job's queued tasks cannot go to any worker (see [`Scheduler::stall`]): the answer to
/// "why does my job not move?" that `job info` and `job wait` print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stall {
    /// No worker is connected.
    NoWorkers,
    /// Every worker is too small for one task: `what` says what it lacks and what to do, e.g.
    /// "3 cpus, the largest worker has 2 cpus; start a bigger worker or cancel the job".
    TooBig {
        /// What the workers lack and what to do.
        what: String,
    },
    /// Every worker that could run the tasks is quarantined.
    Quarantined {
        /// The quarantined workers.
        workers: Vec<WorkerId>,
    },
    /// The tasks read or write files, and no connected worker has a cache (all are of an
    /// older version, or were started without one).
    NoCache,
    /// The tasks call a Python function, and no connected worker has a Python runner.
    NoRunner,
    /// Its queued tasks wait for other jobs or tasks to finish: its `after`, or the writers
    /// of the files they read (see [`Scheduler::waits_for`]).
    Dependencies {
        /// What they wait for: whole jobs (`(job, None)`) and tasks (`(job, Some(task id))`).
        on: Vec<(JobId, Option<u32>)>,
        /// How many more there are beyond `on`, among the tasks looked at.
        more: u32,
        /// Whether more waiting tasks were not looked at (a big job): there may be more.
        partial: bool,
    },
    /// Multi-node tasks (`--nodes`) for which no group has enough workers: what they need,
    /// what there is, and what to do.
    Nodes(String),
}

/// How many jobs and tasks [`Scheduler::waits_for`] names at most.
const NAMED: usize = 8;
/// How many of a job's waiting tasks [`Scheduler::waits_for`] looks at for the writers of
/// their inputs: it is asked for every listing, so it never walks a whole big job.
const LOOKED_AT: usize = 64;

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural =
            |n: u32, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        match self {
            Stall::NoWorkers => {
                f.write_str("no worker is connected; start one with `kestrel worker start`")
            }
            Stall::TooBig { what } => write!(f, "each task needs {what}"),
            Stall::Nodes(what) => f.write_str(what),
            Stall::NoCache => f.write_str(
                "the tasks read or write files, and no connected worker has a file cache; start workers of this version (`kestrel worker start`)",
            ),
            Stall::NoRunner => f.write_str(
                "the tasks call a Python function, and no connected worker runs Python; start one with `kestrel worker start --python PATH` (the interpreter with the client's packages)",
            ),
            Stall::Dependencies { on, more, partial } => {
                let mut names: Vec<String> = on
                    .iter()
                    .map(|&(job, task)| match task {
                        None => format!("job {job}"),
                        Some(t) => format!("task {job}:{t}"),
                    })
                    .collect();
                if *partial {
                    names.push("more".into());
                } else if *more > 0 {
                    names.push(format!("{more} more"));
                }
                let last = names.pop().unwrap_or_default();
                let list = if names.is_empty() {
                    last
                } else {
                    format!("{} and {last}", names.join(", "))
                };
                write!(f, "its tasks wait for {list} to finish")
            }
            Stall::Quarantined { workers } => {
                let ids: Vec<String> = workers.iter().map(u32::to_string).collect();
                let n = workers.len() as u32;
                write!(
                    f,
                    "no worker can take these tasks: {} quarantined ({}); `kestrel worker resume ID` lifts it",
                    plural(n, "worker", "workers"),
                    ids.join(", ")
                )
            }
        }
    }
}

impl Scheduler {
    /// Why a job's queued tasks cannot go to any worker, if so (`None` also when they simply
    /// wait for busy slots). Looks at every worker: for displays, not for every event.
    pub fn stall(&self, job: JobId) -> Option<Stall> {
        let j = self.jobs.get(&job)?;
        if !j.canceled && j.counts.ready == 0 && j.counts.waiting > 0 && !j.held {
            let (on, more, partial) = self.waits_for(job);
            return (!on.is_empty()).then_some(Stall::Dependencies { on, more, partial });
        }
        if j.canceled || j.counts.ready == 0 {
            return None;
        }
        if self.workers.is_empty() {
            return Some(Stall::NoWorkers);
        }
        if j.spec.nodes > 0 {
            return self.nodes_stall(j);
        }
        let need = j.need;
        if j.has_files() && !self.workers.values().any(|w| w.offer.stages_files) {
            return Some(Stall::NoCache);
        }
        if j.spec.template.kind.is_function()
            && !self.workers.values().any(|w| w.offer.runs_functions)
        {
            return Some(Stall::NoRunner);
        }
        let able = || {
            self.workers
                .values()
                .filter(|w| w.can_ever_run(need) && j.runs_on(&w.offer))
        };
        if able().any(|w| w.quarantined.is_none()) {
            return None;
        }
        let quarantined: Vec<WorkerId> = able().map(|w| w.id).collect();
        if !quarantined.is_empty() {
            return Some(Stall::Quarantined {
                workers: quarantined,
            });
        }
        Some(Stall::TooBig {
            what: self.lacking(&need),
        })
    }

    /// What job `job`'s waiting tasks wait for: the jobs and tasks of its `after` that have
    /// not finished, then the writers of their inputs that have not (of the first
    /// [`LOOKED_AT`] waiting tasks), at most [`NAMED`] of them, with how many more there are
    /// and whether there may be more still (not every waiting task was looked at). Task ids,
    /// not indices; empty when nothing waits.
    pub fn waits_for(&self, job: JobId) -> (Vec<(JobId, Option<u32>)>, u32, bool) {
        let Some(j) = self
            .jobs
            .get(&job)
            .filter(|j| j.counts.waiting > 0 && !j.canceled)
        else {
            return (Vec::new(), 0, false);
        };
        let mut on: Vec<(JobId, Option<TaskIndex>)> = Vec::new();
        if j.gate > 0 {
            for a in &j.spec.after {
                let Some(dep) = self.jobs.get(&a.job) else {
                    continue;
                };
                match &a.tasks {
                    None if dep.finished_us.is_none() => on.push((a.job, None)),
                    None => {}
                    Some(ids) => on.extend(
                        (0..ids.len())
                            .filter_map(|k| ids.id_at(k).and_then(|t| dep.index_of(t)))
                            .filter(|&i| dep.record(i).state != TaskState::Finished)
                            .map(|i| (a.job, Some(i))),
                    ),
                }
            }
        }
        let mut unsure = false;
        if !j.unmet.is_empty() {
            let mut waiting: Vec<TaskIndex> = j.unmet.keys().copied().collect();
            waiting.sort_unstable();
            unsure = waiting.len() > LOOKED_AT;
            for &i in waiting.iter().take(LOOKED_AT) {
                for f in j.inputs_of(i) {
                    let Some(&(wj, wi)) = self.graph_writer(*f) else {
                        continue;
                    };
                    let done = self
                        .jobs
                        .get(&wj)
                        .is_none_or(|w| w.record(wi).state == TaskState::Finished);
                    if !done {
                        on.push((wj, Some(wi)));
                    }
                }
            }
        }
        on.sort_unstable();
        on.dedup();
        let more = on.len().saturating_sub(NAMED) as u32;
        on.truncate(NAMED);
        let named = on
            .into_iter()
            .map(|(dj, i)| {
                (
                    dj,
                    i.map(|i| self.jobs.get(&dj).map_or(i, |d| d.task_id(i))),
                )
            })
            .collect();
        (named, more, unsure)
    }

    /// What no connected worker has enough of for a task needing `need`: "3 cpus, the largest
    /// worker has 2 cpus", or, when each resource is somewhere but never all on one worker,
    /// everything the task needs.
    fn lacking(&self, need: &Resources) -> String {
        let most = self
            .workers
            .values()
            .fold(Resources::NONE, |m, w| max_each(m, &w.offer.resources));
        let count = |n: u64, one: &str| {
            if n == 1 {
                format!("1 {one}")
            } else {
                format!("{n} {one}s")
            }
        };
        let mem = |b: u64| {
            if b >= 1 << 30 {
                format!("{:.1} GiB of memory", b as f64 / f64::from(1u32 << 30))
            } else {
                format!("{} MiB of memory", b.div_ceil(1 << 20))
            }
        };
        let bigger = "; start a bigger worker or cancel the job";
        let short =
            |need: String, most: String| format!("{need}, the largest worker has {most}{bigger}");
        let mut needs = vec![count(need.cpus.into(), "cpu")];
        if need.cpus > most.cpus {
            return short(needs.remove(0), count(most.cpus.into(), "cpu"));
        }
        if need.gpus > 0 {
            needs.push(count(need.gpus.into(), "GPU"));
            if need.gpus > most.gpus {
                return short(
                    count(need.gpus.into(), "GPU"),
                    count(most.gpus.into(), "GPU"),
                );
            }
        }
        if need.mem > 0 {
            needs.push(mem(need.mem));
            if need.mem > most.mem {
                return short(mem(need.mem), mem(most.mem));
            }
        }
        for (i, (&n, &m)) in need.named.iter().zip(&most.named).enumerate() {
            if n == 0 {
                continue;
            }
            let name = self.resource_name(i).unwrap_or("?");
            needs.push(format!("{n} {name}"));
            if n > m {
                let offer = format!(
                    "start a worker with `kestrel worker start --resource {name}=N` or cancel the job"
                );
                return match m {
                    0 => format!("{n} {name}, which no worker offers; {offer}"),
                    m => format!("{n} {name}, the most a worker offers is {m}; {offer}"),
                };
            }
        }
        format!(
            "{}, and no worker has all of it{bigger}",
            needs.join(" and ")
        )
    }
}

/// The larger of each resource of `a` and `b`.
fn max_each(mut a: Resources, b: &Resources) -> Resources {
    a.cpus = a.cpus.max(b.cpus);
    a.gpus = a.gpus.max(b.gpus);
    a.mem = a.mem.max(b.mem);
    for (x, y) in a.named.iter_mut().zip(&b.named) {
        *x = (*x).max(*y);
    }
    a
}
