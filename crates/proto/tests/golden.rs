//! The bytes of every message, pinned: one value of each kind is encoded as a frame body and
//! compared with the hex in `tests/golden/NAME.hex`, and those bytes must decode back to the
//! value. A change that alters what goes on the wire fails here. If the change is meant, bump
//! `PROTOCOL_VERSION`, update docs/protocol.md, and write the files again with
//! `KESTREL_BLESS=1 cargo test -p kestrel-proto --test golden`.

use kestrel_core::files::Transfers;
use kestrel_core::{
    After, Failure, Finished, FunctionSpec, IdRanges, IndexRun, JobSpec, Keep, LineList, Placement,
    PolicyName, PythonEnv, Resources, RunEnd, Sink, TaskDeps, TaskFiles, TaskKind, TaskRef,
    TaskSet, TaskState, TaskTemplate,
};
use kestrel_proto::messages::*;
use kestrel_proto::{decode, encode};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;
use std::path::PathBuf;

/// The encoding of `value` as 16 bytes of hex per line.
fn hex(value: &impl Serialize) -> String {
    let body = encode(value).expect("encodes");
    body.chunks(16)
        .map(|line| {
            let bytes: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
            bytes.join(" ") + "\n"
        })
        .collect()
}

/// Checks `value`'s bytes against the file `name` and that they decode back to it.
fn golden<T: Serialize + DeserializeOwned + PartialEq + Debug>(name: &str, value: T) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.hex"));
    let got = hex(&value);
    if std::env::var_os("KESTREL_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; write it with KESTREL_BLESS=1 (see this file's doc)",
            path.display()
        )
    });
    assert_eq!(
        got, want,
        "the bytes of {name} changed: bump PROTOCOL_VERSION and update docs/protocol.md if that is meant"
    );
    let body = encode(&value).unwrap();
    let back: T = decode(&body).expect("the golden bytes decode");
    assert_eq!(back, value, "{name} does not come back from its bytes");
}

fn failure() -> Failure {
    Failure {
        exit_code: Some(3),
        signal: None,
        reason: "exit code 3".into(),
        stderr_tail: "boom".into(),
        permanent: false,
    }
}

fn ends() -> Vec<Finished> {
    let end = |index, end| Finished {
        job: 7,
        index,
        started_us: 1_700_000_000_000_000,
        finished_us: 1_700_000_000_000_250,
        end,
    };
    vec![
        end(0, RunEnd::Success),
        end(1, RunEnd::Failed(Box::new(failure()))),
        end(2, RunEnd::Canceled),
    ]
}

fn output() -> TaskOutput {
    TaskOutput {
        job: 7,
        index: 0,
        stdout: Some(Kept {
            data: b"hi\n".to_vec(),
            total: 3,
        }),
        stderr: None,
        files: 0,
    }
}

fn template() -> TaskTemplate {
    TaskTemplate {
        argv: vec!["sim".into(), "{task}".into()],
        env: vec![("MODE".into(), "fast".into())],
        cwd: Some("/data".into()),
        stdout: Sink::File("out/{task}.txt".into()),
        stderr: Sink::Stream { limit: 1024 },
        timeout_ms: Some(60_000),
        files: TaskFiles::default(),
        kind: TaskKind::Command,
    }
}

fn resources() -> Resources {
    Resources {
        cpus: 2,
        gpus: 1,
        mem: 1 << 30,
        ..Resources::NONE
    }
}

fn spec() -> JobSpec {
    JobSpec {
        name: "sweep".into(),
        template: template(),
        resources: resources(),
        priority: -1,
        retries: 2,
        named: vec![("licenses".into(), 1)],
        placement: Placement::default(),
        after: vec![],
        parent: None,
        nodes: 0,
        deps: vec![],
        task_ids: None,
    }
}

/// A job of version 8 that reads and writes files and picks its store and policy.
fn data_spec() -> JobSpec {
    let mut spec = spec();
    spec.template.files = TaskFiles {
        inputs: vec!["raw/{task}.fits".into()],
        outputs: vec!["out/{task}.fits".into()],
        statics: vec!["bin/mProject".into()],
        keep: vec![],
        replicas: 0,
    };
    spec.placement = Placement {
        store: Some("http://store/".into()),
        policy: Some(PolicyName::GoodCacheCompute),
        util_threshold_permille: Some(900),
    };
    spec
}

