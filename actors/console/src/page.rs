//! The page itself: plain HTML, CSS and JavaScript compiled into the binary, no external
//! assets. A strict Content-Security-Policy allows only this origin's script and style, so
//! nothing an approval carries can run as code even if it reached the markup (the script
//! writes data with `textContent` only).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/console.js");
const STYLE: &str = include_str!("page/console.css");
const UNCONFIGURED: &str = include_str!("page/unconfigured.html");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

fn asset(status: StatusCode, content_type: &'static str, body: &'static str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

pub fn index() -> Response {
    asset(StatusCode::OK, "text/html; charset=utf-8", INDEX)
}

/// What a console without `TOOLMESH_CONSOLE_TOKENS` serves at `/`.
pub fn unconfigured() -> Response {
    asset(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/html; charset=utf-8",
        UNCONFIGURED,
    )
}

pub fn script() -> Response {
    asset(StatusCode::OK, "text/javascript; charset=utf-8", SCRIPT)
}

pub fn style() -> Response {
    asset(StatusCode::OK, "text/css; charset=utf-8", STYLE)
}
