//! Each sandbox's own disk (`TOOLMESH_SANDBOX_DISK_MB`): a sparse ext4 image inside the
//! sandbox's folder, loop-mounted over that very folder, so that everything the sandbox and
//! its worker keep there (the workspace copy, the skills, the spawner's run directory, spooled
//! output) lives on a filesystem of the quota's size, enforced by the kernel. A command that
//! writes past it gets `ENOSPC` ("No space left on device") inside the sandbox; the host's disk
//! holds only the blocks written, never more than the quota.
//!
//! The image (`<folder>/disk.img`) sits under its own mount: the loop device holds it open,
//! and once the folder is unmounted the folder holds the image alone, so removing the folder
//! removes it (cheaply: one file however many the sandbox made). Unmounting must therefore
//! come before any removal of a folder that may hold sandboxes ([`unmount_below`]); a mount
//! still busy is detached lazily. `mount -o loop` sets the loop device to clear itself once
//! the filesystem's last user is gone.
//!
//! The mounts are the worker's, in its mount namespace: the Docker daemon must share it (it
//! binds the workspace into the container by its path) — a worker on the host, or one in a
//! container whose sandbox directory is bound `rshared` from a shared mount of the host
//! ([`plan`] checks which). Where neither holds, the quota is kept only if
//! `TOOLMESH_SANDBOX_DISK_REQUIRED` is off: then the worker runs without one and says so in
//! its log and in `sandbox_status` (compose's default, so that `up` works on any host).
//!
//! Everything here blocks (file system work and child processes): call it from
//! `spawn_blocking`.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use toolmesh_kernel::{ErrorCode, ToolError};

/// The variable that sets the size.
pub const DISK_VAR: &str = "TOOLMESH_SANDBOX_DISK_MB";
/// The image's name inside the folder it is mounted over.
pub const IMAGE_NAME: &str = "disk.img";

/// Gives `folder` (which must exist) a disk of `mb` MiB: a new sparse image inside it, made
/// ext4 (no journal, no reserved blocks, lazily initialised) and mounted over the folder
/// (`nosuid,nodev,noatime`). On failure nothing is left mounted and the image is gone.
pub fn attach(folder: &Path, mb: u64) -> io::Result<()> {
    let image = folder.join(IMAGE_NAME);
    let bytes = mb
        .checked_mul(1024 * 1024)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "disk size overflows"))?;
    let made = (|| {
        std::fs::File::create_new(&image)?.set_len(bytes)?;
        run(Command::new(program("mkfs.ext4"))
            .args([
                "-q",
                "-F",
                "-m",
                "0",
                "-O",
                "^has_journal",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
            ])
            .arg(&image))?;
        run(Command::new(program("mount"))
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev,noatime"])
            .arg(&image)
            .arg(folder))
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&image);
    }
    made
}

/// Whether `path` is a mount point of this mount namespace.
pub fn is_mounted(path: &Path) -> io::Result<bool> {
    let resolved = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    Ok(mounts_below(path)?.contains(&resolved))
}

/// Unmounts everything mounted at or below `path` (deepest first), lazily where a mount is
/// busy; returns how many. A path that does not exist has none.
pub fn unmount_below(path: &Path) -> io::Result<usize> {
    let mut mounts = mounts_below(path)?;
    // Deepest first: a mount inside another goes before it.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for mount in &mounts {
        let flags = rustix::mount::UnmountFlags::NOFOLLOW;
        match rustix::mount::unmount(mount, flags) {
            Ok(()) => {}
            // Gone meanwhile (another reaper, or a lazy unmount that took its children).
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {}
            Err(rustix::io::Errno::BUSY) => {
                rustix::mount::unmount(mount, flags | rustix::mount::UnmountFlags::DETACH)
                    .map_err(|e| {
                        io::Error::other(format!("unmounting {}: {e}", mount.display()))
                    })?;
            }
            Err(e) => {
                return Err(io::Error::other(format!(
                    "unmounting {}: {e}",
                    mount.display()
                )))
            }
        }
    }
    Ok(mounts.len())
}

/// Checks once, at the worker's start, that it can give sandboxes a disk: makes, mounts and
/// removes a small one in `dir` (the sandbox directory). `Err` is the whole message for the
/// operator, naming [`DISK_VAR`] and `0` as the way out.
pub fn probe(dir: &Path, mb: u64) -> Result<(), String> {
    let folder = dir.join(format!(".disk-check-{}", uuid::Uuid::new_v4().simple()));
    let checked = std::fs::create_dir_all(&folder)
        .and_then(|()| attach(&folder, 1))
        .and_then(|()| unmount_below(&folder).map(drop));
    let _ = unmount_below(&folder);
    let _ = std::fs::remove_dir_all(&folder);
    checked.map_err(|e| {
        format!(
            "{DISK_VAR}={mb} gives each sandbox a disk of its own (a loop-mounted ext4 image in \
             its folder of {}), which this worker cannot make: {e}. Run the worker as root with \
             CAP_SYS_ADMIN and loop devices (/dev/loop-control, mkfs.ext4 from e2fsprogs), or set \
             {DISK_VAR}=0 to keep each sandbox's files in a plain folder on the host's disk, \
             without a quota",
            dir.display()
        )
    })
}

