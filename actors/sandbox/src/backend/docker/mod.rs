//! The Docker backend (bollard): one hardened, long-lived container per sandbox.
//!
//! A sandbox container runs under `docker-init` as uid 1000, with no network (unless the
//! operator named one), no capabilities, `no-new-privileges`, a read-only root, tmpfs `/tmp`
//! and `/home/sandbox`, memory/CPU/pids limits and the session's mirror directory bound at
//! `/workspace`. Its commands run in one of two ways:
//!
//! - **spawner** (the default, [`DockerBackend::with_spawner`]): the container's command is the
//!   worker's own binary as the sandbox spawner ([`super::spawner`], as in the process
//!   backend), bound read-only at [`SPAWNER_MOUNT`] and listening on a socket in the sandbox's
//!   `run` directory (bound at `/run/toolmesh`). Once the container started, the worker
//!   connects to it — the only connection it accepts, made before anything else runs there —
//!   and each command is a fork and exec by the spawner with pipes the worker made: about a
//!   millisecond instead of two Docker API calls and the daemon's exec setup (tens of ms).
//!   Commands run in the container's namespaces, cgroup and user, as with `docker exec`.
//! - **exec**: the container runs `sleep infinity` and each command is a `docker exec`
//!   (create_exec and start_exec, attached); its exit code comes from the daemon's
//!   `exec_die` event ([`ExecExits`]), or from inspect_exec when the event does not come. For
//!   images that cannot run the worker's binary (not glibc-based).
//!
//! A sandbox whose runtime cannot run the spawner ([`NO_SPAWNER_RUNTIMES`]: gVisor) runs its
//! commands in exec mode although the worker is in spawner mode.
//!
//! Ending an execution's processes in exec mode (the spawner kills by lineage itself, see
//! [`super::spawner`]): a `docker exec` process is its own session and process-group leader
//! and its children may start their own, so what ends them is a sweep of the container's
//! `/proc` (`SWEEP`, a POSIX shell function). It SIGKILLs every process whose environment
//! holds `TOOLMESH_EXEC_ID=<exec_id>`, and every *orphan* (a process re-parented to the
//! container's init, so escaped from the tree of the exec that started it) that carries no
//! marker of a command still running there, round after round until none is left (bounded),
//! which also catches forks racing the kill. A command still running is an exec's own process
//! (its parent is outside the container, so its parent pid reads 0) and the marker in its
//! environment. The sweep runs in one of two places:
//!
//! - **in the command's own exec**, when it ends by itself: every command runs under a
//!   wrapper shell (`WRAPPER`), the exec's process. It reads a nonce from the first line of its
//!   stdin (so the nonce is in no argument or environment a command can read), runs the
//!   command as its child, sweeps, and when the sweep left nothing ends its stderr with
//!   `\0toolmesh-swept:<nonce>\n`, which the backend takes off the output (`EndLine`). A
//!   command that left nothing pays one pass over `/proc/*/stat` with shell builtins; the
//!   markers of orphans and running commands are read only when there are orphans.
//! - **in a kill exec**, a second `docker exec` of the same sweep: when the kill switch is
//!   used (a timeout, a cancel, `kill_task`), and when an exec ends without its end line (its
//!   wrapper was killed, or the sweep gave up), before its end is reported. A kill exec that
//!   cannot run or does not finish within `KILL_WAIT` restarts the container instead.
//!
//! The limits of exec mode: with no subreaper of its own (the image may not run the worker's
//! binary) and every helper running as the sandbox user, dumpable,
//! - a background command's process that double forks *and* clears or changes its marker is
//!   taken for an orphan of an ended command, and killed when any other command of the
//!   sandbox ends; one that keeps its marker lives as long as its command;
//! - a leftover of an ended command that takes the marker of a command still running (execs
//!   itself with it) lives until that command ends;
//! - a command that reads its wrapper's memory or traces it (the same uid) can forge the end
//!   line without the sweep, and a leftover can stop or trace a kill exec; what it left then
//!   lives until a sweep it did not subvert: any other command's end, or a kill.
//!
//! The parts: [`DockerBackend`] and its [`Backend`](super::Backend) implementation
//! (`backend`), a container's settings and folders (`container`), spawner mode (`connect`),
//! exec mode (`exec`), its sweep and kill exec (`sweep`), and what they share (`common`).
//!
//! [`SPAWNER_MOUNT`]: super::spawner::SPAWNER_MOUNT
//! [`ExecExits`]: super::exits::ExecExits

mod backend;
mod common;
mod connect;
mod container;
mod exec;
mod sweep;

pub use backend::DockerBackend;
pub use common::{
    container_name, runs_spawner, EXEC_ID_VAR, NO_SPAWNER_RUNTIMES, OUTPUT_CHANNEL, SANDBOX_GID,
    SANDBOX_UID,
};
pub use container::prepare_workspace;
