//! `search_skills`: fuzzy matching over name, aliases, tags, description and examples.
//!
//! Scoring (higher is better; a skill scoring 0 is not a result):
//!
//! | match | points |
//! | --- | --- |
//! | the whole query equals the name / an alias | 10 / 8 |
//! | the name / an alias contains the whole query | 5 / 4 |
//! | per query word: in the name / an alias / a tag / the description / an example | 3 / 2.5 / 2 / 1 / 1 |
//! | per query word of 4+ letters, one edit away from a word of the name, an alias or a tag | 1.5 |
//!
//! Matching is case-insensitive; a word "is in" a field when it is a prefix of one of the
//! field's words (so `diagram` finds `diagrams`). Ties are broken by name.

use serde::Serialize;

use crate::catalog::SkillManifest;

/// One result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    pub name: String,
    pub score: f64,
    pub description: String,
    pub space_id: String,
    pub version: String,
    pub tags: Vec<String>,
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

fn has_word(field_words: &[String], word: &str) -> bool {
    field_words.iter().any(|w| w.starts_with(word))
}

/// Whether `a` and `b` are at most one edit (insert, delete, substitute) apart.
fn one_edit(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if long.len() - short.len() > 1 {
        return false;
    }
    let mut i = 0;
    while i < short.len() && short[i] == long[i] {
        i += 1;
    }
    if i == long.len() {
        true
    } else if short.len() == long.len() {
        short[i + 1..] == long[i + 1..]
    } else {
        short[i..] == long[i + 1..]
    }
}

/// The score of one skill for a query (see the module docs).
pub fn score(query: &str, skill: &SkillManifest) -> f64 {
    let q = query.trim().to_lowercase();
    let q_words = words(&q);
    let name = skill.name.to_lowercase();
    let aliases: Vec<String> = skill.aliases.iter().map(|a| a.to_lowercase()).collect();
    let name_words = words(&skill.name);
    let alias_words: Vec<String> = skill.aliases.iter().flat_map(|a| words(a)).collect();
    let tag_words: Vec<String> = skill.tags.iter().flat_map(|t| words(t)).collect();
    let description_words = words(&skill.description);
    let example_words: Vec<String> = skill.examples.iter().flat_map(|e| words(e)).collect();

    let mut score = 0.0;
    if name == q {
        score += 10.0;
    } else if name.contains(&q) {
        score += 5.0;
    }
    if aliases.contains(&q) {
        score += 8.0;
    } else if aliases.iter().any(|a| a.contains(&q)) {
        score += 4.0;
    }
    for word in &q_words {
        let mut hit = false;
        for (field, points) in [
            (&name_words, 3.0),
            (&alias_words, 2.5),
            (&tag_words, 2.0),
            (&description_words, 1.0),
            (&example_words, 1.0),
        ] {
            if has_word(field, word) {
                score += points;
                hit = true;
            }
        }
        if !hit
            && word.chars().count() >= 4
            && name_words
                .iter()
                .chain(&alias_words)
                .chain(&tag_words)
                .any(|w| one_edit(w, word))
        {
            score += 1.5;
        }
    }
    score
}

/// The best `max_results` skills for `query`, best first.
pub fn search<'a>(
    query: &str,
    skills: impl IntoIterator<Item = &'a SkillManifest>,
    max_results: usize,
) -> Vec<Hit> {
    let mut hits: Vec<Hit> = skills
        .into_iter()
        .filter_map(|s| {
            let score = score(query, s);
            (score > 0.0).then(|| Hit {
                name: s.name.clone(),
                score,
                description: s.description.clone(),
                space_id: s.space_id.clone(),
                version: s.version.clone(),
                tags: s.tags.clone(),
            })
        })
        .collect();
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.name.cmp(&b.name))
    });
    hits.truncate(max_results);
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(name: &str, description: &str, tags: &[&str], aliases: &[&str]) -> SkillManifest {
        SkillManifest {
            name: name.into(),
            description: description.into(),
            version: "1".into(),
            space_id: "s".into(),
            status: "active".into(),
            tags: tags.iter().map(|s| s.to_string()).collect(),
            aliases: aliases.iter().map(|s| s.to_string()).collect(),
            examples: vec!["make a pie chart of sales".into()],
        }
    }

    #[test]
    fn ranks_name_over_alias_over_tag_over_description() {
        let skills = [
            skill("diagram", "Draw things", &[], &[]),
            skill("painter", "Draw things", &[], &["diagrams"]),
            skill("svg", "Vector art", &["diagram"], &[]),
            skill("notes", "Take a diagram note", &[], &[]),
            skill("pdf", "Read PDF files", &["documents"], &[]),
        ];
        let hits = search("diagram", &skills, 10);
        let names: Vec<&str> = hits.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["diagram", "painter", "svg", "notes"]);
        assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
        assert_eq!(search("diagram", &skills, 2).len(), 2);
    }

    #[test]
    fn fuzzy_and_examples_count() {
        let skills = [skill("pdf-reader", "Read PDF files", &["documents"], &[])];
        assert!(
            score("documnts", &skills[0]) > 0.0,
            "one edit away from a tag"
        );
        assert!(score("pie", &skills[0]) > 0.0, "a word of an example");
        assert_eq!(score("zebra", &skills[0]), 0.0);
    }

    #[test]
    fn one_edit_distance() {
        for (a, b, ok) in [
            ("abcd", "abcd", true),
            ("abcd", "abce", true),
            ("abcd", "abd", true),
            ("abcd", "xbcd", true),
            ("abcd", "abdc", false),
            ("abcd", "ab", false),
        ] {
            assert_eq!(one_edit(a, b), ok, "{a} {b}");
        }
    }
}
