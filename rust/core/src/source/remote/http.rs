//! The HTTP client of remote files (ureq, rustls): agents whose connections every
//! request shares (one per CA configuration, see [`super::tls`]), redirects followed by
//! kvikpy so that no credential reaches another host, kvikio's retry rule (the
//! `http_status_codes` answers and timeouts, up to `http_max_attempts` attempts, with
//! exponential backoff), the `http_timeout` limit, and the mapping of every failure to a
//! clear [`Error::Remote`].

use std::io::{ErrorKind, Read};
use std::sync::Arc;
use std::time::Duration;

use ureq::http::{Response, StatusCode};
use ureq::{Agent, Body};

use super::s3_sigv4::Credentials;
use super::url::{origin_text, resolve, same_origin};
use crate::cancel;
use crate::error::{Error, RemoteFailure, Result};
use crate::settings::Settings;

/// One HTTP request: method, URL (already encoded), headers, the credential they carry
/// and the agent that sends it.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// `"GET"` or `"HEAD"`.
    pub method: &'static str,
    /// The URL as sent (never with user info: see [`Auth::Basic`]).
    pub url: String,
    /// Extra headers (`Range`, S3's signature headers, `Authorization`).
    pub headers: Vec<(String, String)>,
    /// The credential the headers carry, which decides where a redirect may lead.
    pub auth: Auth,
    /// The agent (connections, trusted CAs) that sends it.
    pub agent: Agent,
}

/// The credential a request carries. A request with one is sent only to its URL's
/// origin (scheme, host, port): a redirect elsewhere is an error, never followed.
#[derive(Clone)]
pub enum Auth {
    /// None: redirects are followed wherever they lead.
    None,
    /// HTTP basic authentication from the URL's user info, in an `Authorization` header:
    /// redirects followed within the origin only.
    Basic,
    /// An AWS SigV4 signature (and session token) made with these credentials:
    /// redirects followed within the origin only, signed again for the new URL.
    Signed(Arc<Credentials>),
}

// The credentials stay out of debug output.
impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "None",
            Self::Basic => "Basic",
            Self::Signed(_) => "Signed",
        })
    }
}

