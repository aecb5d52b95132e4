//! Running a task that reads or writes logical files: its inputs staged into the cache (or
//! streamed past it), the command run with their paths, its outputs collected into the cache
//! and written to the store.
//!
//! This runs on the executor thread that runs the task, just before and after the process, so
//! a slot holds its task while the inputs come. Staging ahead, while the task waits in the
//! prefetch window (see `crate::staging`), is the next step.
//!
//! Stores are directories on a shared file system here; files are copied through
//! `DIR/partial` of the cache and moved into place whole, and written to the store through a
//! hidden partial file renamed into place, so no reader sees half a file.

use crate::cache::{Cache, CacheError};
use crate::exec::{self, CancelHandle, ExitKind, Launch, Outcome};
use crate::reaper::Reaper;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

/// The worker's cache, shared by its executor threads.
pub type SharedCache = Arc<Mutex<Cache>>;

/// The cache, also after a thread panicked holding it (its index is still whole).
pub(crate) fn lock(cache: &SharedCache) -> MutexGuard<'_, Cache> {
    cache.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The files of one task, their names with placeholders replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilesPlan {
    /// The job's store directory, if it has one.
    pub store: Option<PathBuf>,
    /// Inputs, then the job's static inputs, by logical name.
    pub inputs: Vec<String>,
    /// Outputs the task writes under these names in `sandbox`.
    pub outputs: Vec<String>,
    /// Where the task runs and writes its outputs.
    pub sandbox: PathBuf,
}

/// Where each input came from, for the task's report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Inputs found in this worker's cache, and their bytes.
    pub local: (u32, u64),
    /// Inputs read from the store, and their bytes.
    pub store: (u32, u64),
}

/// Stages `plan`'s inputs, runs `launch` with `{input:NAME}`, `{input:N}`, `{inputs}` and
/// `KESTREL_INPUTS` naming their paths, and collects its outputs if it succeeds.
pub fn run_with_files(
    launch: &Launch,
    plan: &FilesPlan,
    cache: &SharedCache,
    cancel: &CancelHandle,
    reaper: Option<&Reaper>,
) -> (Outcome, Moved) {
    let started = SystemTime::now();
    let mut moved = Moved::default();
    let mut pinned: Vec<String> = Vec::new();
    let mut paths: Vec<(String, PathBuf)> = Vec::with_capacity(plan.inputs.len());
    let mut fail = None;
    for name in &plan.inputs {
        match stage(name, plan, cache, &mut moved) {
            Ok((path, pin)) => {
                if pin {
                    pinned.push(name.clone());
                }
                paths.push((name.clone(), path));
            }
            Err(why) => {
                fail = Some(why);
                break;
            }
        }
    }
    let outcome = match fail {
        Some(why) => failed(started, why),
        None => {
            let launch = with_input_paths(launch, &paths);
            let mut outcome = exec::run_with(&launch, cancel, reaper);
            if outcome.status.is_success() {
                if let Err(why) = collect(plan, cache) {
                    outcome.status = ExitKind::SpawnFailed(why);
                }
            }
            outcome
        }
    };
    let mut c = lock(cache);
    for name in &pinned {
        c.unpin(name);
    }
    // Streamed copies belong to this run alone.
    for (name, path) in &paths {
        if !pinned.contains(name) && path.starts_with(plan.sandbox.join(STREAMED)) {
            let _ = fs::remove_file(path);
        }
    }
    (outcome, moved)
}

/// Inputs too large for the cache are copied here, under the task's directory, for its run.
const STREAMED: &str = ".kestrel-streamed";

