//! The sending side of a connection, and what to do when a message is too big for one frame.

use bytes::Bytes;
use kestrel_core::{IndexRun, TaskKind};
use kestrel_proto::messages::{
    Answer, Assigned, EdgeKind, OutputPage, Refusal, RowOutput, ToClient, ToWorker,
};
use kestrel_proto::{
    encode, ProtoError, ALLOC_VERSION, FILES_VERSION, FUNCTIONS_VERSION, MAX_FRAME_BYTES,
    OUTPUT_FILES_VERSION, TASK_DEPS_VERSION, VALUES_VERSION, WAITING_FOR_VERSION,
};
use serde::Serialize;
use tokio::sync::mpsc;

/// Why `what` ("the answer", "its command line") cannot go out in one message, for the
/// person who asked for it. Sizes round up, so "17 MiB" never reads as within a 16 MiB limit.
/// `size` is its encoded size, `None` if it was refused for another reason (logged).
pub fn unsendable_reason(what: &str, size: Option<usize>) -> String {
    match size {
        Some(size) => format!(
            "{what} is {} MiB, more than a message can carry ({} MiB)",
            size.div_ceil(1 << 20),
            MAX_FRAME_BYTES >> 20
        ),
        None => format!("{what} could not be encoded into a message"),
    }
}

/// The encoded size of a message refused for its size.
fn refused_size(e: &ProtoError) -> Option<usize> {
    match e {
        ProtoError::FrameTooLarge { size, .. } => Some(*size),
        _ => None,
    }
}

/// A connection's number, for routing replies.
pub type ConnId = u64;

/// The sending side of a connection: frames queued here are written by its writer task.
pub struct Outbox {
    pub conn: ConnId,
    pub tx: mpsc::UnboundedSender<Bytes>,
    /// The protocol version the connection negotiated: answers to an older client leave out
    /// what it cannot read.
    pub version: u32,
}

impl Outbox {
    /// Encodes and queues a message; a closed connection is noticed by its reader.
    /// Only for messages whose size is bounded well under a frame; see [`Outbox::reply`] and
    /// [`Outbox::assign`] for the others.
    pub fn send<T: Serialize + std::fmt::Debug>(&self, msg: &T) {
        match encode(msg) {
            Ok(frame) => self.queue(frame),
            Err(e) => tracing::error!(conn = self.conn, "cannot encode a message: {e}"),
        }
    }

    fn queue(&self, frame: Bytes) {
        let _ = self.tx.send(frame);
    }

    /// Answers request `id`. An answer too big for a frame (a task list asked with a huge
    /// limit) becomes an error the client can act on, so the client never waits forever.
    pub fn reply(&self, id: u64, mut result: Result<Answer, Refusal>) {
        if self.version < FILES_VERSION {
            if let Ok(answer) = &mut result {
                for_older_client(answer);
            }
        }
        if self.version < WAITING_FOR_VERSION {
            if let Ok(answer) = &mut result {
                without_waiting_for(answer);
            }
        }
        if self.version < ALLOC_VERSION {
            // A worker's allocation is a field it cannot read.
            if let Ok(Answer::Workers(rows)) = &mut result {
                rows.iter_mut().for_each(|r| r.alloc = None);
            }
        }
        if self.version < OUTPUT_FILES_VERSION {
            if let Ok(Answer::Output(page)) = &mut result {
                written_as_files(page);
            }
        }
        if self.version < TASK_DEPS_VERSION {
            if let Ok(answer) = &mut result {
                before_nodes_and_deps(answer);
            }
        }
        if self.version < FUNCTIONS_VERSION {
            // A template's function is a field such a client cannot read: it sees a job of
            // lines without a command.
            if let Ok(Answer::Job(d)) = &mut result {
                d.spec.template.kind = TaskKind::Command;
            }
        }
        if let Ok(Answer::Info(info)) = &mut result {
            if self.version < VALUES_VERSION {
                info.traffic = None;
                info.values_deleted = None;
            } else if info.traffic.is_some() {
                // Positional: the fields before `traffic` go whenever it does.
                info.intermediates_deleted.get_or_insert((0, 0));
                info.intermediates_remade.get_or_insert(0);
            }
        }
        match encode(&ToClient::Reply { id, result }) {
            Ok(frame) => self.queue(frame),
            Err(e) => {
                tracing::warn!(conn = self.conn, "answer not sent: {e}");
                let msg = format!(
                    "{}; ask for less (a smaller --limit, or one job at a time)",
                    unsendable_reason("the answer", refused_size(&e))
                );
                self.send(&ToClient::Reply {
                    id,
                    result: Err(msg.into()),
                });
            }
        }
    }

