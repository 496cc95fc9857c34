//! The egress policy: which addresses a node may connect to when it makes a request for a
//! caller (`web_fetch`, skill archive downloads, and any later outbound path such as a
//! sandbox's egress proxy), and the HTTP plumbing that makes a request go only there.
//!
//! An address is refused when it is not public: loopback, private, link-local (which holds
//! the cloud metadata address 169.254.169.254), CGNAT, unspecified, broadcast, multicast,
//! documentation, a few other special-purpose ranges (benchmarking, reserved, "this
//! network", IETF protocol assignments, discard-only, deprecated site-local), or an IPv6
//! address embedding one of those IPv4 addresses (IPv4-mapped, IPv4-compatible, 6to4,
//! NAT64). Two things open a refused address on purpose: allowed networks (each user names
//! its own variable, e.g. `TOOLMESH_WEB_ALLOWED_NETWORKS`), and exempt origins
//! ([`Egress::allow_origin`]: the configured Skill Service, reachable wherever it runs).
//!
//! The API is transport-neutral at its core: [`Egress::check_host`] takes a host and a port
//! (as an HTTP `CONNECT` proxy receives them) and answers the addresses that may be
//! connected to, or why not. The reqwest side sits on top: [`Egress::client_builder`] gives
//! a client whose only resolver is [`CheckedResolver`], that follows no redirect and uses no
//! proxy, and [`Egress::get`] follows redirects by hand, checking every hop before it is
//! requested.
//!
//! DNS rebinding: the resolver resolves a name, checks every address and hands the client
//! exactly the addresses it checked, so a second answer cannot swap in an address nobody
//! looked at. IP literals never reach a resolver; [`Egress::check_url`] checks them before
//! the request. The resolver sees no port, so it lets through the name of an exempt origin
//! on any port; a hop on another port of that name is still checked with its port first.

use std::error::Error as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::header::LOCATION;
use url::{Host, Url};

use crate::{ErrorCode, ToolError};

/// Which addresses a node may connect to for a caller.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    allowed: Vec<IpNet>,
    /// Host and port of each exempt origin.
    origins: Vec<(Host<String>, u16)>,
}

/// A refused target, with the reason a person reads (`loopback address 127.0.0.1`,
/// `localhost resolves to loopback address 127.0.0.1`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Refusal {
    pub reason: String,
}

impl Refusal {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

/// Why a target may not be connected to.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The policy refuses it.
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error("cannot resolve {host}: {source}")]
    Lookup {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
}

