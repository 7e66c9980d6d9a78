//! Remote files as a source: HTTP(S), S3 (signed, public, presigned) and WebHDFS, read
//! with HTTP range requests that the engine's request path runs in parallel on its pool
//! like any other source's reads (device reads through the bounce ring, a range per
//! task up to a bounce buffer, never a whole-file host copy).
//!
//! kvikio's `RemoteHandle` semantics: an endpoint type per URL form
//! ([`EndpointType`], inferred from the URL or asked for, checked against an allow
//! list), the size asked of the server once at open (or given), read-only. A server that
//! ignores a range request is an error ([`RemoteFailure::NoRange`]) except for a read of
//! the whole file, where its whole-file answer is exactly what was asked.

mod http;
mod interrupt;
mod s3;
mod s3_sigv4;
pub(crate) mod tls;
pub(crate) mod url;
mod webhdfs;

/// For tests: a variable lookup (`getenv`) answering from `pairs` instead of the process's
/// environment.
#[cfg(test)]
pub(crate) fn test_env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::http::{with_retries, Auth, Prepared};
use self::s3::S3Object;
pub use self::s3::S3Options;
use self::webhdfs::{length_from_status, WebHdfsFile};
use super::{Source, Target};
use crate::error::{Error, RemoteFailure, Result};
use crate::settings::Settings;
use crate::span::HostSpan;
use crate::vocab::OpenFlags;

/// kvikio's `RemoteEndpointType`, with its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EndpointType {
    /// Infer the type from the URL.
    Auto = 0,
    /// S3 with credentials (signed requests).
    S3 = 1,
    /// S3 object readable by anyone (unsigned requests).
    S3Public = 2,
    /// S3 presigned URL (the signature is in the query).
    S3PresignedUrl = 3,
    /// Hadoop's WebHDFS.
    WebHdfs = 4,
    /// Any HTTP(S) server with range support.
    Http = 5,
}

impl EndpointType {
    /// kvikio's default allow list, in the order `Auto` tries the types.
    pub(crate) const DEFAULT_ALLOW_LIST: [EndpointType; 5] = [
        Self::S3,
        Self::S3Public,
        Self::S3PresignedUrl,
        Self::WebHdfs,
        Self::Http,
    ];

    /// The type with kvikio's value `value`.
    pub fn from_value(value: u8) -> Option<Self> {
        [Self::Auto]
            .into_iter()
            .chain(Self::DEFAULT_ALLOW_LIST)
            .find(|t| *t as u8 == value)
    }

    /// kvikio's name for messages (`"S3 public"`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Auto => "AUTO",
            Self::S3 => "S3",
            Self::S3Public => "S3 public",
            Self::S3PresignedUrl => "S3 with presigned URL",
            Self::WebHdfs => "WebHDFS",
            Self::Http => "HTTP",
        }
    }
}

/// Where a remote file's bytes are asked for, and how.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// A plain HTTP(S) URL.
    Http(Plain),
    /// A public S3 object's HTTP(S) URL.
    S3Public(Plain),
    /// An S3 presigned URL.
    S3Presigned(Plain),
    /// A signed S3 object.
    S3(S3Object),
    /// A WebHDFS file, and the basic authorization of its URL's user info.
    WebHdfs(WebHdfsFile, Option<Basic>),
}

/// An `Authorization: Basic ...` header value, made from a URL's user info; its debug
/// output hides it.
#[derive(Clone)]
pub struct Basic(String);

impl std::fmt::Debug for Basic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Basic(***)")
    }
}

/// A URL requested as it is: kvikpy's form of it (encoded, without user info) and the
/// basic authorization its user info gives, where it had one.
#[derive(Debug, Clone)]
pub struct Plain {
    url: String,
    basic: Option<Basic>,
}

/// `url` without its user info, and the basic authorization the user info gives (HTTP
/// basic authentication, as curl takes `http://user:password@host/`).
fn without_user_info(url: &str) -> (String, Option<Basic>) {
    let (stripped, info) = url::split_user_info(url);
    let basic = info.map(|(user, password)| Basic(http::basic_authorization(&user, &password)));
    (stripped.into_owned(), basic)
}

