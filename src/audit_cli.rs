//! `toolmesh audit list|head|verify`: reads an account's chain through
//! `toolmesh.v1.audit.<account>.query` (so an account user's NATS permissions suffice), page by
//! page, and checks it with `kernel::audit::verify`. `head` prints the last entry for a person
//! to keep; `verify --head` then fails when the chain no longer holds it (a cut tail).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context as _};
use clap::Subcommand;
use serde_json::{json, Value};

use toolmesh_kernel::audit::{position, verify, ChainHead, StoredEntry, MAX_QUERY_LIMIT};
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::text::display_json;

use crate::cli::{emit, parse_account, print_json, request};

/// Exit code of `verify` when an entry is bad (altered, unlinked, malformed), or the kept
/// head (`--head`) is not in the chain.
const EXIT_BROKEN: u8 = 1;
/// Exit code of `verify` when the chain is whole but a started call never finished.
const EXIT_GAP: u8 = 3;

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Print an account's entries, oldest first (one JSON line each).
    List {
        #[arg(long)]
        account: String,
        /// Only entries after this stream sequence.
        #[arg(long, default_value_t = 0)]
        since: u64,
    },
    /// Print the last entry of an account's chain (seq, sha256, at) as JSON: keep it, and
    /// `verify --head` later shows whether entries were cut from the chain's end.
    Head {
        #[arg(long)]
        account: String,
    },
    /// Check every hash and link of an account's chain, and report started calls that never
    /// finished. Exit 0 when whole, 1 naming the first bad entry (or a kept head the chain no
    /// longer holds), 3 for gaps only.
    Verify {
        #[arg(long)]
        account: String,
        /// A started call without a finished entry older than this is a gap (default: one
        /// hour, longer than any call's timeout).
        #[arg(long, default_value_t = 3600)]
        grace_s: u64,
        /// A head kept from `toolmesh audit head`: the JSON it printed, or its sha256 (64 hex
        /// digits), or @file holding either. The chain must still hold that entry.
        #[arg(long)]
        head: Option<String>,
    },
}

