//! Lists that scale: `job list` filtered by the server, `job forget` for ended jobs (kept
//! forgotten across a restart), `task list` in pages, and `task info` for one task in full.

mod common;

use common::*;
use serde_json::{json, Value};
use std::fs;

fn ids(list: &Value, key: &str) -> Vec<u64> {
    list[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} array in {list:#}"))
        .iter()
        .map(|j| j["id"].as_u64().expect("an id"))
        .collect()
}

#[test]
fn job_list_filters_by_state_and_name_and_keeps_the_newest() {
    let c = Cluster::with_workers(&[2]);
    for (name, command) in [
        ("sweep-a", "true"),
        ("sweep-b", "false"),
        ("post", "true"),
        ("sweep-c", "true"),
    ] {
        c.run(&["submit", "--name", name, "--wait", "--", command]);
    }
    c.run(&["submit", "--name", "long", "--", "sleep", "30"])
        .ok();
    c.run(&["job", "cancel", "5"]).ok();
    let list = |args: &[&str]| {
        let mut all = vec!["job", "list", "--output", "json"];
        all.extend_from_slice(args);
        c.run(&all).ok().json()
    };
    assert_eq!(ids(&list(&[]), "jobs"), [1, 2, 3, 4, 5]);
    assert_eq!(ids(&list(&["--state", "failed"]), "jobs"), [2]);
    assert_eq!(ids(&list(&["--state", "failed,canceled"]), "jobs"), [2, 5]);
    assert_eq!(ids(&list(&["--name", "sweep-*"]), "jobs"), [1, 2, 4]);
    assert_eq!(
        ids(&list(&["--name", "sweep-?", "--state", "finished"]), "jobs"),
        [1, 4]
    );
    let newest = list(&["--last", "2"]);
    assert_eq!(ids(&newest, "jobs"), [4, 5], "the newest two, oldest first");
    assert_eq!(newest["more"], 3);
    assert_eq!(list(&["--last", "0"])["more"], 0);

    // Notes go to stderr: stdout holds the table alone.
    let table = c.run(&["job", "list", "--last", "2"]);
    assert!(
        table.ok().stderr.contains("... and 3 older jobs"),
        "{table:#?}"
    );
    assert!(!table.stdout.contains("older"), "{table:#?}");
    let none = c.run(&["job", "list", "--name", "nothing-*"]);
    assert!(none.ok().stderr.contains("no jobs match"), "{none:#?}");
    assert_eq!(none.stdout, "", "{none:#?}");
}

/// More jobs than a server answers at once (`MAX_JOB_PAGE`): `--last 0` still lists every
/// one, once each and oldest first, and `--last N` past a page has its N.
#[test]
fn job_list_last_0_lists_every_job_past_a_page() {
    use kestrel_proto::messages::{Ask, Request, ToClient, MAX_JOB_PAGE};
    let c = Cluster::new();
    let total = u64::from(MAX_JOB_PAGE) * 2 + 3;
    // Submitted over one connection, all asked before any answer is read: quicker than a
    // process per job.
    let access = kestrel_proto::Access::read(&c.server_dir.join("access.json")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut reader, mut writer, _) = kestrel_proto::client::connect_as(
            &access,
            kestrel_proto::Role::Client,
            kestrel_proto::SPOKEN_VERSIONS,
        )
        .await
        .expect("connected");
        for id in 1..=total {
            let body = Ask::Submit {
                spec: kestrel_core::JobSpec::command("one", vec!["true".into()]),
                tasks: kestrel_core::TaskSet::Array(kestrel_core::IdRanges::span(1, 1)),
                open: false,
                key: None,
            };
            let frame = kestrel_proto::encode(&Request { id, body }).unwrap();
            writer.feed(frame).await.unwrap();
        }
        writer.flush().await.unwrap();
        for _ in 0..total {
            let reply = tokio::time::timeout(COMMAND_LIMIT, reader.recv::<ToClient>()).await;
            assert!(
                matches!(&reply, Ok(Ok(ToClient::Reply { result: Ok(_), .. }))),
                "{reply:?}"
            );
        }
    });
    let list = |args: &[&str]| {
        let mut all = vec!["job", "list", "--output", "json"];
        all.extend_from_slice(args);
        c.run(&all).ok().json()
    };
    let every = list(&["--last", "0"]);
    assert_eq!(ids(&every, "jobs"), (1..=total).collect::<Vec<_>>());
    assert_eq!(every["more"], 0);
    let some = list(&["--last", &(MAX_JOB_PAGE + 1).to_string()]);
    assert_eq!(
        ids(&some, "jobs"),
        (MAX_JOB_PAGE as u64 + 3..=total).collect::<Vec<_>>()
    );
    assert_eq!(some["more"], total - u64::from(MAX_JOB_PAGE) - 1);
    // The table pages the same way.
    let table = c.run(&["job", "list", "--last", "0"]);
    assert_eq!(
        table
            .ok()
            .stdout
            .lines()
            .filter(|l| l.contains("one"))
            .count() as u64,
        total
    );
}

