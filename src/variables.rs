//! The configuration reference: every table of variables gathered ([`TABLES`]), and
//! `docs/configuration.md` rendered from them ([`render`]).
//!
//! The tests hold the file to the tables (`UPDATE_DOCS=1` rewrites it) and the tables to the
//! sources: every `"TOOLMESH_…"` name the code reads is listed, and every name listed is read.

use std::fmt::Write as _;

use toolmesh_kernel::settings::{Component, Variable};

/// Every table, each declared beside the code that reads its variables.
pub const TABLES: &[&[Variable]] = &[
    toolmesh_kernel::config::VARIABLES,
    toolmesh_gateway::variables::VARIABLES,
    toolmesh_approval::variables::VARIABLES,
    toolmesh_skills::variables::VARIABLES,
    toolmesh_sandbox::variables::VARIABLES,
    toolmesh_web::variables::VARIABLES,
    toolmesh_bridge::variables::VARIABLES,
    toolmesh_mcp::variables::VARIABLES,
    toolmesh_console::variables::VARIABLES,
    VARIABLES,
];

/// Every variable, table by table.
pub fn all() -> impl Iterator<Item = &'static Variable> {
    TABLES.iter().flat_map(|table| table.iter())
}

/// The variables the binary itself reads: the runtime, the log, traces, the command line.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TOOLMESH_WORKER_THREADS",
        component: Component::Node,
        default: "`0`",
        description: "`0`: the node runs on one thread; `n`: on a multi-thread runtime of `n` \
                      workers.",
    },
    Variable {
        name: "TOOLMESH_LOG_FORMAT",
        component: Component::Telemetry,
        default: "`text`",
        description: "`json`: the log on stderr is JSON lines; `text`: lines for a person.",
    },
    Variable {
        name: "RUST_LOG",
        component: Component::Telemetry,
        default: "unset (`info` for a node, `warn` for client commands)",
        description: "Log levels, in `tracing-subscriber`'s `EnvFilter` syntax \
                      (`info,toolmesh_sandbox=debug`). It sets the log only: spans of toolmesh \
                      at level INFO and above are exported whatever it says.",
    },
    Variable {
        name: "NO_COLOR",
        component: Component::Telemetry,
        default: "unset (colours on a terminal only)",
        description: "Any non-empty value: text logs are never coloured (no-color.org).",
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_ENDPOINT",
        component: Component::Telemetry,
        default: "unset (no traces)",
        description: "Where the node sends its spans over OTLP/HTTP (`http://collector:4318`); \
                      one call is one trace across nodes.",
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        component: Component::Telemetry,
        default: "unset",
        description: "The endpoint of traces alone; it wins over `OTEL_EXPORTER_OTLP_ENDPOINT`.",
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_PROTOCOL",
        component: Component::Telemetry,
        default: "`http/protobuf`",
        description: "`http/protobuf` or `http/json`; `grpc` stops the node naming the variable.",
    },
    Variable {
        name: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        component: Component::Telemetry,
        default: "unset",
        description: "The protocol of traces alone; it wins over `OTEL_EXPORTER_OTLP_PROTOCOL`.",
    },
    Variable {
        name: "OTEL_SERVICE_NAME",
        component: Component::Telemetry,
        default: "`toolmesh`",
        description: "The spans' `service.name`; their `service.instance.id` is the node id.",
    },
    Variable {
        name: "OTEL_SDK_DISABLED",
        component: Component::Telemetry,
        default: "unset",
        description: "`true`: no traces, whatever the endpoint.",
    },
    Variable {
        name: "OTEL_TRACES_EXPORTER",
        component: Component::Telemetry,
        default: "unset",
        description: "`none`: no traces, whatever the endpoint.",
    },
    Variable {
        name: "TOOLMESH_NATS_INBOX_PREFIX",
        component: Component::Cli,
        default: "unset (`_INBOX`)",
        description: "The reply inbox prefix of client commands: a NATS user allowed to \
                      subscribe only to a private inbox, like the compose cluster's account \
                      users, names it here.",
    },
    Variable {
        name: "TRACEPARENT",
        component: Component::Cli,
        default: "unset",
        description: "W3C Trace Context the client commands send as the `traceparent` NATS \
                      header, so a script running inside a trace continues it. A value that \
                      names no valid span is ignored.",
    },
    Variable {
        name: "TRACESTATE",
        component: Component::Cli,
        default: "unset",
        description: "Sent as the `tracestate` header along with `TRACEPARENT`.",
    },
];

