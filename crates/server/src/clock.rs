//! The server's clock.

/// Microseconds since the Unix epoch (the core has no clock; the drivers read it here).
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
