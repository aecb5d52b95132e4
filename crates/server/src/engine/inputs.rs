//! A submission's inputs checked against the store before the job is taken: a file that no
//! task writes and the store does not have would fail every task that reads it at run time
//! (and cancel what depends on them), so it is refused at once, by name.
//!
//! This runs on the engine's thread, so it must not cost a file-system call per task: the
//! store's directories are listed once each (one `readdir` for a directory of a million
//! inputs, where a `stat` per file would stall every worker's updates for seconds on a
//! shared file system).

use kestrel_core::files::cached_name;
use kestrel_core::placeholders::try_each_name;
use kestrel_core::{JobId, JobSpec, Scheduler, TaskSet};
use rustc_hash::{FxHashMap, FxHashSet};
use std::ffi::OsString;
use std::path::Path;

/// Why job `job` cannot be taken, if an input of one of its tasks is nowhere: not written by
/// any task known to `core` or by another task of the job, and not in `store` (a directory;
/// an HTTP store is not looked at here: its tasks fail at run time saying what is missing).
pub(super) fn missing_input(
    core: &Scheduler,
    store: &str,
    job: JobId,
    spec: &JobSpec,
    tasks: &TaskSet,
) -> Option<String> {
    let files = &spec.template.files;
    if files.inputs.is_empty() || store.contains("://") {
        return None;
    }
    let job = job.to_string();
    let tasks = &*spec.ids_of(tasks);
    // What the job's own tasks write.
    let mut own: FxHashSet<String> = FxHashSet::default();
    let _ = try_each_name(tasks, &job, 0, &files.outputs, |_, _, name| {
        own.insert(name.into_owned());
        Ok::<(), ()>(())
    });
    let mut listed = Listings::default();
    let mut seen: FxHashSet<String> = FxHashSet::default();
    let missing = try_each_name(tasks, &job, 0, &files.inputs, |_, id, name| {
        if own.contains(name.as_ref()) || seen.contains(name.as_ref()) {
            return Ok(());
        }
        let name = name.into_owned();
        // A name that leaves the store is the worker's to refuse, with its own message; a
        // value is in no store (see `missing_value`).
        let fine = kestrel_core::values::is_value(&name)
            || core.is_produced(&cached_name(Some(store), &name))
            || name.split('/').any(|p| p == "..")
            || listed.holds(Path::new(store), &name);
        if fine {
            seen.insert(name);
            Ok(())
        } else {
            Err((id, name))
        }
    });
    let (task, name) = missing.err()?;
    Some(if Path::new(store).is_dir() {
        format!("task {task} reads {name}, which no task writes and the store {store} does not have; check the name, or submit the job that writes it first")
    } else {
        format!("task {task} reads {name}, but the store {store} does not exist (no such directory: check --store)")
    })
}

/// Why a job cannot be taken, if a value (`kestrel_core::values`) its tasks read is held by no
/// worker and cannot be made again: dropped by its client, or lost with the worker that held
/// it when its task cannot run again (a result whose task can is made again by lineage, and
/// the job waits for it). Every task reading it would fail.
pub(super) fn missing_value(core: &Scheduler, spec: &JobSpec) -> Option<String> {
    let files = &spec.template.files;
    let name = files
        .inputs
        .iter()
        .chain(&files.statics)
        .filter(|n| kestrel_core::values::is_value(n))
        .find(|n| !core.value_readable(n))?;
    Some(match kestrel_core::values::kind_of(name) {
        Some(kestrel_core::values::ValueKind::Result { job, index }) => format!(
            "the call reads the result of task {job}:{index}, which no worker holds any more (its future was dropped, its job forgotten, or the worker holding it was lost); compute it again"
        ),
        _ => format!(
            "the call reads value {name}, which no worker holds any more (dropped, or lost with the worker that held it)"
        ),
    })
}

/// Whether a job's files need a store: outputs go to one, and so may any input but a value
/// (a value is in the workers' caches alone).
pub(super) fn needs_store(spec: &JobSpec) -> bool {
    let files = &spec.template.files;
    !files.outputs.is_empty()
        || files
            .inputs
            .iter()
            .chain(&files.statics)
            .any(|n| !kestrel_core::values::is_value(n))
}

/// The entries of the store's directories, each listed once when first asked about.
#[derive(Default)]
struct Listings(FxHashMap<String, Option<FxHashSet<OsString>>>);

impl Listings {
    /// Whether `store/name` exists (as a directory entry).
    fn holds(&mut self, store: &Path, name: &str) -> bool {
        let (dir, file) = name.rsplit_once('/').unwrap_or(("", name));
        let entries = self.0.entry(dir.to_string()).or_insert_with(|| {
            let read = std::fs::read_dir(store.join(dir)).ok()?;
            Some(read.flatten().map(|e| e.file_name()).collect())
        });
        entries
            .as_ref()
            .is_some_and(|e| e.contains(std::ffi::OsStr::new(file)))
    }
}
