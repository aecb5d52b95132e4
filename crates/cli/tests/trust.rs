//! What a task, a job's data or a leaked access file cannot do: a task cannot change the
//! inputs the next task reads, nor put a file outside its directory into the store through a
//! symbolic link; cached files are private; what tasks print cannot drive the terminal of a
//! user who lists them; and an access file written before a rotation of the secret is refused.

mod common;

use common::*;
use kestrel_proto::Access;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every file and directory under `dir`, itself included.
fn tree(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < all.len() {
        if all[i].is_dir() {
            let entries: Vec<_> = fs::read_dir(&all[i]).unwrap().flatten().collect();
            all.extend(entries.into_iter().map(|e| e.path()));
        }
        i += 1;
    }
    all
}

/// A server with a store holding `raw/a` (private to its owner, 4 KiB of `a`) and one worker of
/// one slot whose cache is in `ROOT/cache`.
fn one_worker_with_a_store() -> (Cluster, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().to_path_buf();
    fs::create_dir_all(store.join("raw")).unwrap();
    fs::write(store.join("raw/a"), vec![b'a'; 4096]).unwrap();
    fs::set_permissions(store.join("raw/a"), fs::Permissions::from_mode(0o600)).unwrap();
    let mut c = Cluster::with_server_args(&["--store", &store.display().to_string()]);
    let cache = c.root().join("cache").display().to_string();
    c.add_worker_with(1, &["--cache-dir", &cache, "--cache-size", "1M"]);
    c.wait_workers(1);
    (c, store, dir)
}

#[test]
fn a_task_writing_to_its_input_does_not_change_what_the_next_task_reads() {
    let (c, store, _dir) = one_worker_with_a_store();
    // Writes to its input, the plain way and, should the file be read-only, after making it
    // writable (as a task running as root needs not): either way, what follows reads the
    // store's bytes.
    let overwrite = "echo X > {input:raw/a}; chmod u+w {input:raw/a}; echo X > {input:raw/a}; true";
    c.run(&[
        "submit", "--input", "raw/a", "--wait", "--", "sh", "-c", overwrite,
    ])
    .ok();
    let original = store.join("raw/a").display().to_string();
    let check = format!("cmp {{input:raw/a}} {original}");
    c.run(&[
        "submit", "--input", "raw/a", "--wait", "--", "sh", "-c", &check,
    ])
    .ok();
    assert_eq!(fs::read(store.join("raw/a")).unwrap(), vec![b'a'; 4096]);
    let log = c.worker_log();
    assert!(
        log.contains("a cached file changed since it came in"),
        "{log}"
    );
    // Cached files are private and read-only, their directories private.
    let cache = c.root().join("cache");
    let files = tree(&cache.join("files"));
    assert!(files.iter().any(|p| p.is_file()), "the input is cached");
    for p in files.iter().chain([&cache.join("partial")]) {
        let want = if p.is_dir() { 0o700 } else { 0o400 };
        assert_eq!(mode(p), want, "{}", p.display());
    }
    assert_eq!(mode(&cache), 0o700, "the cache directory the worker made");
}

#[test]
fn an_output_that_is_a_symbolic_link_fails_its_task_and_reaches_no_store() {
    let (c, store, _dir) = one_worker_with_a_store();
    let secret = c.root().join("secret.txt");
    fs::write(&secret, "private\n").unwrap();
    let link = format!("ln -s {} leak.txt", secret.display());
    let out = c.run(&[
        "submit",
        "--output-file",
        "leak.txt",
        "--wait",
        "--",
        "sh",
        "-c",
        &link,
    ]);
    out.failed();
    // A linked directory on the output's path.
    let outside = c.root().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("x"), "private\n").unwrap();
    let dir_link = format!("ln -s {} linked", outside.display());
    c.run(&[
        "submit",
        "--output-file",
        "linked/x",
        "--wait",
        "--",
        "sh",
        "-c",
        &dir_link,
    ])
    .failed();
    let reason = |job: &str| {
        let rows = task_rows(&c, job);
        assert_eq!(rows[0]["state"], "failed", "{rows:?}");
        rows[0]["reason"].as_str().unwrap_or_default().to_string()
    };
    let why = reason("1");
    assert!(
        why.contains("output leak.txt is a symbolic link") && why.contains("secret.txt"),
        "{why}"
    );
    let why = reason("2");
    assert!(
        why.contains("output linked/x is") && why.contains("outside the task's directory"),
        "{why}"
    );
    assert!(!store.join("leak.txt").exists() && !store.join("linked").exists());
    let cached = tree(&c.root().join("cache/files"));
    assert!(
        cached.iter().all(|p| p.is_dir()),
        "nothing cached: {cached:?}"
    );
    // A file written in place is still an output.
    c.run(&[
        "submit",
        "--output-file",
        "fine.txt",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo ok > fine.txt",
    ])
    .ok();
    assert_eq!(fs::read_to_string(store.join("fine.txt")).unwrap(), "ok\n");
}

#[test]
fn task_data_reaches_the_terminal_with_its_control_characters_escaped() {
    let c = Cluster::with_workers(&[1]);
    // ESC (a colour, a window title ending in BEL), a C1 CSI and a right-to-left override.
    let name = "evil\u{1b}[31m\u{9b}2J\u{202e}name";
    let script = "printf '\\033]0;pwned\\007 \\342\\200\\256bad\\n' >&2; exit 3";
    let submitted = c.run(&["submit", "--name", name, "--wait", "--", "sh", "-c", script]);
    submitted.failed();
    let raw = |text: &str| {
        text.chars()
            .any(|ch| matches!(ch, '\u{1b}' | '\u{7}' | '\u{9b}' | '\u{202e}'))
    };
    let shown_name = "evil\\x1b[31m\\x9b2J\\u{202e}name";
    let shown_tail = "\\x1b]0;pwned\\x07 \\u{202e}bad";
    let listed = c.run(&["job", "list"]);
    let listed = &listed.ok().stdout;
    assert!(listed.contains(shown_name) && !raw(listed), "{listed:?}");
    let tasks = c.run(&["task", "list", "1"]);
    let tasks = &tasks.ok().stdout;
    assert!(tasks.contains(shown_tail) && !raw(tasks), "{tasks:?}");
    let id = task_rows(&c, "1")[0]["id"].to_string();
    let info = c.run(&["task", "info", "1", &id]);
    let info = &info.ok().stdout;
    assert!(info.contains(shown_tail) && !raw(info), "{info:?}");
    let waited = c.run(&["job", "wait", "1"]);
    let said = &waited.failed().stderr;
    assert!(said.contains(shown_tail) && !raw(said), "{said:?}");
    assert!(
        submitted.stderr.contains(shown_tail) && !raw(&submitted.stderr),
        "{:?}",
        submitted.stderr
    );
    // JSON keeps every character.
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    assert_eq!(jobs["jobs"][0]["name"], name);
    let rows = task_rows(&c, "1");
    let tail = rows[0]["stderr_tail"].as_str().unwrap_or_default();
    assert!(tail.contains("\u{1b}]0;pwned\u{7} \u{202e}bad"), "{tail:?}");
}

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
    assert_eq!(log.matches("secret was rotated").count(), 1, "{log}");
    assert!(c.server_log().contains("a new secret (--new-secret)"));
}
