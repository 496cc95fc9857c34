//! `SKILL.md`: optional `---` front matter (a small YAML subset) and the body, which is the
//! skill's instructions.
//!
//! The subset: `key: value` lines (plain, `"double"` or `'single'` quoted scalars, `true` /
//! `false`, inline lists `[a, "b"]`), block lists (`key:` then `  - item` lines), blank lines and
//! `#` comments. Keys read: `name`, `description`, `version`, `tags`, `requires_sandbox`, and for
//! the Skill Service `aliases`, `examples`, `status`; others are ignored. Front matter that opens
//! with `---` and never closes, or a line that is none of the above, is unreadable
//! (`invalid_skill`).

use std::collections::BTreeMap;

/// A value of the subset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontValue {
    Scalar(String),
    List(Vec<String>),
}

/// What `SKILL.md` says about its skill.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkillDoc {
    pub name: Option<String>,
    pub description: Option<String>,
    pub version: Option<String>,
    pub tags: Vec<String>,
    pub aliases: Vec<String>,
    pub examples: Vec<String>,
    pub status: Option<String>,
    pub requires_sandbox: bool,
    /// The sandbox template `requires_sandbox` names (`requires_sandbox: py-net`), if it names
    /// one rather than saying `true`.
    pub sandbox_template: Option<String>,
    /// The body after the front matter.
    pub instructions: String,
}