    /// Sends tasks to a worker, in as many messages as the frame limit needs (list tasks carry
    /// their command lines, and thousands of long lines exceed one frame). Returns the tasks
    /// that cannot be sent at all, each with its encoded size (see [`unsendable_reason`]): one
    /// command line alone over the limit.
    pub fn assign(&self, tasks: Vec<Assigned>) -> Vec<(IndexRun, Option<usize>)> {
        let mut unsendable = Vec::new();
        self.assign_into(tasks, &mut unsendable);
        unsendable
    }

    fn assign_into(&self, tasks: Vec<Assigned>, unsendable: &mut Vec<(IndexRun, Option<usize>)>) {
        let msg = ToWorker::Assign { tasks };
        let size = match encode(&msg) {
            Ok(frame) => return self.queue(frame),
            Err(e) => {
                if refused_size(&e).is_none() {
                    // Encoding plain data fails only on size; anything else is a bug to see.
                    tracing::error!(conn = self.conn, "cannot encode an assignment: {e}");
                }
                refused_size(&e)
            }
        };
        let ToWorker::Assign { mut tasks } = msg else {
            unreachable!("built as an Assign just above");
        };
        // Halve until each piece fits: first split between runs, then inside a run.
        if tasks.len() > 1 {
            let right = tasks.split_off(tasks.len() / 2);
            self.assign_into(tasks, unsendable);
            self.assign_into(right, unsendable);
        } else if let Some(mut a) = tasks.pop() {
            if a.run.count > 1 && a.carries_tasks() {
                let right = a.split_off(a.run.count / 2);
                self.assign_into(vec![a], unsendable);
                self.assign_into(vec![right], unsendable);
            } else {
                for i in 0..a.run.count {
                    let run = IndexRun {
                        job: a.run.job,
                        first: a.run.first + i,
                        count: 1,
                    };
                    unsendable.push((run, size));
                }
            }
        }
    }
}

/// Says `File` for the output files a task is known to have written (`Written`, version 11),
/// for a client that cannot read the difference.
fn written_as_files(page: &mut OutputPage) {
    for row in &mut page.rows {
        if let RowOutput::Written(path) = &mut row.output {
            row.output = RowOutput::File(std::mem::take(path));
        }
    }
}

/// Leaves out of `answer` the fields of version 8 (files, placement, transfers, caches), which
/// a client of version 7 or older refuses as longer arrays: it sees the job or worker as it
/// would have before.
fn for_older_client(answer: &mut Answer) {
    match answer {
        Answer::Job(d) => {
            d.spec.template.files = Default::default();
            d.spec.placement = Default::default();
            d.transfers = Default::default();
        }
        Answer::Workers(rows) => {
            for r in rows {
                r.cache = None;
            }
        }
        Answer::Task(d) => d.task.transfers = Default::default(),
        Answer::Tasks(page) => page
            .rows
            .iter_mut()
            .for_each(|r| r.transfers = Default::default()),
        Answer::TaskRange(range) => {
            range
                .rows
                .iter_mut()
                .for_each(|r| r.transfers = Default::default());
        }
        _ => {}
    }
}

/// Leaves out of `answer` what listed jobs wait for (version 11), which a client of version
/// 10 or older refuses as a longer array.
fn without_waiting_for(answer: &mut Answer) {
    match answer {
        Answer::Jobs(jobs) => jobs.iter_mut().for_each(|j| j.waiting_for.clear()),
        Answer::JobsPage(page) => page.jobs.iter_mut().for_each(|j| j.waiting_for.clear()),
        Answer::Job(d) => d.summary.waiting_for.clear(),
        _ => {}
    }
}

