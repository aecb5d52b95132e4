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

    fn script(self, p: &Pilot) -> String {
        match self {
            System::Slurm => slurm::script(p),
            System::Pbs(flavor) => pbs::script(p, flavor),
        }
    }

    fn submit_argv(
        self,
        p: &Pilot,
        script: &str,
        batch_args: &[String],
        hold: bool,
    ) -> Vec<String> {
        match self {
            // Slurm's dry run is `--test-only`, never a held job.
            System::Slurm => slurm::submit(script, batch_args),
            System::Pbs(_) => pbs::submit(p, script, batch_args, hold),
        }
    }

    fn parse_submit(self, stdout: &str) -> Result<String, String> {
        match self {
            System::Slurm => slurm::parse_submit(stdout),
            System::Pbs(_) => pbs::parse_submit(stdout),
        }
    }

    fn cancel_argv(self, ids: &[&str]) -> Vec<String> {
        match self {
            System::Slurm => slurm::cancel(ids),
            System::Pbs(_) => pbs::cancel(ids),
        }
    }

    /// The states a query's output lists; ids it does not list have ended. A query that
    /// failed only because some of its ids are no longer known still answers for the rest:
    /// `squeue` of only unknown ids, and `qstat` of any finished one, exit with an error.
    fn query(self, ids: &[&str], ran: Ran) -> Result<Vec<(String, BatchState)>, String> {
        match self {
            System::Slurm if ran.ok => Ok(slurm::parse_query(&ran.stdout)),
            System::Slurm if slurm::query_knows_none(&ran.stderr) => Ok(Vec::new()),
            System::Pbs(_) if ran.ok || pbs::query_knows_some_not(&ran.stderr) => {
                Ok(pbs::parse_query(&ran.stdout))
            }
            _ => Err(ran.failure(&self.query_argv(ids)[0])),
        }
    }

    fn query_argv(self, ids: &[&str]) -> Vec<String> {
        match self {
            System::Slurm => slurm::query(ids),
            System::Pbs(_) => pbs::query(ids),
        }
    }

    fn find_argv(self, name: &str) -> Vec<String> {
        match self {
            System::Slurm => slurm::find_by_name(name),
            System::Pbs(_) => pbs::find_by_name(name),
        }
    }

    fn family(self) -> &'static str {
        match self {
            System::Slurm => "Slurm",
            System::Pbs(_) => "PBS",
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
        system: System,
        result: Result<String, String>,
    },
    /// The dry run of a queue being added (check number `check`): whether the batch system
    /// accepted its test allocation.
    DryRun {
        check: u32,
        result: Result<(), CheckFailed>,
    },
    /// The search for `alloc`'s batch job by its name `name`: its id if there is one.
    Found {
        queue: QueueId,
        alloc: AllocId,
        system: System,
        name: String,
        result: Result<Option<String>, String>,
    },
    /// One query of a queue's allocations: each listed id's state; ids not listed have ended.
    Queried {
        queue: QueueId,
        asked: Vec<String>,
        result: Result<Vec<(String, BatchState)>, String>,
    },
}

/// Why a dry run did not pass.
#[derive(Debug)]
pub(super) enum CheckFailed {
    /// The batch system refused the test allocation: its words.
    Refused(String),
    /// The batch system could not be asked (its command is missing or hung, or the pilot
    /// script could not be written): why.
    NotAsked(String),
}

