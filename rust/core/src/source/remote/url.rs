//! URLs of remote files: splitting one into its parts, kvikio's rules for which endpoint
//! type a URL fits, percent-encoding of paths and queries for requests and signing, user
//! info (`user:password@`) taken out of URLs and redacted from text, and the origin
//! rules of redirects.

use std::borrow::Cow;

pub use crate::redact::redact;

/// The parts of a URL (`scheme://authority/path?query#fragment`), borrowed from the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url<'a> {
    /// The scheme, lower-cased (`"https"`).
    pub scheme: String,
    /// Everything between `//` and the path, user info and port included.
    pub authority: &'a str,
    /// The host without user info, port or IPv6 brackets' surroundings (`"[::1]"` kept
    /// bracketed).
    pub host: &'a str,
    /// The port, where the authority names one.
    pub port: Option<u16>,
    /// The path, from its leading `/` (empty where the URL has none).
    pub path: &'a str,
    /// The query, without its `?`, where there is one.
    pub query: Option<&'a str>,
}

impl<'a> Url<'a> {
    /// Split `text`; the error says what is wrong with it.
    pub fn parse(text: &'a str) -> Result<Self, String> {
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err(format!(
                "'{text}' has no scheme (Bad scheme): a remote file's URL starts with \
                 http://, https://, s3:// or webhdfs://"
            ));
        };
        let mut chars = scheme.chars();
        let valid_scheme = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        if !valid_scheme {
            return Err(format!(
                "'{text}' has no valid scheme (Bad scheme): a remote file's URL starts with \
                 http://, https://, s3:// or webhdfs://"
            ));
        }
        let rest = rest.split('#').next().unwrap_or_default();
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (path, query) = match tail.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (tail, None),
        };
        let host_port = authority.rsplit('@').next().unwrap_or_default();
        let (host, port) = split_port(host_port)
            .ok_or_else(|| format!("'{text}' has an invalid port in '{authority}'"))?;
        if host.is_empty() {
            return Err(format!("'{text}' has no host"));
        }
        Ok(Self {
            scheme: scheme.to_ascii_lowercase(),
            authority,
            host,
            port,
            path,
            query,
        })
    }

    /// The authority without user info, as a `Host` header carries it: the port only
    /// where it differs from the scheme's default.
    pub fn host_header(&self) -> String {
        let default = match self.scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        };
        match self.port {
            Some(port) if Some(port) != default => format!("{}:{port}", self.host),
            _ => self.host.to_string(),
        }
    }

    /// Whether the scheme is `http` or `https`.
    pub fn is_http(&self) -> bool {
        matches!(self.scheme.as_str(), "http" | "https")
    }

    /// The user info (`user:password` of `http://user:password@host/`), where the
    /// authority has one.
    pub fn user_info(&self) -> Option<&'a str> {
        self.authority.rsplit_once('@').map(|(info, _)| info)
    }

    /// The origin, `(scheme, host lower-cased, port)` with the scheme's default port
    /// where none is named: two URLs of one origin reach the same server.
    pub fn origin(&self) -> (String, String, Option<u16>) {
        let default = match self.scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        };
        (
            self.scheme.clone(),
            self.host.to_ascii_lowercase(),
            self.port.or(default),
        )
    }
}

/// Whether `a` and `b` have the same origin (scheme, host and port), the only URLs a
/// credential made for `a` may be sent to. Unparsable URLs have no origin.
pub fn same_origin(a: &str, b: &str) -> bool {
    match (Url::parse(a), Url::parse(b)) {
        (Ok(a), Ok(b)) => a.origin() == b.origin(),
        _ => false,
    }
}

/// `scheme://host[:port]` of `url` (user info left out), for messages about where a
/// request went.
pub fn origin_text(url: &str) -> String {
    match Url::parse(url) {
        Ok(u) => match u.port {
            Some(port) => format!("{}://{}:{port}", u.scheme, u.host),
            None => format!("{}://{}", u.scheme, u.host),
        },
        Err(_) => redact(url).into_owned(),
    }
}

