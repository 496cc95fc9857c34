//! Every NATS subject and queue group toolmesh uses, public (`toolmesh.v1.…`, PROTOCOL.md) and
//! internal (`toolmesh.internal.v1.…`, ours to change). Nothing else builds a subject.

use crate::ids::{Account, InvocationId, NodeId};
use crate::role::Role;

/// Public subjects: the stable contract of PROTOCOL.md.
pub mod public {
    use super::*;

    pub const PREFIX: &str = "toolmesh.v1";

    /// `toolmesh.v1.call.<account>`
    pub fn call(account: &Account) -> String {
        format!("{PREFIX}.call.{account}")
    }
    /// Everything under `toolmesh.v1.call.`, including malformed accounts, so that they too
    /// get an `invalid_request` reply instead of "no responders".
    pub const CALL_ANY: &str = "toolmesh.v1.call.>";

    /// The verbs under `toolmesh.v1.approvals.<account>.`
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum ApprovalVerb {
        List,
        Get,
        Decide,
        Requested,
        Decided,
    }

    impl ApprovalVerb {
        pub fn as_str(self) -> &'static str {
            match self {
                ApprovalVerb::List => "list",
                ApprovalVerb::Get => "get",
                ApprovalVerb::Decide => "decide",
                ApprovalVerb::Requested => "requested",
                ApprovalVerb::Decided => "decided",
            }
        }
        fn parse(s: &str) -> Option<Self> {
            [
                ApprovalVerb::List,
                ApprovalVerb::Get,
                ApprovalVerb::Decide,
                ApprovalVerb::Requested,
                ApprovalVerb::Decided,
            ]
            .into_iter()
            .find(|v| v.as_str() == s)
        }
    }

    /// `toolmesh.v1.approvals.<account>.<verb>`
    pub fn approvals(account: &Account, verb: ApprovalVerb) -> String {
        format!("{PREFIX}.approvals.{account}.{}", verb.as_str())
    }
    pub const APPROVALS_ANY: &str = "toolmesh.v1.approvals.>";
    /// `toolmesh.v1.grants.<account>.<verb>` (`list` or `revoke`).
    pub fn grants(account: &Account, verb: &str) -> String {
        format!("{PREFIX}.grants.{account}.{verb}")
    }
    /// `toolmesh.v1.grants.<account>.list|revoke` of every account (the approval actor).
    pub const GRANTS_ANY: &str = "toolmesh.v1.grants.>";

    /// Splits `toolmesh.v1.grants.<account>.<verb>` (`list` or `revoke`); `Err` with the rest
    /// of the subject otherwise.
    pub fn grants_parts(subject: &str) -> Result<(&str, &str), String> {
        let rest = subject
            .strip_prefix("toolmesh.v1.grants.")
            .ok_or_else(|| subject.to_owned())?;
        match rest.split('.').collect::<Vec<_>>().as_slice() {
            [account, verb @ ("list" | "revoke")] => Ok((account, verb)),
            _ => Err(rest.to_owned()),
        }
    }
    /// `…decided` of every account: parked calls wait on these.
    pub const APPROVALS_DECIDED_ANY: &str = "toolmesh.v1.approvals.*.decided";
    /// `…requested` and `…decided` of one account, or of every account (for watchers).
    pub fn approvals_events(account: Option<&Account>) -> [String; 2] {
        let account = account.map_or("*", |a| a.as_str());
        [
            format!("{PREFIX}.approvals.{account}.requested"),
            format!("{PREFIX}.approvals.{account}.decided"),
        ]
    }

    /// Every RunEvent of every account (what `TOOLMESH_EVENTS` keeps).
    pub const EVENTS_ALL: &str = "toolmesh.v1.events.>";

    /// `toolmesh.v1.events.<account>.<invocation_id>`
    pub fn events(account: &Account, invocation: &InvocationId) -> String {
        format!("{PREFIX}.events.{account}.{invocation}")
    }
    /// Every event of one account.
    pub fn events_of(account: &Account) -> String {
        format!("{PREFIX}.events.{account}.*")
    }

    /// `toolmesh.v1.cancel.<account>`
    pub fn cancel(account: &Account) -> String {
        format!("{PREFIX}.cancel.{account}")
    }
    pub const CANCEL_ANY: &str = "toolmesh.v1.cancel.>";

    /// `toolmesh.v1.providers.announce`: a provider publishes any body here to be discovered
    /// at once (the bridge does, whenever an MCP server's tool set changes); every gateway
    /// listens (no queue group).
    pub const PROVIDERS_ANNOUNCE: &str = "toolmesh.v1.providers.announce";

    /// `toolmesh.v1.providers.cancel.<service>`: the gateway publishes
    /// `{"invocation_id","account","tool"}` here when a call running in that provider is
    /// cancelled. Every instance hears it (no queue group).
    pub fn provider_cancel(service: &str) -> String {
        format!("{PREFIX}.providers.cancel.{service}")
    }
    /// The cancels of every provider service.
    pub const PROVIDERS_CANCEL_ANY: &str = "toolmesh.v1.providers.cancel.*";
    /// The service name of a [`provider_cancel`] subject.
    pub fn provider_cancel_service(subject: &str) -> Option<&str> {
        subject
            .strip_prefix("toolmesh.v1.providers.cancel.")
            .filter(|s| !s.is_empty() && !s.contains('.'))
    }

    /// `toolmesh.v1.audit.<account>`: the account's hash chain in the `TOOLMESH_AUDIT` stream.
    pub fn audit(account: &Account) -> String {
        format!("{PREFIX}.audit.{account}")
    }
    /// The subjects of the `TOOLMESH_AUDIT` stream: one token after `audit`, so the query
    /// subjects below are not captured.
    pub const AUDIT_ENTRIES: &str = "toolmesh.v1.audit.*";
    /// `toolmesh.v1.audit.<account>.query`
    pub fn audit_query(account: &Account) -> String {
        format!("{PREFIX}.audit.{account}.query")
    }
    /// Every account's query subject (the gateway's queue subscription).
    pub const AUDIT_QUERY_ANY: &str = "toolmesh.v1.audit.*.query";
    /// The account token of `toolmesh.v1.audit.<account>.query`; `Err` carries the raw rest.
    pub fn audit_query_account(subject: &str) -> Result<&str, &str> {
        let rest = subject
            .strip_prefix("toolmesh.v1.audit.")
            .and_then(|s| s.strip_suffix(".query"))
            .unwrap_or(subject);
        one_token(rest)
    }

    /// `toolmesh.v1.status`: answered by any one node.
    pub const STATUS: &str = "toolmesh.v1.status";
    /// `toolmesh.v1.status.<node_id>`
    pub fn node_status(node: &NodeId) -> String {
        format!("{PREFIX}.status.{node}")
    }

    /// What is after `toolmesh.v1.<kind>.` when it is exactly one token (the account);
    /// `Err` carries the raw rest for the error message.
    pub fn account_of<'a>(subject: &'a str, kind: &str) -> Result<&'a str, &'a str> {
        let rest = subject
            .strip_prefix(PREFIX)
            .and_then(|s| s.strip_prefix('.'))
            .and_then(|s| s.strip_prefix(kind))
            .and_then(|s| s.strip_prefix('.'))
            .unwrap_or(subject);
        one_token(rest)
    }

    /// `rest` when it is exactly one token; `Err` carries it otherwise.
    fn one_token(rest: &str) -> Result<&str, &str> {
        if rest.contains('.') || rest.is_empty() {
            Err(rest)
        } else {
            Ok(rest)
        }
    }

    /// `toolmesh.v1.approvals.<account>.decide.<approver>`: a decision by `approver`, whose
    /// name the subject gives (NATS permissions give each person's user only their own).
    pub fn approvals_decide_as(account: &Account, approver: &str) -> String {
        format!("{PREFIX}.approvals.{account}.decide.{approver}")
    }

    /// Splits `toolmesh.v1.approvals.<account>.<verb>` and
    /// `toolmesh.v1.approvals.<account>.decide.<approver>` into the account, the verb and the
    /// approver the subject names; `Err` (the raw rest, for the error message) when the verb is
    /// unknown, the account spans several tokens or the approver is not `[A-Za-z0-9_-]{1,64}`.
    pub fn approvals_parts(subject: &str) -> Result<(&str, ApprovalVerb, Option<&str>), String> {
        let rest = subject
            .strip_prefix("toolmesh.v1.approvals.")
            .ok_or_else(|| subject.to_owned())?;
        let tokens: Vec<&str> = rest.split('.').collect();
        let (account, verb, approver) = match tokens.as_slice() {
            [account, verb] => (*account, *verb, None),
            [account, "decide", approver] if crate::policy::is_reviewer_name(approver) => {
                (*account, "decide", Some(*approver))
            }
            _ => return Err(rest.to_owned()),
        };
        let verb = ApprovalVerb::parse(verb).ok_or_else(|| rest.to_owned())?;
        Ok((account, verb, approver))
    }
}

