//! Which workers stop getting tasks: Falkon's suspension of offending nodes, judged fairly.
//!
//! A task that fails wherever it runs is the task's fault, not the worker's: a sweep in which
//! every fifth point fails, or a job that fails everywhere, must never quarantine anyone. So a
//! worker is judged only against the other workers *on the same job*, by two kinds of
//! evidence, either of which is enough:
//!
//! - **Rates** (first runs of tasks): at least `k` of its recent tasks of a job failed, more
//!   than half of them, while the other workers failed at most a third as often, and so
//!   unevenly that chance would do it less than once in a thousand (Fisher's exact test of the
//!   two rates). A few successes elsewhere are enough against many failures here: a node that
//!   fails at once takes most of a job's tasks, and the others never run as many.
//! - **The same tasks elsewhere** (retries): `2k` of its runs of a job failed in a row, and at
//!   least `k` of those tasks then succeeded when run again on another worker, at least three
//!   times as many as failed there too. Retries are judged only this way: a task run again is
//!   one that failed before, so its failure rate says nothing of the worker that gets it.
//!
//! The counts of first runs decay (halved every window), so old history fades; a streak ends
//! with the worker's next success of the job.

use crate::spec::{JobId, WorkerId};

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
    /// A worker failing most of its tasks of the job, not yet judged faulty for want of
    /// evidence from the others: judged again at their next successes (a node failing at once
    /// may have taken the job's last task before the others ran a few).
    pub suspect: Option<WorkerId>,
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

    /// The counts as they stand (as of the last [`Self::record`]).
    pub fn counts(&self) -> Outcomes {
        self.counts
    }
}

/// A worker's failures of a job in a row, and what became of those tasks on other workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streak {
    /// Runs of the job that failed here since its last success here.
    pub len: u32,
    /// When the first of them failed.
    pub since_us: u64,
    /// Tasks failed in it that then succeeded on another worker.
    pub cleared: u32,
    /// Tasks failed in it that failed on another worker too (before or after).
    pub confirmed: u32,
}

impl Streak {
    fn count(&mut self, now_us: u64, ok: bool) {
        if ok {
            *self = Streak::default();
        } else {
            if self.len == 0 {
                self.since_us = now_us;
            }
            self.len = self.len.saturating_add(1);
        }
    }

    /// Whether a failure here at `at_us` is one of this streak's.
    fn covers(&self, at_us: u64) -> bool {
        self.len > 0 && at_us >= self.since_us
    }
}

/// What a worker holds against itself for one job: the first runs' outcomes and the streak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobTally {
    /// First runs of the job's tasks here (see [`faulty_by_rates`]).
    pub first: Outcomes,
    /// Failures in a row here (see [`faulty_by_streak`]).
    pub streak: Streak,
}

/// A worker's recent task outcomes, per job. A worker runs a few jobs at a time, so a short
/// vector, looked into at the last job's place first, beats a map on the per-task path.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    jobs: Vec<(JobId, JobTally)>,
    halving: Halving,
    /// Where the last job counted is in `jobs`.
    last: usize,
}

impl Tally {
    /// Counts one ended run of a task of `job` (in its streak, and in the first runs' counts
    /// if it was the task's `first` run); returns the job's tally here after it.
    pub fn record(
        &mut self,
        now_us: u64,
        window_us: u64,
        job: JobId,
        ok: bool,
        first: bool,
    ) -> JobTally {
        let passed = self.halving.passed(now_us, window_us);
        if passed > 0 {
            for (_, t) in &mut self.jobs {
                t.first.halve(passed);
            }
            // A streak is kept whole: failures in a row do not fade.
            self.jobs
                .retain(|(_, t)| t.first.runs() > 0 || t.streak.len > 0);
        }
        let t = self.entry(job);
        t.streak.count(now_us, ok);
        if first {
            t.first.count(ok);
        }
        *t
    }

    /// A task of `job` that failed here at `failed_at_us` ran again on another worker and
    /// ended `ok` or not there: evidence for or against this worker if the failure is one of
    /// its current streak. Returns the job's tally here when it changed.
    pub fn elsewhere(&mut self, job: JobId, failed_at_us: u64, ok: bool) -> Option<JobTally> {
        let t = self
            .jobs
            .iter_mut()
            .find(|(j, _)| *j == job)
            .map(|(_, t)| t)?;
        if !t.streak.covers(failed_at_us) {
            return None;
        }
        let c = if ok {
            &mut t.streak.cleared
        } else {
            &mut t.streak.confirmed
        };
        *c = c.saturating_add(1);
        Some(*t)
    }

