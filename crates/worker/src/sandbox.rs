//! A task's files around its body, whatever runs it: its inputs staged before (into the
//! cache, or streamed past it into the run's own directory), its outputs collected after a
//! success (into the cache, and to the store unless `local`), and what staging held (the
//! cache's pins, the streamed copies, the count of what moved) let go of however the body
//! ended, a panic included.
//!
//! [`with_files`] is the whole of it; the executor's thread calls it with the body that runs
//! the task (a process today). Fetching and the cache are [`crate::files`]'.

use crate::exec::{self, CancelHandle, ExitKind, Launch, Outcome};
use crate::files::{fetch_once, fetch_to, lock, Fetch, FilesPlan, NotFetched, WorkerFiles};
use crate::ledger::Key;
use crate::reaper::Reaper;
use crate::store::write_file_digesting;
use kestrel_core::files::Transfers;
use kestrel_core::placeholders::substitute_inputs;
use kestrel_core::{JobId, TaskIndex};
use std::borrow::Cow;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Stages `plan`'s inputs, runs `launch` with `{input:NAME}`, `{input:N}`, `{inputs}` and
/// `KESTREL_INPUTS` naming their paths, and collects its outputs if it succeeds.
pub(crate) fn run_with_files(
    key: Key,
    launch: &Launch,
    plan: &FilesPlan,
    cache: &WorkerFiles,
    cancel: &CancelHandle,
    reaper: Option<&Reaper>,
) -> Outcome {
    with_files(key, plan, cache, cancel, |paths| {
        exec::run_with(&with_input_paths(launch, paths), cancel, reaper)
    })
}

/// Stages `plan`'s inputs, then runs `body` with their paths (logical name, path here), and
/// collects the outputs if it succeeded. A failed staging is the task's end and `body` does
/// not run; a canceled one ends it as canceled.
pub(crate) fn with_files(
    key: Key,
    plan: &FilesPlan,
    cache: &WorkerFiles,
    cancel: &CancelHandle,
    body: impl FnOnce(&[(String, PathBuf)]) -> Outcome,
) -> Outcome {
    let started = SystemTime::now();
    // Dropped last, whichever way this returns: after the outputs are collected.
    let mut staged = Staged::new(key, plan, cache);
    if let Err(why) = staged.stage_inputs(cancel) {
        return Outcome::ended(started, why);
    }
    if cancel.is_canceled() {
        return Outcome::ended(started, ExitKind::Canceled);
    }
    let mut outcome = body(&staged.paths);
    if outcome.status.is_success() {
        if let Err(why) = collect_outputs(plan, cache) {
            outcome.status = ExitKind::SpawnFailed(why);
        }
    }
    outcome
}

/// What staging a task's inputs holds until the task is done with them: released on drop.
struct Staged<'a> {
    key: Key,
    plan: &'a FilesPlan,
    cache: &'a WorkerFiles,
    /// The inputs staged so far: logical name, path here.
    paths: Vec<(String, PathBuf)>,
    /// Cache entries pinned for the run.
    pinned: Vec<String>,
    /// This run's own directory for inputs streamed past the cache: tasks of other workers
    /// and of this one may share the sandbox and read the same file at once.
    streamed: PathBuf,
    /// Whether `streamed` may exist: most runs stream nothing and need no look.
    may_have_streamed: bool,
    /// What staging moved, reported for the task.
    moved: Transfers,
}

