//! Human tables by default, JSON for scripts, and the progress display of waiting commands.

use comfy_table::{presets, Cell, ContentArrangement, Table};
use indicatif::{ProgressBar, ProgressStyle};
use kestrel_proto::messages::{Counts, WaitProgress};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How results are printed.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    /// Aligned columns for people
    #[default]
    Table,
    /// One JSON document, for scripts
    Json,
}

/// Prints a value as JSON.
pub fn json<T: Serialize>(v: &T) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => say(s),
        Err(e) => eprintln!("error: cannot render JSON: {e}"),
    }
}

/// Prints a line on stdout; a reader that went away (`| head`) is no error. For the commands
/// that keep SIGPIPE ignored because they host a worker (`run`): the others die of it quietly,
/// as `ls | head` does (see `main`).
pub fn say(line: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// `1 job`, `2 jobs`: a count with its noun, plural unless one.
pub fn plural(n: impl Into<u64>, noun: &str) -> String {
    match n.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// `job 3`, `jobs 1-4, 7`: job ids with runs of consecutive ids shortened, so a job file of
/// 100,000 jobs is not a 600 KB line.
pub fn jobs(ids: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j].wrapping_add(1) {
            j += 1;
        }
        parts.push(match j - i {
            0 => ids[i].to_string(),
            1 => format!("{}, {}", ids[i], ids[j]),
            _ => format!("{}-{}", ids[i], ids[j]),
        });
        i = j + 1;
    }
    let noun = if ids.len() == 1 { "job" } else { "jobs" };
    format!("{noun} {}", parts.join(", "))
}

/// "active", or "quarantined: why" (see `kestrel worker resume`).
pub fn worker_state(w: &kestrel_proto::messages::WorkerRow) -> String {
    match &w.quarantined {
        Some(why) => format!("quarantined: {why}"),
        None => "active".into(),
    }
}

/// `text` with every character a terminal would act on written out instead: C0 controls
/// (ESC starts the sequences that recolour, move the cursor, retitle the window or rewrite
/// the clipboard), DEL, C1 controls (U+0080 to U+009F, CSI among them) and the Unicode bidi
/// controls that reorder what is shown (U+202A to U+202E, U+2066 to U+2069, U+200E, U+200F,
/// U+061C), and the line and paragraph separators. `\n`, `\t` and `\r` read so, others as
/// `\x1b` or `\u{202e}`. Task data (names, commands, stderr, reasons) is anybody's who can
/// submit or whose task runs: every human view of it goes through here (JSON keeps the
/// characters, escaped as JSON escapes them). `lines` keeps `\n` and `\t`, for a view of
/// several lines.
pub fn escape_controls(text: &str, lines: bool) -> Cow<'_, str> {
    let acts = |c: char| {
        let kept = lines && matches!(c, '\n' | '\t');
        (c.is_control() && !kept)
            || matches!(
                c,
                '\u{061c}'
                    | '\u{200e}'
                    | '\u{200f}'
                    | '\u{2028}'
                    | '\u{2029}'
                    | '\u{202a}'..='\u{202e}'
                    | '\u{2066}'..='\u{2069}'
            )
    };
    if !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !acts(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// [`escape_controls`] for one line (a table cell, a message): every control escaped.
pub fn clean(text: &str) -> Cow<'_, str> {
    escape_controls(text, false)
}

/// A table cell showing `content` with [`clean`].
pub fn cell(content: impl std::fmt::Display) -> Cell {
    let text = content.to_string();
    match clean(&text) {
        Cow::Borrowed(_) => Cell::new(text),
        Cow::Owned(escaped) => Cell::new(escaped),
    }
}

/// A table with a header row and no borders, fitted to the terminal.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().map(|h| Cell::new(h.to_uppercase())));
    t
}

/// A borderless table of `name value` rows (`task info`, `job info`), fitted to the terminal.
pub fn fields() -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic);
    t
}

/// Prints a table built by [`table`] or [`fields`], without the blanks that pad each line to
/// the table's width (they would trail every line a user copies or greps).
pub fn print_table(t: &Table) {
    for line in t.lines() {
        say(line.trim_end());
    }
}

/// `1.5 ms`, `2.30 s`, `3m 12s`, `1h 02m`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 0.001 {
        format!("{} µs", d.as_micros())
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1000.0)
    } else if s < 60.0 {
        format!("{s:.2} s")
    } else if s < 3600.0 {
        format!("{}m {:02}s", d.as_secs() / 60, d.as_secs() % 60)
    } else {
        format!("{}h {:02}m", d.as_secs() / 3600, d.as_secs() / 60 % 60)
    }
}