/// A URL's user name and password, percent-decoded (the password empty where there is
/// none).
pub type UserInfo = (Vec<u8>, Vec<u8>);

/// `url` without its user info, and the user info, where the URL has one.
pub fn split_user_info(url: &str) -> (Cow<'_, str>, Option<UserInfo>) {
    // Found by the text alone, so that a URL that fails to parse loses it too.
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return (Cow::Borrowed(url), None);
    };
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let Some(at) = url[start..authority_end].rfind('@').map(|i| start + i) else {
        return (Cow::Borrowed(url), None);
    };
    let info = &url[start..at];
    let stripped = format!("{}{}", &url[..start], &url[at + 1..]);
    let (user, password) = info.split_once(':').unwrap_or((info, ""));
    (
        Cow::Owned(stripped),
        Some((percent_decode(user), percent_decode(password))),
    )
}

/// `text` with `%XX` escapes decoded (an invalid escape kept as is).
fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' {
            if let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).and_then(|&b| hex(b)),
                bytes.get(i + 2).and_then(|&b| hex(b)),
            ) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// The URL a redirect's `Location` (`location`) leads to from `base`: absolute
/// (`https://h/p`), scheme-relative (`//h/p`), absolute path (`/p`) or relative path
/// (`p`, beside `base`'s last segment). The fragment is dropped; the error says why a
/// location cannot be followed.
pub fn resolve(base: &str, location: &str) -> Result<String, String> {
    let location = location.trim();
    let location = location.split('#').next().unwrap_or_default();
    let parsed = Url::parse(base)?;
    // A scheme (`x:` before any `/`) makes the location absolute.
    let has_scheme = location.split_once(':').is_some_and(|(scheme, _)| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    });
    let joined = if has_scheme {
        location.to_string()
    } else if let Some(rest) = location.strip_prefix("//") {
        format!("{}://{rest}", parsed.scheme)
    } else {
        let host_port = parsed.authority.rsplit('@').next().unwrap_or_default();
        let prefix = format!("{}://{host_port}", parsed.scheme);
        if location.starts_with('/') {
            format!("{prefix}{location}")
        } else {
            let dir = parsed.path.rfind('/').map_or("/", |i| &parsed.path[..=i]);
            let dir = if dir.is_empty() { "/" } else { dir };
            format!("{prefix}{dir}{location}")
        }
    };
    let target = Url::parse(&joined)?;
    if !target.is_http() {
        return Err(format!(
            "the redirect leads to '{}', which is not an http(s) URL",
            redact(&joined)
        ));
    }
    Ok(joined)
}