impl<'a> Staged<'a> {
    fn new((job, index): Key, plan: &'a FilesPlan, cache: &'a WorkerFiles) -> Staged<'a> {
        Staged {
            key: (job, index),
            plan,
            cache,
            paths: Vec::with_capacity(plan.inputs.len()),
            pinned: Vec::new(),
            streamed: plan
                .sandbox
                .join(STREAMED)
                .join(format!("{}-{job}-{index}", std::process::id())),
            may_have_streamed: false,
            moved: Transfers::default(),
        }
    }

    /// Brings every input here, in order; the first that cannot be had ends the task.
    /// Canceled meanwhile: stops fetching (the caller sees the cancel).
    fn stage_inputs(&mut self, cancel: &CancelHandle) -> Result<(), ExitKind> {
        let plan = self.plan;
        if let Some(n) = &plan.bad_name {
            return Err(ExitKind::Unrunnable(format!("file name {n:?} (its placeholders replaced) is not a plain path inside the store: no `..`, `.`, empty parts or leading `/`")));
        }
        let (job, index) = self.key;
        for (i, name) in plan.inputs.iter().enumerate() {
            if cancel.is_canceled() {
                return Ok(());
            }
            let is_static = i >= plan.inputs.len() - plan.statics;
            let staged = stage(
                (job, index, name),
                plan,
                &self.streamed,
                self.cache,
                cancel,
                &mut self.moved,
            );
            match staged {
                Ok((path, pin)) => {
                    self.may_have_streamed |= !pin;
                    if pin {
                        let key = plan.cached(name);
                        if is_static {
                            lock(self.cache).keep(&key);
                        }
                        self.pinned.push(key);
                    }
                    self.paths.push((name.clone(), path));
                }
                Err(why) => {
                    self.may_have_streamed = true;
                    return Err(why);
                }
            }
        }
        Ok(())
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        let cache = self.cache;
        // With the pins the prefetcher took for this task.
        self.pinned.extend(cache.take_prefetched(self.key));
        let mut c = lock(cache);
        for name in &self.pinned {
            c.unpin(name);
        }
        drop(c);
        // Streamed copies belong to this run alone.
        if self.may_have_streamed && self.streamed.exists() {
            let _ = fs::remove_dir_all(&self.streamed);
            // The shared parent goes when the last run's directory has.
            let _ = fs::remove_dir(self.plan.sandbox.join(STREAMED));
        }
        cache.note_moved(self.key, &self.moved);
    }
}

/// Inputs too large for the cache are copied here, under the task's directory, for its run.
pub(crate) const STREAMED: &str = ".kestrel-streamed";

/// Brings input `name` here for a run: its path, and whether it is pinned in the cache. A
/// file the cache cannot hold is streamed: moved into the run's own `streamed` directory.
fn stage(
    (job, index, name): (JobId, TaskIndex, &str),
    plan: &FilesPlan,
    streamed: &Path,
    cache: &WorkerFiles,
    cancel: &CancelHandle,
    moved: &mut Transfers,
) -> Result<(PathBuf, bool), ExitKind> {
    let to = streamed.join(name);
    let cannot = |why: String| ExitKind::SpawnFailed(format!("input {name}: {why}"));
    let cannot_place = |e: std::io::Error| cannot(format!("cannot place it for the task: {e}"));
    let make_parent = || to.parent().map_or(Ok(()), fs::create_dir_all);
    match fetch_once((job, index, name), plan, cache, cancel, moved, false)? {
        Fetch::Cached(path, _) => Ok((path, true)),
        // Moved, or copied if the task's directory is on another disk than the cache.
        Fetch::Uncached(partial) => {
            let placed = make_parent().and_then(|()| {
                fs::rename(&partial, &to).or_else(|_| fs::copy(&partial, &to).map(drop))
            });
            let _ = fs::remove_file(&partial);
            placed.map(|()| (to.clone(), false)).map_err(cannot_place)
        }
        // Fetched again, straight into the task's directory.
        Fetch::NoRoom => {
            make_parent().map_err(cannot_place)?;
            match fetch_to((job, name), &plan.cached(name), plan, &to, cache, cancel, moved) {
                Ok(_) => Ok((to.clone(), false)),
                Err(NotFetched::Exit(why)) => Err(why),
                Err(NotFetched::Local(w)) => Err(cannot(format!(
                    "no room for it: the cache's disk is full of files in use, and the task's directory failed too ({w})"
                ))),
            }
        }
    }
}