/// A request submitting an array job of `spec`.
fn submit_request(spec: JobSpec) -> Request {
    Request {
        id: 9,
        body: Ask::Submit {
            spec,
            tasks: TaskSet::Array(ids()),
            open: false,
            key: None,
        },
    }
}

#[test]
fn files_and_placement_are_trailing_fields_left_out_when_empty() {
    // Without them a spec is written as in version 7: the requests above pin those bytes.
    golden("submit-v8-files", submit_request(data_spec()));
    // Only inputs: the other kinds of file travel as empty arrays, the placement not at all.
    let mut only_inputs = spec();
    only_inputs.template.files.inputs = vec!["a".into()];
    golden("submit-v8-inputs", submit_request(only_inputs));
}

#[test]
fn graph_fields_follow_the_placement_which_travels_when_they_do() {
    // `after` without a placement of its own: the default placement goes in its place.
    let mut after = spec();
    after.after = vec![After::parse("7").unwrap(), After::parse("8:1-4").unwrap()];
    golden("submit-v9-after", submit_request(after));
    // A parent alone: an empty `after` goes before it; and output modes.
    let mut child = data_spec();
    child.parent = Some((3, 12));
    child.template.files.keep = vec![Keep::Local];
    golden("submit-v9-parent", submit_request(child));
}

#[test]
fn nodes_and_task_deps_follow_the_graph_fields_which_travel_when_they_do() {
    // Without them a spec is written as in version 10: the requests above pin those bytes.
    // `nodes` alone: an empty placement, `after` and a nil parent go before it.
    let mut mpi = spec();
    mpi.nodes = 4;
    golden("submit-v11-nodes", submit_request(mpi));
    // `deps`: on tasks of the same job (nil job) and of another; `nodes` 0 goes before it.
    let mut deps = spec();
    deps.deps = vec![
        TaskDeps {
            task: 3,
            on: vec![
                TaskRef { job: None, task: 1 },
                TaskRef {
                    job: Some(5),
                    task: 2,
                },
            ],
        },
        TaskDeps {
            task: 4,
            on: vec![TaskRef { job: None, task: 3 }],
        },
    ];
    golden(
        "submit-v11-deps",
        Request {
            id: 9,
            body: Ask::Submit {
                spec: deps,
                tasks: TaskSet::List(vec![vec!["a".into()]; 5]),
                open: false,
                key: None,
            },
        },
    );
    // Tasks with ids of their own: `nodes` 0 and no `deps` go before them.
    let mut ids = spec();
    ids.task_ids = Some(IdRanges::parse("1,3,5").unwrap());
    golden(
        "submit-v11-task-ids",
        Request {
            id: 9,
            body: Ask::Submit {
                spec: ids,
                tasks: TaskSet::List(vec![vec!["a".into()]; 3]),
                open: false,
                key: None,
            },
        },
    );
    // A multi-node task's assignment: its workers after the (empty) lines.
    let mut one = Assigned::run(IndexRun {
        job: 7,
        first: 3,
        count: 1,
    });
    one.nodes = vec![
        Node {
            worker: 2,
            host: "node2".into(),
        },
        Node {
            worker: 5,
            host: "node5".into(),
        },
    ];
    golden("assign-v11-nodes", ToWorker::Assign { tasks: vec![one] });
}

fn lines() -> LineList {
    ["a.dat", "b.dat"].into_iter().collect()
}

fn ids() -> IdRanges {
    IdRanges::parse("1-100,200-300:10").unwrap()
}

