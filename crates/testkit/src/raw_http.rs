//! Raw HTTP/1.1 over a TCP stream, for tests of what a listener does with a client that is
//! slow, silent or one too many.

use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

/// Reads one response (its head and a `Content-Length` body; the connection stays open)
/// and answers its status line. Panics when the server closes the connection first.
pub async fn read_response(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .unwrap_or_else(|| panic!("a response with a Content-Length: {head}"));
            if got.len() >= end + 4 + length {
                return head.lines().next().unwrap_or_default().to_owned();
            }
        }
        let n = stream.read(&mut buf).await.expect("the response arrives");
        assert!(n > 0, "closed before the response: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// Reads until the server closes the connection (end of stream or reset).
pub async fn read_until_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}
