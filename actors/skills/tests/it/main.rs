//! The skills service without NATS: local skill folders as the loader and the bundle server
//! see them.

use std::path::Path;
use std::time::Duration;

use toolmesh_kernel::config::RawEnv;
use toolmesh_kernel::skills::{BundleCursor, BundleRequest};
use toolmesh_kernel::{ErrorCode, NodeId};
use toolmesh_skills::{service, SkillsSettings};

fn settings(skills_dir: &Path, data_dir: &Path, env: &[(&str, &str)]) -> SkillsSettings {
    let dir = skills_dir.display().to_string();
    let mut pairs = vec![("TOOLMESH_SKILLS_DIR", dir.as_str())];
    pairs.extend_from_slice(env);
    let config = toolmesh_skills::SkillsConfig::from_env(&RawEnv::from_pairs(pairs)).unwrap();
    SkillsSettings {
        node: NodeId::parse("test-node").unwrap(),
        data_dir: data_dir.to_path_buf(),
        config,
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
            heads_only: false,
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
            heads_only: false,
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
            heads_only: false,
        })
        .await
        .unwrap_err();
    assert_eq!(error.code, ErrorCode::UnsafeArchive);

    // Nothing was written to the data dir for local skills.
    assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0);
}

mod egress {
    //! Skill downloads under the egress policy, against real HTTP servers: a Skill Service
    //! and an archive host on 127.0.0.1 (two ports), and a redirector on 127.0.0.2.

    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use toolmesh_kernel::{ErrorCode, ToolError};
    use toolmesh_skills::archive::ZipBuilder;
    use toolmesh_skills::catalog::SkillManifest;
    use toolmesh_skills::service as skills_service;
    use toolmesh_skills::service::{RunningService, ServedSkill, ServiceCatalog, ServiceOptions};

    use super::settings;

    const SPACE: &str = "space";