/// The reference's opening.
const HEADER: &str = "# Configuration

<!-- Generated from the tables of variables in the code (`toolmesh_kernel::settings`, gathered
in src/variables.rs): edit those, then run `UPDATE_DOCS=1 cargo test -p toolmesh --lib
variables`. -->

toolmesh reads its configuration from environment variables, once, as a process starts. A
node (`toolmesh node --roles …`) reads the variables of its roles and those of every node; the
client commands read those of \"Command line\". Every variable has a default that works on one
machine, and an empty value counts as unset.

Unless its entry says otherwise, a value a node cannot use stops the node at startup with a
message naming the variable, such as `TOOLMESH_APPROVAL_TTL_S=\"0\" is not valid: an approval
must live at least one second`. `toolmesh --help` names the variable behind each option but
never prints its value.
";

/// What follows a section's table, where there is more to show than a table says.
fn after(component: Component) -> Option<&'static str> {
    match component {
        Component::Approval => Some(
            "A policy file (`TOOLMESH_POLICY_FILE`):

```toml
mode = \"strict\"            # overrides TOOLMESH_TOOL_APPROVAL_MODE
[accounts.acme]
mode = \"off\"
[tools.run_command]
risk_level = \"critical\"

[[rules]]                  # deny over ask over allow; no match: the mode decides
id = \"no-secrets\"
tools = [\"*_workspace_*\"]
decision = \"deny\"
reason = \"secrets stay where they are\"
when = { path = { glob = \"secrets/**\" } }

[[rules]]
id = \"notes\"
tools = [\"write_workspace_file\"]
decision = \"allow\"
when = { path = { prefix = \"notes/\" } }
```
",
        ),
        _ => None,
    }
}

/// `docs/configuration.md`.
pub fn render() -> String {
    let mut out = String::from(HEADER);
    let sections: Vec<Component> = Component::ALL
        .into_iter()
        .filter(|c| all().any(|v| v.component == *c))
        .collect();
    let contents: Vec<String> = sections
        .iter()
        .map(|c| format!("[{}](#{})", c.title(), anchor(c.title())))
        .collect();
    let _ = writeln!(out, "\nSections: {}.", contents.join(" · "));
    for component in sections {
        let _ = write!(
            out,
            "\n## {}\n\n{}\n\n| variable | default | what it sets |\n| --- | --- | --- |\n",
            component.title(),
            component.about()
        );
        for var in all().filter(|v| v.component == component) {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} |",
                var.name,
                cell(var.default),
                cell(var.description)
            );
        }
        if let Some(text) = after(component) {
            let _ = write!(out, "\n{text}");
        }
    }
    out
}

