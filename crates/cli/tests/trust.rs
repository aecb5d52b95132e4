//! What a leaked access file cannot do once the secret is rotated: an access file written
//! before is refused, saying why, and the journal's jobs are kept.

mod common;

use common::*;
use kestrel_proto::Access;
use std::fs;
use std::time::Duration;

#[test]
fn an_access_file_from_before_a_rotation_is_refused_and_the_jobs_are_kept() {
    let mut c = Cluster::with_workers(&[1]);
    c.assert_serves();
    let before = Access::read(&c.server_dir.join("access.json")).unwrap();
    c.kill_server();
    c.start_server_with(&["--new-secret"]);
    let now = Access::read(&c.server_dir.join("access.json")).unwrap();
    assert_ne!(now.secret, before.secret, "a new secret");
    // The old secret, at the server's address now (it may have moved port).
    let stale_dir = c.root().join("stale");
    fs::create_dir_all(&stale_dir).unwrap();
    let stale = stale_dir.join("access.json");
    Access {
        secret: before.secret.clone(),
        ..now.clone()
    }
    .write(&stale)
    .unwrap();
    let stale = stale.display().to_string();
    let out = c.run(&["--access", &stale, "job", "list"]);
    let err = out.one_line_error();
    assert!(
        err.contains("the access file is stale (the server's secret was rotated with `server start --new-secret`")
            && err.matches("use the server's current access file").count() == 1,
        "{err}"
    );
    // The journal's jobs are kept, and the worker reading the server's own file carries on.
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    assert_eq!(jobs["jobs"][0]["state"], "finished", "{jobs}");
    c.wait_workers(1);
    c.assert_serves();
    // A worker given the old file is refused, and says why.
    let w = c.add_worker_with(1, &["--access", &stale]);
    let status = c.wait_worker_exit(w, Duration::from_secs(30));
    assert!(!status.success());
    let log = c.worker_log();
    assert!(log.contains("secret was rotated"), "{log}");
    assert!(c.server_log().contains("a new secret (--new-secret)"));
}
