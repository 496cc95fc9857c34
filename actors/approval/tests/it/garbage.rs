//! Garbage on every subject gets an `invalid_request` reply, and the actor keeps serving.

use serde_json::json;
use toolmesh_kernel::wire::ApprovalStatus;
use toolmesh_testkit::request_raw;

use crate::support::*;

#[actix_rt::test]
async fn garbage_on_the_public_subjects_is_invalid_request() {
    let rig = Rig::start().await;
    let long_account = "a".repeat(65);
    let long_approver = "x".repeat(257);
    let long_reason = "y".repeat(1025);
    let cases: Vec<(String, Vec<u8>)> = vec![
        // Subjects: malformed accounts, unknown or missing verbs, event verbs asked as requests.
        ("toolmesh.v1.approvals.a$b.list".into(), b"{}".to_vec()),
        (
            format!("toolmesh.v1.approvals.{long_account}.list"),
            b"{}".to_vec(),
        ),
        ("toolmesh.v1.approvals.a.b.list".into(), b"{}".to_vec()),
        (
            "toolmesh.v1.approvals.acme.frobnicate".into(),
            b"{}".to_vec(),
        ),
        ("toolmesh.v1.approvals.acme".into(), b"{}".to_vec()),
        (
            "toolmesh.v1.approvals.acme.requested".into(),
            b"{}".to_vec(),
        ),
        ("toolmesh.v1.approvals.acme.decided".into(), b"{}".to_vec()),
        // Bodies.
        ("toolmesh.v1.approvals.acme.list".into(), b"".to_vec()),
        ("toolmesh.v1.approvals.acme.list".into(), b"nope".to_vec()),
        ("toolmesh.v1.approvals.acme.list".into(), b"[]".to_vec()),
        ("toolmesh.v1.approvals.acme.list".into(), b"null".to_vec()),
        (
            "toolmesh.v1.approvals.acme.list".into(),
            b"\xff\xfe".to_vec(),
        ),
        ("toolmesh.v1.approvals.acme.get".into(), b"{}".to_vec()),
        (
            "toolmesh.v1.approvals.acme.get".into(),
            br#"{"id":5}"#.to_vec(),
        ),
        (
            "toolmesh.v1.approvals.acme.get".into(),
            br#"{"id":"a b"}"#.to_vec(),
        ),
        (
            "toolmesh.v1.approvals.acme.get".into(),
            br#"{"id":"acme:appr_1"}"#.to_vec(),
        ),
        (
            "toolmesh.v1.approvals.acme.get".into(),
            b"\"appr_1\"".to_vec(),
        ),
        (
            "toolmesh.v1.approvals.acme.decide".into(),
            br#"{"id":"appr_1"}"#.to_vec(),
        ),
        (
            "toolmesh.v1.approvals.acme.decide".into(),
            br#"{"id":"appr_1","approved":1}"#.to_vec(),
        ),
        (
            "toolmesh.v1.approvals.acme.decide".into(),
            br#"{"approved":true}"#.to_vec(),
        ),
        (
            "toolmesh.v1.approvals.acme.decide".into(),
            br#"{"id":"appr_1","approved":true,"reason":[]}"#.to_vec(),
        ),
        (
            "toolmesh.v1.approvals.acme.decide".into(),
            json!({"id": "appr_1", "approved": true, "approver": long_approver})
                .to_string()
                .into_bytes(),
        ),
        (
            "toolmesh.v1.approvals.acme.decide".into(),
            json!({"id": "appr_1", "approved": false, "reason": long_reason})
                .to_string()
                .into_bytes(),
        ),
        (
            "toolmesh.v1.approvals.acme.decide".into(),
            b"[true]".to_vec(),
        ),
    ];
    for (subject, body) in cases {
        let reply = request_raw(&rig.client, subject.clone(), body.clone()).await;
        assert_eq!(
            error_of(&reply),
            "invalid_request",
            "{subject} {:?}: {reply}",
            String::from_utf8_lossy(&body)
        );
        assert!(reply.get("invocation_id").is_none(), "{reply}");
    }
    // Still serving.
    let created = rig.create(&Call::new("acme")).await;
    assert_eq!(
        rig.status("acme", &created.id).await,
        ApprovalStatus::Pending
    );
}

#[actix_rt::test]
async fn garbage_on_the_gate_is_refused_as_invalid_request() {
    let rig = Rig::start().await;
    let good = Call::new("acme").body();
    let with = |path: &[&str], value: serde_json::Value| {
        let mut body = good.clone();
        let mut at = &mut body;
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at[path[path.len() - 1]] = value;
        body.to_string().into_bytes()
    };
    let cases: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"nope".to_vec(),
        b"[]".to_vec(),
        b"{}".to_vec(),
        b"\xff\xfe".to_vec(),
        with(&["invocation", "account"], json!("a.b")),
        with(&["invocation", "invocation_id"], json!("has space")),
        with(&["invocation", "session_id"], json!("a/b")),
        with(&["tool_name"], json!("")),
        with(&["risk_level"], json!("extreme")),
        with(&["side_effects"], json!(["teleport"])),
        with(&["arguments_sha256"], json!("not-a-hash")),
        with(&["grant"], json!({"id": "appr.1"})),
        with(&["grant"], json!({"approved": "yes"})),
        with(&["grant"], json!(true)),
    ];
    for body in cases {
        let (code, _, approval) = refusal(rig.gate_raw(&body).await);
        assert_eq!(
            code,
            "invalid_request",
            "{:?}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(approval, None);
    }
    assert_eq!(
        rig.create(&Call::new("acme")).await.status,
        ApprovalStatus::Pending
    );
}
