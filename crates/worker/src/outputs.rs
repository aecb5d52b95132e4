//! Streamed output on its way to the server: taken from a finished run, and cut into messages
//! that stay well under the frame limit.

use crate::capture::Captured;
use crate::exec::Outcome;
use kestrel_core::{Finished, JobId, TaskIndex};
use kestrel_proto::messages::{Kept, TaskOutput, STDERR_WRITTEN, STDOUT_EMPTY};

/// Bytes of streamed output one message carries at most (unless one task alone has more):
/// half a frame, leaving room for the rest of the message. A task keeps at most
/// `MAX_STREAM_LIMIT` (4 MiB) of each of its two streams, so one task always fits.
pub(crate) const OUTPUT_BYTES_PER_MESSAGE: usize = kestrel_proto::MAX_FRAME_BYTES / 2;

/// The streamed output of a run, taken out of its outcome, and with `files` (a server of
/// version 11 on) how its own output files are where that is not the usual; `None` if there
/// is nothing to say (nothing is sent for it).
pub(crate) fn of_run(
    key: (JobId, TaskIndex),
    outcome: &mut Outcome,
    files: bool,
) -> Option<TaskOutput> {
    let kept = |c: Option<Captured>| {
        c.filter(|c| c.total > 0).map(|c| Kept {
            data: c.data,
            total: c.total,
        })
    };
    let (stdout, stderr) = (kept(outcome.stdout.take()), kept(outcome.stderr.take()));
    let files = if files { unusual(outcome.own_files) } else { 0 };
    (stdout.is_some() || stderr.is_some() || files != 0).then_some(TaskOutput {
        job: key.0,
        index: key.1,
        stdout,
        stderr,
        files,
    })
}

/// How own output files differ from the usual, a stdout file written and an empty stderr
/// file removed (see [`TaskOutput::files`]).
fn unusual(own: [Option<bool>; 2]) -> u8 {
    let mut files = 0;
    if own[0] == Some(false) {
        files |= STDOUT_EMPTY;
    }
    if own[1] == Some(true) {
        files |= STDERR_WRITTEN;
    }
    files
}

/// `outputs` as a server of `version` reads them: before 11, without what they say of files
/// (those that say nothing else are left out).
pub(crate) fn for_version(outputs: &[TaskOutput], version: u32) -> Vec<TaskOutput> {
    let mut outputs = outputs.to_vec();
    if version < kestrel_proto::OUTPUT_FILES_VERSION {
        outputs.retain_mut(|o| {
            o.files = 0;
            o.stdout.is_some() || o.stderr.is_some()
        });
    }
    outputs
}

/// How many of the first `finished` (at least one, if any) and of their `outputs` (in the same
/// order) fit in a message with at most `budget` bytes of output.
pub(crate) fn fitting(
    finished: &[Finished],
    outputs: &[TaskOutput],
    budget: usize,
) -> (usize, usize) {
    let (mut taken, mut bytes) = (0, 0);
    for (i, f) in finished.iter().enumerate() {
        let own = outputs
            .get(taken)
            .filter(|o| (o.job, o.index) == (f.job, f.index));
        let size = own.map_or(0, TaskOutput::size);
        if i > 0 && bytes + size > budget {
            return (i, taken);
        }
        bytes += size;
        taken += usize::from(own.is_some());
    }
    // Everything fits: any output without its end goes too rather than stay behind forever.
    (finished.len(), outputs.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::RunEnd;

    fn end(index: TaskIndex) -> Finished {
        Finished {
            job: 1,
            index,
            started_us: 0,
            finished_us: 0,
            end: RunEnd::Success,
        }
    }

    fn out(index: TaskIndex, bytes: usize) -> TaskOutput {
        TaskOutput {
            job: 1,
            index,
            stdout: Some(Kept {
                data: vec![b'x'; bytes],
                total: bytes as u64,
            }),
            stderr: None,
            files: 0,
        }
    }

    #[test]
    fn only_unusual_own_files_are_said_and_never_to_an_older_server() {
        assert_eq!(unusual([Some(true), Some(false)]), 0, "the usual");
        assert_eq!(unusual([None, None]), 0);
        assert_eq!(
            unusual([Some(false), Some(true)]),
            STDOUT_EMPTY | STDERR_WRITTEN
        );
        let said = TaskOutput {
            job: 1,
            index: 3,
            files: STDOUT_EMPTY,
            ..TaskOutput::default()
        };
        let outs = vec![said.clone(), out(4, 2)];
        assert_eq!(for_version(&outs, 11), outs);
        let older = for_version(&outs, 10);
        assert_eq!((older.len(), older[0].index, older[0].files), (1, 4, 0));
    }

    #[test]
    fn ends_are_cut_where_their_output_exceeds_the_budget() {
        let ends: Vec<_> = (0..5).map(end).collect();
        // Tasks 1 and 3 wrote nothing.
        let outs = vec![out(0, 40), out(2, 40), out(4, 40)];
        assert_eq!(fitting(&ends, &outs, 100), (4, 2));
        assert_eq!(fitting(&ends[4..], &outs[2..], 100), (1, 1));
        assert_eq!(fitting(&ends, &outs, 1000), (5, 3));
        // One task over the budget still goes, alone.
        assert_eq!(fitting(&ends, &[out(0, 500), out(1, 10)], 100), (1, 1));
        assert_eq!(fitting(&[], &[], 100), (0, 0));
    }
}