/// What a worker keeps of the quota asked for: the size every sandbox's disk gets (0: none)
/// and, when the quota asked for could not be kept, why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskPlan {
    pub mb: u64,
    pub note: Option<String>,
}

/// Settles the quota at the worker's start: `mb` MiB when this worker can make disks the
/// Docker daemon sees ([`shares_mounts_with_daemon`], [`probe`]), else `Err` naming the way
/// out when `required`, or no quota and a [`DiskPlan::note`] saying why when not.
pub fn plan(dir: &Path, mb: u64, required: bool) -> Result<DiskPlan, String> {
    if mb == 0 {
        return Ok(DiskPlan::default());
    }
    let kept = shares_mounts_with_daemon(dir).and_then(|()| probe(dir, mb));
    match kept {
        Ok(()) => Ok(DiskPlan { mb, note: None }),
        Err(why) if required => Err(format!(
            "{why} (or set TOOLMESH_SANDBOX_DISK_REQUIRED=0 to run without the quota where it \
             cannot be kept)"
        )),
        Err(why) => Ok(DiskPlan {
            mb: 0,
            note: Some(format!(
                "no disk quota: {DISK_VAR}={mb} asks for one, but {why}. Each sandbox's files \
                 are a plain folder on the host's disk (TOOLMESH_SANDBOX_DISK_REQUIRED=0)"
            )),
        }),
    }
}

/// Whether the Docker daemon sees the mounts this worker makes under `dir`: when the daemon
/// (`dockerd`, visible in this worker's process table) shares this worker's mount namespace
/// (a worker on the host, or beside the daemon in one container), or when the mount holding
/// `dir` is shared (`shared:` in `/proc/self/mountinfo`: bound `rshared` from a shared mount of
/// the host, as a worker in a container of its own needs). Where no daemon is visible, a worker
/// outside any container (`/.dockerenv`, `/run/.containerenv`) is taken to share the host's.
/// `Err` says what to change.
pub fn shares_mounts_with_daemon(dir: &Path) -> Result<(), String> {
    match daemon_shares_namespace() {
        Some(true) => return Ok(()),
        None if !in_container() => return Ok(()),
        Some(false) | None => {}
    }
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo cannot be read: {e}"))?;
    let resolved = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    match mount_holding(&table, &resolved) {
        Some((_, true)) => Ok(()),
        Some((mount, false)) => Err(format!(
            "this worker does not share the Docker daemon's mounts and its mount of {} (at {}) \
             is not shared, so the daemon would not see a sandbox's disk; bind the folder `rshared` \
             (TOOLMESH_SANDBOX_DIR_PROPAGATION=rshared in compose) from a shared mount of the \
             host (docs/operations.md)",
            dir.display(),
            mount.display()
        )),
        None => Err(format!("no mount holds {}", dir.display())),
    }
}

/// Whether a Docker daemon this process can see runs in its mount namespace; `None` when
/// none is visible (another pid namespace, or no daemon on this host).
fn daemon_shares_namespace() -> Option<bool> {
    let own = std::fs::read_link("/proc/self/ns/mnt").ok()?;
    let daemons: Vec<_> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "dockerd")
        })
        .filter_map(|e| std::fs::read_link(e.path().join("ns/mnt")).ok())
        .collect();
    (!daemons.is_empty()).then(|| daemons.contains(&own))
}

/// The mount point holding `path` (the longest one it is under) in a mountinfo table, and
/// whether that mount is shared.
fn mount_holding(table: &str, path: &Path) -> Option<(PathBuf, bool)> {
    table
        .lines()
        .zip(parse_mountinfo(table))
        .filter(|(_, point)| path.starts_with(point))
        .max_by_key(|(_, point)| point.components().count())
        .map(|(line, point)| {
            // Optional fields run from the seventh field to the lone "-".
            let shared = line
                .split(' ')
                .skip(6)
                .take_while(|f| *f != "-")
                .any(|f| f.starts_with("shared:"));
            (point, shared)
        })
}

/// Whether an error says the disk (or a quota) is full.
pub fn is_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// The error of a sync that finds the sandbox's disk full while writing `path` into it.
pub fn full_error(path: &str) -> ToolError {
    ToolError::new(
        ErrorCode::LimitExceeded,
        format!(
            "the sandbox's disk is full: the workspace file {path} does not fit into /workspace \
             (the sandbox's files, the workspace copy included, live on a disk of \
             {DISK_VAR} MiB); delete files from the workspace, or ask the operator to raise \
             {DISK_VAR}. The command did not run"
        ),
    )
    .with("limit", DISK_VAR)
    .with("path", path)
}

/// Mount points of this mount namespace at or below `path`.
fn mounts_below(path: &Path) -> io::Result<Vec<PathBuf>> {
    // The table names mount points by their resolved paths.
    let path = match path.canonicalize() {
        Ok(path) => path,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(_) => path.to_owned(),
    };
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mountinfo(&table)
        .into_iter()
        .filter(|m| m.starts_with(&path))
        .collect())
}

