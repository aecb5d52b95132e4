//! Cutting a long list of tasks into pieces that each fit in one message.

use std::ops::Range;

/// Encoded bytes of one string in a message, at most (the string and its length prefix).
pub fn string_bytes(s: &str) -> usize {
    s.len() + 5
}

/// Encoded bytes of one task's argv in a message, at most.
pub fn argv_bytes(argv: &[String]) -> usize {
    argv.iter().map(|a| string_bytes(a)).sum::<usize>() + 5
}

/// Splits `n` tasks into consecutive index ranges of at most `max` bytes each (`size(i)` is
/// task `i`'s; a single larger task gets a range of its own); at least one range, empty if
/// `n` is 0.
pub fn piece_ranges(n: usize, max: usize, size: impl Fn(usize) -> usize) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for i in 0..n {
        let b = size(i);
        if bytes + b > max && i > start {
            ranges.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += b;
    }
    ranges.push(start..n);
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_cut_into_consecutive_pieces_under_the_limit() {
        let line = |len: usize| vec!["x".repeat(len)];
        // Each 10-byte argument costs 20 bytes: 5 fit in 100.
        let list: Vec<_> = (0..12).map(|_| line(10)).collect();
        let cut = |list: &[Vec<String>]| piece_ranges(list.len(), 100, |i| argv_bytes(&list[i]));
        assert_eq!(cut(&list), vec![0..5, 5..10, 10..12]);
        // A task bigger than the limit gets a piece of its own.
        let list = vec![line(10), line(500), line(10)];
        assert_eq!(cut(&list), vec![0..1, 1..2, 2..3]);
        // At least one piece, empty for an empty list.
        assert_eq!(cut(&[]), vec![0..0]);
    }
}
