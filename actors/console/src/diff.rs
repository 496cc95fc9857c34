//! The change an edit tool would make, shown to the approver as a unified diff.
//!
//! The diff comes from the approved arguments alone: the old and new text of each edit, or the
//! whole content of a write (against an empty file). The console does not read the workspace:
//! what an approver approves is bound to these arguments, and the diff shows exactly them.

use serde_json::Value;
use similar::TextDiff;
use toolmesh_kernel::tools::Review;

fn text<'v>(value: &'v Value, member: &str) -> Option<&'v str> {
    value.get(member).and_then(Value::as_str)
}

/// The longest text one diff side may have; past it the diff is left out (the arguments are
/// still shown in full).
const MAX_SIDE: usize = 256 * 1024;

/// The unified diff of a call's arguments as its tool's definition says to show them
/// ([`Review`]); `None` for a tool shown as plain arguments, or arguments that do not have the
/// members the review names.
pub fn of_review(review: Review, arguments: &Value) -> Option<String> {
    let Review::Diff {
        each,
        path,
        old,
        new,
    } = review
    else {
        return None;
    };
    let items = match each {
        None => std::slice::from_ref(arguments),
        Some(member) => arguments.get(member)?.as_array()?.as_slice(),
    };
    let parts = items
        .iter()
        .map(|item| {
            let path = text(item, path).or_else(|| text(arguments, path))?;
            let old = match old {
                Some(member) => text(item, member)?,
                None => "",
            };
            unified(path, old, text(item, new)?)
        })
        .collect::<Option<Vec<_>>>()?;
    Some(parts.concat())
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

    /// The reviews of the workspace's edit, multi-edit, write and batch-write tools, as their
    /// definitions say.
    const fn diff(
        each: Option<&'static str>,
        old: Option<&'static str>,
        new: &'static str,
    ) -> Review {
        Review::Diff {
            each,
            path: "path",
            old,
            new,
        }
    }
    const EDIT: Review = diff(None, Some("old_text"), "new_text");
    const MULTI_EDIT: Review = diff(Some("edits"), Some("old_text"), "new_text");
    const WRITE: Review = diff(None, None, "content");
    const WRITE_MANY: Review = diff(Some("files"), None, "content");

    fn check(review: Review, arguments: Value, expect: Option<&str>) {
        assert_eq!(
            of_review(review, &arguments).as_deref(),
            expect,
            "{review:?} {arguments}"
        );
    }

    #[test]
    fn diffs_of_edit_tools() {
        check(
            EDIT,
            json!({"path": "a.txt", "old_text": "one\ntwo\n", "new_text": "one\n2\n"}),
            Some("--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n"),
        );
        check(
            WRITE,
            json!({"path": "n.txt", "content": "<b>hi</b>\n"}),
            Some("--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+<b>hi</b>\n"),
        );
        check(
            MULTI_EDIT,
            json!({"path": "m", "edits": [{"old_text": "x\n", "new_text": "y\n"}]}),
            Some("--- a/m\n+++ b/m\n@@ -1 +1 @@\n-x\n+y\n"),
        );
        check(
            WRITE_MANY,
            json!({"files": [{"path": "p", "content": "z\n"}]}),
            Some("--- /dev/null\n+++ b/p\n@@ -0,0 +1 @@\n+z\n"),
        );
        check(Review::Arguments, json!({"command": "ls"}), None);
        check(EDIT, json!({"path": "a"}), None);
        check(
            WRITE,
            json!({"path": "big", "content": "x".repeat(MAX_SIDE + 1)}),
            None,
        );
    }
}
