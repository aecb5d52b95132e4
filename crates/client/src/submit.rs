//! Submission: keyed, in pieces, resumable.

use crate::connection::{Connection, Losses};
use crate::error::{lost_or_unreachable, Error};
use crate::pieces::{argv_bytes, piece_ranges, string_bytes};
use kestrel_core::{After, IdRanges, JobId, JobSpec, TaskSet};
use kestrel_proto::messages::{Answer, Ask};
use kestrel_proto::{FILES_VERSION, GRAPH_VERSION, NODES_VERSION, TASK_DEPS_VERSION};

/// Task bytes per message, well under the frame limit.
pub const PIECE_BYTES: usize = 4 << 20;

/// A job to submit: what its tasks run and hold, and the tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submission {
    /// What every task runs and holds.
    pub spec: JobSpec,
    /// The tasks.
    pub tasks: TaskSet,
    /// `after` dependencies on submissions earlier in the same call, by position (a job
    /// file's `after = ["NAME"]`): their job ids are added to `spec.after` when known.
    pub earlier: Vec<(usize, Option<IdRanges>)>,
    /// Task dependencies on submissions earlier in the same call (a job file's `deps =
    /// ["NAME:ID"]`), as (entry of `spec.deps`, entry of its `on`, position of the earlier
    /// submission): that `on` entry names the earlier job once its id is known.
    pub earlier_tasks: Vec<(usize, usize, usize)>,
}

impl Submission {
    /// A job of `tasks` running `spec`, depending on nothing submitted with it.
    pub fn new(spec: JobSpec, tasks: TaskSet) -> Submission {
        Submission {
            spec,
            tasks,
            earlier: Vec::new(),
            earlier_tasks: Vec::new(),
        }
    }
}

/// A submission with its idempotency key: the server answers a repeated key with the job the
/// first submit created, so resending after a lost connection is safe, and so is running the
/// same `kestrel submit --key K` twice.
#[derive(Clone, Debug)]
pub struct Keyed {
    /// The idempotency key.
    pub key: String,
    /// The job.
    pub sub: Submission,
}

/// A job the server holds for a submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The job's id.
    pub job: JobId,
    /// The key had made the job before this call: nothing new was submitted.
    pub repeated: bool,
    /// Why the job's tasks cannot run on the workers connected now, if so (it is kept: a
    /// bigger worker may still come).
    pub warning: Option<String>,
}

/// Gives each submission its key: `user`'s key for the only job (`(key, false)`), the user's
/// key and the job's place for several (`(key, true)`: `K#1`, `K#2`, ...), else a fresh
/// random key.
pub fn keyed(subs: Vec<Submission>, user: Option<(&str, bool)>) -> Vec<Keyed> {
    use rand::RngCore;
    subs.into_iter()
        .enumerate()
        .map(|(i, sub)| {
            let key = match user {
                Some((k, false)) => k.to_string(),
                Some((k, true)) => format!("{k}#{}", i + 1),
                None => {
                    let mut k = [0u8; 16];
                    rand::rngs::OsRng.fill_bytes(&mut k);
                    hex::encode(k)
                }
            };
            Keyed { key, sub }
        })
        .collect()
}

impl Connection {
    /// Submits `subs` in order and returns the jobs the server holds for them. A list too big
    /// for one message goes in pieces; after a lost connection (within the reconnection
    /// window) the submission goes on with the first job the server had not confirmed, and
    /// the keys make sure no task is added twice.
    pub async fn submit(&mut self, subs: &[Keyed]) -> Result<Vec<Submitted>, Error> {
        let mut done = Vec::with_capacity(subs.len());
        let mut resumed = false;
        let mut losses = Losses::default();
        loop {
            let confirmed = done.len();
            match submit_from(self, subs, &mut done, resumed).await {
                // Lost between pieces: without a window to reconnect in, the error says the
                // job holds only part of its tasks.
                Err(e @ (Error::Client(_) | Error::Partial { .. })) if e.is_unreachable() => {
                    if done.len() > confirmed {
                        losses = Losses::default();
                    }
                    let partial = match &e {
                        Error::Partial { job, .. } => Some(*job),
                        _ => None,
                    };
                    match (self.reconnect(e, &mut losses).await, partial) {
                        // Out of time with a job half added: say which, or it stays open.
                        (Err(Error::GaveUp(why)), Some(job)) => {
                            return Err(Error::GaveUp(format!(
                                "{why}; job {job} holds only part of its tasks: cancel it with `kestrel job cancel {job}` and submit again"
                            )))
                        }
                        (gone, _) => gone?,
                    }
                    resumed = true;
                }
                Err(Error::Refused(source)) if !done.is_empty() => {
                    return Err(Error::RefusedAfter {
                        at: done.len(),
                        submitted: done.iter().map(|d| d.job).collect(),
                        source,
                    })
                }
                other => return other.map(|()| done),
            }
        }
    }
}