impl Egress {
    /// A policy that also allows `allowed` (CIDRs, or bare addresses for one host).
    pub fn new(allowed: &[String]) -> Result<Self, String> {
        let allowed = allowed
            .iter()
            .map(|spec| parse_network(spec))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            allowed,
            origins: Vec::new(),
        })
    }

    /// A policy that also allows `allowed`, already parsed (a sandbox's egress proxy builds
    /// one per target from the allow-list entries that name that target's port).
    pub fn with_networks(allowed: Vec<IpNet>) -> Self {
        Self {
            allowed,
            origins: Vec::new(),
        }
    }

    /// Exempts the origin of `url` (its host and port): it is reachable whatever it resolves
    /// to. Other ports of that host, and redirects away from it, are checked as usual.
    pub fn allow_origin(mut self, url: &Url) -> Self {
        if let (Some(host), Some(port)) = (url.host(), url.port_or_known_default()) {
            self.origins.push((host.to_owned(), port));
        }
        self
    }

    fn is_allowed(&self, ip: IpAddr) -> bool {
        self.allowed.iter().any(|net| net.contains(&ip))
    }

    fn is_exempt(&self, host: &Host<String>, port: u16) -> bool {
        self.origins.iter().any(|(h, p)| h == host && *p == port)
    }

    fn is_exempt_name(&self, name: &str) -> bool {
        self.origins
            .iter()
            .any(|(h, _)| matches!(h, Host::Domain(d) if d.eq_ignore_ascii_case(name)))
    }

    /// `Ok` when `ip` may be connected to; otherwise why not.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.is_allowed(ip) {
            return Ok(());
        }
        if let Some(class) = special_class(ip) {
            return Err(Refusal::new(format!("{class} address {ip}")));
        }
        if let IpAddr::V6(v6) = ip {
            if let Some((form, v4)) = embedded_ipv4(v6) {
                if self.is_allowed(IpAddr::V4(v4)) {
                    return Ok(());
                }
                if let Some(class) = special_class(IpAddr::V4(v4)) {
                    return Err(Refusal::new(format!(
                        "{form} address {ip} embeds {class} address {v4}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The addresses `host:port` may be connected to: an IP literal when the policy allows it,
    /// or every address a name resolves to when all of them pass (a client could pick any).
    /// An exempt origin passes whatever it resolves to. `host` is a name, an IPv4 address or
    /// an IPv6 address with or without brackets, as a `CONNECT` request names it.
    pub async fn check_host(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, EgressError> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let parsed = match bare.parse::<IpAddr>() {
            Ok(IpAddr::V4(v4)) => Host::Ipv4(v4),
            Ok(IpAddr::V6(v6)) => Host::Ipv6(v6),
            Err(_) => Host::parse(bare)
                .map_err(|e| Refusal::new(format!("{host:?} is not a host name: {e}")))?,
        };
        self.check_parsed(&parsed, port).await
    }

    /// [`Egress::check_host`] for the host and port of `url`, which must be http or https.
    pub async fn check_url(&self, url: &Url) -> Result<Vec<SocketAddr>, EgressError> {
        match url.scheme() {
            "http" | "https" => {}
            other => {
                return Err(Refusal::new(format!(
                    "scheme {other}: is not allowed, only http and https"
                ))
                .into())
            }
        }
        let (Some(host), Some(port)) = (url.host(), url.port_or_known_default()) else {
            return Err(Refusal::new("a URL without a host").into());
        };
        self.check_parsed(&host.to_owned(), port).await
    }

    async fn check_parsed(
        &self,
        host: &Host<String>,
        port: u16,
    ) -> Result<Vec<SocketAddr>, EgressError> {
        let exempt = self.is_exempt(host, port);
        let ip = match host {
            Host::Ipv4(v4) => IpAddr::V4(*v4),
            Host::Ipv6(v6) => IpAddr::V6(*v6),
            Host::Domain(name) => {
                let addrs = if exempt {
                    lookup(name).await?
                } else {
                    self.resolve_checked(name).await?
                };
                return Ok(with_port(addrs, port));
            }
        };
        if !exempt {
            self.check_ip(ip)?;
        }
        Ok(vec![SocketAddr::new(ip, port)])
    }

    /// Resolves `host` and checks every address; all must pass.
    async fn resolve_checked(&self, host: &str) -> Result<Vec<SocketAddr>, EgressError> {
        let addrs = lookup(host).await?;
        for addr in &addrs {
            self.check_ip(addr.ip())
                .map_err(|refused| Refusal::new(format!("{host} resolves to {refused}")))?;
        }
        Ok(addrs)
    }

    /// A reqwest client builder under this policy: [`CheckedResolver`] as its only resolver,
    /// no redirects followed (use [`Egress::get`]), no proxy (a proxy would connect to the
    /// target on our behalf, unchecked).
    pub fn client_builder(self: &Arc<Self>) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .dns_resolver(Arc::new(CheckedResolver {
                egress: self.clone(),
            }))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
    }

    /// GETs `url` with `client` (built by [`Egress::client_builder`]), following at most
    /// `max_redirects` redirects by hand; every hop is checked before it is requested.
    /// `request` builds the request of each hop (headers, a token for one origin only).
    pub async fn get(
        &self,
        client: &reqwest::Client,
        url: Url,
        max_redirects: usize,
        request: impl Fn(&reqwest::Client, &Url) -> reqwest::RequestBuilder,
    ) -> Result<Fetched, FetchError> {
        let mut current = url;
        let mut hop = 0;
        loop {
            if let Err(error) = self.check_url(&current).await {
                return Err(FetchError::refused_or_failed(error, current, hop));
            }
            let response = match request(client, &current).send().await {
                Ok(response) => response,
                Err(error) => return Err(FetchError::send(error, current, hop)),
            };
            let location = response
                .status()
                .is_redirection()
                .then(|| response.headers().get(LOCATION))
                .flatten();
            let Some(location) = location else {
                return Ok(Fetched {
                    url: current,
                    response,
                    redirects: hop,
                });
            };
            if hop == max_redirects {
                return Err(FetchError::TooManyRedirects {
                    url: current,
                    max: max_redirects,
                });
            }
            let Some(next) = location.to_str().ok().and_then(|l| current.join(l).ok()) else {
                return Err(FetchError::BadLocation {
                    location: format!("{location:?}"),
                    url: current,
                });
            };
            hop += 1;
            current = next;
        }
    }
}

async fn lookup(host: &str) -> Result<Vec<SocketAddr>, EgressError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|source| EgressError::Lookup {
            host: host.to_owned(),
            source,
        })?
        .collect();
    if addrs.is_empty() {
        return Err(EgressError::NoAddress {
            host: host.to_owned(),
        });
    }
    Ok(addrs)
}

fn with_port(addrs: Vec<SocketAddr>, port: u16) -> Vec<SocketAddr> {
    addrs
        .into_iter()
        .map(|a| SocketAddr::new(a.ip(), port))
        .collect()
}

/// The HTTP client's resolver: only checked addresses come out of it (and the addresses of
/// an exempt origin's name).
#[derive(Debug, Clone)]
pub struct CheckedResolver {
    pub egress: Arc<Egress>,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let egress = self.egress.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = if egress.is_exempt_name(&host) {
                lookup(&host).await?
            } else {
                egress.resolve_checked(&host).await?
            };
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The last response of [`Egress::get`].
#[derive(Debug)]
pub struct Fetched {
    /// The URL that answered (after redirects).
    pub url: Url,
    pub response: reqwest::Response,
    pub redirects: usize,
}

/// Why [`Egress::get`] brought no response back.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The policy refuses a hop; `reason` names the redirect when it is not the first hop.
    #[error("the egress policy refuses {url}: {reason}")]
    Refused { url: Url, reason: String },
    /// A hop's name could not be resolved.
    #[error("cannot fetch {url}: {error}")]
    Unresolved { url: Url, error: EgressError },
    #[error("{url} redirects again after {max} redirects; at most {max} are followed")]
    TooManyRedirects { url: Url, max: usize },
    #[error("{url} redirects to a Location that is not a URL: {location}")]
    BadLocation { url: Url, location: String },
    #[error("cannot fetch {url}: {}", chain(.error))]
    Send { url: Url, error: reqwest::Error },
}

impl FetchError {
    fn refused_or_failed(error: EgressError, url: Url, hop: usize) -> Self {
        match error {
            EgressError::Refused(refused) => FetchError::Refused {
                url,
                reason: hop_reason(hop, refused.reason),
            },
            error => FetchError::Unresolved { url, error },
        }
    }

    /// A send error, or the resolver's refusal inside it (the pre-check passed, then the name
    /// resolved to a refused address when the client connected: DNS rebinding).
    pub fn send(error: reqwest::Error, url: Url, hop: usize) -> Self {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
        while let Some(cause) = source {
            if let Some(refused) = cause.downcast_ref::<EgressError>() {
                if let EgressError::Refused(r) = refused {
                    return FetchError::Refused {
                        url,
                        reason: hop_reason(hop, r.reason.clone()),
                    };
                }
                break;
            }
            source = cause.source();
        }
        FetchError::Send { url, error }
    }

    /// The URL the failure happened on.
    pub fn url(&self) -> &Url {
        match self {
            FetchError::Refused { url, .. }
            | FetchError::Unresolved { url, .. }
            | FetchError::TooManyRedirects { url, .. }
            | FetchError::BadLocation { url, .. }
            | FetchError::Send { url, .. } => url,
        }
    }

    /// PROTOCOL.md's code: `blocked_url` with `reason` for a refusal, `timeout`, or
    /// `fetch_failed`.
    pub fn to_tool_error(&self) -> ToolError {
        match self {
            FetchError::Refused { reason, .. } => {
                ToolError::new(ErrorCode::BlockedUrl, self.to_string())
                    .with("reason", reason.clone())
            }
            FetchError::Send { url, error } if error.is_timeout() => {
                ToolError::new(ErrorCode::Timeout, format!("fetching {url} timed out"))
            }
            FetchError::TooManyRedirects { url, .. } => {
                ToolError::new(ErrorCode::FetchFailed, self.to_string())
                    .with("final_url", url.as_str())
            }
            _ => ToolError::new(ErrorCode::FetchFailed, self.to_string()),
        }
    }
}

/// Names the redirect a refusal happened on, so the reason says why a URL that looked fine
/// was refused.
fn hop_reason(hop: usize, reason: String) -> String {
    if hop == 0 {
        reason
    } else {
        format!("redirect {hop} leads to {reason}")
    }
}

/// `error` and its sources, joined: reqwest's own message alone rarely says what went wrong.
pub fn chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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

/// Whether the `bits`-bit address `ip` lies in `net`/`prefix`: their first `prefix` bits agree.
fn in_prefix(ip: u128, net: u128, prefix: u32, bits: u32) -> bool {
    let shift = bits - prefix;
    ip.checked_shr(shift).unwrap_or(0) == net.checked_shr(shift).unwrap_or(0)
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let (ip, net) = (u32::from(ip), u32::from_be_bytes(net));
    in_prefix(ip.into(), net.into(), prefix, 32)
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
    in_prefix(ip.into(), Ipv6Addr::from(net).into(), prefix, 128)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(policy: &Egress, ip: &str, expect: Option<&str>) {
        let ip: IpAddr = ip.parse().unwrap();
        let got = policy.check_ip(ip).err().map(|b| b.reason);
        assert_eq!(got.as_deref(), expect, "{ip}");
    }

    /// The policy refuses each `(ip, reason)`'s address, giving that reason.
    fn refused(policy: &Egress, cases: &[(&str, &str)]) {
        for (ip, reason) in cases {
            check(policy, ip, Some(reason));
        }
    }

    /// The policy lets each address pass.
    fn passes(policy: &Egress, ips: &[&str]) {
        for ip in ips {
            check(policy, ip, None);
        }
    }

    #[test]
    fn special_ipv4_ranges_are_refused() {
        let p = Egress::default();
        refused(
            &p,
            &[
                ("127.0.0.1", "loopback address 127.0.0.1"),
                ("127.255.255.254", "loopback address 127.255.255.254"),
                ("10.1.2.3", "private address 10.1.2.3"),
                ("172.16.0.1", "private address 172.16.0.1"),
                ("172.31.255.255", "private address 172.31.255.255"),
                ("192.168.1.1", "private address 192.168.1.1"),
                (
                    "169.254.169.254",
                    "link-local (cloud metadata) address 169.254.169.254",
                ),
                ("169.254.0.1", "link-local address 169.254.0.1"),
                ("100.64.0.1", "CGNAT address 100.64.0.1"),
                ("100.127.255.255", "CGNAT address 100.127.255.255"),
                ("0.0.0.0", "unspecified address 0.0.0.0"),
                ("0.1.2.3", "\"this network\" address 0.1.2.3"),
                ("255.255.255.255", "broadcast address 255.255.255.255"),
                ("224.0.0.1", "multicast address 224.0.0.1"),
                ("239.255.255.250", "multicast address 239.255.255.250"),
                ("192.0.2.1", "documentation address 192.0.2.1"),
                ("198.51.100.7", "documentation address 198.51.100.7"),
                ("203.0.113.9", "documentation address 203.0.113.9"),
                ("198.18.0.1", "benchmarking address 198.18.0.1"),
                ("240.0.0.1", "reserved address 240.0.0.1"),
                ("192.0.0.8", "IETF protocol assignment address 192.0.0.8"),
            ],
        );
    }

    #[test]
    fn public_ipv4_addresses_pass() {
        let p = Egress::default();
        passes(
            &p,
            &[
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
            ],
        );
    }

    #[test]
    fn special_ipv6_ranges_are_refused() {
        let p = Egress::default();
        refused(
            &p,
            &[
                ("::1", "loopback address ::1"),
                ("::", "unspecified address ::"),
                ("fc00::1", "private (unique local) address fc00::1"),
                (
                    "fd12:3456::1",
                    "private (unique local) address fd12:3456::1",
                ),
                ("fe80::1", "link-local address fe80::1"),
                ("fec0::1", "site-local address fec0::1"),
                ("ff02::1", "multicast address ff02::1"),
                ("2001:db8::1", "documentation address 2001:db8::1"),
                ("100::1", "discard-only address 100::1"),
                (
                    "64:ff9b:1::7f00:1",
                    "local-use NAT64 address 64:ff9b:1::7f00:1",
                ),
            ],
        );
        passes(
            &p,
            &[
                "2606:4700:4700::1111",
                "2001:4860:4860::8888",
                "2a00:1450::1",
            ],
        );
    }

    #[test]
    fn ipv4_embedded_in_ipv6_is_classified_by_the_ipv4_address() {
        let p = Egress::default();
        refused(
            &p,
            &[
                (
                    "::ffff:127.0.0.1",
                    "IPv4-mapped address ::ffff:127.0.0.1 embeds loopback address 127.0.0.1",
                ),
                (
                    "::ffff:7f00:1",
                    "IPv4-mapped address ::ffff:127.0.0.1 embeds loopback address 127.0.0.1",
                ),
            ],
        );
        check(
            &p,
            "::ffff:169.254.169.254",
            Some(
                "IPv4-mapped address ::ffff:169.254.169.254 embeds link-local (cloud metadata) \
                 address 169.254.169.254",
            ),
        );
        refused(
            &p,
            &[
                (
                    "::127.0.0.1",
                    "IPv4-compatible address ::7f00:1 embeds loopback address 127.0.0.1",
                ),
                (
                    "::10.0.0.1",
                    "IPv4-compatible address ::a00:1 embeds private address 10.0.0.1",
                ),
                (
                    "64:ff9b::7f00:1",
                    "NAT64 address 64:ff9b::7f00:1 embeds loopback address 127.0.0.1",
                ),
            ],
        );
        check(
            &p,
            "64:ff9b::a9fe:a9fe",
            Some(
                "NAT64 address 64:ff9b::a9fe:a9fe embeds link-local (cloud metadata) address \
                 169.254.169.254",
            ),
        );
        refused(
            &p,
            &[
                (
                    "2002:7f00:1::",
                    "6to4 address 2002:7f00:1:: embeds loopback address 127.0.0.1",
                ),
                (
                    "2002:c0a8:101::1",
                    "6to4 address 2002:c0a8:101::1 embeds private address 192.168.1.1",
                ),
                (
                    "::ffff:0.0.0.0",
                    "IPv4-mapped address ::ffff:0.0.0.0 embeds unspecified address 0.0.0.0",
                ),
            ],
        );
        // Public IPv4 addresses stay public in every form.
        passes(
            &p,
            &[
                "::ffff:8.8.8.8",
                "64:ff9b::808:808",
                "2002:808:808::1",
                "::8.8.8.8",
            ],
        );
    }

    #[test]
    fn allowed_networks_open_named_ranges_only() {
        let p =
            Egress::new(&["127.0.0.2/32".into(), "10.0.0.0/8".into(), "fd00::1".into()]).unwrap();
        passes(
            &p,
            &["127.0.0.2", "::ffff:127.0.0.2", "10.200.0.1", "fd00::1"],
        );
        refused(
            &p,
            &[
                ("127.0.0.1", "loopback address 127.0.0.1"),
                ("fd00::2", "private (unique local) address fd00::2"),
                ("192.168.0.1", "private address 192.168.0.1"),
            ],
        );
        let err = Egress::new(&["not-a-net".into()]).unwrap_err();
        assert!(err.contains("not-a-net"), "{err}");
    }

    #[tokio::test]
    async fn names_pass_only_when_every_address_does() {
        let p = Egress::default();
        let err = p.check_host("localhost", 80).await.unwrap_err();
        assert!(
            matches!(&err, EgressError::Refused(r) if r.reason.starts_with("localhost resolves to loopback address")),
            "{err}"
        );
        let p = Egress::new(&["127.0.0.0/8".into(), "::1/128".into()]).unwrap();
        let addrs = p.check_host("localhost", 8080).await.unwrap();
        assert!(
            addrs
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 8080),
            "{addrs:?}"
        );
    }

    #[tokio::test]
    async fn hosts_are_checked_as_a_connect_proxy_names_them() {
        let p = Egress::default();
        let reason = |r: Result<Vec<SocketAddr>, EgressError>| match r {
            Err(EgressError::Refused(r)) => r.reason,
            other => panic!("{other:?}"),
        };
        for (host, why) in [
            ("127.0.0.1", "loopback address 127.0.0.1"),
            ("[::1]", "loopback address ::1"),
            ("::1", "loopback address ::1"),
            ("0x7f000001", "loopback address 127.0.0.1"),
        ] {
            assert_eq!(reason(p.check_host(host, 443).await), why, "{host}");
        }
        assert_eq!(
            p.check_host("8.8.8.8", 443).await.unwrap(),
            vec!["8.8.8.8:443".parse::<SocketAddr>().unwrap()]
        );
    }

    #[tokio::test]
    async fn an_exempt_origin_passes_on_its_own_port_only() {
        let service = Url::parse("http://127.0.0.1:4000/base/").unwrap();
        let p = Egress::default().allow_origin(&service);
        let url = |u: &str| Url::parse(u).unwrap();
        assert_eq!(
            p.check_url(&url("http://127.0.0.1:4000/archives/x.zip"))
                .await
                .unwrap(),
            vec!["127.0.0.1:4000".parse::<SocketAddr>().unwrap()]
        );
        assert!(p.check_host("127.0.0.1", 4000).await.is_ok());
        for other in [
            "http://127.0.0.1:4001/",
            "http://127.0.0.2:4000/",
            "http://[::ffff:127.0.0.1]:4000/",
        ] {
            assert!(
                matches!(p.check_url(&url(other)).await, Err(EgressError::Refused(_))),
                "{other}"
            );
        }
        // A named origin: its name resolves unchecked, on its port only.
        let p = Egress::default().allow_origin(&url("http://localhost:4000"));
        assert!(p.check_url(&url("http://LOCALHOST:4000/x")).await.is_ok());
        assert!(p.check_url(&url("http://localhost:4001/x")).await.is_err());
        assert!(p.check_url(&url("ftp://localhost:4000/x")).await.is_err());
    }

    #[tokio::test]
    async fn the_reqwest_resolver_hands_out_only_checked_addresses() {
        use reqwest::dns::Resolve;
        let resolver = CheckedResolver {
            egress: Arc::new(Egress::default()),
        };
        let err = match resolver.resolve("localhost".parse().unwrap()).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(e) => e,
        };
        assert!(err.downcast_ref::<EgressError>().is_some(), "{err}");
    }
}