/// `host[:port]` (IPv6 hosts in brackets) split; `None` for a port that is not a number.
fn split_port(host_port: &str) -> Option<(&str, Option<u16>)> {
    let colon = if host_port.starts_with('[') {
        let close = host_port.find(']')?;
        match &host_port[close + 1..] {
            "" => return Some((host_port, None)),
            after if after.starts_with(':') => close + 1,
            _ => return None,
        }
    } else {
        match host_port.rfind(':') {
            Some(i) => i,
            None => return Some((host_port, None)),
        }
    };
    let (host, port) = (&host_port[..colon], &host_port[colon + 1..]);
    if port.is_empty() {
        return Some((host, None));
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((host, Some(port.parse().ok()?)))
}

/// Whether `url` has one of the AWS S3 HTTP forms kvikio recognises: virtual-hosted
/// (`https://<bucket>.s3.<region>.amazonaws.com/<key>`), path style
/// (`https://s3.<region>.amazonaws.com/<bucket>/<key>`), and the legacy global
/// (`s3.amazonaws.com`) and dash-regional (`s3-<region>.amazonaws.com`) hosts of both.
pub fn is_aws_s3_http(url: &str) -> bool {
    let Ok(parsed) = Url::parse(url) else {
        return false;
    };
    if !parsed.is_http() || parsed.port.is_some() || parsed.authority.contains('@') {
        return false;
    }
    let host = parsed.host.to_ascii_lowercase();
    let Some(name) = host.strip_suffix(".amazonaws.com") else {
        return false;
    };
    // What follows the host's `/`: the path (and query) without its leading slash.
    let Some(path) = parsed.path.strip_prefix('/') else {
        return false;
    };
    let after = match parsed.query {
        Some(query) => format!("{path}?{query}"),
        None => path.to_string(),
    };
    let no_dots = |s: &str| !s.is_empty() && !s.contains('.');
    let s3_part = |s: &str| {
        s == "s3"
            || s.strip_prefix("s3.").is_some_and(no_dots)
            || s.strip_prefix("s3-").is_some_and(no_dots)
    };
    if s3_part(name) {
        // Path style: the bucket, then a key.
        return after
            .split_once('/')
            .is_some_and(|(bucket, key)| !bucket.is_empty() && !key.is_empty());
    }
    // Virtual-hosted: `<bucket>.` before the s3 part; then a key.
    let virtual_hosted = name
        .match_indices(".s3")
        .any(|(i, _)| i > 0 && s3_part(&name[i + 1..]));
    virtual_hosted && !after.is_empty()
}

/// Whether `url` is an AWS S3 presigned URL: an S3 HTTP form whose query carries
/// `X-Amz-Algorithm` and `X-Amz-Signature`.
pub fn is_s3_presigned(url: &str) -> bool {
    is_aws_s3_http(url)
        && Url::parse(url).is_ok_and(|u| {
            u.query
                .is_some_and(|q| q.contains("X-Amz-Algorithm") && q.contains("X-Amz-Signature"))
        })
}

/// Whether `url` is a WebHDFS URL: `http(s)://<host>:<port>/webhdfs/v1/<path>`, or
/// kvikpy's shorthand `webhdfs://<host>:<port>/<path>`.
pub fn is_webhdfs(url: &str) -> bool {
    let Ok(parsed) = Url::parse(url) else {
        return false;
    };
    match parsed.scheme.as_str() {
        "http" | "https" => {
            parsed.port.is_some()
                && parsed
                    .path
                    .get(..12)
                    .is_some_and(|p| p.eq_ignore_ascii_case("/webhdfs/v1/"))
                && parsed.path.len() > 12
        }
        "webhdfs" => parsed.port.is_some() && parsed.path.len() > 1,
        _ => false,
    }
}

/// Whether `url` is a plain HTTP(S) URL with a path beyond `/`.
pub fn is_http(url: &str) -> bool {
    Url::parse(url).is_ok_and(|u| u.is_http() && u.path.len() > 1)
}

/// Whether `url` is an S3 URL kvikio reads with credentials: `s3://<bucket>/<key>`, or an
/// AWS S3 HTTP form that is not presigned.
pub fn is_s3(url: &str) -> bool {
    match Url::parse(url) {
        Ok(u) if u.scheme == "s3" => u.path.len() > 1 && !u.authority.is_empty(),
        Ok(u) if u.is_http() => is_aws_s3_http(url) && !is_s3_presigned(url),
        _ => false,
    }
}

/// `s3://<bucket>/<key>` split into bucket and key.
pub fn parse_s3_url(url: &str) -> Result<(String, String), String> {
    let wrong = || {
        format!(
            "'{url}' does not match the expected S3 URL format s3://<bucket>/<object>: \
             pass a URL such as s3://my-bucket/path/to/object"
        )
    };
    let rest = url
        .get(..5)
        .filter(|s| s.eq_ignore_ascii_case("s3://"))
        .map(|_| &url[5..])
        .ok_or_else(wrong)?;
    match rest.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() => {
            Ok((bucket.to_string(), key.to_string()))
        }
        _ => Err(wrong()),
    }
}

