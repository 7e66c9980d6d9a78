//! The HTTP client of remote files (ureq, rustls): one process-wide agent whose
//! connections every request shares, kvikio's retry rule (the `http_status_codes`
//! answers and timeouts, up to `http_max_attempts` attempts, with exponential backoff),
//! the `http_timeout` limit, and the mapping of every failure to a clear
//! [`Error::Remote`].

use std::io::{ErrorKind, Read};
use std::sync::OnceLock;
use std::time::Duration;

use ureq::http::{Response, StatusCode};
use ureq::{Agent, Body};

use crate::cancel;
use crate::error::{Error, RemoteFailure, Result};
use crate::settings::Settings;

/// One HTTP request: method, URL (already encoded) and headers.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// `"GET"` or `"HEAD"`.
    pub method: &'static str,
    /// The URL as sent.
    pub url: String,
    /// Extra headers (`Range`, S3's signature headers).
    pub headers: Vec<(String, String)>,
}

/// The first wait between attempts; it doubles with each attempt (kvikio's backoff).
const BASE_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(4000);

/// The wait before attempt `attempt + 1` (attempts count from 1): 0.5 s, 1 s, 2 s, 4 s, 4 s...
pub fn backoff(attempt: usize) -> Duration {
    let doublings = attempt.saturating_sub(1).min(4) as u32;
    (BASE_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

/// The agent shared by every remote file: idle connections are kept for reuse (up to
/// 64 per host, more than the I/O pool has threads), redirects followed, proxies taken
/// from the usual environment variables, and HTTP error statuses handed back as
/// responses so that the retry rule sees them.
fn agent() -> &'static Agent {
    static AGENT: OnceLock<Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        let config = Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(256)
            .max_idle_connections_per_host(64)
            .user_agent(concat!("kvikpy/", env!("CARGO_PKG_VERSION")))
            .build();
        // Connections that notice cancellation while they wait (see `interrupt`).
        super::interrupt::agent(config)
    })
}

/// How an attempt failed: worth another attempt (a status in `http_status_codes`, a
/// timeout) or final.
enum Failure {
    Retry { status: Option<u16> },
    Final(Error),
}

/// Run `attempt` until it succeeds, fails for good, or has been tried
/// `http_max_attempts` times; `attempt` gets the response of `request()` (rebuilt for
/// each attempt, so that a signature carries its own time). Cancelled work
/// ([`crate::cancel`]) stops before an attempt, during a backoff sleep or while waiting
/// for the server, with [`RemoteFailure::Cancelled`].
pub fn with_retries<T>(
    settings: &Settings,
    request: impl FnMut() -> Result<Prepared>,
    attempt: impl FnMut(&Prepared, Response<Body>) -> Result<T>,
) -> Result<T> {
    cancel::watched(|| retried(settings, request, attempt))
}

fn retried<T>(
    settings: &Settings,
    mut request: impl FnMut() -> Result<Prepared>,
    mut attempt: impl FnMut(&Prepared, Response<Body>) -> Result<T>,
) -> Result<T> {
    let max_attempts = settings.http_max_attempts.max(1);
    let mut last = None;
    for n in 1..=max_attempts {
        let prepared = request()?;
        if cancel::cancelled() {
            return Err(cancelled(&prepared));
        }
        let outcome = send(&prepared, settings).and_then(|response| {
            let status = response.status().as_u16();
            if settings.http_status_codes.contains(status) {
                return Err(Failure::Retry {
                    status: Some(status),
                });
            }
            if !response.status().is_success() {
                return Err(Failure::Final(status_error(&prepared, response)));
            }
            attempt(&prepared, response).map_err(|e| match e {
                Error::Remote {
                    kind: RemoteFailure::Timeout,
                    ..
                } => Failure::Retry { status: None },
                e => Failure::Final(e),
            })
        });
        match outcome {
            Ok(value) => return Ok(value),
            Err(Failure::Final(e)) => return Err(e),
            Err(Failure::Retry { status, .. }) => {
                if n < max_attempts && !cancel::sleep(backoff(n)) {
                    return Err(cancelled(&prepared));
                }
                last = Some((prepared, status));
            }
        }
    }
    let Some((prepared, status)) = last else {
        return Err(Error::InvalidArgument("http_max_attempts is 0".into()));
    };
    let (kind, what, advice) = match status {
        Some(status) => (
            RemoteFailure::Status,
            format!(
                "Got HTTP code {status} ({})",
                StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("unknown status")
            ),
            "the server is overloaded or failing; retry later, or raise the \
             http_max_attempts setting",
        ),
        None => (
            RemoteFailure::Timeout,
            "Operation timed out".to_string(),
            "the server or the network is too slow for the http_timeout setting; raise \
             it (kvikpy.defaults.set('http_timeout', seconds)) or retry later",
        ),
    };
    Err(Error::remote(
        kind,
        &prepared.url,
        format!(
            "{} {}: HTTP request reached maximum number of attempts ({max_attempts}, the \
             http_max_attempts setting). {what} on the last one; {advice}",
            prepared.method, prepared.url,
        ),
    ))
}

