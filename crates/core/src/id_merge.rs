//! Merging the runs of an array expression into ids that are sorted and unique, as Slurm does
//! (`--array 1-5,3-7` is the ids 1 to 7, once each), while the result stays a few runs: a
//! 10-million-task array must never turn into a set of ids.
//!
//! Runs with steps merge as well (`0-10:2,1-9:2` is `0-10`): where runs overlap, the ids they
//! share form a periodic pattern, which is one run if it is evenly spaced. A pattern that is
//! not (`0-100:2,0-100:3`) is written out id by id over a short stretch, and refused over a long
//! one, since it would need a run per id.

use crate::spec::{IdRun, RangeError};

/// The longest stretch of ids that may be written out one by one.
const EXPAND_LIMIT: u64 = 1 << 16;
/// The longest period (lcm of the steps of overlapping runs) whose pattern is examined.
const PERIOD_LIMIT: u64 = 1 << 16;

/// An arithmetic run of ids `first, first + step, ..= last`; one id has step 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    first: u64,
    last: u64,
    step: u64,
}

impl Span {
    fn single(id: u64) -> Span {
        Span {
            first: id,
            last: id,
            step: 1,
        }
    }

    fn is_single(&self) -> bool {
        self.first == self.last
    }

    fn contains(&self, id: u64) -> bool {
        (self.first..=self.last).contains(&id) && (id - self.first).is_multiple_of(self.step)
    }

    /// The run that continues `self` with `next` (which starts after it), if there is one.
    /// Two lone ids join only when consecutive, so `1,5,9-12` stays as written.
    fn join(&self, next: &Span) -> Option<Span> {
        let step = match (self.is_single(), next.is_single()) {
            (true, true) => 1,
            (true, false) => next.step,
            (false, _) => self.step,
        };
        let continues = next.first == self.last + step && (next.is_single() || next.step == step);
        continues.then_some(Span {
            first: self.first,
            last: next.last,
            step,
        })
    }

    fn describe(&self) -> String {
        match (self.is_single(), self.step) {
            (true, _) => self.first.to_string(),
            (false, 1) => format!("{}-{}", self.first, self.last),
            (false, s) => format!("{}-{}:{s}", self.first, self.last),
        }
    }
}

/// The runs of `runs`' ids, sorted and unique, joined where they continue each other.
pub(crate) fn merge(runs: &[IdRun]) -> Result<Vec<IdRun>, RangeError> {
    // Which lone ids join which run depends on how the first pass cut the stretches; passing
    // the result through again settles it, so merging what was merged changes nothing.
    let mut out = merge_once(runs)?;
    for _ in 0..MAX_PASSES {
        let again = merge_once(&out)?;
        if again == out {
            break;
        }
        out = again;
    }
    Ok(out)
}

/// Passes of [`merge_once`] after the first, at most (one or two settle every case tested).
const MAX_PASSES: usize = 8;

fn merge_once(runs: &[IdRun]) -> Result<Vec<IdRun>, RangeError> {
    let spans = merge_same_lattice(runs);
    let mut out: Vec<Span> = Vec::new();
    let push = |out: &mut Vec<Span>, s: Span| match out.last().and_then(|p| p.join(&s)) {
        Some(joined) => *out.last_mut().expect("checked by and_then") = joined,
        None => out.push(s),
    };
    // Sweep the stretches between consecutive starts and ends: within one, the same runs are
    // present throughout, so their union is one periodic pattern.
    let mut bounds: Vec<u64> = spans.iter().flat_map(|s| [s.first, s.last + 1]).collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut by_first = spans.clone();
    by_first.sort_unstable_by_key(|s| s.first);
    let mut next = 0;
    let mut active: Vec<Span> = Vec::new();
    for w in bounds.windows(2) {
        let (a, b) = (w[0], w[1]);
        active.retain(|s| s.last >= a);
        while next < by_first.len() && by_first[next].first <= a {
            active.push(by_first[next]);
            next += 1;
        }
        if active.is_empty() {
            continue;
        }
        match common_lattice(&active) {
            Some((residue, step)) => {
                let first = a + (residue + step - a % step) % step;
                if first < b {
                    let last = first + (b - 1 - first) / step * step;
                    let step = if first == last { 1 } else { step };
                    push(&mut out, Span { first, last, step });
                }
            }
            None if b - a <= EXPAND_LIMIT => {
                for id in (a..b).filter(|&id| active.iter().any(|s| s.contains(id))) {
                    push(&mut out, Span::single(id));
                }
            }
            None => {
                return Err(RangeError::CannotMerge {
                    one: active[0].describe(),
                    other: active[1].describe(),
                    ids: b - a,
                })
            }
        }
    }
    out.into_iter()
        .map(|s| {
            let count =
                u32::try_from((s.last - s.first) / s.step + 1).map_err(|_| RangeError::TooLarge)?;
            Ok(IdRun {
                first: s.first as u32,
                count,
                step: s.step as u32,
            })
        })
        .collect()
}

/// The runs as spans, with runs on the same lattice (same step, same residue) that overlap or
/// touch joined, so the common case (`1-5,3-7`) never reaches the pattern search.
fn merge_same_lattice(runs: &[IdRun]) -> Vec<Span> {
    let mut spans: Vec<Span> = runs
        .iter()
        .filter(|r| r.count > 0)
        .map(|r| {
            let first = r.first as u64;
            let step = if r.count == 1 { 1 } else { r.step as u64 };
            Span {
                first,
                last: first + (r.count as u64 - 1) * step,
                step,
            }
        })
        .collect();
    spans.sort_unstable_by_key(|s| (s.step, s.first % s.step, s.first));
    let mut merged: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        match merged.last_mut() {
            Some(p)
                if p.step == s.step
                    && p.first % p.step == s.first % s.step
                    && s.first <= p.last + p.step =>
            {
                p.last = p.last.max(s.last);
            }
            _ => merged.push(s),
        }
    }
    merged
}

