//! Who gets a new session on one worker: the per-account quota and, on a full worker, which
//! held session makes room (PROTOCOL.md "Tenancy and trust").
//!
//! The pool takes a [`Snapshot`] of its sessions under its lock and asks [`admit`]; the answer
//! is a pure function of the snapshot, so the order below is tested here without sandboxes.
//!
//! A worker counts the sessions it holds and those being created (a creation counts from its
//! admission on, so concurrent first calls cannot pass a cap together). A session is
//! *evictable* when no call uses it, no background task of it runs, and its registry claim
//! holds. A new session of account `A` is admitted as follows:
//!
//! 1. `A` holds [`Limits::per_account`] sessions here (`TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT`)
//!    → `A`'s own least recently used evictable session makes room, so `A` stays at its quota;
//!    none → [`Refusal::AccountFull`] (`limit_exceeded`). An agent that opens session after
//!    session recycles its own idle ones and never waits out their idle TTL; it never holds
//!    more.
//! 2. The worker holds fewer than [`Limits::max_sessions`] (`TOOLMESH_SANDBOX_MAX_SESSIONS`)
//!    → admitted.
//! 3. The worker is full. The session that goes is
//!    1. `A`'s own least recently used evictable session; otherwise
//!    2. an evictable session of an account holding more sessions here than `A`: of the
//!       account holding the most, its least recently used one (between accounts holding as
//!       many, the least recently used session of all theirs);
//!    3. none → [`Refusal::WorkerFull`] (`unavailable`: another worker, or this one a moment
//!       later, can take the session).
//!
//! So a session with a running background task is never evicted, of any account; and an
//! account only ever takes room from one holding more than it does, never from a smaller one.
//!
//! The quota is per worker: a gateway places sessions on workers through the registry, so in a
//! cluster of `n` workers one account holds at most `n ×` the quota.

use std::collections::HashMap;
use std::time::Instant;

use toolmesh_kernel::{Account, ErrorCode, NodeId, ToolError};

/// The variable of the per-account quota, named in its refusal.
pub const PER_ACCOUNT_VAR: &str = "TOOLMESH_SANDBOX_MAX_SESSIONS_PER_ACCOUNT";
/// The variable of the worker's cap, named in its refusal.
pub const MAX_SESSIONS_VAR: &str = "TOOLMESH_SANDBOX_MAX_SESSIONS";

/// A worker's caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Sessions the worker holds at most.
    pub max_sessions: usize,
    /// Sessions one account holds at most on the worker.
    pub per_account: usize,
}

/// One session the worker holds, as admission sees it.
#[derive(Debug, Clone)]
pub struct Held<K> {
    pub key: K,
    pub account: Account,
    /// When it was last used (monotonic).
    pub last_used: Instant,
    /// No call uses it, no background task of it runs, and its registry claim holds.
    pub evictable: bool,
}

/// The worker's sessions at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot<K> {
    pub held: Vec<Held<K>>,
    /// Sessions being created, by account (never evictable).
    pub creating: HashMap<Account, usize>,
}

impl<K> Snapshot<K> {
    fn total(&self) -> usize {
        self.held.len() + self.creating.values().sum::<usize>()
    }

    /// The sessions `account` holds here, those being created included.
    fn count(&self, account: &Account) -> usize {
        self.held.iter().filter(|h| &h.account == account).count()
            + self.creating.get(account).copied().unwrap_or(0)
    }
}

/// What a new session gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission<K> {
    /// Room is free.
    Admit,
    /// Room is made by ending this session.
    Evict(K),
    Refuse(Refusal),
}

/// Why a new session is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The account holds its quota of sessions on this worker, and none of them may make room
    /// (in use, or running a background task).
    #[error(
        "this account holds {held} sandbox sessions on this worker, the most one account may \
         hold there ({PER_ACCOUNT_VAR}={quota}), and each is in use or runs a background task; \
         run the command in a session it already has, or end a background task (kill_task) \
         to free one"
    )]
    AccountFull { held: usize, quota: usize },
    /// The worker is full and no session may make room.
    #[error(
        "this sandbox worker holds its maximum of {max} sessions ({MAX_SESSIONS_VAR}), none of \
         which may make room (in use, running a background task, or of an account holding no \
         more sessions than this one); retry in a moment or add workers"
    )]
    WorkerFull { max: usize },
}

