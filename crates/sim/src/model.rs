//! The random parts of a workload, drawn from one seeded generator so a run repeats: when
//! tasks arrive, how long they compute, which files they read, which runs fail.

use crate::scenario::{Arrival, Length};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Gamma, Normal};
use std::path::Path;

/// The generator of a run: the same seed draws the same workload.
pub struct Draws {
    rng: ChaCha8Rng,
    length: Sampler,
}

enum Sampler {
    Fixed(u64),
    Gamma(Gamma<f64>),
    Normal(Normal<f64>),
    Trace(Vec<u64>),
}

impl Draws {
    /// A generator for `length`, seeded with `seed`.
    pub fn new(seed: u64, length: &Length) -> Result<Draws, String> {
        let length = match length {
            Length::Fixed(s) => Sampler::Fixed(s.0),
            Length::Gamma { mean, shape } => {
                // Mean = shape · scale.
                let scale = mean.0 as f64 / shape;
                Sampler::Gamma(Gamma::new(*shape, scale).map_err(|e| format!("gamma: {e}"))?)
            }
            Length::Normal { mean, sd } => Sampler::Normal(
                Normal::new(mean.0 as f64, sd.0 as f64).map_err(|e| format!("normal: {e}"))?,
            ),
            Length::Trace { run_us, .. } => Sampler::Trace(run_us.clone()),
        };
        Ok(Draws {
            rng: ChaCha8Rng::seed_from_u64(seed),
            length,
        })
    }

    /// How long task `index` computes, in microseconds.
    pub fn compute_us(&mut self, index: u32) -> u64 {
        match &self.length {
            Sampler::Fixed(us) => *us,
            Sampler::Gamma(g) => g.sample(&mut self.rng).round() as u64,
            Sampler::Normal(n) => n.sample(&mut self.rng).max(0.0).round() as u64,
            Sampler::Trace(t) => t[index as usize % t.len()],
        }
    }

    /// A file number below `files`, uniformly.
    pub fn file(&mut self, files: u32) -> u32 {
        self.rng.gen_range(0..files)
    }

    /// Whether an event of chance `p` happens.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.gen_bool(p.min(1.0))
    }
}

/// When each of `tasks` tasks arrives, in microseconds from the start, in order.
pub fn arrival_times(arrival: &Arrival, tasks: u32) -> Vec<u64> {
    let n = tasks as usize;
    match *arrival {
        Arrival::All => vec![0; n],
        Arrival::Rate { rate } => (0..n).map(|i| (i as f64 / rate * 1e6) as u64).collect(),
        Arrival::Steps {
            start,
            factor,
            every,
            max,
        } => {
            let mut out = Vec::with_capacity(n);
            let mut rate = start.min(max);
            let mut step_start = 0u64;
            while out.len() < n {
                // Tasks of this interval, evenly spaced in it.
                let count = (rate * every.secs()).round().max(1.0) as usize;
                for j in 0..count.min(n - out.len()) {
                    out.push(step_start + (j as f64 * every.0 as f64 / count as f64) as u64);
                }
                step_start += every.0;
                rate = (rate * factor).ceil().min(max);
            }
            out
        }
        Arrival::Sine {
            mean,
            amplitude,
            period,
        } => {
            let mut out = Vec::with_capacity(n);
            let mut t = 0.0f64;
            let period_s = period.secs();
            while out.len() < n {
                out.push((t * 1e6) as u64);
                let rate = mean + amplitude * (std::f64::consts::TAU * t / period_s).sin();
                // Where the wave touches 0, move on a millisecond rather than wait forever.
                t += if rate > 1e-6 { 1.0 / rate } else { 1e-3 };
            }
            out
        }
    }
}

/// The run times (`run_us`) of the tasks in a `kestrel task list --output json` document (or
/// several, one after another, as following `next_offset` page by page prints them).
pub fn read_trace(path: &Path) -> Result<Vec<u64>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the trace {}: {e}", path.display()))?;
    let mut run_us = Vec::new();
    for doc in serde_json::Deserializer::from_str(&text).into_iter::<serde_json::Value>() {
        let doc = doc.map_err(|e| {
            format!(
                "the trace {} is not what `kestrel task list --output json` prints: {e}",
                path.display()
            )
        })?;
        let tasks = doc.get("tasks").and_then(|t| t.as_array()).ok_or_else(|| {
            format!(
                "the trace {} has no `tasks` list: give what `kestrel task list --output json` \
                 prints",
                path.display()
            )
        })?;
        run_us.extend(
            tasks
                .iter()
                .filter_map(|t| t.get("run_us").and_then(|r| r.as_u64())),
        );
    }
    if run_us.is_empty() {
        return Err(format!(
            "the trace {} holds no task that ran (no `run_us`)",
            path.display()
        ));
    }
    Ok(run_us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::Span;

    #[test]
    fn the_mi_arrivals_make_the_seeds_ideal_time() {
        // Falkon's MI: 1 task/s times 1.3 every minute up to 1,000/s; 250K tasks span 1,415 s.
        let steps = Arrival::Steps {
            start: 1.0,
            factor: 1.3,
            every: Span(60_000_000),
            max: 1000.0,
        };
        let t = arrival_times(&steps, 250_000);
        let last = *t.last().expect("tasks") as f64 / 1e6;
        assert!((last - 1414.9).abs() < 0.1, "{last}");
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_seed_draws_the_same_workload_again() {
        let gamma = Length::Gamma {
            mean: Span(1_000_000),
            shape: 2.0,
        };
        let draw = |seed| {
            let mut d = Draws::new(seed, &gamma).expect("gamma");
            (0..100).map(|i| d.compute_us(i)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let mean = draw(7).iter().sum::<u64>() as f64 / 100.0;
        assert!((600_000.0..1_400_000.0).contains(&mean), "{mean}");
    }
}