impl Plain {
    /// `url` (user info taken out), encoded by `encode`.
    fn new(url: &str, encode: impl FnOnce(&str) -> Result<String>) -> Result<Self> {
        let (stripped, basic) = without_user_info(url);
        Ok(Self {
            url: encode(&stripped)?,
            basic,
        })
    }
}
fn invalid(url: &str, message: String) -> Error {
    Error::remote(RemoteFailure::InvalidUrl, url, message)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `url` percent-encoded for sending (see [`url::normalise`]).
fn normalised(url: &str) -> Result<String> {
    url::normalise(url).map_err(|why| invalid(url, why))
}

impl Endpoint {
    /// A plain HTTP(S) endpoint. User info in the URL (`http://user:password@host/`) is
    /// sent as HTTP basic authentication, to that origin only.
    pub fn http(url: &str) -> Result<Self> {
        Ok(Self::Http(Plain::new(url, normalised)?))
    }

    /// A public S3 object, by its HTTP(S) URL or `s3://bucket/key` (then at the URL
    /// [`S3Options::object_url`] gives, from `AWS_ENDPOINT_URL` or `AWS_DEFAULT_REGION`).
    pub fn s3_public(url: &str) -> Result<Self> {
        if url
            .get(..5)
            .is_some_and(|s| s.eq_ignore_ascii_case("s3://"))
        {
            let (bucket, key) = url::parse_s3_url(url).map_err(|why| invalid(url, why))?;
            let http = S3Options::default().object_url(&bucket, &key, &env)?;
            return Ok(Self::S3Public(Plain::new(&http, normalised)?));
        }
        Ok(Self::S3Public(Plain::new(url, normalised)?))
    }

    /// An S3 presigned URL, sent as given (its signature covers its exact text).
    pub fn s3_presigned(url: &str) -> Result<Self> {
        url::Url::parse(url).map_err(|why| invalid(url, why))?;
        Ok(Self::S3Presigned(Plain::new(url, |u| Ok(u.to_string()))?))
    }

    /// A signed S3 object by its HTTP(S) URL.
    pub fn s3_http(url: &str, options: &S3Options) -> Result<Self> {
        Ok(Self::S3(S3Object::from_http_url(url, options, &env)?))
    }

    /// A signed S3 object by `s3://bucket/key`.
    pub fn s3_url(url: &str, options: &S3Options) -> Result<Self> {
        Ok(Self::S3(S3Object::from_s3_url(url, options, &env)?))
    }

    /// A signed S3 object by bucket and object names.
    pub fn s3_bucket(bucket: &str, object: &str, options: &S3Options) -> Result<Self> {
        Ok(Self::S3(S3Object::from_bucket(
            bucket, object, options, &env,
        )?))
    }

    /// A WebHDFS file.
    pub fn webhdfs(url: &str) -> Result<Self> {
        let (stripped, basic) = without_user_info(url);
        Ok(Self::WebHdfs(WebHdfsFile::new(&stripped, &env)?, basic))
    }

    /// The endpoint's type.
    pub(crate) fn kind(&self) -> EndpointType {
        match self {
            Self::Http(_) => EndpointType::Http,
            Self::S3Public(_) => EndpointType::S3Public,
            Self::S3Presigned(_) => EndpointType::S3PresignedUrl,
            Self::S3(_) => EndpointType::S3,
            Self::WebHdfs(..) => EndpointType::WebHdfs,
        }
    }

    /// The file's URL (for `str()` and messages), without user info.
    pub fn url(&self) -> &str {
        match self {
            Self::Http(plain) | Self::S3Public(plain) | Self::S3Presigned(plain) => &plain.url,
            Self::S3(object) => &object.url,
            Self::WebHdfs(file, _) => &file.url,
        }
    }

    /// The agent (connections, trusted CAs) of this endpoint's requests under
    /// `settings` (see [`tls`]).
    pub(crate) fn agent(&self, settings: &Settings) -> Result<ureq::Agent> {
        let s3 = matches!(self, Self::S3(_) | Self::S3Public(_) | Self::S3Presigned(_));
        tls::agent_for(self.url(), s3, settings.http_ca_bundle)
    }

    /// Whether ranges travel in a `Range` header (answered with 206), rather than in the
    /// URL (WebHDFS, answered with 200).
    fn uses_range_header(&self) -> bool {
        !matches!(self, Self::WebHdfs(..))
    }

    /// A request of `method` for `url` with `headers`, sent by `agent`, carrying the
    /// endpoint's credential (its basic authorization or signature).
    fn request(
        &self,
        method: &'static str,
        url: &str,
        mut headers: Vec<(String, String)>,
        agent: &ureq::Agent,
    ) -> Result<Prepared> {
        let auth = match self {
            Self::Http(Plain { basic, .. })
            | Self::S3Public(Plain { basic, .. })
            | Self::S3Presigned(Plain { basic, .. })
            | Self::WebHdfs(_, basic) => match basic {
                Some(Basic(value)) => {
                    headers.push(("Authorization".into(), value.clone()));
                    Auth::Basic
                }
                None => Auth::None,
            },
            Self::S3(object) => {
                let extra: Vec<(&str, String)> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.clone()))
                    .collect();
                headers = object.signed_headers(method, &extra)?;
                Auth::Signed(object.credentials())
            }
        };
        Ok(Prepared {
            method,
            url: url.to_string(),
            headers,
            auth,
            agent: agent.clone(),
        })
    }

    /// The request for `len` (> 0) bytes at `offset`, pinned to version `etag` (sent as
    /// `If-Match`) where the file has one.
    fn range_request(
        &self,
        offset: u64,
        len: usize,
        etag: Option<&str>,
        agent: &ureq::Agent,
    ) -> Result<Prepared> {
        if let Self::WebHdfs(file, _) = self {
            return self.request("GET", &file.open_url(offset, len), Vec::new(), agent);
        }
        let range = format!("bytes={offset}-{}", offset + len as u64 - 1);
        let mut headers = vec![("Range".to_string(), range)];
        if let Some(etag) = etag {
            headers.push((http::IF_MATCH.to_string(), etag.to_string()));
        }
        self.request("GET", self.url(), headers, agent)
    }

    /// Ask the server for the file's size, with `agent`; and its version, the strong
    /// `ETag` of the answer, where it gives one (never for WebHDFS).
    pub fn size(&self, agent: &ureq::Agent, settings: &Settings) -> Result<(u64, Option<String>)> {
        let etag = |response: &ureq::http::Response<ureq::Body>| {
            http::strong_etag(response).map(str::to_string)
        };
        match self {
            Self::Http(_) | Self::S3Public(_) | Self::S3(_) => with_retries(
                settings,
                || self.request("HEAD", self.url(), Vec::new(), agent),
                |prepared, response| {
                    let nbytes = length_of(prepared, http::content_length(&response))?;
                    Ok((nbytes, etag(&response)))
                },
            ),
            // S3 refuses HEAD on a URL presigned for GET: ask for its first byte, and
            // read the size from Content-Range.
            Self::S3Presigned(Plain { url, .. }) => with_retries(
                settings,
                || {
                    self.request(
                        "GET",
                        url,
                        vec![("Range".into(), "bytes=0-0".into())],
                        agent,
                    )
                },
                |prepared, response| {
                    let version = etag(&response);
                    if !http::is_partial(&response) {
                        return Ok((
                            length_of(prepared, http::content_length(&response))?,
                            version,
                        ));
                    }
                    let total = http::header(&response, "content-range")
                        .and_then(|r| r.rsplit('/').next())
                        .and_then(|total| total.trim().parse().ok());
                    let total = total.ok_or_else(|| {
                        Error::remote(
                            RemoteFailure::Body,
                            url,
                            format!(
                                "cannot get size of {url}: File size information missing on \
                                 the server side (no size in Content-Range); pass nbytes="
                            ),
                        )
                    })?;
                    Ok((total, version))
                },
            ),
            Self::WebHdfs(file, _) => with_retries(
                settings,
                || self.request("GET", &file.status_url(), Vec::new(), agent),
                |prepared, response| {
                    let text = http::read_text(response, 1 << 20).unwrap_or_default();
                    let length = length_from_status(&text).ok_or_else(|| {
                        Error::remote(
                            RemoteFailure::Body,
                            &prepared.url,
                            format!(
                                "cannot get size of {}: the GETFILESTATUS answer has no \
                                 \"length\" ({text:.200}); pass nbytes= (kvikio's words: \
                                 Regular expression search failed. Cannot extract file \
                                 length from the JSON response.)",
                                file.url
                            ),
                        )
                    })?;
                    Ok((length, None))
                },
            ),
        }
    }
}

