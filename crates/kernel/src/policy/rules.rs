//! The policy file's rules (PROTOCOL.md "Approval policy"): each `[[rules]]` entry matches
//! calls by tool, account and session globs and by small tests on the arguments, and says
//! `allow`, `ask` or `deny`. Among the rules that match a call `deny` wins over `ask`, `ask`
//! over `allow`; within one decision the first in file order is the one recorded.
//!
//! The rules are checked whole when the file is read (a bad glob, regex, test or member stops
//! the node naming the rule and the field) and evaluated once per call, before the gate: an
//! index of every rule's tool globs (rules for any tool, a map of literal names, one
//! [`GlobSet`] of the other patterns) picks the candidates, and only those are tested further.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use globset::{GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a rule says of the calls it matches; the greater wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Runs the call without an approval.
    Allow,
    /// Makes an approval whatever the risk level.
    Ask,
    /// Answers `policy_denied`; nothing runs.
    Deny,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Ask => "ask",
            Decision::Deny => "deny",
        }
    }
}

/// What happens when an `ask` rule's approval passes its deadline undecided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// It ends as `expired`.
    #[default]
    Reject,
    /// It goes, once, to the rule's `escalate_to` group with a new deadline.
    Escalate,
}

/// One rule of the file, checked.
#[derive(Debug, Clone)]
pub struct Rule {
    /// `[A-Za-z0-9_-]{1,64}`, unique in the file.
    pub id: String,
    pub decision: Decision,
    /// Said to the caller with `policy_denied`, and recorded.
    pub reason: Option<String>,
    /// The group an `ask` rule's approvals go to.
    pub reviewers: Option<String>,
    /// Approvals by distinct members an `ask` rule's approval needs (1 without `reviewers`).
    pub quorum: u32,
    /// The deadline of an `ask` rule's approvals, in place of the approval TTL.
    pub expires_in_s: Option<u64>,
    pub on_timeout: OnTimeout,
    /// With `on_timeout = "escalate"`: the group the approval goes to at its deadline.
    pub escalate_to: Option<String>,
    /// Whether a decision under this rule may remember itself as a grant.
    pub grantable: bool,
    accounts: Option<GlobSet>,
    sessions: Option<GlobSet>,
    when: Conditions,
}

/// The `when` of a rule or a grant: tests on members of the arguments, all of which must hold.
#[derive(Debug, Clone, Default)]
pub struct Conditions(Vec<(Member, Test)>);

impl Conditions {
    /// Parses `{<member or /pointer>: <test>, …}`; the error is `(field, fault)`, the field
    /// naming the member (`when.path`).
    pub fn parse(when: &serde_json::Map<String, Value>) -> Result<Conditions, (String, String)> {
        let mut tests = Vec::with_capacity(when.len());
        for (name, test) in when {
            let field = format!("when.{name}");
            if name.is_empty() || name == "/" {
                return Err((field, "name a member or a pointer to one".into()));
            }
            let test = parse_test(test).map_err(|e| (field, e))?;
            tests.push((Member::parse(name), test));
        }
        Ok(Conditions(tests))
    }

    /// Whether every test holds of `arguments`.
    pub fn hold(&self, arguments: &Value) -> bool {
        self.0
            .iter()
            .all(|(member, test)| test.holds(member.find(arguments)))
    }
}

/// Names matched by globs (`*` within a segment, `**` across): a rule's or a grant's tools.
#[derive(Debug, Clone)]
pub struct Globs(GlobSet);

impl Globs {
    pub fn parse(patterns: &[String]) -> Result<Globs, String> {
        glob_set(patterns).map(Globs)
    }

    pub fn is_match(&self, name: &str) -> bool {
        self.0.is_match(name)
    }
}

/// Where a test looks in the arguments: a top-level member, or a JSON pointer (`/env/PATH`).
#[derive(Debug, Clone)]
enum Member {
    Top(String),
    Pointer(String),
}

impl Member {
    fn parse(name: &str) -> Member {
        if name.starts_with('/') {
            Member::Pointer(name.to_owned())
        } else {
            Member::Top(name.to_owned())
        }
    }

    fn find<'v>(&self, arguments: &'v Value) -> Option<&'v Value> {
        match self {
            Member::Top(name) => arguments.get(name),
            Member::Pointer(pointer) => arguments.pointer(pointer),
        }
    }
}

