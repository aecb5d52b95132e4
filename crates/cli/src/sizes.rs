//! How much of a job fits in one message, checked before anything is sent.
//!
//! A job's options travel whole in its submission and to every worker that runs it, and each
//! task's own command line or line travels in a piece of the submission and in an assignment.
//! One message carries at most [`MAX_FRAME_BYTES`]: a task that does not fit with its job's
//! options could never run, so it is refused at submission, named, with its size.

use anyhow::{bail, Result};
use kestrel_core::JobSpec;
use kestrel_proto::{ProtoError, MAX_FRAME_BYTES};
use std::ops::Range;

/// Room kept in a message for what is not the job's options or a task (message framing, ids).
const HEADROOM: usize = 4 << 10;

/// Encoded bytes of one string in a message, at most (the string and its length prefix).
pub fn string_bytes(s: &str) -> usize {
    s.len() + 5
}

/// Encoded bytes of one task's argv in a message, at most.
pub fn argv_bytes(argv: &[String]) -> usize {
    argv.iter().map(|a| string_bytes(a)).sum::<usize>() + 5
}

/// Sizes as people read them: "20.0 MiB", "512 KiB", "300 bytes".
pub fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// The bytes one task of `spec` may take in a message: what the job's options leave.
pub fn task_room(spec: &JobSpec) -> Result<usize> {
    let options = match kestrel_proto::encode(spec) {
        Ok(frame) => frame.len(),
        Err(ProtoError::FrameTooLarge { size, .. }) => size,
        Err(e) => bail!("the job's options cannot be encoded: {e}"),
    };
    match MAX_FRAME_BYTES.checked_sub(options + HEADROOM) {
        Some(room) if room > 0 => Ok(room),
        _ => bail!(
            "the job's options (command, paths and environment) take {}, more than a message can carry ({}); pass large data through files{}",
            human(options),
            human(MAX_FRAME_BYTES),
            if spec.template.env.len() > 100 { " (or pass fewer variables than --env-all)" } else { "" }
        ),
    }
}

/// Refuses a task of `bytes` that cannot travel in `room`: `what` names it ("line 3 of
/// inputs.txt", "task 7 of the list").
pub fn check_task(what: &str, bytes: usize, room: usize) -> Result<()> {
    if bytes > room {
        bail!(
            "{what} is {}, more than one task can carry ({} beside this job's options, the limit of a message); put large data in a file and pass its path instead",
            human(bytes),
            human(room)
        );
    }
    Ok(())
}

/// Splits `n` tasks into consecutive index ranges of at most `max` bytes each (`size(i)` is
/// task `i`'s; a single larger task gets a range of its own); at least one range, empty if
/// `n` is 0.
pub fn piece_ranges(n: usize, max: usize, size: impl Fn(usize) -> usize) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for i in 0..n {
        let b = size(i);
        if bytes + b > max && i > start {
            ranges.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += b;
    }
    ranges.push(start..n);
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_cut_into_consecutive_pieces_under_the_limit() {
        let line = |len: usize| vec!["x".repeat(len)];
        // Each 10-byte argument costs 20 bytes: 5 fit in 100.
        let list: Vec<_> = (0..12).map(|_| line(10)).collect();
        let cut = |list: &[Vec<String>]| piece_ranges(list.len(), 100, |i| argv_bytes(&list[i]));
        assert_eq!(cut(&list), vec![0..5, 5..10, 10..12]);
        // A task bigger than the limit gets a piece of its own.
        let list = vec![line(10), line(500), line(10)];
        assert_eq!(cut(&list), vec![0..1, 1..2, 2..3]);
        // At least one piece, empty for an empty list.
        assert_eq!(cut(&[]), vec![0..0]);
    }

    #[test]
    fn a_task_too_big_for_a_message_is_named_with_its_size() {
        let e = check_task("line 3 of big.txt", 20 << 20, 16 << 20).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "line 3 of big.txt is 20.0 MiB, more than one task can carry (16.0 MiB"
            ),
            "{msg}"
        );
        assert!(check_task("x", 10, 10).is_ok());
        assert_eq!(human(300), "300 bytes");
        assert_eq!(human(5 << 10), "5 KiB");
    }
}
