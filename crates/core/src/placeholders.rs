//! Placeholders in a job's command, output paths, directory and environment values.
//!
//! `{job}` is the job's id, `{task}` the task's id and, in a job made of the lines of a file
//! (`--each`), `{line}` the task's line and `{line:N}` its Nth whitespace-separated field, from
//! 1 (All-Pairs: a line `a.fits b.fits` names both inputs of its task). `{line:q}` and
//! `{line:N:q}` are the same quoted for a shell (`sh -c 'wc -l {line:q}'` with a line holding
//! spaces), as GNU parallel quotes its `{}`. A placeholder is `{name}` not preceded by `$`, so
//! `${line}` stays the shell's variable. Workers replace them ([`substitute`]); at submission,
//! [`check_template`] refuses a placeholder that does not apply (`{line}` without `--each`),
//! that looks like a mistyped one (`{tsk}`, `{TASK}`, `{lines}`) or that is HyperQueue's
//! (`%{TASK_ID}`, `$HQ_TASK_ID`), and lets any other text in braces through untouched
//! (`awk '{print $1}'`, `find -exec rm {} +`, `{x}`). Doubled braces escape a placeholder:
//! `{{task}}` is the text `{task}`, for a `kestrel submit` that the task itself runs.
//!
//! A task that reads files also has `{input:NAME}` (the path its input NAME was staged at),
//! `{input:N}` (the Nth input's, from 0) and `{inputs}` (all of them, space-separated). Their
//! paths are known only once the worker has staged the inputs, so these are replaced after
//! the others, by [`substitute_inputs`].

use crate::spec::{Sink, TaskIndex, TaskSet, TaskTemplate};
use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

/// The job's id.
pub const JOB: &str = "job";
/// The task's id.
pub const TASK: &str = "task";
/// The task's line, in a job of lines.
pub const LINE: &str = "line";
const NAMES: [&str; 3] = [JOB, TASK, LINE];

/// What the placeholders of one task stand for.
#[derive(Clone, Copy, Debug)]
pub struct Values<'a> {
    /// What `{job}` stands for.
    pub job: &'a str,
    /// What `{task}` stands for.
    pub task: &'a str,
    /// The task's line; `None` leaves `{line}` as it is.
    pub line: Option<&'a str>,
}

/// Each placeholder-shaped `{name}` of `text` (`name` of letters, digits and `_`, not preceded
/// by `$`; or `line` with `:N` and/or `:q` after it): `(start, end, name)`, `start..end`
/// covering the braces. A placeholder in doubled braces (`{{task}}`) is an escaped one: its
/// `name` is the text it stands for, braces included (`{task}`), which no name equals.
fn tokens(text: &str) -> impl Iterator<Item = (usize, usize, &str)> + '_ {
    let bytes = text.as_bytes();
    let mut from = 0;
    std::iter::from_fn(move || {
        while let Some(off) = text[from..].find('{') {
            let open = from + off;
            from = open + 1;
            let len = bytes[from..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                .count();
            let mut close = from + len;
            if &text[from..close] == LINE {
                // `{line:N}`: the Nth field of the line.
                if bytes.get(close) == Some(&b':') {
                    let digits = bytes[close + 1..]
                        .iter()
                        .take_while(|c| c.is_ascii_digit())
                        .count();
                    if digits > 0 {
                        close += 1 + digits;
                    }
                }
                // `{line:q}`, `{line:N:q}`: quoted for a shell.
                if bytes.get(close..close + 2) == Some(b":q") {
                    close += 2;
                }
            }
            let dollar = open > 0 && bytes[open - 1] == b'$';
            if len > 0 && bytes.get(close) == Some(&b'}') && !dollar {
                from = close + 1;
                let name = &text[open + 1..close];
                // `{{task}}`: the text `{task}` (for a `kestrel submit` the task runs).
                let doubled = open > 0
                    && bytes[open - 1] == b'{'
                    && bytes.get(close + 1) == Some(&b'}')
                    && (NAMES[..2].contains(&name) || line_part(name).is_some());
                if doubled {
                    from = close + 2;
                    return Some((open - 1, close + 2, &text[open..close + 1]));
                }
                return Some((open, close + 1, name));
            }
        }
        None
    })
}

