//! The programs tests run: finding an installed server binary or a program of the tests'
//! Python venv, and what starting a server shares (its temp dir, how long it gets).

use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) fn find_binary(name: &str, package: &str) -> PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")]);
    for dir in candidates {
        let path = dir.join(name);
        if path.is_file() {
            return path;
        }
    }
    panic!("`{name}` is not installed; install it with `apt-get install -y {package}` (scripts/test does this)")
}

/// A program of the tests' Python venv (`scripts/python-venv` makes `target/venv` from
/// `tests/python/requirements.txt`): `venv_bin("python")`, `venv_bin("mcp-server-time")`.
/// `TOOLMESH_TEST_VENV` names another venv. A missing venv is a panic that says how to make it.
pub fn venv_bin(name: &str) -> PathBuf {
    let venv = std::env::var_os("TOOLMESH_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/venv"));
    let path = venv.join("bin").join(name);
    if !path.exists() {
        panic!(
            "{} is missing; run `scripts/python-venv` (scripts/test does this)",
            path.display()
        );
    }
    path
}

/// How long a server gets to say it listens.
/// Kills `child` now (a crash, not a shutdown) and reaps it; one that has exited already is
/// just reaped.
pub(crate) fn stop(child: &mut std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

pub(crate) const SERVER_START: Duration = Duration::from_secs(10);

pub(crate) fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}