impl Refusal {
    /// The refusal as the reply's error, naming the worker.
    pub fn into_tool_error(self, node: &NodeId) -> ToolError {
        let (code, limit) = match &self {
            Refusal::AccountFull { .. } => (ErrorCode::LimitExceeded, PER_ACCOUNT_VAR),
            Refusal::WorkerFull { .. } => (ErrorCode::Unavailable, MAX_SESSIONS_VAR),
        };
        ToolError::new(code, self.to_string())
            .with("limit", limit)
            .with("node_id", node.as_str())
    }
}

/// Admits a new session of `account` (which holds no cell in `snapshot` yet) under `limits`:
/// the order of the module's docs.
pub fn admit<K: Clone>(account: &Account, snapshot: &Snapshot<K>, limits: Limits) -> Admission<K> {
    let own = snapshot.count(account);
    let evictable = || snapshot.held.iter().filter(|h| h.evictable);
    let mine = evictable()
        .filter(|h| &h.account == account)
        .min_by_key(|h| h.last_used);
    if own >= limits.per_account {
        return match mine {
            Some(victim) => Admission::Evict(victim.key.clone()),
            None => Admission::Refuse(Refusal::AccountFull {
                held: own,
                quota: limits.per_account,
            }),
        };
    }
    if snapshot.total() < limits.max_sessions {
        return Admission::Admit;
    }
    if let Some(victim) = mine {
        return Admission::Evict(victim.key.clone());
    }
    let mut counts: HashMap<&Account, usize> = HashMap::new();
    for h in &snapshot.held {
        *counts.entry(&h.account).or_default() += 1;
    }
    for (account, n) in &snapshot.creating {
        *counts.entry(account).or_default() += n;
    }
    let theirs = evictable()
        .map(|h| (counts[&h.account], h))
        .filter(|(n, _)| *n > own)
        .min_by_key(|(n, h)| (std::cmp::Reverse(*n), h.last_used));
    match theirs {
        Some((_, victim)) => Admission::Evict(victim.key.clone()),
        None => Admission::Refuse(Refusal::WorkerFull {
            max: limits.max_sessions,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn account(name: &str) -> Account {
        Account::parse(name).unwrap()
    }

    /// Admits a session of `caller` on a worker of `max`/`per_account` holding `held` and
    /// creating `creating`, and compares with `expect`. `held` lists sessions as `key idle_s`,
    /// `busy` after one that may not be evicted (`"a1 90, b1 5 busy"`); a key's account is
    /// its letters (`a1` is `a`'s).
    fn check(
        (max, per_account): (usize, usize),
        held: &'static str,
        creating: &[(&str, usize)],
        caller: &str,
        expect: Admission<&'static str>,
    ) {
        let now = Instant::now() + Duration::from_secs(3600);
        let held_row = |row: &'static str| {
            let mut words = row.split_whitespace();
            let (key, idle_s) = (words.next().unwrap(), words.next().unwrap());
            Held {
                key,
                account: account(key.trim_end_matches(|c: char| c.is_ascii_digit())),
                last_used: now - Duration::from_secs(idle_s.parse().unwrap()),
                evictable: words.next() != Some("busy"),
            }
        };
        let snapshot = Snapshot {
            held: held
                .split(',')
                .filter(|row| !row.trim().is_empty())
                .map(held_row)
                .collect(),
            creating: creating.iter().map(|&(a, n)| (account(a), n)).collect(),
        };
        let limits = Limits {
            max_sessions: max,
            per_account,
        };
        assert_eq!(
            admit(&account(caller), &snapshot, limits),
            expect,
            "{caller} on {held:?} creating {creating:?}"
        );
    }

    const ADMIT: Admission<&str> = Admission::Admit;

    fn account_full(held: usize, quota: usize) -> Admission<&'static str> {
        Admission::Refuse(Refusal::AccountFull { held, quota })
    }

    fn worker_full(max: usize) -> Admission<&'static str> {
        Admission::Refuse(Refusal::WorkerFull { max })
    }

    #[test]
    fn room_is_free_below_both_caps() {
        check((4, 2), "", &[], "a", ADMIT);
        check((4, 2), "a1 5, b1 9", &[], "a", ADMIT);
    }

    #[test]
    fn an_account_at_its_quota_recycles_its_own_idle_session_or_is_refused() {
        check((8, 2), "b1 5, b2 9", &[], "b", Admission::Evict("b2"));
        // Never another account's, even on a full worker where one is older.
        check(
            (3, 2),
            "a1 50, b1 5, b2 9",
            &[],
            "b",
            Admission::Evict("b2"),
        );
        // Its sessions are busy: refused, and nothing is evicted.
        check(
            (3, 2),
            "a1 50, b1 5 busy, b2 9 busy",
            &[],
            "b",
            account_full(2, 2),
        );
        // Sessions being created count: concurrent first calls cannot pass the quota together.
        check((8, 2), "b1 5", &[("b", 1)], "b", Admission::Evict("b1"));
        check((8, 2), "b1 5 busy", &[("b", 1)], "b", account_full(2, 2));
    }

    #[test]
    fn a_full_worker_ends_the_callers_own_least_recently_used_idle_session_first() {
        // a1 is the least recently used of all, yet b's own b1 goes.
        let held = "a1 90, a2 80, b1 30, b2 10";
        check((4, 3), held, &[], "b", Admission::Evict("b1"));
        // Its own busy sessions do not go: b1 is in use, so b2 does.
        let held = "a1 90, b1 30 busy, b2 10";
        check((3, 3), held, &[], "b", Admission::Evict("b2"));
    }

    #[test]
    fn a_session_with_a_running_background_task_is_never_ended() {
        // a1 runs a background task (not evictable); b has nothing idle: b is refused.
        let held = "a1 900 busy, b1 1 busy";
        check((2, 2), held, &[], "b", worker_full(2));
        // c holds nothing, and still a1 stays.
        check((2, 2), held, &[], "c", worker_full(2));
    }

    #[test]
    fn room_comes_from_the_account_holding_the_most_sessions() {
        let held = "a1 90, b1 10, b2 20, b3 5 busy";
        // c holds nothing: b holds the most, its least recently used idle session goes, though
        // a's is older.
        check((4, 4), held, &[], "c", Admission::Evict("b2"));
        // Between accounts holding as many, the least recently used session of theirs.
        let held = "a1 90, a2 10 busy, b1 50, b2 5";
        check((4, 4), held, &[], "c", Admission::Evict("a1"));
        // Sessions being created count towards an account's share.
        let held = "a1 90, b1 10";
        check((3, 4), held, &[("b", 1)], "c", Admission::Evict("b1"));
    }

    #[test]
    fn an_account_never_takes_room_from_one_holding_no_more_than_it() {
        // b holds two, all in use; a holds one idle: a is not pushed out for b's third.
        let held = "a1 90, b1 1 busy, b2 2 busy";
        check((3, 3), held, &[], "b", worker_full(3));
        // Holding as many is not enough either.
        let held = "a1 90, b1 1 busy";
        check((2, 2), held, &[], "b", worker_full(2));
        // One holding more gives room.
        let held = "a1 90, a2 80 busy, b1 1 busy";
        check((3, 3), held, &[], "b", Admission::Evict("a1"));
    }

    #[test]
    fn refusals_name_their_variable_and_code() {
        let node = NodeId::parse("w1").unwrap();
        let quota = Refusal::AccountFull { held: 2, quota: 2 }.into_tool_error(&node);
        assert_eq!(quota.code, ErrorCode::LimitExceeded);
        assert!(quota.message.contains(PER_ACCOUNT_VAR), "{}", quota.message);
        assert!(quota.message.contains("=2"), "{}", quota.message);
        assert_eq!(quota.details["limit"], PER_ACCOUNT_VAR);
        let full = Refusal::WorkerFull { max: 4 }.into_tool_error(&node);
        assert_eq!(full.code, ErrorCode::Unavailable);
        assert!(full.message.contains(MAX_SESSIONS_VAR), "{}", full.message);
        assert_eq!(full.details["node_id"], "w1");
    }
}