    /// Answers every request with `302 Found`: `/goto?<url>` to `<url>`, `/home/<path>` to
    /// `<path>` under the `home` URL set after start; records the targets.
    struct Redirector {
        addr: std::net::SocketAddr,
        seen: Arc<Mutex<Vec<String>>>,
        home: Arc<Mutex<String>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Redirector {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Redirector {
        async fn start(addr: &str) -> Redirector {
            let listener = TcpListener::bind(addr)
                .await
                .expect("bind 127.0.0.2 (Linux routes 127.0.0.0/8 to loopback)");
            let addr = listener.local_addr().unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let home = Arc::new(Mutex::new(String::new()));
            let (log, base) = (seen.clone(), home.clone());
            let task = tokio::spawn(async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    let log = log.clone();
                    let base = base.lock().unwrap().clone();
                    tokio::spawn(async move {
                        let mut buf = Vec::new();
                        let mut chunk = [0u8; 4096];
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let head = String::from_utf8_lossy(&buf);
                        let target = head.split(' ').nth(1).unwrap_or("").to_owned();
                        let location = match target.strip_prefix("/home") {
                            Some(path) => format!("{base}{path}"),
                            None => target.split_once('?').map_or("", |(_, q)| q).to_owned(),
                        };
                        log.lock().unwrap().push(target);
                        let reply = format!(
                            "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                        let _ = stream.write_all(reply.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    });
                }
            });
            Redirector {
                addr,
                seen,
                home,
                task,
            }
        }

        fn goto(&self, url: &str) -> String {
            format!("http://{}/goto?{url}", self.addr)
        }

        fn home(&self, path: &str) -> String {
            format!("http://{}/home{path}", self.addr)
        }

        fn seen(&self) -> Vec<String> {
            self.seen.lock().unwrap().clone()
        }
    }

    fn skill(name: &str) -> ServedSkill {
        let md = format!("---\nname: {name}\ndescription: the {name} skill\n---\n{name} here\n");
        let mut zip = ZipBuilder::new();
        zip.file("SKILL.md", md.as_bytes());
        ServedSkill::new(
            SkillManifest {
                version: "1.0.0".into(),
                ..SkillManifest::new(name)
            },
            zip.finish(),
        )
    }

    struct Servers {
        service: RunningService,
        archive_host: RunningService,
        redirector: Redirector,
    }

    /// The Skill Service lists `own` (its archive on the service's origin), `elsewhere` (on
    /// the archive host, another loopback port), `redirected` (on the redirector, which
    /// sends the client to the archive host) and `home` (on the redirector, which sends the
    /// client back to the service's own origin).
    async fn servers() -> Servers {
        let mut hosted = ServiceCatalog::default();
        hosted.add(SPACE, skill("elsewhere"));
        hosted.add(SPACE, skill("redirected"));
        let archive_host = RunningService::start(hosted, ServiceOptions::default())
            .await
            .unwrap();
        let redirector = Redirector::start("127.0.0.2:0").await;
        let mut catalog = ServiceCatalog::default();
        catalog.add(SPACE, skill("own"));
        let mut elsewhere = skill("elsewhere");
        elsewhere.archive_url = Some(format!(
            "{}/archives/{SPACE}/elsewhere.zip",
            archive_host.url()
        ));
        catalog.add(SPACE, elsewhere);
        let mut redirected = skill("redirected");
        redirected.archive_url = Some(redirector.goto(&format!(
            "{}/archives/{SPACE}/redirected.zip",
            archive_host.url()
        )));
        catalog.add(SPACE, redirected);
        let mut home = skill("home");
        home.archive_url = Some(redirector.home(&format!("/archives/{SPACE}/home.zip")));
        catalog.add(SPACE, home);
        let service = RunningService::start(catalog, ServiceOptions::default())
            .await
            .unwrap();
        *redirector.home.lock().unwrap() = service.url();
        Servers {
            service,
            archive_host,
            redirector,
        }
    }

    async fn load(s: &Servers, allowed: Option<&str>, name: &str) -> Result<String, ToolError> {
        let skills = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let url = s.service.url();
        let mut env = vec![
            ("TOOLMESH_SKILL_SERVICE_URL", url.as_str()),
            ("TOOLMESH_SKILL_SPACE_IDS", SPACE),
        ];
        if let Some(allowed) = allowed {
            env.push(("TOOLMESH_SKILL_ALLOWED_NETWORKS", allowed));
        }
        let svc = skills_service(&settings(skills.path(), data.path(), &env)).unwrap();
        let catalog = svc.catalog().await;
        assert!(catalog.warnings.is_empty(), "{:?}", catalog.warnings);
        let skill = catalog.get(name).expect("the skill is listed");
        let loaded = svc.loader.load(skill).await?;
        Ok(loaded.doc.instructions)
    }

    fn reason(result: Result<String, ToolError>) -> String {
        let error = result.expect_err("the download is refused");
        assert_eq!(error.code, ErrorCode::BlockedUrl, "{error}");
        error.details["reason"].as_str().unwrap().to_owned()
    }

    fn archive_requests(s: &Servers) -> usize {
        s.archive_host.requests().len()
    }

    #[tokio::test]
    async fn downloads_reach_the_service_origin_and_nothing_else_inward() {
        let s = servers().await;
        // The service's own origin is loopback, and reachable.
        assert_eq!(load(&s, None, "own").await.unwrap(), "own here\n");
        // Another port of the same loopback address is not the service.
        assert_eq!(
            reason(load(&s, None, "elsewhere").await),
            "loopback address 127.0.0.1"
        );
        // The redirector itself is refused before it is asked.
        assert_eq!(
            reason(load(&s, None, "redirected").await),
            "loopback address 127.0.0.2"
        );
        assert!(s.redirector.seen().is_empty(), "{:?}", s.redirector.seen());
        assert_eq!(archive_requests(&s), 0);
    }

    #[tokio::test]
    async fn every_redirect_is_checked_again() {
        let s = servers().await;
        // The redirector's network is allowed; where it redirects to is not.
        assert_eq!(
            reason(load(&s, Some("127.0.0.2/32"), "redirected").await),
            "redirect 1 leads to loopback address 127.0.0.1"
        );
        assert_eq!(s.redirector.seen().len(), 1);
        assert_eq!(archive_requests(&s), 0, "the redirect was followed inward");
        // A redirect back to the service's own origin is followed.
        assert_eq!(
            load(&s, Some("127.0.0.2/32"), "home").await.unwrap(),
            "home here\n"
        );
    }

    #[tokio::test]
    async fn the_allow_list_opens_named_networks() {
        let s = servers().await;
        let all = Some("127.0.0.0/8");
        assert_eq!(
            load(&s, all, "elsewhere").await.unwrap(),
            "elsewhere here\n"
        );
        assert_eq!(
            load(&s, all, "redirected").await.unwrap(),
            "redirected here\n"
        );
        assert_eq!(archive_requests(&s), 2);
        let bad = tempfile::tempdir().unwrap();
        let error = skills_service(&settings(
            bad.path(),
            bad.path(),
            &[("TOOLMESH_SKILL_ALLOWED_NETWORKS", "not-a-network")],
        ))
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("TOOLMESH_SKILL_ALLOWED_NETWORKS"),
            "{error}"
        );
    }
}
