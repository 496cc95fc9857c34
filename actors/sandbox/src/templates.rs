//! Sandbox templates (PROTOCOL.md "Sandbox templates"): named environments a session's sandbox
//! is made from. `TOOLMESH_SANDBOX_TEMPLATES` names a TOML file of `[templates.<name>]` tables;
//! the template `default` always exists, made from the `TOOLMESH_SANDBOX_*` variables, and the
//! file may redefine it.
//!
//! A field a template leaves out is the default template's, except `network` (`none`), `allow`
//! (empty) and `warm` (none kept before the template is first used on a worker, then one). The
//! file is read and checked once, before the node connects: any error names the file, the
//! template and the field (`templates.py.memory_mb: must be at least 16`), and stops the node.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use toolmesh_kernel::config::{ConfigFile, FileError, RawEnv, Unplaced};

use crate::backend::SandboxLimits;
use crate::config::SandboxConfig;
use crate::egress::allow::is_host_label;

/// The variable naming the templates file.
pub const TEMPLATES_VAR: &str = "TOOLMESH_SANDBOX_TEMPLATES";
/// The template every session uses unless a call names another.
pub const DEFAULT_TEMPLATE: &str = "default";
/// Warm sandboxes a template that declares no `warm` keeps once it has been used on a worker.
pub const LAZY_WARM: usize = 1;
/// The runtimes a template may name: Docker's own, and gVisor's.
pub const RUNTIMES: &[&str] = &["runc", "runsc"];

/// How a template's sandbox reaches the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// No network at all.
    None,
    /// A Docker network the operator opened on purpose (`TOOLMESH_SANDBOX_NETWORK`, the default
    /// template only).
    Docker(String),
    /// Only the worker's egress proxy, which relays to what the `allow` entries match.
    Allow(Vec<AllowEntry>),
}

impl Network {
    /// What `sandbox_status` says: `none`, `allow`, or the Docker network's name.
    pub fn wire_name(&self) -> &str {
        match self {
            Network::None => "none",
            Network::Docker(name) => name,
            Network::Allow(_) => "allow",
        }
    }
}

/// One `allow` entry: `host`, `*.domain`, `CIDR[:port]` or `host:port` (no port: any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowEntry {
    /// Exactly this host name.
    Host { host: String, port: Option<u16> },
    /// Any name below this domain (not the domain itself).
    Subdomains { domain: String, port: Option<u16> },
    /// Addresses in this network, named by address (the only way to a non-public one).
    Network {
        net: ipnet::IpNet,
        port: Option<u16>,
    },
}

impl AllowEntry {
    /// Parses one entry; `Err` says what is wrong with it.
    pub fn parse(raw: &str) -> Result<AllowEntry, String> {
        let entry = raw.trim();
        if entry.is_empty() {
            return Err("an allow entry may not be empty".into());
        }
        if entry != raw {
            return Err(format!("{raw:?} has spaces around it"));
        }
        // `[v6]:port`, `v6/len` and a bare v6 address hold colons of their own.
        let (target, port) = split_port(entry)?;
        if let Ok(net) = target.parse::<ipnet::IpNet>() {
            return Ok(AllowEntry::Network {
                net: net.trunc(),
                port,
            });
        }
        if let Ok(ip) = target.parse::<IpAddr>() {
            return Ok(AllowEntry::Network {
                net: ipnet::IpNet::from(ip),
                port,
            });
        }
        if let Some(domain) = target.strip_prefix("*.") {
            check_host(domain).map_err(|why| format!("{entry:?}: {why}"))?;
            return Ok(AllowEntry::Subdomains {
                domain: domain.to_ascii_lowercase(),
                port,
            });
        }
        check_host(target).map_err(|why| format!("{entry:?}: {why}"))?;
        Ok(AllowEntry::Host {
            host: target.to_ascii_lowercase(),
            port,
        })
    }
}

/// Splits `target[:port]`; an IPv6 target is `[addr]:port`, or has no port.
fn split_port(entry: &str) -> Result<(&str, Option<u16>), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{entry:?}: the port must be a number from 1 to 65535"))
    };
    if let Some(rest) = entry.strip_prefix('[') {
        let (target, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{entry:?}: an opening [ without ]"))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((target, Some(port(p)?))),
            None if after.is_empty() => Ok((target, None)),
            None => Err(format!("{entry:?}: only :port may follow ]")),
        };
    }
    match entry.matches(':').count() {
        0 => Ok((entry, None)),
        1 => {
            let (target, p) = entry.split_once(':').expect("one colon");
            Ok((target, Some(port(p)?)))
        }
        // A bare IPv6 address or network: no port.
        _ => Ok((entry, None)),
    }
}

