//! The providers one gateway knows, from the `$SRV.INFO` replies it has seen: their instances
//! with when each was last seen, their tools, the tools refused and why. Pure state: the
//! discovery task feeds it replies and the clock, and takes the registry it builds.
//!
//! Name clashes: a built-in name is always refused. Between providers the first come keeps a
//! name for as long as it offers it; providers first seen in the same round take names in
//! the order of their service names (then endpoint order). Gateways that saw the providers
//! start in the same order agree; one that starts later and meets two claimants at once gives
//! the name to the first by service name.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::service::Info;
use serde::Serialize;

use toolmesh_kernel::tools::{RegisteredTool, ToolRegistry};

use super::metadata::{self, TOOL_KEY};

/// An instance not seen for this long is gone; a provider goes with its last instance.
pub const INSTANCE_EXPIRY: Duration = Duration::from_secs(8);

/// One instance's reply to `$SRV.INFO`, with how long it took.
#[derive(Debug)]
pub struct Seen {
    pub info: Info,
    pub latency: Duration,
}

#[derive(Debug)]
struct Instance {
    version: String,
    description: String,
    last_seen: Instant,
    last_seen_ms: u64,
    latency: Duration,
    /// `(name, subject, toolmesh.tool metadata)` of each tool endpoint, in the order given.
    endpoints: Vec<Endpoint>,
}

/// `(name, subject, toolmesh.tool metadata)` of one tool endpoint.
type Endpoint = (String, String, String);
/// One checked tool endpoint: its name and the tool, or why it is refused.
type Checked = (String, Result<Arc<RegisteredTool>, String>);

/// A tool endpoint's last check, kept while its definition stays the same.
#[derive(Debug)]
struct Compiled {
    subject: String,
    metadata: String,
    tool: Result<Arc<RegisteredTool>, String>,
}