/// Submits `subs[done.len()..]`, pushing each job once the server holds all its tasks. A
/// lost connection comes back as [`Error::Client`]; calling again after reconnecting
/// (`resumed`) goes on with the first job not yet confirmed.
async fn submit_from(
    conn: &mut Connection,
    subs: &[Keyed],
    done: &mut Vec<Submitted>,
    resumed: bool,
) -> Result<(), Error> {
    let first_unconfirmed = done.len();
    let piece_bytes = conn.piece_bytes;
    let client = conn.client();
    for k in &subs[done.len()..] {
        let mut spec = k.sub.spec.clone();
        for (pos, tasks) in &k.sub.earlier {
            let Some(d) = done.get(*pos) else {
                return Err(Error::Unexpected(format!(
                    "job {:?} depends on submission {} of the same call, which comes after it",
                    spec.name,
                    pos + 1
                )));
            };
            spec.after.push(After {
                job: d.job,
                tasks: tasks.clone(),
            });
        }
        for &(dep, on, pos) in &k.sub.earlier_tasks {
            let (Some(d), Some(r)) = (
                done.get(pos),
                spec.deps.get_mut(dep).and_then(|d| d.on.get_mut(on)),
            ) else {
                return Err(Error::Unexpected(format!(
                    "job {:?} has tasks that depend on submission {} of the same call, which comes after it",
                    spec.name,
                    pos + 1
                )));
            };
            r.job = Some(d.job);
        }
        let graph =
            !spec.after.is_empty() || spec.parent.is_some() || !spec.template.files.keep.is_empty();
        if graph && client.version() < GRAPH_VERSION {
            return Err(Error::TooOld(format!(
                "job {:?} depends on other tasks (--after, local/persist outputs, or a parent task; protocol {GRAPH_VERSION}), but the server speaks protocol {}: upgrade the server",
                spec.name,
                client.version()
            )));
        }
        for (used, needs, what) in [
            (
                spec.nodes > 0,
                NODES_VERSION,
                "takes whole workers per task (--nodes)",
            ),
            (
                !spec.deps.is_empty(),
                TASK_DEPS_VERSION,
                "has tasks that wait for other tasks (deps in a job file)",
            ),
            (
                spec.task_ids.is_some(),
                TASK_DEPS_VERSION,
                "gives its tasks ids of their own (id in a job file)",
            ),
        ] {
            if used && client.version() < needs {
                return Err(Error::TooOld(format!(
                    "job {:?} {what} (protocol {needs}), but the server speaks protocol {}: upgrade the server (`kestrel server info` shows its version)",
                    spec.name,
                    client.version()
                )));
            }
        }
        let needs = FILES_VERSION;
        if client.version() < needs
            && !(spec.template.files.is_empty() && spec.placement.is_default())
        {
            return Err(Error::TooOld(format!(
                "job {:?} declares files, a store or a policy (protocol {needs}), but the server speaks protocol {}: upgrade the server (`kestrel server info` shows its version)",
                spec.name,
                client.version()
            )));
        }
        // Pieces are index ranges into the list, copied one at a time as they are sent: the
        // list itself is kept (for a resend after a reconnect) but never copied whole.
        let tasks = &k.sub.tasks;
        let mut ranges = match tasks {
            TaskSet::List(list) => piece_ranges(list.len(), piece_bytes, |i| argv_bytes(&list[i])),
            TaskSet::Lines(lines) => piece_ranges(lines.len(), piece_bytes, |i| {
                string_bytes(lines.get(i).unwrap_or_default())
            }),
            TaskSet::Array(_) => piece_ranges(0, piece_bytes, |_| 0),
        };
        let rest = ranges.split_off(1);
        let first = match tasks {
            TaskSet::List(list) => TaskSet::List(list[ranges[0].clone()].to_vec()),
            TaskSet::Lines(lines) => TaskSet::Lines(lines.slice(ranges[0].clone())),
            array => array.clone(),
        };
        let answer = client
            .call(Ask::Submit {
                spec,
                tasks: first,
                open: !rest.is_empty(),
                key: Some(k.key.clone()),
            })
            .await;
        let (job, repeated, warning) = match answer {
            Ok(Answer::Submitted {
                job,
                warning,
                repeated,
            }) => (job, repeated, warning),
            Ok(other) => return Err(Error::Unexpected(format!("{other:?}"))),
            Err(e) if lost_or_unreachable(&e) => return Err(e.into()),
            Err(e) => return Err(Error::Refused(e)),
        };
        let n = rest.len();
        for (i, r) in rest.into_iter().enumerate() {
            let (at, close) = (r.start as u32, i + 1 == n);
            let piece = match tasks {
                TaskSet::Lines(lines) => Ask::ExtendLines {
                    job,
                    at,
                    lines: lines.slice(r),
                    close,
                },
                TaskSet::List(list) => Ask::Extend {
                    job,
                    at,
                    argvs: list[r].to_vec(),
                    close,
                },
                TaskSet::Array(_) => break,
            };
            if let Err(source) = client.call(piece).await {
                // A job of a graph is linked at its last piece, and withdrawn whole if that
                // is refused (a cycle, a missing input): refused like a submission then.
                let gone = close
                    && !lost_or_unreachable(&source)
                    && matches!(
                        client.call(Ask::JobInfo { job }).await,
                        Err(kestrel_proto::ClientError::NotFound(_))
                    );
                if gone {
                    return Err(Error::Refused(source));
                }
                return Err(Error::Partial { job, cause: source });
            }
        }
        // After a reconnect the first job may have been sent before the connection broke: a
        // repeated key then names what this call itself submitted.
        let sent_before = resumed && done.len() == first_unconfirmed;
        done.push(Submitted {
            job,
            repeated: repeated && !sent_before,
            warning,
        });
    }
    Ok(())
}