/// A Markdown table cell: `|` escaped, so that a code span may hold one.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// GitHub's anchor of a heading.
fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    use toolmesh_kernel::config::RawEnv;

    use super::*;

    /// `"TOOLMESH_…"` names in the code that are no setting of a node or the command line.
    const NOT_SETTINGS: &[(&str, &str)] = &[
        ("TOOLMESH_AUDIT", "the audit trail's JetStream stream"),
        ("TOOLMESH_EVENTS", "the RunEvents' JetStream stream"),
        (
            "TOOLMESH_NODE_PASSWORD",
            "the node user's password in docker/nats.conf and docker/nats-leaf.conf",
        ),
        (
            "TOOLMESH_SANDBOX_SESSIONS",
            "the sandbox registry's JetStream key-value bucket",
        ),
        (
            "TOOLMESH_EXEC_",
            "the prefix a sandboxed command's `env` may not use",
        ),
        (
            "TOOLMESH_EXEC_ID",
            "set by a worker on each sandboxed command",
        ),
        (
            "TOOLMESH_WORKFLOW_PROMPT",
            "set by `execute_skills` for the skill runner",
        ),
        (
            "TOOLMESH_SKILL_NAMES",
            "set by `execute_skills` for the skill runner",
        ),
        (
            "TOOLMESH_TEST_LOCKED_TREE",
            "a unit test's run of itself as another user",
        ),
        ("TOOLMESH_TEST_VENV", "the test kit's Python environment"),
    ];

    /// Listed variables no toolmesh code names: the libraries toolmesh uses read them.
    const READ_BY_LIBRARIES: &[&str] = &["RUST_LOG"];

    fn root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    /// The `.rs` files of `dir`, without tests, benches and the tables themselves
    /// (`variables.rs`: a name listed there is not read there).
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "tests" | "benches" | "target") {
                    sources(&path, out);
                }
            } else if name.ends_with(".rs") && name != "variables.rs" {
                out.push(path);
            }
        }
    }

    /// String literals of the form `"PREFIX[A-Z0-9_]+"`.
    fn literals<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        let needle = format!("\"{prefix}");
        let mut found = Vec::new();
        let mut at = 0;
        while let Some(i) = text[at..].find(&needle) {
            let start = at + i + 1;
            let len = text[start..]
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(text.len() - start);
            if len > prefix.len() && text[start + len..].starts_with('"') {
                found.push(&text[start..start + len]);
            }
            at = start + len;
        }
        found
    }

    /// Every source file's text, by its path from the repository's root.
    fn source_texts() -> BTreeMap<String, String> {
        let mut files = Vec::new();
        for dir in ["src", "crates", "actors"] {
            sources(&root().join(dir), &mut files);
        }
        files
            .into_iter()
            .map(|path| {
                let text = std::fs::read_to_string(&path).unwrap();
                let rel = path.strip_prefix(root()).unwrap().display().to_string();
                (rel, text)
            })
            .collect()
    }

    #[test]
    fn docs_configuration_md_is_generated_from_the_tables() {
        let path = root().join("docs/configuration.md");
        let want = render();
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have == want {
            return;
        }
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(&path, want).unwrap();
            return;
        }
        panic!(
            "docs/configuration.md is not what the tables of variables render; rewrite it \
             with `UPDATE_DOCS=1 cargo test -p toolmesh --lib variables` and commit it"
        );
    }

    #[test]
    fn the_tables_list_every_variable_the_code_reads_and_no_other() {
        let texts = source_texts();
        let mut read: BTreeMap<&str, &str> = BTreeMap::new();
        for (file, text) in &texts {
            for name in literals(text, "TOOLMESH_") {
                read.entry(name).or_insert(file);
            }
        }
        let listed: BTreeSet<&str> = all().map(|v| v.name).collect();
        let not_settings: BTreeSet<&str> = NOT_SETTINGS.iter().map(|(n, _)| *n).collect();
        let missing: Vec<String> = read
            .iter()
            .filter(|(name, _)| !listed.contains(*name) && !not_settings.contains(*name))
            .map(|(name, file)| format!("{name} (read in {file})"))
            .collect();
        assert!(
            missing.is_empty(),
            "read by the code but in no table of variables (add each to the `variables.rs` \
             of the crate reading it, or to NOT_SETTINGS here if it is no setting): {}",
            missing.join(", ")
        );
        let unread: Vec<&str> = listed
            .iter()
            .copied()
            .filter(|name| {
                let quoted = format!("\"{name}\"");
                !READ_BY_LIBRARIES.contains(name) && !texts.values().any(|t| t.contains(&quoted))
            })
            .collect();
        assert!(
            unread.is_empty(),
            "listed in a table of variables but read by no code: {}",
            unread.join(", ")
        );
        let stale: Vec<&str> = not_settings
            .iter()
            .copied()
            .filter(|name| !read.contains_key(name))
            .collect();
        assert!(
            stale.is_empty(),
            "NOT_SETTINGS names no code uses: {stale:?}"
        );
    }

    /// Each default `table` writes as a literal is the `const` the code uses (those of `consts`
    /// that it lists), and setting a variable to its default's literal changes nothing `read`
    /// shows; at least `min_literals` of the table's defaults are literals. Returns how many
    /// of `consts` the table lists.
    fn check_defaults(
        table: &'static [Variable],
        consts: &[(&str, &dyn std::fmt::Display)],
        read: impl Fn(&RawEnv) -> String,
        min_literals: usize,
    ) -> usize {
        let own: Vec<_> = consts
            .iter()
            .filter(|(name, _)| toolmesh_kernel::settings::find(table, name).is_some())
            .copied()
            .collect();
        toolmesh_kernel::settings::assert_defaults(table, &own);
        let literals = toolmesh_kernel::config::assert_literal_defaults_change_nothing(table, read);
        assert!(
            literals >= min_literals,
            "{literals} defaults are literals in {}",
            table[0].name
        );
        own.len()
    }

    /// The tables of the actors whose settings are a `const` and a literal each, against
    /// their code. The literals that are no `const` (`docker`, `spawner`, `none`, …) are held
    /// to the code too.
    #[test]
    fn the_actors_defaults_are_the_code_s() {
        use toolmesh_approval::config::*;
        use toolmesh_sandbox::config::*;
        use toolmesh_skills::config::*;
        use toolmesh_web::config::*;

        let consts: [(&str, &dyn std::fmt::Display); 26] = [
            ("TOOLMESH_APPROVAL_TTL_S", &DEFAULT_APPROVAL_TTL_S),
            (
                "TOOLMESH_APPROVAL_MAX_PENDING",
                &DEFAULT_APPROVAL_MAX_PENDING,
            ),
            (
                "TOOLMESH_APPROVAL_RETENTION_S",
                &DEFAULT_APPROVAL_RETENTION_S,
            ),
            ("TOOLMESH_SKILLS_DIR", &DEFAULT_SKILLS_DIR),
            ("TOOLMESH_SKILL_MAX_BYTES", &DEFAULT_SKILL_MAX_BYTES),
            ("TOOLMESH_SKILL_MAX_ENTRIES", &DEFAULT_SKILL_MAX_ENTRIES),
            (
                "TOOLMESH_SKILL_DOWNLOAD_TIMEOUT_S",
                &DEFAULT_SKILL_DOWNLOAD_TIMEOUT_S,
            ),
            ("TOOLMESH_SANDBOX_IMAGE", &DEFAULT_SANDBOX_IMAGE),
            ("TOOLMESH_SANDBOX_MEMORY_MB", &DEFAULT_SANDBOX_MEMORY_MB),
            ("TOOLMESH_SANDBOX_PIDS", &DEFAULT_SANDBOX_PIDS),
            ("TOOLMESH_SANDBOX_CPUS", &DEFAULT_SANDBOX_CPUS),
            (
                "TOOLMESH_SANDBOX_MAX_SESSIONS",
                &DEFAULT_SANDBOX_MAX_SESSIONS,
            ),
            ("TOOLMESH_SANDBOX_IDLE_TTL_S", &DEFAULT_SANDBOX_IDLE_TTL_S),
            ("TOOLMESH_SANDBOX_WARM", &DEFAULT_SANDBOX_WARM),
            ("TOOLMESH_SANDBOX_TMPFS_MB", &DEFAULT_SANDBOX_TMPFS_MB),
            ("TOOLMESH_SANDBOX_DISK_MB", &DEFAULT_SANDBOX_DISK_MB),
            ("TOOLMESH_SANDBOX_TIMEOUT_S", &DEFAULT_SANDBOX_TIMEOUT_S),
            ("TOOLMESH_SANDBOX_SYNC_MAX_FILES", &DEFAULT_SYNC_MAX_FILES),
            (
                "TOOLMESH_SANDBOX_SYNC_MAX_FILE_BYTES",
                &DEFAULT_SYNC_MAX_FILE_BYTES,
            ),
            (
                "TOOLMESH_SANDBOX_SYNC_MAX_TOTAL_BYTES",
                &DEFAULT_SYNC_MAX_TOTAL_BYTES,
            ),
            (
                "TOOLMESH_SANDBOX_SYNC_MAX_ENTRIES",
                &DEFAULT_SYNC_MAX_ENTRIES,
            ),
            ("TOOLMESH_SANDBOX_SYNC_MAX_DEPTH", &DEFAULT_SYNC_MAX_DEPTH),
            (
                "TOOLMESH_SANDBOX_OUTPUT_MAX_BYTES",
                &DEFAULT_SANDBOX_OUTPUT_MAX_BYTES,
            ),
            (
                "TOOLMESH_SANDBOX_SESSION_OUTPUT_MAX_BYTES",
                &DEFAULT_SANDBOX_SESSION_OUTPUT_MAX_BYTES,
            ),
            (
                "TOOLMESH_SANDBOX_WORKER_OUTPUT_MAX_BYTES",
                &DEFAULT_SANDBOX_WORKER_OUTPUT_MAX_BYTES,
            ),
            ("TOOLMESH_WEB_MAX_BYTES", &DEFAULT_WEB_MAX_BYTES),
        ];
        let approval = toolmesh_approval::variables::VARIABLES;
        let read = |env: &RawEnv| format!("{:?}", ApprovalConfig::from_env(env).unwrap());
        let mut checked = check_defaults(approval, &consts, read, 4);
        let read = |env: &RawEnv| {
            let config = SandboxConfig::from_env(env, Path::new("./data"));
            format!("{:?}", config.unwrap())
        };
        checked += check_defaults(toolmesh_sandbox::variables::VARIABLES, &consts, read, 21);
        let read = |env: &RawEnv| format!("{:?}", SkillsConfig::from_env(env).unwrap());
        checked += check_defaults(toolmesh_skills::variables::VARIABLES, &consts, read, 5);
        let read = |env: &RawEnv| format!("{:?}", WebConfig::from_env(env).unwrap());
        checked += check_defaults(toolmesh_web::variables::VARIABLES, &consts, read, 1);
        assert_eq!(
            checked,
            consts.len(),
            "each const's variable is in a table here"
        );
    }

    #[test]
    fn every_variable_is_listed_once_with_a_description() {
        let mut seen = BTreeSet::new();
        for var in all() {
            assert!(seen.insert(var.name), "{} is listed twice", var.name);
            assert!(!var.default.is_empty(), "{} has no default", var.name);
            let sentences = var.description.matches(". ").count() + 1;
            assert!(
                !var.description.is_empty() && sentences <= 2,
                "{}: one or two sentences: {}",
                var.name,
                var.description
            );
        }
    }

    #[test]
    fn literals_are_whole_quoted_names() {
        assert_eq!(
            literals(
                r#"("TOOLMESH_A_1") "TOOLMESH_B" "TOOLMESH_C {x}" `TOOLMESH_D` "TOOLMESH_""#,
                "TOOLMESH_"
            ),
            ["TOOLMESH_A_1", "TOOLMESH_B"]
        );
        assert_eq!(
            anchor("Logs, metrics and traces"),
            "logs-metrics-and-traces"
        );
    }
}
