//! Checking a chain: [`verify`] finds every altered, dropped or reordered entry of a page of
//! entries (`toolmesh audit verify`), and [`ChainHead`] is what a person keeps to notice a cut
//! tail later.

use super::*;

/// What is wrong with one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Not a JSON object with a string `sha256`.
    Malformed(String),
    /// Its content does not hash to its `sha256`: it was changed after it was written.
    Altered { stored: String, computed: String },
    /// Its `prev_sha256` is not the `sha256` of the entry before it: an entry was removed,
    /// inserted or moved.
    BrokenLink {
        expected: Option<String>,
        found: Option<String>,
    },
    /// It names another account than its subject's.
    OtherAccount(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Malformed(why) => write!(f, "malformed: {why}"),
            Fault::Altered { stored, computed } => write!(
                f,
                "altered: its content hashes to {computed}, not to its sha256 {stored}"
            ),
            Fault::BrokenLink { expected, found } => write!(
                f,
                "broken link: prev_sha256 is {}, the entry before it has sha256 {}",
                found.as_deref().unwrap_or("null"),
                expected.as_deref().unwrap_or("null")
            ),
            Fault::OtherAccount(account) => {
                write!(f, "names account {account:?}, not the chain's")
            }
        }
    }
}

/// One bad entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub seq: u64,
    pub invocation_id: Option<String>,
    pub fault: Fault,
}

/// A call entry `started` without its `finished`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub seq: u64,
    pub invocation_id: String,
    pub tool: Option<String>,
    pub at: String,
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verification {
    pub entries: usize,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// The first entry's `prev_sha256` when it is not `null`: older entries aged out (or
    /// were removed), and this link is taken as given.
    pub taken_as_given: Option<String>,
    pub problems: Vec<Problem>,
    /// Calls started longer ago than the grace and never finished.
    pub gaps: Vec<Gap>,
    /// Calls started within the grace and not finished yet.
    pub open: Vec<Gap>,
}

impl Verification {
    /// No bad entry and no gap.
    pub fn whole(&self) -> bool {
        self.problems.is_empty() && self.gaps.is_empty()
    }
}

