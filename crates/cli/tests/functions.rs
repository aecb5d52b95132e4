//! Function tasks end to end, below the Python package: a job carrying a pickled function is
//! submitted through the client library, goes only to the worker started with `--python`,
//! runs in that worker's runners, and its results come back through the server's output log;
//! a raise fails its task with the exception, and a job no worker can call says why.

mod common;

use common::*;
use kestrel_core::{FunctionSpec, JobSpec, Sink, TaskKind, TaskSet, DEFAULT_INLINE_LIMIT};
use kestrel_proto::client::Client;
use kestrel_proto::messages::{Answer, Ask, RowOutput};
use kestrel_proto::Access;
use std::process::Command;
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// What `python3` writes running `code` (the pickles are made by the runner's interpreter).
fn python(code: &str) -> Vec<u8> {
    let script = format!("import base64, operator, pickle, sys\nout = sys.stdout.buffer\n{code}");
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A job calling `expr` (a function pickled by reference) once per argument tuple of `args`.
fn function_job(expr: &str, args: &[&str]) -> (JobSpec, TaskSet) {
    let mut spec = JobSpec::command(expr, Vec::new());
    spec.template.stdout = Sink::Stream {
        limit: DEFAULT_INLINE_LIMIT,
    };
    spec.template.stderr = Sink::Stream { limit: 1 << 16 };
    spec.template.kind = TaskKind::Function(Box::new(FunctionSpec {
        name: expr.into(),
        pickled: python(&format!("out.write(pickle.dumps({expr}))")),
        inline_limit: DEFAULT_INLINE_LIMIT,
        ..FunctionSpec::default()
    }));
    let lines: Vec<String> = args
        .iter()
        .map(|a| {
            let b = python(&format!(
                "out.write(base64.b64encode(pickle.dumps(({a}, {{}}))))"
            ));
            String::from_utf8(b).unwrap()
        })
        .collect();
    (
        spec,
        TaskSet::Lines(lines.iter().map(String::as_str).collect()),
    )
}

/// The values the tasks' results unpickle to, as Python prints them, in task order.
fn results(client: &mut Client, job: u32, rt: &tokio::runtime::Runtime) -> Vec<String> {
    let answer = rt
        .block_on(client.call(Ask::Output {
            job,
            stderr: false,
            tasks: None,
            from: 0,
            max_bytes: 1 << 20,
        }))
        .expect("outputs");
    let Answer::Output(page) = answer else {
        panic!("{answer:?}");
    };
    page.rows
        .iter()
        .map(|row| match &row.output {
            RowOutput::Kept(k) => {
                let code = format!(
                    "sys.stdout.write(repr(pickle.loads(bytes.fromhex({:?}))))",
                    hex::encode(&k.data)
                );
                String::from_utf8(python(&code)).unwrap()
            }
            other => format!("{other:?}"),
        })
        .collect()
}

/// Submits `job` through `client`: its id.
fn submit(
    client: &mut Client,
    rt: &tokio::runtime::Runtime,
    (spec, tasks): (JobSpec, TaskSet),
) -> u32 {
    let answer = rt
        .block_on(client.call(Ask::Submit {
            spec,
            tasks,
            open: false,
            key: None,
        }))
        .expect("submitted");
    let Answer::Submitted { job, .. } = answer else {
        panic!("{answer:?}");
    };
    job
}

#[test]
fn function_tasks_run_in_the_python_workers_runners_and_their_results_come_back() {
    let mut c = Cluster::with_workers(&[2]);
    c.add_worker_with(2, &["--python", "python3"]);
    c.wait_workers(2);
    let access = Access::read(&c.server_dir.join("access.json")).expect("access file");
    let rt = rt();
    let mut client = rt
        .block_on(Client::connect(&access))
        .expect("a client connects");
    let adds = submit(
        &mut client,
        &rt,
        function_job("operator.add", &["(1, 2)", "('a', 'b')", "([1], [2, 3])"]),
    );
    let divs = submit(
        &mut client,
        &rt,
        function_job("operator.truediv", &["(1, 0)"]),
    );
    let wait = client.wait(vec![adds, divs], Duration::from_millis(200), |_| {});
    rt.block_on(async { tokio::time::timeout(COMMAND_LIMIT, wait).await })
        .expect("the jobs ended in time")
        .expect("waited");
    assert_eq!(
        results(&mut client, adds, &rt),
        ["3", "'ab'", "[1, 2, 3]"],
        "each call's value, in task order"
    );
    // The raise fails its task, saying what it raised; no retry makes it pass.
    let failed = c.run(&["task", "list", &divs.to_string(), "--output", "json"]);
    let failed = failed.ok().json();
    let task = &failed["tasks"][0];
    assert_eq!(task["state"], "failed", "{failed:#}");
    let reason = task["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("raised ZeroDivisionError: division by zero"),
        "{failed:#}"
    );
    // Only the worker with Python took them.
    let listed = c.run(&["task", "list", &adds.to_string(), "--output", "json"]);
    let workers: Vec<_> = listed.ok().json()["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["worker"].clone())
        .collect();
    assert!(workers.iter().all(|w| *w == workers[0]), "{workers:?}");
    assert_eq!(workers[0], 2, "the second worker, started with --python");
}

#[test]
fn a_function_job_without_a_python_worker_says_how_to_start_one() {
    let c = Cluster::with_workers(&[1]);
    let access = Access::read(&c.server_dir.join("access.json")).expect("access file");
    let rt = rt();
    let mut client = rt
        .block_on(Client::connect(&access))
        .expect("a client connects");
    let job = submit(&mut client, &rt, function_job("operator.add", &["(1, 2)"]));
    let info = c.run(&["job", "info", &job.to_string()]);
    info.ok();
    assert!(
        info.stdout.contains("kestrel worker start --python"),
        "{info:#?}"
    );
}

#[test]
fn a_worker_given_a_python_that_does_not_run_refuses_to_start() {
    let c = Cluster::new();
    let out = c.run(&["worker", "start", "--python", "/nonexistent/python9"]);
    out.failed();
    assert!(
        out.stderr.contains("/nonexistent/python9") && out.stderr.contains("--python"),
        "{out:#?}"
    );
}
