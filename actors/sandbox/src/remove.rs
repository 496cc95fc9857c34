//! Removing a sandbox's folder, however deep the sandbox made its tree: iteratively, with a
//! bounded number of open descriptors, never following a link. Every removal of a sandbox
//! folder in this crate goes through [`remove_tree`].
//!
//! `std::fs::remove_dir_all` recurses once per level and holds a descriptor per level, so a
//! tree a few tens of thousands of levels deep overflows a thread's stack (aborting the
//! process) or runs out of descriptors (leaving the tree behind). [`remove_tree`] keeps the
//! levels it is in on a heap stack (each level's name, device and inode) and a directory
//! stream open for the deepest [`OPEN_LEVELS`] only. Going back up past them, it reopens the
//! parent as `..` of the child and checks it is the directory it left (device and inode): a
//! tree moved meanwhile stops the removal with an error instead of removing something else.
//! Entries are removed with `unlinkat` on the held-open parent, so a symlink goes as a link and
//! its target is untouched.
//!
//! A sandbox may leave folders its owner cannot enter, list or change (`chmod 000`); root
//! removes them anyway, a worker that is not root could not. Where permissions refuse a step
//! inside a folder of the tree that the worker owns, [`remove_tree`] gives that folder to its
//! owner (`u+rwx`) and tries once more: the folder being read (`fchmod` on its open handle),
//! and a folder to be opened through an `O_PATH` handle on it (never through a link; its mode
//! changed and then reopened through `/proc/self/fd`, so the folder changed is the folder
//! opened). A folder owned by anyone else stays as it is, and the removal fails as before.
//!
//! Blocking: call it from a blocking thread (`tokio::task::spawn_blocking`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Directory streams held open at most (one descriptor each), the deepest levels'.
pub const OPEN_LEVELS: usize = 32;

/// How directories are opened: for reading, never through a link.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// One directory the removal is in.
struct Level {
    /// Its name in its parent.
    name: CString,
    dev: u64,
    ino: u64,
    /// Its entries being read; `None` above the deepest [`OPEN_LEVELS`].
    stream: Option<Dir>,
}