/// The mount points of a `/proc/self/mountinfo` text (its fifth field, octal escapes undone).
fn parse_mountinfo(table: &str) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| {
            let raw = field.as_bytes();
            let mut out = Vec::with_capacity(raw.len());
            let mut i = 0;
            while i < raw.len() {
                let octal = raw.get(i + 1..i + 4).and_then(|d| {
                    std::str::from_utf8(d)
                        .ok()
                        .and_then(|d| u8::from_str_radix(d, 8).ok())
                });
                match (raw[i], octal) {
                    (b'\\', Some(byte)) => {
                        out.push(byte);
                        i += 4;
                    }
                    (byte, _) => {
                        out.push(byte);
                        i += 1;
                    }
                }
            }
            PathBuf::from(std::ffi::OsString::from_vec(out))
        })
        .collect()
}

/// Runs a helper to its end; `Err` with its standard error when it fails.
fn run(command: &mut Command) -> io::Result<()> {
    let out = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{:?}: {e}", command.get_program())))?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{} failed ({}): {}",
        Path::new(command.get_program()).display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// A system program by its usual place (a worker's PATH may lack the sbin folders), else by
/// name.
fn program(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Whether this process runs in a container (Docker's `/.dockerenv`, Podman's
/// `/run/.containerenv`).
pub(crate) fn in_container() -> bool {
    ["/.dockerenv", "/run/.containerenv"]
        .iter()
        .any(|marker| std::path::Path::new(marker).exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_mount_points_are_unescaped() {
        let table = "36 25 7:0 / /tmp/a\\040b rw,nosuid - ext4 /dev/loop0 rw\n\
                     37 25 0:5 / /proc rw - proc proc rw\n";
        assert_eq!(
            parse_mountinfo(table),
            [PathBuf::from("/tmp/a b"), PathBuf::from("/proc")]
        );
    }

    #[test]
    fn the_mount_holding_a_path_tells_whether_it_is_shared() {
        let table = "22 1 0:21 / / rw,relatime shared:1 - overlay overlay rw\n\
                     40 22 8:1 /srv /var/lib/toolmesh-sandboxes rw master:3 - ext4 /dev/sda1 rw\n\
                     41 22 8:1 /srv2 /var/lib/shared rw shared:7 master:3 - ext4 /dev/sda1 rw\n";
        let at = |p: &str| mount_holding(table, Path::new(p));
        assert_eq!(
            at("/var/lib/toolmesh-sandboxes/n1"),
            Some((PathBuf::from("/var/lib/toolmesh-sandboxes"), false))
        );
        assert_eq!(
            at("/var/lib/shared/x"),
            Some((PathBuf::from("/var/lib/shared"), true))
        );
        assert_eq!(at("/tmp"), Some((PathBuf::from("/"), true)));
    }

    #[test]
    fn no_quota_asked_is_a_plain_folder_without_a_note() {
        assert_eq!(
            plan(Path::new("/nonexistent"), 0, true),
            Ok(DiskPlan::default())
        );
    }

    #[test]
    fn a_quota_that_cannot_be_kept_stops_the_role_or_is_noted() {
        // A folder under a file: no disk can be made there, as root or not.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let at = file.join("sandboxes");
        let refused = plan(&at, 8, true).unwrap_err();
        assert!(
            refused.contains("TOOLMESH_SANDBOX_DISK_REQUIRED=0"),
            "{refused}"
        );
        let noted = plan(&at, 8, false).unwrap();
        assert_eq!(noted.mb, 0);
        let note = noted.note.unwrap();
        assert!(
            note.starts_with("no disk quota: TOOLMESH_SANDBOX_DISK_MB=8"),
            "{note}"
        );
    }

    #[test]
    fn only_the_disk_errors_are_full() {
        assert!(is_full(&io::Error::from_raw_os_error(28)));
        assert!(is_full(&io::Error::from_raw_os_error(122)));
        assert!(!is_full(&io::Error::from_raw_os_error(13)));
    }

    /// As root only (tests run as root here): a disk is mounted over its folder, holds no
    /// more than its size, and goes with one unmount, leaving the image alone in the folder.
    #[test]
    fn a_disk_holds_its_size_and_unmounts() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("sbx");
        std::fs::create_dir(&folder).unwrap();
        attach(&folder, 8).unwrap();
        assert!(is_mounted(&folder).unwrap());
        let big = std::fs::File::create(folder.join("big")).unwrap();
        let written = std::io::Write::write_all(&mut &big, &vec![1u8; 9 * 1024 * 1024]);
        assert!(is_full(&written.unwrap_err()));
        assert_eq!(unmount_below(dir.path()).unwrap(), 1);
        assert!(!is_mounted(&folder).unwrap());
        drop(big);
        let left: Vec<_> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [IMAGE_NAME]);
        use std::os::unix::fs::MetadataExt;
        let image = std::fs::metadata(folder.join(IMAGE_NAME)).unwrap();
        assert!(image.blocks() * 512 <= 8 * 1024 * 1024, "{image:?}");
    }
}