/// Checks a chain read oldest first: every entry's hash, every link, the account, and calls
/// started without a `finished` entry (a gap once `grace` has passed since `at`).
pub fn verify(
    account: &Account,
    entries: &[StoredEntry],
    now: SystemTime,
    grace: Duration,
) -> Verification {
    let mut out = Verification {
        entries: entries.len(),
        first_seq: entries.first().map(|e| e.seq),
        last_seq: entries.last().map(|e| e.seq),
        ..Default::default()
    };
    let mut previous: Option<Option<String>> = None;
    let mut finished = std::collections::HashSet::new();
    let mut started = Vec::new();
    for stored in entries {
        let object = stored.entry.as_object();
        let invocation_id = object
            .and_then(|o| o.get("invocation_id"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let problem = |fault| Problem {
            seq: stored.seq,
            invocation_id: invocation_id.clone(),
            fault,
        };
        let Some(object) = object else {
            out.problems
                .push(problem(Fault::Malformed("not a JSON object".into())));
            previous = Some(None);
            continue;
        };
        let stored_sha = object.get("sha256").and_then(Value::as_str);
        let prev = object
            .get("prev_sha256")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match stored_sha {
            None => out
                .problems
                .push(problem(Fault::Malformed("no string sha256".into()))),
            Some(stored_sha) => {
                let computed = entry_sha256(object);
                if computed != stored_sha {
                    out.problems.push(problem(Fault::Altered {
                        stored: stored_sha.to_owned(),
                        computed,
                    }));
                }
            }
        }
        match &previous {
            None => out.taken_as_given.clone_from(&prev),
            Some(expected) if *expected != prev => out.problems.push(problem(Fault::BrokenLink {
                expected: expected.clone(),
                found: prev.clone(),
            })),
            Some(_) => {}
        }
        if let Some(named) = object.get("account").and_then(Value::as_str) {
            if named != account.as_str() {
                out.problems
                    .push(problem(Fault::OtherAccount(named.to_owned())));
            }
        }
        if object.get("kind").and_then(Value::as_str) == Some("call") {
            if let Some(id) = &invocation_id {
                match object.get("status").and_then(Value::as_str) {
                    Some("finished") => {
                        finished.insert(id.clone());
                    }
                    Some("started") => started.push(Gap {
                        seq: stored.seq,
                        invocation_id: id.clone(),
                        tool: object
                            .get("tool")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        at: object
                            .get("at")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    }),
                    _ => {}
                }
            }
        }
        previous = Some(stored_sha.map(str::to_owned));
    }
    for gap in started {
        if finished.contains(&gap.invocation_id) {
            continue;
        }
        let age = humantime::parse_rfc3339(&gap.at)
            .ok()
            .and_then(|at| now.duration_since(at).ok());
        // An unreadable time counts as old: it cannot show the call is still running.
        if age.is_none_or(|age| age > grace) {
            out.gaps.push(gap);
        } else {
            out.open.push(gap);
        }
    }
    out
}

/// A chain's last entry as a person keeps it (`toolmesh audit head`), to check later that the
/// chain still holds it (`toolmesh audit verify --head`). Entries cut from the end of a chain
/// leave a chain that verifies whole: only a head kept from before shows the cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHead {
    /// The chain's account, when known.
    pub account: Option<String>,
    /// The entry's stream sequence, when known.
    pub seq: Option<u64>,
    /// The entry's `sha256` (lowercase hex): what identifies it.
    pub sha256: String,
    /// The entry's `at`, when known.
    pub at: Option<String>,
}

impl ChainHead {
    /// The last of `entries` (read oldest first); `None` for an empty chain, or when the last
    /// entry has no `sha256`.
    pub fn of(account: &Account, entries: &[StoredEntry]) -> Option<Self> {
        let last = entries.last()?;
        Some(Self {
            account: Some(account.as_str().to_owned()),
            seq: Some(last.seq),
            sha256: last.entry.get("sha256")?.as_str()?.to_owned(),
            at: last
                .entry
                .get("at")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    /// `{"account", "seq", "sha256", "at"}`: what `toolmesh audit head` prints.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "account": self.account,
            "seq": self.seq,
            "sha256": self.sha256,
            "at": self.at,
        })
    }

    /// A kept head: the JSON object [`ChainHead::to_json`] wrote (its `sha256`, and `account`,
    /// `seq` and `at` when present; other members are ignored), or a bare sha256 (64 hex
    /// digits, either case).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let sha256 = |raw: &str| {
            if raw.len() == 64 && raw.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(raw.to_ascii_lowercase())
            } else {
                Err(format!(
                    "{raw:?} is not a sha256 (64 hex digits), nor the JSON `toolmesh audit head` prints"
                ))
            }
        };
        if !text.starts_with('{') {
            return Ok(Self {
                account: None,
                seq: None,
                sha256: sha256(text)?,
                at: None,
            });
        }
        let object: Map<String, Value> = serde_json::from_str(text)
            .map_err(|e| format!("the kept head is not a JSON object ({e})"))?;
        let text_member = |name: &str| -> Result<Option<String>, String> {
            match object.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(format!("the kept head's {name} is not a string")),
            }
        };
        let seq = match object.get("seq") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .ok_or("the kept head's seq is not a stream sequence")?,
            ),
        };
        let Some(raw) = text_member("sha256")? else {
            return Err("the kept head has no sha256 (an empty chain has no head to keep)".into());
        };
        Ok(Self {
            account: text_member("account")?,
            seq,
            sha256: sha256(&raw)?,
            at: text_member("at")?,
        })
    }
}

/// The stream sequence of the entry of `entries` whose `sha256` is `sha256`.
pub fn position(entries: &[StoredEntry], sha256: &str) -> Option<u64> {
    entries
        .iter()
        .find(|stored| stored.entry.get("sha256").and_then(Value::as_str) == Some(sha256))
        .map(|stored| stored.seq)
}