/// Internal subjects between actors. Not part of the public contract.
pub mod internal {
    use super::*;

    pub const PREFIX: &str = "toolmesh.internal.v1";

    /// Where the gateway routes a tool call for the actor of `role` (queue group per role).
    pub fn run(role: Role) -> String {
        format!("{PREFIX}.run.{role}")
    }

    /// One node's own run subject for `role` (no queue group): where a worker hands a call
    /// for a session that another worker holds (sandbox sessions are pinned to one worker).
    pub fn run_on(role: Role, node: &NodeId) -> String {
        format!("{PREFIX}.node.{node}.run.{role}")
    }

    /// The approval gate: the gateway asks the approval actor to create, decide or consume.
    pub const APPROVAL_GATE: &str = "toolmesh.internal.v1.approval.gate";

    /// Approval release: the gateway gives back an approval its call consumed but that
    /// provably never ran (no actor took the call). Same queue group as the gate.
    pub const APPROVAL_RELEASE: &str = "toolmesh.internal.v1.approval.release";

    /// Approval withdrawal: the caller cancelled a call parked on the approval it made, so the
    /// gateway asks for that still-pending approval to be rejected (reason `withdrawn`). Same
    /// queue group as the gate.
    pub const APPROVAL_WITHDRAW: &str = "toolmesh.internal.v1.approval.withdraw";

