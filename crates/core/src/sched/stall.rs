//! Why a job does not move: the answer `job info` and `job wait` print.

use super::Scheduler;
use crate::spec::{JobId, Resources, WorkerId};
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
    /// Multi-node tasks (`--nodes`) for which no group has enough workers: what they need,
    /// what there is, and what to do.
    Nodes(String),
}

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
        let able = || {
            self.workers
                .values()
                .filter(|w| w.can_ever_run(need) && (w.offer.stages_files || !j.has_files()))
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