/// A DNS name: dot-separated labels of letters, digits and `-`, 253 characters at most.
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() || host.len() > 253 {
        return Err("a host name is 1 to 253 characters".into());
    }
    for label in host.split('.') {
        if !is_host_label(label, false) {
            return Err(
                "not a host name (letters, digits and - in dot-separated labels; a wildcard only as a leading *.)"
                    .into(),
            );
        }
    }
    Ok(())
}

/// One named template, with every field resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub name: String,
    pub image: String,
    /// Memory, pids, CPUs, runtime and (for the backend) the Docker network mode.
    pub limits: SandboxLimits,
    pub network: Network,
    /// Started sandboxes kept ready; `None`: [`LAZY_WARM`] once used on the worker.
    pub warm: Option<usize>,
    /// A session's sandbox of this template is removed after this long unused.
    pub idle_ttl: Duration,
}

impl Template {
    /// The runtime's name for `sandbox_status`: the template's, or `runc` (the engine's usual
    /// default) when it names none.
    pub fn runtime_name(&self) -> &str {
        self.limits.runtime.as_deref().unwrap_or("runc")
    }
}

/// The templates of a worker: `default` and those of the file, by name.
#[derive(Debug, Clone)]
pub struct Templates {
    by_name: BTreeMap<String, Arc<Template>>,
    /// The file they came from, if any.
    pub file: Option<PathBuf>,
}

/// The templates file: TOML, named by [`TEMPLATES_VAR`].
pub const TEMPLATES_FILE: ConfigFile = ConfigFile {
    var: TEMPLATES_VAR,
    format: "TOML",
};

/// Whether `name` may name a template: `[A-Za-z0-9_-]{1,64}`.
pub fn is_template_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

impl Templates {
    /// Only `default`, from the sandbox settings.
    pub fn only_default(config: &SandboxConfig) -> Templates {
        let default = default_of(config);
        Templates {
            by_name: BTreeMap::from([(default.name.clone(), Arc::new(default))]),
            file: None,
        }
    }

    /// Only `template`, as `default` (tests and benches).
    pub fn of_default(template: Template) -> Templates {
        Templates {
            by_name: BTreeMap::from([(DEFAULT_TEMPLATE.to_owned(), Arc::new(template))]),
            file: None,
        }
    }

    /// The same templates with no warm sandboxes at all (a backend that keeps none).
    pub fn without_warm(mut self) -> Templates {
        for template in self.by_name.values_mut() {
            Arc::make_mut(template).warm = Some(0);
        }
        self
    }

    /// Reads [`TEMPLATES_VAR`] (unset: only `default`).
    pub fn from_env(env: &RawEnv, config: &SandboxConfig) -> Result<Templates, FileError> {
        match env.get(TEMPLATES_VAR) {
            None => Ok(Templates::only_default(config)),
            Some(path) => Templates::from_file(Path::new(path.trim()), config),
        }
    }

    pub fn from_file(path: &Path, config: &SandboxConfig) -> Result<Templates, FileError> {
        let mut templates = TEMPLATES_FILE.read(path, |text| Templates::parse(text, config))?;
        templates.file = Some(path.to_owned());
        Ok(templates)
    }

