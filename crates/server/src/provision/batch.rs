//! The Slurm and PBS backends: the pilot scripts and command lines of
//! [`kestrel_alloc::backend`], run off the engine's thread with a time limit. Their answers
//! come back on a channel the provisioner drains at its next tick, so a batch system that
//! hangs or fails never stalls the server or the allocator (HQ #764): a failed query changes
//! nothing, and is tried again at the next tick.

use kestrel_alloc::backend::{pbs, slurm, BatchState, Pilot};
use kestrel_alloc::{AllocId, QueueId};
use kestrel_proto::messages::AllocQueueSpec;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::sync::mpsc;

/// How long one batch-system command may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// Which batch system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum System {
    Slurm,
    Pbs(pbs::Flavor),
}

impl System {
    pub(super) fn named(backend: &str) -> Option<System> {
        match backend {
            "slurm" => Some(System::Slurm),
            "pbs" => Some(System::Pbs(pbs::Flavor::Pro)),
            "torque" => Some(System::Pbs(pbs::Flavor::Torque)),
            _ => None,
        }
    }
}

/// What a command answered.
#[derive(Debug)]
pub(super) enum Answer {
    /// The submit command of `alloc`: its batch id, or why not.
    Submitted {
        queue: QueueId,
        alloc: AllocId,
        result: Result<String, String>,
    },
    /// The held test allocation of a queue being added: canceled at once; whether the batch
    /// system took it.
    DryRun {
        queue: QueueId,
        result: Result<(), String>,
    },
    /// One query of a queue's allocations: each listed id's state; ids not listed have ended.
    Queried {
        queue: QueueId,
        asked: Vec<String>,
        result: Result<Vec<(String, BatchState)>, String>,
    },
}

/// Runs batch commands and collects their answers.
pub(super) struct Runner {
    tx: mpsc::UnboundedSender<Answer>,
    rx: mpsc::UnboundedReceiver<Answer>,
    /// Queues with a query under way (one at a time each).
    querying: Vec<QueueId>,
    dir: PathBuf,
    access: PathBuf,
}

impl Runner {
    pub(super) fn new(access: PathBuf, dir: PathBuf) -> Runner {
        let (tx, rx) = mpsc::unbounded_channel();
        Runner {
            tx,
            rx,
            querying: Vec::new(),
            dir,
            access,
        }
    }

    /// The answers that came since the last call.
    pub(super) fn answers(&mut self) -> Vec<Answer> {
        let mut out = Vec::new();
        while let Ok(a) = self.rx.try_recv() {
            if let Answer::Queried { queue, .. } = &a {
                self.querying.retain(|q| q != queue);
            }
            out.push(a);
        }
        out
    }

