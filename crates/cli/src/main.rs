//! The `kestrel` binary: the command of [`kestrel_cli`].

use std::process::ExitCode;

fn main() -> ExitCode {
    // A worker's reaper is this executable started afresh; it never gets past this line.
    kestrel_worker::reaper::serve_if_reaper();
    kestrel_cli::main_with(std::env::args_os())
}
