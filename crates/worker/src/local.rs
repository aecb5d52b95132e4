//! The worker's own bookkeeping: job templates, the local queue of assigned tasks, free slots
//! and GPUs, and turning an assignment into a [`Launch`].
//!
//! Pure data; the session loop in `session.rs` drives it.

use crate::exec::{Launch, Sink as ExecSink};
use kestrel_core::placeholders::{substitute, Values};
use kestrel_core::{JobId, Resources, Sink, TaskIndex, TaskTemplate};
use kestrel_proto::messages::{Assigned, JobIds};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A task waiting on this worker for a free slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalTask {
    pub job: JobId,
    pub index: TaskIndex,
    /// Own argv (list jobs); `None` uses the job template's.
    pub argv: Option<Vec<String>>,
    /// When its assignment arrived (microseconds since the Unix epoch): the time until it
    /// starts is its wait for a slot.
    pub arrived_us: u64,
    /// Own line (jobs of lines), for `{line}` in the template.
    pub line: Option<String>,
}

/// A job as this worker knows it.
#[derive(Debug)]
pub struct JobDef {
    pub template: TaskTemplate,
    pub ids: JobIds,
    pub resources: Resources,
}

/// Values substituted into placeholders and the task environment.
#[derive(Debug, Clone)]
pub struct Identity {
    pub worker: u32,
    /// `host:port` of the server, for `KESTREL_SERVER`.
    pub server: String,
    /// The server directory, for `KESTREL_SERVER_DIR`, so a task can submit tasks.
    pub server_dir: Option<String>,
}

/// Templates, queued tasks and free resources of one worker.
#[derive(Debug)]
pub struct Local {
    pub jobs: FxHashMap<JobId, JobDef>,
    pub queue: VecDeque<LocalTask>,
    free_cpus: u32,
    free_gpus: Vec<u32>,
}

impl Local {
    pub fn new(slots: u32, gpus: u32) -> Local {
        Local {
            jobs: FxHashMap::default(),
            queue: VecDeque::new(),
            free_cpus: slots,
            free_gpus: (0..gpus).collect(),
        }
    }

    pub fn define(
        &mut self,
        job: JobId,
        template: TaskTemplate,
        ids: JobIds,
        resources: Resources,
    ) {
        self.jobs.insert(
            job,
            JobDef {
                template,
                ids,
                resources,
            },
        );
    }

    /// Queues assigned tasks in order; they arrived at `now_us`.
    pub fn enqueue(&mut self, tasks: Vec<Assigned>, now_us: u64) {
        for a in tasks {
            let r = a.run;
            let task = |index, argv, line| LocalTask {
                job: r.job,
                index,
                argv,
                line,
                arrived_us: now_us,
            };
            if !a.argvs.is_empty() {
                self.queue.extend(
                    a.argvs
                        .into_iter()
                        .zip(r.first..)
                        .map(|(argv, index)| task(index, Some(argv), None)),
                );
            } else if !a.lines.is_empty() {
                self.queue.extend(
                    a.lines
                        .iter()
                        .zip(r.first..)
                        .map(|(line, index)| task(index, None, Some(line.to_string()))),
                );
            } else {
                self.queue
                    .extend((r.first..r.first + r.count).map(|index| task(index, None, None)));
            }
        }
    }

    /// Takes the next queued task if its resources are free; returns it with the GPUs it got.
    pub fn next_startable(&mut self) -> Option<(LocalTask, Vec<u32>)> {
        let head = self.queue.front()?;
        let need = self
            .jobs
            .get(&head.job)
            .map_or(Resources::default(), |d| d.resources);
        if need.cpus > self.free_cpus || need.gpus as usize > self.free_gpus.len() {
            return None;
        }
        self.free_cpus -= need.cpus;
        let gpus = self
            .free_gpus
            .split_off(self.free_gpus.len() - need.gpus as usize);
        self.queue.pop_front().map(|t| (t, gpus))
    }

    /// Gives back what a task of `job` held (the job must still be defined).
    pub fn release(&mut self, job: JobId, gpus: Vec<u32>) {
        let cpus = self.cpus_of(job);
        self.release_held(cpus, gpus);
    }