#[test]
fn forgotten_jobs_stay_forgotten_after_a_restart() {
    let mut c = Cluster::with_workers(&[1]);
    c.run(&["submit", "--wait", "--", "true"]).ok();
    c.run(&["submit", "--wait", "--", "false"]);
    c.run(&["submit", "--", "sleep", "30"]).ok();

    // A job with work left is refused, with what to do, and kept.
    let out = c.run(&["job", "forget", "3"]);
    let err = out.one_line_error();
    assert!(err.contains("has not ended"), "{err}");
    assert!(err.contains("kestrel job cancel 3"), "{err}");
    assert_eq!(out.code(), Some(2));

    let out = c.run(&["job", "forget", "1"]);
    assert_eq!(out.ok().stdout, "forgot job 1\n");
    let out = c.run(&["job", "forget", "--all-finished", "--output", "json"]);
    assert_eq!(out.ok().json(), json!({"jobs": [{"id": 2, "error": null}]}));
    assert_eq!(
        c.run(&["job", "forget", "--all-finished"]).ok().stdout,
        "no ended jobs to forget\n"
    );
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    assert_eq!(ids(&jobs, "jobs"), [3]);

    // The journal remembers: a restarted server does not bring them back, and ids go on.
    c.kill_server();
    c.start_server();
    let jobs = c.run(&["job", "list", "--output", "json"]).ok().json();
    assert_eq!(ids(&jobs, "jobs"), [3]);
    let out = c.run(&["job", "state", "1", "2", "3"]);
    assert_eq!(out.code(), Some(3));
    assert!(
        out.stdout.starts_with("1 unknown\n2 unknown\n3 "),
        "{out:#?}"
    );
    assert!(!out.stdout.contains("3 unknown"), "{out:#?}");
    let out = c.run(&["job", "forget", "1"]);
    assert_eq!(out.code(), Some(3), "{out:#?}");
    let out = c.run(&["submit", "--output", "json", "--", "true"]);
    assert_eq!(
        out.ok().json()["jobs"],
        json!([4]),
        "ids are not given out again"
    );
}

#[test]
fn task_list_pages_say_how_to_get_the_next() {
    let c = Cluster::with_workers(&[2]);
    c.run(&[
        "submit",
        "--array",
        "1-25",
        "--stdout",
        "none",
        "--stderr",
        "none",
        "--wait",
        "--",
        "sh",
        "-c",
        "test $(({task} % 5)) -ne 0",
    ]);
    let page = |args: &[&str]| {
        let mut all = vec!["task", "list", "1", "--output", "json"];
        all.extend_from_slice(args);
        c.run(&all).ok().json()
    };
    let first = page(&["--limit", "10"]);
    assert_eq!(ids(&first, "tasks"), (1..=10).collect::<Vec<_>>());
    assert_eq!(
        (&first["offset"], &first["matched"], &first["next_offset"]),
        (&json!(0), &json!(25), &json!(10))
    );
    let last = page(&["--offset", "20", "--limit", "10"]);
    assert_eq!(ids(&last, "tasks"), [21, 22, 23, 24, 25]);
    assert_eq!(last["next_offset"], Value::Null);
    // `--state`, as everywhere else; `--status` is its alias.
    let failed = page(&["--state", "failed", "--offset", "2", "--limit", "2"]);
    let alias = page(&["--status", "failed", "--offset", "2", "--limit", "2"]);
    assert_eq!(alias, failed);
    assert_eq!(ids(&failed, "tasks"), [15, 20]);
    assert_eq!(
        (&failed["matched"], &failed["next_offset"]),
        (&json!(5), &json!(4))
    );
    assert!(failed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["state"] == "failed" && t["exit_code"] == 1 && t["job"] == 1));

    // The next page's command is a note on stderr, and it works as printed.
    let table = c.run(&["task", "list", "1", "--state", "failed", "--limit", "2"]);
    let hint = "tasks 1-2 of 5; next page: kestrel task list 1 --state failed --offset 2 --limit 2";
    assert!(table.ok().stderr.contains(hint), "{table:#?}");
    assert!(!table.stdout.contains("next page"), "{table:#?}");
    let next: Vec<&str> = hint.split("kestrel ").nth(1).unwrap().split(' ').collect();
    let next = c.run(&next);
    let rows: Vec<&str> = next.ok().stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{next:#?}");
    assert!(rows[0].trim_start().starts_with("15 "), "{next:#?}");
    let beyond = c.run(&["task", "list", "1", "--offset", "30"]);
    assert!(beyond.ok().stderr.contains("--offset 0"), "{beyond:#?}");
    assert_eq!(beyond.stdout, "", "{beyond:#?}");
}

