//! Skills bound into a sandbox for `execute_skills`: the bundles the skill loader sends
//! (`kernel::skills`) are written under the sandbox's skills directory, which the sandbox sees
//! read-only at `/skills/<name>/`.
//!
//! The worker writes; the sandbox only reads (a read-only bind). Each skill is written whole
//! into a temporary directory and renamed into place, so a command never sees half a skill.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use toolmesh_kernel::skills::{is_skill_name, SkillBundle, LOCAL_SHA256};
use toolmesh_kernel::ToolError;

/// Written beside a skill's files: which archive it came from, so an unchanged remote skill is
/// not rewritten for every run.
const MARKER: &str = ".toolmesh-skill";

/// Why the skills could not be written into a sandbox. Every one is `internal`: the bundle
/// came from the skills actor, which checks names and paths, and the folder is the worker's.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The skill loader sent a name or a file path that is not one plain relative path.
    #[error("the skill loader sent an unusable bundle for {name:?}: {why}")]
    UnusableBundle { name: String, why: String },
    /// The worker's file system failed.
    #[error("cannot write skill {name:?} into the sandbox: {source}")]
    Write {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// The blocking task running [`install`] panicked or was cancelled.
    #[error("installing skills: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// `internal` with the sentence of the error; the log line keeps its cause.
impl From<InstallError> for ToolError {
    fn from(e: InstallError) -> Self {
        ToolError::internal_logged(&e, "cannot install skills into a sandbox")
    }
}

fn unsafe_bundle(name: &str, why: impl std::fmt::Display) -> InstallError {
    InstallError::UnusableBundle {
        name: name.to_owned(),
        why: why.to_string(),
    }
}

/// A bundle path as a relative path with plain components only.
fn relative(name: &str, path: &str) -> Result<PathBuf, InstallError> {
    let p = Path::new(path);
    if path.is_empty() || path.contains('\0') || p.is_absolute() {
        return Err(unsafe_bundle(name, format!("bad file path {path:?}")));
    }
    let mut out = PathBuf::new();
    for part in p.components() {
        match part {
            Component::Normal(part) => out.push(part),
            _ => return Err(unsafe_bundle(name, format!("bad file path {path:?}"))),
        }
    }
    Ok(out)
}

fn io(name: &str, source: std::io::Error) -> InstallError {
    InstallError::Write {
        name: name.to_owned(),
        source,
    }
}

/// Writes `bundles` under `skills_dir` (blocking file work; call from a blocking thread).
pub fn install(skills_dir: &Path, bundles: &[SkillBundle]) -> Result<(), InstallError> {
    for bundle in bundles {
        let name = bundle.name.as_str();
        if !is_skill_name(name) {
            return Err(unsafe_bundle(name, "not a skill name"));
        }
        let target = skills_dir.join(name);
        let stamp = format!("{}\n{}\n", bundle.sha256, bundle.version);
        if bundle.sha256 != LOCAL_SHA256
            && std::fs::read_to_string(target.join(MARKER)).is_ok_and(|s| s == stamp)
        {
            continue;
        }
        let staging = skills_dir.join(format!(".staging-{name}-{}", uuid::Uuid::new_v4().simple()));
        let written = write_skill(&staging, bundle, &stamp);
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
        // Replace the previous copy, if any (a stale one is removed first: rename cannot
        // replace a non-empty directory).
        if target.exists() {
            let old = skills_dir.join(format!(".old-{name}-{}", uuid::Uuid::new_v4().simple()));
            std::fs::rename(&target, &old).map_err(|e| io(name, e))?;
            let _ = std::fs::remove_dir_all(&old);
        }
        std::fs::rename(&staging, &target).map_err(|e| io(name, e))?;
    }
    Ok(())
}

fn write_skill(staging: &Path, bundle: &SkillBundle, stamp: &str) -> Result<(), InstallError> {
    let name = bundle.name.as_str();
    std::fs::create_dir_all(staging).map_err(|e| io(name, e))?;
    std::fs::set_permissions(staging, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| io(name, e))?;
    for file in &bundle.files {
        let rel = relative(name, &file.path)?;
        let path = staging.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(name, e))?;
        }
        // Readable by the sandbox's user; executable bits kept; nothing else.
        let mode = 0o644 | (file.mode & 0o111);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .map_err(|e| io(name, e))?;
        out.write_all(&file.bytes).map_err(|e| io(name, e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io(name, e))?;
    }
    std::fs::write(staging.join(MARKER), stamp).map_err(|e| io(name, e))?;
    // Directories made above follow the umask; make every one listable by the sandbox.
    for dir in walk_dirs(staging) {
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
    }
    Ok(())
}

fn walk_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if let Ok(entries) = std::fs::read_dir(&out[i]) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(entry.path());
                }
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use toolmesh_kernel::skills::SkillFile;

    fn bundle(name: &str, files: &[(&str, &str, u32)]) -> SkillBundle {
        SkillBundle {
            name: name.into(),
            version: "1".into(),
            sha256: "abc".into(),
            space_id: "local".into(),
            instructions: None,
            files: files
                .iter()
                .map(|(p, c, m)| SkillFile {
                    path: (*p).into(),
                    mode: *m,
                    bytes: Bytes::from(c.to_string()),
                })
                .collect(),
        }
    }

    #[test]
    fn skills_are_written_whole_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        install(
            dir.path(),
            &[bundle(
                "demo",
                &[
                    ("SKILL.md", "# demo", 0o644),
                    ("bin/run.sh", "echo", 0o4755),
                ],
            )],
        )
        .unwrap();
        let run = dir.path().join("demo/bin/run.sh");
        assert_eq!(std::fs::read_to_string(&run).unwrap(), "echo");
        let mode = std::fs::metadata(&run).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755, "exec bits kept, setuid dropped");
        let mut next = bundle("demo", &[("SKILL.md", "# demo 2", 0o644)]);
        next.sha256 = "def".into();
        install(dir.path(), &[next]).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("demo/SKILL.md")).unwrap(),
            "# demo 2"
        );
        assert!(!run.exists(), "the old copy is gone");
    }

    #[test]
    fn paths_that_climb_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/x", "a/../../x", ""] {
            assert!(
                install(dir.path(), &[bundle("demo", &[(bad, "x", 0o644)])]).is_err(),
                "{bad}"
            );
        }
        assert!(install(dir.path(), &[bundle("../up", &[("a", "x", 0o644)])]).is_err());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "nothing left behind"
        );
    }
}