    /// Gives back `cpus` slots and the `gpus` a task held (for tasks that may outlive their
    /// job's definition: a `ForgetJob` can arrive while a duplicate run still goes on).
    pub fn release_held(&mut self, cpus: u32, gpus: Vec<u32>) {
        self.free_cpus += cpus;
        self.free_gpus.extend(gpus);
    }

    /// Slots each task of `job` holds.
    pub fn cpus_of(&self, job: JobId) -> u32 {
        self.jobs
            .get(&job)
            .map_or(Resources::default(), |d| d.resources)
            .cpus
    }

    /// Removes queued tasks among `tasks`; returns the ones removed.
    pub fn unqueue(&mut self, tasks: &[(JobId, TaskIndex)]) -> Vec<(JobId, TaskIndex)> {
        let mut removed = Vec::new();
        self.queue.retain(|t| {
            let hit = tasks.contains(&(t.job, t.index));
            if hit {
                removed.push((t.job, t.index));
            }
            !hit
        });
        removed
    }

    /// Builds the launch of a task: placeholders substituted, environment set.
    pub fn launch(&self, task: &LocalTask, gpus: &[u32], me: &Identity) -> Result<Launch, String> {
        let def = self
            .jobs
            .get(&task.job)
            .ok_or_else(|| format!("job {} was never defined on this worker", task.job))?;
        let t = &def.template;
        let id = match &def.ids {
            JobIds::Array(r) => r.id_at(task.index).unwrap_or(task.index),
            JobIds::List => task.index,
        };
        let (job_s, id_s) = (task.job.to_string(), id.to_string());
        let values = Values {
            job: &job_s,
            task: &id_s,
            line: task.line.as_deref(),
        };
        let sub = |s: &str| substitute(s, &values).into_owned();
        let argv: Vec<String> = match &task.argv {
            Some(a) => a.iter().map(|s| sub(s)).collect(),
            None => t.argv.iter().map(|s| sub(s)).collect(),
        };
        let cwd = t.cwd.as_deref().map(|c| PathBuf::from(sub(c)));
        let sink = |s: &Sink| match s {
            Sink::Null => ExecSink::Null,
            Sink::File(p) => ExecSink::File(resolve(cwd.as_deref(), &sub(p))),
        };
        let mut env = Vec::with_capacity(t.env.len() + 6);
        env.push(("KESTREL_JOB_ID".to_string(), job_s.clone()));
        env.push(("KESTREL_TASK_ID".to_string(), id_s.clone()));
        env.push(("KESTREL_WORKER_ID".to_string(), me.worker.to_string()));
        env.push(("KESTREL_SERVER".to_string(), me.server.clone()));
        if let Some(d) = &me.server_dir {
            env.push(("KESTREL_SERVER_DIR".to_string(), d.clone()));
        }
        if !gpus.is_empty() {
            let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
            env.push(("CUDA_VISIBLE_DEVICES".to_string(), list.join(",")));
        }
        env.extend(t.env.iter().map(|(k, v)| (k.clone(), sub(v))));
        Ok(Launch {
            argv,
            env,
            stdout: sink(&t.stdout),
            stderr: sink(&t.stderr),
            cwd,
            timeout: t.timeout_ms.map(Duration::from_millis),
        })
    }
}