/// A placeholder of the line, parsed from its name: `line`, `line:N`, `line:q`, `line:N:q`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LinePart {
    /// The field, from 1; `None` for the whole line.
    field: Option<usize>,
    /// Quoted for a shell.
    quoted: bool,
}

/// The part of the line a placeholder's name stands for, if it is a line placeholder
/// (a field number, if any, at least 1).
fn line_part(name: &str) -> Option<LinePart> {
    let rest = name.strip_prefix(LINE)?;
    let (rest, quoted) = match rest.strip_suffix(":q") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    if rest.is_empty() {
        return Some(LinePart {
            field: None,
            quoted,
        });
    }
    let n: usize = rest.strip_prefix(':')?.parse().ok()?;
    (n >= 1).then_some(LinePart {
        field: Some(n),
        quoted,
    })
}

/// `text` with its placeholders replaced; borrowed when there is nothing to replace. Every
/// placeholder is replaced in one pass, so a line holding `{task}` is not replaced again.
pub fn substitute<'a>(text: &'a str, v: &Values) -> Cow<'a, str> {
    let mut out: Option<String> = None;
    let mut copied = 0;
    for (start, end, name) in tokens(text) {
        let value: Cow<'_, str> = match (name, v.line) {
            (escaped, _) if escaped.starts_with('{') => Cow::Borrowed(escaped),
            (JOB, _) => Cow::Borrowed(v.job),
            (TASK, _) => Cow::Borrowed(v.task),
            (_, Some(line)) => match line_part(name) {
                Some(part) => line_value(line, part),
                None => continue,
            },
            _ => continue,
        };
        let o = out.get_or_insert_with(|| String::with_capacity(text.len() + value.len()));
        o.push_str(&text[copied..start]);
        o.push_str(&value);
        copied = end;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut o) => {
            o.push_str(&text[copied..]);
            Cow::Owned(o)
        }
    }
}

/// What a line placeholder stands for in `line`. A line with fewer fields gives an empty one
/// (submission refuses such lines: see [`fields_needed`]).
fn line_value(line: &str, part: LinePart) -> Cow<'_, str> {
    let value = match part.field {
        None => line,
        Some(n) => line.split_whitespace().nth(n - 1).unwrap_or(""),
    };
    if !part.quoted {
        return Cow::Borrowed(value);
    }
    // A line holds no NUL (submission refuses it), the one thing a shell word cannot carry.
    shlex::try_quote(value).unwrap_or(Cow::Borrowed("''"))
}

/// A placeholder refused at submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceholderError {
    /// One that does not apply here, or looks like a mistyped one.
    Unknown {
        /// As written, with its braces.
        found: String,
        /// Where: "the command", "--stdout", "--env NAME", ...
        place: String,
        /// The placeholder it looks like.
        meant: &'static str,
        /// Whether the job is made of lines (`--each`).
        lines: bool,
    },
    /// HyperQueue's syntax (`%{TASK_ID}`, `$HQ_TASK_ID`), which Kestrel would take literally.
    HyperQueue {
        /// As written.
        found: String,
        /// Where, as in `Unknown`.
        place: String,
        /// What to write instead.
        instead: &'static str,
    },
}

impl fmt::Display for PlaceholderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (found, place, meant, lines) = match self {
            PlaceholderError::HyperQueue {
                found,
                place,
                instead,
            } => return write!(f, "{found} in {place} is HyperQueue's syntax; {instead}"),
            PlaceholderError::Unknown {
                found,
                place,
                meant,
                lines,
            } => (found, place, *meant, *lines),
        };
        let name = found.trim_matches(['{', '}']);
        if line_part(name).is_some() && !lines {
            write!(f, "placeholder {found} in {place} works only with --each")?;
        } else if meant == LINE && !lines {
            write!(
                f,
                "unknown placeholder {found} in {place} (did you mean {{{meant}}}? it works only with --each)"
            )?;
        } else {
            write!(
                f,
                "unknown placeholder {found} in {place} (did you mean {{{meant}}}?)"
            )?;
        }
        f.write_str(
            "; placeholders are {job}, {task} and, with --each, {line} (and {line:N}, its Nth field from 1; {line:q} and {line:N:q} quoted for a shell)",
        )
    }
}

