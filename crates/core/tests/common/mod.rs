//! What the scheduler tests share: a plain job and an array of tasks.

#![allow(dead_code)]

use kestrel_core::*;

/// A job named `name` of `/bin/true` tasks, one cpu each, no retries, output discarded.
pub fn spec(name: &str) -> JobSpec {
    JobSpec {
        name: name.into(),
        template: TaskTemplate {
            argv: vec!["/bin/true".into()],
            env: vec![],
            cwd: None,
            stdout: Sink::Null,
            stderr: Sink::Null,
            timeout_ms: None,
        },
        resources: Resources::default(),
        priority: 0,
        retries: 0,
        named: vec![],
    }
}

/// The tasks of an array with ids `1..=n`.
pub fn array(n: u32) -> TaskSet {
    TaskSet::Array(IdRanges::span(1, n))
}