#[test]
fn worker_to_server() {
    golden(
        "register",
        FromWorker::Register(Registration {
            hostname: "node1".into(),
            slots: 4,
            gpus: 1,
            prefetch: 4,
            exec: "process".into(),
            resume: Some(Resume {
                server_id: "s-1".into(),
                previous_worker: 3,
                epoch: 42,
                running: vec![(7, 5)],
                finished: ends(),
                outputs: vec![output()],
            }),
            mem: 8 << 30,
            named: vec![("licenses".into(), 4)],
            cache: None,
            alloc: None,
            ends_at_s: None,
            group: None,
            python: None,
        }),
    );
    // Version 8: a worker with a cache says so, and reports what it gains and loses.
    golden(
        "register-v8-cache",
        FromWorker::Register(Registration {
            hostname: "node1".into(),
            slots: 4,
            gpus: 0,
            prefetch: 4,
            exec: "process".into(),
            resume: None,
            mem: 8 << 30,
            named: vec![],
            cache: Some(CacheInfo {
                serves: "http://node1:7100/".into(),
                capacity: 20 << 30,
                held: vec![("raw/1.fits".into(), 1 << 20)],
            }),
            alloc: None,
            ends_at_s: None,
            group: None,
            python: None,
        }),
    );
    // A worker a pilot script started says which allocation it runs in and when that ends.
    golden(
        "register-alloc",
        FromWorker::Register(Registration {
            hostname: "n1".into(),
            slots: 4,
            gpus: 0,
            prefetch: 4,
            exec: "process".into(),
            resume: None,
            mem: 4 << 30,
            named: vec![],
            cache: None,
            alloc: Some(7),
            ends_at_s: Some(1_795_000_000),
            group: None,
            python: None,
        }),
    );
    // Version 11: a worker of a group of its own (`--group`); the fields before it as nil.
    golden(
        "register-v11-group",
        FromWorker::Register(Registration {
            hostname: "n1".into(),
            slots: 4,
            gpus: 0,
            prefetch: 4,
            exec: "process".into(),
            resume: None,
            mem: 4 << 30,
            named: vec![],
            cache: None,
            alloc: None,
            ends_at_s: None,
            group: Some("rack-2".into()),
            python: None,
        }),
    );
    // Version 12: a worker that calls function tasks, in this Python.
    golden(
        "register-v12-python",
        FromWorker::Register(Registration {
            hostname: "n1".into(),
            slots: 2,
            gpus: 0,
            prefetch: 2,
            exec: "process".into(),
            resume: None,
            mem: 1 << 30,
            named: vec![],
            cache: None,
            alloc: None,
            ends_at_s: None,
            group: None,
            python: Some(PythonRunner {
                python: "3.11.7".into(),
                cloudpickle: "3.1.1".into(),
                executable: "/usr/bin/python3".into(),
            }),
        }),
    );
    golden(
        "update-v8-cache",
        FromWorker::Update {
            started: vec![],
            finished: vec![],
            outputs: vec![],
            waited: vec![],
            cache: CacheChange {
                added: vec![("raw/2.fits".into(), 1 << 20)],
                evicted: vec!["raw/1.fits".into()],
                moved: vec![JobTransfers {
                    job: 7,
                    moved: Transfers {
                        local_files: 3,
                        local_bytes: 3 << 20,
                        peer_files: 1,
                        peer_bytes: 1 << 20,
                        store_files: 2,
                        store_bytes: 2 << 20,
                    },
                    store_trouble: String::new(),
                    tasks: vec![TaskTransfers {
                        index: 3,
                        moved: Transfers {
                            peer_files: 1,
                            peer_bytes: 1 << 20,
                            ..Transfers::default()
                        },
                    }],
                }],
                unheld: vec![],
                capacity: None,
            },
        },
    );
    golden(
        "update-v8-capacity",
        FromWorker::Update {
            started: vec![],
            finished: vec![],
            outputs: vec![],
            waited: vec![],
            cache: CacheChange {
                evicted: vec!["6b1c0a3f2d9e8b74/raw/1.fits".into()],
                capacity: Some(3 << 20),
                ..CacheChange::default()
            },
        },
    );
    golden(
        "update-v8-unheld",
        FromWorker::Update {
            started: vec![],
            finished: vec![],
            outputs: vec![],
            waited: vec![],
            cache: CacheChange {
                moved: vec![JobTransfers {
                    job: 8,
                    moved: Transfers::default(),
                    store_trouble: "reading raw/3.fits from http://store/: connection refused"
                        .into(),
                    tasks: vec![],
                }],
                unheld: vec![Unheld {
                    file: "6b1c0a3f2d9e8b74/raw/1.fits".into(),
                    peer: "http://node2:7100/".into(),
                }],
                ..CacheChange::default()
            },
        },
    );
    golden(
        "update",
        FromWorker::Update {
            started: vec![Started {
                job: 7,
                index: 3,
                at_us: 1_700_000_000_000_000,
            }],
            finished: ends(),
            outputs: vec![output()],
            waited: vec![(7, 1500)],
            cache: Default::default(),
        },
    );
    golden("heartbeat", FromWorker::Heartbeat);
    golden(
        "revoked",
        FromWorker::Revoked {
            tasks: vec![(7, 4), (7, 5)],
        },
    );
}