pub async fn run(nats: &crate::cli::Mesh, action: AuditCommand) -> anyhow::Result<ExitCode> {
    match action {
        AuditCommand::List { account, since } => {
            let account = parse_account(&account)?;
            for stored in read_all(nats, &account, since).await? {
                let mut line = json!({ "seq": stored.seq });
                if let (Some(out), Value::Object(members)) = (line.as_object_mut(), stored.entry) {
                    out.extend(members);
                }
                emit(&display_json(&line))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Head { account } => {
            let account = parse_account(&account)?;
            let entries = read_all(nats, &account, 0).await?;
            let mut out = json!({"ok": true});
            let head = match ChainHead::of(&account, &entries) {
                Some(head) => head.to_json(),
                None => {
                    eprintln!(
                        "the audit chain of {account} has no entries: there is no head to keep"
                    );
                    json!({"account": account.as_str(), "seq": null, "sha256": null, "at": null})
                }
            };
            if let (Some(out), Value::Object(members)) = (out.as_object_mut(), head) {
                out.extend(members);
            }
            print_json(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        AuditCommand::Verify {
            account,
            grace_s,
            head,
        } => {
            let account = parse_account(&account)?;
            let kept = head.as_deref().map(parse_head).transpose()?;
            if let Some(named) = kept.as_ref().and_then(|k| k.account.as_deref()) {
                if named != account.as_str() {
                    bail!(
                        "--head is a head of {named:?}'s chain, not of {:?}'s",
                        account.as_str()
                    );
                }
            }
            let entries = read_all(nats, &account, 0).await?;
            let report = verify(
                &account,
                &entries,
                SystemTime::now(),
                Duration::from_secs(grace_s),
            );
            let problems: Vec<Value> = report
                .problems
                .iter()
                .map(|p| json!({"seq": p.seq, "invocation_id": p.invocation_id, "fault": p.fault.to_string()}))
                .collect();
            let gap = |g: &toolmesh_kernel::audit::Gap| json!({"seq": g.seq, "invocation_id": g.invocation_id, "tool": g.tool, "started_at": g.at});
            let kept_at = kept.as_ref().map(|k| position(&entries, &k.sha256));
            let head_missing = matches!(kept_at, Some(None));
            let summary = json!({
                "ok": report.whole() && !head_missing,
                "account": account.as_str(),
                "entries": report.entries,
                "first_seq": report.first_seq,
                "last_seq": report.last_seq,
                "genesis": report.entries == 0 || report.taken_as_given.is_none(),
                "first_prev_sha256_taken_as_given": report.taken_as_given,
                "first_bad": problems.first(),
                "problems": problems,
                "gaps": report.gaps.iter().map(gap).collect::<Vec<_>>(),
                "open_calls": report.open.iter().map(gap).collect::<Vec<_>>(),
                "head": kept.as_ref().map(|k| json!({
                    "sha256": k.sha256,
                    "found": !head_missing,
                    "seq": kept_at.flatten(),
                })),
            });
            print_json(&summary)?;
            if let Some(first) = report.problems.first() {
                eprintln!(
                    "audit chain of {account} is broken at stream seq {} (invocation {}): {}",
                    first.seq,
                    first.invocation_id.as_deref().unwrap_or("unknown"),
                    first.fault
                );
                return Ok(ExitCode::from(EXIT_BROKEN));
            }
            if let (Some(kept), true) = (&kept, head_missing) {
                eprintln!(
                    "audit chain of {account} does not hold the kept head {}{}: {}",
                    kept.sha256,
                    kept.seq
                        .map(|s| format!(" (stream seq {s})"))
                        .unwrap_or_default(),
                    missing_head_reason(kept.seq, report.first_seq, report.last_seq)
                );
                return Ok(ExitCode::from(EXIT_BROKEN));
            }
            if let Some(taken) = &report.taken_as_given {
                eprintln!("the first entry's prev_sha256 {taken} is taken as given: older entries aged out of the stream (TOOLMESH_AUDIT_MAX_AGE_S)");
            }
            if let Some(first) = report.gaps.first() {
                eprintln!(
                    "audit chain of {account} has {} gap(s): invocation {} (stream seq {}) started and never finished",
                    report.gaps.len(),
                    first.invocation_id,
                    first.seq
                );
                return Ok(ExitCode::from(EXIT_GAP));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--head`: what `toolmesh audit head` printed, a sha256, or @file holding either.
fn parse_head(raw: &str) -> anyhow::Result<ChainHead> {
    let text = match raw.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("--head: cannot read {path}"))?
        }
        None => raw.to_owned(),
    };
    ChainHead::parse(&text).map_err(|e| anyhow::anyhow!("--head: {e}"))
}

/// Why a kept head may be missing, from where it was and what the chain holds now.
fn missing_head_reason(kept: Option<u64>, first: Option<u64>, last: Option<u64>) -> String {
    match (kept, first, last) {
        (_, None, _) | (_, _, None) => {
            "the chain has no entries now: it was removed, or the head is of another chain"
                .to_owned()
        }
        (Some(kept), Some(first), Some(_)) if kept < first => format!(
            "it is older than the chain's first entry (stream seq {first}): it aged out of the stream (TOOLMESH_AUDIT_MAX_AGE_S) or was removed; keep a newer head"
        ),
        (_, Some(first), Some(last)) => format!(
            "entries were cut from the chain's end (it now holds stream seq {first} to {last}), or the head was never in this chain"
        ),
    }
}

/// Every entry after `since`, page by page through the query subject.
async fn read_all(
    nats: &crate::cli::Mesh,
    account: &toolmesh_kernel::Account,
    mut since: u64,
) -> anyhow::Result<Vec<StoredEntry>> {
    let subject = public::audit_query(account);
    let mut out = Vec::new();
    loop {
        let reply = request(
            nats,
            subject.clone(),
            &json!({"since": since, "limit": MAX_QUERY_LIMIT}),
            10,
        )
        .await?;
        if reply.get("ok") != Some(&Value::Bool(true)) {
            bail!(
                "the audit query failed: {}",
                reply
                    .get("error_message")
                    .and_then(Value::as_str)
                    .unwrap_or("no error message")
            );
        }
        let entries = reply
            .get("entries")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for mut entry in entries {
            let seq = entry.get("seq").and_then(Value::as_u64).unwrap_or(0);
            if let Some(members) = entry.as_object_mut() {
                members.shift_remove("seq");
            }
            since = since.max(seq);
            out.push(StoredEntry { seq, entry });
        }
        if reply.get("more") != Some(&Value::Bool(true)) {
            return Ok(out);
        }
    }
}
