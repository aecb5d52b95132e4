//! docs/json.md's examples are what the commands print. Its console blocks are run again, in
//! order, on a fresh server with one 2-slot worker, and each command's JSON must have exactly
//! the keys (recursively) and the types the doc shows, its exit status and its stderr lines
//! too; values (times, ids, addresses) may differ. Every key printed must also be described
//! in the doc's prose, and follow its conventions (times in microseconds, in `_us` keys).
//!
//! After a change to what a command prints, `KESTREL_BLESS=1 cargo test -p kestrel-cli --test
//! json_doc` rewrites the blocks that no longer match from the real output (the others are
//! left as they are), for review with `git diff docs/json.md`.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeSet;

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/json.md");
const BLESS: &str = "KESTREL_BLESS";

/// One command of a console block, as the doc shows it (or as it ran).
#[derive(Clone, Debug, PartialEq)]
struct Step {
    /// The command line, `kestrel ...`.
    line: String,
    stdout: String,
    stderr: Vec<String>,
    status: i32,
}

/// A console block: where it is in the doc (the lines between its fences) and its commands.
struct Block {
    first: usize,
    end: usize,
    steps: Vec<Step>,
}

fn parse(doc: &str) -> Vec<Block> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i] != "```console" {
            i += 1;
            continue;
        }
        let first = i + 1;
        let end = first
            + lines[first..]
                .iter()
                .position(|l| *l == "```")
                .expect("a console block is closed by ```");
        let mut steps: Vec<Step> = Vec::new();
        for line in &lines[first..end] {
            if let Some(command) = line.strip_prefix("$ ") {
                steps.push(Step {
                    line: command.to_string(),
                    stdout: String::new(),
                    stderr: Vec::new(),
                    status: 0,
                });
                continue;
            }
            let step = steps
                .last_mut()
                .unwrap_or_else(|| panic!("json.md:{}: output before any `$ ` command", first));
            if let Some(err) = line.strip_prefix("(stderr) ") {
                step.stderr.push(err.to_string());
            } else if let Some(code) = line
                .strip_prefix("(exit status ")
                .and_then(|l| l.strip_suffix(')'))
            {
                step.status = code.parse().expect("(exit status N)");
            } else {
                step.stdout.push_str(line);
                step.stdout.push('\n');
            }
        }
        blocks.push(Block { first, end, steps });
        i = end + 1;
    }
    blocks
}

/// The block's lines for these steps.
fn render(steps: &[Step]) -> Vec<String> {
    let mut out = Vec::new();
    for s in steps {
        out.push(format!("$ {}", s.line));
        out.extend(s.stdout.lines().map(str::to_string));
        out.extend(s.stderr.iter().map(|l| format!("(stderr) {l}")));
        out.push(format!("(exit status {})", s.status));
    }
    out
}

/// Runs a doc's command line in the cluster's work directory, its server found through
/// `KESTREL_SERVER_DIR` as a user's would be; paths are written as the doc writes them.
fn run_step(c: &mut Cluster, line: &str) -> Step {
    let words = shlex::split(line).unwrap_or_else(|| panic!("cannot split {line:?}"));
    assert_eq!(words[0], "kestrel", "json.md runs only kestrel: {line}");
    let mut cmd = kestrel();
    cmd.args(&words[1..])
        .env("KESTREL_SERVER_DIR", &c.server_dir)
        .current_dir(&c.work);
    let out = run_bounded(cmd, COMMAND_LIMIT);
    if words[1..].starts_with(&["server".into(), "stop".into()]) && out.code() == Some(0) {
        // What comes next must find it gone.
        c.wait_server_exit(COMMAND_LIMIT);
    }
    let (server, work) = (c.server_dir.display().to_string(), c.path(""));
    let work = work.trim_end_matches('/');
    let doc_paths = |s: &str| s.replace(&server, "<server>").replace(work, "<work>");
    Step {
        line: line.to_string(),
        stdout: doc_paths(&out.stdout),
        stderr: doc_paths(&out.stderr).lines().map(str::to_string).collect(),
        status: out.code().expect("exited, not killed"),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a fraction",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Where `real` has other keys or types than `doc`, at `at`.
fn shape_differences(at: &str, doc: &Value, real: &Value, out: &mut Vec<String>) {
    match (doc, real) {
        (Value::Object(d), Value::Object(r)) => {
            for k in d.keys().filter(|k| !r.contains_key(*k)) {
                out.push(format!("{at}.{k} is in the doc, not in the output"));
            }
            for k in r.keys().filter(|k| !d.contains_key(*k)) {
                out.push(format!("{at}.{k} is in the output, not in the doc"));
            }
            for (k, dv) in d {
                if let Some(rv) = r.get(k) {
                    shape_differences(&format!("{at}.{k}"), dv, rv, out);
                }
            }
        }
        (Value::Array(d), Value::Array(r)) => {
            if d.len() != r.len() {
                out.push(format!(
                    "{at} has {} items in the doc, {} in the output",
                    d.len(),
                    r.len()
                ));
            }
            for (i, (dv, rv)) in d.iter().zip(r).enumerate() {
                shape_differences(&format!("{at}[{i}]"), dv, rv, out);
            }
        }
        _ if kind(doc) != kind(real) => out.push(format!(
            "{at} is {} in the doc, {} in the output ({real})",
            kind(doc),
            kind(real)
        )),
        _ => {}
    }
}

/// How the step as it ran differs from the doc's.
fn differences(doc: &Step, real: &Step) -> Vec<String> {
    let mut out = Vec::new();
    if doc.status != real.status {
        out.push(format!(
            "exit status {} in the doc, {} when run",
            doc.status, real.status
        ));
    }
    if doc.stderr != real.stderr {
        out.push(format!(
            "stderr {:?} in the doc, {:?} when run",
            doc.stderr, real.stderr
        ));
    }
    match (doc.stdout.trim().is_empty(), real.stdout.trim().is_empty()) {
        (true, true) => {}
        (true, false) | (false, true) => out.push(format!(
            "stdout {:?} in the doc, {:?} when run",
            doc.stdout, real.stdout
        )),
        (false, false) => {
            let doc_json: Value = serde_json::from_str(&doc.stdout)
                .unwrap_or_else(|e| panic!("json.md: `{}` shows no JSON: {e}", doc.line));
            match serde_json::from_str::<Value>(&real.stdout) {
                Ok(real_json) => shape_differences("", &doc_json, &real_json, &mut out),
                Err(e) => out.push(format!("printed no JSON ({e}): {:?}", real.stdout)),
            }
        }
    }
    out
}

/// Every key of a document, recursively.
fn keys(v: &Value, into: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                into.insert(k.clone());
                keys(v, into);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| keys(v, into)),
        _ => {}
    }
}

