//! Tests of [`serve`] over real TCP connections, and of [`HttpLimits::from_env`].

use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use toolmesh_testkit::raw_http::{read_response, read_until_closed};

use super::*;

/// A request served on a kept-alive connection.
const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n";
/// An outer bound for events that come within a fraction of it.
const WITHIN: Duration = Duration::from_secs(10);

/// Answers `hello` to everything.
#[derive(Clone)]
struct Hello;

impl tower_service::Service<Request<Incoming>> for Hello {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Incoming>) -> Self::Future {
        std::future::ready(Ok(Response::new("hello".to_owned())))
    }
}

/// [`serve`] on a fresh loopback port in a task: its address, its stop, and the task.
async fn start(limits: HttpLimits) -> (String, CancellationToken, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve(
        listener,
        Hello,
        limits,
        stop.clone().cancelled_owned(),
    ));
    (addr, stop, task)
}

#[tokio::test]
async fn a_half_sent_head_is_closed_after_the_header_timeout() {
    let timeout = Duration::from_millis(300);
    let (addr, _stop, _task) = start(HttpLimits {
        header_timeout: timeout,
        ..HttpLimits::default()
    })
    .await;
    for sent in [&b"GET / HTTP/1.1\r\nHost: te"[..], b""] {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        stream.write_all(sent).await.unwrap();
        let began = Instant::now();
        tokio::time::timeout(WITHIN, read_until_closed(&mut stream))
            .await
            .unwrap_or_else(|_| panic!("{sent:?} still open after {WITHIN:?}"));
        assert!(began.elapsed() >= timeout - Duration::from_millis(50));
    }
    // A kept-alive connection gets the same time for its next head.
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    stream.write_all(GET).await.unwrap();
    read_response(&mut stream).await;
    tokio::time::timeout(WITHIN, read_until_closed(&mut stream))
        .await
        .expect("an idle kept-alive connection is closed");
}

#[tokio::test]
async fn past_the_cap_a_connection_waits_until_one_closes() {
    let (addr, _stop, _task) = start(HttpLimits {
        header_timeout: WITHIN * 6,
        max_connections: 2,
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        stream.write_all(GET).await.unwrap();
        read_response(&mut stream).await;
        held.push(stream);
    }
    let mut third = TcpStream::connect(&addr).await.unwrap();
    third.write_all(GET).await.unwrap();
    // Nothing happens, so a short bound is all there is to wait on.
    let early = tokio::time::timeout(Duration::from_millis(500), read_response(&mut third)).await;
    assert!(early.is_err(), "served past the cap: {early:?}");
    drop(held.pop());
    let served = tokio::time::timeout(WITHIN, read_response(&mut third))
        .await
        .expect("served once a connection closed");
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
}

#[tokio::test]
async fn shutdown_stops_accepting_and_closes_idle_connections() {
    let (addr, stop, task) = start(HttpLimits::default()).await;
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(GET).await.unwrap();
    read_response(&mut idle).await;
    stop.cancel();
    tokio::time::timeout(WITHIN, task)
        .await
        .expect("serve returns")
        .unwrap();
    tokio::time::timeout(WITHIN, read_until_closed(&mut idle))
        .await
        .expect("the idle connection is closed");
    assert!(TcpStream::connect(&addr).await.is_err());
}

#[test]
fn limits_come_from_the_environment() {
    fn check(pairs: &[(&str, &str)], expect: Result<(u64, usize), &str>) {
        let got = HttpLimits::from_env(&RawEnv::from_pairs(pairs.iter().copied()));
        match (got, expect) {
            (Ok(got), Ok((timeout_s, max))) => {
                assert_eq!(
                    got.header_timeout,
                    Duration::from_secs(timeout_s),
                    "{pairs:?}"
                );
                assert_eq!(got.max_connections, max, "{pairs:?}");
            }
            (Err(e), Err(key)) => {
                assert!(e.to_string().contains(key), "{pairs:?}: {e}");
            }
            (got, expect) => panic!("{pairs:?}: got {got:?}, want {expect:?}"),
        }
    }
    check(&[], Ok((10, 1024)));
    check(
        &[(HEADER_TIMEOUT_VAR, " 3 "), (MAX_CONNECTIONS_VAR, "2")],
        Ok((3, 2)),
    );
    for bad in ["0", "-1", "ten", "1.5", "86401"] {
        check(&[(HEADER_TIMEOUT_VAR, bad)], Err(HEADER_TIMEOUT_VAR));
    }
    for bad in ["0", "-1", "many", "99999999999999999999"] {
        check(&[(MAX_CONNECTIONS_VAR, bad)], Err(MAX_CONNECTIONS_VAR));
    }
}

#[test]
fn a_listen_address_is_an_ip_and_a_port() {
    let read = |value: &str| {
        listen_addr(
            &RawEnv::from_pairs([("LISTEN", value)]),
            "LISTEN",
            "127.0.0.1:80",
        )
    };
    assert_eq!(read("").unwrap(), SocketAddr::from(([127, 0, 0, 1], 80)));
    assert_eq!(
        read(" [::1]:9 ").unwrap(),
        SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], 9))
    );
    let err = read("localhost:9").unwrap_err().to_string();
    assert!(
        err.starts_with("LISTEN=\"localhost:9\" is not valid: "),
        "{err}"
    );
}
