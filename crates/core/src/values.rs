//! Values: Python results and arguments too large to travel inline with a task's end or its
//! line, kept as files in the workers' caches instead and moved worker to worker by data
//! diffusion, never through the server.
//!
//! A value is a logical file under [`PREFIX`], named by what it is:
//!
//! - `kestrel-values/r/TAG/JOB/INDEX`: the result of task INDEX of function job JOB, kept by
//!   the worker that ran it (TAG is a short digest of the server's id, so that a worker that
//!   outlives its server never hands a value of the old server's job 3 for the new one's).
//!   It lives until the client drops its future ([`crate::Event::DropValues`]) or forgets
//!   the job.
//! - `kestrel-values/a/RANDOM`: the pickled call of one task, too large for its line, put on a
//!   worker by the client before it submitted the job that reads it. It lives as long as that
//!   job.
//! - `kestrel-values/s/RANDOM`: a value the client placed on a worker for any number of calls
//!   (`Client.scatter`); it lives until the client drops its future.
//!
//! Caches name values as they are, without a store's key ([`crate::files::cached_name`]): a
//! value belongs to no store, and a job's store does not change which file it is.

use crate::spec::{JobId, TaskIndex};

/// What every value's name starts with.
pub const PREFIX: &str = "kestrel-values/";

/// What a value's name says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// The result of a task.
    Result {
        /// The task's job.
        job: JobId,
        /// The task's index in it.
        index: TaskIndex,
    },
    /// The call of one task, read by the job it was put there for.
    Argument,
    /// A value placed by a client for any calls, dropped when the client says.
    Scattered,
}

/// Whether logical file `name` is a value.
pub fn is_value(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// What value `name` is, if it is a well-formed value's name.
pub fn kind_of(name: &str) -> Option<ValueKind> {
    let rest = name.strip_prefix(PREFIX)?;
    let mut parts = rest.split('/');
    let kind = match (parts.next()?, parts.next(), parts.next(), parts.next()) {
        ("r", Some(tag), Some(job), Some(index)) if !tag.is_empty() => ValueKind::Result {
            job: job.parse().ok()?,
            index: index.parse().ok()?,
        },
        ("a", Some(id), None, None) if !id.is_empty() => ValueKind::Argument,
        ("s", Some(id), None, None) if !id.is_empty() => ValueKind::Scattered,
        _ => return None,
    };
    parts.next().is_none().then_some(kind)
}

/// The tag of a server's values: 12 hex digits of its id.
pub fn server_tag(server_id: &str) -> String {
    let tag: String = server_id
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(12)
        .collect();
    if tag.is_empty() {
        "0".into()
    } else {
        tag
    }
}

/// The name of the result of task `index` of `job`, on the server whose tag is `tag`.
pub fn result_name(tag: &str, job: JobId, index: TaskIndex) -> String {
    format!("{PREFIX}r/{tag}/{job}/{index}")
}

/// What a function task's end carries in place of a result kept on its worker: these bytes,
/// then the value's size in decimal, a newline and its name. A pickle never starts so (its
/// first byte is the protocol's opcode, 0x80), so a client tells one from the other by the
/// first byte.
pub const REFERENCE_MAGIC: &[u8] = b"\0kestrel-value\0";

/// The reference to value `name` of `size` bytes (see [`REFERENCE_MAGIC`]).
pub fn reference(name: &str, size: u64) -> Vec<u8> {
    let mut r = REFERENCE_MAGIC.to_vec();
    r.extend_from_slice(format!("{size}\n{name}").as_bytes());
    r
}

/// The value a reference names, with its size, if `bytes` is one.
pub fn parse_reference(bytes: &[u8]) -> Option<(&str, u64)> {
    let rest = bytes.strip_prefix(REFERENCE_MAGIC)?;
    let text = std::str::from_utf8(rest).ok()?;
    let (size, name) = text.split_once('\n')?;
    is_value(name).then_some((name, size.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_what_a_value_is_and_nothing_else_passes() {
        let tag = server_tag("3f9a0c77d1e2b4a5c6d7e8f9");
        assert_eq!(tag, "3f9a0c77d1e2");
        let name = result_name(&tag, 17, 4);
        assert_eq!(name, "kestrel-values/r/3f9a0c77d1e2/17/4");
        assert_eq!(
            kind_of(&name),
            Some(ValueKind::Result { job: 17, index: 4 })
        );
        assert_eq!(kind_of("kestrel-values/a/9d1c"), Some(ValueKind::Argument));
        assert_eq!(kind_of("kestrel-values/s/9d1c"), Some(ValueKind::Scattered));
        for bad in [
            "kestrel-values/r/t/17",
            "kestrel-values/r/t/x/4",
            "kestrel-values/r//1/2",
            "kestrel-values/a/",
            "kestrel-values/a/x/y",
            "kestrel-values/q/x",
            "kestrel-values/r/t/1/2/3",
            "raw/kestrel-values/a/x",
        ] {
            assert_eq!(kind_of(bad), None, "{bad}");
        }
        assert!(is_value("kestrel-values/q/x") && !is_value("raw/1.dat"));
        assert_eq!(server_tag("--"), "0");
    }

    #[test]
    fn a_reference_comes_back_whole_and_a_pickle_is_never_one() {
        let r = reference("kestrel-values/r/ab/3/0", 209_715_200);
        assert_eq!(
            parse_reference(&r),
            Some(("kestrel-values/r/ab/3/0", 209_715_200))
        );
        // A pickle starts with its protocol opcode.
        assert_eq!(parse_reference(b"\x80\x05K*."), None);
        let mut forged = REFERENCE_MAGIC.to_vec();
        forged.extend_from_slice(b"12\n/etc/passwd");
        assert_eq!(
            parse_reference(&forged),
            None,
            "only values are referred to"
        );
        assert_eq!(parse_reference(&r[..r.len() - 30]), None);
    }
}