fn length_of(prepared: &Prepared, length: Option<u64>) -> Result<u64> {
    length.ok_or_else(|| {
        Error::remote(
            RemoteFailure::Body,
            &prepared.url,
            format!(
                "cannot get size of {}, content-length not provided by the server; pass \
                 nbytes= with the file's size",
                prepared.url
            ),
        )
    })
}

/// An open remote file: its endpoint and size (fixed at open, as in kvikio), and the
/// version (`ETag`) the server gave with the size, to which every read is pinned.
#[derive(Debug)]
pub struct RemoteSource {
    endpoint: Endpoint,
    nbytes: u64,
    etag: Option<String>,
    path: PathBuf,
    agent: ureq::Agent,
}

impl RemoteSource {
    /// Open `endpoint`, asking the server for the size unless `nbytes` gives it.
    /// The CA configuration (see [`tls`]) is taken now, and kept for the file's life.
    /// Where the size answer carries a strong `ETag`, every read of the file asks for
    /// that version only (`If-Match`): a file replaced on the server since is an error
    /// ([`RemoteFailure::Changed`]), never a mix of two versions.
    pub fn open(endpoint: Endpoint, nbytes: Option<u64>, settings: &Settings) -> Result<Self> {
        let agent = endpoint.agent(settings)?;
        let (nbytes, etag) = match nbytes {
            Some(n) => (n, None),
            None => endpoint.size(&agent, settings)?,
        };
        Ok(Self {
            path: PathBuf::from(endpoint.url()),
            endpoint,
            nbytes,
            etag,
            agent,
        })
    }

