//! Compatibility across releases: a server serves clients of the protocol versions before its
//! own (at least N−1), so an installed client or SDK keeps working after the server is upgraded.

mod common;

use common::*;
use kestrel_core::{IdRanges, JobSpec, TaskSet};
use kestrel_proto::client::Client;
use kestrel_proto::messages::{Answer, Ask};
use kestrel_proto::{Access, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION};
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn clients_of_the_previous_protocol_versions_are_served() {
    // At least N-1..N, checked where it is decided: a constant assertion here would not run.
    const _: () = assert!(OLDEST_PROTOCOL_VERSION < PROTOCOL_VERSION);
    for version in OLDEST_PROTOCOL_VERSION..PROTOCOL_VERSION {
        a_client_of_an_older_version_is_served(version);
    }
}

fn a_client_of_an_older_version_is_served(older: u32) {
    let c = Cluster::with_workers(&[2]);
    let access = Access::read(&c.server_dir.join("access.json")).expect("access file");
    let marker = c.work.join("ran-{task}");
    let spec = JobSpec::command(
        "old-client",
        vec!["touch".into(), marker.to_string_lossy().into_owned()],
    );

    let (version, job, done) = rt().block_on(async {
        let old = older..=older;
        let mut client =
            tokio::time::timeout(COMMAND_LIMIT, Client::connect_speaking(&access, old))
                .await
                .expect("connected in time")
                .expect("a client of an older version is let in");
        let submitted = client
            .call(Ask::Submit {
                spec,
                tasks: TaskSet::Array(IdRanges::span(1, 3)),
                open: false,
                key: None,
            })
            .await
            .expect("submitted");
        let Answer::Submitted { job, .. } = submitted else {
            panic!("a submission answered {submitted:?}");
        };
        let wait = client.wait(vec![job], Duration::from_millis(200), |_| {});
        let done = tokio::time::timeout(COMMAND_LIMIT, wait)
            .await
            .expect("the job ended in time")
            .expect("waited");
        (client.version(), job, done)
    });

    assert_eq!(version, older, "the server spoke the client's version");
    assert_eq!(done.counts.finished, 3, "{done:?}");
    for task in 1..=3 {
        assert!(
            c.work.join(format!("ran-{task}")).exists(),
            "task {task} ran"
        );
    }
    // And the current CLI, speaking N, sees the same job.
    let info = c
        .run(&["job", "info", &job.to_string(), "--output", "json"])
        .ok()
        .json();
    assert_eq!(info["state"], "finished", "{info}");
}