impl std::error::Error for PlaceholderError {}

/// The placeholder a `{name}` was probably meant to be, if it is a near miss: the same but
/// for case, or one letter added, dropped, changed or two swapped (`{tsk}`, `{jobs}`).
fn meant(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    NAMES
        .into_iter()
        .find(|n| strsim::osa_distance(&lower, n) <= 1)
}

/// HyperQueue's placeholders (`%{NAME}`) and what Kestrel has instead.
const HQ_PLACEHOLDERS: [(&str, &str); 6] = [
    ("TASK_ID", "Kestrel's is {task}"),
    ("JOB_ID", "Kestrel's is {job}"),
    (
        "INSTANCE_ID",
        "Kestrel has no instance id (a task run again writes the same files); leave it out",
    ),
    (
        "CWD",
        "Kestrel's relative paths are relative to the task's directory (--cwd); leave it out",
    ),
    (
        "SUBMIT_DIR",
        "tasks run in the directory you submit from (unless --cwd says otherwise); write a relative path",
    ),
    (
        "SERVER_UID",
        "Kestrel has no server id; {job} in a path keeps jobs apart",
    ),
];

/// HyperQueue's variables in a task's environment and Kestrel's.
const HQ_VARIABLES: [(&str, &str); 2] = [
    ("HQ_TASK_ID", "Kestrel's is $KESTREL_TASK_ID"),
    ("HQ_JOB_ID", "Kestrel's is $KESTREL_JOB_ID"),
];

/// HyperQueue's syntax in `text`, if any: `%{TASK_ID}` and the like, or `$HQ_TASK_ID`.
fn hyperqueue(text: &str, place: &str) -> Option<PlaceholderError> {
    let refused = |found: String, instead| PlaceholderError::HyperQueue {
        found,
        place: place.to_string(),
        instead,
    };
    for (start, _, name) in tokens(text) {
        if !text[..start].ends_with('%') {
            continue;
        }
        if let Some((_, instead)) = HQ_PLACEHOLDERS.iter().find(|(n, _)| *n == name) {
            return Some(refused(format!("%{{{name}}}"), instead));
        }
    }
    if !text.contains("HQ_") {
        return None;
    }
    for (var, instead) in HQ_VARIABLES {
        for found in [format!("${var}"), format!("${{{var}}}")] {
            let at = text.find(&found);
            // `$HQ_TASK_IDS` is another variable.
            let whole = at.is_some_and(|at| {
                !text[at + found.len()..]
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            });
            if whole {
                return Some(refused(found, instead));
            }
        }
    }
    None
}

