//! A submission's inputs checked against the store before the job is taken: a file that no
//! task writes and the store does not have would fail every task that reads it at run time
//! (and cancel what depends on them), so it is refused at once, by name.

use kestrel_core::files::cached_name;
use kestrel_core::placeholders::{substitute, Values};
use kestrel_core::{JobSpec, Scheduler, TaskSet};
use rustc_hash::FxHashSet;
use std::path::Path;

/// Why the job cannot be taken, if an input of one of its tasks is nowhere: not written by
/// any task known to `core` or by another task of the job, and not in `store` (a directory;
/// an HTTP store is not looked at here: its tasks fail at run time saying what is missing).
pub(super) fn missing_input(
    core: &Scheduler,
    store: &str,
    spec: &JobSpec,
    tasks: &TaskSet,
) -> Option<String> {
    let files = &spec.template.files;
    if files.inputs.is_empty() || store.contains("://") {
        return None;
    }
    let job_s = core.next_job_id().to_string();
    // What the job's own tasks write.
    let own: FxHashSet<String> = names_of(&job_s, tasks, &files.outputs)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    let mut seen: FxHashSet<String> = FxHashSet::default();
    for (task, name) in names_of(&job_s, tasks, &files.inputs) {
        if own.contains(&name) || !seen.insert(name.clone()) {
            continue;
        }
        if core.is_produced(&cached_name(Some(store), &name)) {
            continue;
        }
        // A name that leaves the store is the worker's to refuse, with its own message.
        if !Path::new(store).join(&name).exists() && !name.split('/').any(|p| p == "..") {
            if !Path::new(store).is_dir() {
                return Some(format!(
                    "task {task} reads {name}, but the store {store} does not exist (no such directory: check --store)"
                ));
            }
            return Some(format!(
                "task {task} reads {name}, which no task writes and the store {store} does not have; check the name, or submit the job that writes it first"
            ));
        }
    }
    None
}

/// Each task's names of `patterns` in job `job_s`, with the task's id: (task id, name).
fn names_of(job_s: &str, tasks: &TaskSet, patterns: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if patterns.is_empty() {
        return out;
    }
    for i in 0..tasks.len() {
        let task = match tasks {
            TaskSet::Array(r) => r.id_at(i).unwrap_or(i),
            _ => i,
        }
        .to_string();
        let values = Values {
            job: job_s,
            task: &task,
            line: tasks.line(i),
        };
        for p in patterns {
            out.push((task.clone(), substitute(p, &values).into_owned()));
        }
    }
    out
}