/// Brings input `name` here: its path, and whether it is pinned in the cache.
fn stage(
    name: &str,
    plan: &FilesPlan,
    cache: &SharedCache,
    moved: &mut Moved,
) -> Result<(PathBuf, bool), String> {
    if let Some((path, size)) = lock(cache).pin(name) {
        if path.is_file() {
            moved.local.0 += 1;
            moved.local.1 += size;
            return Ok((path, true));
        }
        // Gone from the disk under the cache: forget it and fetch it again.
        let mut c = lock(cache);
        c.unpin(name);
        c.discard(name);
    }
    let Some(store) = &plan.store else {
        return Err(format!(
            "input {name} is in no cache and the job has no store; give one with `--store DIR` (or `kestrel server start --store DIR`)"
        ));
    };
    let from = store.join(name);
    let size = match fs::metadata(&from) {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => return Err(format!("input {name} in {} is not a file", store.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(format!("input {name} not found in {}", store.display()))
        }
        Err(e) => return Err(format!("input {name} in {}: {e}", store.display())),
    };
    let partial = lock(cache).partial_path();
    let copied = fs::copy(&from, &partial)
        .map_err(|e| format!("reading input {name} from {}: {e}", store.display()))?;
    if copied != size {
        let _ = fs::remove_file(&partial);
        return Err(format!(
            "input {name} changed while it was read from {} ({size} bytes, then {copied})",
            store.display()
        ));
    }
    moved.store.0 += 1;
    moved.store.1 += size;
    let inserted = lock(cache).insert(name, &partial, size);
    match inserted {
        Ok(path) => Ok((path, true)),
        // Larger than the cache, or the cache is full of files in use: streamed to the task.
        Err(CacheError::TooLarge { .. } | CacheError::Pinned { .. }) => {
            let to = plan.sandbox.join(STREAMED).join(name);
            let placed = to
                .parent()
                .map_or(Ok(()), fs::create_dir_all)
                .and_then(|()| fs::rename(&partial, &to));
            match placed {
                Ok(()) => Ok((to, false)),
                Err(e) => {
                    let _ = fs::remove_file(&partial);
                    Err(format!("input {name}: cannot place it for the task: {e}"))
                }
            }
        }
        Err(CacheError::Io(e)) => {
            let _ = fs::remove_file(&partial);
            Err(format!("input {name}: the cache directory failed: {e}"))
        }
    }
}

/// `launch` with the input placeholders replaced and `KESTREL_INPUTS` set.
fn with_input_paths(launch: &Launch, paths: &[(String, PathBuf)]) -> Launch {
    let all: Vec<String> = paths.iter().map(|(_, p)| p.display().to_string()).collect();
    let joined = all.join(" ");
    let replace = |text: &str| -> String {
        if !text.contains("{input") {
            return text.to_string();
        }
        let mut out = text.replace("{inputs}", &joined);
        for (i, (name, path)) in paths.iter().enumerate() {
            let p = path.display().to_string();
            out = out.replace(&format!("{{input:{name}}}"), &p);
            out = out.replace(&format!("{{input:{i}}}"), &p);
        }
        out
    };
    let mut l = launch.clone();
    l.argv = l.argv.iter().map(|a| replace(a)).collect();
    for (_, v) in &mut l.env {
        *v = replace(v);
    }
    l.env.push(("KESTREL_INPUTS".into(), joined));
    l
}

/// Moves the outputs a successful task wrote into the cache and writes them to the store.
fn collect(plan: &FilesPlan, cache: &SharedCache) -> Result<(), String> {
    for name in &plan.outputs {
        let written = plan.sandbox.join(name);
        let size = match fs::metadata(&written) {
            Ok(m) if m.is_file() => m.len(),
            _ => {
                return Err(format!(
                    "output {name} was not written (expected at {})",
                    written.display()
                ))
            }
        };
        if let Some(store) = &plan.store {
            put_in_store(store, name, &written)
                .map_err(|e| format!("writing output {name} to {}: {e}", store.display()))?;
        }
        let partial = lock(cache).partial_path();
        if fs::copy(&written, &partial).is_ok() {
            let mut c = lock(cache);
            if c.insert(name, &partial, size).is_ok() {
                c.unpin(name);
            } else {
                let _ = fs::remove_file(&partial);
            }
        }
    }
    Ok(())
}

/// Copies `from` to `store/name` through a hidden partial file renamed into place.
fn put_in_store(store: &Path, name: &str, from: &Path) -> io::Result<()> {
    let to = store.join(name);
    let dir = to.parent().unwrap_or(store);
    fs::create_dir_all(dir)?;
    let file = to.file_name().and_then(|f| f.to_str()).unwrap_or("output");
    let partial = dir.join(format!(".{file}.kestrel-{}", std::process::id()));
    fs::copy(from, &partial)?;
    fs::rename(&partial, &to)
}

fn failed(started: SystemTime, why: String) -> Outcome {
    Outcome {
        started,
        finished: SystemTime::now(),
        status: ExitKind::SpawnFailed(why),
        stderr_tail: None,
        stdout: None,
        stderr: None,
    }
}