fn resolve(cwd: Option<&Path>, p: &str) -> PathBuf {
    let p = Path::new(p);
    match cwd {
        Some(c) if p.is_relative() => c.join(p),
        _ => p.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::{IdRanges, IndexRun};

    fn template() -> TaskTemplate {
        TaskTemplate {
            argv: vec![
                "sim".into(),
                "--seed".into(),
                "{task}".into(),
                "j{job}".into(),
            ],
            env: vec![("OUT".into(), "out-{task}".into())],
            cwd: Some("/data/run-{job}".into()),
            stdout: Sink::File("logs/{task}.out".into()),
            stderr: Sink::Null,
            timeout_ms: Some(1500),
        }
    }

    fn me() -> Identity {
        Identity {
            worker: 7,
            server: "h:1".into(),
            server_dir: None,
        }
    }

    #[test]
    fn placeholders_and_environment() {
        let mut l = Local::new(2, 0);
        l.define(
            3,
            template(),
            JobIds::Array(IdRanges::parse("10-20:5").unwrap()),
            Resources::default(),
        );
        let t = LocalTask {
            job: 3,
            index: 2,
            argv: None,
            arrived_us: 0,
            line: None,
        };
        let launch = l.launch(&t, &[], &me()).unwrap();
        assert_eq!(launch.argv, vec!["sim", "--seed", "20", "j3"]);
        assert_eq!(launch.cwd.as_deref(), Some(Path::new("/data/run-3")));
        assert_eq!(
            launch.stdout,
            ExecSink::File("/data/run-3/logs/20.out".into())
        );
        assert_eq!(launch.timeout, Some(Duration::from_millis(1500)));
        let env: FxHashMap<_, _> = launch.env.into_iter().collect();
        assert_eq!(env["KESTREL_TASK_ID"], "20");
        assert_eq!(env["KESTREL_JOB_ID"], "3");
        assert_eq!(env["KESTREL_WORKER_ID"], "7");
        assert_eq!(env["OUT"], "out-20");
    }

    #[test]
    fn slots_and_gpus_limit_what_starts() {
        let mut l = Local::new(2, 1);
        l.define(1, template(), JobIds::List, Resources { cpus: 1, gpus: 1 });
        l.enqueue(
            vec![Assigned {
                run: IndexRun {
                    job: 1,
                    first: 0,
                    count: 2,
                },
                argvs: vec![vec!["a".into()], vec!["b".into()]],
                lines: Default::default(),
            }],
            0,
        );
        let (t, gpus) = l.next_startable().unwrap();
        assert_eq!((t.index, gpus.clone()), (0, vec![0]));
        assert!(l.next_startable().is_none(), "the only GPU is taken");
        let launch = l.launch(&t, &gpus, &me()).unwrap();
        assert_eq!(launch.argv, vec!["a"]);
        assert!(launch
            .env
            .contains(&("CUDA_VISIBLE_DEVICES".into(), "0".into())));
        l.release(1, gpus);
        assert_eq!(l.next_startable().unwrap().0.index, 1);
    }

    #[test]
    fn canceled_tasks_leave_the_queue() {
        let mut l = Local::new(1, 0);
        l.enqueue(
            vec![Assigned::run(IndexRun {
                job: 1,
                first: 0,
                count: 3,
            })],
            0,
        );
        assert_eq!(l.unqueue(&[(1, 1), (2, 0)]), vec![(1, 1)]);
        assert_eq!(l.queue.len(), 2);
    }

    #[test]
    fn a_line_goes_into_the_command_paths_and_environment() {
        let mut l = Local::new(1, 0);
        let mut t = template();
        t.argv = vec!["sha1sum".into(), "{line}".into()];
        t.stdout = Sink::File("sums/{line}.sha".into());
        t.stderr = Sink::File("${line}/{task}.err".into());
        t.env = vec![("IN".into(), "{line}-{job}".into())];
        l.define(4, t, JobIds::List, Resources::default());
        l.enqueue(
            vec![Assigned {
                run: IndexRun {
                    job: 4,
                    first: 7,
                    count: 2,
                },
                argvs: vec![],
                lines: ["a.dat", "b {task}.dat"].into_iter().collect(),
            }],
            0,
        );
        let (first, _) = l.next_startable().unwrap();
        let launch = l.launch(&first, &[], &me()).unwrap();
        assert_eq!(launch.argv, vec!["sha1sum", "a.dat"]);
        assert_eq!(
            launch.stdout,
            ExecSink::File("/data/run-4/sums/a.dat.sha".into())
        );
        // `${line}` is the shell's, not a placeholder.
        assert_eq!(
            launch.stderr,
            ExecSink::File("/data/run-4/${line}/7.err".into())
        );
        assert!(launch.env.contains(&("IN".into(), "a.dat-4".into())));
        l.release(4, vec![]);
        let (second, _) = l.next_startable().unwrap();
        let launch = l.launch(&second, &[], &me()).unwrap();
        // A line is put in as it is, never read for placeholders itself.
        assert_eq!(launch.argv, vec!["sha1sum", "b {task}.dat"]);
    }
}
