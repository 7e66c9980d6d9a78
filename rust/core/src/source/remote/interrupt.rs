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