    /// The version (`ETag`) of the file that reads are pinned to, where the server gave one.
    pub fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    /// The endpoint's type.
    pub fn endpoint_type(&self) -> EndpointType {
        self.endpoint.kind()
    }

    /// The file's URL.
    pub fn url(&self) -> &str {
        self.endpoint.url()
    }

    /// The size in bytes.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Fill `dst` with the bytes at `offset` (inside the file), with one range request
    /// (retried as the settings say).
    fn fetch(&self, dst: &mut [u8], offset: u64, settings: &Settings) -> Result<()> {
        let len = dst.len();
        let whole = offset == 0 && len as u64 == self.nbytes;
        with_retries(
            settings,
            || {
                self.endpoint
                    .range_request(offset, len, self.etag.as_deref(), &self.agent)
            },
            |prepared, response| {
                http::check_version(prepared, &response)?;
                if self.endpoint.uses_range_header() {
                    if http::is_partial(&response) {
                        check_content_range(prepared, &response, offset)?;
                    } else if !whole {
                        return Err(no_range(prepared, offset, len, self.nbytes));
                    }
                }
                http::read_body(prepared, response, dst)
            },
        )
    }
}

/// A 206 answer must start where asked.
fn check_content_range(
    prepared: &Prepared,
    response: &ureq::http::Response<ureq::Body>,
    offset: u64,
) -> Result<()> {
    let start = http::header(response, "content-range")
        .and_then(|r| r.trim().strip_prefix("bytes"))
        .and_then(|r| r.trim().split('-').next())
        .and_then(|s| s.trim().parse::<u64>().ok());
    match start {
        Some(start) if start != offset => Err(Error::remote(
            RemoteFailure::Body,
            &prepared.url,
            format!(
                "{} {}: asked for bytes from {offset}, the server answered bytes from {start}",
                prepared.method, prepared.url
            ),
        )),
        _ => Ok(()),
    }
}

fn no_range(prepared: &Prepared, offset: u64, len: usize, nbytes: u64) -> Error {
    Error::remote(
        RemoteFailure::NoRange,
        &prepared.url,
        format!(
            "{} {}: asked for {len} bytes at offset {offset} of {nbytes} with a range request, \
             but the server answered with the whole file (HTTP 200): maybe the server doesn't \
             support file ranges? kvikpy reads remote files with range requests, in \
             parallel, and only a small file read whole in one request can do without \
             them; serve the file from a server that supports range requests (nginx, \
             Apache, S3 and most others do)",
            prepared.method, prepared.url
        ),
    )
}