    /// Parses and checks the file's text against the sandbox settings (the default template,
    /// the image allow-list).
    pub fn parse(text: &str, config: &SandboxConfig) -> Result<Templates, Unplaced> {
        let root: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            Unplaced::Syntax(e.message().to_owned() + &line_of(text, e.span()))
        })?;
        for key in root.keys() {
            if key != "templates" {
                return Err(Unplaced::field(
                    key,
                    "unknown key; the file holds [templates.<name>] tables",
                ));
            }
        }
        let empty = toml::Table::new();
        let tables = match root.get("templates") {
            None => &empty,
            Some(toml::Value::Table(t)) => t,
            Some(_) => {
                return Err(Unplaced::field(
                    "templates",
                    "must be a table of [templates.<name>] tables",
                ))
            }
        };
        let mut base = default_of(config);
        // `default` first: the others inherit from it as the file defines it.
        if let Some(table) = tables.get(DEFAULT_TEMPLATE) {
            base = parse_template(DEFAULT_TEMPLATE, table, &base, config, true)?;
        }
        let mut by_name = BTreeMap::from([(base.name.clone(), Arc::new(base.clone()))]);
        for (name, table) in tables {
            if name == DEFAULT_TEMPLATE {
                continue;
            }
            if !is_template_name(name) {
                return Err(Unplaced::field(
                    format!("templates.{name:?}"),
                    "a template name is 1 to 64 of A-Z a-z 0-9 _ -",
                ));
            }
            let template = parse_template(name, table, &base, config, false)?;
            by_name.insert(name.clone(), Arc::new(template));
        }
        Ok(Templates {
            by_name,
            file: None,
        })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Template>> {
        self.by_name.get(name)
    }

    pub fn default_template(&self) -> &Arc<Template> {
        self.by_name
            .get(DEFAULT_TEMPLATE)
            .expect("the default template always exists")
    }

    /// Every template, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Template>> {
        self.by_name.values()
    }

    pub fn names(&self) -> Vec<String> {
        self.by_name.keys().cloned().collect()
    }

    /// The template `name` names, or `invalid_arguments` at `pointer` listing the others.
    pub fn resolve(
        &self,
        name: &str,
        pointer: &str,
    ) -> Result<&Arc<Template>, toolmesh_kernel::ToolError> {
        self.get(name).ok_or_else(|| {
            toolmesh_kernel::ToolError::invalid_argument(
                pointer,
                format!(
                    "no sandbox template {name:?} on the sandbox workers; they have {}",
                    self.names().join(", ")
                ),
            )
            .with("available_templates", self.names())
        })
    }
}

/// The refusal of a call naming `asked` in a session whose sandbox is of `bound`.
pub fn bound_elsewhere(bound: &str, asked: &str) -> toolmesh_kernel::ToolError {
    toolmesh_kernel::ToolError::new(
        toolmesh_kernel::ErrorCode::Conflict,
        format!(
            "the session's sandbox is of template {bound:?}, not {asked:?}: a session is bound to the template of its first sandbox; name {bound:?} or none, or use another session"
        ),
    )
    .with("template_id", bound)
}

/// `default` as the `TOOLMESH_SANDBOX_*` variables make it.
fn default_of(config: &SandboxConfig) -> Template {
    let network = match config.network.as_str() {
        "" | "none" => Network::None,
        other => Network::Docker(other.to_owned()),
    };
    Template {
        name: DEFAULT_TEMPLATE.to_owned(),
        image: config.image.clone(),
        limits: SandboxLimits {
            memory_mb: config.memory_mb,
            pids: config.pids,
            cpus: config.cpus,
            network: config.network.clone(),
            tmpfs_mb: config.tmpfs_mb,
            runtime: None,
        },
        network,
        warm: Some(config.warm),
        idle_ttl: config.idle_ttl,
    }
}

/// `" (line N)"` for an error at `span` of `text`, or nothing.
fn line_of(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    span.map(|s| {
        let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
        format!(" (line {line})")
    })
    .unwrap_or_default()
}

const FIELDS: &[&str] = &[
    "image",
    "memory_mb",
    "cpus",
    "pids",
    "runtime",
    "network",
    "allow",
    "warm",
    "idle_ttl_s",
];

