//! A job file as a graph: the jobs of one file pass files to each other, and what can be
//! known of that before anything is submitted is checked here, so that a file refused for it
//! submits nothing.
//!
//! Each job's file names are worked out task by task (the server does the same per job, but
//! sees the file's jobs one at a time): two jobs writing one file and a job reading what a
//! later job writes are refused, naming the jobs, tasks and file; an output a later job reads
//! and that is not marked `local:` or `persist:` is made `local` (intermediate data).

use anyhow::{bail, Result};
use kestrel_client::Submission;
use kestrel_core::placeholders::try_each_name;
use kestrel_core::Keep;
use std::collections::HashMap;

/// Jobs with more tasks than this are not worked out name by name (the server still checks
/// each job as it comes).
const MAX_TASKS: u32 = 200_000;

/// The names `patterns` make for every task of `sub` (pattern index, task id, name); `None`
/// when they cannot be known before submission (`{job}`) or the job is too big.
fn names(sub: &Submission, patterns: &[String]) -> Option<Vec<(usize, u32, String)>> {
    if sub.tasks.len() > MAX_TASKS || patterns.iter().any(|p| p.contains("{job}")) {
        return None;
    }
    let mut out = Vec::new();
    let _ = try_each_name(
        &sub.spec.ids_of(&sub.tasks),
        "",
        0,
        patterns,
        |_, id, name| {
            out.push((out.len() % patterns.len(), id, name.into_owned()));
            Ok::<(), ()>(())
        },
    );
    Some(out)
}

fn job_label(subs: &[Submission], pos: usize) -> String {
    format!("job #{} ({})", pos + 1, subs[pos].spec.name)
}

/// Checks the file's jobs against each other and resolves their `auto` outputs.
pub fn check(subs: &mut [Submission]) -> Result<()> {
    if subs.len() < 2 {
        return Ok(());
    }
    // name -> (job, output pattern, task)
    let mut writers: HashMap<String, (usize, usize, u32)> = HashMap::new();
    let mut known = vec![true; subs.len()];
    for (pos, sub) in subs.iter().enumerate() {
        let Some(outs) = names(sub, &sub.spec.template.files.outputs) else {
            known[pos] = false;
            continue;
        };
        for (k, task, name) in outs {
            if let Some((other, _, other_task)) = writers.get(&name) {
                bail!(
                    "{} task {other_task} and {} task {task} both write {name}; a file has one writer",
                    job_label(subs, *other),
                    job_label(subs, pos)
                );
            }
            writers.insert(name, (pos, k, task));
        }
    }
    let mut read_later: Vec<Vec<bool>> = subs
        .iter()
        .map(|s| vec![false; s.spec.template.files.outputs.len()])
        .collect();
    for (pos, sub) in subs.iter().enumerate() {
        let Some(ins) = names(sub, &sub.spec.template.files.inputs) else {
            continue;
        };
        for (_, task, name) in ins {
            let Some((writer, k, _)) = writers.get(&name) else {
                continue;
            };
            if *writer > pos {
                bail!(
                    "{} task {task} reads {name}, which {} writes later in the file; put the writer first",
                    job_label(subs, pos),
                    job_label(subs, *writer)
                );
            }
            if *writer < pos {
                read_later[*writer][*k] = true;
            }
        }
    }
    for (pos, sub) in subs.iter_mut().enumerate() {
        let files = &mut sub.spec.template.files;
        if !known[pos] || !read_later[pos].iter().any(|&r| r) {
            continue;
        }
        let mut keep: Vec<Keep> = (0..files.outputs.len()).map(|i| files.keep_of(i)).collect();
        for (k, mode) in keep.iter_mut().enumerate() {
            if *mode == Keep::Auto && read_later[pos][k] {
                *mode = Keep::Local;
            }
        }
        files.keep = keep;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::{IdRanges, JobSpec, TaskSet};

    fn job(name: &str, inputs: &[&str], outputs: &[&str]) -> Submission {
        let mut spec = JobSpec::command(name, vec!["x".into()]);
        spec.template.files.inputs = inputs.iter().map(|s| s.to_string()).collect();
        spec.template.files.outputs = outputs.iter().map(|s| s.to_string()).collect();
        Submission::new(spec, TaskSet::Array(IdRanges::span(1, 3)))
    }

    #[test]
    fn outputs_a_later_job_reads_stay_local() {
        let mut subs = vec![
            job("proj", &["raw/{task}"], &["p/{task}", "area/{task}"]),
            job("add", &["p/{task}"], &["mosaic/{task}"]),
        ];
        check(&mut subs).unwrap();
        let files = &subs[0].spec.template.files;
        assert_eq!(files.keep, vec![Keep::Local, Keep::Auto]);
        assert!(subs[1].spec.template.files.keep.is_empty());
    }

    #[test]
    fn two_writers_and_reading_ahead_are_refused_by_name() {
        let mut subs = vec![job("a", &[], &["x/{task}"]), job("b", &[], &["x/{task}"])];
        let err = check(&mut subs).unwrap_err().to_string();
        assert_eq!(
            err,
            "job #1 (a) task 1 and job #2 (b) task 1 both write x/1; a file has one writer"
        );
        let mut subs = vec![job("a", &["y/{task}"], &[]), job("b", &[], &["y/{task}"])];
        let err = check(&mut subs).unwrap_err().to_string();
        assert!(
            err.contains("job #1 (a) task 1 reads y/1, which job #2 (b) writes later"),
            "{err}"
        );
    }
}
