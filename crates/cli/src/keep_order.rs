//! `kestrel run`'s files shared by several tasks, written in task order (GNU parallel's
//! `--keep-order`): `kestrel run --array 1-5 --stdout all.txt -- echo hi {task}` leaves
//! `hi 1` to `hi 5`, in that order, however the tasks were spread and whenever they ended.
//!
//! The run knows all its jobs, so it need not trust the order the tasks end in: before
//! submitting, it points each shared output at a file of each task's own in a hidden directory
//! of its own (`.kestrel-run-PID/JOB/TASK.out`, beside the run's default outputs, where every
//! worker of the run writes: with `--alloc`, on other nodes too), so the tasks write as fast
//! as into per-task files, and a task run again replaces its own part. When the run ends (or
//! is interrupted), the parts are added to the shared files in task order, each file written
//! afresh, and the directory goes. A task that wrote nothing has no part (the run's workers
//! remove empty own files). A standalone server's tasks add their output whole as each ends
//! (see the worker's `sinks`), as a server cannot know when a job is complete for a file.

use crate::jobs::Submission;
use kestrel_core::placeholders::{fields_needed, output_path, shared_file, Values};
use kestrel_core::{IdRanges, JobId, Sink, TaskSet, TaskTemplate};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// The shared outputs of a run's jobs and where their parts are.
pub struct KeepOrder {
    /// The run's directory of parts.
    parts: PathBuf,
    jobs: Vec<Ordered>,
}

/// A job of the run with an output shared by its tasks.
struct Ordered {
    /// Its place among the run's jobs.
    nth: u32,
    /// Its template as submitted: where its outputs were meant to go.
    template: TaskTemplate,
    /// Its tasks (their ids and, when a path holds a field of the line, their lines).
    tasks: TaskSet,
    /// Stdout's and stderr's part names, for the streams whose file the tasks share.
    streams: [Option<&'static str>; 2],
}

impl KeepOrder {
    /// Points the shared outputs of `subs` at parts under a directory in `here` (made by the
    /// workers as they write there); `None` if no job has one.
    pub fn prepare(subs: &mut [Submission], here: &Path) -> Option<KeepOrder> {
        let parts = here.join(format!(".kestrel-run-{}", std::process::id()));
        let mut jobs = Vec::new();
        for (nth, s) in subs.iter_mut().enumerate() {
            let t = &s.spec.template;
            let shared = |sink: &Sink| match sink {
                Sink::File(p) => s.tasks.len() > 1 && shared_file(t.cwd.as_deref(), p),
                Sink::Null | Sink::Stream { .. } => false,
            };
            let same = t.stdout == t.stderr;
            let streams = [
                shared(&t.stdout).then_some("out"),
                shared(&t.stderr).then_some(if same { "out" } else { "err" }),
            ];
            if streams == [None, None] {
                continue;
            }
            let template = t.clone();
            let part = |name: &str| {
                let p = parts.join("{job}").join(format!("{{task}}.{name}"));
                Sink::File(p.display().to_string())
            };
            let t = &mut s.spec.template;
            if let Some(name) = streams[0] {
                t.stdout = part(name);
            }
            if let Some(name) = streams[1] {
                t.stderr = part(name);
            }
            jobs.push(Ordered {
                nth: nth as u32,
                tasks: ids_and_lines(&template, &s.tasks),
                template,
                streams,
            });
        }
        (!jobs.is_empty()).then_some(KeepOrder { parts, jobs })
    }

    /// Writes each shared file afresh from the parts, in task order (jobs in the order they
    /// were submitted, `submitted` their ids), and removes the parts. A job not submitted (a
    /// refused submission) leaves its files as they were. Returns the files written, as the
    /// user can reach them (relative to `here` when inside it).
    pub fn finish(self, submitted: &[JobId], here: &Path) -> Vec<String> {
        let mut files: HashMap<PathBuf, Option<File>> = HashMap::new();
        let mut written = Vec::new();
        for job in &self.jobs {
            let Some(&id) = submitted.get(job.nth as usize) else {
                continue;
            };
            let id_s = id.to_string();
            let mut task_s = String::new();
            for index in 0..job.tasks.len() {
                task_s.clear();
                task_s.push_str(&job.tasks.id_at(index).to_string());
                let values = Values {
                    job: &id_s,
                    task: &task_s,
                    line: job.tasks.line(index),
                };
                let t = &job.template;
                for (slot, sink) in [&t.stdout, &t.stderr].into_iter().enumerate() {
                    // Stderr into stdout's file has stdout's part ("out"), added once.
                    let part = job.streams[slot].filter(|p| slot == 0 || *p != "out");
                    let (Some(part), Some(target)) = (part, output_path(t, sink, &values)) else {
                        continue;
                    };
                    let file = files.entry(target.clone()).or_insert_with(|| {
                        written.push(shown(&target, here));
                        create(&target)
                    });
                    let from = self.parts.join(&id_s).join(format!("{task_s}.{part}"));
                    if let Some(to) = file {
                        append(&from, to, &target);
                    }
                }
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.parts) {
            if e.kind() != io::ErrorKind::NotFound {
                eprintln!(
                    "warning: cannot remove the run's directory of outputs in progress, {}: {e}",
                    self.parts.display()
                );
            }
        }
        written
    }
}

/// What of `tasks` the end of the run needs: the ids, and the lines only if a path of
/// `template` holds a field of them (a list of lines may be big).
fn ids_and_lines(template: &TaskTemplate, tasks: &TaskSet) -> TaskSet {
    match tasks {
        TaskSet::Array(ids) => TaskSet::Array(ids.clone()),
        TaskSet::Lines(lines) if fields_needed(template) > 0 => TaskSet::Lines(lines.clone()),
        other => TaskSet::Array(IdRanges::span(0, other.len().saturating_sub(1))),
    }
}

/// Creates (or empties) a shared file and its directory; `None`, said, if it cannot be.
fn create(path: &Path) -> Option<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    match File::create(path) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!(
                "error: cannot write {}: {e}; the tasks' outputs for it are lost",
                path.display()
            );
            None
        }
    }
}

/// Adds the part `from` (if the task wrote one) to `to`, then removes it.
fn append(from: &Path, to: &mut File, target: &Path) {
    let mut part = match File::open(from) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", from.display());
            return;
        }
    };
    if let Err(e) = io::copy(&mut part, to) {
        eprintln!(
            "error: cannot add {} to {}: {e}",
            from.display(),
            target.display()
        );
        return;
    }
    let _ = std::fs::remove_file(from);
}

fn shown(path: &Path, here: &Path) -> String {
    path.strip_prefix(here)
        .unwrap_or(path)
        .display()
        .to_string()
}
