use super::*;

fn record(pairs: &[(&str, &str)]) -> Record {
    let mut base: Record = [
        ("id", "appr_1"),
        ("account", "acme"),
        ("status", "pending"),
        ("session_id", ""),
        ("invocation_id", "inv-1"),
        ("tool_name", "run_command"),
        ("risk_level", "high"),
        ("side_effects", "[\"isolated_runtime_execution\"]"),
        ("arguments_sha256", "ab"),
        ("arguments_preview", "{}"),
        ("created_at_ms", "1000"),
        ("expires_at_ms", "2000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (k, v) in pairs {
        base.insert((*k).to_owned(), (*v).to_owned());
    }
    base
}

fn check(pairs: &[(&str, &str)], now: u64, expect: ApprovalStatus) {
    let approval = view(&record(pairs), now).unwrap();
    assert_eq!(approval.status, expect, "{pairs:?} at {now}");
}

#[test]
fn status_shown_follows_redis_time() {
    check(&[], 1999, ApprovalStatus::Pending);
    check(&[], 2000, ApprovalStatus::Expired);
    check(&[("status", "approved")], 1500, ApprovalStatus::Approved);
    check(&[("status", "approved")], 2500, ApprovalStatus::Expired);
    check(&[("status", "rejected")], 9999, ApprovalStatus::Rejected);
    check(&[("status", "used")], 9999, ApprovalStatus::Used);
    check(&[("status", "expired")], 1500, ApprovalStatus::Expired);
}

#[test]
fn view_fills_the_protocol_fields() {
    let approval = view(
        &record(&[
            ("session_id", "s-1"),
            ("decided_by", "alice"),
            ("decided_at_ms", "1500"),
            ("reason", "ok"),
            ("status", "approved"),
        ]),
        1600,
    )
    .unwrap();
    assert_eq!(approval.session_id.unwrap().as_str(), "s-1");
    assert_eq!(approval.created_at, "1970-01-01T00:00:01.000Z");
    assert_eq!(
        approval.decided_at.as_deref(),
        Some("1970-01-01T00:00:01.500Z")
    );
    assert_eq!(approval.decided_by.as_deref(), Some("alice"));
    assert_eq!(
        approval.side_effects,
        vec![SideEffect::IsolatedRuntimeExecution]
    );
    assert_eq!(approval.risk_level, RiskLevel::High);
}

#[test]
fn a_damaged_record_is_an_error_not_a_panic() {
    for (key, value) in [
        ("status", "maybe"),
        ("expires_at_ms", "soon"),
        ("account", "a.b"),
        ("side_effects", "nope"),
        ("decided_at_ms", "x"),
    ] {
        let damaged = view(&record(&[(key, value)]), 0).unwrap_err();
        assert!(
            matches!(StoreError::from(damaged), StoreError::Failed(_)),
            "{key}={value}"
        );
    }
    let mut missing = record(&[]);
    missing.remove("tool_name");
    assert!(view(&missing, 0).is_err());
}
