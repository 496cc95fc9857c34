//! The skills service without NATS: local skill folders as the loader and the bundle server
//! see them.

use std::path::Path;
use std::time::Duration;

use toolmesh_kernel::config::{NodeConfig, RawEnv};
use toolmesh_kernel::skills::{BundleCursor, BundleRequest};
use toolmesh_kernel::{ErrorCode, NodeId};
use toolmesh_skills::{service, SkillsSettings};

fn settings(skills_dir: &Path, data_dir: &Path, env: &[(&str, &str)]) -> SkillsSettings {
    let dir = skills_dir.display().to_string();
    let mut pairs = vec![("TOOLMESH_SKILLS_DIR", dir.as_str())];
    pairs.extend_from_slice(env);
    let config = NodeConfig::from_env(&RawEnv::from_pairs(pairs)).unwrap();
    SkillsSettings {
        node: NodeId::parse("test-node").unwrap(),
        data_dir: data_dir.to_path_buf(),
        config: config.skills,
        budget_chars: 20_000,
    }
}

#[tokio::test]
async fn local_bundles_take_regular_files_only_and_respect_caps() {
    let skills = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let root = skills.path().join("tool");
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    std::fs::write(root.join("SKILL.md"), "---\nname: tool\n---\nuse it\n").unwrap();
    std::fs::write(root.join("scripts/run.sh"), "echo\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            root.join("scripts/run.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        // A symlink out of the skill folder is never followed or sent.
        std::os::unix::fs::symlink("/etc/passwd", root.join("passwd")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
    }
    let svc = service(&settings(skills.path(), data.path(), &[])).unwrap();
    let page = tokio::time::timeout(
        Duration::from_secs(10),
        svc.bundle(BundleRequest {
            names: vec!["tool".into()],
            continue_from: None,
        }),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(page.next, None);
    assert_eq!(page.skills[0].sha256, "local");
    assert_eq!(page.skills[0].instructions.as_deref(), Some("use it\n"));
    let files: Vec<(&str, u32)> = page
        .chunks
        .iter()
        .map(|c| (c.head.path.as_str(), c.head.mode))
        .collect();
    assert_eq!(files, [("SKILL.md", 0o644), ("scripts/run.sh", 0o755)]);
    // A later page repeats the heads without instructions.
    let later = svc
        .bundle(BundleRequest {
            names: vec!["tool".into()],
            continue_from: Some(BundleCursor { file: 1, offset: 0 }),
        })
        .await
        .unwrap();
    assert_eq!(later.skills[0].instructions, None);
    assert_eq!(later.skills[0].fingerprint, page.skills[0].fingerprint);
    assert_eq!(later.chunks.len(), 1);

    // Caps apply to local folders too.
    let capped = service(&settings(
        skills.path(),
        data.path(),
        &[("TOOLMESH_SKILL_MAX_ENTRIES", "1")],
    ))
    .unwrap();
    let error = capped
        .bundle(BundleRequest {
            names: vec!["tool".into()],
            continue_from: None,
        })
        .await
        .unwrap_err();
    assert_eq!(error.code, ErrorCode::UnsafeArchive);

    // Nothing was written to the data dir for local skills.
    assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0);
}
