//! The process's limit on open files: raised at start, so that connections and tasks have
//! every descriptor the system allows, and read by those that keep a reserve of them.

/// The soft limit on open files (`RLIMIT_NOFILE`), or `fallback` if it cannot be read or is
/// unlimited.
#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
pub fn open_file_limit(fallback: u64) -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0
        || l.rlim_cur == libc::RLIM_INFINITY
    {
        return fallback;
    }
    l.rlim_cur as u64
}

/// Raises the soft limit on open files to the hard limit (the default soft limit, often 1,024,
/// is what a flood of connections or a worker with many slots runs into first). Returns the
/// limits before and after when it raised it, `None` when it was at the hard limit already or
/// could not be raised.
#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
pub fn raise_open_file_limit() -> Option<(u64, u64)> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return None;
    }
    if l.rlim_cur >= l.rlim_max {
        return None;
    }
    let before = l.rlim_cur;
    // macOS refuses a soft limit above OPEN_MAX whatever the hard limit says.
    #[cfg(target_os = "macos")]
    let want = l.rlim_max.min(10_240);
    #[cfg(not(target_os = "macos"))]
    let want = l.rlim_max;
    if want <= before {
        return None;
    }
    l.rlim_cur = want;
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
        return None;
    }
    Some((before as u64, want as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        raise_open_file_limit();
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
        #[cfg(not(target_os = "macos"))]
        assert_eq!(l.rlim_cur, l.rlim_max);
        assert!(open_file_limit(7) > 0);
    }
}