    /// Edits before approving: the approval actor asks any gateway whether a reviewer's
    /// arguments pass the checks a call with them would meet ([`crate::wire::ArgumentsCheck`]),
    /// queue group of the gateway role.
    pub const GATEWAY_CHECK: &str = "toolmesh.internal.v1.gateway.check";

    /// An actor running an invocation that can be cancelled listens here for its duration.
    pub fn cancel(account: &Account, invocation: &InvocationId) -> String {
        format!("{PREFIX}.cancel.{account}.{invocation}")
    }

    /// The endpoint subject of one MCP tool the bridge serves: `…mcp.<server>.<endpoint>`
    /// (both names are `[A-Za-z0-9_-]`, so each is one token). Gateways route provider calls
    /// to the subject a service's `$SRV.INFO` names; the bridge's live under the internal
    /// prefix, which callers cannot publish on (docker/nats.conf).
    pub fn mcp_tool(server: &str, endpoint: &str) -> String {
        format!("{PREFIX}.mcp.{server}.{endpoint}")
    }

    /// Skill bundles: a sandbox worker asks the skill loader for the files of named skills
    /// (`kernel::skills`), queue group of the skills role.
    pub const SKILLS_BUNDLE: &str = "toolmesh.internal.v1.skills.bundle";

    /// Node heartbeats (every node publishes and listens; no queue group).
    pub const HEARTBEAT: &str = "toolmesh.internal.v1.heartbeat";

    /// Workspace sync (`kernel::sync`), queue group `toolmesh.workspace`: the regular files of
    /// a session's workspace with their stamps.
    pub const WORKSPACE_MANIFEST: &str = "toolmesh.internal.v1.workspace.manifest";
    /// Workspace sync: content of files, in chunks.
    pub const WORKSPACE_FETCH: &str = "toolmesh.internal.v1.workspace.fetch";
    /// Workspace sync: conditional puts and deletes.
    pub const WORKSPACE_APPLY: &str = "toolmesh.internal.v1.workspace.apply";
}

/// The NATS micro protocol's own subjects (ADR-32) that the gateway asks to discover tool
/// providers. They are NATS's namespace, not toolmesh's.
pub mod srv {
    /// `$SRV.INFO`: every instance of every service answers with its endpoints.
    pub const INFO_ALL: &str = "$SRV.INFO";

    /// `$SRV.PING.<service>.<id>`: one instance; "no responders" means it is gone.
    pub fn ping_instance(service: &str, id: &str) -> String {
        format!("$SRV.PING.{service}.{id}")
    }
}

/// Queue groups: one per role, so that any number of nodes share the work of a role.
pub mod queue {
    use super::Role;

    pub fn of(role: Role) -> String {
        format!("toolmesh.{role}")
    }
    /// `toolmesh.v1.status` is answered by one node out of all.
    pub const STATUS: &str = "toolmesh.status";
}

#[cfg(test)]
mod tests {
    use super::public::*;
    use super::*;