/// A test on one member of the arguments.
#[derive(Debug, Clone)]
enum Test {
    Equals(Value),
    OneOf(Vec<Value>),
    Glob(GlobMatcher),
    Regex(Regex),
    Prefix(String),
    Max(f64),
    Min(f64),
    /// `absent: true` holds for a missing member, `absent: false` for a present one.
    Absent(bool),
    Not(Box<Test>),
}

impl Test {
    /// Whether the test holds of `value` (`None`: the member is missing, which fails every
    /// test but `absent`, and a `not` of one).
    fn holds(&self, value: Option<&Value>) -> bool {
        match (self, value) {
            (Test::Absent(absent), value) => value.is_none() == *absent,
            (Test::Not(inner), None) => inner.is_about_presence() && !inner.holds(None),
            (_, None) => false,
            (Test::Not(inner), value) => !inner.holds(value),
            (Test::Equals(want), Some(v)) => same(want, v),
            (Test::OneOf(wants), Some(v)) => wants.iter().any(|want| same(want, v)),
            (Test::Glob(glob), Some(Value::String(s))) => glob.is_match(s),
            (Test::Regex(regex), Some(Value::String(s))) => regex.is_match(s),
            (Test::Prefix(prefix), Some(Value::String(s))) => s.starts_with(prefix.as_str()),
            (Test::Max(max), Some(Value::Number(n))) => n.as_f64().is_some_and(|n| n <= *max),
            (Test::Min(min), Some(Value::Number(n))) => n.as_f64().is_some_and(|n| n >= *min),
            _ => false,
        }
    }

    fn is_about_presence(&self) -> bool {
        match self {
            Test::Absent(_) => true,
            Test::Not(inner) => inner.is_about_presence(),
            _ => false,
        }
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// What a call shows the rules.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub tool: &'a str,
    pub account: &'a str,
    pub session: Option<&'a str>,
    pub arguments: &'a Value,
}

impl Rule {
    /// Whether the rule matches the call, its tool aside (the candidates' tool globs matched).
    fn matches_beyond_tool(&self, facts: &Facts) -> bool {
        if let Some(accounts) = &self.accounts {
            if !accounts.is_match(facts.account) {
                return false;
            }
        }
        if let Some(sessions) = &self.sessions {
            // A rule naming sessions matches only calls in a session.
            if !facts.session.is_some_and(|s| sessions.is_match(s)) {
                return false;
            }
        }
        self.when.hold(facts.arguments)
    }
}

/// The rules of one policy file, in file order.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    rules: Vec<Arc<Rule>>,
    /// Which rules a tool name is a candidate for ([`ToolIndex`]).
    tools: ToolIndex,
}

/// The rules' tool globs, indexed so that a call costs one hash lookup and one glob-set match
/// whatever the number of rules: rules for every tool (`*`, `**`) are candidates at once,
/// literal names are a map, and the other globs (each pattern once) one [`GlobSet`].
#[derive(Debug, Clone, Default)]
struct ToolIndex {
    any: Vec<usize>,
    exact: std::collections::HashMap<String, Vec<usize>>,
    globs: GlobSet,
    /// The rules of each pattern of `globs`.
    owners: Vec<Vec<usize>>,
}

impl ToolIndex {
    /// The rules (indexes, in file order, once each) whose tool globs match `tool`.
    /// The rules for any tool are borrowed as they are when no other glob names `tool`.
    fn candidates(&self, tool: &str) -> Cow<'_, [usize]> {
        let exact = self.exact.get(tool).map_or(&[][..], Vec::as_slice);
        let globbed = if self.owners.is_empty() {
            Vec::new()
        } else {
            self.globs.matches(tool)
        };
        if exact.is_empty() && globbed.is_empty() {
            return Cow::Borrowed(&self.any);
        }
        let mut out = self.any.clone();
        out.extend_from_slice(exact);
        for pattern in globbed {
            out.extend_from_slice(&self.owners[pattern]);
        }
        out.sort_unstable();
        out.dedup();
        Cow::Owned(out)
    }
}

/// Builds a [`ToolIndex`] rule by rule.
#[derive(Default)]
struct ToolIndexBuilder {
    index: ToolIndex,
    patterns: Vec<String>,
}

impl ToolIndexBuilder {
    fn add(&mut self, pattern: &str, rule: usize) -> Result<(), String> {
        glob(pattern)?;
        if pattern == "*" || pattern == "**" {
            // Rules come in file order: `any` stays sorted, and once each.
            if self.index.any.last() != Some(&rule) {
                self.index.any.push(rule);
            }
        } else if !pattern.contains(['*', '?', '[', '{', '\\']) {
            self.index
                .exact
                .entry(pattern.to_owned())
                .or_default()
                .push(rule);
        } else if let Some(at) = self.patterns.iter().position(|p| p == pattern) {
            self.index.owners[at].push(rule);
        } else {
            self.patterns.push(pattern.to_owned());
            self.index.owners.push(vec![rule]);
        }
        Ok(())
    }

