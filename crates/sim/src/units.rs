//! The quantities a scenario is written in: durations (`10ms`, `60s`, `4h`), sizes (`10MB`,
//! `1.5GB`, `512MiB`) and bandwidths (`3420Mbit/s`, `1Gbit/s`, `400MB/s`).
//!
//! Written by hand because the seeds give sizes in decimal units with fractions ("1.5 GB
//! caches") and bandwidths in bits per second ("3,420 Mb/s"), which the size crates (binary,
//! whole numbers, bytes only) do not read.

use serde::{de, Deserialize, Deserializer};
use std::fmt;

/// A span of simulated time, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Span(pub u64);

impl Span {
    /// In seconds.
    pub fn secs(self) -> f64 {
        self.0 as f64 / 1e6
    }
}

/// A number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Bytes(pub u64);

/// A rate, in bytes per second (never zero: a scenario gives none, or a positive one).
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Bandwidth(pub f64);

impl Bandwidth {
    /// Microseconds to move `bytes` at this rate (at least 1 for a non-empty move).
    pub fn time_us(self, bytes: u64) -> u64 {
        if bytes == 0 {
            return 0;
        }
        ((bytes as f64 / self.0) * 1e6).ceil().max(1.0) as u64
    }
}

/// Splits `12.5GB` into `12.5` and `GB`.
fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let sign = usize::from(s.starts_with('-'));
    let end = s[sign..]
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .map_or(s.len(), |i| i + sign);
    let number: String = s[..end].chars().filter(|&c| c != '_').collect();
    let value: f64 = number.parse().ok()?;
    value.is_finite().then_some((value, s[end..].trim()))
}

/// Parses a duration: `250us`, `10ms`, `60s`, `10m`, `4h`, `1d`, or a bare number of seconds.
pub fn parse_span(s: &str) -> Result<Span, String> {
    let bad = || format!("{s:?} is not a duration; write e.g. 10ms, 60s, 10m or 4h");
    let (v, unit) = split_number(s).ok_or_else(bad)?;
    let per = match unit {
        "" | "s" => 1e6,
        "us" | "µs" => 1.0,
        "ms" => 1e3,
        "m" | "min" => 60e6,
        "h" => 3600e6,
        "d" => 86_400e6,
        _ => return Err(bad()),
    };
    if v < 0.0 {
        return Err(format!("{s:?}: a duration cannot be negative"));
    }
    Ok(Span((v * per).round() as u64))
}

fn byte_unit(unit: &str) -> Option<f64> {
    Some(match unit {
        "" | "B" => 1.0,
        "kB" | "KB" | "K" => 1e3,
        "MB" | "M" => 1e6,
        "GB" | "G" => 1e9,
        "TB" | "T" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    })
}

/// Parses a size: `10MB`, `1.5GB` (decimal), `512MiB` (binary), `0`, or a bare number of bytes.
pub fn parse_bytes(s: &str) -> Result<Bytes, String> {
    let bad = || format!("{s:?} is not a size; write e.g. 10MB, 1.5GB or 512MiB");
    let (v, unit) = split_number(s).ok_or_else(bad)?;
    let per = byte_unit(unit).ok_or_else(bad)?;
    if v < 0.0 {
        return Err(format!("{s:?}: a size cannot be negative"));
    }
    Ok(Bytes((v * per).round() as u64))
}

/// Parses a bandwidth: `3420Mbit/s`, `1Gbit/s` (bits, decimal), `400MB/s` (bytes); the `/s`
/// may be left out. Zero and negative rates are refused: nothing could move.
pub fn parse_bandwidth(s: &str) -> Result<Bandwidth, String> {
    let bad = || format!("{s:?} is not a bandwidth; write e.g. 1Gbit/s, 3420Mbit/s or 400MB/s");
    let (v, unit) = split_number(s).ok_or_else(bad)?;
    let unit = unit.strip_suffix("/s").unwrap_or(unit);
    let bytes_per = if let Some(prefix) = unit.strip_suffix("bit") {
        let scale = match prefix {
            "" => 1.0,
            "k" | "K" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            _ => return Err(bad()),
        };
        scale / 8.0
    } else {
        byte_unit(unit).ok_or_else(bad)?
    };
    if v <= 0.0 {
        return Err(format!("{s:?}: a bandwidth must be positive"));
    }
    Ok(Bandwidth(v * bytes_per))
}

/// Deserializes with `parse` from a string, or from a number read as `unit` (`"s"`, `"B"`).
fn from_text<'de, D, T>(
    d: D,
    parse: fn(&str) -> Result<T, String>,
    unit: &str,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Str(String),
        Int(i64),
        Float(f64),
    }
    let text = match Text::deserialize(d)? {
        Text::Str(s) => s,
        Text::Int(n) => format!("{n}{unit}"),
        Text::Float(x) => format!("{x}{unit}"),
    };
    parse(&text).map_err(de::Error::custom)
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d, parse_span, "s")
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d, parse_bytes, "B")
    }
}

impl<'de> Deserialize<'de> for Bandwidth {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_text(d, parse_bandwidth, "B/s")
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.secs();
        if s >= 1.0 {
            write!(f, "{s:.1} s")
        } else {
            write!(f, "{:.1} ms", s * 1e3)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_units_read_as_written() {
        assert_eq!(parse_span("10ms"), Ok(Span(10_000)));
        assert_eq!(parse_span("60"), Ok(Span(60_000_000)));
        assert_eq!(parse_span("1.5h"), Ok(Span(5_400_000_000)));
        assert_eq!(parse_bytes("10MB"), Ok(Bytes(10_000_000)));
        assert_eq!(parse_bytes("1.5GB"), Ok(Bytes(1_500_000_000)));
        assert_eq!(parse_bytes("1MiB"), Ok(Bytes(1 << 20)));
        assert_eq!(parse_bandwidth("1Gbit/s"), Ok(Bandwidth(125e6)));
        assert_eq!(parse_bandwidth("3420Mbit"), Ok(Bandwidth(427.5e6)));
        assert_eq!(parse_bandwidth("400MB/s"), Ok(Bandwidth(400e6)));
        // 10 MB over 1 Gbit/s: 80 ms.
        assert_eq!(Bandwidth(125e6).time_us(10_000_000), 80_000);
    }

    #[test]
    fn nonsense_is_refused_saying_what_to_write() {
        for bad in ["-1s", "ten", "5 parsecs", ""] {
            assert!(parse_span(bad).is_err(), "{bad}");
        }
        assert!(parse_bytes("-3GB").unwrap_err().contains("negative"));
        assert!(parse_bandwidth("0Mbit/s").unwrap_err().contains("positive"));
        assert!(parse_bandwidth("-1Gbit").unwrap_err().contains("positive"));
        assert!(parse_bandwidth("5 furlongs")
            .unwrap_err()
            .contains("1Gbit/s"));
    }
}
