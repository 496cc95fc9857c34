//! `web_search` providers, chosen by `TOOLMESH_WEB_SEARCH_PROVIDER`:
//!
//! * `fake`: `max_results` deterministic results for tests and demos; nothing leaves the node.
//! * `http`: one GET to the operator's endpoint `TOOLMESH_WEB_SEARCH_URL` with the query
//!   parameters `q`, `count` (= `max_results`) and, when given, `recency_days`, and
//!   `Authorization: Bearer <TOOLMESH_WEB_SEARCH_API_KEY>` when a key is set. The endpoint
//!   answers `{"results": [{"title", "url", "snippet"?, "date"?}]}`; extra members are
//!   ignored, results past `max_results` dropped. The endpoint is configured by the operator,
//!   so it is not subject to `web_fetch`'s egress policy.
//!
//! Every result is `{"title", "url", "snippet", "rank" (from 1), "provider"}`, plus `date`
//! when the provider gave one.

use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use url::Url;

/// How long the `http` provider may take.
pub const HTTP_SEARCH_TIMEOUT: Duration = Duration::from_secs(30);

/// A configured search provider.
#[derive(Debug, Clone)]
pub enum SearchProvider {
    Fake,
    Http {
        url: Url,
        api_key: Option<String>,
        client: reqwest::Client,
    },
}

/// One search as the tool was asked.
#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    pub query: &'a str,
    pub max_results: usize,
    pub recency_days: Option<u64>,
}

/// Why the search provider's configuration cannot be used (the web actor does not start).
#[derive(Debug, thiserror::Error)]
pub enum SearchConfigError {
    #[error(
        "TOOLMESH_WEB_SEARCH_PROVIDER=http needs TOOLMESH_WEB_SEARCH_URL, the search endpoint"
    )]
    NoUrl,
    #[error("TOOLMESH_WEB_SEARCH_URL={0:?} is not an http(s) URL")]
    NotHttp(String),
    #[error("cannot build the search HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("TOOLMESH_WEB_SEARCH_PROVIDER={0:?} is not a provider; use http or fake")]
    Unknown(String),
}

/// Why the `http` provider brought no results. `tools::web_search` turns it into PROTOCOL.md's
/// code.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("the search provider did not answer in time")]
    Timeout(#[source] reqwest::Error),
    #[error("cannot reach the search provider: {0}")]
    Unreachable(#[source] reqwest::Error),
    #[error("the search provider answered HTTP {}", .0.as_u16())]
    Status(StatusCode),
    #[error("cannot read the search provider's answer: {0}")]
    Body(#[source] reqwest::Error),
    #[error(
        "the search provider's answer is not {{\"results\": [{{\"title\", \"url\", …}}]}}: {0}"
    )]
    Answer(#[source] serde_json::Error),
}

/// What kind of [`SearchError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchErrorKind {
    /// The provider did not answer in time: `timeout`.
    TimedOut,
    /// The provider could not be reached, refused or answered nonsense: `fetch_failed`.
    Failed,
}

impl SearchError {
    pub fn kind(&self) -> SearchErrorKind {
        match self {
            SearchError::Timeout(_) => SearchErrorKind::TimedOut,
            _ => SearchErrorKind::Failed,
        }
    }
}

#[derive(Debug, Deserialize)]
struct HttpAnswer {
    results: Vec<HttpResult>,
}

#[derive(Debug, Deserialize)]
struct HttpResult {
    title: String,
    url: String,
    #[serde(default)]
    snippet: Option<String>,
    #[serde(default)]
    date: Option<String>,
}

impl SearchProvider {
    /// The provider named by the configuration; `None` when none is configured.
    pub fn from_config(
        name: Option<&str>,
        url: Option<&str>,
        api_key: Option<&str>,
    ) -> Result<Option<SearchProvider>, SearchConfigError> {
        match name.map(str::trim) {
            None => Ok(None),
            Some("fake") => Ok(Some(SearchProvider::Fake)),
            Some("http") => {
                let raw = url.ok_or(SearchConfigError::NoUrl)?;
                let url = Url::parse(raw.trim())
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https"))
                    .ok_or_else(|| SearchConfigError::NotHttp(raw.to_owned()))?;
                let client = reqwest::Client::builder()
                    .timeout(HTTP_SEARCH_TIMEOUT)
                    .build()
                    .map_err(SearchConfigError::Client)?;
                Ok(Some(SearchProvider::Http {
                    url,
                    api_key: api_key.map(str::to_owned),
                    client,
                }))
            }
            Some(other) => Err(SearchConfigError::Unknown(other.to_owned())),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            SearchProvider::Fake => "fake",
            SearchProvider::Http { .. } => "http",
        }
    }