impl Source for RemoteSource {
    fn name(&self) -> &'static str {
        "remote"
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn flags(&self) -> OpenFlags {
        OpenFlags::READ_ONLY
    }

    fn size(&self) -> Result<u64> {
        Ok(self.nbytes)
    }

    fn read_host(&self, span: HostSpan, offset: u64, settings: &Settings) -> Result<usize> {
        let len = (span.len() as u64).min(self.nbytes.saturating_sub(offset)) as usize;
        if len == 0 {
            return Ok(0);
        }
        // SAFETY: the span's creator guarantees (HostSpan::new) that its memory is valid
        // and writable for the whole operation and touched by no one else meanwhile, and
        // `len` is at most its length. Its bytes may be uninitialised (a pinned bounce
        // buffer); they are only written here, never read.
        let dst = unsafe { std::slice::from_raw_parts_mut(span.as_ptr(), len) };
        self.fetch(dst, offset, settings)?;
        Ok(len)
    }

    fn write_host(&self, _span: HostSpan, _offset: u64, _settings: &Settings) -> Result<usize> {
        Err(read_only(self.url()))
    }

    /// A whole task per request (up to a bounce buffer): measured on the H100 against a
    /// loopback server, one thread reading 4 MiB tasks in 1 MiB requests reached 0.59x
    /// kvikio's rate, which asks for each task in one request.
    fn min_device_chunk(&self) -> usize {
        usize::MAX
    }

    fn may_stall(&self) -> bool {
        true
    }

    fn version(&self) -> Option<&str> {
        self.etag()
    }
}

fn read_only(url: &str) -> Error {
    Error::UnsupportedOperation(format!(
        "'{}' is a remote file, which kvikpy reads only; open it with mode 'r'",
        url::redact(url)
    ))
}

/// The endpoint of type `kind` for `url`: `None` where the URL does not have that type's
/// form, else the endpoint or why it cannot be made (missing credentials...).
fn endpoint_for(url: &str, scheme: &str, kind: EndpointType) -> Option<Result<Endpoint>> {
    let fits = match kind {
        EndpointType::S3 | EndpointType::S3Public => url::is_s3(url),
        EndpointType::S3PresignedUrl => url::is_s3_presigned(url),
        EndpointType::WebHdfs => url::is_webhdfs(url),
        EndpointType::Http => url::is_http(url),
        EndpointType::Auto => false,
    };
    if !fits {
        return None;
    }
    Some(match kind {
        EndpointType::S3 if scheme == "s3" => Endpoint::s3_url(url, &S3Options::default()),
        EndpointType::S3 => Endpoint::s3_http(url, &S3Options::default()),
        EndpointType::S3Public => Endpoint::s3_public(url),
        EndpointType::S3PresignedUrl => Endpoint::s3_presigned(url),
        EndpointType::WebHdfs => Endpoint::webhdfs(url),
        _ => Endpoint::http(url),
    })
}

fn scheme_of(url: &str) -> Result<String> {
    url::Url::parse(url)
        .map(|u| u.scheme)
        .map_err(|why| invalid(url, format!("Missing scheme in URL: {why}")))
}

fn unsupported(url: &str, allow: &[EndpointType]) -> Error {
    let names: Vec<&str> = allow.iter().map(|t| t.label()).collect();
    invalid(
        url,
        format!(
            "Unsupported endpoint URL: '{url}' has none of the forms of the endpoint types \
             allowed ({}): http(s)://<host>/<path>, s3://<bucket>/<key>, \
             https://<bucket>.s3.<region>.amazonaws.com/<key> (presigned with \
             X-Amz-Algorithm and X-Amz-Signature), http://<host>:<port>/webhdfs/v1/<path>",
            names.join(", ")
        ),
    )
}