/// Breaches of json.md's conventions on times by a printed document.
fn time_units(at: &str, v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let here = format!("{at}.{k}");
                if ["_ms", "_s", "_secs", "_seconds", "_millis", "_ns"]
                    .iter()
                    .any(|unit| k.ends_with(unit))
                    && k != "tasks_per_s"
                {
                    out.push(format!(
                        "{here}: times and durations are microseconds, in keys that end in `_us`"
                    ));
                }
                if k.ends_with("_us") && !(v.is_u64() || v.is_null()) {
                    out.push(format!("{here} = {v}: not whole microseconds"));
                }
                time_units(&here, v, out);
            }
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .for_each(|(i, v)| time_units(&format!("{at}[{i}]"), v, out)),
        _ => {}
    }
}

/// The doc without its console blocks: where keys are described.
fn prose(doc: &str, blocks: &[Block]) -> String {
    let lines: Vec<&str> = doc.lines().collect();
    let mut text = String::new();
    let mut from = 0;
    for b in blocks {
        text += &lines[from..b.first].join("\n");
        from = b.end;
    }
    text + &lines[from..].join("\n")
}

#[test]
fn the_examples_in_json_md_are_what_the_commands_print() {
    let doc = std::fs::read_to_string(DOC).expect("docs/json.md");
    let blocks = parse(&doc);
    assert!(blocks.len() >= 20, "json.md has its examples");
    let mut c = Cluster::with_workers(&[2]);
    let mut problems = Vec::new();
    let mut printed = BTreeSet::new();
    let mut rewritten = Vec::new();
    for b in &blocks {
        let ran: Vec<Step> = b.steps.iter().map(|s| run_step(&mut c, &s.line)).collect();
        let mut wrong = false;
        for (doc_step, real) in b.steps.iter().zip(&ran) {
            let mut found = differences(doc_step, real);
            if let Ok(v) = serde_json::from_str::<Value>(&real.stdout) {
                keys(&v, &mut printed);
                time_units("", &v, &mut found);
            }
            wrong |= !found.is_empty();
            problems.extend(
                found
                    .into_iter()
                    .map(|d| format!("`{}`: {d}", doc_step.line)),
            );
        }
        if wrong {
            rewritten.push((b.first, b.end, render(&ran)));
        }
    }
    let text = prose(&doc, &blocks);
    for key in &printed {
        if !text.contains(&format!("`{key}`")) {
            problems.push(format!(
                "key `{key}` is printed but not described in json.md's prose"
            ));
        }
    }
    if std::env::var_os(BLESS).is_some() && !rewritten.is_empty() {
        let mut lines: Vec<String> = doc.lines().map(str::to_string).collect();
        for (first, end, new) in rewritten.into_iter().rev() {
            lines.splice(first..end, new);
        }
        std::fs::write(DOC, lines.join("\n") + "\n").expect("write docs/json.md");
        eprintln!("rewrote the examples of docs/json.md that differed; review `git diff`");
        // What blessing cannot do: describe a key, or follow the conventions.
        problems.retain(|p| p.contains("not described") || p.contains("microseconds"));
    }
    assert!(
        problems.is_empty(),
        "docs/json.md does not match what the commands print:\n  {}\n\
         If the output is right, `{BLESS}=1 cargo test -p kestrel-cli --test json_doc` rewrites \
         the examples from it (then review `git diff docs/json.md`); describe new keys in the \
         prose.",
        problems.join("\n  ")
    );
}

#[test]
fn a_changed_key_or_type_is_found_and_a_changed_value_is_not() {
    let doc: Value = serde_json::json!({"id": 1, "at_us": null, "jobs": [{"state": "queued"}]});
    let same: Value = serde_json::json!({"id": 7, "at_us": null, "jobs": [{"state": "failed"}]});
    let mut out = Vec::new();
    shape_differences("", &doc, &same, &mut out);
    assert!(out.is_empty(), "{out:?}");
    let other: Value = serde_json::json!({"id": "7", "at_us": 5, "jobs": [{"status": "x"}]});
    shape_differences("", &doc, &other, &mut out);
    assert_eq!(
        out,
        [
            ".at_us is null in the doc, an integer in the output (5)",
            ".id is an integer in the doc, a string in the output (\"7\")",
            ".jobs[0].state is in the doc, not in the output",
            ".jobs[0].status is in the output, not in the doc",
        ]
    );
    let mut units = Vec::new();
    time_units("", &serde_json::json!({"a": {"ended_ms": 3}}), &mut units);
    assert_eq!(units.len(), 1, "{units:?}");
}
