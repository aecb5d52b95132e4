//! Placeholders in a job's command, output paths, directory and environment values.
//!
//! `{job}` is the job's id, `{task}` the task's id and, in a job made of the lines of a file
//! (`--each`), `{line}` the task's line and `{line:N}` its Nth whitespace-separated field, from
//! 1 (All-Pairs: a line `a.fits b.fits` names both inputs of its task). A placeholder is `{name}` not preceded by `$`, so
//! `${line}` stays the shell's variable. Workers replace them ([`substitute`]); at submission,
//! [`check_template`] refuses a placeholder that does not apply (`{line}` without `--each`) or that
//! looks like a mistyped one (`{tsk}`, `{TASK}`, `{lines}`), and lets any other text in braces
//! through untouched (`awk '{print $1}'`, `find -exec rm {} +`, `{x}`).
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
/// by `$`): `(start, end, name)`, `start..end` covering the braces.
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
            // `{line:N}`: the Nth field of the line.
            if &text[from..close] == LINE && bytes.get(close) == Some(&b':') {
                let digits = bytes[close + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit())
                    .count();
                if digits > 0 {
                    close += 1 + digits;
                }
            }
            let dollar = open > 0 && bytes[open - 1] == b'$';
            if len > 0 && bytes.get(close) == Some(&b'}') && !dollar {
                from = close + 1;
                return Some((open, close + 1, &text[open + 1..close]));
            }
        }
        None
    })
}

/// `text` with its placeholders replaced; borrowed when there is nothing to replace. Every
/// placeholder is replaced in one pass, so a line holding `{task}` is not replaced again.
pub fn substitute<'a>(text: &'a str, v: &Values) -> Cow<'a, str> {
    let mut out: Option<String> = None;
    let mut copied = 0;
    for (start, end, name) in tokens(text) {
        let value = match (name, v.line) {
            (JOB, _) => v.job,
            (TASK, _) => v.task,
            (LINE, Some(line)) => line,
            (_, Some(line)) => match field_number(name) {
                // A line with fewer fields gives an empty one.
                Some(n) => line.split_whitespace().nth(n - 1).unwrap_or(""),
                None => continue,
            },
            _ => continue,
        };
        let o = out.get_or_insert_with(|| String::with_capacity(text.len() + value.len()));
        o.push_str(&text[copied..start]);
        o.push_str(value);
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

/// N of a `{line:N}` placeholder's name (`line:N`), if it is one with N ≥ 1.
fn field_number(name: &str) -> Option<usize> {
    let n: usize = name.strip_prefix("line:")?.parse().ok()?;
    (n >= 1).then_some(n)
}

/// A placeholder refused at submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceholderError {
    /// As written, with its braces.
    pub found: String,
    /// Where: "the command", "--stdout", "--env NAME", ...
    pub place: String,
    /// The placeholder it looks like.
    pub meant: &'static str,
    /// Whether the job is made of lines (`--each`).
    pub lines: bool,
}

impl fmt::Display for PlaceholderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (found, place, meant) = (&self.found, &self.place, self.meant);
        let name = found.trim_matches(['{', '}']);
        if (name == LINE || field_number(name).is_some()) && !self.lines {
            write!(f, "placeholder {found} in {place} works only with --each")?;
        } else if meant == LINE && !self.lines {
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
            "; placeholders are {job}, {task} and, with --each, {line} (and {line:N}, its Nth field from 1)",
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
    for (_, _, name) in tokens(text) {
        let of_line = name == LINE || field_number(name).is_some();
        let fine = name == JOB || name == TASK || (of_line && lines);
        if fine {
            continue;
        }
        // `{line:0}` (fields count from 1), or a line placeholder without --each.
        let meant = match of_line || name.starts_with("line:") {
            true => Some(LINE),
            false => meant(name),
        };
        if let Some(meant) = meant {
            return Err(PlaceholderError {
                found: format!("{{{name}}}"),
                place: place.to_string(),
                meant,
                lines,
            });
        }
    }
    Ok(())
}

/// Checks every text of a job's template that placeholders are replaced in: the command, the
/// output paths, the directory and the environment values. `lines` says whether the job is
/// made of lines (`--each`). A list's own commands are checked with [`check`] each.
pub fn check_template(t: &TaskTemplate, lines: bool) -> Result<(), PlaceholderError> {
    for arg in &t.argv {
        check(arg, "the command", lines)?;
    }
    for (sink, flag) in [(&t.stdout, "--stdout"), (&t.stderr, "--stderr")] {
        if let Sink::File(path) = sink {
            check(path, flag, lines)?;
        }
    }
    if let Some(cwd) = &t.cwd {
        check(cwd, "--cwd", lines)?;
    }
    for (key, value) in &t.env {
        check(value, &format!("--env {key}"), lines)?;
    }
    let f = &t.files;
    for (names, flag) in [
        (&f.inputs, "--input"),
        (&f.outputs, "--output-file"),
        (&f.statics, "--input-static"),
    ] {
        for name in names {
            check(name, flag, lines)?;
        }
    }
    Ok(())
}

/// Whether placeholder `name` appears in `text` where it would be replaced.
pub fn uses(text: &str, name: &str) -> bool {
    tokens(text).any(|(_, _, n)| n == name)
}

/// Whether `{line}` appears anywhere it would be replaced, files included (a job of lines
/// without it runs the same command on the same files for every line, which is rarely meant).
pub fn uses_line(t: &TaskTemplate) -> bool {
    let sinks = [&t.stdout, &t.stderr].into_iter().filter_map(|s| match s {
        Sink::File(p) => Some(p.as_str()),
        Sink::Null | Sink::Stream { .. } => None,
    });
    let f = &t.files;
    let files = f.inputs.iter().chain(&f.outputs).chain(&f.statics);
    t.argv
        .iter()
        .map(String::as_str)
        .chain(sinks)
        .chain(t.cwd.as_deref())
        .chain(t.env.iter().map(|(_, v)| v.as_str()))
        .chain(files.map(String::as_str))
        .any(|text| tokens(text).any(|(_, _, n)| n == LINE || field_number(n).is_some()))
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
        assert_eq!(substitute("{{task}}", &v), "{17}");
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
    fn near_misses_are_refused_and_other_braces_pass() {
        let e = check("out/{tsk}.txt", "--stdout", false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown placeholder {tsk} in --stdout (did you mean {task}?); placeholders are {job}, {task} and, with --each, {line} (and {line:N}, its Nth field from 1)"
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
