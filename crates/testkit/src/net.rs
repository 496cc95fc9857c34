//! Network fixtures: a loopback port nothing listens on ([`ClosedPort`]) and an HTTP server a
//! sandbox can reach ([`http_target`]).

/// A loopback port held bound but not listening, for "nothing listens there": a connection to
/// it is refused at once, and no other process can listen on it while this value lives (a
/// port bound and released could be taken by anyone).
#[derive(Debug)]
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    port: u16,
}

impl ClosedPort {
    #[allow(clippy::new_without_default)]
    pub fn new() -> ClosedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(([127, 0, 0, 1], 0).into())
            .expect("bind a loopback port");
        let port = socket.local_addr().expect("a bound port").port();
        ClosedPort {
            _socket: socket,
            port,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// An HTTP/1.1 server the tests run on every host address, so a sandbox container can be
/// pointed at it: `/bytes/<n>` answers n bytes `x`, any other path `hello from <path>`; one
/// request per connection. Answers its port.
pub async fn http_target() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind the HTTP target");
    let port = listener.local_addr().expect("a bound port").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                let body = match path.strip_prefix("/bytes/") {
                    Some(n) => vec![b'x'; n.parse().unwrap_or(0)],
                    None => format!("hello from {path}").into_bytes(),
                };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            });
        }
    });
    port
}

#[cfg(test)]
mod tests {
    use crate::net::ClosedPort;

    #[tokio::test]
    async fn a_closed_port_refuses_connections() {
        let closed = ClosedPort::new();
        let refused = tokio::net::TcpStream::connect(("127.0.0.1", closed.port()))
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
