//! `toolmesh audit list|verify`: reads an account's chain through
//! `toolmesh.v1.audit.<account>.query` (so an account user's NATS permissions suffice), page by
//! page, and checks it with `kernel::audit::verify`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::bail;
use clap::Subcommand;
use serde_json::{json, Value};

use toolmesh_kernel::audit::{verify, StoredEntry, MAX_QUERY_LIMIT};
use toolmesh_kernel::subjects::public;
use toolmesh_kernel::text::display_json;

use crate::cli::{emit, parse_account, print_json, request};

/// Exit code of `verify` when an entry is bad (altered, unlinked, malformed).
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
    /// Check every hash and link of an account's chain, and report started calls that never
    /// finished. Exit 0 when whole, 1 naming the first bad entry, 3 for gaps only.
    Verify {
        #[arg(long)]
        account: String,
        /// A started call without a finished entry older than this is a gap (default: one
        /// hour, longer than any call's timeout).
        #[arg(long, default_value_t = 3600)]
        grace_s: u64,
    },
}

pub async fn run(nats: &async_nats::Client, action: AuditCommand) -> anyhow::Result<ExitCode> {
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
        AuditCommand::Verify { account, grace_s } => {
            let account = parse_account(&account)?;
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
            let summary = json!({
                "ok": report.whole(),
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

/// Every entry after `since`, page by page through the query subject.
async fn read_all(
    nats: &async_nats::Client,
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