/// Leaves out of `answer` what a client of version 10 or older cannot read (a job's `nodes`
/// and `deps`, longer arrays; a graph's `Deps` edges, drawn as `after` for it).
fn before_nodes_and_deps(answer: &mut Answer) {
    match answer {
        Answer::Job(d) => {
            d.spec.nodes = 0;
            d.spec.deps = Vec::new();
            d.spec.task_ids = None;
        }
        Answer::Graph(g) => {
            for e in &mut g.edges {
                if e.kind == EdgeKind::Deps {
                    e.kind = EdgeKind::After;
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use kestrel_core::{JobSpec, Placement, PolicyName, TaskKind};

    /// Job 1 of `spec` as `job info` answers it, queued, nothing moved.
    fn job_detail(spec: JobSpec) -> kestrel_proto::messages::JobDetail {
        kestrel_proto::messages::JobDetail {
            summary: kestrel_proto::messages::JobSummary {
                id: 1,
                name: spec.name.clone(),
                state: "queued".into(),
                counts: Default::default(),
                submitted_us: 0,
                finished_us: None,
                waiting_for: Vec::new(),
            },
            spec,
            tasks: String::new(),
            timing: Default::default(),
            ids: None,
            waiting: None,
            transfers: Default::default(),
        }
    }

    #[test]
    fn an_older_client_gets_answers_without_the_fields_it_cannot_read() {
        let (mut out, mut rx) = outbox();
        out.version = FILES_VERSION - 1;
        let mut spec = JobSpec::command("reads", vec!["cat".into()]);
        spec.template.files.inputs = vec!["raw/{task}".into()];
        spec.placement = Placement {
            policy: Some(PolicyName::MaxCacheHit),
            ..Placement::default()
        };
        let mut plain = spec.clone();
        plain.template.files = Default::default();
        plain.placement = Default::default();
        let mut detail = job_detail(spec);
        detail.transfers.store_files = 1;
        let mut answer = Answer::Job(Box::new(detail));
        out.reply(1, Ok(answer.clone()));
        let frame = rx.try_recv().expect("a reply");
        // What was sent is the answer as version 7 wrote it.
        for_older_client(&mut answer);
        let Answer::Job(d) = &answer else {
            unreachable!()
        };
        assert_eq!((&d.spec, d.transfers.is_empty()), (&plain, true));
        let want = encode(&ToClient::Reply {
            id: 1,
            result: Ok(answer),
        })
        .unwrap();
        assert_eq!(&frame[..], &want[..]);
    }

    /// A function job's template reaches a client of version 11 without the function, which
    /// it could not decode.
    #[test]
    fn a_version_11_client_gets_a_function_jobs_template_without_its_function() {
        let mut spec = JobSpec::command("f", Vec::new());
        spec.template.kind = TaskKind::Function(Box::default());
        let detail = job_detail(spec);
        for (version, function) in [(FUNCTIONS_VERSION - 1, false), (FUNCTIONS_VERSION, true)] {
            let (mut out, mut rx) = outbox();
            out.version = version;
            out.reply(1, Ok(Answer::Job(Box::new(detail.clone()))));
            let frame = rx.try_recv().expect("a reply");
            let back: ToClient = kestrel_proto::decode(&frame).expect("decodes");
            let ToClient::Reply {
                result: Ok(Answer::Job(d)),
                ..
            } = back
            else {
                panic!("{back:?}");
            };
            assert_eq!(
                d.spec.template.kind.is_function(),
                function,
                "version {version}"
            );
        }
    }

    /// What a listed job waits for (version 11) is left out for a client of version 10, which
    /// would refuse the longer array; a client of 11 gets it.
    #[test]
    fn a_version_10_client_gets_listed_jobs_without_what_they_wait_for() {
        use kestrel_proto::messages::{JobSummary, JobsPage};
        let summary = JobSummary {
            id: 2,
            name: "b".into(),
            state: "queued".into(),
            counts: Default::default(),
            submitted_us: 0,
            finished_us: None,
            waiting_for: vec![(1, None)],
        };
        let page = |waiting_for: Vec<_>| {
            Answer::JobsPage(JobsPage {
                jobs: vec![JobSummary {
                    waiting_for,
                    ..summary.clone()
                }],
                more: 0,
            })
        };
        for (version, sent) in [(10, page(vec![])), (11, page(vec![(1, None)]))] {
            let (mut out, mut rx) = outbox();
            out.version = version;
            out.reply(1, Ok(page(vec![(1, None)])));
            let frame = rx.try_recv().expect("a reply");
            let want = encode(&ToClient::Reply {
                id: 1,
                result: Ok(sent),
            })
            .unwrap();
            assert_eq!(&frame[..], &want[..], "version {version}");
        }
    }

    #[test]
    fn an_older_client_reads_a_file_known_written_as_a_file() {
        let page = |output| {
            Answer::Output(OutputPage {
                sink: kestrel_core::Sink::File("job-{job}/{task}.out".into()),
                rows: vec![kestrel_proto::messages::OutputRow {
                    id: 1,
                    state: None,
                    output,
                }],
                next: None,
            })
        };
        let (mut out, mut rx) = outbox();
        out.version = OUTPUT_FILES_VERSION - 1;
        out.reply(1, Ok(page(RowOutput::Written("/w/job-1/1.out".into()))));
        let want = encode(&ToClient::Reply {
            id: 1,
            result: Ok(page(RowOutput::File("/w/job-1/1.out".into()))),
        })
        .unwrap();
        assert_eq!(&rx.try_recv().expect("a reply")[..], &want[..]);
    }

    use super::*;
    use kestrel_proto::decode;

    fn outbox() -> (Outbox, mpsc::UnboundedReceiver<Bytes>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Outbox {
                conn: 1,
                tx,
                version: kestrel_proto::PROTOCOL_VERSION,
            },
            rx,
        )
    }

    fn long_task(bytes: usize) -> Vec<String> {
        vec!["echo".into(), "x".repeat(bytes)]
    }

    #[test]
    fn an_assignment_too_big_for_one_frame_goes_in_several() {
        let (o, mut rx) = outbox();
        // 40 tasks of 1 MiB each: 40 MiB, at least three frames.
        let tasks = vec![
            Assigned {
                run: IndexRun {
                    job: 7,
                    first: 0,
                    count: 30,
                },
                argvs: (0..30).map(|_| long_task(1 << 20)).collect(),
                lines: Default::default(),
                nodes: vec![],
            },
            Assigned {
                run: IndexRun {
                    job: 7,
                    first: 30,
                    count: 10,
                },
                argvs: (0..10).map(|_| long_task(1 << 20)).collect(),
                lines: Default::default(),
                nodes: vec![],
            },
        ];
        assert!(o.assign(tasks).is_empty());
        let mut indices = Vec::new();
        let mut frames = 0;
        while let Ok(frame) = rx.try_recv() {
            frames += 1;
            assert!(frame.len() <= MAX_FRAME_BYTES);
            let ToWorker::Assign { tasks } = decode(&frame).unwrap() else {
                panic!("not an assignment");
            };
            for a in tasks {
                assert_eq!(a.argvs.len(), a.run.count as usize);
                indices.extend(a.run.first..a.run.first + a.run.count);
            }
        }
        assert!(frames >= 3, "{frames} frames");
        assert_eq!(
            indices,
            (0..40).collect::<Vec<_>>(),
            "every task once, in order"
        );
    }

    #[test]
    fn lines_too_many_for_one_frame_are_split_with_their_run() {
        let (o, mut rx) = outbox();
        let line = "y".repeat(1 << 20);
        let tasks = vec![Assigned {
            run: IndexRun {
                job: 3,
                first: 10,
                count: 40,
            },
            argvs: vec![],
            lines: (0..40).map(|_| line.as_str()).collect(),
            nodes: vec![],
        }];
        assert!(o.assign(tasks).is_empty());
        let mut indices = Vec::new();
        while let Ok(frame) = rx.try_recv() {
            let ToWorker::Assign { tasks } = decode(&frame).unwrap() else {
                panic!("not an assignment");
            };
            for a in tasks {
                assert_eq!(a.lines.len(), a.run.count as usize);
                indices.extend(a.run.first..a.run.first + a.run.count);
            }
        }
        assert_eq!(indices, (10..50).collect::<Vec<_>>());
    }

    #[test]
    fn a_task_longer_than_a_frame_is_returned_not_dropped() {
        let (o, mut rx) = outbox();
        let tasks = vec![Assigned {
            run: IndexRun {
                job: 2,
                first: 5,
                count: 2,
            },
            argvs: vec![long_task(10), long_task(MAX_FRAME_BYTES + 1)],
            lines: Default::default(),
            nodes: vec![],
        }];
        let left = o.assign(tasks);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].0.first, 6);
        assert!(left[0].1 > Some(MAX_FRAME_BYTES));
        let ToWorker::Assign { tasks } = decode(&rx.try_recv().unwrap()).unwrap() else {
            panic!("not an assignment");
        };
        assert_eq!(tasks[0].run.first, 5);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn an_answer_too_big_becomes_an_error_reply() {
        let (o, mut rx) = outbox();
        o.reply(3, Ok(Answer::Extended));
        let ok: ToClient = decode(&rx.try_recv().unwrap()).unwrap();
        assert_eq!(
            ok,
            ToClient::Reply {
                id: 3,
                result: Ok(Answer::Extended)
            }
        );
        o.reply(4, Err("x".repeat(MAX_FRAME_BYTES + 1).into()));
        let ToClient::Reply { id, result } = decode(&rx.try_recv().unwrap()).unwrap() else {
            panic!("not a reply");
        };
        assert_eq!(id, 4);
        let err = result.unwrap_err().message;
        assert!(err.contains("more than a message can carry"), "{err}");
    }
}