/// Removes `path` and everything below it; a missing `path` is `Ok`. A symlink at `path` is
/// removed as a link. Blocking.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a path below a directory",
        ));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent_fd = match rustix::fs::open(
        parent,
        DIR_FLAGS.difference(OFlags::NOFOLLOW),
        Mode::empty(),
    ) {
        Err(Errno::NOENT) => return Ok(()),
        other => other?,
    };
    let name = CString::new(name.as_bytes())?;
    match rustix::fs::statat(&parent_fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => return Ok(()),
        Ok(stat) if FileType::from_raw_mode(stat.st_mode) != FileType::Directory => {
            return ignore_gone(rustix::fs::unlinkat(
                &parent_fd,
                name.as_c_str(),
                AtFlags::empty(),
            ));
        }
        other => drop(other?),
    }
    let (stream, dev, ino) = open_level(parent_fd.as_fd(), &name, false)?;
    let mut stack = vec![Level {
        name,
        dev,
        ino,
        stream: Some(stream),
    }];
    while let Some(level) = stack.last_mut() {
        let stream = level.stream.as_mut().expect("the deepest level is open");
        if let Some(child) = next_subdir(stream)? {
            let at = stream.fd()?;
            let (stream, dev, ino) = match open_level(at, &child, true) {
                Ok(opened) => opened,
                Err(Errno::NOENT) => continue,
                // No longer a directory (replaced meanwhile): removed as what it is now.
                Err(Errno::NOTDIR | Errno::LOOP) => {
                    ignore_gone(in_own_dir(at, || {
                        rustix::fs::unlinkat(at, child.as_c_str(), AtFlags::empty())
                    }))?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            stack.push(Level {
                name: child,
                dev,
                ino,
                stream: Some(stream),
            });
            if let Some(above) = stack.len().checked_sub(OPEN_LEVELS + 1) {
                stack[above].stream = None;
            }
            continue;
        }
        // Empty now: remove it from its parent, reopened as `..` if it was closed.
        let done = stack.pop().expect("the level just read");
        let Some(parent) = stack.last_mut() else {
            return ignore_gone(rustix::fs::unlinkat(
                &parent_fd,
                done.name.as_c_str(),
                AtFlags::REMOVEDIR,
            ));
        };
        if parent.stream.is_none() {
            let below = done
                .stream
                .as_ref()
                .expect("the deepest level is open")
                .fd()?;
            let (stream, dev, ino) = open_level(below, c"..", true)?;
            if (dev, ino) != (parent.dev, parent.ino) {
                return Err(io::Error::other(
                    "a directory was moved while its tree was being removed",
                ));
            }
            parent.stream = Some(stream);
        }
        drop(done.stream);
        let at = parent.stream.as_ref().expect("opened above").fd()?;
        ignore_gone(in_own_dir(at, || {
            rustix::fs::unlinkat(at, done.name.as_c_str(), AtFlags::REMOVEDIR)
        }))?;
    }
    Ok(())
}

/// Opens the directory `name` in `at` (never through a link): its stream, device and inode.
/// Where permissions refuse it, `at` (when `at_in_tree`) and then `name` are given to their
/// owner if that is this process ([`unlock`], [`open_unlocked`]).
fn open_level(
    at: BorrowedFd<'_>,
    name: &CStr,
    at_in_tree: bool,
) -> rustix::io::Result<(Dir, u64, u64)> {
    let open = || -> rustix::io::Result<(Dir, u64, u64)> {
        let fd: OwnedFd = rustix::fs::openat(at, name, DIR_FLAGS, Mode::empty())?;
        let stat = rustix::fs::fstat(&fd)?;
        Ok((Dir::new(fd)?, stat.st_dev, stat.st_ino))
    };
    let opened = match at_in_tree {
        true => in_own_dir(at, open),
        false => open(),
    };
    match opened {
        Err(Errno::ACCESS | Errno::PERM) => open_unlocked(at, name),
        other => other,
    }
}

/// Runs `op`, an operation on an entry of the folder `at`; where permissions refuse it and
/// [`unlock`] gave `at` to its owner, runs it once more.
fn in_own_dir<T>(
    at: BorrowedFd<'_>,
    mut op: impl FnMut() -> rustix::io::Result<T>,
) -> rustix::io::Result<T> {
    match op() {
        Err(e @ (Errno::ACCESS | Errno::PERM)) => match unlock(at)? {
            true => op(),
            false => Err(e),
        },
        other => other,
    }
}

/// Gives the folder `dir` to its owner (`u+rwx`) when that is this process and it lacks any
/// of the three; whether it changed.
fn unlock(dir: BorrowedFd<'_>) -> rustix::io::Result<bool> {
    let stat = rustix::fs::fstat(dir)?;
    if !lockable(&stat) {
        return Ok(false);
    }
    rustix::fs::fchmod(dir, Mode::from_raw_mode((stat.st_mode & 0o7777) | 0o700))?;
    Ok(true)
}

/// A folder of this process's own that lacks some of `u+rwx`.
fn lockable(stat: &rustix::fs::Stat) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::Directory
        && stat.st_uid == rustix::process::geteuid().as_raw()
        && stat.st_mode & 0o700 != 0o700
}