    fn build(mut self) -> Result<ToolIndex, String> {
        let mut set = GlobSetBuilder::new();
        for pattern in &self.patterns {
            set.add(glob(pattern)?.glob().clone());
        }
        self.index.globs = set.build().map_err(|e| e.to_string())?;
        Ok(self.index)
    }
}

impl Rules {
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().map(|r| &**r)
    }

    /// The rule that decides the call: the first `deny` that matches, else the first `ask`,
    /// else the first `allow`; `None` when no rule matches.
    pub fn decide(&self, facts: &Facts) -> Option<&Arc<Rule>> {
        if self.rules.is_empty() {
            return None;
        }
        let mut best: Option<&Arc<Rule>> = None;
        for &index in self.tools.candidates(facts.tool).iter() {
            let rule = &self.rules[index];
            if best.is_some_and(|b| b.decision >= rule.decision) {
                continue;
            }
            if rule.matches_beyond_tool(facts) {
                best = Some(rule);
                if rule.decision == Decision::Deny {
                    break;
                }
            }
        }
        best
    }

    /// Checks the file's `[[rules]]` (each a TOML table) against its reviewer groups.
    pub(super) fn parse(
        raw: Vec<toml::Value>,
        groups: &BTreeMap<String, Vec<String>>,
    ) -> Result<Rules, String> {
        let mut rules = Vec::with_capacity(raw.len());
        let mut tools = ToolIndexBuilder::default();
        for (index, value) in raw.into_iter().enumerate() {
            let id = value
                .get("id")
                .and_then(toml::Value::as_str)
                .map(str::to_owned);
            let at = |field: &str, reason: String| {
                let rule = match &id {
                    Some(id) => format!("rules[{index}] (id {id:?})"),
                    None => format!("rules[{index}]"),
                };
                match field {
                    "" => format!("{rule}: {reason}"),
                    field => format!("{rule}: {field}: {reason}"),
                }
            };
            let raw = RawRule::deserialize(value).map_err(|e| at("", e.message().to_owned()))?;
            if rules.iter().any(|r: &Arc<Rule>| r.id == raw.id) {
                return Err(at("id", "another rule has this id".into()));
            }
            for pattern in &raw.tools {
                tools.add(pattern, index).map_err(|e| at("tools", e))?;
            }
            let rule = raw
                .check(groups)
                .map_err(|(field, reason)| at(&field, reason))?;
            rules.push(Arc::new(rule));
        }
        Ok(Rules {
            rules,
            tools: tools.build()?,
        })
    }
}

/// A glob of names or paths: `*` within a segment, `**` across.
fn glob(pattern: &str) -> Result<GlobMatcher, String> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("bad glob {pattern:?}: {}", e.kind()))
}

fn glob_set(patterns: &[String]) -> Result<GlobSet, String> {
    let mut set = GlobSetBuilder::new();
    for pattern in patterns {
        set.add(glob(pattern)?.glob().clone());
    }
    set.build().map_err(|e| e.to_string())
}

/// A rule as the file writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: String,
    tools: Vec<String>,
    accounts: Option<Vec<String>>,
    sessions: Option<Vec<String>>,
    #[serde(default)]
    when: toml::Table,
    decision: Decision,
    reason: Option<String>,
    reviewers: Option<String>,
    quorum: Option<u32>,
    expires_in_s: Option<u64>,
    on_timeout: Option<OnTimeout>,
    escalate_to: Option<String>,
    grantable: Option<bool>,
}

/// A field of a rule and why it is refused.
type Refusal = (String, String);

fn refuse(field: &str, reason: impl Into<String>) -> Refusal {
    (field.to_owned(), reason.into())
}

