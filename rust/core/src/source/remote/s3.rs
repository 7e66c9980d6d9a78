//! S3 endpoints: where an object's URL comes from (`s3://bucket/key`, bucket and object
//! names, an HTTP URL), the credentials and region from arguments or kvikio's AWS
//! environment variables, and the signed headers of each request.

use std::sync::Arc;
use std::time::SystemTime;

use super::s3_sigv4::{amz_date, sign, Credentials};
use super::url::{normalise, parse_s3_url, Url};
use crate::error::{Error, RemoteFailure, Result};

/// What `open_s3*` take besides the object: each `None` falls back on its environment
/// variable (`AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_ENDPOINT_URL`, `AWS_SESSION_TOKEN`).
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// The region, such as `us-east-1`.
    pub region: Option<String>,
    /// The access key id.
    pub access_key: Option<String>,
    /// The secret access key.
    pub secret_key: Option<String>,
    /// The endpoint to use instead of AWS's (`http://127.0.0.1:9000`): objects are then
    /// at `<endpoint>/<bucket>/<key>`.
    pub endpoint_url: Option<String>,
    /// The session token of temporary credentials (access keys starting with `ASIA`).
    pub session_token: Option<String>,
}

fn invalid(url: &str, message: String) -> Error {
    Error::remote(RemoteFailure::InvalidUrl, url, message)
}

/// `value`, or the environment variable `var`.
fn or_env(
    value: &Option<String>,
    var: &str,
    getenv: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    value.clone().or_else(|| getenv(var))
}

