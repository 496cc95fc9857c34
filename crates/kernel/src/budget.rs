//! The result budget of PROTOCOL.md "Large data": text fields over the budget are cut to a
//! preview with `<field>_truncated`, `<field>_original_chars`, `<field>_preview_chars` beside
//! them. Persisting the whole text is the workspace's job (it owns the files).

use serde_json::{Map, Value};

/// A text cut to the budget (counted in characters, not bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub preview: String,
    pub original_chars: usize,
    pub truncated: bool,
}

impl Cut {
    pub fn preview_chars(&self) -> usize {
        if self.truncated {
            self.preview.chars().count()
        } else {
            self.original_chars
        }
    }
}

/// Cuts `text` to at most `budget_chars` characters.
pub fn cut(text: &str, budget_chars: usize) -> Cut {
    let mut chars = text.char_indices();
    match chars.nth(budget_chars) {
        None => Cut {
            preview: text.to_owned(),
            original_chars: text.chars().count(),
            truncated: false,
        },
        Some((end, _)) => Cut {
            preview: text[..end].to_owned(),
            original_chars: budget_chars + 1 + chars.count(),
            truncated: true,
        },
    }
}

/// Puts `field` (cut to the budget) and its `_truncated` / `_original_chars` /
/// `_preview_chars` companions into `fields`; returns whether it was cut.
pub fn insert_budgeted(
    fields: &mut Map<String, Value>,
    field: &str,
    text: &str,
    budget_chars: usize,
) -> bool {
    insert_cut(fields, field, cut(text, budget_chars))
}

/// Puts a cut made elsewhere (a stream counted as it went) and its companions into `fields`;
/// returns whether it was cut.
pub fn insert_cut(fields: &mut Map<String, Value>, field: &str, cut: Cut) -> bool {
    let (truncated, original, preview_chars) =
        (cut.truncated, cut.original_chars, cut.preview_chars());
    // The text first, its companions right after it.
    fields.insert(field.to_owned(), Value::from(cut.preview));
    fields.insert(format!("{field}_truncated"), Value::Bool(truncated));
    fields.insert(format!("{field}_original_chars"), Value::from(original));
    fields.insert(format!("{field}_preview_chars"), Value::from(preview_chars));
    truncated
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, budget: usize, preview: &str, original: usize, truncated: bool) {
        let got = cut(text, budget);
        assert_eq!(
            (got.preview.as_str(), got.original_chars, got.truncated),
            (preview, original, truncated),
            "{text:?} / {budget}"
        );
    }

    #[test]
    fn cuts_by_characters() {
        check("hello", 10, "hello", 5, false);
        check("hello", 5, "hello", 5, false);
        check("hello", 4, "hell", 5, true);
        check("héllo wörld", 3, "hél", 11, true);
        check("", 0, "", 0, false);
        check("ab", 0, "", 2, true);
    }

    #[test]
    fn companions_are_inserted() {
        let mut fields = Map::new();
        assert!(insert_budgeted(&mut fields, "stdout", "abcdef", 2));
        assert_eq!(fields["stdout"], "ab");
        assert_eq!(fields["stdout_truncated"], true);
        assert_eq!(fields["stdout_original_chars"], 6);
        assert_eq!(fields["stdout_preview_chars"], 2);
    }
}
