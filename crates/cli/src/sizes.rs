//! How much of a job fits in one message, checked before anything is sent.
//!
//! A job's options travel whole in its submission and to every worker that runs it, and each
//! task's own command line or line travels in a piece of the submission and in an assignment.
//! One message carries at most [`MAX_FRAME_BYTES`]: a task that does not fit with its job's
//! options could never run, so it is refused at submission, named, with its size.

use anyhow::{bail, Result};
use kestrel_core::JobSpec;
use kestrel_proto::{ProtoError, MAX_FRAME_BYTES};

/// Room kept in a message for what is not the job's options or a task (message framing, ids).
const HEADROOM: usize = 4 << 10;

pub use kestrel_client::{argv_bytes, string_bytes};

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
    let options = match kestrel_proto::encode(&kestrel_proto::wire::Ref(spec)) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