/// What `component_status` shows of one provider.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProviderStatus {
    pub name: String,
    pub version: String,
    pub description: String,
    pub instances: usize,
    pub instance_ids: Vec<String>,
    pub tools: Vec<String>,
    pub refused: Vec<Refused>,
    pub health: Health,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Refused {
    pub tool: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Health {
    /// When an instance last answered `$SRV.INFO` (RFC 3339).
    pub last_seen: String,
    /// How long that answer took, in milliseconds.
    pub ping_ms: f64,
}

/// Every provider a gateway knows, by service name.
#[derive(Debug, Default)]
pub struct Catalog {
    services: BTreeMap<String, BTreeMap<String, Instance>>,
    /// Instances found gone (their ping had no responders), with when: a `$SRV.INFO` reply
    /// from before they went, still on its way, does not bring them back. Kept for
    /// [`INSTANCE_EXPIRY`]; instance ids are never reused.
    forgotten: HashMap<(String, String), Instant>,
    compiled: HashMap<(String, String), Compiled>,
    /// Tool name → the service that holds it (first come).
    holders: HashMap<String, String>,
}

/// What one build gives: the tools granted (in service order) and every provider's status.
#[derive(Debug)]
pub struct Built {
    pub tools: Vec<Arc<RegisteredTool>>,
    pub status: Vec<ProviderStatus>,
}

impl Catalog {
    /// Records the replies of one round. Services without a tool endpoint are not providers
    /// and are left out.
    pub fn observe(&mut self, seen: Vec<Seen>, now: Instant, now_ms: u64) {
        for Seen { info, latency } in seen {
            let endpoints: Vec<Endpoint> = info
                .endpoints
                .iter()
                .filter_map(|e| {
                    e.metadata
                        .get(TOOL_KEY)
                        .map(|m| (e.name.clone(), e.subject.clone(), m.clone()))
                })
                .collect();
            if endpoints.is_empty() || info.name.is_empty() || info.id.is_empty() {
                continue;
            }
            if self
                .forgotten
                .contains_key(&(info.name.clone(), info.id.clone()))
            {
                continue;
            }
            self.services.entry(info.name).or_default().insert(
                info.id,
                Instance {
                    version: info.version,
                    description: info.description,
                    last_seen: now,
                    last_seen_ms: now_ms,
                    latency,
                    endpoints,
                },
            );
        }
    }

    /// Drops instances not seen within [`INSTANCE_EXPIRY`], and providers left without one.
    pub fn expire(&mut self, now: Instant) {
        for instances in self.services.values_mut() {
            instances.retain(|_, i| now.saturating_duration_since(i.last_seen) < INSTANCE_EXPIRY);
        }
        self.services.retain(|_, instances| !instances.is_empty());
        self.forgotten
            .retain(|_, at| now.saturating_duration_since(*at) < INSTANCE_EXPIRY);
    }

    /// Drops one instance found gone before its expiry, and its provider when it was the
    /// last. Replies to `$SRV.INFO` from it are ignored from now on.
    pub fn forget(&mut self, service: &str, id: &str, now: Instant) {
        if let Some(instances) = self.services.get_mut(service) {
            instances.remove(id);
            if instances.is_empty() {
                self.services.remove(service);
            }
        }
        self.forgotten
            .insert((service.to_owned(), id.to_owned()), now);
    }

    /// Whether `service` has an instance this gateway knows.
    pub fn knows(&self, service: &str) -> bool {
        self.services.contains_key(service)
    }

    /// The instance ids of `service` this gateway knows.
    pub fn instances_of(&self, service: &str) -> Vec<String> {
        self.services
            .get(service)
            .map(|i| i.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Resolves names and checks metadata: the tools to register and every provider's status.
    pub fn build(&mut self, builtin: &ToolRegistry) -> Built {
        // Each service's tool endpoints: the first instance (by id) that has a name defines it.
        let mut offered: Vec<(String, Vec<Endpoint>, Vec<Refused>)> = Vec::new();
        for (service, instances) in &self.services {
            let mut endpoints: Vec<Endpoint> = Vec::new();
            let mut refused = Vec::new();
            for (n, instance) in instances.values().enumerate() {
                let mut names_here = BTreeSet::new();
                for endpoint in &instance.endpoints {
                    if !names_here.insert(endpoint.0.clone()) {
                        if n == 0 {
                            refused.push(Refused {
                                tool: endpoint.0.clone(),
                                reason: "another endpoint of this service has the same name".into(),
                            });
                        }
                        continue;
                    }
                    if !endpoints.iter().any(|e| e.0 == endpoint.0) {
                        endpoints.push(endpoint.clone());
                    }
                }
            }
            offered.push((service.clone(), endpoints, refused));
        }

        // Check (or reuse the check of) every definition.
        let mut compiled = HashMap::new();
        let mut checked: Vec<(String, Vec<Checked>)> = Vec::new();
        for (service, endpoints, _) in &offered {
            let mut tools = Vec::new();
            for (name, subject, meta) in endpoints {
                let key = (service.clone(), name.clone());
                let entry = match self.compiled.remove(&key) {
                    Some(c) if c.subject == *subject && c.metadata == *meta => c,
                    _ => Compiled {
                        subject: subject.clone(),
                        metadata: meta.clone(),
                        tool: metadata::tool_of(service, name, subject, meta).map(Arc::new),
                    },
                };
                tools.push((name.clone(), entry.tool.clone()));
                compiled.insert(key, entry);
            }
            checked.push((service.clone(), tools));
        }
        self.compiled = compiled;

        // Names: built-ins refused; a holder keeps its name; the rest by service order.
        let mut granted: HashMap<String, String> = HashMap::new();
        for (service, tools) in &checked {
            for (name, tool) in tools {
                if tool.is_ok() && !builtin.has(name) && self.holders.get(name) == Some(service) {
                    granted.insert(name.clone(), service.clone());
                }
            }
        }
        let mut refusals: HashMap<String, Vec<Refused>> = HashMap::new();
        let mut registered = Vec::new();
        let mut names_of: HashMap<String, Vec<String>> = HashMap::new();
        for (service, tools) in &checked {
            for (name, tool) in tools {
                let refuse = |reason: String| Refused {
                    tool: name.clone(),
                    reason,
                };
                let refusal = match tool {
                    Err(reason) => Some(refuse(reason.clone())),
                    Ok(_) if builtin.has(name) => {
                        Some(refuse(format!("{name} is a built-in tool")))
                    }
                    Ok(_) => match granted.get(name) {
                        Some(holder) if holder != service => Some(refuse(format!(
                            "{name} is already served by the provider {holder}"
                        ))),
                        _ => None,
                    },
                };
                match (refusal, tool) {
                    (Some(r), _) => refusals.entry(service.clone()).or_default().push(r),
                    (None, Ok(tool)) => {
                        granted.insert(name.clone(), service.clone());
                        registered.push(tool.clone());
                        names_of
                            .entry(service.clone())
                            .or_default()
                            .push(name.clone());
                    }
                    (None, Err(_)) => unreachable!("refused above"),
                }
            }
        }
        self.holders = granted;

        let mut status = Vec::new();
        for (service, _, duplicate) in offered {
            let instances = &self.services[&service];
            let latest = instances
                .values()
                .max_by_key(|i| i.last_seen)
                .expect("a provider has an instance");
            let mut refused = duplicate;
            refused.extend(refusals.remove(&service).unwrap_or_default());
            status.push(ProviderStatus {
                tools: names_of.remove(&service).unwrap_or_default(),
                name: service,
                version: latest.version.clone(),
                description: latest.description.clone(),
                instances: instances.len(),
                instance_ids: instances.keys().cloned().collect(),
                refused,
                health: Health {
                    last_seen: toolmesh_kernel::time::ms_to_rfc3339(latest.last_seen_ms),
                    ping_ms: (latest.latency.as_secs_f64() * 1e5).round() / 100.0,
                },
            });
        }
        Built {
            tools: registered,
            status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The gateway's own tools stand for the built-ins (the gateway sees no actor's table).
    fn builtin() -> ToolRegistry {
        ToolRegistry::new(crate::tools::LISTED.iter().copied()).unwrap()
    }

    fn info(service: &str, id: &str, tools: &[&str]) -> Seen {
        let endpoints: Vec<Value> = tools
            .iter()
            .map(|name| {
                json!({
                    "name": name,
                    "subject": format!("{service}.{name}"),
                    "queue_group": "q",
                    "metadata": {TOOL_KEY: json!({
                        "description": "d",
                        "input_schema": {"type": "object"},
                        "risk_level": "low",
                    }).to_string()},
                })
            })
            .collect();
        let info = serde_json::from_value(json!({
            "type": "io.nats.micro.v1.info_response",
            "name": service, "id": id, "description": "", "version": "1.0.0",
            "metadata": {}, "endpoints": endpoints,
        }))
        .unwrap();
        Seen {
            info,
            latency: Duration::from_millis(1),
        }
    }
    use serde_json::Value;

    fn names(built: &Built) -> Vec<(String, String)> {
        built
            .tools
            .iter()
            .map(|t| {
                (
                    t.spec.name.to_string(),
                    t.spec
                        .execution()
                        .trim_start_matches("provider:")
                        .to_owned(),
                )
            })
            .collect()
    }

    /// A catalog that saw provider `a` at `t0` on two instances, `1` and `2`, each with `echo`.
    fn two_instances_of_a(t0: Instant) -> Catalog {
        let mut c = Catalog::default();
        c.observe(
            vec![info("a", "1", &["echo"]), info("a", "2", &["echo"])],
            t0,
            0,
        );
        c
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn first_come_keeps_a_name_and_ties_go_by_service_name() {
        let t0 = Instant::now();
        let mut c = Catalog::default();
        // Seen in one round: b-svc and a-svc both offer "echo"; a-svc wins by name.
        c.observe(
            vec![
                info("b-svc", "1", &["echo", "b_only"]),
                info("a-svc", "1", &["echo"]),
            ],
            t0,
            0,
        );
        let built = c.build(&builtin());
        assert_eq!(
            names(&built),
            pairs(&[("echo", "a-svc"), ("b_only", "b-svc")])
        );
        let b = built.status.iter().find(|s| s.name == "b-svc").unwrap();
        assert_eq!(b.refused[0].tool, "echo");
        assert!(b.refused[0].reason.contains("a-svc"), "{:?}", b.refused);

        // A newcomer whose name sorts first does not take the name from its holder.
        let mut c = Catalog::default();
        c.observe(vec![info("m-svc", "1", &["echo"])], t0, 0);
        c.build(&builtin());
        c.observe(vec![info("a-svc", "1", &["echo"])], t0, 0);
        let built = c.build(&builtin());
        assert_eq!(names(&built), pairs(&[("echo", "m-svc")]));

        // Built-in names are never taken.
        let mut c = Catalog::default();
        c.observe(vec![info("x", "1", &["tool_search", "fine"])], t0, 0);
        let built = c.build(&builtin());
        assert_eq!(names(&built), pairs(&[("fine", "x")]));
        assert!(built.status[0].refused[0].reason.contains("built-in"));
    }

    #[test]
    fn a_provider_goes_with_its_last_instance_and_frees_its_names() {
        let t0 = Instant::now();
        let mut c = two_instances_of_a(t0);
        c.observe(vec![info("b", "1", &["echo"])], t0, 0);
        let built = c.build(&builtin());
        assert_eq!(built.status[0].instances, 2);
        assert_eq!(names(&built), pairs(&[("echo", "a")]));
        // Instance 2 keeps answering; 1 does not.
        let t1 = t0 + INSTANCE_EXPIRY - Duration::from_secs(1);
        c.observe(
            vec![info("a", "2", &["echo"]), info("b", "1", &["echo"])],
            t1,
            0,
        );
        c.expire(t0 + INSTANCE_EXPIRY);
        assert_eq!(c.instances_of("a"), ["2"]);
        // Then 2 stops too: a goes, b gets the name.
        c.observe(vec![info("b", "1", &["echo"])], t1 + INSTANCE_EXPIRY, 0);
        c.expire(t1 + INSTANCE_EXPIRY);
        let built = c.build(&builtin());
        assert_eq!(names(&built), pairs(&[("echo", "b")]));
        assert!(c.instances_of("a").is_empty());
    }

    #[test]
    fn a_forgotten_instance_stays_gone_until_its_expiry() {
        let t0 = Instant::now();
        let mut c = two_instances_of_a(t0);
        c.forget("a", "1", t0);
        assert_eq!(c.instances_of("a"), ["2"]);
        // A late reply of 1 (sent before it went) does not bring it back.
        c.observe(vec![info("a", "1", &["echo"])], t0, 0);
        assert_eq!(c.instances_of("a"), ["2"]);
        c.forget("a", "2", t0);
        assert!(!c.knows("a"));
        assert!(c.build(&builtin()).tools.is_empty());
        // Past the expiry the tombstone goes (ids are never reused; this only frees memory).
        c.expire(t0 + INSTANCE_EXPIRY);
        c.observe(vec![info("a", "1", &["echo"])], t0 + INSTANCE_EXPIRY, 0);
        assert!(c.knows("a"));
    }

    #[test]
    fn services_without_tool_endpoints_are_not_providers() {
        let mut c = Catalog::default();
        c.observe(vec![info("toolmesh-node", "n1", &[])], Instant::now(), 0);
        assert!(c.build(&builtin()).status.is_empty());
    }
}