/// Send one request under the `http_timeout` limit.
fn send(prepared: &Prepared, settings: &Settings) -> std::result::Result<Response<Body>, Failure> {
    let timeout = Some(Duration::from_secs(settings.http_timeout));
    let agent = agent();
    let mut builder = match prepared.method {
        "HEAD" => agent.head(&prepared.url),
        _ => agent.get(&prepared.url),
    };
    for (name, value) in &prepared.headers {
        builder = builder.header(name, value);
    }
    builder
        .config()
        .timeout_global(timeout)
        .build()
        .call()
        .map_err(|e| classify(prepared, e))
}

/// The error of a request abandoned because its work was cancelled.
fn cancelled(prepared: &Prepared) -> Error {
    Error::remote(
        RemoteFailure::Cancelled,
        &prepared.url,
        format!(
            "{} {}: the request was cancelled (the call was interrupted, another request \
             of the same read failed, or the interpreter is exiting)",
            prepared.method, prepared.url
        ),
    )
}

/// The failure of a request that got no response.
fn classify(prepared: &Prepared, error: ureq::Error) -> Failure {
    if cancel::cancelled() {
        return Failure::Final(cancelled(prepared));
    }
    let url = &prepared.url;
    let failed =
        |kind, why: String| Error::remote(kind, url, format!("{} {url}: {why}", prepared.method));
    match error {
        ureq::Error::Timeout(_) => Failure::Retry { status: None },
        ureq::Error::Io(e) if e.kind() == ErrorKind::TimedOut => Failure::Retry { status: None },
        ureq::Error::Io(e) if e.kind() == ErrorKind::ConnectionRefused => Failure::Final(failed(
            RemoteFailure::Refused,
            format!(
                "connection refused ({e}): no server listens at that address; check \
                     the host and port, and that the server is running"
            ),
        )),
        ureq::Error::HostNotFound => Failure::Final(failed(
            RemoteFailure::Connection,
            "the host name could not be resolved; check the URL's host".into(),
        )),
        ureq::Error::BadUri(why) | ureq::Error::RequireHttpsOnly(why) => Failure::Final(failed(
            RemoteFailure::InvalidUrl,
            format!("the URL cannot be requested: {why}"),
        )),
        ureq::Error::Http(e) => Failure::Final(failed(
            RemoteFailure::InvalidUrl,
            format!("the request cannot be built: {e}"),
        )),
        e @ (ureq::Error::Io(_)
        | ureq::Error::ConnectionFailed
        | ureq::Error::Tls(_)
        | ureq::Error::Rustls(_)
        | ureq::Error::Protocol(_)) => Failure::Final(failed(
            RemoteFailure::Connection,
            format!("the connection failed: {e}"),
        )),
        e => Failure::Final(failed(
            RemoteFailure::Connection,
            format!("the request failed: {e}"),
        )),
    }
}

/// The error for a response with a failing status: its kind follows the status (404:
/// not found, 401/403: forbidden, others: a status error), its message names the status
/// and, where the body is a short text (S3's and WebHDFS's error documents), quotes it.
fn status_error(prepared: &Prepared, response: Response<Body>) -> Error {
    let status = response.status();
    let mut body = String::new();
    let _ = response
        .into_body()
        .into_reader()
        .take(2048)
        .read_to_string(&mut body);
    let detail = body.split_whitespace().collect::<Vec<_>>().join(" ");
    let detail = if detail.is_empty() || detail.len() > 600 {
        String::new()
    } else {
        format!(" (the server said: {detail})")
    };
    let (kind, advice) = match status.as_u16() {
        404 | 410 => (
            RemoteFailure::NotFound,
            "check the URL (bucket and object names)",
        ),
        401 | 403 => (
            RemoteFailure::Forbidden,
            "check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, \
             AWS_SESSION_TOKEN, AWS_DEFAULT_REGION for S3) and that they may read this \
             object, or that a presigned URL has not expired",
        ),
        416 => (
            RemoteFailure::Body,
            "the range lies outside the file on the server: the file changed size since \
             it was opened, or nbytes= was larger than the file",
        ),
        _ => (
            RemoteFailure::Status,
            "the server failed the request; if the failure is temporary, add the status \
             to the http_status_codes setting so that it is retried",
        ),
    };
    Error::remote(
        kind,
        &prepared.url,
        format!(
            "{} {}: the requested URL returned error: {} {}{detail}; {advice}",
            prepared.method,
            prepared.url,
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
        ),
    )
}

