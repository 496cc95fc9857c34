//! The change an edit tool would make, shown to the approver as a unified diff.
//!
//! The diff comes from the approved arguments alone: the old and new text of each edit, or the
//! whole content of a write (against an empty file). The console does not read the workspace:
//! what an approver approves is bound to these arguments, and the diff shows exactly them.

use serde_json::Value;
use similar::TextDiff;

/// The longest text one diff side may have; past it the diff is left out (the arguments are
/// still shown in full).
const MAX_SIDE: usize = 256 * 1024;

/// The unified diff of an edit tool's arguments, `None` for other tools or unusable arguments.
pub fn of_tool(tool: &str, arguments: &Value) -> Option<String> {
    let path = arguments.get("path").and_then(Value::as_str);
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    match tool {
        "edit_workspace_file" => {
            let path = path?;
            Some(unified(
                path,
                &text(arguments, "old_text")?,
                &text(arguments, "new_text")?,
            )?)
        }
        "multi_edit_workspace_file" => {
            let path = path?;
            let edits = arguments.get("edits")?.as_array()?;
            let parts = edits
                .iter()
                .map(|e| unified(path, &text(e, "old_text")?, &text(e, "new_text")?))
                .collect::<Option<Vec<_>>>()?;
            Some(parts.concat())
        }
        "write_workspace_file" => unified(path?, "", &text(arguments, "content")?),
        "write_workspace_files" => {
            let files = arguments.get("files")?.as_array()?;
            let parts = files
                .iter()
                .map(|f| unified(f.get("path")?.as_str()?, "", &text(f, "content")?))
                .collect::<Option<Vec<_>>>()?;
            Some(parts.concat())
        }
        _ => None,
    }
}

fn unified(path: &str, old: &str, new: &str) -> Option<String> {
    if old.len() > MAX_SIDE || new.len() > MAX_SIDE {
        return None;
    }
    let diff = TextDiff::from_lines(old, new);
    let from = if old.is_empty() {
        "/dev/null".to_owned()
    } else {
        format!("a/{path}")
    };
    Some(
        diff.unified_diff()
            .context_radius(3)
            .header(&from, &format!("b/{path}"))
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(tool: &str, arguments: Value, expect: Option<&str>) {
        assert_eq!(
            of_tool(tool, &arguments).as_deref(),
            expect,
            "{tool} {arguments}"
        );
    }

    #[test]
    fn diffs_of_edit_tools() {
        check(
            "edit_workspace_file",
            json!({"path": "a.txt", "old_text": "one\ntwo\n", "new_text": "one\n2\n"}),
            Some("--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n"),
        );
        check(
            "write_workspace_file",
            json!({"path": "n.txt", "content": "<b>hi</b>\n"}),
            Some("--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+<b>hi</b>\n"),
        );
        check(
            "multi_edit_workspace_file",
            json!({"path": "m", "edits": [{"old_text": "x\n", "new_text": "y\n"}]}),
            Some("--- a/m\n+++ b/m\n@@ -1 +1 @@\n-x\n+y\n"),
        );
        check(
            "write_workspace_files",
            json!({"files": [{"path": "p", "content": "z\n"}]}),
            Some("--- /dev/null\n+++ b/p\n@@ -0,0 +1 @@\n+z\n"),
        );
        check("run_command", json!({"command": "ls"}), None);
        check("edit_workspace_file", json!({"path": "a"}), None);
        check(
            "write_workspace_file",
            json!({"path": "big", "content": "x".repeat(MAX_SIDE + 1)}),
            None,
        );
    }
}
