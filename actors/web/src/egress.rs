//! The egress policy of `web_fetch` (PROTOCOL.md "Web"): which addresses a fetch may connect
//! to, and the resolver that makes the connection go only to addresses that were checked.
//!
//! An address is refused when it is not public: loopback, private, link-local (which holds
//! the cloud metadata address 169.254.169.254), CGNAT, unspecified, broadcast, multicast,
//! documentation, a few other special-purpose ranges (benchmarking, reserved, "this
//! network", IETF protocol assignments, discard-only, deprecated site-local), or an IPv6
//! address embedding one of those IPv4 addresses (IPv4-mapped, IPv4-compatible, 6to4,
//! NAT64). `TOOLMESH_WEB_ALLOWED_NETWORKS` names networks that are allowed all the same.
//!
//! DNS rebinding: [`CheckedResolver`] is the HTTP client's only resolver. It resolves a name,
//! checks every address and hands the client exactly the addresses it checked, so a second
//! answer cannot swap in an address nobody looked at. IP literals never reach a resolver;
//! the fetch checks them itself before it connects ([`EgressPolicy::check`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

/// Which addresses `web_fetch` may connect to.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    allowed: Vec<IpNet>,
}

/// A refused address, with the reason a person reads (`loopback address 127.0.0.1`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct BlockedAddress {
    pub reason: String,
}

impl EgressPolicy {
    /// A policy that also allows `allowed` (CIDRs, or bare addresses for one host).
    pub fn new(allowed: &[String]) -> Result<Self, String> {
        let allowed = allowed
            .iter()
            .map(|spec| parse_network(spec))
            .collect::<Result<_, _>>()?;
        Ok(Self { allowed })
    }

    fn is_allowed(&self, ip: IpAddr) -> bool {
        self.allowed.iter().any(|net| net.contains(&ip))
    }

    /// `Ok` when `ip` may be connected to; otherwise why not.
    pub fn check(&self, ip: IpAddr) -> Result<(), BlockedAddress> {
        if self.is_allowed(ip) {
            return Ok(());
        }
        if let Some(class) = special_class(ip) {
            return Err(BlockedAddress {
                reason: format!("{class} address {ip}"),
            });
        }
        if let IpAddr::V6(v6) = ip {
            if let Some((form, v4)) = embedded_ipv4(v6) {
                if self.is_allowed(IpAddr::V4(v4)) {
                    return Ok(());
                }
                if let Some(class) = special_class(IpAddr::V4(v4)) {
                    return Err(BlockedAddress {
                        reason: format!("{form} address {ip} embeds {class} address {v4}"),
                    });
                }
            }
        }
        Ok(())
    }
}

/// `10.0.0.0/8`, or a bare address meaning that one host.
fn parse_network(spec: &str) -> Result<IpNet, String> {
    let spec = spec.trim();
    if let Ok(net) = spec.parse::<IpNet>() {
        return Ok(net);
    }
    spec.parse::<IpAddr>().map(IpNet::from).map_err(|_| {
        format!("{spec:?} is not a network; use CIDR notation such as 10.0.0.0/8 or fd00::/8")
    })
}

