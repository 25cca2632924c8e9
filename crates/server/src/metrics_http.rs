//! A tiny HTTP/1.1 server for Prometheus scrapes, on the node's tokio
//! runtime: `GET /metrics` gets the exposition text, any other path 404,
//! any other method 405. One request per connection (the reply carries
//! `Connection: close`); headers are read and ignored.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::state::NodeState;

/// Largest request head read.
const MAX_HEAD: usize = 8 << 10;
/// How long a client gets to send its request and read the reply.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves scrapes until the node stops.
pub async fn serve(listener: TcpListener, state: Arc<NodeState>) {
    let mut stop = state.shutdown.subscribe();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => {
                    let state = state.clone();
                    tokio::spawn(async move {
                        if tokio::time::timeout(IO_TIMEOUT, answer(s, state)).await.is_err() {
                            tracing::debug!("metrics request timed out");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("metrics accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
}

/// Reads the request head (until the blank line) and writes the response.
async fn answer(mut s: TcpStream, state: Arc<NodeState>) {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let (status, ctype, body) = match route(&head) {
        Route::Metrics => {
            let st = state.clone();
            let text = tokio::task::spawn_blocking(move || {
                crate::prom::render(&st.metrics.commands(), st.metrics.phases(), &st.db.stats())
            })
            .await;
            match text {
                Ok(t) => ("200 OK", crate::prom::CONTENT_TYPE, t),
                Err(_) => ("500 Internal Server Error", "text/plain", "error\n".into()),
            }
        }
        Route::NotFound => ("404 Not Found", "text/plain", "not found\n".into()),
        Route::BadMethod => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".into(),
        ),
        Route::Bad => ("400 Bad Request", "text/plain", "bad request\n".into()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(reply.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics,
    NotFound,
    BadMethod,
    Bad,
}

/// Routes on the request line `METHOD PATH VERSION`.
fn route(head: &[u8]) -> Route {
    let line_end = head
        .iter()
        .position(|b| *b == b'\r' || *b == b'\n')
        .unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return Route::Bad;
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::Bad;
    };
    if !version.starts_with("HTTP/") {
        return Route::Bad;
    }
    if method != "GET" {
        return Route::BadMethod;
    }
    let path = target.split('?').next().unwrap_or(target);
    if path == "/metrics" {
        Route::Metrics
    } else {
        Route::NotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_request_lines() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics
        );
        assert_eq!(route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Route::Metrics);
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"POST /metrics HTTP/1.1\r\n\r\n"), Route::BadMethod);
        assert_eq!(route(b"garbage"), Route::Bad);
        assert_eq!(route(b"\xff\xfe / HTTP/1.1\r\n"), Route::Bad);
    }
}