    /// Writes allocation `alloc` of `queue` (`spec`)'s pilot script for `nodes` nodes and
    /// submits it.
    pub(super) fn submit(
        &self,
        system: System,
        (queue, alloc, nodes): (QueueId, AllocId, u32),
        spec: &AllocQueueSpec,
    ) {
        let tx = self.tx.clone();
        let prepared = self.prepare(system, (queue, alloc, nodes), spec);
        let (pilot, script) = match prepared {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.send(Answer::Submitted {
                    queue,
                    alloc,
                    result: Err(e),
                });
                return;
            }
        };
        let path = script.display().to_string();
        let argv = match system {
            System::Slurm => slurm::submit(&path, &spec.batch_args, false),
            System::Pbs(_) => pbs::submit(&pilot, &path, &spec.batch_args, false),
        };
        tokio::spawn(async move {
            let result = run(&argv).await.and_then(|(stdout, _)| match system {
                System::Slurm => slurm::parse_submit(&stdout),
                System::Pbs(_) => pbs::parse_submit(&stdout),
            });
            let _ = tx.send(Answer::Submitted {
                queue,
                alloc,
                result,
            });
        });
    }

    /// Submits a held test allocation for queue `queue` and cancels it (`alloc add`'s dry run).
    pub(super) fn dry_run(&self, system: System, queue: QueueId, spec: &AllocQueueSpec) {
        let tx = self.tx.clone();
        // Allocation 0 is never given out: the test's files go to alloc/0/.
        let (pilot, script) = match self.prepare(system, (queue, 0, spec.nodes), spec) {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.send(Answer::DryRun {
                    queue,
                    result: Err(e),
                });
                return;
            }
        };
        let path = script.display().to_string();
        let argv = match system {
            System::Slurm => slurm::submit(&path, &spec.batch_args, true),
            System::Pbs(_) => pbs::submit(&pilot, &path, &spec.batch_args, true),
        };
        tokio::spawn(async move {
            let submitted = run(&argv).await.and_then(|(stdout, _)| match system {
                System::Slurm => slurm::parse_submit(&stdout),
                System::Pbs(_) => pbs::parse_submit(&stdout),
            });
            let result = match submitted {
                Ok(id) => {
                    let cancel = match system {
                        System::Slurm => slurm::cancel(&[&id]),
                        System::Pbs(_) => pbs::cancel(&[&id]),
                    };
                    run(&cancel).await.map(|_| ()).map_err(|e| {
                        format!("the held test allocation {id} was taken but not canceled ({e}): cancel it by hand")
                    })
                }
                Err(e) => Err(e),
            };
            let _ = tx.send(Answer::DryRun { queue, result });
        });
    }

    fn prepare(
        &self,
        system: System,
        (queue, alloc, nodes): (QueueId, AllocId, u32),
        spec: &AllocQueueSpec,
    ) -> Result<(Pilot, PathBuf), String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find the kestrel binary for the pilot: {e}"))?;
        let dir = self.dir.join(alloc.to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let pilot = Pilot {
            job_name: format!("kestrel-q{queue}-a{alloc}"),
            nodes,
            time_limit_us: spec.time_limit_ms.saturating_mul(1000),
            kestrel: exe.display().to_string(),
            access: self.access.display().to_string(),
            alloc,
            worker_args: spec.worker_args.clone(),
            stdout: dir.join("stdout").display().to_string(),
            stderr: dir.join("stderr").display().to_string(),
        };
        let text = match system {
            System::Slurm => slurm::script(&pilot),
            System::Pbs(flavor) => pbs::script(&pilot, flavor),
        };
        let script = dir.join("pilot.sh");
        std::fs::write(&script, text)
            .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
        Ok((pilot, script))
    }

    /// Asks for the state of `ids`, all of `queue`'s, in one command, unless one is under way.
    pub(super) fn query(&mut self, system: System, queue: QueueId, ids: Vec<String>) {
        if ids.is_empty() || self.querying.contains(&queue) {
            return;
        }
        self.querying.push(queue);
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let argv = match system {
            System::Slurm => slurm::query(&refs),
            System::Pbs(_) => pbs::query(&refs),
        };
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = match run(&argv).await {
                Ok((stdout, _)) => Ok(match system {
                    System::Slurm => slurm::parse_query(&stdout),
                    System::Pbs(_) => pbs::parse_query(&stdout),
                }),
                // squeue of ids it no longer knows: they have all ended.
                Err(e) if system == System::Slurm && slurm::query_knows_none(&e) => Ok(Vec::new()),
                Err(e) => Err(e),
            };
            let _ = tx.send(Answer::Queried {
                queue,
                asked: ids,
                result,
            });
        });
    }

    /// Cancels batch jobs; a failure is only logged (the next query shows what is left).
    pub(super) fn cancel(&self, system: System, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let argv = match system {
            System::Slurm => slurm::cancel(&refs),
            System::Pbs(_) => pbs::cancel(&refs),
        };
        tokio::spawn(async move {
            if let Err(e) = run(&argv).await {
                tracing::warn!("canceling allocations failed: {e}");
            }
        });
    }
}

/// Runs `argv` with [`COMMAND_LIMIT`]; its stdout and stderr, or why it failed (its stderr, or
/// that it could not start or hung).
async fn run(argv: &[String]) -> Result<(String, String), String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("no command".into());
    };
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(COMMAND_LIMIT, child).await {
        Err(_) => {
            return Err(format!(
                "`{program}` did not answer within {} s",
                COMMAND_LIMIT.as_secs()
            ))
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "`{program}` is not on the server's PATH: is this a {} login node?",
                if program.starts_with('q') {
                    "PBS"
                } else {
                    "Slurm"
                }
            ))
        }
        Ok(Err(e)) => return Err(format!("`{program}` could not run: {e}")),
        Ok(Ok(out)) => out,
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if out.status.success() {
        Ok((stdout, stderr))
    } else {
        // Debian's qsub wrapper says what went wrong on stdout.
        let said = if stderr.is_empty() {
            stdout.trim().to_string()
        } else {
            stderr
        };
        Err(format!("`{program}` failed ({}): {said}", out.status))
    }
}