    /// The task this worker just failed (its current streak's last) had failed on another
    /// worker before: the task's fault as much as this worker's. Returns the job's tally here
    /// after it, if it has one.
    pub fn failed_before_elsewhere(&mut self, job: JobId) -> Option<JobTally> {
        let (_, t) = self.jobs.iter_mut().find(|(j, _)| *j == job)?;
        t.streak.confirmed = t.streak.confirmed.saturating_add(1);
        Some(*t)
    }

    fn entry(&mut self, job: JobId) -> &mut JobTally {
        if self.jobs.get(self.last).is_none_or(|(j, _)| *j != job) {
            self.last = match self.jobs.iter().position(|(j, _)| *j == job) {
                Some(p) => p,
                None => {
                    self.jobs.push((job, JobTally::default()));
                    self.jobs.len() - 1
                }
            };
        }
        &mut self.jobs[self.last].1
    }

    /// The tally of `job` here, if it has one.
    pub fn of(&self, job: JobId) -> Option<JobTally> {
        self.jobs.iter().find(|(j, _)| *j == job).map(|(_, t)| *t)
    }

    /// Forgets everything (a lifted quarantine starts afresh).
    pub fn clear(&mut self) {
        self.jobs.clear();
    }
}

/// Why a worker was found faulty on a job: the reason `worker list` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// Its first runs failed far more often than the others' (see [`faulty_by_rates`]).
    Rates {
        /// Its first runs of the job.
        mine: Outcomes,
        /// The other workers' first runs of the job.
        others: Outcomes,
    },
    /// It failed many in a row of tasks that succeeded elsewhere (see [`faulty_by_streak`]).
    Streak(Streak),
}

impl Evidence {
    /// The reason, naming `job`.
    pub fn reason(&self, job: JobId) -> String {
        match self {
            Evidence::Rates { mine, others } => format!(
                "{} of its last {} tasks of job {job} failed, against {} of {} on the other workers",
                mine.failed,
                mine.runs(),
                others.failed,
                others.runs(),
            ),
            Evidence::Streak(s) => format!(
                "its last {} runs of job {job} failed, and {} of those tasks then succeeded on other workers ({} failed there too)",
                s.len, s.cleared, s.confirmed,
            ),
        }
    }
}

/// Whether a worker whose runs of a job are tallied as `mine` is faulty, given the other
/// workers' first runs of the same job (`others`, summed); `min_failures` is the least
/// evidence (`k` in the module's text).
pub fn judge(mine: &JobTally, others: Outcomes, min_failures: u32) -> Option<Evidence> {
    if faulty_by_rates(mine.first, others, min_failures) {
        Some(Evidence::Rates {
            mine: mine.first,
            others,
        })
    } else if faulty_by_streak(mine.streak, min_failures) {
        Some(Evidence::Streak(mine.streak))
    } else {
        None
    }
}

/// Whether first runs `mine` fail enough for a judgement by rates, the others' aside: at least
/// `min_failures`, and more than half.
pub fn suspicious(mine: Outcomes, min_failures: u32) -> bool {
    let failed = u64::from(mine.failed);
    failed >= u64::from(min_failures.max(1)) && 2 * failed > mine.runs()
}

/// The chance below which failures falling this unevenly on one worker are not taken for luck.
const CHANCE: f64 = 1e-3;

/// Judged by rates: at least `min_failures` of `mine` failed, more than half, while `others`
/// failed at most a third as often, and the difference is not chance (see [`uneven_by_chance`]).
pub fn faulty_by_rates(mine: Outcomes, others: Outcomes, min_failures: u32) -> bool {
    let failed = u64::from(mine.failed);
    // Enough failures here, and most of its runs of this job failed...
    if !suspicious(mine, min_failures) {
        return false;
    }
    // ...while the others ran some and failed at most a third as often:
    // others.failed / others.runs <= failed / (3 * mine.runs).
    let theirs = others.runs();
    theirs > 0
        && 3 * u64::from(others.failed) * mine.runs() <= failed * theirs
        && uneven_by_chance(mine, others) < CHANCE
}