/// Microseconds as a duration string.
pub fn micros(us: f64) -> String {
    duration(Duration::from_secs_f64(us.max(0.0) / 1e6))
}

/// A Unix-epoch microsecond time as local `HH:MM:SS` age, e.g. `12s ago`.
pub fn ago(us: u64) -> String {
    if us == 0 {
        return "-".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(us);
    format!(
        "{} ago",
        duration(Duration::from_micros(now.saturating_sub(us)))
    )
}

/// A byte count for people: 512 B, 3.2 MiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `9990 finished, 10 failed` (only the non-zero parts; `nothing` when empty).
pub fn counts(c: &Counts) -> String {
    let parts: Vec<String> = [
        (c.finished, "finished"),
        (c.failed, "failed"),
        (c.canceled, "canceled"),
        (c.running, "running"),
        (c.assigned, "assigned"),
        (c.ready, "queued"),
        (c.waiting, "waiting"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, s)| format!("{n} {s}"))
    .collect();
    if parts.is_empty() {
        "no tasks".into()
    } else {
        parts.join(", ")
    }
}

/// How many tasks must end while a wait watches before it shows an ETA.
const ETA_AFTER_ENDS: u64 = 10;
/// The rate shown is that of the ends of about this last while.
const RATE_WINDOW: Duration = Duration::from_secs(5);

/// Tasks that ended over some seconds.
#[derive(Clone, Copy)]
struct Ends {
    ended: u64,
    secs: f64,
}

/// Shows the progress of a wait: a bar on a terminal, a plain line every few seconds otherwise.
pub struct Progress {
    bar: Option<ProgressBar>,
    /// Whether the bar shows counts yet: until the server's first report it is a spinner, since
    /// a bar of 0 tasks out of 0 would be drawn full.
    counting: bool,
    started: Instant,
    last_line: Instant,
    quiet: bool,
    /// The last "why the work does not move" shown, to say it once per change.
    waiting: Option<String>,
    /// When the first report came and how many tasks were done then: the rate counts only
    /// what ended while this command watched (a wait on a half-done job must not count the
    /// tasks done before it began).
    first: Option<(Instant, u64)>,
    /// Reports of the last [`RATE_WINDOW`] (and the one just before it): the rate is that of
    /// recent ends, so a job that waited behind long tasks is not judged by the wait.
    recent: VecDeque<(Instant, u64)>,
}

/// The progress display on screen, if any: a note printed meanwhile goes above it.
static SHOWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Prints a line on stderr, above the progress display if one is shown (a reconnection
/// notice during a wait must not be drawn over by the bar).
pub fn note(line: &str) {
    let shown = SHOWN.lock().unwrap_or_else(PoisonError::into_inner);
    match shown.as_ref() {
        Some(bar) => bar.println(line),
        None => eprintln!("{line}"),
    }
}

impl Progress {
    pub fn new(quiet: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new_spinner();
            b.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.set_message("waiting for the server's first progress report");
            b.enable_steady_tick(Duration::from_millis(200));
            *SHOWN.lock().unwrap_or_else(PoisonError::into_inner) = Some(b.clone());
            b
        });
        Progress {
            bar,
            counting: false,
            started: Instant::now(),
            last_line: Instant::now(),
            quiet,
            waiting: None,
            first: None,
            recent: VecDeque::new(),
        }
    }

    pub fn update(&mut self, p: &WaitProgress) {
        let c = &p.counts;
        let done = c.done();
        let now = Instant::now();
        let (since, done_then) = *self.first.get_or_insert((now, done));
        self.recent.push_back((now, done));
        while self.recent.len() > 2 && now - self.recent[1].0 >= RATE_WINDOW {
            self.recent.pop_front();
        }
        let (then, done_before) = self.recent[0];
        let recent = Ends {
            ended: done.saturating_sub(done_before),
            secs: (now - then).as_secs_f64(),
        };
        let watched = Ends {
            ended: done.saturating_sub(done_then),
            secs: (now - since).as_secs_f64(),
        };
        let left = c.total().saturating_sub(done);
        let msg = format!("{} failed{}", c.failed, rate_text(recent, watched, left));
        // Escaped: what the server says may quote a job's name or a file's.
        let waiting = p.waiting.as_deref().map(|w| clean(w).into_owned());
        if waiting != self.waiting {
            self.waiting = waiting.clone();
            // Said once, even without a terminal: a stalled run must not look merely slow.
            if let (Some(w), false) = (&waiting, self.quiet) {
                match &self.bar {
                    Some(b) => b.println(format!("waiting: {w}")),
                    None => eprintln!("waiting: {w}"),
                }
            }
        }
        let msg = match &waiting {
            Some(w) => format!("{} failed  waiting: {w}", c.failed),
            None => msg,
        };
        if let Some(b) = &self.bar {
            b.set_length(c.total());
            b.set_position(done);
            if !self.counting {
                self.counting = true;
                b.set_style(
                    ProgressStyle::with_template(
                        "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} tasks  {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
            }
            b.set_message(msg);
        } else if !self.quiet && self.last_line.elapsed() >= Duration::from_secs(5) {
            self.last_line = Instant::now();
            eprintln!(
                "[{}] {done}/{} tasks done, {msg}",
                duration(self.started.elapsed()),
                c.total()
            );
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
            SHOWN.lock().unwrap_or_else(PoisonError::into_inner).take();
        }
    }
}

/// The rate of the `recent` ends and, once enough tasks ended while `watched`, the time the
/// `left` ones will take at that rate. Nothing before a task ended or within the first second.
fn rate_text(recent: Ends, watched: Ends, left: u64) -> String {
    let rate = recent.ended as f64 / recent.secs.max(1e-3);
    if watched.ended == 0 || watched.secs < 1.0 {
        return String::new();
    }
    let mut text = if rate < 10.0 {
        format!("  {rate:.1} tasks/s")
    } else {
        format!("  {rate:.0} tasks/s")
    };
    // An estimate from a handful of ends is a guess that grows while long tasks run
    // (4 six-second tasks: "ETA 4.8 s", then "ETA 9.9 s" as they were about to end).
    if left > 0 && rate > 0.0 && watched.ended >= ETA_AFTER_ENDS {
        let eta = Duration::from_secs_f64(left as f64 / rate);
        text.push_str(&format!(", ETA {}", duration(eta)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{clean, escape_controls, jobs, rate_text, Ends};
    use std::borrow::Cow;

    #[test]
    fn control_characters_are_written_out() {
        assert!(matches!(clean("plain, ünïcode 名前"), Cow::Borrowed(_)));
        assert_eq!(
            clean("a\u{1b}[31mb\u{7}\u{9b}\u{202e}\u{2066}\u{200f}\n\t\r\u{7f}"),
            "a\\x1b[31mb\\x07\\x9b\\u{202e}\\u{2066}\\u{200f}\\n\\t\\r\\x7f"
        );
        // A view of several lines keeps its newlines and tabs.
        assert_eq!(escape_controls("a\n\tb\u{1b}", true), "a\n\tb\\x1b");
    }

    fn ends(ended: u64, secs: f64) -> Ends {
        Ends { ended, secs }
    }

    #[test]
    fn an_eta_waits_for_enough_ended_tasks() {
        assert_eq!(rate_text(ends(0, 5.0), ends(0, 5.0), 4), "");
        let early = rate_text(ends(3, 0.5), ends(3, 0.5), 4);
        assert_eq!(early, "", "not within the first second");
        assert_eq!(rate_text(ends(2, 5.0), ends(2, 5.0), 2), "  0.4 tasks/s");
        let eta = rate_text(ends(10, 5.0), ends(10, 5.0), 20);
        assert_eq!(eta, "  2.0 tasks/s, ETA 10.00 s");
        assert_eq!(
            rate_text(ends(500, 5.0), ends(500, 5.0), 0),
            "  100 tasks/s"
        );
    }

    #[test]
    fn the_rate_is_that_of_recent_ends() {
        // 19 ends in 15 s of watching, all in the last 5 s (the job waited behind long tasks).
        let text = rate_text(ends(19, 5.0), ends(19, 15.0), 40);
        assert_eq!(text, "  3.8 tasks/s, ETA 10.53 s");
        // Nothing ended lately: a rate of 0 and no ETA.
        assert_eq!(rate_text(ends(0, 5.0), ends(19, 15.0), 40), "  0.0 tasks/s");
    }

    #[test]
    fn job_ids_are_shortened_to_runs() {
        assert_eq!(jobs(&[3]), "job 3");
        assert_eq!(jobs(&[1, 2]), "jobs 1, 2");
        assert_eq!(jobs(&[1, 2, 3, 4, 7, 9, 10, 11]), "jobs 1-4, 7, 9-11");
        let many: Vec<u32> = (1..=100_000).collect();
        assert_eq!(jobs(&many), "jobs 1-100000");
    }
}
