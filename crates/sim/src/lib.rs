//! `kestrel sim`: Kestrel's scheduler in virtual time, on simulated clusters far bigger than
//! the machine it runs on.
//!
//! A [`Scenario`] (TOML) describes the nodes, the shared store and the network, the workload
//! (task lengths, input files, arrivals) and its failures; each of its runs is driven by the
//! same scheduler the server steps (`kestrel_core::Scheduler`), fed by simulated nodes in the
//! order of a virtual clock ([`driver`]). A run with the same seed repeats exactly.
//!
//! ```
//! let scenario = kestrel_sim::Scenario::parse(r#"
//!     [cluster]
//!     nodes = 4
//!     cpus = 2
//!     [workload]
//!     tasks = 100
//!     compute = "1s"
//! "#, std::path::Path::new(".")).unwrap();
//! let report = kestrel_sim::run(&scenario.runs[0], None).unwrap();
//! assert_eq!(report.finished, 100);
//! assert!((report.makespan_s - 13.0).abs() < 0.1); // 100 one-second tasks on 8 cpus
//! ```

pub mod driver;
pub mod model;
pub mod report;
pub mod scenario;
pub mod units;

pub use report::{DataReport, RunReport, Sample};
pub use scenario::{Scenario, Setup};

/// Runs one setup, with `seed` instead of its own if given.
pub fn run(setup: &Setup, seed: Option<u64>) -> Result<RunReport, String> {
    driver::Driver::new(setup, seed.unwrap_or(setup.seed))?.run()
}
