//! The documents a newcomer reads first: every relative link resolves in a clone.

use std::path::Path;

/// Relative link targets of a Markdown text: `[text](target)`, without `#anchors`; URLs
/// (`scheme:`) and pure anchors are not files.
fn relative_links(markdown: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or_default().trim();
        if !target.is_empty() && !target.contains(':') && !target.contains(' ') {
            links.push(target.to_owned());
        }
        rest = &rest[end..];
    }
    links
}

/// The Markdown files a reader meets: every `.md` at the repository's root and in `docs/`,
/// and the benchmark results.
fn documents(root: &Path) -> Vec<String> {
    let mut docs = vec!["benches/RESULTS.md".to_owned()];
    for dir in ["", "docs"] {
        let entries = std::fs::read_dir(root.join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        for entry in entries {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name.ends_with(".md") {
                docs.push(if dir.is_empty() {
                    name
                } else {
                    format!("{dir}/{name}")
                });
            }
        }
    }
    docs.sort();
    docs
}

#[test]
fn relative_links_in_the_docs_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = documents(root);
    for doc in ["README.md", "ARCHITECTURE.md", "docs/PROTOCOL.md"] {
        assert!(docs.iter().any(|d| d == doc), "{doc} is missing");
    }
    let mut checked = 0;
    for doc in &docs {
        let path = root.join(doc);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let base = path.parent().unwrap();
        for link in relative_links(&text) {
            let target = base.join(&link);
            assert!(
                target.exists(),
                "{doc} links to {link}, which is not in the repository"
            );
            // Nothing outside the repository: a clone has nothing there.
            let target = target.canonicalize().unwrap();
            assert!(
                target.starts_with(root.canonicalize().unwrap()),
                "{doc} links to {link}, outside the repository"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 10,
        "README links to the guides in docs/, ARCHITECTURE.md and benches/RESULTS.md"
    );
}

#[test]
fn links_are_found_and_urls_are_not_files() {
    assert_eq!(
        relative_links(
            "see [the contract](docs/PROTOCOL.md#tools), [NATS](https://nats.io) and [a](#b)"
        ),
        ["docs/PROTOCOL.md"]
    );
}

/// README is the front door and ARCHITECTURE.md a map (STYLE.md "Docs"): guides and per-file
/// detail go to `docs/` and `//!` docs, not back into them.
#[test]
fn readme_and_architecture_stay_short() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |name: &str| std::fs::read_to_string(root.join(name)).expect(name);
    let readme_lines = read("README.md").lines().count();
    assert!(
        readme_lines < 300,
        "README.md has {readme_lines} lines; keep it under 300"
    );
    let map_bytes = read("ARCHITECTURE.md").len();
    assert!(
        map_bytes < 40 * 1024,
        "ARCHITECTURE.md has {map_bytes} bytes; keep it under 40 KB (detail goes to //! docs)"
    );
}
