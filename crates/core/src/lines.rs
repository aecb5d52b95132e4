//! [`LineList`]: the lines of a `--each` job, packed into one buffer.
//!
//! A job of a million input lines holds a million short strings for its whole life on the
//! server. One `String` each would cost a heap block and 24 bytes of header per line; packed,
//! a line costs its bytes and one offset. On the wire and in the journal it is a plain list of
//! strings, decoded straight into the buffer (kestrel-proto's `wire::line_list`).

use std::fmt;
use std::ops::Range;

/// A list of strings in one buffer.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct LineList {
    text: String,
    /// `ends[i]` is the end of line `i` in `text`; it starts where line `i - 1` ends.
    ends: Vec<usize>,
}

impl LineList {
    /// An empty list.
    pub fn new() -> LineList {
        LineList::default()
    }

    /// How many lines it holds.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether it holds no line.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Line `i`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.text[start..end])
    }

    /// Makes room for `lines` more lines (their offsets; the text grows as they come).
    pub fn reserve(&mut self, lines: usize) {
        self.ends.reserve(lines);
    }

    /// Appends `line` (which holds no line break).
    pub fn push(&mut self, line: &str) {
        self.text.push_str(line);
        self.ends.push(self.text.len());
    }

    /// The lines in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).expect("index below len"))
    }

    /// A copy of lines `range` (clamped to the list).
    pub fn slice(&self, range: Range<usize>) -> LineList {
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        let base = if start == 0 { 0 } else { self.ends[start - 1] };
        let stop = if end == 0 { 0 } else { self.ends[end - 1] };
        LineList {
            text: self.text[base..stop].to_string(),
            ends: self.ends[start..end].iter().map(|e| e - base).collect(),
        }
    }

    /// Splits off lines `at..`, keeping `..at`.
    pub fn split_off(&mut self, at: usize) -> LineList {
        let right = self.slice(at..self.len());
        self.truncate(at);
        right
    }

    /// Keeps the first `n` lines.
    pub fn truncate(&mut self, n: usize) {
        if n < self.len() {
            self.text
                .truncate(if n == 0 { 0 } else { self.ends[n - 1] });
            self.ends.truncate(n);
        }
    }

    /// Appends the lines of `other` from its `skip`th on.
    pub fn append_from(&mut self, other: &LineList, skip: usize) {
        for line in other.iter().skip(skip) {
            self.push(line);
        }
    }

    /// Bytes held by the lines themselves.
    pub fn text_len(&self) -> usize {
        self.text.len()
    }
}

impl<'a> FromIterator<&'a str> for LineList {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> LineList {
        let mut l = LineList::new();
        for line in iter {
            l.push(line);
        }
        l
    }
}

impl fmt::Debug for LineList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(lines: &[&str]) -> LineList {
        lines.iter().copied().collect()
    }

    #[test]
    fn lines_come_back_as_pushed_and_slice_and_split() {
        let mut l = list(&["a.fits", "", "b c.fits", "d"]);
        assert_eq!(l.len(), 4);
        assert_eq!(l.get(1), Some(""));
        assert_eq!(l.get(2), Some("b c.fits"));
        assert_eq!(l.get(4), None);
        assert_eq!(l.slice(1..3), list(&["", "b c.fits"]));
        assert_eq!(l.slice(3..9), list(&["d"]));
        let right = l.split_off(2);
        assert_eq!(
            (l, right),
            (list(&["a.fits", ""]), list(&["b c.fits", "d"]))
        );
        let mut a = list(&["x"]);
        a.append_from(&list(&["y", "z"]), 1);
        assert_eq!(a, list(&["x", "z"]));
    }
}