fn parse_template(
    name: &str,
    value: &toml::Value,
    base: &Template,
    config: &SandboxConfig,
    is_default: bool,
) -> Result<Template, Unplaced> {
    let at = |field: &str| format!("templates.{name}.{field}");
    let table = value.as_table().ok_or_else(|| {
        Unplaced::field(
            format!("templates.{name}"),
            "must be a table ([templates.<name>])",
        )
    })?;
    for key in table.keys() {
        if !FIELDS.contains(&key.as_str()) {
            return Err(Unplaced::field(
                at(key),
                format!("unknown field; a template has {}", FIELDS.join(", ")),
            ));
        }
    }
    let integer = |field: &str, min: i64, max: i64| -> Result<Option<u64>, Unplaced> {
        match table.get(field) {
            None => Ok(None),
            Some(toml::Value::Integer(n)) if (min..=max).contains(n) => Ok(Some(*n as u64)),
            Some(toml::Value::Integer(_)) => Err(Unplaced::field(
                at(field),
                format!("must be from {min} to {max}"),
            )),
            Some(_) => Err(Unplaced::field(at(field), "must be a whole number")),
        }
    };
    let string = |field: &str| -> Result<Option<&str>, Unplaced> {
        match table.get(field) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(Unplaced::field(at(field), "must be a string")),
        }
    };
    let image = match string("image")? {
        None => base.image.clone(),
        Some(image) if config.allowed_images.iter().any(|a| a == image) => image.to_owned(),
        Some(image) => {
            return Err(Unplaced::field(
                at("image"),
                format!(
                    "{image:?} is not an allowed image ({}); add it to TOOLMESH_SANDBOX_IMAGES",
                    config.allowed_images.join(", ")
                ),
            ))
        }
    };
    let memory_mb = integer("memory_mb", 16, 1 << 20)?.unwrap_or(base.limits.memory_mb);
    let pids = integer("pids", 8, 1 << 22)?.unwrap_or(base.limits.pids);
    let cpus = match table.get("cpus") {
        None => base.limits.cpus,
        Some(v) => {
            let cpus = match v {
                toml::Value::Integer(n) => *n as f64,
                toml::Value::Float(f) => *f,
                _ => return Err(Unplaced::field(at("cpus"), "must be a number")),
            };
            if !(0.01..=1024.0).contains(&cpus) {
                return Err(Unplaced::field(at("cpus"), "must be from 0.01 to 1024"));
            }
            cpus
        }
    };
    let runtime = match string("runtime")? {
        None => base.limits.runtime.clone(),
        Some(r) if RUNTIMES.contains(&r) => Some(r.to_owned()),
        Some(r) => {
            return Err(Unplaced::field(
                at("runtime"),
                format!("{r:?} is not a runtime; use {}", RUNTIMES.join(" or ")),
            ))
        }
    };
    let allow = match table.get("allow") {
        None => None,
        Some(toml::Value::Array(items)) => {
            let mut entries = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let raw = item.as_str().ok_or_else(|| {
                    Unplaced::field(format!("{}[{i}]", at("allow")), "must be a string")
                })?;
                entries.push(
                    AllowEntry::parse(raw)
                        .map_err(|why| Unplaced::field(format!("{}[{i}]", at("allow")), why))?,
                );
            }
            Some(entries)
        }
        Some(_) => {
            return Err(Unplaced::field(
                at("allow"),
                "must be a list of strings (host, *.domain, CIDR[:port], host:port)",
            ))
        }
    };
    let network = match (string("network")?, allow) {
        (None | Some("none"), None) if !is_default || table.contains_key("network") => {
            Network::None
        }
        // `default` redefined without a network keeps TOOLMESH_SANDBOX_NETWORK.
        (None, None) => base.network.clone(),
        (Some("allow"), Some(entries)) if !entries.is_empty() => Network::Allow(entries),
        (Some("allow"), _) => {
            return Err(Unplaced::field(
                at("allow"),
                "network = \"allow\" needs a non-empty allow list",
            ))
        }
        (None | Some("none"), Some(_)) => {
            return Err(Unplaced::field(
                at("allow"),
                "allow entries need network = \"allow\"",
            ))
        }
        (Some(other), _) => {
            return Err(Unplaced::field(
                at("network"),
                format!("{other:?} is not a network; use \"none\" or \"allow\""),
            ))
        }
    };
    let warm = match integer("warm", 0, 64)? {
        Some(n) => Some(n as usize),
        None if is_default => base.warm,
        None => None,
    };
    let idle_ttl = integer("idle_ttl_s", 1, 30 * 24 * 3600)?
        .map(Duration::from_secs)
        .unwrap_or(base.idle_ttl);
    let docker_network = match &network {
        Network::None => "none".to_owned(),
        Network::Docker(name) => name.clone(),
        // The network seam gives it its network once the proxy runs (`crate::network`).
        Network::Allow(_) => "none".to_owned(),
    };
    Ok(Template {
        name: name.to_owned(),
        image,
        limits: SandboxLimits {
            memory_mb,
            pids,
            cpus,
            network: docker_network,
            tmpfs_mb: base.limits.tmpfs_mb,
            runtime,
        },
        network,
        warm,
        idle_ttl,
    })
}

#[cfg(test)]
mod tests {
    use toolmesh_kernel::config::assert_refused_at;

    use super::*;

    fn config() -> SandboxConfig {
        let env = RawEnv::from_pairs([("TOOLMESH_SANDBOX_IMAGES", "toolmesh/sandbox:latest,py:1")]);
        SandboxConfig::from_env(&env, Path::new("./data")).unwrap()
    }

    /// `text` is refused naming `field`, with a reason containing `why`.
    #[track_caller]
    fn check_refused(text: &str, field: &str, why: &str) {
        assert_refused_at(Templates::parse(text, &config()), text, field, why);
    }

    #[test]
    fn default_always_exists_from_the_variables() {
        let t = Templates::parse("", &config()).unwrap();
        assert_eq!(t.names(), ["default"]);
        let d = t.default_template();
        assert_eq!(d.image, "toolmesh/sandbox:latest");
        assert_eq!(d.limits.memory_mb, 1024);
        assert_eq!(d.network, Network::None);
        assert_eq!(d.warm, Some(2));
        assert_eq!(d.runtime_name(), "runc");
    }

