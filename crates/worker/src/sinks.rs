//! The files a task's output goes to, from its launch to its end.
//!
//! A file of the task's own is opened (created or truncated) for the child, and removed when
//! the task leaves it empty if the launch says it belongs to this task alone.
//!
//! A file shared by several tasks (`--stdout all.txt` in an array) must hold each task's
//! output whole: two tasks on two workers writing it at once would otherwise mix their lines,
//! and `O_APPEND` alone keeps only each `write` whole, not a task's output. So the task writes
//! into a part of its own, an unnamed file in the shared file's directory (`O_TMPFILE`; a
//! named file removed at once where the file system lacks it, as NFS does), and when the task
//! has ended the part is copied to the end of the shared file under an exclusive `flock`,
//! which NFS clients pass on as a lock of the whole file. Beside the shared file, so that a
//! big output takes space where the user put it (not in a node's small `/tmp`) and copies
//! within one file system (`copy_file_range`). Unnamed, so that a worker killed meanwhile
//! leaves no debris. A shared file that is not a regular file (`/dev/stdout`, a FIFO) is
//! given to the task as it is.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The output files of one run, kept open while it runs.
#[derive(Default)]
pub(crate) struct Outputs<'a> {
    /// Stdout's and stderr's own files (one entry when they share a file), removed if left
    /// empty.
    own: [Option<(File, &'a Path)>; 2],
    /// Stdout's and stderr's shared files (one entry when they share a file).
    shared: [Option<Shared<'a>>; 2],
    /// Whether stderr goes into stdout's file: what is said of it is said of both.
    one_file: bool,
}

/// What became of a run's output files once it ended.
#[derive(Debug, Default)]
pub(crate) struct Closed {
    /// For stdout and stderr, if the file was the task's own: whether it held output (and was
    /// kept) or was left empty (and removed).
    pub(crate) own: [Option<bool>; 2],
    /// An output that could not be kept, said.
    pub(crate) lost: Option<String>,
}

/// A shared file and the part a task writes for it.
struct Shared<'a> {
    target: File,
    part: File,
    path: &'a Path,
    which: &'static str,
}

impl<'a> Outputs<'a> {
    /// Keeps a second descriptor of the own file `file` (stream `slot`: 0 stdout, 1 stderr),
    /// to tell whether the task left it empty; without one (out of descriptors) it stays.
    pub(crate) fn keep_own(&mut self, slot: usize, file: &File, path: &'a Path) {
        self.own[slot] = file.try_clone().ok().map(|f| (f, path));
    }

    /// Stderr goes into stdout's file, which is the task's own only if `own` (both streams'
    /// paths say so).
    pub(crate) fn stderr_in_stdout(&mut self, own: bool) {
        self.one_file = true;
        if !own {
            self.own[0] = None;
        }
    }

    /// Opens the shared file `path` for stream `slot` (`which` names it in errors) and returns
    /// what the child writes to: a part of its own, or the file itself if it is not a regular
    /// file. Errors are ready-made `SpawnFailed` messages.
    pub(crate) fn open_shared(
        &mut self,
        slot: usize,
        path: &'a Path,
        which: &'static str,
        cwd: Option<&Path>,
    ) -> Result<File, String> {
        let mut shared = OpenOptions::new();
        // Neither truncated (other tasks' outputs are in it) nor O_APPEND, which
        // copy_file_range refuses: the copy seeks to the end under the lock.
        shared.write(true).create(true);
        let target = open_creating_dirs(path, which, cwd, &shared)?;
        if !target.metadata().is_ok_and(|m| m.is_file()) {
            return Ok(target);
        }
        let part = part_beside(path).map_err(|e| {
            format!(
                "cannot create a file for the task's {which} beside '{}' (the shared file takes each task's output whole when it ends): {e}",
                path.display()
            )
        })?;
        let child = part
            .try_clone()
            .map_err(|e| format!("cannot open {which} file '{}': {e}", path.display()))?;
        self.shared[slot] = Some(Shared {
            target,
            part,
            path,
            which,
        });
        Ok(child)
    }

    /// The part stream `slot` writes, if it goes to a shared (regular) file.
    pub(crate) fn part(&self, slot: usize) -> Option<&File> {
        self.shared[slot].as_ref().map(|s| &s.part)
    }

    /// Once the task has ended: removes the own files it left empty and adds each part to the
    /// end of its shared file; says which own files held output, and which output could not
    /// be kept.
    pub(crate) fn close(mut self) -> Closed {
        let mut closed = Closed::default();
        for (slot, own) in self.own.iter_mut().enumerate() {
            let Some((file, path)) = own.take() else {
                continue;
            };
            let empty = file.metadata().is_ok_and(|m| m.len() == 0);
            // Closed first: unlinking a file still open costs a filesystem more (ext4 keeps
            // it on its orphan list until the last close).
            drop(file);
            if empty {
                let _ = fs::remove_file(path);
            }
            closed.own[slot] = Some(!empty);
            if self.one_file {
                closed.own[1] = Some(!empty);
            }
        }
        for s in self.shared.iter_mut().filter_map(Option::take) {
            if let Err(e) = append_whole(&s.part, &s.target) {
                let lost = format!(
                    "the task's {} could not be added to shared file '{}': {e}",
                    s.which,
                    s.path.display()
                );
                // Both streams may fail: each is said.
                closed.lost = Some(match closed.lost.take() {
                    Some(first) => format!("{first}; {lost}"),
                    None => lost,
                });
            }
        }
        closed
    }
}

/// Opens `path` with `options`; parent directories are created only if the first open says
/// they are missing, so the common case is a single `open`. A missing working directory is
/// reported as such instead of being created as a parent of the file.
pub(crate) fn open_creating_dirs(
    path: &Path,
    which: &str,
    cwd: Option<&Path>,
    options: &OpenOptions,
) -> Result<File, String> {
    let open_err = |e: io::Error| format!("cannot open {which} file '{}': {e}", path.display());
    match options.open(path) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(problem) = cwd.and_then(crate::exec::cwd_problem) {
                return Err(problem);
            }
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            // Twice: a worker removing the directory of an ended job's empty outputs may
            // take it away between the two calls (see `local::JobDef::output_dirs`).
            let mut last = e;
            for _ in 0..2 {
                if let Some(parent) = parent {
                    fs::create_dir_all(parent).map_err(|e| {
                        format!(
                            "cannot create directory '{}' for {which} file '{}': {e}",
                            parent.display(),
                            path.display()
                        )
                    })?;
                }
                match options.open(path) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => last = e,
                    other => return other.map_err(open_err),
                }
            }
            Err(open_err(last))
        }
        Err(e) => Err(open_err(e)),
    }
}