impl RawRule {
    fn check(self, groups: &BTreeMap<String, Vec<String>>) -> Result<Rule, Refusal> {
        if !super::is_token(&self.id, 64) {
            return Err(refuse("id", "a rule id is [A-Za-z0-9_-]{1,64}"));
        }
        if self.tools.is_empty() {
            return Err(refuse("tools", "name at least one tool (a glob)"));
        }
        let accounts = self.accounts.as_deref().map(glob_set).transpose();
        let accounts = accounts.map_err(|e| refuse("accounts", e))?;
        let sessions = self.sessions.as_deref().map(glob_set).transpose();
        let sessions = sessions.map_err(|e| refuse("sessions", e))?;
        let when = match serde_json::to_value(self.when) {
            Ok(Value::Object(when)) => Conditions::parse(&when)?,
            Ok(_) => return Err(refuse("when", "a table of tests")),
            Err(e) => return Err(refuse("when", e.to_string())),
        };
        let asks = self.decision == Decision::Ask;
        let only_ask = |field: &str, given: bool| {
            if given && !asks {
                Err(refuse(field, "only an ask rule makes approvals"))
            } else {
                Ok(())
            }
        };
        only_ask("reviewers", self.reviewers.is_some())?;
        only_ask("quorum", self.quorum.is_some())?;
        only_ask("expires_in_s", self.expires_in_s.is_some())?;
        only_ask("on_timeout", self.on_timeout.is_some())?;
        only_ask("escalate_to", self.escalate_to.is_some())?;
        only_ask("grantable", self.grantable.is_some())?;
        let members = |field: &str, group: &Option<String>| match group {
            None => Ok(0),
            Some(group) => groups
                .get(group)
                .map(Vec::len)
                .ok_or_else(|| refuse(field, format!("no [reviewers.{group}] group in this file"))),
        };
        let reviewers = members("reviewers", &self.reviewers)?;
        members("escalate_to", &self.escalate_to)?;
        let quorum = self.quorum.unwrap_or(1);
        if quorum == 0 {
            return Err(refuse("quorum", "at least 1"));
        }
        if quorum > 1 && self.reviewers.is_none() {
            return Err(refuse("quorum", "a quorum counts members of `reviewers`"));
        }
        if self.reviewers.is_some() && quorum as usize > reviewers {
            return Err(refuse(
                "quorum",
                format!("{quorum} is more than the group's {reviewers} members"),
            ));
        }
        if self.expires_in_s == Some(0) {
            return Err(refuse("expires_in_s", "at least 1"));
        }
        let on_timeout = self.on_timeout.unwrap_or_default();
        match (on_timeout, &self.escalate_to) {
            (OnTimeout::Escalate, None) => {
                return Err(refuse(
                    "escalate_to",
                    "on_timeout = \"escalate\" names a group here",
                ))
            }
            (OnTimeout::Reject, Some(_)) => {
                return Err(refuse(
                    "escalate_to",
                    "set on_timeout = \"escalate\" to escalate",
                ))
            }
            _ => {}
        }
        Ok(Rule {
            id: self.id,
            decision: self.decision,
            reason: self.reason,
            reviewers: self.reviewers,
            quorum,
            expires_in_s: self.expires_in_s,
            on_timeout,
            escalate_to: self.escalate_to,
            grantable: self.grantable.unwrap_or(true),
            accounts,
            sessions,
            when,
        })
    }
}

/// One test: an object with exactly one member naming its kind.
fn parse_test(value: &Value) -> Result<Test, String> {
    let Some((kind, arg)) = value
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
    else {
        return Err("a test is a table with one member, e.g. { glob = \"src/**\" }".into());
    };
    let string = || {
        arg.as_str()
            .ok_or_else(|| format!("{kind}: takes a string"))
    };
    let number = || {
        arg.as_f64()
            .ok_or_else(|| format!("{kind}: takes a number"))
    };
    Ok(match kind.as_str() {
        "equals" => Test::Equals(arg.clone()),
        "one_of" => Test::OneOf(
            arg.as_array()
                .ok_or_else(|| "one_of: takes an array".to_owned())?
                .clone(),
        ),
        "glob" => Test::Glob(glob(string()?).map_err(|e| format!("glob: {e}"))?),
        "regex" => Test::Regex(
            Regex::new(string()?).map_err(|e| format!("regex: {}", first_line(&e.to_string())))?,
        ),
        "prefix" => Test::Prefix(string()?.to_owned()),
        "max" => Test::Max(number()?),
        "min" => Test::Min(number()?),
        "absent" => Test::Absent(
            arg.as_bool()
                .ok_or_else(|| "absent: takes true or false".to_owned())?,
        ),
        "not" => Test::Not(Box::new(parse_test(arg).map_err(|e| format!("not: {e}"))?)),
        other => {
            return Err(format!(
                "unknown test {other:?}; use equals, one_of, glob, regex, prefix, max, min, absent or not"
            ))
        }
    })
}

fn first_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