    #[test]
    fn templates_inherit_from_default_as_the_file_defines_it() {
        let t = Templates::parse(
            r#"
            [templates.default]
            memory_mb = 512
            [templates.py]
            image = "py:1"
            cpus = 2
            pids = 512
            runtime = "runsc"
            network = "allow"
            allow = ["pypi.org", "*.pythonhosted.org", "127.0.0.1/32:8080", "[::1]:9000", "10.0.0.0/8"]
            idle_ttl_s = 60
            "#,
            &config(),
        )
        .unwrap();
        assert_eq!(t.names(), ["default", "py"]);
        let py = t.get("py").unwrap();
        assert_eq!(py.limits.memory_mb, 512, "from the redefined default");
        assert_eq!(py.limits.cpus, 2.0);
        assert_eq!(py.limits.runtime.as_deref(), Some("runsc"));
        assert_eq!(py.warm, None, "lazy");
        assert_eq!(py.idle_ttl, Duration::from_secs(60));
        let Network::Allow(allow) = &py.network else {
            panic!("{:?}", py.network)
        };
        assert_eq!(allow.len(), 5);
        assert_eq!(
            allow[1],
            AllowEntry::Subdomains {
                domain: "pythonhosted.org".into(),
                port: None
            }
        );
        assert_eq!(
            allow[3],
            AllowEntry::Network {
                net: "::1/128".parse().unwrap(),
                port: Some(9000)
            }
        );
        assert_eq!(t.default_template().warm, Some(2));
    }

    #[test]
    fn a_bad_field_is_named() {
        check_refused(
            "[templates.a]\nmemory_mb = 1",
            "templates.a.memory_mb",
            "from 16",
        );
        check_refused(
            "[templates.a]\nmemory_mb = \"1g\"",
            "templates.a.memory_mb",
            "whole",
        );
        check_refused("[templates.a]\ncpus = 0", "templates.a.cpus", "0.01");
        check_refused(
            "[templates.a]\nruntime = \"kata\"",
            "templates.a.runtime",
            "runsc",
        );
        check_refused(
            "[templates.a]\nimage = \"evil:1\"",
            "templates.a.image",
            "TOOLMESH_SANDBOX_IMAGES",
        );
        check_refused(
            "[templates.a]\nnetwork = \"host\"",
            "templates.a.network",
            "none",
        );
        check_refused(
            "[templates.a]\nnetwork = \"allow\"",
            "templates.a.allow",
            "non-empty",
        );
        check_refused(
            "[templates.a]\nallow = [\"x.org\"]",
            "templates.a.allow",
            "network = \"allow\"",
        );
        check_refused(
            "[templates.a]\nnetwork = \"allow\"\nallow = [\"ok.org\", \"a b\"]",
            "templates.a.allow[1]",
            "host name",
        );
        check_refused(
            "[templates.a]\nnetwork = \"allow\"\nallow = [\"ok.org:0\"]",
            "templates.a.allow[0]",
            "port",
        );
        check_refused(
            "[templates.a]\nnetwork = \"allow\"\nallow = [\"a.*.org\"]",
            "templates.a.allow[0]",
            "wildcard",
        );
        check_refused("[templates.a]\nwarm = 100", "templates.a.warm", "0 to 64");
        check_refused(
            "[templates.a]\nmemory = 5",
            "templates.a.memory",
            "unknown field",
        );
        check_refused("[templates.\"a b\"]", "templates.\"a b\"", "template name");
        check_refused("[other]", "other", "unknown key");
        assert!(matches!(
            Templates::parse("[templates.a", &config()),
            Err(Unplaced::Syntax(_))
        ));
    }

    #[test]
    fn allow_entries_parse() {
        let ok = [
            ("pypi.org", "Host"),
            ("PyPI.org:443", "Host"),
            ("*.pythonhosted.org", "Subdomains"),
            ("127.0.0.1/32:8080", "Network"),
            ("10.1.2.3", "Network"),
            ("fd00::/8", "Network"),
        ];
        for (raw, kind) in ok {
            let entry = AllowEntry::parse(raw).unwrap();
            assert!(format!("{entry:?}").starts_with(kind), "{raw}: {entry:?}");
        }
        for bad in [
            "", " a.org", "*", "*.", "a..org", "-a.org", "a.org:x", "[::1", "[::1]x",
        ] {
            assert!(AllowEntry::parse(bad).is_err(), "{bad:?}");
        }
    }
}
