//! What scripts and workflow managers rely on: `job state` for many jobs at once, exit statuses
//! that tell a failed task from an unknown id from an unreachable server, `--reconnect-for` on
//! every command so a poll during a server restart waits, and shell completion scripts.

mod common;

use common::*;
use serde_json::json;
use std::fs::File;
use std::time::Duration;

#[test]
fn job_state_prints_one_line_per_job_and_3_for_an_unknown_one() {
    let mut c = Cluster::new();
    c.run(&["submit", "--", "true"]).ok();
    c.run(&["submit", "--", "false"]).ok();
    c.run(&["submit", "--", "sleep", "30"]).ok();
    let out = c.run(&["job", "state", "1", "2", "3"]);
    assert_eq!(out.ok().stdout, "1 queued\n2 queued\n3 queued\n");
    assert!(out.stderr.is_empty(), "{out:#?}");

    c.add_worker(1);
    assert_eq!(c.run(&["job", "wait", "1", "2", "--quiet"]).code(), Some(1));
    poll_every(
        "job 3 to run",
        COMMAND_LIMIT,
        Duration::from_millis(50),
        || (c.run(&["job", "state", "3"]).ok().stdout == "3 running\n").then_some(()),
    );
    let out = c.run(&["job", "state", "3", "1", "99", "2"]);
    assert_eq!(out.code(), Some(3), "an unknown id: {out:#?}");
    assert_eq!(out.stdout, "3 running\n1 finished\n99 unknown\n2 failed\n");
    assert!(out.stderr.is_empty(), "{out:#?}");

    let out = c.run(&["job", "state", "1", "42", "--output", "json"]);
    assert_eq!(out.code(), Some(3), "{out:#?}");
    assert_eq!(
        out.json(),
        json!({"jobs": [{"id": 1, "state": "finished"}, {"id": 42, "state": "unknown"}]})
    );
    c.run(&["job", "cancel", "3"]).ok();
    assert_eq!(c.run(&["job", "state", "3"]).ok().stdout, "3 canceled\n");
}

#[test]
fn exit_statuses_tell_failure_error_not_found_and_unreachable_apart() {
    let c = Cluster::with_workers(&[1]);
    // 1: the job ended with a failed task.
    let failed = c.run(&["submit", "--wait", "--", "false"]);
    assert_eq!(failed.code(), Some(1), "{failed:#?}");
    assert_eq!(c.run(&["job", "wait", "1"]).code(), Some(1));
    c.run(&["submit", "--", "sleep", "30"]).ok();

    // 3: ids the server does not have, each said once with what to do.
    for args in [
        &["job", "info", "99"][..],
        &["job", "wait", "99"],
        &["job", "cancel", "99"],
        &["job", "retry", "99"],
        &["job", "forget", "99"],
        &["task", "list", "99"],
        &["task", "info", "99", "0"],
        &["task", "info", "1", "7"],
        &["worker", "resume", "42"],
    ] {
        let out = c.run(args);
        let err = out.one_line_error().to_string();
        assert_eq!(out.code(), Some(3), "{args:?}: {out:#?}");
        let id = if args[0] == "worker" { "42" } else { "99" };
        let named = if args == ["task", "info", "1", "7"] {
            "job 1 has no task 7"
        } else {
            id
        };
        assert!(err.contains(named), "{args:?}: {err}");
        assert!(err.contains("`kestrel "), "says what to do: {err}");
    }
    assert_eq!(
        c.run(&["job", "cancel", "99"]).stderr,
        "error: job 99 does not exist; `kestrel job list` shows the jobs\n"
    );
    // Some ids known, some not: the known ones are acted on, the status is still 3.
    let out = c.run(&["job", "cancel", "2", "99"]);
    assert_eq!(out.code(), Some(3), "{out:#?}");
    assert!(out.stdout.contains("job 2: canceled"), "{out:#?}");

    // 2: a request the server refuses, and bad arguments.
    let out = c.run(&["job", "list", "--name", "[unclosed"]);
    assert!(out.one_line_error().contains("--name"), "{out:#?}");
    assert_eq!(out.code(), Some(2));
    assert_eq!(c.run(&["job", "frobnicate"]).code(), Some(2));

    // 4: no access file, or nobody listening at the address it names.
    let empty = c.root().join("no-server-here");
    let out = c.run_with_dir(&empty, &["job", "state", "1"]);
    assert!(out.one_line_error().contains("no access file"), "{out:#?}");
    assert_eq!(out.code(), Some(4));
    let mut c = c;
    c.kill_server();
    for args in [
        &["job", "state", "1"][..],
        &["job", "wait", "1"],
        &["server", "info"],
    ] {
        let out = c.run(args);
        assert!(
            out.one_line_error().contains("cannot reach the server"),
            "{args:?}: {out:#?}"
        );
        assert_eq!(out.code(), Some(4), "{args:?}: {out:#?}");
    }

    // And they are documented where a script writer looks.
    let help = run_bounded(
        {
            let mut k = kestrel();
            k.arg("--help");
            k
        },
        COMMAND_LIMIT,
    );
    for line in [
        "1  a task of the job(s) failed",
        "3  not found",
        "4  server unreachable",
    ] {
        assert!(help.ok().stdout.contains(line), "{line} in {help:#?}");
    }
}

