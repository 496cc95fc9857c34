//! A sandbox's egress allow-list: which targets its proxy may connect to.
//!
//! Entries, as a template's `allow` names them:
//!
//! * `pypi.org` — that host, on ports 80 and 443;
//! * `*.pythonhosted.org` — every name below that domain (not the domain itself), on ports 80
//!   and 443;
//! * `pypi.org:8443`, `*.example.com:8080` — the same, on that port only;
//! * `10.0.0.0/8`, `127.0.0.1/32:8080`, `fd00::/8:443`, `192.0.2.7` — IP targets in that
//!   network (a bare address is one host), on any port or on the port named.
//!
//! A target passes when an entry names it, and then the kernel's egress policy
//! ([`Egress::check_host`]) resolves it and checks every address: a non-public address passes
//! only when a CIDR entry on that port names it, whether the target is an IP literal or a name
//! that resolves there.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use toolmesh_kernel::egress::{Egress, EgressError};

/// The ports a bare `host` or `*.domain` entry allows.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// A parsed allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    names: Vec<NameEntry>,
    networks: Vec<NetEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct NameEntry {
    /// Lower case, no trailing dot.
    name: String,
    /// `*.name`: the names below it.
    wildcard: bool,
    /// `None`: [`DEFAULT_PORTS`].
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct NetEntry {
    net: IpNet,
    /// `None`: any port.
    port: Option<u16>,
}

/// An entry that is not one of the four forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allow entry {entry:?}: {reason}")]
pub struct AllowError {
    pub entry: String,
    pub reason: String,
}

/// Why a target is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

impl AllowList {
    /// Parses every entry; the first bad one is the error.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, AllowError> {
        let mut list = AllowList::default();
        for entry in entries {
            let entry = entry.as_ref();
            let error = |reason: &str| AllowError {
                entry: entry.to_owned(),
                reason: reason.to_owned(),
            };
            let text = entry.trim();
            if text.is_empty() {
                return Err(error("is empty"));
            }
            if let Some(net) = parse_network(text).map_err(|r| error(&r))? {
                list.networks.push(net);
            } else {
                list.names.push(parse_name(text).map_err(|r| error(&r))?);
            }
        }
        Ok(list)
    }

    /// The entries from a comma-separated list (`TOOLMESH_SANDBOX_EGRESS_ALLOW`).
    pub fn parse_csv(text: &str) -> Result<Self, AllowError> {
        let entries: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        Self::parse(&entries)
    }

    /// True when no entry allows anything.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.networks.is_empty()
    }

    /// The addresses `host:port` may be connected to (as a proxy request names it: a name,
    /// an IPv4 address, an IPv6 address with or without brackets), or why not.
    pub async fn check(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refused> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            if !self.networks.iter().any(|n| n.allows_ip(ip, port)) {
                return Err(Refused(format!(
                    "{} is not in the allow-list",
                    target(bare, port)
                )));
            }
        } else {
            let name = bare.trim_end_matches('.').to_ascii_lowercase();
            let matching: Vec<&NameEntry> = self
                .names
                .iter()
                .filter(|e| e.matches_name(&name))
                .collect();
            if matching.is_empty() {
                return Err(Refused(format!("{name} is not in the allow-list")));
            }
            if !matching.iter().any(|e| e.allows_port(port)) {
                return Err(Refused(format!(
                    "port {port} of {name} is not in the allow-list"
                )));
            }
        }
        let networks = self
            .networks
            .iter()
            .filter(|n| n.port.is_none_or(|p| p == port))
            .map(|n| n.net)
            .collect();
        Egress::with_networks(networks)
            .check_host(bare, port)
            .await
            .map_err(|e| match e {
                EgressError::Refused(r) => Refused(r.reason),
                other => Refused(other.to_string()),
            })
    }
}

fn target(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl NameEntry {
    fn matches_name(&self, name: &str) -> bool {
        if self.wildcard {
            name.len() > self.name.len() + 1
                && name.ends_with(&self.name)
                && name.as_bytes()[name.len() - self.name.len() - 1] == b'.'
        } else {
            name == self.name
        }
    }

    fn allows_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }
}

impl NetEntry {
    fn allows_ip(&self, ip: IpAddr, port: u16) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        self.net.contains(&ip) && self.port.is_none_or(|p| p == port)
    }
}

fn parse_port(text: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("{text:?} is not a port (1 to 65535)")),
        Ok(port) => Ok(port),
    }
}

/// `CIDR[:port]`, a bare IP address, `[IPv6]:port` or `IPv4:port`; `None` when the entry
/// is no IP form at all (then it is a name).
fn parse_network(text: &str) -> Result<Option<NetEntry>, String> {
    if let Some((addr, rest)) = text.rsplit_once('/') {
        let (prefix, port) = match rest.split_once(':') {
            Some((prefix, port)) => (prefix, Some(parse_port(port)?)),
            None => (rest, None),
        };
        let addr = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(addr);
        let net = format!("{addr}/{prefix}")
            .parse::<IpNet>()
            .map_err(|_| "is not a network; use CIDR notation such as 10.0.0.0/8".to_owned())?;
        return Ok(Some(NetEntry { net, port }));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(Some(NetEntry {
            net: IpNet::from(ip),
            port: None,
        }));
    }
    if let Some((addr, port)) = text.strip_prefix('[').and_then(|t| t.split_once("]:")) {
        let ip = addr
            .parse::<IpAddr>()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        return Ok(Some(NetEntry {
            net: IpNet::from(ip),
            port: Some(parse_port(port)?),
        }));
    }
    if let Some((addr, port)) = text.rsplit_once(':') {
        if let Ok(ip) = addr.parse::<std::net::Ipv4Addr>() {
            return Ok(Some(NetEntry {
                net: IpNet::from(IpAddr::V4(ip)),
                port: Some(parse_port(port)?),
            }));
        }
    }
    Ok(None)
}