/// The logical file names `patterns` make for each task of `tasks` from index `from` on, in
/// task order: `f(index, task id, name)` for each task and pattern, stopping at the first error
/// `f` returns. The one place that turns a job's file patterns into names, for the scheduler's
/// index, the server's check of a submission and the CLI's check of a job file.
pub fn try_each_name<E>(
    tasks: &TaskSet,
    job: &str,
    from: TaskIndex,
    patterns: &[String],
    mut f: impl FnMut(TaskIndex, u32, Cow<'_, str>) -> Result<(), E>,
) -> Result<(), E> {
    if patterns.is_empty() {
        return Ok(());
    }
    let mut task = String::new();
    for index in from..tasks.len() {
        let id = tasks.id_at(index);
        task.clear();
        fmt::Write::write_fmt(&mut task, format_args!("{id}")).expect("a String takes any text");
        let values = Values {
            job,
            task: &task,
            line: tasks.line(index),
        };
        for p in patterns {
            f(index, id, substitute(p, &values))?;
        }
    }
    Ok(())
}

/// `text` with `{input:NAME}`, `{input:N}` and `{inputs}` replaced by the paths of `inputs`
/// (name, path: the task's inputs in the order declared, their names with placeholders
/// already replaced); borrowed when there is nothing to replace. One pass, so a path that
/// itself holds `{input` is not replaced again; an `{input:X}` naming no input stays as it is.
pub fn substitute_inputs<'a>(text: &'a str, inputs: &[(String, String)]) -> Cow<'a, str> {
    const OPEN: &str = "{input";
    if !text.contains(OPEN) {
        return Cow::Borrowed(text);
    }
    let path_of = |key: &str| {
        inputs
            .iter()
            .find(|(name, _)| name == key)
            .or_else(|| key.parse::<usize>().ok().and_then(|i| inputs.get(i)))
            .map(|(_, path)| path.as_str())
    };
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len()..];
        if let Some(r) = after.strip_prefix("s}") {
            let all: Vec<&str> = inputs.iter().map(|(_, p)| p.as_str()).collect();
            out.push_str(&all.join(" "));
            rest = r;
            continue;
        }
        let named = after.strip_prefix(':').and_then(|r| {
            let end = r.find('}')?;
            Some((path_of(&r[..end])?, &r[end + 1..]))
        });
        match named {
            Some((path, r)) => {
                out.push_str(path);
                rest = r;
            }
            None => {
                out.push_str(OPEN);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Checks the placeholders of one piece of text (see the module's rule); `place` names it in
/// the error, `lines` says whether `{line}` applies.
pub fn check(text: &str, place: &str, lines: bool) -> Result<(), PlaceholderError> {
    if let Some(e) = hyperqueue(text, place) {
        return Err(e);
    }
    for (_, _, name) in tokens(text) {
        let of_line = line_part(name).is_some();
        let escaped = name.starts_with('{');
        let fine = escaped || name == JOB || name == TASK || (of_line && lines);
        if fine {
            continue;
        }
        // `{line:0}` (fields count from 1), or a line placeholder without --each.
        let meant = match of_line || name.starts_with("line:") {
            true => Some(LINE),
            false => meant(name),
        };
        if let Some(meant) = meant {
            return Err(PlaceholderError::Unknown {
                found: format!("{{{name}}}"),
                place: place.to_string(),
                meant,
                lines,
            });
        }
    }
    Ok(())
}

/// Every text of a template that placeholders are replaced in, with where it is for errors:
/// the command, the output paths, the directory, the environment values and the files.
fn texts(t: &TaskTemplate) -> impl Iterator<Item = (&str, Cow<'static, str>)> + '_ {
    let sinks = [(&t.stdout, "--stdout"), (&t.stderr, "--stderr")]
        .into_iter()
        .filter_map(|(sink, flag)| match sink {
            Sink::File(path) => Some((path.as_str(), Cow::Borrowed(flag))),
            Sink::Null | Sink::Stream { .. } => None,
        });
    let f = &t.files;
    let files = [
        (&f.inputs, "--input"),
        (&f.outputs, "--output-file"),
        (&f.statics, "--input-static"),
    ]
    .into_iter()
    .flat_map(|(names, flag)| names.iter().map(move |n| (n.as_str(), Cow::Borrowed(flag))));
    t.argv
        .iter()
        .map(|a| (a.as_str(), Cow::Borrowed("the command")))
        .chain(sinks)
        .chain(t.cwd.as_deref().map(|c| (c, Cow::Borrowed("--cwd"))))
        .chain(
            t.env
                .iter()
                .map(|(k, v)| (v.as_str(), Cow::Owned(format!("--env {k}")))),
        )
        .chain(files)
}

/// Checks every text of a job's template that placeholders are replaced in: the command, the
/// output paths, the directory, the environment values and the files. `lines` says whether
/// the job is made of lines (`--each`). A list's own commands are checked with [`check`] each.
pub fn check_template(t: &TaskTemplate, lines: bool) -> Result<(), PlaceholderError> {
    texts(t).try_for_each(|(text, place)| check(text, &place, lines))
}

/// Whether placeholder `name` appears in `text` where it would be replaced.
pub fn uses(text: &str, name: &str) -> bool {
    tokens(text).any(|(_, _, n)| n == name)
}

/// Whether `{line}` (or a field of it) appears anywhere it would be replaced, files included
/// (a job of lines without it runs the same command on the same files for every line, which
/// is rarely meant).
pub fn uses_line(t: &TaskTemplate) -> bool {
    texts(t).any(|(text, _)| tokens(text).any(|(_, _, n)| line_part(n).is_some()))
}

/// How many whitespace-separated fields each line must have for the `{line:N}` placeholders
/// of `t`: the highest N (0 if none). A line with fewer would make an empty argument or path,
/// so submission refuses it, naming the line.
pub fn fields_needed(t: &TaskTemplate) -> usize {
    texts(t)
        .flat_map(|(text, _)| tokens(text).filter_map(|(_, _, n)| line_part(n)?.field))
        .max()
        .unwrap_or(0)
}

/// Whether a file sink's path `path` names a file of its own for each task of a job: it uses
/// `{task}` or the whole `{line}`, or, being relative, is in a directory `cwd` that does.
/// Otherwise the job's tasks share the file (`--stdout all.txt`, `--stdout by-{line:1}.txt`),
/// and each task's output is added to it whole.
pub fn per_task(cwd: Option<&str>, path: &str) -> bool {
    let names_task = |text: &str| {
        tokens(text).any(|(_, _, n)| n == TASK || line_part(n).is_some_and(|p| p.field.is_none()))
    };
    names_task(path) || (Path::new(path).is_relative() && cwd.is_some_and(names_task))
}

/// Whether the tasks of a job (if it has several) share the file sink `path` in `cwd`: it does
/// not name a file per task ([`per_task`]) and is not a device (`/dev/stdout` is written as it
/// is by every task).
pub fn shared_file(cwd: Option<&str>, path: &str) -> bool {
    !per_task(cwd, path) && !path.starts_with("/dev/")
}

/// Whether a file sink's path names both `{job}` and `{task}`, so that no other task of any
/// job writes the file: the worker may remove it when the task leaves it empty, and a
/// missing one means just that.
pub fn names_one_task(path: &str) -> bool {
    uses(path, TASK) && uses(path, JOB)
}

/// `p` relative to the task's working directory, when it has one and `p` is relative.
pub fn resolve(cwd: Option<&Path>, p: &str) -> PathBuf {
    let p = Path::new(p);
    match cwd {
        Some(c) if p.is_relative() => c.join(p),
        _ => p.to_path_buf(),
    }
}

/// The file a task's output goes to when `sink` is a file, as its worker opens it: placeholders
/// replaced, relative to the task's working directory (left relative when the worker's own
/// directory is used). The server names it to `kestrel job cat`, which reads it.
pub fn output_path(template: &TaskTemplate, sink: &Sink, v: &Values) -> Option<PathBuf> {
    let Sink::File(path) = sink else {
        return None;
    };
    let cwd = template
        .cwd
        .as_deref()
        .map(|c| PathBuf::from(substitute(c, v).as_ref()));
    Some(resolve(cwd.as_deref(), &substitute(path, v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_placeholders_name_the_staged_paths() {
        let inputs = vec![
            ("raw/7.fits".to_string(), "/c/files/raw/7.fits".to_string()),
            ("db".to_string(), "/c/files/db".to_string()),
        ];
        let sub = |t: &str| substitute_inputs(t, &inputs).into_owned();
        assert_eq!(
            sub("cat {input:raw/7.fits} {input:1}"),
            "cat /c/files/raw/7.fits /c/files/db"
        );
        assert_eq!(sub("ls {inputs}"), "ls /c/files/raw/7.fits /c/files/db");
        // Unknown names and other braces stay; text without any is borrowed.
        assert_eq!(
            sub("{input:nope} {input:9} {inputx}"),
            "{input:nope} {input:9} {inputx}"
        );
        assert!(matches!(
            substitute_inputs("plain {task}", &inputs),
            Cow::Borrowed(_)
        ));
        // A path holding `{input` is not replaced again.
        let odd = vec![("a".to_string(), "/p/{inputs}".to_string())];
        assert_eq!(substitute_inputs("{input:a}", &odd), "/p/{inputs}");
    }

    fn values(line: Option<&str>) -> Values<'_> {
        Values {
            job: "3",
            task: "17",
            line,
        }
    }

    #[test]
    fn placeholders_are_replaced_once_and_shell_text_is_kept() {
        let v = values(Some("a {task} b.txt"));
        assert_eq!(substitute("sums/{line}.sha", &v), "sums/a {task} b.txt.sha");
        assert_eq!(substitute("j{job}-t{task}-{task}", &v), "j3-t17-17");
        // Doubled braces keep a placeholder for a command the task runs.
        assert_eq!(substitute("{{task}}-{task}", &v), "{task}-17");
        assert_eq!(substitute("{{line:2}} {{job}}", &v), "{line:2} {job}");
        assert!(matches!(substitute("{{x}}", &v), Cow::Borrowed(_)));
        for kept in [
            "${line}",
            "awk '{print $1}'",
            "{}",
            "{x}",
            "{task",
            "task}",
            "${task}x",
        ] {
            assert!(matches!(substitute(kept, &v), Cow::Borrowed(_)), "{kept}");
        }
        assert_eq!(substitute("{line}/{task}", &values(None)), "{line}/17");
    }

    #[test]
    fn line_fields_name_the_pairs_of_all_pairs() {
        let v = values(Some("  a.fits\tb.fits "));
        assert_eq!(
            substitute("cmp {line:1} {line:2} > {task}-{line:3}.out", &v),
            "cmp a.fits b.fits > 17-.out"
        );
        assert!(check("raw/{line:2}", "--input", true).is_ok());
        let e = check("raw/{line:2}", "--input", false).unwrap_err();
        assert!(e.to_string().contains("works only with --each"), "{e}");
        let e = check("raw/{line:0}", "--input", true).unwrap_err();
        assert!(e.to_string().contains("its Nth field from 1"), "{e}");
        // Not placeholders: kept as they are.
        for kept in ["{line:}", "{line:x}", "${line:2}", "{lines:2}"] {
            assert!(matches!(substitute(kept, &v), Cow::Borrowed(_)), "{kept}");
        }
    }

    #[test]
    fn a_quoted_line_is_one_shell_word() {
        let v = values(Some("my file.txt  it's $HOME"));
        assert_eq!(
            substitute("wc -l {line:q}", &values(Some("my file.txt"))),
            "wc -l 'my file.txt'"
        );
        // Each field quoted on its own; a plain word stays as it is.
        assert_eq!(substitute("{line:1:q} {line:3:q}", &v), "my \"it's\"");
        let quoted = substitute("{line:q}", &v).into_owned();
        assert_eq!(
            shlex::split(&quoted).unwrap(),
            vec!["my file.txt  it's $HOME"],
            "{quoted}"
        );
        assert_eq!(substitute("{line:q}", &values(Some(""))), "''");
        assert!(check("sh -c 'cat {line:q} {line:2:q}'", "the command", true).is_ok());
        let e = check("{line:q}", "the command", false).unwrap_err();
        assert!(e.to_string().contains("works only with --each"), "{e}");
        // Not placeholders: kept as they are.
        for kept in ["{line:qq}", "{line:q:2}", "${line:q}", "{task:q}"] {
            assert!(matches!(substitute(kept, &v), Cow::Borrowed(_)), "{kept}");
        }
    }

    #[test]
    fn hyperqueue_syntax_is_refused_with_kestrel_s() {
        let e = check("out/%{TASK_ID}.txt", "--stdout", false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "%{TASK_ID} in --stdout is HyperQueue's syntax; Kestrel's is {task}"
        );
        for (text, says) in [
            ("%{JOB_ID}", "Kestrel's is {job}"),
            ("%{CWD}/x", "relative to the task's directory"),
            ("%{SUBMIT_DIR}/x", "write a relative path"),
            ("%{INSTANCE_ID}", "no instance id"),
            ("%{SERVER_UID}", "no server id"),
            ("echo $HQ_TASK_ID", "Kestrel's is $KESTREL_TASK_ID"),
            ("echo ${HQ_JOB_ID}", "Kestrel's is $KESTREL_JOB_ID"),
        ] {
            let e = check(text, "the command", true).unwrap_err().to_string();
            assert!(
                e.contains("is HyperQueue's syntax; ") && e.contains(says),
                "{e}"
            );
        }
        for fine in [
            "%{other}",
            "{TASK_ID}",
            "$HQ_TASK_IDS",
            "printf %s {task}",
            "HQ_TASK_ID",
        ] {
            assert_eq!(check(fine, "the command", false), Ok(()), "{fine}");
        }
    }

    #[test]
    fn paths_naming_each_task_and_those_tasks_share() {
        assert!(per_task(None, "out/{task}.txt"));
        assert!(per_task(None, "sums/{line}.sha"));
        assert!(per_task(None, "{line:q}"));
        assert!(per_task(Some("/r/{task}"), "out.txt"));
        // Shared by the job's tasks: no task, or only a field of the line.
        assert!(!per_task(None, "all.txt"));
        assert!(!per_task(None, "job-{job}.log"));
        assert!(!per_task(None, "by-{line:1}.txt"));
        assert!(!per_task(Some("/r/{task}"), "/abs/all.txt"));
        assert!(!per_task(None, "${task}.txt"));
        assert!(names_one_task("job-{job}/{task}.err"));
        assert!(!names_one_task("out/{task}.err"));
        assert!(!names_one_task("job-{job}.log"));
    }

    #[test]
    fn the_fields_lines_need_are_the_highest_used() {
        let mut t = TaskTemplate {
            argv: vec!["cmp".into(), "{line:1}".into(), "{line:3:q}".into()],
            env: vec![],
            cwd: None,
            stdout: Sink::File("{line:2}.out".into()),
            stderr: Sink::Null,
            timeout_ms: None,
            files: Default::default(),
            kind: Default::default(),
        };
        assert_eq!(fields_needed(&t), 3);
        t.files.inputs = vec!["raw/{line:4}".into()];
        assert_eq!(fields_needed(&t), 4);
        t.argv = vec!["echo".into(), "{line}".into()];
        t.files.inputs.clear();
        t.stdout = Sink::Null;
        assert_eq!(fields_needed(&t), 0);
    }

    #[test]
    fn near_misses_are_refused_and_other_braces_pass() {
        let e = check("out/{tsk}.txt", "--stdout", false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown placeholder {tsk} in --stdout (did you mean {task}?); placeholders are {job}, {task} and, with --each, {line} (and {line:N}, its Nth field from 1; {line:q} and {line:N:q} quoted for a shell)"
        );
        for typo in [
            "{TASK}", "{Job}", "{jobs}", "{tasks}", "{lien}", "{lines}", "{ob}",
        ] {
            assert!(check(typo, "the command", true).is_err(), "{typo}");
        }
        let e = check("{line}", "the command", false).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("placeholder {line} in the command works only with --each"),
            "{e}"
        );
        let e = check("{Line}", "the command", false).unwrap_err();
        assert!(
            e.to_string()
                .contains("did you mean {line}? it works only with --each"),
            "{e}"
        );
        for fine in [
            "{job}-{task}",
            "${HOME}/{task}",
            "${line}",
            "${TASK}",
            "awk '{print $1}'",
            "{}",
            "{x}",
            "{name}",
            "{1..10}",
            "{a,b}",
        ] {
            assert_eq!(check(fine, "the command", false), Ok(()), "{fine}");
        }
        assert_eq!(check("{line}", "the command", true), Ok(()));
    }

    #[test]
    fn output_paths_follow_the_working_directory() {
        let t = TaskTemplate {
            argv: vec!["x".into()],
            env: vec![],
            cwd: Some("/data/run-{job}".into()),
            stdout: Sink::File("job-{job}/{line}.out".into()),
            stderr: Sink::File("/logs/{task}.err".into()),
            timeout_ms: None,
            files: Default::default(),
            kind: Default::default(),
        };
        let v = Values {
            job: "3",
            task: "17",
            line: Some("a.fits"),
        };
        assert_eq!(
            output_path(&t, &t.stdout, &v),
            Some(PathBuf::from("/data/run-3/job-3/a.fits.out"))
        );
        assert_eq!(
            output_path(&t, &t.stderr, &v),
            Some(PathBuf::from("/logs/17.err"))
        );
        assert_eq!(output_path(&t, &Sink::Null, &v), None);
        assert_eq!(output_path(&t, &Sink::Stream { limit: 1 }, &v), None);
    }
}