/// The `Content-Length` of `response`, where it has one.
pub fn content_length(response: &Response<Body>) -> Option<u64> {
    header(response, "content-length")?.trim().parse().ok()
}

/// The value of header `name` of `response`, where it is present and text.
pub fn header<'r>(response: &'r Response<Body>, name: &str) -> Option<&'r str> {
    response.headers().get(name)?.to_str().ok()
}

/// Whether `response` answers a range request with the range (206).
pub fn is_partial(response: &Response<Body>) -> bool {
    response.status() == StatusCode::PARTIAL_CONTENT
}

/// Read `response`'s body into `dst`, which it must fill exactly: fewer bytes (the
/// connection closed early) or more (the server sent another range) is an error. A
/// timeout while reading is [`RemoteFailure::Timeout`], so that it is retried.
pub fn read_body(prepared: &Prepared, response: Response<Body>, dst: &mut [u8]) -> Result<()> {
    let expected = dst.len();
    let promised = content_length(&response);
    if let Some(promised) = promised.filter(|&n| n != expected as u64) {
        return Err(Error::remote(
            RemoteFailure::Body,
            &prepared.url,
            format!(
                "{} {}: the server announced {promised} bytes for a request of {expected}; \
                 the file changed on the server, or the server answered another range",
                prepared.method, prepared.url
            ),
        ));
    }
    let mut reader = response.into_body().into_reader();
    let mut got = 0;
    while got < expected {
        if cancel::cancelled() {
            return Err(cancelled(prepared));
        }
        match reader.read(&mut dst[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(body_error(prepared, e, got, expected)),
        }
    }
    if got < expected {
        return Err(short_body(prepared, got, expected));
    }
    if promised.is_none() {
        // Without a length to trust, a body longer than asked shows only here.
        let mut extra = [0u8; 1];
        if matches!(reader.read(&mut extra), Ok(n) if n > 0) {
            return Err(Error::remote(
                RemoteFailure::Body,
                &prepared.url,
                format!(
                    "{} {}: the server sent more than the {expected} bytes asked for; it \
                     does not answer range requests correctly",
                    prepared.method, prepared.url
                ),
            ));
        }
    }
    Ok(())
}

fn short_body(prepared: &Prepared, got: usize, expected: usize) -> Error {
    Error::remote(
        RemoteFailure::Body,
        &prepared.url,
        format!(
            "{} {}: the body ended after {got} of the {expected} bytes expected (a body \
             shorter than promised): the connection was cut or the file shrank on the server",
            prepared.method, prepared.url
        ),
    )
}

fn body_error(prepared: &Prepared, e: std::io::Error, got: usize, expected: usize) -> Error {
    if cancel::cancelled() {
        return cancelled(prepared);
    }
    let timed_out = e.kind() == ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|inner| inner.downcast_ref::<ureq::Error>())
            .is_some_and(|u| matches!(u, ureq::Error::Timeout(_)));
    if timed_out {
        return Error::remote(
            RemoteFailure::Timeout,
            &prepared.url,
            format!(
                "{} {}: timed out after {got} of {expected} bytes (the http_timeout setting)",
                prepared.method, prepared.url
            ),
        );
    }
    if matches!(e.kind(), ErrorKind::UnexpectedEof) {
        return short_body(prepared, got, expected);
    }
    Error::remote(
        RemoteFailure::Connection,
        &prepared.url,
        format!(
            "{} {}: the connection broke after {got} of the {expected} bytes of the body \
             ({e}); retry, and check the server and the network",
            prepared.method, prepared.url
        ),
    )
}

/// Read a small body (a JSON status document) as text, at most `limit` bytes.
pub fn read_text(response: Response<Body>, limit: u64) -> std::io::Result<String> {
    let mut text = String::new();
    response
        .into_body()
        .into_reader()
        .take(limit)
        .read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_four_seconds() {
        let waits: Vec<u64> = (1..=7).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 4000, 4000, 4000]);
    }
}
