//! Where default outputs go, so that jobs never write into each other's `job-N/`.
//!
//! A run's server is new each time, so its job numbers would start at 1 and its default
//! outputs (`job-{job}/...` in the task's directory) would land in an earlier run's `job-1/`.
//! Before submitting, the run takes the next free numbers and creates their `job-N`
//! directories itself: `create_dir` fails on one that exists, so two runs started together in
//! one directory take different numbers. Directories left empty are removed at the end.
//!
//! A standalone server numbers its jobs after the `job-N` directories of the directory it
//! starts in ([`first_free`]), for the same reason: a new server (or one without a journal,
//! started again) would otherwise give its job 1 an earlier run's `job-1/`. A job submitted
//! from elsewhere may still meet an older `job-N/` of its number there: `submit` says so
//! ([`Existing`]).

use crate::jobs::{Submission, DEFAULT_STDERR, DEFAULT_STDOUT};
use kestrel_core::Sink;
use std::path::{Path, PathBuf};

/// The output directories a run took: its first job number and, per job, the `job-N`
/// directory created for it (`None` for a job whose outputs go elsewhere).
pub struct RunDirs {
    pub first_job: u32,
    dirs: Vec<Option<PathBuf>>,
}

/// The directory holding a job's default outputs, if it writes any there and it is known
/// before the run (no placeholder in its working directory).
fn default_dir(s: &Submission) -> Option<&Path> {
    let t = &s.spec.template;
    let default = t.stdout == Sink::File(DEFAULT_STDOUT.into())
        || t.stderr == Sink::File(DEFAULT_STDERR.into());
    let cwd = t.cwd.as_deref()?;
    (default && !cwd.contains('{')).then(|| Path::new(cwd))
}

/// The highest `N` of a `job-N` directory in `dir` (0 if none).
fn highest(dir: &Path) -> u32 {
    job_dirs(dir).max().unwrap_or(0)
}

/// The first job number past the `job-N` directories in `dir`.
pub fn first_free(dir: &Path) -> u32 {
    highest(dir).saturating_add(1)
}

/// The `job-N` directories that existed, before submission, where each job writes its default
/// outputs, to tell when a job's own `job-N/` already held files.
pub struct Existing(Vec<Option<(PathBuf, Vec<u32>)>>);

impl Existing {
    /// Looks, for each of `subs`, at the directory of its default outputs.
    pub fn before(subs: &[Submission]) -> Existing {
        Existing(
            subs.iter()
                .map(|s| {
                    let dir = default_dir(s)?;
                    let numbers = job_dirs(dir).collect::<Vec<_>>();
                    (!numbers.is_empty()).then(|| (dir.to_path_buf(), numbers))
                })
                .collect(),
        )
    }

    /// Warns about each new job of `ids` (in the order of the submissions looked at; `None`
    /// for one submitted before, under the same key) whose `job-N/` was there before it.
    pub fn warn(&self, ids: &[Option<u32>]) {
        for (seen, id) in self.0.iter().zip(ids) {
            let (Some((dir, numbers)), Some(id)) = (seen, id) else {
                continue;
            };
            if numbers.contains(id) {
                eprintln!(
                    "warning: job-{id}/ in {} already held files before job {id} (another server's or run's): job {id}'s outputs go in with them, replacing those of the same names; move old job-N directories away before submitting there",
                    dir.display()
                );
            }
        }
    }
}

/// The numbers of the `job-N` directories in `dir`.
fn job_dirs(dir: &Path) -> impl Iterator<Item = u32> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let n: u32 = e.file_name().to_str()?.strip_prefix("job-")?.parse().ok()?;
            e.file_type().ok()?.is_dir().then_some(n)
        })
}

impl RunDirs {
    /// Takes job numbers for `subs` (they get consecutive ids, in order) whose `job-N`
    /// directories do not exist yet, and creates them.
    pub fn take(subs: &[Submission]) -> RunDirs {
        let wanted: Vec<Option<&Path>> = subs.iter().map(default_dir).collect();
        // One past the highest `job-N` in any of the directories.
        let past_highest = || {
            wanted
                .iter()
                .flatten()
                .map(|d| highest(d))
                .max()
                .unwrap_or(0)
                + 1
        };
        let mut first = past_highest();
        // Another run may take the same numbers between the look and the create: the first to
        // create a directory has it, the other moves past it.
        for _ in 0..1000 {
            let mut made: Vec<Option<PathBuf>> = Vec::with_capacity(subs.len());
            let mut taken = false;
            for (i, dir) in wanted.iter().enumerate() {
                let Some(dir) = dir else {
                    made.push(None);
                    continue;
                };
                let path = dir.join(format!("job-{}", first + i as u32));
                match std::fs::create_dir(&path) {
                    Ok(()) => made.push(Some(path)),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        taken = true;
                        break;
                    }
                    // A missing or unwritable directory: the tasks will say so themselves.
                    Err(_) => made.push(None),
                }
            }
            if !taken {
                return RunDirs {
                    first_job: first,
                    dirs: made,
                };
            }
            for p in made.into_iter().flatten() {
                let _ = std::fs::remove_dir(p);
            }
            first = past_highest();
        }
        RunDirs {
            first_job: first,
            dirs: Vec::new(),
        }
    }

    /// Removes the directories the run left empty and returns the others as the user can
    /// reach them: relative to `here` when inside it.
    pub fn finish(self, here: &Path) -> Vec<String> {
        self.dirs
            .into_iter()
            .flatten()
            .filter(|d| std::fs::remove_dir(d).is_err() && d.is_dir())
            .map(|d| {
                let shown = d.strip_prefix(here).unwrap_or(&d);
                format!("{}/", shown.display())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{from_flags, TaskOptions, TaskShape};

    fn sub(dir: &Path, stdout: Option<&str>) -> Submission {
        let opts = TaskOptions {
            stdout: stdout.map(String::from),
            ..TaskOptions::default()
        };
        let shape = TaskShape {
            array: Some("1-3"),
            each: None,
        };
        from_flags(&opts, shape, vec!["true".into()], dir).unwrap()
    }

    #[test]
    fn numbers_continue_after_earlier_outputs_and_a_taken_one_is_passed() {
        let dir = tempfile::tempdir().unwrap();
        let first = RunDirs::take(&[sub(dir.path(), None)]);
        assert_eq!(first.first_job, 1);
        assert!(dir.path().join("job-1").is_dir());
        // A second run at the same time sees job-1 taken.
        let second = RunDirs::take(&[sub(dir.path(), None), sub(dir.path(), None)]);
        assert_eq!(second.first_job, 2);
        assert!(dir.path().join("job-3").is_dir());
        std::fs::write(dir.path().join("job-2/1.out"), "x").unwrap();
        assert_eq!(second.finish(dir.path()), vec!["job-2/".to_string()]);
        assert!(
            !dir.path().join("job-3").exists(),
            "an empty one is removed"
        );
        // Streamed stdout still writes stderr files under job-N.
        let third = RunDirs::take(&[sub(dir.path(), Some("stream"))]);
        assert_eq!(third.first_job, 3);
        drop(first);
    }

    #[test]
    fn outputs_elsewhere_take_no_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sub(dir.path(), Some("none"));
        s.spec.template.stderr = Sink::Null;
        let d = RunDirs::take(&[s]);
        assert_eq!(d.first_job, 1);
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }
}
