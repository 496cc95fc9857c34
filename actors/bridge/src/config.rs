//! The bridge's configuration: `TOOLMESH_MCP_SERVERS` names a JSON file in the `mcpServers`
//! format MCP clients use, validated once at start. A bad file stops the node with an error
//! naming the server and the field (`mcpServers.git.args[1]: must be a string`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use http::{HeaderName, HeaderValue};
use serde_json::{Map, Value};
use toolmesh_kernel::config::{ConfigFile, FileError, RawEnv, Unplaced};

/// The environment variable naming the file.
pub const SERVERS_VAR: &str = "TOOLMESH_MCP_SERVERS";

/// Characters of a server's name at most: `<name>_<tool>` must stay within the 64 characters
/// of a tool name with room for the tool's own.
pub const MAX_SERVER_NAME: usize = 32;

/// Variables a stdio server inherits from the node (the MCP SDKs' default set); everything
/// else it gets comes from its `env`. The node's own `TOOLMESH_*` settings (NATS credentials)
/// never reach a server.
pub const INHERITED_ENV: [&str; 10] = [
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR",
];

/// Headers the MCP transport sets itself; a server's `headers` may not name them.
const RESERVED_HEADERS: [&str; 3] = ["accept", "mcp-session-id", "last-event-id"];

/// What the bridge runs: one entry per MCP server, in the file's order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BridgeConfig {
    /// The file the servers came from (for messages).
    pub file: Option<PathBuf>,
    pub servers: Vec<ServerConfig>,
}

/// One MCP server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Its key in `mcpServers`: `[A-Za-z0-9_-]{1,32}`.
    pub name: String,
    pub transport: Transport,
}

/// How the bridge reaches a server.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A child process speaking MCP on its standard input and output.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A server at a URL, over streamable HTTP.
    Http {
        url: url::Url,
        headers: Vec<(HeaderName, HeaderValue)>,
    },
}

impl Transport {
    /// `stdio` or `http`, as status reports it.
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Stdio { .. } => "stdio",
            Transport::Http { .. } => "http",
        }
    }
}

impl ServerConfig {
    /// The micro service its tools are served as.
    pub fn service_name(&self) -> String {
        format!("mcp-{}", self.name)
    }
}

/// The servers file: JSON, named by [`SERVERS_VAR`].
pub const SERVERS_FILE: ConfigFile = ConfigFile {
    var: SERVERS_VAR,
    format: "JSON",
};

impl BridgeConfig {
    /// Reads `TOOLMESH_MCP_SERVERS`; unset means a bridge without servers.
    pub fn from_env(env: &RawEnv) -> Result<BridgeConfig, FileError> {
        match env.get(SERVERS_VAR) {
            None => Ok(BridgeConfig::default()),
            Some(path) => BridgeConfig::from_file(Path::new(path.trim())),
        }
    }

    pub fn from_file(path: &Path) -> Result<BridgeConfig, FileError> {
        let mut config = SERVERS_FILE.read(path, BridgeConfig::parse)?;
        config.file = Some(path.to_owned());
        Ok(config)
    }

    /// Parses and validates the file's text.
    pub fn parse(text: &str) -> Result<BridgeConfig, Unplaced> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| Unplaced::Syntax(e.to_string()))?;
        let root = root
            .as_object()
            .ok_or_else(|| Unplaced::field("(top level)", "must be an object"))?;
        for key in root.keys() {
            if key != "mcpServers" {
                return Err(Unplaced::field(
                    key,
                    "unknown member; the file holds {\"mcpServers\": {…}}",
                ));
            }
        }
        let servers = root
            .get("mcpServers")
            .ok_or_else(|| Unplaced::field("mcpServers", "missing"))?
            .as_object()
            .ok_or_else(|| Unplaced::field("mcpServers", "must be an object of servers"))?;
        let mut out = Vec::with_capacity(servers.len());
        for (name, entry) in servers {
            if let Some(server) = parse_server(name, entry)? {
                out.push(server);
            }
        }
        Ok(BridgeConfig {
            file: None,
            servers: out,
        })
    }
}

