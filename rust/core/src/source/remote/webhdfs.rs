//! WebHDFS endpoints (Hadoop's HTTP interface): the file's URL, the user name from the
//! URL's `user.name` query or `KVIKIO_WEBHDFS_USERNAME`, ranges as `op=OPEN` queries, and
//! the size from `op=GETFILESTATUS`.

use super::url::{normalise, Url};
use crate::error::{Error, RemoteFailure, Result};

/// A file on WebHDFS.
#[derive(Debug, Clone)]
pub struct WebHdfsFile {
    /// `http(s)://<host>:<port>/webhdfs/v1/<path>`, without query.
    pub url: String,
    /// The user name sent as `user.name`, where there is one.
    pub user: Option<String>,
}

impl WebHdfsFile {
    /// The file at `url` (`http(s)://<host>:<port>/webhdfs/v1/<path>[?user.name=...]`, or
    /// kvikpy's shorthand `webhdfs://<host>:<port>/<path>`).
    pub fn new(url: &str, getenv: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let invalid = |why: String| Error::remote(RemoteFailure::InvalidUrl, url, why);
        let parsed = Url::parse(url).map_err(invalid)?;
        let base = match parsed.scheme.as_str() {
            "webhdfs" => format!("http://{}/webhdfs/v1{}", parsed.authority, parsed.path),
            "http" | "https" => format!("{}://{}{}", parsed.scheme, parsed.authority, parsed.path),
            other => {
                return Err(invalid(format!(
                    "a WebHDFS URL is http(s)://<host>:<port>/webhdfs/v1/<path> or \
                     webhdfs://<host>:<port>/<path>, not {other}://"
                )))
            }
        };
        let user = parsed
            .query
            .and_then(|q| {
                q.split('&')
                    .find_map(|pair| pair.strip_prefix("user.name="))
                    .filter(|name| !name.is_empty())
                    .map(str::to_string)
            })
            .or_else(|| getenv("KVIKIO_WEBHDFS_USERNAME"));
        Ok(Self {
            url: normalise(&base).map_err(invalid)?,
            user,
        })
    }

    fn with_query(&self, op: &str) -> String {
        match &self.user {
            Some(user) => format!("{}?user.name={user}&{op}", self.url),
            None => format!("{}?{op}", self.url),
        }
    }

    /// The URL that reads `len` bytes at `offset`.
    pub fn open_url(&self, offset: u64, len: usize) -> String {
        self.with_query(&format!("op=OPEN&offset={offset}&length={len}"))
    }

    /// The URL of the file's status document.
    pub fn status_url(&self) -> String {
        self.with_query("op=GETFILESTATUS")
    }
}

/// The `"length"` of a `GETFILESTATUS` answer (`{"FileStatus": {"length": 24930, ...}}`).
pub fn length_from_status(json: &str) -> Option<u64> {
    let at = json.find("\"length\"")? + "\"length\"".len();
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    let digits: &str = &rest[..rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len())];
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_user_names() {
        let no_env = |_: &str| None;
        let f = WebHdfsFile::new(
            "http://nn:9870/webhdfs/v1/home/a.bin?op=OPEN&user.name=ann",
            &no_env,
        )
        .unwrap();
        assert_eq!(f.url, "http://nn:9870/webhdfs/v1/home/a.bin");
        assert_eq!(
            f.open_url(8, 16),
            "http://nn:9870/webhdfs/v1/home/a.bin?user.name=ann&op=OPEN&offset=8&length=16"
        );
        let env = |k: &str| (k == "KVIKIO_WEBHDFS_USERNAME").then(|| "bob".to_string());
        let f = WebHdfsFile::new("webhdfs://nn:9870/home/a b.bin", &env).unwrap();
        assert_eq!(
            f.status_url(),
            "http://nn:9870/webhdfs/v1/home/a%20b.bin?user.name=bob&op=GETFILESTATUS"
        );
        let f = WebHdfsFile::new("http://nn:9870/webhdfs/v1/x", &no_env).unwrap();
        assert_eq!(
            f.status_url(),
            "http://nn:9870/webhdfs/v1/x?op=GETFILESTATUS"
        );
        assert!(WebHdfsFile::new("ftp://nn:1/x", &no_env).is_err());
    }

    #[test]
    fn status_lengths() {
        let doc = r#"{"FileStatus":{"accessTime":0,"length" : 24930,"type":"FILE"}}"#;
        assert_eq!(length_from_status(doc), Some(24930));
        assert_eq!(length_from_status(r#"{"length":0}"#), Some(0));
        assert_eq!(length_from_status(r#"{"size":3}"#), None);
        assert_eq!(length_from_status(r#"{"length":"x"}"#), None);
    }
}
