//! Which workers stop getting tasks: Falkon's suspension of offending nodes, judged fairly.
//!
//! A task that fails wherever it runs is the task's fault, not the worker's: a sweep in which
//! every fifth point fails must never quarantine anyone. So a worker is judged only against the
//! other workers *on the same job*: it is quarantined when most of its recent tasks of a job
//! fail while the other workers ran as many of that job's tasks and failed at most a third as
//! often. The counts decay (halved every window), so old history fades.

use crate::spec::JobId;

/// Successes and failures of one job's tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    pub ok: u32,
    pub failed: u32,
}

impl Outcomes {
    fn runs(self) -> u64 {
        u64::from(self.ok) + u64::from(self.failed)
    }

    fn count(&mut self, ok: bool) {
        let c = if ok { &mut self.ok } else { &mut self.failed };
        *c = c.saturating_add(1);
    }

    fn halve(&mut self, times: u64) {
        let shift = times.min(31) as u32;
        self.ok >>= shift;
        self.failed >>= shift;
    }

    /// What is left of `self` without `part` (never below zero: halving a sum and halving its
    /// parts round differently).
    pub fn without(self, part: Outcomes) -> Outcomes {
        Outcomes {
            ok: self.ok.saturating_sub(part.ok),
            failed: self.failed.saturating_sub(part.failed),
        }
    }
}

/// When counts are halved: at every multiple of the window, the same instants for every
/// worker and job, so a job's total stays the sum of its workers' counts. Kept as the next
/// such instant, so the per-task path compares instead of dividing.
#[derive(Clone, Copy, Debug, Default)]
struct Halving {
    next_us: u64,
}

impl Halving {
    /// How many window boundaries have passed since the last call (0 almost always).
    fn passed(&mut self, now_us: u64, window_us: u64) -> u64 {
        if now_us < self.next_us {
            return 0;
        }
        let window = window_us.max(1);
        // The first call only sets the boundary: there is nothing to halve yet.
        let passed = if self.next_us == 0 {
            0
        } else {
            1 + (now_us - self.next_us) / window
        };
        self.next_us = (now_us / window + 1) * window;
        passed
    }
}

/// A job's outcomes on all workers, fading like each worker's [`Tally`]. Counting starts at
/// the job's first failure (until then there is nobody to judge): a job whose tasks never
/// fail costs the per-task path one test.
#[derive(Clone, Copy, Debug, Default)]
pub struct JobOutcomes {
    halving: Halving,
    counts: Outcomes,
    failing: bool,
}

impl JobOutcomes {
    /// Whether runs of this job are counted (it has failed once): call before [`Self::record`].
    pub fn counting(&mut self, ok: bool) -> bool {
        self.failing |= !ok;
        self.failing
    }

    /// Counts one ended run; returns the counts after it.
    pub fn record(&mut self, now_us: u64, window_us: u64, ok: bool) -> Outcomes {
        let passed = self.halving.passed(now_us, window_us);
        if passed > 0 {
            self.counts.halve(passed);
        }
        self.counts.count(ok);
        self.counts
    }
}

/// A worker's recent task outcomes, per job. A worker runs a few jobs at a time, so a short
/// vector, looked into at the last job's place first, beats a map on the per-task path.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    jobs: Vec<(JobId, Outcomes)>,
    halving: Halving,
    /// Where the last job counted is in `jobs`.
    last: usize,
}

impl Tally {
    /// Counts one ended run of a task of `job`; returns the job's counts here after it.
    pub fn record(&mut self, now_us: u64, window_us: u64, job: JobId, ok: bool) -> Outcomes {
        let passed = self.halving.passed(now_us, window_us);
        if passed > 0 {
            for (_, o) in &mut self.jobs {
                o.halve(passed);
            }
            self.jobs.retain(|(_, o)| o.runs() > 0);
        }
        if self.jobs.get(self.last).is_none_or(|(j, _)| *j != job) {
            self.last = match self.jobs.iter().position(|(j, _)| *j == job) {
                Some(p) => p,
                None => {
                    self.jobs.push((job, Outcomes::default()));
                    self.jobs.len() - 1
                }
            };
        }
        let o = &mut self.jobs[self.last].1;
        o.count(ok);
        *o
    }

    /// Forgets everything (a lifted quarantine starts afresh).
    pub fn clear(&mut self) {
        self.jobs.clear();
    }
}

/// Whether a worker whose tasks of a job ended as `mine` is faulty, given how the same job's
/// tasks ended on the other workers (`others`, summed). `min_failures` is the least evidence:
/// failures on this worker, and runs on the others.
pub fn faulty(mine: Outcomes, others: Outcomes, min_failures: u32) -> bool {
    let min = u64::from(min_failures.max(1));
    let failed = u64::from(mine.failed);
    // Enough failures here, and most of its runs of this job failed...
    if failed < min || 2 * failed < mine.runs() {
        return false;
    }
    // ...while the others ran as many and failed at most a third as often:
    // others.failed / others.runs <= failed / (3 * mine.runs).
    let theirs = others.runs();
    theirs >= min && 3 * u64::from(others.failed) * mine.runs() <= failed * theirs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(ok: u32, failed: u32) -> Outcomes {
        Outcomes { ok, failed }
    }

    #[test]
    fn a_worker_failing_where_others_succeed_is_faulty() {
        assert!(faulty(o(0, 10), o(10, 0), 10));
        assert!(faulty(o(5, 10), o(40, 3), 10));
    }

    #[test]
    fn failures_everywhere_or_too_little_evidence_are_not_a_worker_s_fault() {
        // Every fifth task fails everywhere: same rate here and there.
        assert!(!faulty(o(40, 10), o(40, 10), 10));
        // A job that fails mostly, everywhere.
        assert!(!faulty(o(2, 12), o(3, 11), 10));
        // Too few failures here, or too few runs elsewhere to compare with.
        assert!(!faulty(o(0, 9), o(100, 0), 10));
        assert!(!faulty(o(0, 30), o(9, 0), 10));
        // Failing less than half of the time here.
        assert!(!faulty(o(12, 11), o(100, 0), 10));
    }

    #[test]
    fn counts_are_per_job_and_fade_at_the_same_boundaries_as_the_job_s() {
        let mut t = Tally::default();
        let mut job = JobOutcomes::default();
        let w = 1_000;
        for _ in 0..8 {
            t.record(10, w, 1, false);
            job.record(10, w, false);
        }
        assert_eq!(t.record(20, w, 2, true), o(1, 0));
        // Two windows later the counts are a quarter, and emptied entries are dropped.
        assert_eq!(t.record(2 * w, w, 1, false), o(0, 3));
        assert_eq!(job.record(2 * w + 5, w, false), o(0, 3));
        assert_eq!(t.record(2 * w, w, 2, true), o(1, 0));
        // Within a window nothing fades; one boundary later, counts are halved once.
        assert_eq!(t.record(2 * w + 999, w, 1, false), o(0, 4));
        assert_eq!(t.record(3 * w, w, 1, false), o(0, 3));
        assert_eq!(o(3, 5).without(o(4, 1)), o(0, 4));
    }
}