/// Judged by the same tasks elsewhere: `2 * min_failures` failures in a row, at least
/// `min_failures` of those tasks succeeded on another worker, three times as many as failed
/// there too.
pub fn faulty_by_streak(s: Streak, min_failures: u32) -> bool {
    let min = min_failures.max(1);
    s.len >= min.saturating_mul(2)
        && s.cleared >= min
        && u64::from(s.confirmed) * 3 <= u64::from(s.cleared)
}

/// The chance that at least `mine.failed` of all failures fall on a worker that ran
/// `mine.runs()` of all runs, if every run were as likely to fail wherever it ran: the
/// one-sided p-value of Fisher's exact test, the upper tail of the hypergeometric law.
///
/// Hand-written (a dozen lines over `ln`): the statistics crates would bring linear algebra
/// into a core that depends on three small crates.
pub fn uneven_by_chance(mine: Outcomes, others: Outcomes) -> f64 {
    let n = mine.runs() as f64;
    let all = (mine.runs() + others.runs()) as f64;
    let failures = (u64::from(mine.failed) + u64::from(others.failed)) as f64;
    let x = f64::from(mine.failed);
    let top = n.min(failures);
    let ln_choose = |a: f64, b: f64| ln_factorial(a) - ln_factorial(b) - ln_factorial(a - b);
    // P(X = x), then each next term from the one before.
    let mut term =
        (ln_choose(failures, x) + ln_choose(all - failures, n - x) - ln_choose(all, n)).exp();
    let mut sum = 0.0;
    let mut k = x;
    while k <= top && term > 0.0 {
        sum += term;
        // Past the mode the terms only shrink: stop once they no longer count.
        if term < sum * 1e-12 {
            break;
        }
        term *= (failures - k) * (n - k) / ((k + 1.0) * (all - failures - n + k + 1.0));
        k += 1.0;
    }
    sum.min(1.0)
}