#[test]
fn server_to_worker() {
    golden(
        "registered",
        ToWorker::Registered {
            worker: 3,
            heartbeat_ms: 5000,
            server: "head:7777".into(),
            server_id: "s-1".into(),
            epoch: 42,
        },
    );
    golden(
        "define_job",
        ToWorker::DefineJob {
            job: 7,
            template: Box::new(template()),
            ids: JobIds::Array(ids()),
            resources: resources(),
            named: vec![("licenses".into(), 1)],
            store: None,
        },
    );
    golden(
        "define_job-v8-files",
        ToWorker::DefineJob {
            job: 7,
            template: Box::new(data_spec().template),
            ids: JobIds::Array(ids()),
            resources: resources(),
            named: vec![],
            store: Some("/shared/store".into()),
        },
    );
    // Version 12: a job calling a Python function, sent once per worker with its definition.
    golden(
        "define_job-v12-function",
        ToWorker::DefineJob {
            job: 8,
            template: Box::new(TaskTemplate {
                stdout: Sink::Stream { limit: 1 << 20 },
                stderr: Sink::Stream { limit: 1 << 16 },
                kind: TaskKind::Function(Box::new(FunctionSpec {
                    name: "sweep.simulate".into(),
                    pickled: vec![0x80, 0x05, 0x95, b'.'],
                    env: PythonEnv {
                        python: "3.11.7".into(),
                        cloudpickle: "3.1.1".into(),
                        modules: vec![("numpy".into(), "2.1.0".into())],
                    },
                    path: vec!["/home/me/project".into()],
                    inline_limit: 1 << 20,
                })),
                ..TaskTemplate::default()
            }),
            ids: JobIds::List,
            resources: resources(),
            named: vec![],
            store: None,
        },
    );
    let run = |first, count| IndexRun {
        job: 7,
        first,
        count,
    };
    let mut lines_run = Assigned::run(run(10, 2));
    lines_run.lines = lines();
    golden(
        "assign",
        ToWorker::Assign {
            tasks: vec![
                Assigned::run(run(0, 64)),
                Assigned {
                    run: run(64, 1),
                    argvs: vec![vec!["echo".into(), "x".into()]],
                    lines: LineList::new(),
                    nodes: vec![],
                },
                lines_run,
            ],
        },
    );
    golden(
        "cancel",
        ToWorker::Cancel {
            tasks: vec![(7, 1)],
        },
    );
    golden(
        "revoke",
        ToWorker::Revoke {
            tasks: vec![(7, 4)],
        },
    );
    golden("forget_job", ToWorker::ForgetJob { job: 7 });
    golden(
        "shutdown",
        ToWorker::Shutdown {
            reason: "the server is stopping".into(),
        },
    );
    golden(
        "sources-v8",
        ToWorker::Sources {
            files: vec![FileSources {
                file: "6b1c0a3f2d9e8b74/raw/1.fits".into(),
                peers: vec!["http://node2:7100/".into(), "http://node3:7100/".into()],
            }],
        },
    );
    golden(
        "task_row-v8-transfers",
        TaskRow {
            transfers: Transfers {
                local_files: 1,
                local_bytes: 1 << 20,
                store_files: 1,
                store_bytes: 1 << 20,
                ..Transfers::default()
            },
            ..row()
        },
    );
    golden("job_ids_list", JobIds::List);
}

