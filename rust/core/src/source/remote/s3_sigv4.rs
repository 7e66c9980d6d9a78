//! AWS Signature Version 4 for S3 requests: the canonical request, the string to sign,
//! the derived signing key and the `Authorization` header, with ring's SHA-256 and HMAC
//! (the same crypto rustls already links).

use std::time::{SystemTime, UNIX_EPOCH};

use ring::{digest, hmac};

use super::url::{canonical_query, Url};

/// SHA-256 of the empty payload: what a GET or HEAD signs as its body.
pub const EMPTY_PAYLOAD_SHA256: &str =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// What signs requests: an access key pair, the region and the service.
#[derive(Clone)]
pub struct Credentials {
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key: String,
    /// `AWS_SECRET_ACCESS_KEY` (never sent; only keys the signature).
    pub secret_key: String,
    /// `AWS_SESSION_TOKEN`, sent as `x-amz-security-token` with temporary credentials.
    pub session_token: Option<String>,
    /// The region, such as `us-east-1`.
    pub region: String,
    /// The service, `s3`.
    pub service: &'static str,
}

// The secret stays out of debug output (error messages, logs).
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field("region", &self.region)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(data: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, data).as_ref())
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::sign(&key, data).as_ref().to_vec()
}

/// `time` as SigV4's `YYYYMMDDTHHMMSSZ` (UTC).
pub fn amz_date(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The credential scope, `<day>/<region>/<service>/aws4_request`.
fn scope(credentials: &Credentials, date: &str) -> Result<String, String> {
    let day = date.get(..8).ok_or("a SigV4 date is YYYYMMDDTHHMMSSZ")?;
    Ok(format!(
        "{day}/{}/{}/aws4_request",
        credentials.region, credentials.service
    ))
}

/// The signed header names (`host;x-amz-date`) and the signature of a request of
/// `method` on `url` at `date` that signs `headers` (names in any case, `host`
/// included) and an empty payload.
pub fn signature(
    credentials: &Credentials,
    method: &str,
    url: &str,
    headers: &[(String, String)],
    date: &str,
) -> Result<(String, String), String> {
    let parsed = Url::parse(url)?;
    let mut signed: Vec<(String, String)> = headers
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    signed.sort();
    let canonical_headers: String = signed
        .iter()
        .map(|(name, value)| format!("{name}:{value}\n"))
        .collect();
    let signed_names = signed
        .iter()
        .map(|(name, _)| name.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let path = if parsed.path.is_empty() {
        "/"
    } else {
        parsed.path
    };
    let canonical_request = format!(
        "{method}\n{path}\n{}\n{canonical_headers}\n{signed_names}\n{EMPTY_PAYLOAD_SHA256}",
        canonical_query(parsed.query.unwrap_or_default())
    );
    let scope = scope(credentials, date)?;
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    );
    let mut key = hmac_sha256(
        format!("AWS4{}", credentials.secret_key).as_bytes(),
        date.get(..8).unwrap_or(date).as_bytes(),
    );
    for part in [
        credentials.region.as_str(),
        credentials.service,
        "aws4_request",
    ] {
        key = hmac_sha256(&key, part.as_bytes());
    }
    Ok((
        signed_names,
        hex(&hmac_sha256(&key, string_to_sign.as_bytes())),
    ))
}

/// The headers to send with a request of `method` on `url` at `date` (from
/// [`amz_date`]): `x-amz-date`, `x-amz-content-sha256`, `x-amz-security-token` where
/// there is a session token, and `Authorization`, signing those, `host` and `extra`
/// (such as `range`). `url` must already be encoded as it is sent (see
/// [`super::url::normalise`]).
pub fn sign(
    credentials: &Credentials,
    method: &str,
    url: &str,
    extra: &[(&str, String)],
    date: &str,
) -> Result<Vec<(String, String)>, String> {
    let parsed = Url::parse(url)?;
    let mut headers: Vec<(String, String)> = vec![
        ("x-amz-date".into(), date.to_string()),
        ("x-amz-content-sha256".into(), EMPTY_PAYLOAD_SHA256.into()),
    ];
    if let Some(token) = &credentials.session_token {
        headers.push(("x-amz-security-token".into(), token.clone()));
    }
    let mut signed: Vec<(String, String)> = headers.clone();
    signed.push(("host".into(), parsed.host_header()));
    signed.extend(
        extra
            .iter()
            .map(|(name, value)| (name.to_string(), value.clone())),
    );
    let (signed_names, signature) = signature(credentials, method, url, &signed, date)?;
    let scope = scope(credentials, date)?;
    headers.push((
        "authorization".into(),
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_names}, \
             Signature={signature}",
            credentials.access_key
        ),
    ));
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn authorization(headers: &[(String, String)]) -> &str {
        &headers
            .iter()
            .find(|(n, _)| n == "authorization")
            .unwrap()
            .1
    }

    fn example(service: &'static str, key: &str, secret: &str) -> Credentials {
        Credentials {
            access_key: key.into(),
            secret_key: secret.into(),
            session_token: None,
            region: "us-east-1".into(),
            service,
        }
    }

    fn suite_signature(credentials: &Credentials, url: &str) -> String {
        let headers = [
            ("Host".to_string(), "example.amazonaws.com".to_string()),
            ("X-Amz-Date".to_string(), "20150830T123600Z".to_string()),
        ];
        let (names, sig) =
            signature(credentials, "GET", url, &headers, "20150830T123600Z").unwrap();
        assert_eq!(names, "host;x-amz-date");
        sig
    }

    #[test]
    fn aws_test_suite_vectors() {
        let c = example(
            "service",
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        );
        // AWS's SigV4 test suite: get-vanilla
        assert_eq!(
            suite_signature(&c, "https://example.amazonaws.com/"),
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        // get-vanilla-query-order-key-case
        assert_eq!(
            suite_signature(
                &c,
                "https://example.amazonaws.com/?Param2=value2&Param1=value1"
            ),
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
    }

    /// The S3 documentation's example "GET Object" with a range (signed headers host,
    /// range, x-amz-content-sha256, x-amz-date): exactly the headers `sign` produces.
    #[test]
    fn s3_documentation_get_object_example() {
        let c = example(
            "s3",
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        );
        let headers = sign(
            &c,
            "GET",
            "https://examplebucket.s3.amazonaws.com/test.txt",
            &[("Range", "bytes=0-9".into())],
            "20130524T000000Z",
        )
        .unwrap();
        assert_eq!(
            authorization(&headers),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/\
             aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
        assert!(headers
            .iter()
            .any(|(n, v)| n == "x-amz-date" && v == "20130524T000000Z"));
    }

    #[test]
    fn session_token_is_sent_and_signed() {
        let mut c = example("s3", "ASIAEXAMPLE", "secret");
        c.session_token = Some("token".into());
        let headers = sign(
            &c,
            "HEAD",
            "http://127.0.0.1:9000/b/k",
            &[],
            "20240101T000000Z",
        )
        .unwrap();
        assert!(headers
            .iter()
            .any(|(n, v)| n == "x-amz-security-token" && v == "token"));
        assert!(authorization(&headers)
            .contains("SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token"));
        assert!(!format!("{c:?}").contains("secret"));
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(amz_date(UNIX_EPOCH), "19700101T000000Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_369_353_600); // 2013-05-24
        assert_eq!(amz_date(t), "20130524T000000Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_661); // 2000-02-29 01:01:01
        assert_eq!(amz_date(t), "20000229T010101Z");
        let t = UNIX_EPOCH + Duration::from_secs(4_102_444_799); // 2099-12-31 23:59:59
        assert_eq!(amz_date(t), "20991231T235959Z");
    }
}