/// A client command running in the background with its output in files; killed if the test
/// fails before it ends.
struct Background {
    child: std::process::Child,
    stdout: std::path::PathBuf,
    stderr: std::path::PathBuf,
}

impl Background {
    fn start(c: &Cluster, name: &str, args: &[&str], env: &[(&str, &str)]) -> Background {
        let stdout = c.root().join(format!("{name}.out"));
        let stderr = c.root().join(format!("{name}.err"));
        let mut k = kestrel();
        k.arg("--server-dir")
            .arg(&c.server_dir)
            .args(args)
            .envs(env.iter().copied())
            .current_dir(&c.work)
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap());
        Background {
            child: k.spawn().expect("start a client"),
            stdout,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits (bounded) for it to exit; its status and stdout.
    fn finish(mut self) -> (Option<i32>, String) {
        let status = poll("a background client to exit", COMMAND_LIMIT, || {
            self.child.try_wait().unwrap()
        });
        (
            status.code(),
            std::fs::read_to_string(&self.stdout).unwrap_or_default(),
        )
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_poll_during_a_server_restart_waits_with_reconnect_for() {
    let mut c = Cluster::with_workers(&[1]);
    c.run(&["submit", "--wait", "--", "true"]).ok();
    c.kill_server();
    // Asked while the server is down: it says it keeps trying, then answers once it is back.
    let by_option = Background::start(
        &c,
        "state",
        &["job", "state", "1", "--reconnect-for", "60s"],
        &[],
    );
    let by_env = Background::start(
        &c,
        "list",
        &["job", "list", "--output", "json"],
        &[("KESTREL_RECONNECT_FOR", "60s")],
    );
    for b in [&by_option, &by_env] {
        poll_every(
            "the client to say it keeps trying",
            COMMAND_LIMIT,
            Duration::from_millis(20),
            || {
                b.stderr()
                    .contains("trying again for up to 1m")
                    .then_some(())
            },
        );
    }
    c.start_server();
    let (code, stdout) = by_option.finish();
    assert_eq!((code, stdout.as_str()), (Some(0), "1 finished\n"));
    let (code, stdout) = by_env.finish();
    assert_eq!(code, Some(0), "{stdout}");
    let list: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(list["jobs"][0]["state"], "finished");

    // With a time limit that passes, status 4 and a message that says what to do.
    c.kill_server();
    let out = c.run(&["job", "state", "1", "--reconnect-for", "300ms"]);
    assert_eq!(out.code(), Some(4), "{out:#?}");
    assert!(out.stderr.contains("trying again"), "{out:#?}");
    assert!(
        out.stderr.trim_end().lines().last().is_some_and(|l| l
            .starts_with("error: could not reach the server within 300ms")
            && l.contains("kestrel server start")),
        "{out:#?}"
    );
    let out = c.run(&["job", "state", "1", "--reconnect-for", "soon"]);
    assert!(out.one_line_error().contains("--reconnect-for"), "{out:#?}");
}

#[test]
fn completion_scripts_for_bash_zsh_and_fish() {
    let gen = |shell: &str| {
        let mut k = kestrel();
        k.args(["completions", shell]);
        run_bounded(k, COMMAND_LIMIT)
    };
    let bash = gen("bash");
    assert!(
        bash.ok().stdout.contains("complete -F _kestrel"),
        "{bash:#?}"
    );
    assert!(bash.stdout.contains("forget"), "subcommands are in it");
    let zsh = gen("zsh");
    assert!(zsh.ok().stdout.starts_with("#compdef kestrel"), "{zsh:#?}");
    let fish = gen("fish");
    assert!(
        fish.ok().stdout.contains("complete -c kestrel"),
        "{fish:#?}"
    );
    assert!(fish.stdout.contains("reconnect-for"));
    assert_eq!(
        gen("tcsh").code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

/// A reader that goes away (`| head`, `| true`) is no crash: found in a user's trial, where
/// `kestrel job list | true` panicked with exit status 101.
#[test]
fn output_into_a_closed_pipe_is_no_crash() {
    let dir = tempfile::tempdir().unwrap();
    for cmd in [
        format!("'{BIN}' completions bash | true"),
        format!("'{BIN}' run --array 1-3 -- true | true"),
        format!("'{BIN}' --help | true"),
    ] {
        let mut c = std::process::Command::new("sh");
        c.args(["-c", &cmd])
            .current_dir(dir.path())
            .env_remove("KESTREL_SERVER_DIR");
        let out = run_bounded(c, COMMAND_LIMIT);
        assert!(
            !out.stderr.contains("panicked") && out.code() == Some(0),
            "{cmd}: {out:#?}"
        );
    }
}
