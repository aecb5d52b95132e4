//! `kestrel completions SHELL`: the shell completion script, generated from the command line
//! definition so it never falls behind it.

use crate::args::Cli;
use clap::CommandFactory;
use clap_complete::Shell;
use std::process::ExitCode;

/// Writes the completion script for `shell` to stdout.
pub fn print(shell: Shell) -> ExitCode {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "kestrel", &mut std::io::stdout());
    ExitCode::SUCCESS
}