#[test]
fn client_requests() {
    let asks = vec![
        Ask::Submit {
            spec: spec(),
            tasks: TaskSet::Array(ids()),
            open: false,
            key: Some("nightly".into()),
        },
        Ask::Submit {
            spec: spec(),
            tasks: TaskSet::List(vec![vec!["a".into()], vec!["b".into(), "c".into()]]),
            open: true,
            key: None,
        },
        Ask::Submit {
            spec: spec(),
            tasks: TaskSet::Lines(lines()),
            open: true,
            key: None,
        },
        Ask::Extend {
            job: 7,
            at: 2,
            argvs: vec![vec!["d".into()]],
            close: true,
        },
        Ask::ExtendLines {
            job: 7,
            at: 2,
            lines: lines(),
            close: false,
        },
        Ask::JobList,
        Ask::JobInfo { job: 7 },
        Ask::TaskList {
            job: 7,
            state: Some(TaskState::Failed),
            limit: 100,
        },
        Ask::WorkerList,
        Ask::Cancel { jobs: vec![7, 8] },
        Ask::Wait {
            jobs: vec![7],
            progress_ms: 500,
        },
        Ask::ServerInfo,
        Ask::Stop,
        Ask::Retry {
            job: 7,
            failed_only: true,
        },
        Ask::ResumeWorker { worker: 3 },
        Ask::JobStates { jobs: vec![7, 9] },
        Ask::Jobs {
            filter: JobFilter {
                states: vec![JobState::Running, JobState::Failed],
                name: Some("sweep*".into()),
                last: 10,
                before: None,
            },
        },
        Ask::Forget {
            jobs: vec![7],
            all_ended: true,
        },
        Ask::TaskPage {
            job: 7,
            state: None,
            offset: 100,
            limit: 50,
        },
        Ask::TaskInfo { job: 7, task: 42 },
        Ask::Output {
            job: 7,
            stderr: true,
            tasks: Some(ids()),
            from: 3,
            max_bytes: 65536,
        },
        Ask::AllocList,
        Ask::AllocLog {
            queue: 1,
            alloc: Some(7),
            lines: 20,
        },
    ];
    for (i, body) in asks.into_iter().enumerate() {
        golden(&format!("request-{i:02}"), Request { id: 9, body });
    }
}

fn counts() -> Counts {
    Counts {
        ready: 1,
        assigned: 2,
        running: 3,
        finished: 90,
        failed: 4,
        canceled: 0,
        waiting: 0,
    }
}

fn summary() -> JobSummary {
    JobSummary {
        id: 7,
        name: "sweep".into(),
        state: "running".into(),
        counts: counts(),
        submitted_us: 1_700_000_000_000_000,
        finished_us: None,
        waiting_for: Vec::new(),
    }
}

fn row() -> TaskRow {
    TaskRow {
        id: 42,
        state: TaskState::Failed,
        worker: Some(3),
        assigned_us: 1_700_000_000_000_000,
        started_us: 1_700_000_000_000_100,
        finished_us: 1_700_000_000_000_900,
        failures: 1,
        lost: 0,
        exit_code: Some(3),
        reason: Some("exit code 3".into()),
        stderr_tail: Some("boom".into()),
        attempts: 2,
        transfers: Transfers::default(),
    }
}

fn progress() -> WaitProgress {
    WaitProgress {
        jobs: 2,
        jobs_done: 1,
        counts: counts(),
        waiting: Some("job 8: no worker is connected".into()),
    }
}