/// `host`, `*.domain`, either with `:port`.
fn parse_name(text: &str) -> Result<NameEntry, String> {
    let (name, port) = match text.rsplit_once(':') {
        Some((name, port)) => (name, Some(parse_port(port)?)),
        None => (text, None),
    };
    let (wildcard, name) = match name.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() {
        return Err("names no host".to_owned());
    }
    if name.len() > 253 {
        return Err("is longer than 253 characters".to_owned());
    }
    for label in name.split('.') {
        if !is_host_label(label, true) {
            return Err(format!(
                "is not a host name, *.domain, CIDR or address (label {label:?}); a wildcard \
                 may only be the first label"
            ));
        }
    }
    Ok(NameEntry {
        name,
        wildcard,
        port,
    })
}

/// One label of a DNS name: 1 to 63 letters, digits and `-` (and `_` when `underscore`, as
/// some real names have), not starting or ending with `-`.
pub(crate) fn is_host_label(label: &str, underscore: bool) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || (underscore && b == b'_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).expect("valid entries")
    }

    async fn refused(list: &AllowList, host: &str, port: u16) -> String {
        match list.check(host, port).await {
            Err(Refused(reason)) => reason,
            Ok(addrs) => panic!("{host}:{port} allowed: {addrs:?}"),
        }
    }

    #[test]
    fn the_four_forms_parse_and_bad_entries_are_named() {
        let l = list(&[
            "PyPI.org",
            "*.pythonhosted.org",
            "example.com:8443",
            "10.0.0.0/8",
            "127.0.0.1/32:8080",
            "fd00::/8:443",
            "192.0.2.7",
            "[::1]:9000",
            "127.0.0.2:81",
        ]);
        assert_eq!(l.names.len(), 3);
        assert_eq!(l.networks.len(), 6);
        assert_eq!(l.names[0].name, "pypi.org");
        assert_eq!(l.networks[2].port, Some(443));
        assert_eq!(l.networks[4].port, Some(9000));
        for (bad, says) in [
            ("", "is empty"),
            ("*.", "names no host"),
            ("a.*.example.com", "wildcard"),
            ("exa mple.com", "not a host name"),
            ("example.com:0", "not a port"),
            ("example.com:http", "not a port"),
            ("10.0.0.0/33", "not a network"),
            ("10.0.0.0/8:99999", "not a port"),
            ("-bad.example", "not a host name"),
        ] {
            let err = AllowList::parse(&[bad]).expect_err(bad);
            assert!(err.to_string().contains(says), "{bad}: {err}");
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert_eq!(
            AllowList::parse_csv(" pypi.org, ,*.pythonhosted.org ").unwrap(),
            list(&["pypi.org", "*.pythonhosted.org"])
        );
    }

    #[test]
    fn names_match_exactly_and_wildcards_match_below_their_domain() {
        let l = list(&["pypi.org", "*.pythonhosted.org", "example.com:8443"]);
        let m = |name: &str| l.names.iter().any(|e| e.matches_name(name));
        assert!(m("pypi.org"));
        assert!(!m("evilpypi.org"));
        assert!(!m("pypi.org.evil.com"));
        assert!(m("files.pythonhosted.org"));
        assert!(m("a.b.pythonhosted.org"));
        assert!(!m("pythonhosted.org"));
        assert!(!m("evilpythonhosted.org"));
        assert!(l.names[0].allows_port(443) && l.names[0].allows_port(80));
        assert!(!l.names[0].allows_port(8080));
        assert!(l.names[2].allows_port(8443) && !l.names[2].allows_port(443));
    }

    #[tokio::test]
    async fn unlisted_hosts_ports_and_addresses_are_refused_with_a_reason() {
        let l = list(&["localhost:8080", "127.0.0.1/32:9000", "example.com"]);
        for (host, port, unlisted) in [
            ("other.example", 443, "other.example"),
            ("example.com", 22, "port 22 of example.com"),
            ("127.0.0.1", 9001, "127.0.0.1:9001"),
            ("[::1]", 9000, "[::1]:9000"),
        ] {
            let reason = refused(&l, host, port).await;
            assert_eq!(reason, format!("{unlisted} is not in the allow-list"));
        }
        assert_eq!(
            l.check("127.0.0.1", 9000).await.unwrap(),
            vec!["127.0.0.1:9000".parse::<SocketAddr>().unwrap()]
        );
        // A listed name resolving to a private address needs a CIDR entry on that port.
        let reason = refused(&l, "localhost", 8080).await;
        assert!(
            reason.starts_with("localhost resolves to loopback"),
            "{reason}"
        );
        let l = list(&["localhost:8080", "127.0.0.0/8:8080", "::1/128:8080"]);
        let addrs = l.check("LOCALHOST", 8080).await.unwrap();
        assert!(addrs
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 8080));
        let l = list(&["localhost:8080", "127.0.0.0/8:9000", "::1/128:9000"]);
        assert!(refused(&l, "localhost", 8080).await.contains("loopback"));
        // The cloud metadata address stays refused unless named.
        let l = list(&["169.254.0.0/16:80"]);
        assert!(l.check("169.254.169.254", 80).await.is_ok());
        let l = list(&["0.0.0.0/0"]);
        assert!(l.check("169.254.169.254", 80).await.is_ok(), "0/0 names it");
    }
}