/// ln(n!) for a whole `n`: summed below 256, Stirling's series (error under 1e-12) above.
fn ln_factorial(n: f64) -> f64 {
    if n < 256.0 {
        (2..=n as u32).map(|i| f64::from(i).ln()).sum()
    } else {
        let tau = std::f64::consts::TAU;
        n * n.ln() - n + 0.5 * (tau * n).ln() + 1.0 / (12.0 * n) - 1.0 / (360.0 * n * n * n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(ok: u32, failed: u32) -> Outcomes {
        Outcomes { ok, failed }
    }

    #[test]
    fn a_worker_failing_where_others_succeed_is_faulty() {
        assert!(faulty_by_rates(o(0, 10), o(10, 0), 10));
        assert!(faulty_by_rates(o(5, 10), o(40, 3), 10));
        // A node that fails at once takes most of a job's tasks: a few successes elsewhere
        // are evidence enough against many failures here.
        assert!(faulty_by_rates(o(0, 10), o(4, 0), 10));
        assert!(faulty_by_rates(o(0, 100), o(2, 0), 10));
    }

    #[test]
    fn failures_everywhere_or_too_little_evidence_are_not_a_worker_s_fault() {
        // Every fifth task fails everywhere: same rate here and there.
        assert!(!faulty_by_rates(o(40, 10), o(40, 10), 10));
        // A job that fails mostly, everywhere.
        assert!(!faulty_by_rates(o(2, 12), o(3, 11), 10));
        assert!(!faulty_by_rates(o(0, 30), o(0, 30), 10));
        // Too few failures here, or too few runs elsewhere to tell from luck.
        assert!(!faulty_by_rates(o(0, 9), o(100, 0), 10));
        assert!(!faulty_by_rates(o(0, 30), o(0, 0), 10));
        assert!(!faulty_by_rates(o(0, 10), o(3, 0), 10));
        assert!(!faulty_by_rates(o(0, 20), o(1, 0), 10));
        // Failing half of the time here or less.
        assert!(!faulty_by_rates(o(12, 11), o(100, 0), 10));
        assert!(!faulty_by_rates(o(10, 10), o(100, 0), 10));
        // Twice as often as the others only.
        assert!(!faulty_by_rates(o(8, 12), o(70, 30), 10));
    }

    #[test]
    fn the_chance_of_failures_this_uneven_is_fisher_s() {
        // All 10 failures on the worker that ran 10 of 14 runs: 1 / C(14, 4).
        let p = uneven_by_chance(o(0, 10), o(4, 0));
        assert!((p - 1.0 / 1001.0).abs() < 1e-12, "{p}");
        // Same rates here and there: most likely.
        assert!(uneven_by_chance(o(40, 10), o(40, 10)) > 0.4);
        // Large counts stay finite and tiny.
        let p = uneven_by_chance(o(10, 5_000), o(90_000, 200));
        assert!(p.is_finite() && p < 1e-100, "{p}");
        assert!(ln_factorial(300.0) - (2..=300).map(|i| f64::from(i).ln()).sum::<f64>() < 1e-9);
    }

    fn streak(len: u32, cleared: u32, confirmed: u32) -> Streak {
        Streak {
            len,
            since_us: 1,
            cleared,
            confirmed,
        }
    }

    #[test]
    fn failing_in_a_row_tasks_that_succeed_elsewhere_is_a_worker_s_fault() {
        assert!(faulty_by_streak(streak(20, 10, 0), 10));
        assert!(faulty_by_streak(streak(50, 12, 4), 10));
        // Not long enough, too few seen elsewhere, or failing elsewhere too.
        assert!(!faulty_by_streak(streak(19, 19, 0), 10));
        assert!(!faulty_by_streak(streak(40, 9, 0), 10));
        assert!(!faulty_by_streak(streak(40, 12, 5), 10));
        assert!(!faulty_by_streak(streak(40, 0, 40), 10));
    }

    #[test]
    fn a_streak_ends_with_a_success_and_hears_only_of_its_own_failures() {
        let mut t = Tally::default();
        let w = 1_000_000;
        for at in 10..30 {
            t.record(at, w, 1, false, false);
        }
        // Failures of the streak, seen elsewhere.
        assert_eq!(t.elsewhere(1, 12, true).unwrap().streak.cleared, 1);
        assert_eq!(t.elsewhere(1, 13, false).unwrap().streak.confirmed, 1);
        t.failed_before_elsewhere(1);
        let s = t.record(31, w, 1, false, true).streak;
        assert_eq!((s.len, s.cleared, s.confirmed, s.since_us), (21, 1, 2, 10));
        // Another job's tally is apart.
        assert_eq!(t.elsewhere(2, 12, true), None);
        // A success here ends it: an older failure is no longer its.
        t.record(40, w, 1, true, true);
        t.record(50, w, 1, false, false);
        assert_eq!(t.elsewhere(1, 12, true), None);
        assert_eq!(t.elsewhere(1, 50, true).unwrap().streak.cleared, 1);
        // A streak outlives the fading of the first runs' counts.
        let later = t.record(10 * w, w, 1, false, false);
        assert_eq!(later.streak.len, 2);
        assert_eq!(later.first, o(0, 0));
    }

    #[test]
    fn counts_are_per_job_and_fade_at_the_same_boundaries_as_the_job_s() {
        let mut t = Tally::default();
        let mut job = JobOutcomes::default();
        let w = 1_000;
        let first = |t: &mut Tally, at, job, ok| t.record(at, w, job, ok, true).first;
        for _ in 0..8 {
            first(&mut t, 10, 1, false);
            job.record(10, w, false);
        }
        assert_eq!(first(&mut t, 20, 2, true), o(1, 0));
        // Two windows later the counts are a quarter, and emptied entries are dropped.
        assert_eq!(first(&mut t, 2 * w, 1, false), o(0, 3));
        assert_eq!(job.record(2 * w + 5, w, false), o(0, 3));
        assert_eq!(first(&mut t, 2 * w, 2, true), o(1, 0));
        // Within a window nothing fades; one boundary later, counts are halved once.
        assert_eq!(first(&mut t, 2 * w + 999, 1, false), o(0, 4));
        assert_eq!(first(&mut t, 3 * w, 1, false), o(0, 3));
        // Runs that are not first runs count in the streak only.
        assert_eq!(t.record(3 * w, w, 1, false, false).first, o(0, 3));
        assert_eq!(o(3, 5).without(o(4, 1)), o(0, 4));
    }
}