/// The endpoint type `RemoteFile.open(url)` would pick (kvikio's
/// `infer_remote_endpoint_type`: the default allow list, no request sent).
pub fn infer_endpoint_type(url: &str) -> Result<EndpointType> {
    let scheme = scheme_of(url)?;
    for kind in EndpointType::DEFAULT_ALLOW_LIST {
        match endpoint_for(url, &scheme, kind) {
            None => continue,
            // S3 without credentials: AUTO falls back on S3 public.
            Some(Err(_)) if kind == EndpointType::S3 => return Ok(EndpointType::S3Public),
            Some(Err(e)) => return Err(e),
            Some(Ok(_)) => return Ok(kind),
        }
    }
    Err(unsupported(url, &EndpointType::DEFAULT_ALLOW_LIST))
}

/// Open `url` as kvikio's `RemoteHandle::open` does: of type `kind`, or with `Auto` the
/// first type of `allow` (default [`EndpointType::DEFAULT_ALLOW_LIST`]) whose form the
/// URL has. With `Auto`, an S3 URL is tried with credentials first (asking its size),
/// then, if that fails and S3 public is allowed, without.
pub fn open_url(
    url: &str,
    kind: EndpointType,
    allow: Option<&[EndpointType]>,
    nbytes: Option<u64>,
    settings: &Settings,
) -> Result<RemoteSource> {
    let allow = allow.unwrap_or(&EndpointType::DEFAULT_ALLOW_LIST);
    if kind != EndpointType::Auto {
        if !allow.contains(&kind) {
            let names: Vec<&str> = allow.iter().map(|t| t.label()).collect();
            return Err(invalid(
                url,
                format!(
                    "{} is not in the allowlist ({}): add it to allow_list, or pass \
                     another remote_endpoint_type",
                    kind.label(),
                    names.join(", ")
                ),
            ));
        }
        let scheme = scheme_of(url)?;
        let endpoint = endpoint_for(url, &scheme, kind).ok_or_else(|| {
            invalid(
                url,
                format!(
                    "Invalid URL for {} endpoint: '{url}' does not have its form; pass \
                     remote_endpoint_type=RemoteEndpointType.AUTO to infer the type",
                    kind.label()
                ),
            )
        })??;
        return RemoteSource::open(endpoint, nbytes, settings);
    }
    let scheme = scheme_of(url)?;
    for &candidate in allow {
        let Some(endpoint) = endpoint_for(url, &scheme, candidate) else {
            continue;
        };
        if candidate != EndpointType::S3 {
            return RemoteSource::open(endpoint?, nbytes, settings);
        }
        // Signed S3: check that the credentials reach the object (kvikio probes its
        // size, and keeps it); fall back on public access where allowed. A size given
        // skips the probe.
        let signed = endpoint.and_then(|e| RemoteSource::open(e, nbytes, settings));
        return match signed {
            Ok(source) => Ok(source),
            Err(_) if allow.contains(&EndpointType::S3Public) => {
                RemoteSource::open(Endpoint::s3_public(url)?, nbytes, settings)
            }
            Err(e) => Err(e),
        };
    }
    Err(unsupported(url, allow))
}

/// The URL schemes remote files have, the one list of them (Python asks the engine for it).
pub const URL_SCHEMES: [&str; 4] = ["http", "https", "s3", "webhdfs"];

/// Whether `path` is a URL of a scheme remote files have (`http`, `https`, `s3`,
/// `webhdfs`), which the opener below takes instead of a local path.
pub(crate) fn as_url(path: &Path) -> Option<&str> {
    let text = path.to_str()?;
    let (scheme, _) = text.split_once("://")?;
    URL_SCHEMES
        .iter()
        .any(|s| s.eq_ignore_ascii_case(scheme))
        .then_some(text)
}

/// The opener of [`super::OPENERS`]: takes URLs (see [`as_url`]), read-only, with the
/// endpoint type inferred.
pub(crate) fn open(target: &Target<'_>) -> Option<Result<Arc<dyn Source>>> {
    let url = as_url(target.path)?;
    if target.flags.writable {
        return Some(Err(read_only(url)));
    }
    Some((|| {
        let settings = crate::settings::current()?;
        let source = open_url(url, EndpointType::Auto, None, None, &settings)?;
        target.note(format!(
            "'{}' is a URL: read over {}",
            source.url(),
            source.endpoint_type().label()
        ));
        Ok(Arc::new(source) as Arc<dyn Source>)
    })())
}