impl S3Options {
    /// The HTTP URL of `key` in `bucket`: `<endpoint_url>/<bucket>/<key>` where an endpoint
    /// is given (or `AWS_ENDPOINT_URL` set), else AWS's virtual-hosted
    /// `https://<bucket>.s3.<region>.amazonaws.com/<key>`.
    pub(crate) fn object_url(
        &self,
        bucket: &str,
        key: &str,
        getenv: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String> {
        if let Some(endpoint) = or_env(&self.endpoint_url, "AWS_ENDPOINT_URL", getenv) {
            return Ok(format!("{}/{bucket}/{key}", endpoint.trim_end_matches('/')));
        }
        let region = self.region(bucket, getenv)?;
        Ok(format!("https://{bucket}.s3.{region}.amazonaws.com/{key}"))
    }

    fn region(&self, what: &str, getenv: &dyn Fn(&str) -> Option<String>) -> Result<String> {
        or_env(&self.region, "AWS_DEFAULT_REGION", getenv).ok_or_else(|| {
            invalid(
                what,
                "S3: must provide `aws_region` if AWS_DEFAULT_REGION isn't set: pass \
                 aws_region_name= or set AWS_DEFAULT_REGION (e.g. us-east-1)"
                    .into(),
            )
        })
    }

    /// The signing credentials, from the arguments or the environment; an error naming
    /// what is missing.
    pub fn credentials(
        &self,
        url: &str,
        getenv: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Credentials> {
        let region = self.region(url, getenv)?;
        let missing = |arg: &str, var: &str| {
            invalid(
                url,
                format!(
                    "S3: must provide `{arg}` if {var} isn't set: pass {arg}= or set {var} \
                     (for a public object, use RemoteFile.open_s3_public)"
                ),
            )
        };
        let access_key = or_env(&self.access_key, "AWS_ACCESS_KEY_ID", getenv)
            .ok_or_else(|| missing("aws_access_key_id", "AWS_ACCESS_KEY_ID"))?;
        let secret_key = or_env(&self.secret_key, "AWS_SECRET_ACCESS_KEY", getenv)
            .ok_or_else(|| missing("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"))?;
        // As kvikio: temporary credentials (ASIA...) need their session token; permanent
        // ones are sent without one, so that a stale AWS_SESSION_TOKEN cannot break them.
        let session_token = if access_key.starts_with("ASIA") {
            Some(
                or_env(&self.session_token, "AWS_SESSION_TOKEN", getenv).ok_or_else(|| {
                    invalid(
                        url,
                        "When using temporary credentials, AWS_SESSION_TOKEN must be set: \
                         the access key starts with ASIA (temporary credentials); pass \
                         aws_session_token= or set AWS_SESSION_TOKEN"
                            .into(),
                    )
                })?,
            )
        } else {
            None
        };
        Ok(Credentials {
            access_key,
            secret_key,
            session_token,
            region,
            service: "s3",
        })
    }
}

/// A signed S3 object: its URL (encoded as sent) and the credentials.
#[derive(Debug, Clone)]
pub struct S3Object {
    /// The HTTP URL, percent-encoded.
    pub url: String,
    credentials: Arc<Credentials>,
}

impl S3Object {
    /// The object at the HTTP(S) `url`, signed with `options`' credentials.
    pub fn from_http_url(
        url: &str,
        options: &S3Options,
        getenv: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let lower = url.to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return Err(invalid(
                url,
                format!("url must start with http:// or https://, got '{url}'"),
            ));
        }
        if Url::parse(url).is_ok_and(|u| u.user_info().is_some()) {
            return Err(invalid(
                url,
                format!(
                    "'{url}' has user info (user:password@): a signed S3 request carries \
                     the AWS signature, not a password; remove the user info from the URL \
                     (or from AWS_ENDPOINT_URL)"
                ),
            ));
        }
        let credentials = Arc::new(options.credentials(url, getenv)?);
        Ok(Self {
            url: normalise(url).map_err(|why| invalid(url, why))?,
            credentials,
        })
    }

    /// `key` in `bucket`, at the URL [`S3Options::object_url`] gives.
    pub fn from_bucket(
        bucket: &str,
        key: &str,
        options: &S3Options,
        getenv: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let url = options.object_url(bucket, key, getenv)?;
        Self::from_http_url(&url, options, getenv)
    }

    /// The object of `s3://bucket/key`.
    pub fn from_s3_url(
        url: &str,
        options: &S3Options,
        getenv: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let (bucket, key) = parse_s3_url(url).map_err(|why| invalid(url, why))?;
        Self::from_bucket(&bucket, &key, options, getenv)
    }

    /// The headers of a request of `method` with `extra` headers, signed now.
    pub fn signed_headers(
        &self,
        method: &str,
        extra: &[(&str, String)],
    ) -> Result<Vec<(String, String)>> {
        let date = amz_date(SystemTime::now());
        let mut headers = sign(&self.credentials, method, &self.url, extra, &date)
            .map_err(|why| invalid(&self.url, why))?;
        headers.extend(extra.iter().map(|(n, v)| (n.to_string(), v.clone())));
        Ok(headers)
    }

    /// The credentials, for a request to carry (see [`super::http::Auth::Signed`]).
    pub fn credentials(&self) -> Arc<Credentials> {
        Arc::clone(&self.credentials)
    }
}

/// The headers SigV4 adds (and [`resign`] replaces).
const SIGNATURE_HEADERS: [&str; 4] = [
    "authorization",
    "x-amz-date",
    "x-amz-content-sha256",
    "x-amz-security-token",
];

/// `headers` of a signed request signed again, now, for `url` (a redirect within the
/// origin): the signature headers replaced, the others (`Range`) kept and signed.
pub fn resign(
    credentials: &Credentials,
    method: &str,
    url: &str,
    headers: &[(String, String)],
) -> Result<Vec<(String, String)>> {
    let extra: Vec<(&str, String)> = headers
        .iter()
        .filter(|(name, _)| {
            !SIGNATURE_HEADERS
                .iter()
                .any(|s| s.eq_ignore_ascii_case(name))
        })
        .map(|(name, value)| (name.as_str(), value.clone()))
        .collect();
    let date = amz_date(SystemTime::now());
    let mut signed =
        sign(credentials, method, url, &extra, &date).map_err(|why| invalid(url, why))?;
    signed.extend(extra.iter().map(|(n, v)| (n.to_string(), v.clone())));
    Ok(signed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::remote::test_env as env;

    #[test]
    fn object_urls_follow_kvikio() {
        let none = S3Options::default();
        let region = env(&[("AWS_DEFAULT_REGION", "eu-west-1")]);
        assert_eq!(
            none.object_url("b", "k/x", &region).unwrap(),
            "https://b.s3.eu-west-1.amazonaws.com/k/x"
        );
        let endpoint = env(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/")]);
        assert_eq!(
            none.object_url("b", "k", &endpoint).unwrap(),
            "http://127.0.0.1:9000/b/k"
        );
        let given = S3Options {
            endpoint_url: Some("http://h:1".into()),
            ..S3Options::default()
        };
        assert_eq!(
            given.object_url("b", "k", &endpoint).unwrap(),
            "http://h:1/b/k"
        );
        let err = none.object_url("b", "k", &env(&[])).unwrap_err();
        assert!(err.to_string().contains("AWS_DEFAULT_REGION"), "{err}");
    }

    #[test]
    fn credentials_come_from_arguments_then_environment() {
        let vars = env(&[
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "AKIAENV"),
            ("AWS_SECRET_ACCESS_KEY", "envsecret"),
            ("AWS_SESSION_TOKEN", "stale"),
        ]);
        let c = S3Options::default().credentials("u", &vars).unwrap();
        assert_eq!((c.access_key.as_str(), c.session_token), ("AKIAENV", None));
        let temporary = S3Options {
            access_key: Some("ASIATEMP".into()),
            ..S3Options::default()
        };
        let c = temporary.credentials("u", &vars).unwrap();
        assert_eq!(c.session_token.as_deref(), Some("stale"));
        let err = temporary
            .credentials(
                "u",
                &env(&[("AWS_DEFAULT_REGION", "r"), ("AWS_SECRET_ACCESS_KEY", "s")]),
            )
            .unwrap_err();
        assert!(err.to_string().contains("AWS_SESSION_TOKEN"), "{err}");
        let err = S3Options::default()
            .credentials("u", &env(&[("AWS_DEFAULT_REGION", "r")]))
            .unwrap_err();
        assert!(err.to_string().contains("AWS_ACCESS_KEY_ID"), "{err}");
    }

    #[test]
    fn objects_encode_their_keys() {
        let vars = env(&[
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "AKIA"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
        ]);
        let o = S3Object::from_s3_url("s3://bucket/dir/a b+c.bin", &S3Options::default(), &vars)
            .unwrap();
        assert_eq!(o.url, "http://127.0.0.1:5000/bucket/dir/a%20b%2Bc.bin");
        let headers = o
            .signed_headers("GET", &[("Range", "bytes=0-9".into())])
            .unwrap();
        let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        assert!(
            names.contains(&"authorization") && names.contains(&"Range"),
            "{names:?}"
        );
        assert!(S3Object::from_s3_url("s3://bucket", &S3Options::default(), &vars).is_err());
        assert!(S3Object::from_http_url("ftp://x/y", &S3Options::default(), &vars).is_err());
    }
}