/// Opens the directory `name` in `at` that permissions refused: through an `O_PATH` handle
/// (which needs no permission on the folder itself, never follows a link), gives it to its
/// owner when that is this process, and reopens that handle's folder for reading through
/// `/proc/self/fd`; the device and inode opened must be the handle's.
fn open_unlocked(at: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<(Dir, u64, u64)> {
    let handle = rustix::fs::openat(
        at,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let stat = rustix::fs::fstat(&handle)?;
    if !lockable(&stat) {
        return Err(Errno::ACCESS);
    }
    let by_handle = format!("/proc/self/fd/{}", handle.as_raw_fd());
    rustix::fs::chmod(
        by_handle.as_str(),
        Mode::from_raw_mode((stat.st_mode & 0o7777) | 0o700),
    )?;
    // The magic link leads to the handle's folder itself: followed, on purpose.
    let fd = rustix::fs::open(
        by_handle.as_str(),
        DIR_FLAGS.difference(OFlags::NOFOLLOW),
        Mode::empty(),
    )?;
    let opened = rustix::fs::fstat(&fd)?;
    if (opened.st_dev, opened.st_ino) != (stat.st_dev, stat.st_ino) {
        return Err(Errno::STALE);
    }
    Ok((Dir::new(fd)?, stat.st_dev, stat.st_ino))
}

/// Reads on in `stream`, unlinking every entry that is not a directory, up to the next
/// directory: its name, or `None` at the end.
fn next_subdir(stream: &mut Dir) -> io::Result<Option<CString>> {
    while let Some(entry) = stream.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let at = stream.fd()?;
        let kind = match entry.file_type() {
            FileType::Unknown => {
                match in_own_dir(at, || {
                    rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW)
                }) {
                    Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            kind => kind,
        };
        if kind == FileType::Directory {
            return Ok(Some(name.to_owned()));
        }
        ignore_gone(in_own_dir(at, || {
            rustix::fs::unlinkat(at, name, AtFlags::empty())
        }))?;
    }
    Ok(None)
}

/// `Ok` also when the entry was gone already.
fn ignore_gone(result: rustix::io::Result<()>) -> io::Result<()> {
    match result {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `depth` directories named `d` under `root`, with a regular file and a
    /// symlink to `outside` every 1000 levels; made with `mkdirat` from held-open handles (the
    /// path is far past `PATH_MAX`).
    fn chain(root: &Path, depth: usize, outside: &Path) {
        let mut dir = rustix::fs::open(root, DIR_FLAGS, Mode::empty()).unwrap();
        for level in 0..depth {
            if level % 1000 == 0 {
                let file = rustix::fs::openat(
                    &dir,
                    c"f",
                    OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                    Mode::RUSR | Mode::WUSR,
                )
                .unwrap();
                drop(file);
                rustix::fs::symlinkat(outside, &dir, c"link").unwrap();
            }
            rustix::fs::mkdirat(&dir, c"d", Mode::RWXU).unwrap();
            dir = rustix::fs::openat(&dir, c"d", DIR_FLAGS, Mode::empty()).unwrap();
        }
    }

    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
    }

    /// A temp dir in memory where there is one: the chain's 100,000 `rmdir`s take a minute
    /// on a slow disk.
    fn fast_tempdir() -> tempfile::TempDir {
        tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap())
    }

    #[test]
    fn a_100_000_deep_chain_goes_on_a_small_stack_with_few_descriptors() {
        let tmp = fast_tempdir();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "kept").unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        chain(&tree, 100_000, &outside);

        // Watch the process's descriptors while the removal runs on a 128 KiB stack.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut peak = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    peak = peak.max(open_descriptors());
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                peak
            })
        };
        let before = open_descriptors();
        let remover = std::thread::Builder::new()
            .stack_size(128 * 1024)
            .spawn(move || remove_tree(&tree))
            .unwrap();
        let removed = remover.join().expect("no stack overflow");
        done.store(true, std::sync::atomic::Ordering::Release);
        let peak = watcher.join().unwrap();
        removed.expect("the chain is removed");

        assert!(!tmp.path().join("tree").exists());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "kept");
        assert!(
            peak <= before + OPEN_LEVELS + 64,
            "at most {OPEN_LEVELS} streams and a few more descriptors open: {peak} (from {before})"
        );
    }

    /// Set in the re-run of [`locked_folders_go_without_root`] as another user: the tree to
    /// remove.
    const LOCKED_TREE: &str = "TOOLMESH_TEST_LOCKED_TREE";
    /// Who removes the tree when the test runs as root: `nobody`, without capabilities.
    const NOBODY: u32 = 65534;

    fn mode(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Folders a sandbox locked (000, read-only, search-only, list-only), a chain deeper than
    /// [`OPEN_LEVELS`] locked at every level, and a link to a locked folder outside: a
    /// process that is not root removes the tree, and the folder outside stays as it was. As
    /// root, the test runs itself again as `nobody` (`setpriv`, util-linux), on a tree that is
    /// `nobody`'s.
    #[test]
    fn locked_folders_go_without_root() {
        use std::os::unix::fs::MetadataExt;
        if let Some(tree) = std::env::var_os(LOCKED_TREE) {
            remove_tree(Path::new(&tree)).expect("the locked tree is removed");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(outside.join("kept")).unwrap();
        let tree = tmp.path().join("tree");
        for (folder, locked) in [
            ("none", 0o000),
            ("read-only", 0o500),
            ("search-only", 0o100),
            ("list-only", 0o400),
        ] {
            let dir = tree.join(folder);
            std::fs::create_dir_all(dir.join("inner")).unwrap();
            std::fs::write(dir.join("f"), "x").unwrap();
            std::fs::write(dir.join("inner/f"), "x").unwrap();
            std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
            mode(&dir.join("inner"), locked);
            mode(&dir, locked);
        }
        let mut deep = tree.join("deep");
        let mut chain = Vec::new();
        for _ in 0..OPEN_LEVELS + 8 {
            std::fs::create_dir_all(&deep).unwrap();
            std::fs::write(deep.join("f"), "x").unwrap();
            chain.push(deep.clone());
            deep.push("d");
        }
        for dir in chain.iter().rev() {
            mode(dir, 0o000);
        }
        mode(&outside, 0o000);

        if rustix::process::geteuid().is_root() {
            let mut paths = vec![tmp.path().to_owned()];
            while let Some(path) = paths.pop() {
                std::os::unix::fs::lchown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
                if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                    paths.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                }
            }
            let test = "remove::tests::locked_folders_go_without_root";
            let ran = std::process::Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(std::env::current_exe().unwrap())
                .args(["--exact", test, "--test-threads=1", "--nocapture"])
                .env(LOCKED_TREE, &tree)
                .output()
                .expect("setpriv (util-linux) runs the test as nobody");
            assert!(
                ran.status.success(),
                "as nobody: {}{}",
                String::from_utf8_lossy(&ran.stdout),
                String::from_utf8_lossy(&ran.stderr)
            );
        } else {
            remove_tree(&tree).expect("the locked tree is removed");
        }
        assert!(!tree.exists());
        let meta = std::fs::metadata(&outside).unwrap();
        assert_eq!(
            meta.mode() & 0o7777,
            0o000,
            "the folder outside is untouched"
        );
        mode(&outside, 0o700);
        assert!(outside.join("kept").is_dir());
    }

    #[test]
    fn files_links_and_missing_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("x"), "kept").unwrap();
        // A link at the top goes as a link.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        remove_tree(&link).unwrap();
        assert!(!link.exists() && outside.join("x").exists());
        // A file, a missing path, and a wide tree with links to directories inside.
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        remove_tree(&file).unwrap();
        assert!(!file.exists());
        remove_tree(&tmp.path().join("missing")).unwrap();
        let wide = tmp.path().join("wide");
        for i in 0..50 {
            let sub = wide.join(format!("s{i}")).join("inner");
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(sub.join("f"), "x").unwrap();
            std::os::unix::fs::symlink(&outside, sub.join("l")).unwrap();
        }
        remove_tree(&wide).unwrap();
        assert!(!wide.exists());
        assert_eq!(std::fs::read_to_string(outside.join("x")).unwrap(), "kept");
    }
}