/// `None` for a server marked `"disabled": true`.
fn parse_server(name: &str, entry: &Value) -> Result<Option<ServerConfig>, Unplaced> {
    let at = |field: &str| {
        if field.is_empty() {
            format!("mcpServers.{}", quoted(name))
        } else {
            format!("mcpServers.{}.{field}", quoted(name))
        }
    };
    let name_ok = !name.is_empty()
        && name.len() <= MAX_SERVER_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !name_ok {
        return Err(Unplaced::field(
            at(""),
            format!("a server's name is 1 to {MAX_SERVER_NAME} of A-Z a-z 0-9 _ -"),
        ));
    }
    let entry = entry
        .as_object()
        .ok_or_else(|| Unplaced::field(at(""), "must be an object"))?;
    const KNOWN: [&str; 8] = [
        "command", "args", "env", "cwd", "url", "headers", "type", "disabled",
    ];
    if let Some(unknown) = entry.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(Unplaced::field(
            at(unknown),
            format!("unknown member (known: {})", KNOWN.join(", ")),
        ));
    }
    match entry.get("disabled") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => return Ok(None),
        Some(_) => return Err(Unplaced::field(at("disabled"), "must be true or false")),
    }
    let kind = match entry.get("type") {
        None => None,
        Some(Value::String(t)) => Some(t.as_str()),
        Some(_) => return Err(Unplaced::field(at("type"), "must be a string")),
    };
    let transport = match (entry.get("command"), entry.get("url")) {
        (Some(_), Some(_)) => {
            return Err(Unplaced::field(
                at(""),
                "has both command and url; a server is one or the other",
            ))
        }
        (None, None) => {
            return Err(Unplaced::field(
                at(""),
                "needs command (a stdio server) or url (an HTTP server)",
            ))
        }
        (Some(command), None) => {
            if !matches!(kind, None | Some("stdio")) {
                return Err(Unplaced::field(
                    at("type"),
                    "a server with command is stdio",
                ));
            }
            for field in ["headers"] {
                if entry.contains_key(field) {
                    return Err(Unplaced::field(at(field), "only for a url server"));
                }
            }
            let command = match command {
                Value::String(c) if !c.trim().is_empty() => c.clone(),
                _ => return Err(Unplaced::field(at("command"), "must be a non-empty string")),
            };
            let args = match entry.get("args") {
                None => Vec::new(),
                Some(Value::Array(items)) => items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_str().map(str::to_owned).ok_or_else(|| {
                            Unplaced::field(at(&format!("args[{i}]")), "must be a string")
                        })
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(Unplaced::field(at("args"), "must be a list of strings")),
            };
            let env = string_map(entry.get("env"), &at("env"))?
                .into_iter()
                .collect::<BTreeMap<_, _>>();
            for key in env.keys() {
                if key.is_empty() || key.contains('=') || key.contains('\0') {
                    return Err(Unplaced::field(
                        format!("{}.{}", at("env"), quoted(key)),
                        "not a variable name",
                    ));
                }
            }
            let cwd = match entry.get("cwd") {
                None => None,
                Some(Value::String(c)) if !c.is_empty() => Some(PathBuf::from(c)),
                Some(_) => return Err(Unplaced::field(at("cwd"), "must be a non-empty string")),
            };
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            }
        }
        (None, Some(url)) => {
            if !matches!(
                kind,
                None | Some("http" | "streamable-http" | "streamableHttp")
            ) {
                return Err(Unplaced::field(
                    at("type"),
                    "a url server is streamable HTTP (type http)",
                ));
            }
            for field in ["args", "env", "cwd"] {
                if entry.contains_key(field) {
                    return Err(Unplaced::field(at(field), "only for a command server"));
                }
            }
            let url = url
                .as_str()
                .ok_or_else(|| Unplaced::field(at("url"), "must be a string"))?;
            let url = url::Url::parse(url)
                .map_err(|e| Unplaced::field(at("url"), format!("not a URL: {e}")))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(Unplaced::field(at("url"), "must be http:// or https://"));
            }
            let mut headers = Vec::new();
            for (key, value) in string_map(entry.get("headers"), &at("headers"))? {
                let field = format!("{}.{}", at("headers"), quoted(&key));
                let name = HeaderName::from_bytes(key.as_bytes())
                    .map_err(|_| Unplaced::field(&field, "not a header name"))?;
                if RESERVED_HEADERS.contains(&name.as_str()) {
                    return Err(Unplaced::field(&field, "set by the MCP transport itself"));
                }
                let value = HeaderValue::from_str(&value)
                    .map_err(|_| Unplaced::field(&field, "not a header value"))?;
                headers.push((name, value));
            }
            Transport::Http { url, headers }
        }
    };
    Ok(Some(ServerConfig {
        name: name.to_owned(),
        transport,
    }))
}