#[test]
fn server_answers() {
    let refusal = Refusal::not_found("job 99 does not exist; `kestrel job list` shows the jobs");
    let answers = vec![
        Answer::Submitted {
            job: 7,
            warning: Some("each task needs 3 cpus".into()),
            repeated: false,
        },
        Answer::Extended,
        Answer::Jobs(vec![summary()]),
        Answer::Job(Box::new(JobDetail {
            summary: summary(),
            spec: spec(),
            tasks: "array of 111 tasks, ids 1-100,200-300:10".into(),
            timing: Timing {
                tasks: 90,
                mean_queue_us: 1500.5,
                mean_dispatch_us: 300.25,
                mean_run_us: 12000.0,
                span_us: 2_000_000,
                mean_waited_us: 40.0,
            },
            ids: Some("1-100,200-300:10".into()),
            waiting: None,
            transfers: Default::default(),
        })),
        Answer::Tasks(TaskPage {
            rows: vec![row()],
            more: 5,
        }),
        Answer::Workers(vec![WorkerRow {
            id: 3,
            hostname: "node1".into(),
            address: "10.0.0.5:41000".into(),
            slots: 4,
            gpus: 1,
            prefetch: 4,
            exec: "process".into(),
            tasks: 2,
            finished: 90,
            failed: 4,
            joined_us: 1_700_000_000_000_000,
            last_seen_us: 1_700_000_001_000_000,
            quarantined: Some("10 of its last 10 tasks of job 7 failed".into()),
            mem: 8 << 30,
            named: vec![("licenses".into(), 4)],
            cache: None,
            alloc: None,
        }]),
        Answer::Canceled(vec![
            CancelResult {
                job: 7,
                result: Ok((10, 2)),
            },
            CancelResult {
                job: 99,
                result: Err(refusal.clone()),
            },
        ]),
        Answer::WaitDone(progress()),
        Answer::Info(Box::new(ServerInfo {
            intermediates_deleted: None,
            intermediates_remade: None,
            traffic: None,
            values_deleted: None,
            version: "0.1.0".into(),
            protocol: 6,
            address: "head:7777".into(),
            dir: "/srv/kestrel".into(),
            pid: 4242,
            started_us: 1_700_000_000_000_000,
            workers: 2,
            jobs: 3,
            live_jobs: 1,
            queued: 50,
            journal: Some(JournalInfo {
                path: "/srv/kestrel/journal.sqlite".into(),
                bytes: 1 << 20,
                rows: 1000,
                error: None,
            }),
        })),
        Answer::Stopping,
        Answer::Retried {
            job: 7,
            failed: 4,
            canceled: 0,
        },
        Answer::WorkerResumed {
            worker: 3,
            was_quarantined: true,
        },
        Answer::Output(OutputPage {
            sink: Sink::Stream { limit: 1024 },
            rows: vec![
                OutputRow {
                    id: 1,
                    state: Some(TaskState::Finished),
                    output: RowOutput::Kept(Kept {
                        data: b"hi\n".to_vec(),
                        total: 3,
                    }),
                },
                OutputRow {
                    id: 2,
                    state: Some(TaskState::Running),
                    output: RowOutput::Nothing,
                },
                OutputRow {
                    id: 3,
                    state: None,
                    output: RowOutput::Dropped("over the server's output budget".into()),
                },
                OutputRow {
                    id: 4,
                    state: Some(TaskState::Finished),
                    output: RowOutput::File("out/4.txt".into()),
                },
            ],
            next: Some(5),
        }),
        Answer::JobStates(vec![(7, Some(JobState::Running)), (99, None)]),
        Answer::JobsPage(JobsPage {
            jobs: vec![summary()],
            more: 12,
        }),
        Answer::Forgotten(vec![
            ForgetResult {
                job: 6,
                result: Ok(()),
            },
            ForgetResult {
                job: 7,
                result: Err(Refusal::from("job 7 has not ended".to_string())),
            },
        ]),
        Answer::TaskRange(TaskRange {
            rows: vec![row()],
            offset: 100,
            matched: 160,
        }),
        Answer::Task(Box::new(TaskDetail {
            job: 7,
            task: row(),
            signal: None,
            argv: vec!["sim".into(), "{task}".into()],
            cwd: Some("/data".into()),
            stdout: Sink::File("out/{task}.txt".into()),
            stderr: Sink::Null,
            worker_host: Some("node1".into()),
            line: Some("a.dat".into()),
            nodes: Vec::new(),
        })),
        Answer::AllocLogs(vec![AllocLogView {
            alloc: 7,
            batch_id: Some("123".into()),
            state: "running".into(),
            files: vec![
                LogFile {
                    path: "/srv/kestrel/alloc/7/stdout".into(),
                    size: Some(60),
                    tail: "kestrel pilot: allocation 7, batch job 123".into(),
                },
                LogFile {
                    path: "/srv/kestrel/alloc/7/stderr".into(),
                    size: None,
                    tail: String::new(),
                },
            ],
        }]),
    ];
    for (i, answer) in answers.into_iter().enumerate() {
        golden(
            &format!("reply-{i:02}"),
            ToClient::Reply {
                id: 9,
                result: Ok(answer),
            },
        );
    }
    golden(
        "reply-refused",
        ToClient::Reply {
            id: 9,
            result: Err(refusal),
        },
    );
    golden(
        "progress",
        ToClient::Progress {
            id: 9,
            progress: progress(),
        },
    );
}