/// The `Authorization` header value of HTTP basic authentication for `user` and
/// `password` (RFC 7617: base64 of `user:password`).
pub fn basic_authorization(user: &[u8], password: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut plain = Vec::with_capacity(user.len() + 1 + password.len());
    plain.extend_from_slice(user);
    plain.push(b':');
    plain.extend_from_slice(password);
    let mut out = String::from("Basic ");
    for chunk in plain.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The most redirects one request follows (curl's default is 50, browsers' about 20;
/// a chain longer than this is a loop or a misconfiguration).
pub const MAX_REDIRECTS: usize = 10;

/// The first wait between attempts; it doubles with each attempt (kvikio's backoff).
const BASE_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(4000);

/// The wait before attempt `attempt + 1` (attempts count from 1): 0.5 s, 1 s, 2 s, 4 s, 4 s...
pub fn backoff(attempt: usize) -> Duration {
    let doublings = attempt.saturating_sub(1).min(4) as u32;
    (BASE_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
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
            // The file changed since it was opened: final, whatever http_status_codes says.
            if status == 412 {
                if let Some(pinned) = if_match(&prepared) {
                    return Err(Failure::Final(changed(
                        &prepared,
                        pinned,
                        strong_etag(&response),
                    )));
                }
            }
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

/// Send one request, following its redirects (at most [`MAX_REDIRECTS`]) as
/// [`follow`] allows.
fn send(prepared: &Prepared, settings: &Settings) -> std::result::Result<Response<Body>, Failure> {
    let mut hop = std::borrow::Cow::Borrowed(prepared);
    for _ in 0..=MAX_REDIRECTS {
        let response = send_once(&hop, settings)?;
        if !response.status().is_redirection() {
            return Ok(response);
        }
        // A redirect without a location (304 Not Modified, 300 Multiple Choices) is
        // handed back as an answer.
        let Some(location) = header(&response, "location").map(str::to_string) else {
            return Ok(response);
        };
        let next = follow(&hop, response.status().as_u16(), &location);
        hop = std::borrow::Cow::Owned(next.map_err(|e| match (e, bucket_region(&response)) {
            (Error::Remote { kind, url, message }, Some(region)) => Failure::Final(Error::Remote {
                kind,
                url,
                message: format!("{message} (S3 says the bucket is in region {region})"),
            }),
            (e, _) => Failure::Final(e),
        })?);
    }
    Err(Failure::Final(Error::remote(
        RemoteFailure::Status,
        &prepared.url,
        format!(
            "{} {}: more than {MAX_REDIRECTS} redirects (the last to {}); the server \
             redirects in a loop, or the URL is out of date: open the final URL directly",
            prepared.method, prepared.url, hop.url
        ),
    )))
}

/// The request a redirect (`status` with `location`) of `prepared` leads to: the same
/// method and headers at the new URL where it stays within the origin (signed again for
/// the new URL where the request is signed), or anywhere for a request that carries no
/// credential. A request with a credential redirected to another origin is an error
/// naming both: the credential was made for one host only and is never sent to another.
pub fn follow(prepared: &Prepared, status: u16, location: &str) -> Result<Prepared> {
    let target = resolve(&prepared.url, location).map_err(|why| {
        Error::remote(
            RemoteFailure::Status,
            &prepared.url,
            format!(
                "{} {}: the server redirected ({status}) to '{location}', which cannot be \
                 followed: {why}",
                prepared.method, prepared.url
            ),
        )
    })?;
    // User info in a location came from the server, not from the user: never sent.
    let (target, _) = super::url::split_user_info(&target);
    let target = target.into_owned();
    let mut next = prepared.clone();
    if !same_origin(&prepared.url, &target) {
        let what = match &prepared.auth {
            Auth::None => {
                next.url = target;
                return Ok(next);
            }
            Auth::Basic => "the user name and password of its URL",
            Auth::Signed(_) => "an AWS signature (and session token, if any)",
        };
        let advice = match &prepared.auth {
            Auth::Signed(_) => {
                "the bucket is served from another endpoint or region than the one \
                 asked: set the bucket's region (AWS_DEFAULT_REGION or aws_region_name=; \
                 S3 names it in the x-amz-bucket-region header) or its endpoint \
                 (AWS_ENDPOINT_URL or aws_endpoint_url=), as the AWS SDKs, which do not \
                 follow such redirects either, require"
            }
            _ => "open the URL it leads to directly, with the credentials that host needs",
        };
        return Err(Error::remote(
            RemoteFailure::Forbidden,
            &prepared.url,
            format!(
                "{} {}: the server at {} redirected ({status}) to another host, {}; the \
                 request carries {what}, made for {} only, so kvikpy does not follow it \
                 (that would hand the credential to {}): {advice}",
                prepared.method,
                prepared.url,
                origin_text(&prepared.url),
                origin_text(&target),
                origin_text(&prepared.url),
                origin_text(&target),
            ),
        ));
    }
    if let Auth::Signed(credentials) = &prepared.auth {
        next.headers = super::s3::resign(credentials, prepared.method, &target, &prepared.headers)?;
    }
    next.url = target;
    Ok(next)
}

/// Send one request under the `http_timeout` limit, without following a redirect.
fn send_once(
    prepared: &Prepared,
    settings: &Settings,
) -> std::result::Result<Response<Body>, Failure> {
    let timeout = Some(Duration::from_secs(settings.http_timeout));
    let agent = &prepared.agent;
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
        e if is_certificate_error(&e) => Failure::Final(failed(
            RemoteFailure::Connection,
            format!(
                "the server's certificate cannot be verified ({e}): if a private CA issued \
                 it, name a PEM file of that CA with the http_ca_bundle setting \
                 (kvikpy.defaults.set('http_ca_bundle', path), KVIKPY_HTTP_CA_BUNDLE) or \
                 with CURL_CA_BUNDLE, SSL_CERT_FILE (AWS_CA_BUNDLE for S3); otherwise check \
                 the host name and the server's certificate chain"
            ),
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

/// The region S3 names in a redirect (`x-amz-bucket-region`), where it does.
fn bucket_region(response: &Response<Body>) -> Option<String> {
    header(response, "x-amz-bucket-region").map(str::to_string)
}

/// Whether `error` is a failed verification of the server's certificate (rustls'
/// "invalid peer certificate", wrapped in an I/O error or not).
fn is_certificate_error(error: &ureq::Error) -> bool {
    let text = error.to_string();
    text.contains("invalid peer certificate") || text.contains("InvalidCertificate")
}

/// The error for a response with a failing status: its kind follows the status (404:
/// not found, 401/403: forbidden, others: a status error), its message names the status
/// and, where the body is a short text (S3's and WebHDFS's error documents), quotes it.
fn status_error(prepared: &Prepared, response: Response<Body>) -> Error {
    let status = response.status();
    let region = bucket_region(&response);
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
    // S3 answers a request to the wrong region with 301 and the bucket's region, and no
    // Location to follow.
    let moved = match region {
        Some(region) if status.is_redirection() => format!(
            "the bucket is in region {region}, another region than the request's: set \
             AWS_DEFAULT_REGION={region} (or pass aws_region_name='{region}'), or the \
             bucket's endpoint (AWS_ENDPOINT_URL)"
        ),
        _ => "the server redirected without saying where (no Location header); open the \
              URL the file moved to"
            .to_string(),
    };
    let (kind, advice) = match status.as_u16() {
        300..=399 => (RemoteFailure::Status, moved.as_str()),
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

/// The request header that pins a ranged read to the version of the file it was opened
/// at (the `ETag` of the size request).
pub const IF_MATCH: &str = "If-Match";

/// The strong `ETag` of `response`, where it has one: the version of the file it answers
/// with. A weak one (`W/"..."`) is left out: `If-Match` compares strongly, so a server
/// would refuse every request pinned to it.
pub fn strong_etag(response: &Response<Body>) -> Option<&str> {
    strong(header(response, "etag")?)
}

/// `etag` trimmed, where it is a strong entity tag (`"..."`, not `W/"..."`).
fn strong(etag: &str) -> Option<&str> {
    let etag = etag.trim();
    (etag.len() >= 2 && etag.starts_with('"') && etag.ends_with('"')).then_some(etag)
}

/// The `If-Match` value `prepared` carries, where it is pinned to a version.
fn if_match(prepared: &Prepared) -> Option<&str> {
    prepared
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(IF_MATCH))
        .map(|(_, value)| value.as_str())
}

/// Whether the answer to `prepared` is of another version of the file than the one it is
/// pinned to: an error naming both `ETag`s where it is (a server that ignores `If-Match`
/// and sends the file's new version), else nothing.
pub fn check_version(prepared: &Prepared, response: &Response<Body>) -> Result<()> {
    match (if_match(prepared), strong_etag(response)) {
        (Some(pinned), Some(now)) if now != pinned => Err(changed(prepared, pinned, Some(now))),
        _ => Ok(()),
    }
}

/// The error of a read of a file that changed on the server since it was opened, at
/// version `pinned` (an `ETag`); `now` is its version now, where the server said.
pub fn changed(prepared: &Prepared, pinned: &str, now: Option<&str>) -> Error {
    let range = prepared
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("range"))
        .map(|(_, value)| format!(" ({value})"))
        .unwrap_or_default();
    let found = match now {
        Some(now) => format!("its ETag was {pinned} when it was opened and is {now} now"),
        None => format!(
            "the server answered 412 Precondition Failed to a request pinned to the \
             ETag it had when it was opened, {pinned}"
        ),
    };
    Error::remote(
        RemoteFailure::Changed,
        &prepared.url,
        format!(
            "{} {}{range}: the file changed on the server since it was opened ({found}); \
             the read stopped rather than mix bytes of two versions. Open the file again \
             and read it again to get its new version",
            prepared.method, prepared.url
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
    fn basic_authorization_is_base64() {
        assert_eq!(
            basic_authorization(b"Aladdin", b"open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(basic_authorization(b"a", b""), "Basic YTo=");
        assert_eq!(basic_authorization(b"ab", b"c"), "Basic YWI6Yw==");
    }

    fn prepared(url: &str, auth: Auth) -> Prepared {
        Prepared {
            method: "GET",
            url: url.into(),
            headers: vec![("Range".into(), "bytes=0-9".into())],
            auth,
            agent: super::super::tls::agent(&[]).unwrap(),
        }
    }

    fn credentials() -> Arc<Credentials> {
        Arc::new(Credentials {
            access_key: "AKIDEXAMPLE".into(),
            secret_key: "secret".into(),
            session_token: Some("TOKEN".into()),
            region: "us-east-1".into(),
            service: "s3",
        })
    }

    #[test]
    fn redirects_keep_credentials_on_their_origin() {
        // No credential: followed anywhere.
        let free = prepared("http://127.0.0.1:8/a", Auth::None);
        let next = follow(&free, 307, "http://localhost:9/b").unwrap();
        assert_eq!(next.url, "http://localhost:9/b");
        // A server's location never brings user info to send.
        let next = follow(&free, 302, "http://u:p@o/b").unwrap();
        assert_eq!(next.url, "http://o/b");
        // Basic: within the origin as is; elsewhere an error naming both hosts.
        let basic = prepared("http://127.0.0.1:8/a", Auth::Basic);
        assert_eq!(
            follow(&basic, 301, "/b").unwrap().url,
            "http://127.0.0.1:8/b"
        );
        let err = follow(&basic, 301, "http://127.0.0.1:9/b")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("http://127.0.0.1:8") && err.contains("http://127.0.0.1:9"),
            "{err}"
        );
        // Signed: re-signed within the origin, refused elsewhere.
        let mut signed = prepared("http://127.0.0.1:8/bucket/a", Auth::Signed(credentials()));
        signed.headers =
            super::super::s3::resign(&credentials(), "GET", &signed.url, &signed.headers).unwrap();
        let next = follow(&signed, 307, "/bucket/b").unwrap();
        let auth = |p: &Prepared| {
            p.headers
                .iter()
                .find(|(n, _)| n == "authorization")
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_ne!(auth(&next), auth(&signed));
        assert_eq!(
            next.headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
                .count(),
            1
        );
        assert!(next
            .headers
            .iter()
            .any(|(n, v)| n == "Range" && v == "bytes=0-9"));
        let err = follow(&signed, 307, "http://localhost:8/bucket/a")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("http://127.0.0.1:8")
                && err.contains("http://localhost:8")
                && err.contains("AWS_DEFAULT_REGION"),
            "{err}"
        );
        assert!(!err.contains("TOKEN") && !err.contains("secret"), "{err}");
        assert!(follow(&free, 302, "ftp://o/b").is_err());
    }

    #[test]
    fn backoff_doubles_up_to_four_seconds() {
        let waits: Vec<u64> = (1..=7).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 4000, 4000, 4000]);
    }
}