    #[test]
    fn account_of_takes_exactly_one_token() {
        assert_eq!(account_of("toolmesh.v1.call.acme", "call"), Ok("acme"));
        assert_eq!(account_of("toolmesh.v1.call.a.b", "call"), Err("a.b"));
        assert_eq!(account_of("toolmesh.v1.cancel.x", "cancel"), Ok("x"));
        let query = audit_query_account;
        assert_eq!(query("toolmesh.v1.audit.acme.query"), Ok("acme"));
        assert_eq!(query("toolmesh.v1.audit.a.b.query"), Err("a.b"));
        assert_eq!(query("toolmesh.v1.audit..query"), Err(""));
    }

    #[test]
    fn approvals_parts_splits_account_and_verb() {
        assert_eq!(
            approvals_parts("toolmesh.v1.approvals.acme.decide").map(|(a, v, _)| (a, v)),
            Ok(("acme", ApprovalVerb::Decide))
        );
        assert!(approvals_parts("toolmesh.v1.approvals.a.b.list").is_err());
        assert!(approvals_parts("toolmesh.v1.approvals.acme.frobnicate").is_err());
        // The approver a subject names is one token of a reviewer's name, after `decide` only.
        assert_eq!(
            approvals_parts("toolmesh.v1.approvals.acme.decide.alice"),
            Ok(("acme", ApprovalVerb::Decide, Some("alice")))
        );
        assert!(approvals_parts("toolmesh.v1.approvals.acme.get.alice").is_err());
        assert!(approvals_parts("toolmesh.v1.approvals.acme.decide.a.b").is_err());
        assert!(approvals_parts("toolmesh.v1.approvals.acme.decide.").is_err());
        let long = format!("toolmesh.v1.approvals.acme.decide.{}", "x".repeat(65));
        assert!(approvals_parts(&long).is_err());
        assert_eq!(
            approvals_decide_as(&Account::parse("acme").unwrap(), "bob"),
            "toolmesh.v1.approvals.acme.decide.bob"
        );
        let acme = Account::parse("acme").unwrap();
        assert_eq!(
            approvals(&acme, ApprovalVerb::Requested),
            "toolmesh.v1.approvals.acme.requested"
        );
    }

    #[test]
    fn provider_subjects_are_public_and_per_service() {
        assert_eq!(PROVIDERS_ANNOUNCE, "toolmesh.v1.providers.announce");
        assert_eq!(
            provider_cancel("tickets"),
            "toolmesh.v1.providers.cancel.tickets"
        );
        assert_eq!(super::srv::ping_instance("a", "b"), "$SRV.PING.a.b");
    }

    #[test]
    fn provider_subjects_name_their_service() {
        let cancel = provider_cancel("mcp-git");
        assert_eq!(cancel, "toolmesh.v1.providers.cancel.mcp-git");
        assert_eq!(provider_cancel_service(&cancel), Some("mcp-git"));
        assert_eq!(
            provider_cancel_service("toolmesh.v1.providers.cancel."),
            None
        );
        assert_eq!(
            provider_cancel_service("toolmesh.v1.providers.cancel.a.b"),
            None
        );
        assert_eq!(
            internal::mcp_tool("git", "git_status"),
            "toolmesh.internal.v1.mcp.git.git_status"
        );
    }

    #[test]
    fn internal_subjects_are_namespaced() {
        assert_eq!(
            internal::run(Role::Sandbox),
            "toolmesh.internal.v1.run.sandbox"
        );
        assert_eq!(queue::of(Role::Gateway), "toolmesh.gateway");
    }

    #[test]
    fn approval_subjects_are_internal_and_distinct() {
        // Both are constants (the approval actor subscribes them by `&'static str`): check
        // they stay under the internal prefix and never collide.
        for subject in [
            internal::APPROVAL_GATE,
            internal::APPROVAL_RELEASE,
            internal::APPROVAL_WITHDRAW,
        ] {
            assert!(
                subject.starts_with(internal::PREFIX) && subject.contains(".approval."),
                "{subject}"
            );
        }
        assert_eq!(
            internal::APPROVAL_RELEASE,
            "toolmesh.internal.v1.approval.release"
        );
        assert_eq!(
            internal::APPROVAL_WITHDRAW,
            "toolmesh.internal.v1.approval.withdraw"
        );
        assert_ne!(internal::APPROVAL_GATE, internal::APPROVAL_RELEASE);
        assert_ne!(internal::APPROVAL_RELEASE, internal::APPROVAL_WITHDRAW);
    }
}