/// The special-purpose class of `ip`, or `None` for a public address. IPv6 addresses that
/// embed an IPv4 address are classified by [`embedded_ipv4`], not here.
pub fn special_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 32, "unspecified"),
        ([0, 0, 0, 0], 8, "\"this network\""),
        ([127, 0, 0, 0], 8, "loopback"),
        ([10, 0, 0, 0], 8, "private"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 168, 0, 0], 16, "private"),
        ([169, 254, 169, 254], 32, "link-local (cloud metadata)"),
        ([169, 254, 0, 0], 16, "link-local"),
        ([100, 64, 0, 0], 10, "CGNAT"),
        ([255, 255, 255, 255], 32, "broadcast"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([192, 0, 0, 0], 24, "IETF protocol assignment"),
        ([198, 18, 0, 0], 15, "benchmarking"),
        ([240, 0, 0, 0], 4, "reserved"),
    ];
    RANGES
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map(|(_, _, class)| *class)
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    u128::from(ip) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    const RANGES: &[([u16; 8], u32, &str)] = &[
        ([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified"),
        ([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback"),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "private (unique local)"),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local"),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
        ([0x2001, 0x0db8, 0, 0, 0, 0, 0, 0], 32, "documentation"),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation"),
        ([0x0100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only"),
        (
            [0x0064, 0xff9b, 0x0001, 0, 0, 0, 0, 0],
            48,
            "local-use NAT64",
        ),
    ];
    RANGES
        .iter()
        .find(|(net, prefix, _)| in_v6(ip, *net, *prefix))
        .map(|(_, _, class)| *class)
}

/// The IPv4 address an IPv6 address carries, and the form that carries it: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), 6to4 (`2002:AABB:CCDD::/48`) or NAT64
/// (`64:ff9b::a.b.c.d`).
pub fn embedded_ipv4(ip: Ipv6Addr) -> Option<(&'static str, Ipv4Addr)> {
    let bits = u128::from(ip);
    let low = Ipv4Addr::from(bits as u32);
    if in_v6(ip, [0, 0, 0, 0, 0, 0xffff, 0, 0], 96) {
        Some(("IPv4-mapped", low))
    } else if in_v6(ip, [0; 8], 96) {
        Some(("IPv4-compatible", low))
    } else if in_v6(ip, [0x0064, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        Some(("NAT64", low))
    } else if in_v6(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        Some(("6to4", Ipv4Addr::from((bits >> 80) as u32)))
    } else {
        None
    }
}

/// Why a name could not be resolved to addresses a fetch may use.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{host} resolves to a refused address: {blocked}")]
    Blocked {
        host: String,
        blocked: BlockedAddress,
    },
    #[error("cannot resolve {host}: {source}")]
    Lookup {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
}

/// Resolves `host` and checks every address; all must pass, so a name with one public and
/// one private address is refused (a client could pick either).
pub async fn resolve_checked(
    policy: &EgressPolicy,
    host: &str,
) -> Result<Vec<SocketAddr>, ResolveError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|source| ResolveError::Lookup {
            host: host.to_owned(),
            source,
        })?
        .collect();
    if addrs.is_empty() {
        return Err(ResolveError::NoAddress {
            host: host.to_owned(),
        });
    }
    for addr in &addrs {
        policy
            .check(addr.ip())
            .map_err(|blocked| ResolveError::Blocked {
                host: host.to_owned(),
                blocked,
            })?;
    }
    Ok(addrs)
}

/// The HTTP client's resolver: only checked addresses come out of it.
#[derive(Debug, Clone)]
pub struct CheckedResolver {
    pub policy: Arc<EgressPolicy>,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = resolve_checked(&policy, &host).await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(policy: &EgressPolicy, ip: &str, expect: Option<&str>) {
        let ip: IpAddr = ip.parse().unwrap();
        let got = policy.check(ip).err().map(|b| b.reason);
        assert_eq!(got.as_deref(), expect, "{ip}");
    }

    #[test]
    fn special_ipv4_ranges_are_refused() {
        let p = EgressPolicy::default();
        check(&p, "127.0.0.1", Some("loopback address 127.0.0.1"));
        check(
            &p,
            "127.255.255.254",
            Some("loopback address 127.255.255.254"),
        );
        check(&p, "10.1.2.3", Some("private address 10.1.2.3"));
        check(&p, "172.16.0.1", Some("private address 172.16.0.1"));
        check(&p, "172.31.255.255", Some("private address 172.31.255.255"));
        check(&p, "192.168.1.1", Some("private address 192.168.1.1"));
        check(
            &p,
            "169.254.169.254",
            Some("link-local (cloud metadata) address 169.254.169.254"),
        );
        check(&p, "169.254.0.1", Some("link-local address 169.254.0.1"));
        check(&p, "100.64.0.1", Some("CGNAT address 100.64.0.1"));
        check(&p, "100.127.255.255", Some("CGNAT address 100.127.255.255"));
        check(&p, "0.0.0.0", Some("unspecified address 0.0.0.0"));
        check(&p, "0.1.2.3", Some("\"this network\" address 0.1.2.3"));
        check(
            &p,
            "255.255.255.255",
            Some("broadcast address 255.255.255.255"),
        );
        check(&p, "224.0.0.1", Some("multicast address 224.0.0.1"));
        check(
            &p,
            "239.255.255.250",
            Some("multicast address 239.255.255.250"),
        );
        check(&p, "192.0.2.1", Some("documentation address 192.0.2.1"));
        check(
            &p,
            "198.51.100.7",
            Some("documentation address 198.51.100.7"),
        );
        check(&p, "203.0.113.9", Some("documentation address 203.0.113.9"));
        check(&p, "198.18.0.1", Some("benchmarking address 198.18.0.1"));
        check(&p, "240.0.0.1", Some("reserved address 240.0.0.1"));
        check(
            &p,
            "192.0.0.8",
            Some("IETF protocol assignment address 192.0.0.8"),
        );
    }

    #[test]
    fn public_ipv4_addresses_pass() {
        let p = EgressPolicy::default();
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "172.15.255.255",
            "172.32.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "169.253.255.255",
            "192.169.0.1",
            "223.255.255.255",
            "11.0.0.1",
            "126.255.255.255",
            "128.0.0.1",
        ] {
            check(&p, ip, None);
        }
    }

    #[test]
    fn special_ipv6_ranges_are_refused() {
        let p = EgressPolicy::default();
        check(&p, "::1", Some("loopback address ::1"));
        check(&p, "::", Some("unspecified address ::"));
        check(
            &p,
            "fc00::1",
            Some("private (unique local) address fc00::1"),
        );
        check(
            &p,
            "fd12:3456::1",
            Some("private (unique local) address fd12:3456::1"),
        );
        check(&p, "fe80::1", Some("link-local address fe80::1"));
        check(&p, "fec0::1", Some("site-local address fec0::1"));
        check(&p, "ff02::1", Some("multicast address ff02::1"));
        check(&p, "2001:db8::1", Some("documentation address 2001:db8::1"));
        check(&p, "100::1", Some("discard-only address 100::1"));
        check(
            &p,
            "64:ff9b:1::7f00:1",
            Some("local-use NAT64 address 64:ff9b:1::7f00:1"),
        );
        for ip in [
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450::1",
        ] {
            check(&p, ip, None);
        }
    }

    #[test]
    fn ipv4_embedded_in_ipv6_is_classified_by_the_ipv4_address() {
        let p = EgressPolicy::default();
        check(
            &p,
            "::ffff:127.0.0.1",
            Some("IPv4-mapped address ::ffff:127.0.0.1 embeds loopback address 127.0.0.1"),
        );
        check(
            &p,
            "::ffff:7f00:1",
            Some("IPv4-mapped address ::ffff:127.0.0.1 embeds loopback address 127.0.0.1"),
        );
        check(
            &p,
            "::ffff:169.254.169.254",
            Some(
                "IPv4-mapped address ::ffff:169.254.169.254 embeds link-local (cloud metadata) \
                 address 169.254.169.254",
            ),
        );
        check(
            &p,
            "::127.0.0.1",
            Some("IPv4-compatible address ::7f00:1 embeds loopback address 127.0.0.1"),
        );
        check(
            &p,
            "::10.0.0.1",
            Some("IPv4-compatible address ::a00:1 embeds private address 10.0.0.1"),
        );
        check(
            &p,
            "64:ff9b::7f00:1",
            Some("NAT64 address 64:ff9b::7f00:1 embeds loopback address 127.0.0.1"),
        );
        check(
            &p,
            "64:ff9b::a9fe:a9fe",
            Some(
                "NAT64 address 64:ff9b::a9fe:a9fe embeds link-local (cloud metadata) address \
                 169.254.169.254",
            ),
        );
        check(
            &p,
            "2002:7f00:1::",
            Some("6to4 address 2002:7f00:1:: embeds loopback address 127.0.0.1"),
        );
        check(
            &p,
            "2002:c0a8:101::1",
            Some("6to4 address 2002:c0a8:101::1 embeds private address 192.168.1.1"),
        );
        check(
            &p,
            "::ffff:0.0.0.0",
            Some("IPv4-mapped address ::ffff:0.0.0.0 embeds unspecified address 0.0.0.0"),
        );
        // Public IPv4 addresses stay public in every form.
        for ip in [
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "::8.8.8.8",
        ] {
            check(&p, ip, None);
        }
    }

    #[test]
    fn allowed_networks_open_named_ranges_only() {
        let p = EgressPolicy::new(&["127.0.0.2/32".into(), "10.0.0.0/8".into(), "fd00::1".into()])
            .unwrap();
        check(&p, "127.0.0.2", None);
        check(&p, "::ffff:127.0.0.2", None);
        check(&p, "10.200.0.1", None);
        check(&p, "fd00::1", None);
        check(&p, "127.0.0.1", Some("loopback address 127.0.0.1"));
        check(
            &p,
            "fd00::2",
            Some("private (unique local) address fd00::2"),
        );
        check(&p, "192.168.0.1", Some("private address 192.168.0.1"));
        let err = EgressPolicy::new(&["not-a-net".into()]).unwrap_err();
        assert!(err.contains("not-a-net"), "{err}");
    }

    #[tokio::test]
    async fn the_resolver_refuses_names_of_refused_addresses() {
        let p = EgressPolicy::default();
        let err = resolve_checked(&p, "localhost").await.unwrap_err();
        assert!(
            matches!(&err, ResolveError::Blocked { blocked, .. } if blocked.reason.starts_with("loopback address")),
            "{err}"
        );
        let p = EgressPolicy::new(&["127.0.0.0/8".into(), "::1/128".into()]).unwrap();
        let addrs = resolve_checked(&p, "localhost").await.unwrap();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }

    #[tokio::test]
    async fn the_reqwest_resolver_hands_out_only_checked_addresses() {
        use reqwest::dns::Resolve;
        let resolver = CheckedResolver {
            policy: Arc::new(EgressPolicy::default()),
        };
        let err = match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(e) => e,
        };
        assert!(err.downcast_ref::<ResolveError>().is_some(), "{err}");
    }
}
