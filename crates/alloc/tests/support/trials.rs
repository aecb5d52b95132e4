//! The test harness of the test files whose tests may have to be skipped: where this machine
//! lacks what a test needs (a Slurm, `unshare`, `script`), the test says why and shows in the
//! summary as ignored, with the reason, never as passed:
//!
//! ```text
//! test a_queue_grows_to_four_nodes ... ignored (no Slurm here, and starting the test cluster needs root)
//! test result: ok. 2 passed; 0 failed; 8 ignored; 0 measured; 0 filtered out
//! ```
//!
//! Such a file is a `[[test]]` with `harness = false` in its crate's Cargo.toml; its tests are
//! plain functions (no `#[test]`, which such a file would silently never run: [`run`] refuses
//! it), listed in its `main`:
//!
//! ```text
//! fn main() -> std::process::ExitCode {
//!     trials::run(file!(), trials![first_test, second_test])
//! }
//! ```
//!
//! A test that cannot run here calls [`skip`] with the reason, or [`need`] on a
//! `Result<T, String>`, at any depth: like Go's `t.Skip`, it ends the test by unwinding.
//! libtest-mimic parses `cargo test`'s arguments (a name filter, `--exact`, `--skip`,
//! `--test-threads`, `--list`); it does not capture what the tests print.
//! Shared by the tests of `kestrel-alloc` and `kestrel-cli` (included with `#[path]`).

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind};
use std::path::Path;
use std::process::ExitCode;

/// What [`skip`] unwinds with: the reason.
struct Skip(String);

thread_local! {
    /// Set while a test unwinds from [`skip`], so that a guard dropped on the way (such as a
    /// test cluster that prints its logs when a test fails) can tell a skip from a failure.
    static SKIPPING: Cell<bool> = const { Cell::new(false) };
}

/// Ends the running test as skipped, for `why` (shown in the summary as `ignored (why)`).
pub fn skip(why: impl Into<String>) -> ! {
    SKIPPING.with(|s| s.set(true));
    // Not `panic!`: no panic message is printed, as none is due.
    resume_unwind(Box::new(Skip(why.into())))
}

/// The value of `what` the test needs, or [`skip`] with the reason it gives.
pub fn need<T>(what: Result<T, String>) -> T {
    what.unwrap_or_else(|why| skip(why))
}

/// Whether this thread unwinds from [`skip`] (not from a failure).
#[allow(dead_code)] // Not every including test binary has such a guard.
pub fn skipping() -> bool {
    SKIPPING.with(Cell::get)
}

/// The tests of a file, named: `trials![a, b]` is `vec![("a", a), ("b", b)]`.
#[macro_export]
macro_rules! trials {
    ($($test:ident),* $(,)?) => {
        vec![$((stringify!($test), $test as fn())),*]
    };
}

/// Runs the tests `file` (`file!()` of the caller) lists, as `cargo test` asked: a test
/// passes when it returns, fails when it panics, and is ignored when it calls [`skip`].
pub fn run(file: &str, tests: Vec<(&'static str, fn())>) -> ExitCode {
    refuse_test_attributes(file);
    let trials = tests
        .into_iter()
        .map(|(name, test)| {
            libtest_mimic::Trial::ignorable_test(name, move || {
                SKIPPING.with(|s| s.set(false));
                match catch_unwind(test) {
                    Ok(()) => Ok(libtest_mimic::Completion::Completed),
                    Err(payload) => match payload.downcast::<Skip>() {
                        Ok(skip) => Ok(libtest_mimic::Completion::ignored_with(skip.0)),
                        // A failure: libtest-mimic reports it with its message (the panic
                        // hook has printed where it happened).
                        Err(payload) => resume_unwind(payload),
                    },
                }
            })
        })
        .collect();
    libtest_mimic::run(&libtest_mimic::Arguments::from_args(), trials).exit_code()
}

/// Panics if the test file has a `#[test]` function: without libtest's harness it would be
/// compiled out and never run, silently.
fn refuse_test_attributes(file: &str) {
    // `file!()` is relative to the workspace's root, an ancestor of the crate's directory.
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find_map(|dir| std::fs::read_to_string(dir.join(file)).ok())
        .unwrap_or_else(|| panic!("cannot read {file}, to check it has no #[test] function"));
    if let Some(line) = source
        .lines()
        .position(|l| l.trim_start().starts_with("#[test]"))
    {
        panic!(
            "{file}:{}: a #[test] function in a test file of `harness = false` is never run: \
             drop the attribute and list the function in the file's `trials![...]`",
            line + 1
        );
    }
}