/// Runs `argv` as a dry run's step: what it printed, a refusal in the batch system's words if
/// it ran and failed, or why it could not run.
async fn check_step(argv: &[String], system: System) -> Result<Ran, CheckFailed> {
    let ran = run_any(argv, system).await.map_err(CheckFailed::NotAsked)?;
    if ran.ok {
        Ok(ran)
    } else {
        Err(CheckFailed::Refused(ran.failure(&argv[0])))
    }
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

    /// Writes allocation `alloc` of `queue`'s pilot script for `nodes` nodes and submits it.
    pub(super) fn submit(
        &self,
        system: System,
        (queue, alloc, nodes): (QueueId, AllocId, u32),
        name: String,
        spec: &AllocQueueSpec,
    ) {
        let tx = self.tx.clone();
        let prepared = self.prepare(system, &alloc.to_string(), name, (alloc, nodes), spec);
        let batch_args = spec.batch_args.clone();
        tokio::spawn(async move {
            let result = async {
                let (pilot, script) = prepared?;
                let script = script.display().to_string();
                let argv = system.submit_argv(&pilot, &script, &batch_args, false);
                let ran = run(&argv, system).await?;
                system.parse_submit(&ran.stdout)
            }
            .await;
            let _ = tx.send(Answer::Submitted {
                queue,
                alloc,
                system,
                result,
            });
        });
    }

    /// `alloc add`'s dry run of a queue being added (check number `check`): Slurm checks a
    /// test allocation with `sbatch --test-only`; PBS, which has no such thing, is sent a held
    /// one that is then canceled. Its files go to `alloc/check-N/`.
    pub(super) fn dry_run(&self, system: System, check: u32, spec: &AllocQueueSpec) {
        let tx = self.tx.clone();
        let (dir, name) = (format!("check-{check}"), format!("kestrel-check{check}"));
        let prepared = self.prepare(system, &dir, name, (0, spec.nodes), spec);
        let batch_args = spec.batch_args.clone();
        tokio::spawn(async move {
            let result = async {
                let (pilot, script) = prepared.map_err(CheckFailed::NotAsked)?;
                let script = script.display().to_string();
                if system == System::Slurm {
                    let argv = slurm::test_only(&script, &batch_args);
                    return check_step(&argv, system).await.map(|_| ());
                }
                let argv = system.submit_argv(&pilot, &script, &batch_args, true);
                let ran = check_step(&argv, system).await?;
                let id = system.parse_submit(&ran.stdout).map_err(CheckFailed::Refused)?;
                let cancel = system.cancel_argv(&[&id]);
                run(&cancel, system).await.map(|_| ()).map_err(|e| {
                    CheckFailed::NotAsked(format!("the held test allocation {id} was taken but not canceled ({e}): cancel it by hand"))
                })
            }
            .await;
            let _ = tx.send(Answer::DryRun { check, result });
        });
    }

    /// Writes the pilot script of an allocation (or of a dry run's test one) to
    /// `alloc/DIR/pilot.sh`.
    fn prepare(
        &self,
        system: System,
        dir: &str,
        job_name: String,
        (alloc, nodes): (AllocId, u32),
        spec: &AllocQueueSpec,
    ) -> Result<(Pilot, PathBuf), String> {
        let exe = super::kestrel_exe().map_err(|e| format!("the pilot: {e}"))?;
        let dir = self.dir.join(dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let pilot = Pilot {
            job_name,
            nodes,
            time_limit_us: spec.time_limit_ms.saturating_mul(1000),
            kestrel: exe.display().to_string(),
            access: self.access.display().to_string(),
            alloc,
            worker_args: spec.worker_args.clone(),
            stdout: dir.join("stdout").display().to_string(),
            stderr: dir.join("stderr").display().to_string(),
        };
        let script = dir.join("pilot.sh");
        std::fs::write(&script, system.script(&pilot))
            .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
        Ok((pilot, script))
    }

    /// Looks for the batch job named `name` of allocation `alloc`, whose submission never
    /// answered (the server stopped meanwhile).
    pub(super) fn find(&self, system: System, (queue, alloc): (QueueId, AllocId), name: String) {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = run(&system.find_argv(&name), system)
                .await
                .map(|ran| ran.stdout.split_whitespace().next().map(str::to_string));
            let _ = tx.send(Answer::Found {
                queue,
                alloc,
                system,
                name,
                result,
            });
        });
    }

    /// Asks for the state of `ids`, all of `queue`'s, in one command, unless one is under way;
    /// whether it asked.
    pub(super) fn query(&mut self, system: System, queue: QueueId, ids: Vec<String>) -> bool {
        if ids.is_empty() || self.querying.contains(&queue) {
            return false;
        }
        self.querying.push(queue);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            let result = match run_any(&system.query_argv(&refs), system).await {
                Ok(ran) => system.query(&refs, ran),
                Err(e) => Err(e),
            };
            let _ = tx.send(Answer::Queried {
                queue,
                asked: ids,
                result,
            });
        });
        true
    }

    /// Cancels batch jobs; a failure is only logged (the next query shows what is left).
    pub(super) fn cancel(&self, system: System, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        tokio::spawn(async move {
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            if let Err(e) = run(&system.cancel_argv(&refs), system).await {
                tracing::warn!("canceling allocations failed: {e}");
            }
        });
    }
}

/// Cancels batch jobs `ids` at once, in one command, on the calling thread (the server is stopping: its runtime
/// will not run a spawned command), waiting for the command at most [`STOP_CANCEL_LIMIT`].
pub(super) fn cancel_now(system: System, ids: &[&str]) -> Result<(), String> {
    let argv = system.cancel_argv(ids);
    let mut child = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("`{}` could not run: {e}", argv[0]))?;
    let deadline = std::time::Instant::now() + STOP_CANCEL_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(s)) if s.success() => return Ok(()),
            Ok(Some(s)) => return Err(format!("`{}` failed ({s})", argv[0])),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`{}` did not answer within {} s",
                    argv[0],
                    STOP_CANCEL_LIMIT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for `{}`: {e}", argv[0])),
        }
    }
}

/// How long a cancel at the server's stop may take.
const STOP_CANCEL_LIMIT: Duration = Duration::from_secs(5);

/// What a command printed, and whether it succeeded.
struct Ran {
    ok: bool,
    status: String,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// Why it failed, in the batch system's words.
    fn failure(&self, program: &str) -> String {
        // Debian's qsub wrapper says what went wrong on stdout.
        let said = if self.stderr.is_empty() {
            self.stdout.trim()
        } else {
            &self.stderr
        };
        format!("`{program}` failed ({}): {said}", self.status)
    }
}

/// Runs `argv`; what it printed, or why it failed (its words, or that it could not start or
/// hung).
async fn run(argv: &[String], system: System) -> Result<Ran, String> {
    let ran = run_any(argv, system).await?;
    if ran.ok {
        Ok(ran)
    } else {
        Err(ran.failure(&argv[0]))
    }
}

/// Runs `argv` with [`COMMAND_LIMIT`]; what it printed, however it exited.
async fn run_any(argv: &[String], system: System) -> Result<Ran, String> {
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
                "`{program}` is not on the server's PATH: start the server on a {} login node, or put the batch system's commands on its PATH",
                system.family()
            ))
        }
        Ok(Err(e)) => return Err(format!("`{program}` could not run: {e}")),
        Ok(Ok(out)) => out,
    };
    Ok(Ran {
        ok: out.status.success(),
        status: out.status.to_string(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}