    pub async fn search(&self, query: Query<'_>) -> Result<Vec<Value>, SearchError> {
        match self {
            SearchProvider::Fake => Ok(fake_results(query)),
            SearchProvider::Http {
                url,
                api_key,
                client,
            } => http_results(client, url, api_key.as_deref(), query).await,
        }
    }
}

/// The `fake` provider's answer: a pure function of the query and the count.
pub fn fake_results(query: Query<'_>) -> Vec<Value> {
    (1..=query.max_results)
        .map(|rank| {
            let mut url = Url::parse("https://search.invalid/fake").expect("a valid URL");
            url.query_pairs_mut()
                .append_pair("q", query.query)
                .append_pair("rank", &rank.to_string());
            json!({
                "title": format!("Result {rank} for {}", query.query),
                "url": url.as_str(),
                "snippet": format!("Deterministic result {rank} of the fake provider for \"{}\".", query.query),
                "rank": rank,
                "provider": "fake",
            })
        })
        .collect()
}

async fn http_results(
    client: &reqwest::Client,
    endpoint: &Url,
    api_key: Option<&str>,
    query: Query<'_>,
) -> Result<Vec<Value>, SearchError> {
    let mut url = endpoint.clone();
    {
        let mut pairs = url.query_pairs_mut();
        pairs
            .append_pair("q", query.query)
            .append_pair("count", &query.max_results.to_string());
        if let Some(days) = query.recency_days {
            pairs.append_pair("recency_days", &days.to_string());
        }
    }
    let mut request = client.get(url);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| {
        if e.is_timeout() {
            SearchError::Timeout(e)
        } else {
            SearchError::Unreachable(e)
        }
    })?;
    let status = response.status();
    if !status.is_success() {
        return Err(SearchError::Status(status));
    }
    let body = response.bytes().await.map_err(SearchError::Body)?;
    let answer: HttpAnswer = serde_json::from_slice(&body).map_err(SearchError::Answer)?;
    Ok(answer
        .results
        .into_iter()
        .take(query.max_results)
        .enumerate()
        .map(|(i, r)| {
            let mut item = json!({
                "title": r.title,
                "url": r.url,
                "snippet": r.snippet.unwrap_or_default(),
                "rank": i + 1,
                "provider": "http",
            });
            if let Some(date) = r.date {
                item["date"] = Value::from(date);
            }
            item
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_results_are_deterministic_and_ranked_from_one() {
        let q = Query {
            query: "rust & nats",
            max_results: 3,
            recency_days: None,
        };
        let a = fake_results(q);
        assert_eq!(a, fake_results(q));
        assert_eq!(a.len(), 3);
        assert_eq!(a[0]["rank"], 1);
        assert_eq!(a[2]["rank"], 3);
        assert_eq!(a[0]["provider"], "fake");
        assert_eq!(
            a[1]["url"],
            "https://search.invalid/fake?q=rust+%26+nats&rank=2"
        );
    }

    #[test]
    fn configuration_is_checked() {
        assert!(SearchProvider::from_config(None, None, None)
            .unwrap()
            .is_none());
        let fake = SearchProvider::from_config(Some("fake"), None, None).unwrap();
        assert_eq!(fake.unwrap().name(), "fake");
        let err = SearchProvider::from_config(Some("http"), None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("TOOLMESH_WEB_SEARCH_URL"), "{err}");
        let err = SearchProvider::from_config(Some("http"), Some("ftp://x/"), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an http(s) URL"), "{err}");
        let err = SearchProvider::from_config(Some("ksyun"), None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("use http or fake"), "{err}");
        let http = SearchProvider::from_config(Some("http"), Some("http://127.0.0.1:1/s"), None);
        assert_eq!(http.unwrap().unwrap().name(), "http");
    }
}
