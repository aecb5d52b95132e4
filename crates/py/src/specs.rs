//! The job specs of the Python package's submissions, from the dicts it passes.
//!
//! A function job streams each call's result back as its stdout (the pickled value, or the
//! pickled exception) and its printed output and traceback as its stderr; a command job keeps
//! its tasks' stdout and stderr up to the limits the caller sets. What a dict may hold is the
//! keyword arguments of `Client.submit` (see `python/kestrel/client.py`); a key this module
//! does not know is refused, so a misspelt option is not silently ignored.

use crate::KestrelError;
use kestrel_core::{
    After, FunctionSpec, JobSpec, PolicyName, PythonEnv, Sink, TaskKind, DEFAULT_INLINE_LIMIT,
    MAX_STREAM_LIMIT,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The options every job takes.
pub const OPTIONS: &[&str] = &[
    "name",
    "retries",
    "timeout",
    "cpus",
    "mem",
    "inputs",
    "outputs",
    "after",
    "env",
    "cwd",
    "priority",
    "stdout_limit",
    "stderr_limit",
    "store",
];

/// A job calling the function `f` describes: `name`, `pickled` (bytes), `python`,
/// `cloudpickle`, `modules` (pairs of name and version), `path` and `inline_limit`; its calls
/// read `values` (see `kestrel_core::values`), which are staged like inputs and place the
/// calls by data (`max-compute-util`: a free worker, the one holding most of them first).
pub fn function_job(
    f: &Bound<'_, PyDict>,
    options: Option<&Bound<'_, PyDict>>,
    values: Vec<String>,
) -> PyResult<JobSpec> {
    let name: String = required(f, "name")?;
    let inline_limit: u32 = get(f, "inline_limit")?.unwrap_or(DEFAULT_INLINE_LIMIT);
    let function = FunctionSpec {
        name: name.clone(),
        pickled: required(f, "pickled")?,
        env: PythonEnv {
            python: get(f, "python")?.unwrap_or_default(),
            cloudpickle: get(f, "cloudpickle")?.unwrap_or_default(),
            modules: get(f, "modules")?.unwrap_or_default(),
        },
        path: get(f, "path")?.unwrap_or_default(),
        inline_limit,
    };
    let mut spec = JobSpec::command(name, Vec::new());
    spec.template.stdout = Sink::Stream {
        limit: inline_limit,
    };
    spec.template.stderr = Sink::Stream { limit: 64 << 10 };
    spec.template.kind = TaskKind::Function(Box::new(function));
    apply(&mut spec, options)?;
    if !values.is_empty() {
        spec.template.files.inputs.extend(values);
        spec.placement
            .policy
            .get_or_insert(PolicyName::MaxComputeUtil);
    }
    Ok(spec)
}

/// A job of command lines (each task's argv is its own), named `name`.
pub fn command_job(name: String, options: Option<&Bound<'_, PyDict>>) -> PyResult<JobSpec> {
    let mut spec = JobSpec::command(name, Vec::new());
    spec.template.stdout = Sink::Stream { limit: 64 << 10 };
    spec.template.stderr = Sink::Stream { limit: 64 << 10 };
    apply(&mut spec, options)?;
    Ok(spec)
}

/// Applies the options every job takes.
fn apply(spec: &mut JobSpec, options: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    let Some(o) = options else {
        return Ok(());
    };
    for key in o.keys() {
        let key: String = key.extract()?;
        if !OPTIONS.contains(&key.as_str()) {
            return Err(KestrelError::new_err(format!(
                "unknown job option {key:?}; the options are {}",
                OPTIONS.join(", ")
            )));
        }
    }
    if let Some(name) = get::<String>(o, "name")? {
        spec.name = name;
    }
    if let Some(r) = get(o, "retries")? {
        spec.retries = r;
    }
    if let Some(t) = get::<f64>(o, "timeout")? {
        if !(t > 0.0 && t.is_finite()) {
            return Err(KestrelError::new_err(format!(
                "timeout={t}: give a positive number of seconds, or None for no limit"
            )));
        }
        spec.template.timeout_ms = Some((t * 1000.0).ceil() as u64);
    }
    if let Some(c) = get(o, "cpus")? {
        spec.resources.cpus = c;
    }
    if let Some(m) = get(o, "mem")? {
        spec.resources.mem = m;
    }
    if let Some(i) = get(o, "inputs")? {
        spec.template.files.inputs = i;
    }
    if let Some(out) = get(o, "outputs")? {
        spec.template.files.outputs = out;
    }
    if let Some(after) = get::<Vec<u32>>(o, "after")? {
        spec.after = after
            .into_iter()
            .map(|job| After { job, tasks: None })
            .collect();
    }
    if let Some(env) = o.get_item("env")?.filter(|v| !v.is_none()) {
        // A dict, as Python's own `env=` arguments take, or pairs.
        let pairs = match env.cast::<PyDict>() {
            Ok(d) => d.items().into_any(),
            Err(_) => env,
        };
        spec.template.env = pairs.extract().map_err(|e: PyErr| {
            KestrelError::new_err(format!(
                "option env: give a dict of names to values (strings): {e}"
            ))
        })?;
    }
    if let Some(cwd) = get(o, "cwd")? {
        spec.template.cwd = Some(cwd);
    }
    if let Some(p) = get(o, "priority")? {
        spec.priority = p;
    }
    if let Some(store) = get(o, "store")? {
        spec.placement.store = Some(store);
    }
    for (key, sink) in [
        ("stdout_limit", &mut spec.template.stdout),
        ("stderr_limit", &mut spec.template.stderr),
    ] {
        if let Some(limit) = get::<u32>(o, key)? {
            if limit > MAX_STREAM_LIMIT {
                return Err(KestrelError::new_err(format!(
                    "{key}={limit}: at most {MAX_STREAM_LIMIT} bytes of a task's output travel back; write bigger outputs to files (outputs=[...])"
                )));
            }
            *sink = if limit == 0 {
                Sink::Null
            } else {
                Sink::Stream { limit }
            };
        }
    }
    Ok(())
}

fn get<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<T>> {
    match d.get_item(key)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => v.extract::<T>().map(Some).map_err(|e| {
            let e: PyErr = e.into();
            KestrelError::new_err(format!("option {key}: {e}"))
        }),
    }
}

fn required<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    get(d, key)?.ok_or_else(|| KestrelError::new_err(format!("{key} is missing")))
}