/// Version 11: a listed job says what its waiting tasks wait for (a whole job, a task); a
/// job that waits for nothing is written as before (the answers above pin those bytes).
#[test]
fn a_job_waiting_for_others_names_them() {
    let waiting = JobSummary {
        state: "queued".into(),
        waiting_for: vec![(3, None), (5, Some(7))],
        ..summary()
    };
    golden(
        "reply-v11-waiting_for",
        ToClient::Reply {
            id: 9,
            result: Ok(Answer::JobsPage(JobsPage {
                jobs: vec![waiting],
                more: 0,
            })),
        },
    );
}

/// Version 11: which own output files of a task hold output where that is not the usual (a
/// trailing field of `TaskOutput`, absent when 0, so the `update` above is as in 10), and an
/// output file a task is known to have written (`RowOutput::Written`).
#[test]
fn output_files_of_version_11() {
    golden(
        "update-v11-files",
        FromWorker::Update {
            started: vec![],
            finished: ends(),
            outputs: vec![
                TaskOutput {
                    job: 7,
                    index: 0,
                    files: STDOUT_EMPTY,
                    ..TaskOutput::default()
                },
                TaskOutput {
                    files: STDERR_WRITTEN,
                    ..output()
                },
            ],
            waited: vec![],
            cache: Default::default(),
        },
    );
    golden(
        "reply-v11-written",
        ToClient::Reply {
            id: 9,
            result: Ok(Answer::Output(OutputPage {
                sink: Sink::File("job-{job}/{task}.out".into()),
                rows: vec![OutputRow {
                    id: 1,
                    state: Some(TaskState::Finished),
                    output: RowOutput::Written("/data/job-7/1.out".into()),
                }],
                next: None,
            })),
        },
    );
}

/// Version 11: a worker that says it leaves, and the requests and answers that show and stop
/// workers (`worker list --all`, `worker info`, `worker stop`).
#[test]
fn workers_under_control() {
    golden(
        "leaving",
        FromWorker::Leaving {
            now: false,
            reason: "the worker got SIGTERM".into(),
        },
    );
    let asks = [
        ("ask-workers", Ask::Workers { departed: true }),
        ("ask-worker_info", Ask::WorkerInfo { worker: 3 }),
        (
            "ask-worker_stop",
            Ask::WorkerStop {
                workers: vec![3, 4],
                all: false,
                now: true,
            },
        ),
    ];
    for (name, body) in asks {
        golden(name, Request { id: 5, body });
    }
    let row = WorkerRow {
        id: 3,
        hostname: "node1".into(),
        address: "10.0.0.5:41000".into(),
        slots: 4,
        gpus: 1,
        prefetch: 4,
        exec: "process".into(),
        tasks: 0,
        finished: 90,
        failed: 4,
        joined_us: 1_700_000_000_000_000,
        last_seen_us: 1_700_000_001_000_000,
        quarantined: None,
        mem: 8 << 30,
        named: vec![],
        cache: None,
        alloc: Some((1, 2)),
    };
    let answers = [
        (
            "reply-worker_list",
            Answer::WorkerList(WorkerListing {
                workers: vec![],
                stopping: vec![(4, "the worker got SIGTERM".into())],
                departed: vec![DepartedWorker {
                    worker: row.clone(),
                    left_us: 1_700_000_002_000_000,
                    reason: "no message for 20 s (heartbeat timeout)".into(),
                }],
            }),
        ),
        (
            "reply-worker_detail",
            Answer::WorkerDetail(Box::new(WorkerDetail {
                worker: row,
                tasks: vec![HeldTask {
                    job: 7,
                    task: 12,
                    state: TaskState::Running,
                }],
                stopping: Some("stopped by `kestrel worker stop`".into()),
                ends_at_us: None,
                left: None,
            })),
        ),
        (
            "reply-workers_stopped",
            Answer::WorkersStopped(vec![
                StopResult {
                    worker: 3,
                    result: Ok(2),
                },
                StopResult {
                    worker: 9,
                    result: Err(Refusal::not_found("worker 9 is not connected")),
                },
            ]),
        ),
    ];
    for (name, answer) in answers {
        golden(
            name,
            ToClient::Reply {
                id: 9,
                result: Ok(answer),
            },
        );
    }
}

