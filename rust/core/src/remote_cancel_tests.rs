//! Tests of cancelling remote reads through the one request path: a read of a server
//! that stalls mid-body stops at once when cancelled, and still times out when not. They
//! live above both the request path and the remote source, which they join.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, RemoteFailure, Result};
use crate::request::{submit, Completion, Request};
use crate::settings::Settings;
use crate::source::remote::{open_url, EndpointType};
use crate::span::{HostSpan, Span};
use crate::FileHandle;

/// A server that answers each request's headers (a 206 of `len` bytes) and then
/// sends nothing more, holding the connection open for a minute.
fn stalling_server(len: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/f", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut head = [0u8; 4096];
                let _ = conn.read(&mut head);
                let _ = write!(
                    conn,
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {len}\r\n\
                     Content-Range: bytes 0-{}/{len}\r\n\r\n",
                    len - 1
                );
                std::thread::sleep(Duration::from_secs(60));
            });
        }
    });
    url
}

fn stalled_read(settings: &Settings) -> (crate::IoFuture, Vec<u8>) {
    let len = 1000;
    let url = stalling_server(len);
    let source = open_url(&url, EndpointType::Http, None, Some(len as u64), settings).unwrap();
    let handle = FileHandle::from_source(Arc::new(source), "test".into());
    let mut buf = vec![0u8; len];
    let span = Span::Host(HostSpan::from_slice(&mut buf));
    let future = submit(
        settings,
        &handle,
        Request::read(span, 0),
        Completion::Future,
    );
    (future.unwrap(), buf)
}

/// Whether a read's `outcome` is a remote failure of `kind`.
fn failed_with(outcome: &Option<Result<usize>>, kind: RemoteFailure) -> bool {
    matches!(outcome, Some(Err(Error::Remote { kind: k, .. })) if *k == kind)
}

#[test]
fn a_cancelled_read_of_a_stalled_server_stops_at_once() {
    let _serial = crate::cancel::generation_lock();
    let settings = Settings {
        http_timeout: 60,
        ..Settings::default()
    };
    let (future, _buf) = stalled_read(&settings);
    assert!(future.wait_timeout(Duration::from_millis(200)).is_none());
    future.cancel();
    let outcome = future.wait_timeout(Duration::from_secs(5));
    assert!(
        failed_with(&outcome, RemoteFailure::Cancelled),
        "{outcome:?}"
    );
}

#[test]
fn a_stalled_read_still_times_out() {
    let _serial = crate::cancel::generation_lock();
    let settings = Settings {
        http_timeout: 1,
        http_max_attempts: 1,
        ..Settings::default()
    };
    let (future, _buf) = stalled_read(&settings);
    let outcome = future.wait_timeout(Duration::from_secs(10));
    assert!(failed_with(&outcome, RemoteFailure::Timeout), "{outcome:?}");
}
