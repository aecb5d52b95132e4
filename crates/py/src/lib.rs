//! `kestrel._native`, the native module of Kestrel's Python package.
//!
//! - [`session::Session`]: one connection to a server, shared by every thread of the client.
//!   Requests from any thread are multiplexed on it (each waits for its own reply, the GIL
//!   released); the task ends the server pushes for watched jobs (protocol 13) queue up for
//!   the package's dispatcher thread, which turns them into futures' results.
//! - [`specs`]: the job specs of function calls and command lines, built from what Python gives.
//! - [`main`]: the `kestrel` command itself, so the wheel needs no separate binary:
//!   `python -m kestrel server start`, and the `kestrel` script pip installs, run it.
//!
//! The futures, the clusters and the executor are Python (`python/kestrel`); this module
//! holds what must not be written twice: the protocol, its authentication and TLS.

mod session;
mod specs;

use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    KestrelError,
    pyo3::exceptions::PyException,
    "Anything Kestrel refuses or cannot do."
);
pyo3::create_exception!(
    _native,
    ServerError,
    KestrelError,
    "The server refused a request; the message says why."
);
pyo3::create_exception!(
    _native,
    ConnectionLost,
    KestrelError,
    "The connection to the server was lost (the server stopped or restarted, or the network failed)."
);
pyo3::create_exception!(
    _native,
    NoServer,
    KestrelError,
    "No server could be reached where the client looked."
);

pyo3::create_exception!(
    _native,
    ValueLost,
    KestrelError,
    "A value kept in the workers' caches (a large result or argument) is held by no worker any more."
);

/// Runs the `kestrel` command with `argv` (the program's name first) and returns its exit
/// status. The GIL is released while it runs: a server or worker runs until it is stopped.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> i32 {
    let code = py.detach(|| kestrel_cli::main_with(argv.into_iter().map(Into::into)));
    // `ExitCode` hides its number; the command's codes are those of `kestrel --help`.
    if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        exit_number(code)
    }
}

/// The number of a failing `ExitCode`, found by its debug form (`ExitCode(unix_exit_status(N))`).
fn exit_number(code: std::process::ExitCode) -> i32 {
    let shown = format!("{code:?}");
    shown
        .rsplit('(')
        .next()
        .and_then(|s| s.trim_end_matches(')').parse().ok())
        .unwrap_or(1)
}

/// The protocol version this module speaks at most.
#[pyfunction]
fn protocol_version() -> u32 {
    kestrel_proto::PROTOCOL_VERSION
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(protocol_version, m)?)?;
    m.add_class::<session::Session>()?;
    m.add("KestrelError", py.get_type::<KestrelError>())?;
    m.add("ServerError", py.get_type::<ServerError>())?;
    m.add("ConnectionLost", py.get_type::<ConnectionLost>())?;
    m.add("NoServer", py.get_type::<NoServer>())?;
    m.add("ValueLost", py.get_type::<ValueLost>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_INLINE_LIMIT", kestrel_core::DEFAULT_INLINE_LIMIT)?;
    m.add("JOB_OPTIONS", specs::OPTIONS.to_vec())?;
    Ok(())
}