/// `launch` with the input placeholders replaced ([`substitute_inputs`]) and
/// `KESTREL_INPUTS` set.
pub(crate) fn with_input_paths(launch: &Launch, paths: &[(String, PathBuf)]) -> Launch {
    let paths: Vec<(String, String)> = paths
        .iter()
        .map(|(n, p)| (n.clone(), p.display().to_string()))
        .collect();
    let replace = |text: &mut String| {
        if let Cow::Owned(done) = substitute_inputs(text, &paths) {
            *text = done;
        }
    };
    let mut l = launch.clone();
    l.argv.iter_mut().for_each(replace);
    l.env.iter_mut().for_each(|(_, v)| replace(v));
    let all: Vec<&str> = paths.iter().map(|(_, p)| p.as_str()).collect();
    l.env.push(("KESTREL_INPUTS".into(), all.join(" ")));
    l
}

/// Moves the outputs a successful task wrote into the cache and writes those not `local` to
/// the store.
pub(crate) fn collect_outputs(plan: &FilesPlan, cache: &WorkerFiles) -> Result<(), String> {
    for (i, name) in plan.outputs.iter().enumerate() {
        let local = plan.local.get(i).copied().unwrap_or(false);
        let (mut file, size) = open_output(plan, name)?;
        if let (Some(store), false) = (&plan.store, local) {
            store.write_from(name, &mut file)?;
        }
        // Kept for the tasks that read it next, if there is room: the store has it anyway,
        // unless it is local, and then the cache is its only copy and must take it.
        let kept = keep_output(plan, cache, name, &mut file, size, local);
        if let (Err(why), true) = (kept, local) {
            return Err(format!(
                "local output {name} could not be kept in the cache ({why}); mark it persist or give the worker a larger --cache-size"
            ));
        }
    }
    Ok(())
}

/// Opens output `name` that the task wrote in its directory, and its size. Refused: a
/// symbolic link, or a path that a linked directory on its way leads out of the task's
/// directory; either would put another file (`/etc/passwd`, a private key) into the store
/// and the caches under the output's name.
fn open_output(plan: &FilesPlan, name: &str) -> Result<(fs::File, u64), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let written = plan.sandbox.join(name);
    let not_written = || {
        format!(
            "output {name} was not written (expected at {})",
            written.display()
        )
    };
    let meta = fs::symlink_metadata(&written).map_err(|_| not_written())?;
    if meta.file_type().is_symlink() {
        let to = fs::read_link(&written).map_or_else(|_| "?".into(), |t| t.display().to_string());
        return Err(format!(
            "output {name} is a symbolic link (to {to}), not a file the task wrote: outputs are not followed out of the task's directory; write (or copy) the file itself there"
        ));
    }
    if !meta.is_file() {
        return Err(not_written());
    }
    let (Ok(real), Ok(root)) = (written.canonicalize(), plan.sandbox.canonicalize()) else {
        return Err(not_written());
    };
    if !real.starts_with(&root) {
        return Err(format!(
            "output {name} is {}, outside the task's directory {} (a directory on its path is a symbolic link): outputs are not followed out of it; write the file itself there",
            real.display(),
            plan.sandbox.display()
        ));
    }
    // Not followed if it became a link since it was looked at.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&written)
        .map_err(|e| format!("output {name}: cannot open {}: {e}", written.display()))?;
    match file.metadata() {
        Ok(m) if m.is_file() => Ok((file, m.len())),
        _ => Err(not_written()),
    }
}

/// Copies output `name` (open as `from`, `size` bytes) into the cache, kept there until the
/// server releases it if it is `local`. Copied (not linked: a later task of the directory may
/// write the name again), its digest taken on the way; a failed copy leaves nothing behind.
fn keep_output(
    plan: &FilesPlan,
    cache: &WorkerFiles,
    name: &str,
    from: &mut fs::File,
    size: u64,
    local: bool,
) -> Result<(), String> {
    use std::io::{Seek, SeekFrom};
    // From its start: the store's copy may have read it already.
    from.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let partial = lock(cache).partial_path();
    let (copied, digest) =
        write_file_digesting(from, &partial, Some(size)).map_err(|e| e.to_string())?;
    let key = plan.cached(name);
    let mut c = lock(cache);
    if let Err(e) = c.insert(&key, &partial, copied, Some(digest)) {
        drop(c);
        let _ = fs::remove_file(&partial);
        return Err(e.to_string());
    }
    c.unpin(&key);
    if local {
        c.keep(&key);
    }
    Ok(())
}