/// Parses `SKILL.md`; `Err` says why the front matter is unreadable.
pub fn parse(text: &str) -> Result<SkillDoc, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.clone().next().unwrap_or("");
    if first.trim_end() != "---" {
        return Ok(SkillDoc {
            instructions: text.to_owned(),
            ..SkillDoc::default()
        });
    }
    lines.next();
    let mut front: Vec<&str> = Vec::new();
    let mut closed = false;
    let mut consumed = first.len();
    for line in lines.by_ref() {
        consumed += line.len();
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed == "..." {
            closed = true;
            break;
        }
        front.push(trimmed);
    }
    if !closed {
        return Err("the front matter opens with --- but never closes".into());
    }
    let map = parse_map(&front)?;
    let scalar = |key: &str| match map.get(key) {
        Some(FrontValue::Scalar(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    let list = |key: &str| match map.get(key) {
        Some(FrontValue::List(items)) => items.clone(),
        Some(FrontValue::Scalar(s)) if !s.is_empty() => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    let (requires_sandbox, sandbox_template) = match map.get("requires_sandbox") {
        None => (false, None),
        Some(FrontValue::Scalar(s)) => match s.as_str() {
            "true" | "yes" | "on" | "1" => (true, None),
            "false" | "no" | "off" | "0" | "" => (false, None),
            // A template's name: `[A-Za-z0-9_-]{1,64}` (PROTOCOL.md "Sandbox templates").
            name if name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')) =>
            {
                (true, Some(name.to_owned()))
            }
            other => {
                return Err(format!(
                "requires_sandbox must be true, false or a sandbox template's name, got {other:?}"
            ))
            }
        },
        Some(FrontValue::List(_)) => {
            return Err("requires_sandbox must be true, false or a sandbox template's name".into())
        }
    };
    let body = &text[consumed.min(text.len())..];
    Ok(SkillDoc {
        name: scalar("name"),
        description: scalar("description"),
        version: scalar("version"),
        tags: list("tags"),
        aliases: list("aliases"),
        examples: list("examples"),
        status: scalar("status"),
        requires_sandbox,
        sandbox_template,
        instructions: body.trim_start_matches(['\r', '\n']).to_owned(),
    })
}

fn parse_map(lines: &[&str]) -> Result<BTreeMap<String, FrontValue>, String> {
    let mut map = BTreeMap::new();
    let mut open_list: Option<String> = None;
    for (i, line) in lines.iter().enumerate() {
        let n = i + 2; // line numbers in the file (after the opening ---)
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if let Some(item) = trimmed
            .strip_prefix("- ")
            .or((trimmed == "-").then_some(""))
        {
            let Some(key) = &open_list else {
                return Err(format!("line {n}: a list item outside a list"));
            };
            if let Some(FrontValue::List(items)) = map.get_mut(key) {
                items.push(unquote(item.trim()));
            }
            continue;
        }
        if line.starts_with([' ', '\t']) {
            // Continuation of a folded scalar: append to the last scalar key.
            return Err(format!("line {n}: nested values are not supported"));
        }
        let Some((key, value)) = trimmed.split_once(':') else {
            return Err(format!("line {n}: expected `key: value`"));
        };
        let key = key.trim().to_owned();
        if key.is_empty() {
            return Err(format!("line {n}: empty key"));
        }
        let value = value.trim();
        if value.is_empty() {
            map.insert(key.clone(), FrontValue::List(Vec::new()));
            open_list = Some(key);
            continue;
        }
        open_list = None;
        let value = if let Some(inner) = value.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| format!("line {n}: an inline list must end with ]"))?;
            FrontValue::List(
                split_inline(inner)
                    .into_iter()
                    .map(|s| unquote(s.trim()))
                    .filter(|s| !s.is_empty())
                    .collect(),
            )
        } else {
            FrontValue::Scalar(unquote(value))
        };
        map.insert(key, value);
    }
    // A key with nothing after it and no items is an empty scalar.
    for value in map.values_mut() {
        if matches!(value, FrontValue::List(items) if items.is_empty()) {
            *value = FrontValue::Scalar(String::new());
        }
    }
    Ok(map)
}

/// Splits `a, "b, c", d` on commas outside quotes.
fn split_inline(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut quote: Option<char> = None;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ',') => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['"', '\''] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return s[1..s.len() - 1].replace("\\\"", "\"");
        }
    }
    // A trailing comment after a plain scalar.
    match s.find(" #") {
        Some(at) => s[..at].trim_end().to_owned(),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_front_matter_and_body() {
        let doc = parse(
            "---\nname: diagram\ndescription: \"Draw: diagrams\"\nversion: 1.2.0\ntags: [draw, 'svg']\nrequires_sandbox: true\naliases:\n  - chart\n  - graph\n# comment\n---\n\n# Diagram\nDo it.\n",
        )
        .unwrap();
        assert_eq!(doc.name.as_deref(), Some("diagram"));
        assert_eq!(doc.description.as_deref(), Some("Draw: diagrams"));
        assert_eq!(doc.version.as_deref(), Some("1.2.0"));
        assert_eq!(doc.tags, ["draw", "svg"]);
        assert_eq!(doc.aliases, ["chart", "graph"]);
        assert!(doc.requires_sandbox);
        assert_eq!(doc.sandbox_template, None);
        assert_eq!(doc.instructions, "# Diagram\nDo it.\n");
    }

    #[test]
    fn requires_sandbox_may_name_a_template() {
        let doc = parse("---\nrequires_sandbox: py-net\n---\nbody\n").unwrap();
        assert!(doc.requires_sandbox);
        assert_eq!(doc.sandbox_template.as_deref(), Some("py-net"));
        let doc = parse("---\nrequires_sandbox: false\n---\n").unwrap();
        assert_eq!((doc.requires_sandbox, doc.sandbox_template), (false, None));
    }

    #[test]
    fn no_front_matter_is_all_body() {
        let doc = parse("# Title\nbody\n").unwrap();
        assert_eq!(doc.name, None);
        assert_eq!(doc.instructions, "# Title\nbody\n");
    }

    #[test]
    fn unreadable_front_matter_is_an_error() {
        for text in [
            "---\nname: x\n",
            "---\njust words\n---\n",
            "---\n- item\n---\n",
            "---\nrequires_sandbox: maybe not\n---\n",
            "---\ntags: [a, b\n---\n",
        ] {
            assert!(parse(text).is_err(), "{text:?}");
        }
    }
}