/// `(residue, step)` of the union of the runs' lattices when it is evenly spaced, else `None`.
/// Every run given covers the stretch examined, so only their lattices matter.
fn common_lattice(active: &[Span]) -> Option<(u64, u64)> {
    if let [one] = active {
        return Some((one.first % one.step, one.step));
    }
    if active.iter().any(|s| s.step == 1) {
        return Some((0, 1));
    }
    let mut period: u64 = 1;
    for s in active {
        period = lcm(period, s.step).filter(|&p| p <= PERIOD_LIMIT)?;
    }
    let mut hit = vec![false; period as usize];
    for s in active {
        let mut r = s.first % period;
        for _ in 0..period / s.step {
            hit[r as usize] = true;
            r = (r + s.step) % period;
        }
    }
    let residues: Vec<u64> = (0..period).filter(|&r| hit[r as usize]).collect();
    let n = residues.len() as u64;
    if !period.is_multiple_of(n) {
        return None;
    }
    let step = period / n;
    let even = residues
        .iter()
        .enumerate()
        .all(|(i, &r)| r == residues[0] + i as u64 * step);
    even.then_some((residues[0] % step, step))
}

fn lcm(a: u64, b: u64) -> Option<u64> {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    (a / gcd(a, b)).checked_mul(b)
}

#[cfg(test)]
mod tests {
    use crate::spec::{IdRanges, RangeError};
    use proptest::prelude::*;

    fn ids(r: &IdRanges) -> Vec<u32> {
        (0..r.len()).map(|i| r.id_at(i).unwrap()).collect()
    }

    fn runs(text: &str) -> usize {
        IdRanges::parse(text).unwrap().runs().len()
    }

    #[test]
    fn overlapping_ranges_give_each_id_once_in_order() {
        let r = IdRanges::parse("1-5,3-7").unwrap();
        assert_eq!(ids(&r), (1..=7).collect::<Vec<_>>());
        assert_eq!(runs("1-5,3-7"), 1);
        assert_eq!(
            ids(&IdRanges::parse("7,3,3,5,1-2").unwrap()),
            [1, 2, 3, 5, 7]
        );
        assert_eq!(runs("9-12,1-4,5-8"), 1);
        // What was already sorted and unique keeps the runs it was written with.
        for text in ["1,5,9-12", "0-10:5,20,30-31", "0-98:2", "7"] {
            let r = IdRanges::parse(text).unwrap();
            assert_eq!(r.runs().len(), text.split(',').count(), "{text}");
        }
        // A lone id that continues a stepped run joins it.
        assert_eq!(runs("0-4:2,6-10:2,12"), 1);
    }

    #[test]
    fn stepped_ranges_merge_into_few_runs() {
        assert_eq!(
            ids(&IdRanges::parse("0-10:2,1-9:2").unwrap()),
            (0..=10).collect::<Vec<_>>()
        );
        assert_eq!(runs("0-10:2,1-9:2"), 1);
        assert_eq!(runs("0-9999999:2,1-9999999:2"), 1);
        assert_eq!(runs("0-9999999:4,2-9999999:4,1-9999999:2"), 1);
        // Coarser steps inside finer ones add nothing.
        assert_eq!(runs("0-9999999:2,0-9999999:6"), 1);
        // An uneven pattern over a short stretch is written out.
        let r = IdRanges::parse("0-30:2,0-30:3").unwrap();
        let want: Vec<u32> = (0..=30).filter(|i| i % 2 == 0 || i % 3 == 0).collect();
        assert_eq!(ids(&r), want);
    }

    #[test]
    fn a_huge_array_stays_a_few_runs() {
        let r = IdRanges::parse("1-10000000,5000000-15000000,20000000").unwrap();
        assert_eq!(r.len(), 15_000_001);
        assert_eq!(r.runs().len(), 2);
    }

    #[test]
    fn an_uneven_pattern_over_millions_of_ids_is_refused() {
        let e = IdRanges::parse("0-10000000:2,0-10000000:3").unwrap_err();
        assert!(matches!(e, RangeError::CannotMerge { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("0-10000000:2") && msg.contains("overlap"),
            "{msg}"
        );
    }

    fn expr() -> impl Strategy<Value = Vec<(u32, u32, u32)>> {
        proptest::collection::vec((0u32..60, 0u32..40, 1u32..6), 1..6)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn ids_are_the_sorted_unique_union(parts in expr()) {
            let text: Vec<String> = parts
                .iter()
                .map(|&(a, n, s)| format!("{a}-{}:{s}", a + n))
                .collect();
            let r = IdRanges::parse(&text.join(",")).unwrap();
            let mut want: Vec<u32> = parts
                .iter()
                .flat_map(|&(a, n, s)| (a..=a + n).step_by(s as usize))
                .collect();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(ids(&r), want.clone());
            prop_assert!(r.is_sorted_unique());
            for (i, id) in want.iter().enumerate() {
                prop_assert_eq!(r.index_of(*id), Some(i as u32));
            }
            // Merging what was merged changes nothing.
            let again = IdRanges::try_from(r.runs().to_vec()).unwrap().merged().unwrap();
            prop_assert_eq!(again, r);
        }
    }
}
