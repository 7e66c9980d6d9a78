//! The HTTP client's connections made cancellable: a transport layer between TCP and TLS
//! that waits for data in slices of [`cancel::POLL`], so that a request to a server that
//! stalls (after its headers, part-way through a body) notices that its work was
//! cancelled ([`crate::cancel`]) within a slice instead of when `http_timeout` runs out.
//!
//! ureq's own layers are kept, in its default order (a CONNECT proxy, TCP, rustls); only
//! this one is added. A slice that times out consumed nothing, so the wait simply goes
//! on until data comes, the request's own deadline passes or the work is cancelled.

use std::io;
use std::time::Instant;

use ureq::config::Config;
use ureq::unversioned::resolver::DefaultResolver;
use ureq::unversioned::transport::{
    time::Duration as UreqDuration, Buffers, ConnectProxyConnector, ConnectionDetails, Connector,
    NextTimeout, RustlsConnector, TcpConnector, Transport,
};
use ureq::{Agent, Error};

use crate::cancel;

/// An agent with `config` whose connections wait for data cancellably.
pub fn agent(config: Config) -> Agent {
    let connector =
        ().chain(ConnectProxyConnector::default())
            .chain(TcpConnector::default())
            .chain(Interruptible)
            .chain(RustlsConnector::default());
    Agent::with_parts(config, connector, DefaultResolver::default())
}

/// The error a transport gives when its work was cancelled; the client reports it as
/// [`crate::error::RemoteFailure::Cancelled`] (it asks [`cancel::cancelled`] first).
fn cancelled() -> Error {
    Error::Io(io::Error::other("the request was cancelled"))
}

/// The connector that wraps each new connection in [`Cancellable`].
#[derive(Debug)]
struct Interruptible;

impl<In: Transport> Connector<In> for Interruptible {
    type Out = Cancellable<In>;

    fn connect(
        &self,
        _details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, Error> {
        Ok(chained.map(|inner| Cancellable { inner }))
    }
}

/// A connection whose waits for data end when the current work is cancelled.
#[derive(Debug)]
struct Cancellable<T> {
    inner: T,
}

impl<T: Transport> Transport for Cancellable<T> {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), Error> {
        if cancel::cancelled() {
            return Err(cancelled());
        }
        self.inner.transmit_output(amount, timeout)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, Error> {
        let deadline = match timeout.after {
            UreqDuration::Exact(after) => Instant::now().checked_add(after),
            UreqDuration::NotHappening => None,
        };
        loop {
            if cancel::cancelled() {
                return Err(cancelled());
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let slice = left.map_or(cancel::POLL, |left| left.min(cancel::POLL));
            let last = left.is_some_and(|left| left <= cancel::POLL);
            let attempt = NextTimeout {
                after: UreqDuration::Exact(slice),
                ..timeout
            };
            match self.inner.await_input(attempt) {
                // A slice ran out with nothing read: wait on, unless the deadline has.
                Err(Error::Timeout(_)) if !last => continue,
                outcome => return outcome,
            }
        }
    }

    fn is_open(&mut self) -> bool {
        self.inner.is_open()
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::error::{Error, RemoteFailure};
    use crate::memory::{HostSpan, Span};
    use crate::request::{submit, Completion, Request};
    use crate::settings::Settings;
    use crate::source::remote::{open_url, EndpointType};
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
            matches!(
                outcome,
                Some(Err(Error::Remote {
                    kind: RemoteFailure::Cancelled,
                    ..
                }))
            ),
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
        assert!(
            matches!(
                outcome,
                Some(Err(Error::Remote {
                    kind: RemoteFailure::Timeout,
                    ..
                }))
            ),
            "{outcome:?}"
        );
    }
}
