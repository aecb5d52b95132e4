//! `kestrel sim SCENARIO.toml`: runs a scenario's runs in virtual time and prints their
//! figures (a table, or one JSON document with `--output json`).

use crate::exit;
use crate::output::{self, Format};
use anyhow::{anyhow, bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kestrel_sim::{RunReport, Scenario};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;

/// Options of `kestrel sim`.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// The scenario (TOML): cluster, store, scheduler, workload, failures and its [[runs]]
    pub scenario: PathBuf,
    /// Seed every run with this instead of the scenario's `seed`
    #[arg(long)]
    pub seed: Option<u64>,
    /// Only the runs of these names (repeat, or separate with commas)
    #[arg(long = "run", value_name = "NAME", value_delimiter = ',')]
    pub runs: Vec<String>,
    /// Leave each run's timeline out of the JSON (it holds a sample every `sample`)
    #[arg(long)]
    pub no_timeline: bool,
}

#[derive(Serialize)]
struct Document<'a> {
    scenario: String,
    description: Option<&'a str>,
    runs: &'a [RunReport],
}

/// Runs the scenario, several runs at once on the machine's cpus.
pub fn sim(format: Format, args: SimArgs) -> Result<ExitCode> {
    let scenario = Scenario::load(&args.scenario).map_err(|e| anyhow!(e))?;
    let mut runs: Vec<_> = scenario.runs.iter().collect();
    if !args.runs.is_empty() {
        for name in &args.runs {
            if !runs.iter().any(|r| &r.name == name) {
                let names: Vec<_> = runs.iter().map(|r| r.name.as_str()).collect();
                bail!(
                    "{}: no run is named {name:?}; its runs are {}",
                    args.scenario.display(),
                    names.join(", ")
                );
            }
        }
        runs.retain(|r| args.runs.contains(&r.name));
    }
    let bar = progress(runs.len() as u64);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Result<RunReport, String>>>> =
        Mutex::new(runs.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.min(runs.len()) {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(setup) = runs.get(i) else {
                    break;
                };
                let r = kestrel_sim::run(setup, args.seed);
                bar.inc(1);
                bar.set_message(format!("{} done", setup.name));
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    bar.finish_and_clear();
    let mut reports = Vec::new();
    for (setup, r) in runs
        .iter()
        .zip(results.into_inner().unwrap_or_else(|e| e.into_inner()))
    {
        match r {
            Some(Ok(mut rep)) => {
                if args.no_timeline {
                    rep.timeline.clear();
                }
                reports.push(rep);
            }
            Some(Err(e)) => bail!("run {:?}: {e}", setup.name),
            None => bail!("run {:?} did not run", setup.name),
        }
    }
    let description = scenario.runs.first().and_then(|r| r.description.as_deref());
    match format {
        Format::Json => output::json(&Document {
            scenario: args.scenario.display().to_string(),
            description,
            runs: &reports,
        }),
        Format::Table => print(description, &reports),
    }
    let all_ended = reports.iter().all(|r| r.stopped.is_none() && r.failed == 0);
    Ok(if all_ended {
        ExitCode::SUCCESS
    } else {
        exit::code(exit::TASKS_FAILED)
    })
}

fn progress(runs: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(runs);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} simulating: {pos}/{len} runs {msg} [{elapsed}]")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn seconds(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.2} s")
    }
}

fn print(description: Option<&str>, reports: &[RunReport]) {
    if let Some(d) = description {
        output::say(d.trim());
        output::say("");
    }
    let mut t = output::table(&[
        "run",
        "tasks",
        "makespan",
        "ideal",
        "efficiency",
        "cpu busy",
        "inputs local/peer/store",
        "store read",
        "sim speed",
    ]);
    for r in reports {
        let d = &r.data;
        let inputs = d.inputs();
        let share = |n: u64| {
            if inputs == 0 {
                "-".to_string()
            } else {
                format!("{:.0}%", n as f64 * 100.0 / inputs as f64)
            }
        };
        let done = if r.finished == r.tasks {
            r.tasks.to_string()
        } else {
            format!("{}/{}", r.finished, r.tasks)
        };
        t.add_row(vec![
            r.name.clone(),
            done,
            seconds(r.makespan_s),
            seconds(r.ideal_s),
            r.efficiency.map_or("-".into(), pct),
            pct(r.cpu_utilisation),
            if inputs == 0 {
                "-".into()
            } else {
                format!(
                    "{}/{}/{}",
                    share(d.local_hits),
                    share(d.peer_hits),
                    share(d.store_reads)
                )
            },
            format!("{:.1} GB", d.store_bytes as f64 / 1e9),
            format!("{:.0}k events/s", r.events_per_s / 1e3),
        ]);
    }
    output::print_table(&t);
    for r in reports {
        if let Some(why) = &r.stopped {
            output::say(format!("run {}: {why}", r.name));
        }
        if r.failed > 0 {
            output::say(format!(
                "run {}: {} tasks failed for good ({} failed runs); raise workload.retries to run them again more often",
                r.name, r.failed, r.runs_failed
            ));
        }
        if r.nodes_killed > 0 {
            output::say(format!(
                "run {}: {} nodes killed, {} runs lost with them (run again elsewhere)",
                r.name, r.nodes_killed, r.runs_lost
            ));
        }
    }
}