fn string_map(value: Option<&Value>, field: &str) -> Result<Vec<(String, String)>, Unplaced> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let object: &Map<String, Value> = value
        .as_object()
        .ok_or_else(|| Unplaced::field(field, "must be an object of strings"))?;
    object
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(Unplaced::field(
                format!("{field}.{}", quoted(k)),
                "must be a string",
            )),
        })
        .collect()
}

/// A name as it appears in a field path: bare when it is a plain word, else JSON-quoted and
/// display-safe.
fn quoted(name: &str) -> String {
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        name.to_owned()
    } else {
        toolmesh_kernel::text::display_safe(&serde_json::to_string(name).unwrap_or_default())
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    use toolmesh_kernel::config::assert_refused_at;

    use super::*;

    #[track_caller]
    fn check_err(text: &str, field: &str, reason_part: &str) {
        assert_refused_at(BridgeConfig::parse(text), text, field, reason_part);
    }

    #[test]
    fn bad_files_name_the_server_and_field() {
        check_err(r#"{"servers": {}}"#, "servers", "unknown member");
        check_err(r#"{"mcpServers": []}"#, "mcpServers", "object");
        check_err(
            r#"{"mcpServers": {"git": {"command": "x", "args": ["a", 1]}}}"#,
            "mcpServers.git.args[1]",
            "string",
        );
        check_err(
            r#"{"mcpServers": {"git": {"comand": "x"}}}"#,
            "mcpServers.git.comand",
            "unknown member",
        );
        check_err(
            r#"{"mcpServers": {"git": {}}}"#,
            "mcpServers.git",
            "needs command",
        );
        check_err(
            r#"{"mcpServers": {"a b": {"command": "x"}}}"#,
            "mcpServers.\"a b\"",
            "name",
        );
        check_err(
            r#"{"mcpServers": {"web": {"url": "ftp://x"}}}"#,
            "mcpServers.web.url",
            "http",
        );
        check_err(
            r#"{"mcpServers": {"web": {"url": "http://x", "headers": {"Accept": "y"}}}}"#,
            "mcpServers.web.headers.Accept",
            "transport",
        );
        check_err(
            r#"{"mcpServers": {"t": {"command": "x", "env": {"A": 1}}}}"#,
            "mcpServers.t.env.A",
            "string",
        );
        assert!(matches!(BridgeConfig::parse("{"), Err(Unplaced::Syntax(_))));
    }

    #[test]
    fn good_files_parse_in_order_and_skip_disabled_servers() {
        let config = BridgeConfig::parse(
            r#"{"mcpServers": {
                "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
                "off": {"command": "x", "disabled": true},
                "web": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer t"}}
            }}"#,
        )
        .unwrap();
        let names: Vec<&str> = config.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["time", "web"]);
        assert_eq!(config.servers[0].service_name(), "mcp-time");
        assert_eq!(config.servers[1].transport.kind(), "http");
        match &config.servers[0].transport {
            Transport::Stdio { command, args, .. } => {
                assert_eq!(command, "mcp-server-time");
                assert_eq!(args, &["--local-timezone", "UTC"]);
            }
            other => panic!("{other:?}"),
        }
    }
}
