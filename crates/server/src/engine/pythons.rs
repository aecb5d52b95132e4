//! Whether a function job's calls can run on the Python of the workers connected now, checked
//! at submission so that a client of another Python hears it once, naming both sides, before
//! any task runs (instead of every task failing in a runner).
//!
//! Not checked while an allocation queue is active: the workers it brings may fit.
//!
//! The rule is the runner's own (`python/kestrel/_runner.py`, `mismatch`): the same Python
//! minor version and, if the client has one, the same cloudpickle. The versions of the modules
//! a function uses only a runner can see; they are checked there, per job.

use kestrel_core::{FunctionSpec, PythonEnv, WorkerId};
use kestrel_proto::messages::PythonRunner;

/// How many workers' interpreters a refusal names.
const NAMED: usize = 3;

/// Why `f`'s calls can run on none of `workers` (id, host, Python) that run Python, if so;
/// `None` when one fits, or when none runs Python yet (the job then waits for one, saying so).
pub(super) fn mismatch<'a>(
    f: &FunctionSpec,
    workers: impl Iterator<Item = (WorkerId, &'a str, &'a PythonRunner)>,
) -> Option<String> {
    let mut misfits: Vec<String> = Vec::new();
    for (id, host, p) in workers {
        if fits(&f.env, p) {
            return None;
        }
        misfits.push(format!(
            "worker {id} on {host} runs Python {} with cloudpickle {} ({})",
            p.python,
            if p.cloudpickle.is_empty() {
                "not installed"
            } else {
                &p.cloudpickle
            },
            p.executable
        ));
    }
    if misfits.is_empty() {
        return None;
    }
    let more = misfits.len().saturating_sub(NAMED);
    misfits.truncate(NAMED);
    let others = if more > 0 {
        format!(", and {more} more like them")
    } else {
        String::new()
    };
    Some(format!(
        "function {} cannot run on any connected worker: the client has Python {} with cloudpickle {}; {}{others}. Start a worker with `kestrel worker start --python PATH` naming an interpreter of the client's versions",
        f.name,
        f.env.python,
        f.env.cloudpickle,
        misfits.join("; ")
    ))
}

/// `major.minor` of a `major.minor.micro` version.
fn minor(version: &str) -> Vec<&str> {
    version.split('.').take(2).collect()
}

/// Whether pickles of `client`'s Python load in `worker`'s.
pub(super) fn fits(client: &PythonEnv, worker: &PythonRunner) -> bool {
    let python = client.python.is_empty() || minor(&client.python) == minor(&worker.python);
    let pickle = client.cloudpickle.is_empty() || client.cloudpickle == worker.cloudpickle;
    python && pickle
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(python: &str, cloudpickle: &str) -> FunctionSpec {
        FunctionSpec {
            name: "sim.step".into(),
            pickled: Vec::new(),
            env: PythonEnv {
                python: python.into(),
                cloudpickle: cloudpickle.into(),
                modules: Vec::new(),
            },
            path: Vec::new(),
            inline_limit: 1 << 20,
        }
    }

    fn runner(python: &str, cloudpickle: &str) -> PythonRunner {
        PythonRunner {
            python: python.into(),
            cloudpickle: cloudpickle.into(),
            executable: "/opt/py/bin/python".into(),
        }
    }

    #[test]
    fn one_worker_of_the_clients_minor_version_and_cloudpickle_is_enough() {
        let f = function("3.11.7", "3.1.3");
        let (old, same) = (runner("3.10.2", "3.1.3"), runner("3.11.9", "3.1.3"));
        let both = [(1, "a", &old), (2, "b", &same)];
        assert_eq!(mismatch(&f, both.into_iter()), None);
        assert_eq!(
            mismatch(&f, std::iter::empty()),
            None,
            "no Python worker yet: it waits"
        );
    }

    #[test]
    fn a_refusal_names_both_sides_and_what_to_do() {
        let f = function("3.11.7", "3.1.3");
        let (old, bare) = (runner("3.10.2", "3.1.3"), runner("3.11.7", ""));
        let why = mismatch(&f, [(1, "a", &old), (2, "b", &bare)].into_iter()).unwrap();
        assert_eq!(
            why,
            "function sim.step cannot run on any connected worker: the client has Python 3.11.7 with cloudpickle 3.1.3; \
             worker 1 on a runs Python 3.10.2 with cloudpickle 3.1.3 (/opt/py/bin/python); \
             worker 2 on b runs Python 3.11.7 with cloudpickle not installed (/opt/py/bin/python). \
             Start a worker with `kestrel worker start --python PATH` naming an interpreter of the client's versions"
        );
    }

    #[test]
    fn many_misfits_are_counted_not_listed() {
        let f = function("3.12.1", "");
        let old = runner("3.11.7", "3.1.3");
        let why = mismatch(&f, (1..=5).map(|i| (i, "n", &old))).unwrap();
        assert!(
            why.contains("worker 3 on n") && !why.contains("worker 4"),
            "{why}"
        );
        assert!(why.contains(", and 2 more like them."), "{why}");
    }
}