#[test]
fn task_info_shows_one_task_in_full() {
    let c = Cluster::with_workers(&[1]);
    fs::create_dir_all(c.work.join("run")).unwrap();
    let out = c.run(&[
        "submit",
        "--array",
        "3",
        "--cwd",
        "run",
        "--stdout",
        "out/{task}.txt",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo to stdout {task}; echo 'no such input' >&2; exit 3",
    ]);
    assert_eq!(out.code(), Some(1), "{out:#?}");
    let run = fs::canonicalize(c.work.join("run"))
        .unwrap()
        .display()
        .to_string();
    let info = c
        .run(&["task", "info", "1", "3", "--output", "json"])
        .ok()
        .json();
    assert_eq!(info["job"], 1);
    assert_eq!(info["id"], 3);
    assert_eq!(info["state"], "failed");
    assert_eq!(info["worker"], 1);
    assert_eq!(info["attempts"], 1);
    assert_eq!(info["exit_code"], 3);
    assert_eq!(info["signal"], Value::Null);
    assert!(
        info["reason"].as_str().unwrap().contains("exit code 3"),
        "{info}"
    );
    assert!(
        info["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("no such input"),
        "{info}"
    );
    assert!(info["worker_hostname"].is_string(), "{info}");
    for k in ["assigned_us", "started_us", "finished_us", "run_us"] {
        assert!(info[k].is_u64(), "{k} in {info}");
    }
    assert_eq!(
        info["command"],
        json!([
            "sh",
            "-c",
            "echo to stdout 3; echo 'no such input' >&2; exit 3"
        ])
    );
    assert_eq!(info["directory"], run.as_str());
    assert_eq!(info["stdout"], format!("{run}/out/3.txt"));
    assert_eq!(info["stderr"], format!("{run}/job-1/3.err"));
    assert_eq!(
        fs::read_to_string(info["stdout"].as_str().unwrap()).unwrap(),
        "to stdout 3\n",
        "the path is where the output is"
    );

    let table = c.run(&["task", "info", "1", "3"]).ok().stdout.clone();
    for part in [
        "3 of job 1",
        "failed",
        "exit code 3",
        "out/3.txt",
        "no such input",
    ] {
        assert!(table.contains(part), "{part} in\n{table}");
    }
    // Its lines carry nothing past their text (copied or grepped, blanks would tag along).
    assert!(table.starts_with(" task "), "{table}");
    assert!(table.lines().all(|l| l == l.trim_end()), "{table:?}");
    let out = c.run(&["task", "info", "1", "4"]);
    assert!(
        out.one_line_error().contains("job 1 has no task 4"),
        "{out:#?}"
    );
    assert_eq!(out.code(), Some(3));
}

#[test]
fn a_huge_task_list_limit_gets_a_bounded_page_and_every_task_in_pages() {
    // 25,000 queued tasks (no worker): more than one page of the server's.
    let c = Cluster::new();
    c.run(&["submit", "--array", "1-25000", "--", "true"]).ok();
    let page = |args: &[&str]| {
        let mut all = vec!["task", "list", "1", "--output", "json"];
        all.extend_from_slice(args);
        c.run(&all).ok().json()
    };
    let first = page(&["--limit", "4294967295"]);
    assert_eq!(ids(&first, "tasks"), (1..=10_000).collect::<Vec<_>>());
    assert_eq!(
        (&first["matched"], &first["next_offset"]),
        (&json!(25_000), &json!(10_000))
    );
    // Every task, page after page as `next_offset` says (three pages: a bounded walk).
    let mut seen = Vec::new();
    let mut offset = Some(0u64);
    for _ in 0..10 {
        let Some(at) = offset else { break };
        let p = page(&["--offset", &at.to_string(), "--limit", "4294967295"]);
        seen.extend(ids(&p, "tasks"));
        offset = p["next_offset"].as_u64();
    }
    assert_eq!(seen, (1..=25_000).collect::<Vec<_>>());
    // The table says the server's page size and how to get the next page.
    let table = c.run(&["task", "list", "1", "--limit", "4294967295"]);
    let hint = "tasks 1-10000 of 25000 (the server sends at most 10000 tasks a page); next page: kestrel task list 1 --offset 10000 --limit 10000";
    assert!(table.ok().stderr.contains(hint), "{}", table.stderr);
}
