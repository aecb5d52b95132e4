//! Which of a task's own output files hold output, so that `kestrel job cat` can tell a file
//! deleted since from one the task left empty (which its worker removed).
//!
//! A task's own output file (its path names both `{job}` and `{task}`: the defaults) is
//! removed by the worker when the task leaves it empty, so a missing one means nothing by
//! itself. A worker of version 11 says, with each end, where its task's own files differ from
//! the usual (a stdout file written, an empty stderr file removed: `TaskOutput::files`), so the
//! usual task costs no byte. Marks are kept in memory, three bits per task of a job with own
//! files, for the ends accepted since this server started from workers that report them; a
//! task ended before (or on an older or no-op worker) is not known, and `job cat` then says
//! nothing of a missing file, as before.

use kestrel_core::placeholders::names_one_task;
use kestrel_core::{JobId, JobSpec, Sink, TaskIndex};
use kestrel_proto::messages::{STDERR_WRITTEN, STDOUT_EMPTY};
use rustc_hash::FxHashMap;

/// The marks of every job with own output files.
#[derive(Default)]
pub struct FileMarks {
    /// By job; `None` for a job seen to have no own output file.
    jobs: FxHashMap<JobId, Option<Marks>>,
    /// Whether any job has own output files (until then task ends skip this).
    any: bool,
}

/// One job's marks.
struct Marks {
    /// Whether stdout's and stderr's files are the tasks' own.
    own: [bool; 2],
    /// Tasks whose latest run's report says how its files are.
    known: Bits,
    /// Of those: stdout left empty (removed), stderr written (kept).
    unusual: [Bits; 2],
}

/// A bit per task index, grown as needed.
#[derive(Default)]
struct Bits(Vec<u64>);

impl Bits {
    fn set(&mut self, index: TaskIndex, on: bool) {
        let (word, bit) = (index as usize / 64, index % 64);
        if word >= self.0.len() {
            if !on {
                return;
            }
            self.0.resize(word + 1, 0);
        }
        if on {
            self.0[word] |= 1 << bit;
        } else {
            self.0[word] &= !(1 << bit);
        }
    }

    fn get(&self, index: TaskIndex) -> bool {
        self.0
            .get(index as usize / 64)
            .is_some_and(|w| w & (1 << (index % 64)) != 0)
    }
}

/// Whether `sink` is a file of each task's own.
fn own(sink: &Sink) -> bool {
    matches!(sink, Sink::File(p) if names_one_task(p))
}

impl FileMarks {
    /// Notes a job (submitted or restored): its task ends concern these marks if it has own
    /// output files.
    pub fn note_job(&mut self, spec: &JobSpec) {
        self.any |= own(&spec.template.stdout) || own(&spec.template.stderr);
    }

    /// Whether a task end may concern these marks.
    pub fn any(&self) -> bool {
        self.any
    }

    /// Records the accepted end of task `index` of `job` (of `spec`): `files`, its worker's
    /// report of its own files (`TaskOutput::files`), or `None` from a worker that does not
    /// report them (then the task is not known).
    pub fn record(&mut self, job: JobId, spec: &JobSpec, index: TaskIndex, files: Option<u8>) {
        let entry = self.jobs.entry(job).or_insert_with(|| {
            let own = [own(&spec.template.stdout), own(&spec.template.stderr)];
            (own != [false, false]).then(|| Marks {
                own,
                known: Bits::default(),
                unusual: Default::default(),
            })
        });
        let Some(m) = entry else { return };
        m.known.set(index, files.is_some());
        let files = files.unwrap_or(0);
        m.unusual[0].set(index, files & STDOUT_EMPTY != 0);
        m.unusual[1].set(index, files & STDERR_WRITTEN != 0);
    }

    /// Whether the latest run of task `index` of `job` left output in its own file of stream
    /// `stream` (0 stdout, 1 stderr); `None` if that is not known, or the file is not the
    /// task's own.
    pub fn written(&self, job: JobId, index: TaskIndex, stream: usize) -> Option<bool> {
        let m = self.jobs.get(&job)?.as_ref()?;
        if !m.own[stream] || !m.known.get(index) {
            return None;
        }
        let unusual = m.unusual[stream].get(index);
        Some(if stream == 0 { !unusual } else { unusual })
    }

    /// Drops the marks of `job` (`kestrel job forget`).
    pub fn forget(&mut self, job: JobId) {
        self.jobs.remove(&job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(stdout: &str, stderr: &str) -> JobSpec {
        let mut s = JobSpec::command("t", vec!["true".into()]);
        s.template.stdout = Sink::File(stdout.into());
        s.template.stderr = Sink::File(stderr.into());
        s
    }

    #[test]
    fn the_usual_costs_nothing_and_the_unusual_is_told() {
        let mut m = FileMarks::default();
        let s = spec("job-{job}/{task}.out", "job-{job}/{task}.err");
        m.note_job(&s);
        assert!(m.any());
        m.record(1, &s, 0, Some(0));
        m.record(1, &s, 130, Some(STDOUT_EMPTY | STDERR_WRITTEN));
        m.record(1, &s, 2, None);
        assert_eq!(m.written(1, 0, 0), Some(true));
        assert_eq!(m.written(1, 0, 1), Some(false));
        assert_eq!(m.written(1, 130, 0), Some(false));
        assert_eq!(m.written(1, 130, 1), Some(true));
        assert_eq!(m.written(1, 2, 0), None, "an unreporting worker's end");
        assert_eq!(m.written(1, 7, 0), None, "not ended");
        // A later run replaces what the earlier said.
        m.record(1, &s, 130, Some(0));
        assert_eq!(m.written(1, 130, 0), Some(true));
        m.forget(1);
        assert_eq!(m.written(1, 0, 0), None);
    }

    #[test]
    fn files_other_tasks_may_write_are_never_known() {
        let mut m = FileMarks::default();
        let s = spec("all.txt", "errors/{task}.err");
        m.note_job(&s);
        assert!(!m.any());
        m.record(2, &s, 0, Some(0));
        assert_eq!((m.written(2, 0, 0), m.written(2, 0, 1)), (None, None));
        let half = spec("all.txt", "job-{job}/{task}.err");
        m.record(3, &half, 0, Some(STDERR_WRITTEN));
        assert_eq!((m.written(3, 0, 0), m.written(3, 0, 1)), (None, Some(true)));
    }
}