/// Open `url` with the endpoint type inferred, under `settings`; with its size where it is
/// known already (a batch element), without asking the server, and then its reads pinned
/// to `version`, the one it was sized at (its `ETag`), where it had one.
pub(crate) fn open_sized(
    url: &str,
    nbytes: Option<u64>,
    version: Option<&str>,
    settings: &Settings,
) -> Result<Arc<dyn Source>> {
    let mut source = open_url(url, EndpointType::Auto, None, nbytes, settings)?;
    if nbytes.is_some() {
        source.etag = version.map(str::to_string);
    }
    Ok(Arc::new(source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_types_round_trip_kvikio_values() {
        for value in 0..=5u8 {
            assert_eq!(EndpointType::from_value(value).unwrap() as u8, value);
        }
        assert!(EndpointType::from_value(6).is_none());
    }

    #[test]
    fn inference_follows_kvikio() {
        let cases = [
            ("https://example.com/a.bin", EndpointType::Http),
            ("http://127.0.0.1:8000/bucket/key", EndpointType::Http),
            ("http://nn:9870/webhdfs/v1/home/f", EndpointType::WebHdfs),
            (
                "https://b.s3.us-east-1.amazonaws.com/k?X-Amz-Algorithm=A&X-Amz-Signature=S",
                EndpointType::S3PresignedUrl,
            ),
        ];
        for (url, kind) in cases {
            assert_eq!(infer_endpoint_type(url).unwrap(), kind, "{url}");
        }
        let s3 = infer_endpoint_type("s3://bucket/key").unwrap();
        assert!(
            matches!(s3, EndpointType::S3 | EndpointType::S3Public),
            "{s3:?}"
        );
        for bad in ["s3://bucket", "unsupported://b/o", "ftp://h/f"] {
            let err = infer_endpoint_type(bad).unwrap_err();
            assert!(
                err.to_string().contains("Unsupported endpoint URL"),
                "{bad}: {err}"
            );
        }
        let err = infer_endpoint_type("://b/o").unwrap_err();
        assert!(err.to_string().contains("Bad scheme"), "{err}");
    }

    #[test]
    fn explicit_types_check_the_allow_list_and_form() {
        let settings = Settings::default();
        let err = open_url(
            "http://127.0.0.1:1/b/o",
            EndpointType::S3,
            Some(&[EndpointType::WebHdfs]),
            Some(1),
            &settings,
        )
        .unwrap_err();
        assert!(err.to_string().contains("not in the allowlist"), "{err}");
        let err = open_url("s3://bucket", EndpointType::S3, None, Some(1), &settings).unwrap_err();
        assert!(err.to_string().contains("Invalid URL"), "{err}");
        let source = open_url(
            "http://127.0.0.1:1/a",
            EndpointType::Http,
            None,
            Some(10),
            &settings,
        )
        .unwrap();
        assert_eq!(
            (source.nbytes(), source.endpoint_type()),
            (10, EndpointType::Http)
        );
        assert!(source
            .write_host(HostSpan::from_slice(&mut []), 0, &settings)
            .is_err());
    }

    /// A loopback HTTP server answering HEAD with 8 bytes of size and `ETag: <etag>`,
    /// and GET with `get(request head)`; one request per connection. It keeps each GET's
    /// request head, lowercased.
    fn versioned_server(
        etag: &'static str,
        get: fn(&str) -> String,
    ) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/f", listener.local_addr().unwrap());
        let gets = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&gets);
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let answer = if head.starts_with("head") {
                    format!("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nETag: {etag}\r\n")
                } else {
                    seen.lock().unwrap().push(head.clone());
                    get(&head)
                };
                let _ = write!(conn, "{answer}Connection: close\r\n\r\n");
                if answer.contains(" 206 ") {
                    let _ = conn.write_all(b"abcdefgh");
                }
            }
        });
        (url, gets)
    }

    fn read_all(source: &RemoteSource, settings: &Settings) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 8];
        source.read_host(HostSpan::from_slice(&mut buf), 0, settings)?;
        Ok(buf)
    }

    const PARTIAL: &str =
        "HTTP/1.1 206 Partial Content\r\nContent-Length: 8\r\nContent-Range: bytes 0-7/8\r\n";

    #[test]
    fn a_changed_file_is_refused_at_once_never_retried() {
        let mut settings = Settings::default();
        // Even where 412 is named as worth retrying, it is final.
        settings.http_status_codes = crate::settings::StatusCodes::new(&[412, 503]).unwrap();
        settings.http_max_attempts = 3;
        let (url, gets) = versioned_server("\"v1\"", |_| {
            "HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\nETag: \"v2\"\r\n".into()
        });
        let source = open_url(&url, EndpointType::Http, None, None, &settings).unwrap();
        assert_eq!(source.etag(), Some("\"v1\""));
        let err = read_all(&source, &settings).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Remote {
                    kind: RemoteFailure::Changed,
                    ..
                }
            ),
            "{err:?}"
        );
        let text = err.to_string();
        for part in [
            "\"v1\"",
            "\"v2\"",
            "bytes=0-7",
            "changed on the server",
            "again",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        let gets = gets.lock().unwrap();
        assert_eq!(gets.len(), 1, "{gets:?}");
        assert!(gets[0].contains("\r\nif-match: \"v1\"\r\n"), "{}", gets[0]);
    }

    #[test]
    fn a_server_ignoring_if_match_is_caught_by_its_etag() {
        let settings = Settings::default();
        let (url, _) = versioned_server("\"v1\"", |_| format!("{PARTIAL}ETag: \"v2\"\r\n"));
        let source = open_url(&url, EndpointType::Http, None, None, &settings).unwrap();
        let err = read_all(&source, &settings).unwrap_err().to_string();
        assert!(
            err.contains("its ETag was \"v1\" when it was opened and is \"v2\" now"),
            "{err}"
        );
        // The same version: read as ever.
        let (url, _) = versioned_server("\"v1\"", |_| format!("{PARTIAL}ETag: \"v1\"\r\n"));
        let source = open_url(&url, EndpointType::Http, None, None, &settings).unwrap();
        assert_eq!(read_all(&source, &settings).unwrap(), b"abcdefgh");
    }

    #[test]
    fn weak_or_absent_etags_pin_nothing() {
        let settings = Settings::default();
        for etag in ["W/\"v1\"", "unquoted", "\"\"x"] {
            let (url, gets) = versioned_server(etag, |_| PARTIAL.into());
            let source = open_url(&url, EndpointType::Http, None, None, &settings).unwrap();
            assert_eq!(source.etag(), None, "{etag}");
            assert_eq!(read_all(&source, &settings).unwrap(), b"abcdefgh");
            assert!(!gets.lock().unwrap()[0].contains("if-match"), "{etag}");
        }
        // A size given: no size request, so no version to pin.
        let (url, gets) = versioned_server("\"v1\"", |_| PARTIAL.into());
        let source = open_url(&url, EndpointType::Http, None, Some(8), &settings).unwrap();
        assert_eq!(read_all(&source, &settings).unwrap(), b"abcdefgh");
        assert!(!gets.lock().unwrap()[0].contains("if-match"));
    }

    #[test]
    fn signed_range_requests_sign_their_if_match() {
        let options = S3Options {
            region: Some("us-east-1".into()),
            access_key: Some("AKIDEXAMPLE".into()),
            secret_key: Some("secret".into()),
            endpoint_url: Some("http://127.0.0.1:1".into()),
            session_token: None,
        };
        let endpoint = Endpoint::s3_bucket("b", "k", &options).unwrap();
        let agent = tls::agent(&[]).unwrap();
        let prepared = endpoint
            .range_request(0, 8, Some("\"v1\""), &agent)
            .unwrap();
        let header = |name: &str| {
            prepared
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(header("if-match").as_deref(), Some("\"v1\""));
        let authorization = header("authorization").unwrap();
        assert!(
            authorization.contains("SignedHeaders=host;if-match;range;"),
            "{authorization}"
        );
    }

    #[test]
    fn urls_are_told_from_paths() {
        assert!(as_url(Path::new("https://h/f")).is_some());
        assert!(as_url(Path::new("S3://b/k")).is_some());
        assert!(as_url(Path::new("webhdfs://h:1/f")).is_some());
        assert!(as_url(Path::new("/tmp/http://x")).is_none());
        assert!(as_url(Path::new("data.bin")).is_none());
        assert!(as_url(Path::new("ftp://h/f")).is_none());
    }
}