/// Version 13: a watch (`Watch`, its answer) and what it pushes: the task ends of a pass in
/// one frame (a success with its stdout, a failure with its stderr, a cancel) and a job gone.
#[test]
fn watches_of_version_13() {
    golden(
        "ask-watch",
        Request {
            id: 5,
            body: Ask::Watch {
                jobs: vec![7, 8],
                submitted: true,
            },
        },
    );
    golden(
        "reply-watching",
        ToClient::Reply {
            id: 5,
            result: Ok(Answer::Watching { missing: vec![8] }),
        },
    );
    golden(
        "ended",
        ToClient::Ended {
            ends: vec![
                TaskEnded {
                    job: 7,
                    id: 1,
                    state: TaskState::Finished,
                    reason: None,
                    worker: Some("node1".into()),
                    stdout: Some(Kept {
                        data: vec![0x80, 0x05, 0x4b, 0x2a, b'.'],
                        total: 5,
                    }),
                    stderr: None,
                },
                TaskEnded {
                    job: 7,
                    id: 2,
                    state: TaskState::Failed,
                    reason: Some("exit code 1".into()),
                    worker: Some("node1".into()),
                    stdout: None,
                    stderr: Some(Kept {
                        data: b"Traceback (most recent call last):\n".to_vec(),
                        total: 300,
                    }),
                },
                TaskEnded {
                    job: 7,
                    id: 3,
                    state: TaskState::Canceled,
                    reason: None,
                    worker: None,
                    stdout: None,
                    stderr: None,
                },
            ],
        },
    );
    golden(
        "gone",
        ToClient::Gone {
            job: 7,
            why: "job 7 was forgotten (`kestrel job forget`)".into(),
        },
    );
}

/// Version 14: values (where they are, where to put one, those put there and those dropped)
/// and the server's traffic in its info, which brings the fields before it along.
#[test]
fn values_of_version_14() {
    let value = "kestrel-values/r/3f9a0c77d1e2/7/0".to_string();
    golden(
        "ask-values",
        vec![
            Ask::Locate {
                files: vec![value.clone()],
            },
            Ask::Place { bytes: 209_715_200 },
            Ask::Placed {
                worker: 2,
                files: vec![("kestrel-values/a/9d1c".into(), 4096)],
            },
            Ask::DropValues {
                files: vec![value.clone()],
            },
            Ask::CancelTasks {
                job: 7,
                tasks: IdRanges::parse("3,5-9").unwrap(),
            },
        ],
    );
    golden(
        "answer-values",
        vec![
            Answer::Located(vec![FileSources {
                file: value,
                peers: vec!["http://10.0.0.7:7100/".into()],
            }]),
            Answer::Place {
                worker: 2,
                url: "http://10.0.0.8:7100/".into(),
            },
            Answer::Placed,
            Answer::ValuesDropped { held: 1 },
        ],
    );
    golden(
        "answer-info-traffic",
        Answer::Info(Box::new(ServerInfo {
            version: "0.1.0".into(),
            protocol: 14,
            address: "head:7777".into(),
            dir: "/srv/kestrel".into(),
            pid: 4242,
            started_us: 1_700_000_000_000_000,
            workers: 2,
            jobs: 3,
            live_jobs: 1,
            queued: 50,
            journal: None,
            intermediates_deleted: Some((0, 0)),
            intermediates_remade: Some(0),
            traffic: Some(Traffic {
                from_clients: 3151,
                to_clients: 2904,
                from_workers: 1877,
                to_workers: 1733,
            }),
            values_deleted: Some((4, 838_860_800)),
        })),
    );
}
