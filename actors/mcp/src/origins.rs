//! The browser origins the MCP front serves (`TOOLMESH_MCP_ALLOWED_ORIGINS`, PROTOCOL.md
//! "Tenancy and trust"): a request whose `Origin` header is present and not listed is HTTP 403
//! before its bearer token is looked at, so a page of another site, or one reached through DNS
//! rebinding, can neither use a token nor learn whether one is valid. A request without
//! `Origin` (any client that is not a browser) is unaffected.
//!
//! rmcp's own `allowed_origins` check is not used: it runs inside the MCP service, after the
//! token check, and an entry without a port there matches every port. Here an origin is listed
//! only when scheme, host and port (the scheme's default when absent) all match an entry.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use url::{Origin, Url};

/// The variable listing the origins served.
pub const ALLOWED_ORIGINS_VAR: &str = "TOOLMESH_MCP_ALLOWED_ORIGINS";

/// The origins listed in `TOOLMESH_MCP_ALLOWED_ORIGINS` (none by default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedOrigins(Vec<Origin>);

impl AllowedOrigins {
    /// Parses a comma-separated list of `http(s)://host[:port]`; the error names the first
    /// entry that is not one.
    pub fn parse(list: &str) -> Result<AllowedOrigins, String> {
        let mut origins = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let origin = parse_origin(entry).ok_or_else(|| {
                format!("{entry:?} is not an origin; use scheme://host[:port], e.g. https://app.example.com")
            })?;
            origins.push(origin);
        }
        Ok(AllowedOrigins(origins))
    }

    /// Whether an `Origin` header's value is listed.
    pub fn allows(&self, value: &http::HeaderValue) -> bool {
        value
            .to_str()
            .ok()
            .and_then(parse_origin)
            .is_some_and(|origin| self.0.contains(&origin))
    }
}

/// An origin as a browser serializes it: an http or https URL with nothing after the host and
/// port. Anything else (`null`, a path, a query) is none.
fn parse_origin(text: &str) -> Option<Origin> {
    let url = Url::parse(text).ok()?;
    let bare = matches!(url.scheme(), "http" | "https")
        && url.username().is_empty()
        && url.password().is_none()
        && url.path() == "/"
        && !text.ends_with('/')
        && url.query().is_none()
        && url.fragment().is_none();
    bare.then(|| url.origin())
}

/// 403 when an `Origin` header is present and not listed; otherwise the request goes on.
pub(crate) async fn check_origin(
    State(allowed): State<Arc<AllowedOrigins>>,
    request: Request,
    next: Next,
) -> Response {
    let mut origins = request.headers().get_all(http::header::ORIGIN).iter();
    if origins.all(|origin| allowed.allows(origin)) {
        return next.run(request).await;
    }
    tracing::warn!("refused an MCP request from a browser origin not in {ALLOWED_ORIGINS_VAR}");
    (
        http::StatusCode::FORBIDDEN,
        [(http::header::CONTENT_TYPE, "application/json")],
        r#"{"error":"forbidden","error_description":"requests from this Origin are not served (TOOLMESH_MCP_ALLOWED_ORIGINS)"}"#,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(list: &str, origin: &str, allowed: bool) {
        let origins = AllowedOrigins::parse(list).unwrap();
        let value = http::HeaderValue::from_str(origin).unwrap();
        assert_eq!(
            origins.allows(&value),
            allowed,
            "{origin:?} against {list:?}"
        );
    }

    #[test]
    fn an_origin_is_allowed_when_scheme_host_and_port_match_an_entry() {
        let list = "https://app.example.com, http://localhost:3000";
        check(list, "https://app.example.com", true);
        check(list, "https://APP.example.com:443", true);
        check(list, "http://localhost:3000", true);
        check(list, "http://app.example.com", false);
        check(list, "https://app.example.com:8443", false);
        check(list, "http://localhost", false);
        check(list, "http://localhost:3001", false);
        check(list, "https://app.example.com.attacker.example", false);
        check(list, "https://app.example.com/", false);
        check(list, "https://app.example.com/path", false);
        check(list, "null", false);
        check(list, "", false);
        check("", "https://app.example.com", false);
        check("http://attacker.example", "http://attacker.example", true);
    }

    #[test]
    fn entries_that_are_not_origins_are_refused_naming_them() {
        for bad in [
            "app.example.com",
            "https://app.example.com/path",
            "https://app.example.com/",
            "https://user@app.example.com",
            "null",
            "ftp://files.example.com",
            "https://a.example, *",
        ] {
            let err = AllowedOrigins::parse(bad).unwrap_err();
            assert!(err.contains("is not an origin"), "{bad}: {err}");
        }
        assert_eq!(
            AllowedOrigins::parse(" , ").unwrap(),
            AllowedOrigins::default()
        );
    }
}
