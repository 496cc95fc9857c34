//! The mirror: a worker-local copy of one session's workspace, bind-mounted as `/workspace`
//! in its sandbox, kept in step with the workspace actor over NATS (`kernel::sync`).
//!
//! Before a command, [`Mirror::pull`] brings workspace changes in; after it, [`Mirror::push`]
//! sends back what the command created, changed or deleted.
//!
//! **The local directory is hostile.** The sandbox (uid 1000 in a container) writes it and may
//! plant symlinks to anywhere, FIFOs, devices, hard links or huge files, and may swap a
//! directory for a symlink while the mirror reads. So every access goes through a
//! `cap_std::fs::Dir` opened on `local_root`: directories are entered only by
//! `open_dir_nofollow` on the handle of their parent, files are opened with `O_NOFOLLOW |
//! O_NONBLOCK` and their type is checked on the opened handle (`fstat`), sizes are capped while
//! reading, and only regular files are ever read or sent. Writes go to a fresh temp file
//! (`O_CREAT | O_EXCL`, which never follows a link) in the held-open parent, then are renamed
//! over the name — so a planted link is replaced as a link, never written through. A hard link
//! can only join files the sandbox can see already (inside the mirror), and the mirror never
//! writes into an existing file, so hard links cannot carry a write elsewhere.
//!
//! **What the mirror remembers** (`known`): for each file it synced, the workspace stamp and
//! the local stamp `(size, mtime_ns, ino)` that hold the same content. A local file whose stamp
//! differs changed in the sandbox; a workspace file whose stamp differs changed in the
//! workspace. mtimes come from a coarse clock, so a file recorded less than [`RACY_NS`] after
//! its mtime is "racy" (a rewrite of the same size within the same tick would keep its stamp):
//! its content hash is kept and compared on the next push, as git does for racily clean files.
//!
//! **Modes.** The local stamp carries the mode (`st_mode & 0o7777`), so a `chmod` in the
//! sandbox is a change: the file is sent again with its permission bits, and the workspace
//! applies them masked (`kernel::sync::applied_mode`: never setuid, setgid or sticky). A pull
//! writes each file with the workspace file's mode, masked the same way.
//!
//! **Directories** (with a workspace whose manifest lists them). The mirror remembers the
//! directories it knows on both sides (`known_dirs`). A pull creates each listed directory it
//! does not know (removing a file or link in the way: the workspace wins), and removes a known
//! directory the workspace no longer lists only if it is empty here (`rmdir` on its held-open
//! parent, which never follows a link). A push sends a `make_dir` for each local directory it
//! does not know and a `remove_dir` for each known directory that is gone here, children
//! first, after the file changes; the workspace removes one only while it is empty there, and
//! a conflict (not empty there, or a file there) leaves the workspace's state to the next pull.
//! Directories count toward `max_files`. Dirs travel in applies of their own, so a workspace of
//! an older version that refuses them still takes the file changes.
//!
//! **The walk is bounded** whatever the sandbox makes. It reads at most `max_entries` entries
//! of every kind (files, directories, links, FIFOs, skipped and non-UTF-8 names all count),
//! goes at most `max_depth` levels down and builds no path longer than [`MAX_PATH_BYTES`] (the
//! workspace refuses longer ones). It is depth first with one directory handle per level and
//! one path buffer it pushes names onto and truncates back, so its cost is linear in what it
//! reads. Past any cap, or where a directory cannot be read, the push is `truncated`: what lies
//! beyond is not synced and nothing is deleted in the workspace.
//!
//! **No file-system work on the async threads.** The walk, every local read and write and the
//! directory work run in `tokio::task::spawn_blocking` (`on_disk`) on a shared handle of the
//! mirror's root, so a sandbox's tree never stalls the other actors of the node.
//!
//! **Who wins.** The workspace: a pull overwrites a local file when the workspace changed it,
//! and a push is conditional on the workspace stamp the mirror last saw, so a file changed on
//! both sides comes back as a conflict (reported, not fatal) and the next pull brings the

//!
//! The parts: the mirror's state and limits (`state`), [`Mirror::pull`] (`pull`),
//! [`Mirror::push`] (`push`), the local walk (`walk`) and the local side's file-system work
//! (`local`).

mod local;
mod pull;
mod push;
mod state;
mod walk;

pub use local::RACY_NS;
pub use pull::PullReport;
pub use push::PushReport;
pub use state::{Mirror, SyncLimits, SANDBOX_OWNER};
pub use walk::MAX_PATH_BYTES;
