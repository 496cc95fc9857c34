//! A probe of a sandbox's egress, for the tests that run one inside a sandbox: the sandbox
//! crate's backend tests run it as a program, the root's cluster tests as a `run_command`.

/// A Python program that runs the ops of its first argument, a JSON list, and prints their
/// answers as one JSON list: `["get", url]` (urllib through `HTTP_PROXY`), `["tunnel", host,
/// port, path]` (CONNECT with the proxy credential, then plain HTTP inside), `["raw_get", url]`
/// (absolute-form to the proxy without a credential), `["direct", host, port]` and
/// `["direct_to_proxy", port]` (a TCP connection, no proxy).
pub const EGRESS_PROBE: &str = r#"
import base64, http.client, json, os, socket, sys, urllib.error, urllib.request
from urllib.parse import urlsplit
proxy = urlsplit(os.environ["HTTP_PROXY"])
def get(url):
    try:
        r = urllib.request.urlopen(url, timeout=15)
        return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except Exception as e:
        return ["error", repr(e)]
def tunnel(host, port, path):
    auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
    c = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=15)
    c.set_tunnel(host, port, headers={"Proxy-Authorization": "Basic " + auth})
    try:
        c.request("GET", path)
        r = c.getresponse()
        return [r.status, r.read().decode()]
    except OSError as e:
        return ["error", str(e)]
def raw_get(url):
    c = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=15)
    c.request("GET", url)
    r = c.getresponse()
    return [r.status, r.read().decode()]
def direct(host, port):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, port))
        return "connected"
    except OSError as e:
        return type(e).__name__
def direct_to_proxy(port):
    return direct(proxy.hostname, port)
out = []
for op in json.loads(sys.argv[1]):
    out.append(globals()[op[0]](*op[1:]))
print(json.dumps(out))
"#;

/// A shell command that runs [`EGRESS_PROBE`] with `ops`.
pub fn egress_probe_command(ops: &serde_json::Value) -> String {
    let ops = ops.to_string();
    assert!(
        !ops.contains('\''),
        "ops are single-quoted for the shell: {ops}"
    );
    format!("python3 - '{ops}' <<'EOF'{EGRESS_PROBE}EOF")
}
