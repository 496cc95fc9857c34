//! The built-in tools of a node: every actor's table in one registry, for the gateway. This
//! crate links every actor crate, so it is the one place the whole set is known.

use toolmesh_kernel::tools::{Listed, RegistryError, ToolRegistry};

/// Every built-in tool, in the order of PROTOCOL.md's tool table.
pub fn listed() -> impl Iterator<Item = &'static dyn Listed> {
    let gateway = toolmesh_gateway::tools::LISTED.iter().copied();
    let workspace = toolmesh_workspace::tools::TOOLS.iter().map(as_listed);
    let skills = toolmesh_skills::tools::TOOLS.iter().map(as_listed);
    let sandbox = toolmesh_sandbox::tools::TOOLS.iter().map(as_listed);
    let web = toolmesh_web::tools::TOOLS.iter().map(as_listed);
    gateway
        .chain(workspace)
        .chain(skills)
        .chain(sandbox)
        .chain(web)
}

fn as_listed<E: Listed>(entry: &'static E) -> &'static dyn Listed {
    entry
}

/// The registry of every built-in tool.
pub fn registry() -> Result<ToolRegistry, RegistryError> {
    ToolRegistry::new(listed())
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};
    use toolmesh_kernel::tools::args::Profile;
    use toolmesh_kernel::tools::{
        find, DETAIL_MESSAGE_CHARS, TOOL_DISPATCHER, TOOL_DISPATCHER_ALIAS,
    };
    use toolmesh_kernel::{ErrorCode, Role};

    use super::*;

    /// The tools of PROTOCOL.md's tool table: name, group, risk and side effects, from its
    /// rows (`| group | `a`, `b` (alias `c`) | risk | `effect` |`).
    fn protocol_tools() -> Vec<(String, String, String, String)> {
        let protocol = include_str!("../docs/PROTOCOL.md");
        let table = protocol
            .split("| group | tool | risk | side effects |")
            .nth(1)
            .expect("PROTOCOL.md has the tool table");
        let mut tools = Vec::new();
        for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
            let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
            let [group, names, risk, effects] = cells[..] else {
                panic!("a row of four cells: {row}");
            };
            let effects = effects.replace(['`', '–'], "");
            // Names are the backticked words outside parentheses (aliases are inside).
            let outside: String = names
                .split('(')
                .map(|p| p.split(')').next_back().unwrap())
                .collect();
            for name in outside.split('`').skip(1).step_by(2) {
                tools.push((name.into(), group.into(), risk.into(), effects.clone()));
            }
        }
        tools
    }

    /// The golden list is PROTOCOL.md's table: every tool of every table is a row of it with
    /// the same group, risk and side effects, and every row is a tool.
    #[test]
    fn the_tables_hold_exactly_the_tools_of_protocol_md() {
        let reg = registry().unwrap();
        let documented = protocol_tools();
        assert_eq!(documented.len(), 26, "{documented:?}");
        let registered: Vec<_> = reg
            .iter()
            .map(|t| {
                let effects: Vec<String> = t
                    .spec
                    .side_effects
                    .iter()
                    .map(|e| {
                        serde_json::to_value(e)
                            .unwrap()
                            .as_str()
                            .unwrap()
                            .to_owned()
                    })
                    .collect();
                (
                    t.spec.name.to_string(),
                    t.spec.group.as_str().to_owned(),
                    t.spec.risk_level.as_str().to_owned(),
                    effects.join(", "),
                )
            })
            .collect();
        let (mut registered, mut documented) = (registered, documented);
        registered.sort();
        documented.sort();
        assert_eq!(registered, documented);
        assert_eq!(
            reg.get(TOOL_DISPATCHER_ALIAS).unwrap().spec.name,
            TOOL_DISPATCHER
        );
    }

    #[test]
    fn sessions_and_roles_are_as_before_the_tables() {
        let reg = registry().unwrap();
        let sessions: Vec<&str> = reg
            .iter()
            .filter(|t| t.spec.needs_session)
            .map(|t| t.spec.name.as_ref())
            .collect();
        assert_eq!(
            sessions,
            [
                "workspace_status",
                "list_workspace_files",
                "read_workspace_file",
                "search_workspace_files",
                "lint_workspace_file",
                "write_workspace_file",
                "write_workspace_files",
                "edit_workspace_file",
                "multi_edit_workspace_file",
                "delete_workspace_file",
                "execute_skills",
                "sandbox_status",
                "run_command",
                "run_code",
                "list_tasks",
                "task_output",
                "task_input",
                "kill_task",
            ]
        );
        let count = |role| {
            reg.iter()
                .filter(|t| t.spec.runs.role() == Some(role))
                .count()
        };
        assert_eq!(count(Role::Gateway), 3);
        assert_eq!(count(Role::Workspace), 10);
        assert_eq!(count(Role::Skills), 3);
        assert_eq!(count(Role::Sandbox), 8);
        assert_eq!(count(Role::Web), 2);
        assert_eq!(
            reg.get("execute_skills").unwrap().spec.runs.role(),
            Some(Role::Sandbox)
        );
        assert_eq!(
            reg.get("execute_skills").unwrap().spec.execution(),
            "sandbox_worker"
        );
    }

    #[test]
    fn every_tool_of_every_table_has_a_unique_name_and_a_schema_that_compiles() {
        let reg = registry().expect("names are unique and every schema compiles");
        let tables = toolmesh_gateway::tools::LISTED.len()
            + toolmesh_workspace::tools::TOOLS.len()
            + toolmesh_skills::tools::TOOLS.len()
            + toolmesh_sandbox::tools::TOOLS.len()
            + toolmesh_web::tools::TOOLS.len();
        assert_eq!(reg.iter().count(), tables);
        for tool in reg.iter() {
            assert_eq!(tool.input_schema["title"], tool.spec.name.as_ref());
            assert_eq!(
                tool.input_schema["additionalProperties"], false,
                "{}",
                tool.spec.name
            );
        }
    }

    /// A name reaches only the actor of its role, and only that actor's table has it: an
    /// actor answers any other name `unknown_tool` (its dispatch is a lookup in its table).
    #[test]
    fn each_tool_is_in_the_table_of_its_role_and_no_other() {
        type Has = fn(&str) -> bool;
        let tables: [(Role, Has); 5] = [
            (Role::Gateway, |n| {
                find(toolmesh_gateway::tools::LISTED, n).is_some()
            }),
            (Role::Workspace, |n| {
                find(toolmesh_workspace::tools::TOOLS, n).is_some()
            }),
            (Role::Skills, |n| {
                find(toolmesh_skills::tools::TOOLS, n).is_some()
            }),
            (Role::Sandbox, |n| {
                find(toolmesh_sandbox::tools::TOOLS, n).is_some()
            }),
            (Role::Web, |n| find(toolmesh_web::tools::TOOLS, n).is_some()),
        ];
        for def in listed().map(|t| t.def()) {
            for (role, has) in tables {
                assert_eq!(has(def.name), def.role == role, "{} in {role}", def.name);
            }
        }
        for (role, has) in tables {
            assert!(!has("nope") && !has(""), "{role}");
        }
        // Only the tools that run a command make a sandbox for the session.
        let creating: Vec<&str> = toolmesh_sandbox::tools::TOOLS
            .iter()
            .filter(|t| t.placement.creates_sandbox)
            .map(|t| t.tool.def.name)
            .collect();
        assert_eq!(creating, ["execute_skills", "run_command", "run_code"]);
        // The gateway answers every tool of its own but the dispatcher, which its call path
        // runs.
        let answered: Vec<&str> = toolmesh_gateway::tools::TOOLS
            .iter()
            .map(|t| t.def.name)
            .collect();
        assert_eq!(answered, ["component_status", "tool_search"]);
    }

    fn check(tool: &str, args: Value, expect_paths: &[&str]) {
        let reg = registry().unwrap();
        let result = reg.get(tool).unwrap().validate(&args, "");
        let paths: Vec<String> = match result {
            Ok(()) => vec![],
            Err(e) => {
                assert_eq!(e.code, ErrorCode::InvalidArguments);
                e.details["details"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d["path"].as_str().unwrap().to_owned())
                    .collect()
            }
        };
        assert_eq!(paths, expect_paths, "{tool} {args}");
    }

    #[test]
    fn validation_names_the_field() {
        check("read_workspace_file", json!({"path": "a"}), &[]);
        check("read_workspace_file", json!({}), &["/path"]);
        check("read_workspace_file", json!({"path": 5}), &["/path"]);
        check(
            "read_workspace_file",
            json!({"path": "a", "nope": 1}),
            &["/nope"],
        );
        check(
            "read_workspace_file",
            json!({"path": "a", "start_line": 0}),
            &["/start_line"],
        );
        check(
            "run_command",
            json!({"command": "ls", "env": {"A": 1}}),
            &["/env/A"],
        );
        check(
            "task_output",
            json!({"task_id": "t", "timeout": 301}),
            &["/timeout"],
        );
        check("search_skills", json!({"query": ""}), &["/query"]);
        check("tool_dispatcher", json!({"action": "frob"}), &["/action"]);
        check(
            "write_workspace_files",
            json!({"files": [{"path": "a"}]}),
            &["/files/0/content"],
        );
        check("component_status", json!({"x": 1}), &["/x"]);
    }

    /// Issue 16: a schema message quoted the whole offending value, so a 600 KB value made a
    /// reply over `max_payload`.
    #[test]
    fn a_huge_invalid_value_gets_short_messages_that_name_the_path() {
        let reg = registry().unwrap();
        let huge = "x".repeat(600 * 1024);
        let cases = [
            ("list_workspace_files", json!({"sort_by": huge}), "/sort_by"),
            (
                "run_command",
                json!({"command": "ls", "env": {"A": {"v": huge}}}),
                "/env/A",
            ),
            (
                "run_command",
                json!({"command": "ls", "env": {"A": [huge, huge, huge]}}),
                "/env/A",
            ),
            (
                "read_workspace_file",
                json!({"path": "a", "start_line": huge}),
                "/start_line",
            ),
        ];
        for (tool, args, path) in cases {
            let e = reg.get(tool).unwrap().validate(&args, "").unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidArguments);
            let size = serde_json::to_vec(&e.clone().into_fields()).unwrap().len();
            assert!(size < 4096, "{tool}: {size} bytes");
            let details = e.details["details"].as_array().unwrap();
            assert_eq!(details[0]["path"], path, "{tool}");
            let message = details[0]["message"].as_str().unwrap();
            assert!(message.chars().count() <= DETAIL_MESSAGE_CHARS, "{message}");
            assert!(message.contains("chars hidden"), "{message}");
            assert!(e.message.contains(path), "{}", e.message);
        }
        // A huge unknown member name: the path keeps its ends, the reply stays small.
        let mut args = serde_json::Map::new();
        args.insert("path".into(), json!("a"));
        args.insert(format!("k{huge}\u{202e}"), json!(1));
        let e = reg
            .get("read_workspace_file")
            .unwrap()
            .validate(&Value::Object(args), "")
            .unwrap_err();
        let size = serde_json::to_vec(&e.clone().into_fields()).unwrap().len();
        assert!(size < 4096, "{size} bytes");
        let path = e.details["details"][0]["path"].as_str().unwrap();
        assert!(
            path.starts_with("/kxx") && path.ends_with("x\\u202e"),
            "{path}"
        );
    }

    #[test]
    fn profiles_never_hold_the_dispatcher() {
        let reg = registry().unwrap();
        for p in [Profile::Focused, Profile::Default, Profile::Coding] {
            assert!(!reg.profile(p).contains(TOOL_DISPATCHER), "{p:?}");
        }
        assert_eq!(reg.profile(Profile::Default).len(), reg.iter().count() - 1);
        let focused = reg.profile(Profile::Core);
        assert!(focused.contains("read_workspace_file"));
        assert!(!focused.contains("run_command"));
        let coding = reg.profile(Profile::Coding);
        assert!(coding.contains("run_command") && coding.contains("tool_search"));
        assert!(!coding.contains("web_fetch") && !coding.contains("component_status"));
    }

    #[test]
    fn select_mixes_groups_profiles_and_names() {
        let reg = registry().unwrap();
        let got = reg
            .select(&[
                "web".into(),
                "focused".into(),
                "run_code".into(),
                "tool_dispatcher".into(),
            ])
            .unwrap();
        assert!(
            got.contains("web_fetch") && got.contains("run_code") && got.contains("load_skill")
        );
        assert!(!got.contains(TOOL_DISPATCHER));
        assert!(reg.select(&["nope".into()]).is_err());
    }
}