/// An unnamed file, open for reading and writing, in the directory of `path`.
fn part_beside(path: &Path) -> io::Result<File> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let unnamed = OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    match unnamed {
        Ok(f) => Ok(f),
        // The file system (NFS, or a kernel before 3.11) has no unnamed files.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) =>
        {
            named_part(dir, path)
        }
        Err(e) => Err(e),
    }
}

/// A file in `dir` named after `path` (so that one left by a worker killed between the two
/// calls says whose it is), removed at once.
fn named_part(dir: &Path, path: &Path) -> io::Result<File> {
    static PARTS: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    loop {
        let n = PARTS.fetch_add(1, Ordering::Relaxed);
        let part: PathBuf = dir.join(format!(".{name}.kestrel-part-{}-{n}", std::process::id()));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&part)
        {
            Ok(f) => {
                fs::remove_file(&part)?;
                return Ok(f);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Copies all of `part` to the end of `target` under an exclusive lock of `target`, so that
/// it lands whole, after what other tasks added. A copy cut short is taken back.
fn append_whole(part: &File, target: &File) -> io::Result<()> {
    let len = part.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let _lock = Lock::exclusive(target)?;
    let mut to = target;
    let end = to.seek(SeekFrom::End(0))?;
    let mut from = part;
    from.seek(SeekFrom::Start(0))?;
    match io::copy(&mut from, &mut to) {
        Ok(n) if n == len => Ok(()),
        Ok(n) => {
            let _ = target.set_len(end);
            Err(io::Error::other(format!(
                "copied {n} of {len} bytes; nothing was added"
            )))
        }
        Err(e) => {
            let _ = target.set_len(end);
            Err(e)
        }
    }
}

/// An exclusive `flock` on a file, released when dropped.
struct Lock<'a>(&'a File);

impl<'a> Lock<'a> {
    fn exclusive(file: &'a File) -> io::Result<Lock<'a>> {
        loop {
            // SAFETY: plain flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Lock(file));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Lock<'_> {
    fn drop(&mut self) {
        // SAFETY: plain flock on a descriptor we own.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn parts_land_whole_after_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/all.txt");
        let mut a = Outputs::default();
        let mut b = Outputs::default();
        let mut wa = a.open_shared(0, &path, "stdout", None).unwrap();
        let mut wb = b.open_shared(0, &path, "stdout", None).unwrap();
        // Interleaved writes of two tasks running at once.
        wa.write_all(b"a1\n").unwrap();
        wb.write_all(b"b1\n").unwrap();
        wa.write_all(b"a2\n").unwrap();
        wb.write_all(b"b2\n").unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "",
            "nothing before an end"
        );
        assert!(b.close().lost.is_none());
        assert!(a.close().lost.is_none());
        assert_eq!(fs::read_to_string(&path).unwrap(), "b1\nb2\na1\na2\n");
        // The parts left nothing in the directory.
        let names: Vec<_> = fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["all.txt"]);
    }

    #[test]
    fn a_named_part_is_gone_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = named_part(dir.path(), &dir.path().join("x.log")).unwrap();
        f.write_all(b"kept while open").unwrap();
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_shared_file_that_is_not_a_regular_file_is_written_as_it_is() {
        let mut o = Outputs::default();
        let dev_null = Path::new("/dev/null");
        o.open_shared(0, dev_null, "stdout", None).unwrap();
        assert!(o.shared[0].is_none());
        assert!(o.close().lost.is_none());
    }
}