/// Percent-encode `text` the way AWS canonicalises URIs: unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`) stay, `/` stays where `keep_slash`, existing `%XX` escapes stay
/// (with upper-case hex), and every other byte becomes `%XX`.
pub fn encode(text: &str, keep_slash: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let escape = b == b'%'
            && bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
            && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
        if escape {
            out.push('%');
            out.push(bytes[i + 1].to_ascii_uppercase() as char);
            out.push(bytes[i + 2].to_ascii_uppercase() as char);
            i += 3;
            continue;
        }
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
        i += 1;
    }
    out
}

/// A query string in AWS canonical form: each name and value encoded by [`encode`],
/// the pairs sorted by name, then value.
pub fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (encode(k, false), encode(v, false))
        })
        .collect();
    pairs.sort();
    pairs
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `url` with its path (and query) percent-encoded by [`encode`], so that an HTTP client
/// accepts it and a signature computed over it matches what the server sees.
pub fn normalise(url: &str) -> Result<String, String> {
    let parsed = Url::parse(url)?;
    let mut out = format!(
        "{}://{}{}",
        parsed.scheme,
        parsed.authority,
        encode(parsed.path, true)
    );
    if let Some(query) = parsed.query {
        out.push('?');
        out.push_str(
            &query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => format!("{}={}", encode(k, false), encode(v, false)),
                    None => encode(p, false),
                })
                .collect::<Vec<_>>()
                .join("&"),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_parts() {
        let u = Url::parse("HTTPS://user:pw@example.com:8443/a/b%20c?x=1&y#frag").unwrap();
        assert_eq!(u.scheme, "https");
        assert_eq!(u.authority, "user:pw@example.com:8443");
        assert_eq!((u.host, u.port), ("example.com", Some(8443)));
        assert_eq!((u.path, u.query), ("/a/b%20c", Some("x=1&y")));
        assert_eq!(u.host_header(), "example.com:8443");
        let u = Url::parse("http://[::1]:80/f").unwrap();
        assert_eq!(
            (u.host, u.port, u.host_header().as_str()),
            ("[::1]", Some(80), "[::1]")
        );
        let u = Url::parse("s3://bucket/key/with/slashes").unwrap();
        assert_eq!((u.host, u.path), ("bucket", "/key/with/slashes"));
        assert_eq!(Url::parse("http://h").unwrap().path, "");
        for bad in [
            "://bucket/object",
            "no-scheme",
            "1http://x/y",
            "http:///path",
            "http://h:x/",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
        assert!(Url::parse("://b/o").unwrap_err().contains("Bad scheme"));
    }

    #[test]
    fn aws_s3_http_forms_like_kvikio() {
        for good in [
            "https://bucket.s3.us-east-1.amazonaws.com/key",
            "http://my.dotted.bucket.s3.eu-west-2.amazonaws.com/a/b",
            "https://s3.us-east-1.amazonaws.com/bucket/key",
            "https://bucket.s3.amazonaws.com/key",
            "https://s3.amazonaws.com/bucket/key",
            "https://bucket.s3-us-west-1.amazonaws.com/key",
            "https://s3-us-west-1.amazonaws.com/bucket/key",
            "HTTPS://BUCKET.S3.US-EAST-1.AMAZONAWS.COM/KEY",
        ] {
            assert!(is_aws_s3_http(good), "{good}");
            assert!(is_s3(good), "{good}");
        }
        for bad in [
            "https://bucket.s3.us-east-1.amazonaws.com/",
            "https://s3.us-east-1.amazonaws.com/bucket",
            "https://s3.us-east-1.amazonaws.com/bucket/",
            "https://example.com/bucket/key",
            "ftp://bucket.s3.amazonaws.com/key",
            "https://bucket.s3.us-east-1.amazonaws.com:443/key",
            "https://amazonaws.com/bucket/key",
            "https://s3.amazonaws.com.evil.com/bucket/key",
        ] {
            assert!(!is_aws_s3_http(bad), "{bad}");
        }
        let presigned = "https://b.s3.us-east-1.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256\
                         &X-Amz-Signature=abc";
        assert!(is_s3_presigned(presigned) && !is_s3(presigned));
        assert!(!is_s3_presigned(
            "https://b.s3.us-east-1.amazonaws.com/k?X-Amz-Algorithm=A"
        ));
        assert!(is_s3("s3://bucket/key") && !is_s3("s3://bucket") && !is_s3("s3://bucket/"));
    }

    #[test]
    fn webhdfs_and_http_forms() {
        assert!(is_webhdfs("http://host:9870/webhdfs/v1/home/f.bin"));
        assert!(is_webhdfs("http://host:9870/webhdfs/v1/home/f.bin?op=OPEN"));
        assert!(is_webhdfs("webhdfs://host:9870/home/f.bin"));
        assert!(!is_webhdfs("http://host/webhdfs/v1/home/f.bin"));
        assert!(!is_webhdfs("http://host:9870/webhdfs/v1/"));
        assert!(!is_webhdfs("http://host:9870/other/v1/f"));
        assert!(is_http("http://127.0.0.1:8000/a") && !is_http("http://127.0.0.1:8000/"));
        assert!(!is_http("s3://b/k"));
    }

    #[test]
    fn s3_urls_split() {
        assert_eq!(
            parse_s3_url("S3://bucket/a/b.bin").unwrap(),
            ("bucket".into(), "a/b.bin".into())
        );
        for bad in ["s3://bucket", "s3://bucket/", "s3:///key", "http://b/k"] {
            assert!(parse_s3_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn encoding_follows_aws() {
        assert_eq!(encode("/a b/c+d~e_%2f", true), "/a%20b/c%2Bd~e_%2F");
        assert_eq!(encode("a/b", false), "a%2Fb");
        assert_eq!(encode("100%", true), "100%25");
        assert_eq!(canonical_query("b=2&a=1&a=0&c"), "a=0&a=1&b=2&c=");
        assert_eq!(
            normalise("http://h:1/a b?x=y z").unwrap(),
            "http://h:1/a%20b?x=y%20z"
        );
    }

    #[test]
    fn user_info_is_split_and_decoded() {
        let (url, info) = split_user_info("http://ann:p%40ss:w@h:8/f?x=1");
        assert_eq!(url, "http://h:8/f?x=1");
        assert_eq!(info, Some((b"ann".to_vec(), b"p@ss:w".to_vec())));
        let (url, info) = split_user_info("https://tok@h/f");
        assert_eq!(
            (url.as_ref(), info),
            ("https://h/f", Some((b"tok".to_vec(), Vec::new())))
        );
        // Taken out even where the rest does not parse (a port out of range).
        let (url, info) = split_user_info("http://a:*@a:66000");
        assert_eq!((url.as_ref(), info.is_some()), ("http://a:66000", true));
        let (url, info) = split_user_info("http://h/a@b");
        assert_eq!((url.as_ref(), info), ("http://h/a@b", None));
        assert_eq!(
            Url::parse("http://u:p@h/").unwrap().user_info(),
            Some("u:p")
        );
        assert_eq!(Url::parse("http://h/x@y").unwrap().user_info(), None);
    }

    #[test]
    fn redaction_hides_passwords_in_urls_and_messages() {
        assert_eq!(redact("http://ann:secret@h:1/f"), "http://ann:***@h:1/f");
        assert_eq!(redact("https://token@h/f"), "https://***@h/f");
        assert_eq!(redact("http://h/a@b"), "http://h/a@b");
        assert_eq!(
            redact("GET 'http://a:s1@h/x' then http://b:s2@[::1]:8 (and s3://c/k)"),
            "GET 'http://a:***@h/x' then http://b:***@[::1]:8 (and s3://c/k)"
        );
        assert_eq!(redact("http://u:p@ss@h/f"), "http://u:***@h/f");
        assert!(matches!(redact("no url here"), Cow::Borrowed(_)));
        assert_eq!(
            redact("'https://b.s3.amazonaws.com/k?X-Amz-Algorithm=A&x-amz-signature=abc&X-Amz-Security-Token=tok%2B1&X-Amz-Expires=60'"),
            "'https://b.s3.amazonaws.com/k?X-Amz-Algorithm=A&x-amz-signature=***&X-Amz-Security-Token=***&X-Amz-Expires=60'"
        );
        assert_eq!(redact("no-X-Amz-Signature=here"), "no-X-Amz-Signature=here");
    }

    #[test]
    fn origins_compare_scheme_host_and_port() {
        assert!(same_origin("http://h/a", "http://H:80/b?x"));
        assert!(same_origin("https://h:443/a", "https://h/b"));
        assert!(same_origin("http://u:p@h:8/a", "http://h:8/b"));
        assert!(!same_origin("http://h/a", "https://h/a"));
        assert!(!same_origin("http://127.0.0.1:8/a", "http://localhost:8/a"));
        assert!(!same_origin("http://h:8/a", "http://h:9/a"));
        assert!(!same_origin("http://h.evil/a", "http://h/a"));
        assert!(!same_origin("nonsense", "nonsense"));
        assert_eq!(origin_text("http://u:p@h:8/a"), "http://h:8");
    }

    #[test]
    fn locations_resolve_against_the_request() {
        let base = "http://h:8/dir/f.bin?x=1";
        assert_eq!(resolve(base, "https://o/g").unwrap(), "https://o/g");
        assert_eq!(resolve(base, "//o:9/g").unwrap(), "http://o:9/g");
        assert_eq!(resolve(base, "/g?y=2#frag").unwrap(), "http://h:8/g?y=2");
        assert_eq!(resolve(base, "g.bin").unwrap(), "http://h:8/dir/g.bin");
        assert_eq!(resolve("http://u:p@h/f", "/g").unwrap(), "http://h/g");
        assert!(resolve(base, "ftp://o/g").is_err());
        assert!(resolve(base, "file:///etc/passwd").is_err());
    }

    proptest! {
        #[test]
        fn redaction_never_shows_a_password(
            user in "[a-z]{1,8}",
            password in "[A-Za-z0-9~!$&*+,;=%-]{1,16}",
            host in "[a-z]{1,8}(:[0-9]{1,5})?",
            path in "(/[a-z@:]{0,8}){0,3}",
        ) {
            let url = format!("https://{user}:{password}@{host}{path}");
            // A path holding "://" reads as another URL in a message (redacted too, which
            // is on the safe side); leave that to the cases above.
            prop_assume!(!path.contains("//"));
            // The password goes, whatever the path holds (which may look like one).
            let expected = format!("https://{user}:***@{host}{path}");
            prop_assert_eq!(redact(&url), expected.clone());
            let message = format!("GET '{url}': failed; retry {url}");
            prop_assert_eq!(
                redact(&message),
                format!("GET '{expected}': failed; retry {expected}")
            );
            let (stripped, info) = split_user_info(&url);
            prop_assert!(!stripped.contains('@') || path.contains('@'));
            prop_assert_eq!(info.map(|(u, _)| u), Some(user.into_bytes()));
        }

        #[test]
        fn url_helpers_never_panic(a in "\\PC{0,40}", b in "\\PC{0,40}") {
            let _ = redact(&a);
            let _ = split_user_info(&a);
            let _ = same_origin(&a, &b);
            let _ = resolve(&a, &b);
            let _ = origin_text(&a);
        }

        #[test]
        fn encode_is_idempotent_and_safe(text in ".{0,40}") {
            let once = encode(&text, true);
            prop_assert_eq!(encode(&once, true), once.clone());
            prop_assert!(once.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~/%".contains(&b)));
        }

        #[test]
        fn parse_never_panics(text in "\\PC{0,60}") {
            let _ = Url::parse(&text);
            let _ = is_s3(&text);
            let _ = is_webhdfs(&text);
            let _ = is_s3_presigned(&text);
        }
    }
}
