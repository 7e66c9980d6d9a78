//! Which certificate authorities HTTPS requests trust: the public roots (Mozilla's, built
//! in) unless a CA bundle is configured, by the `http_ca_bundle` setting or the
//! conventional environment variables, and one HTTP agent per configuration (agents are
//! cached, so a changed setting or variable applies to the files opened after it).
//!
//! The first of these that is set (and not empty) names the bundle:
//!
//! 1. the `http_ca_bundle` setting (`KVIKPY_HTTP_CA_BUNDLE`);
//! 2. for S3 endpoints, `AWS_CA_BUNDLE` (as the AWS SDKs and CLI);
//! 3. `CURL_CA_BUNDLE` (libcurl's, which kvikio reads first);
//! 4. `REQUESTS_CA_BUNDLE` (Python requests');
//! 5. `SSL_CERT_FILE` and `SSL_CERT_DIR` (OpenSSL's; both where both are set, the
//!    directories separated by `:`).
//!
//! A configured bundle replaces the public roots, as it does for curl, OpenSSL, the AWS
//! SDKs and requests: it must hold every CA the servers read need. A bundle is a PEM file
//! of certificates, or a directory whose files are (files without a certificate are
//! skipped, as OpenSSL's hashed links and other files may sit beside them). A bundle that
//! cannot be read, or that holds no certificate, is an error naming the file and where it
//! was named.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use ureq::tls::{parse_pem, Certificate, PemItem, RootCerts, TlsConfig};
use ureq::Agent;

use crate::error::{Error, Result};
use crate::fork::ForkLocal;

/// A CA bundle's path and what named it (`"SSL_CERT_FILE"`, `"the http_ca_bundle
/// setting"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaSource {
    /// The file or directory.
    pub path: PathBuf,
    /// The setting or variable that named it, for messages.
    pub named_by: &'static str,
}

/// The name of the setting's origin in messages.
pub const SETTING: &str = "the http_ca_bundle setting (KVIKPY_HTTP_CA_BUNDLE)";

/// The CA bundles HTTPS requests of an endpoint trust (empty: the public roots), from
/// the `http_ca_bundle` setting (`setting`) or the variables `getenv` finds; `s3` for S3
/// endpoints, which also honour `AWS_CA_BUNDLE`.
pub fn choose(
    setting: Option<&Path>,
    s3: bool,
    getenv: &dyn Fn(&str) -> Option<String>,
) -> Vec<CaSource> {
    if let Some(path) = setting.filter(|p| !p.as_os_str().is_empty()) {
        return vec![CaSource {
            path: path.to_path_buf(),
            named_by: SETTING,
        }];
    }
    let var = |name: &'static str| {
        getenv(name).filter(|v| !v.is_empty()).map(|v| CaSource {
            path: PathBuf::from(v),
            named_by: name,
        })
    };
    let single: &[&'static str] = if s3 {
        &["AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE"]
    } else {
        &["CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE"]
    };
    if let Some(source) = single.iter().find_map(|&name| var(name)) {
        return vec![source];
    }
    let mut sources: Vec<CaSource> = var("SSL_CERT_FILE").into_iter().collect();
    if let Some(dirs) = getenv("SSL_CERT_DIR") {
        sources.extend(dirs.split(':').filter(|d| !d.is_empty()).map(|d| CaSource {
            path: PathBuf::from(d),
            named_by: "SSL_CERT_DIR",
        }));
    }
    sources
}

/// The largest CA bundle file read (a system bundle is about 200 KiB).
const MAX_BUNDLE_BYTES: u64 = 64 << 20;

fn unusable(source: &CaSource, why: impl std::fmt::Display) -> Error {
    let remedy = if source.named_by == SETTING {
        "set http_ca_bundle to a PEM file (or directory) of CA certificates, or to None \
         for the public roots (kvikpy.defaults.set('http_ca_bundle', path))"
            .to_string()
    } else {
        format!(
            "point {} at a PEM file of CA certificates, or unset it",
            source.named_by
        )
    };
    Error::Config(format!(
        "the CA bundle '{}' named by {} cannot be used to verify HTTPS servers: {why}; \
         {remedy}",
        source.path.display(),
        source.named_by
    ))
}

/// The certificates of the PEM file `path` (of `source`); empty where it holds none.
fn certificates_in(path: &Path, source: &CaSource) -> Result<Vec<Certificate<'static>>> {
    let len = std::fs::metadata(path)
        .map_err(|e| unusable(source, e))?
        .len();
    if len > MAX_BUNDLE_BYTES {
        return Err(unusable(
            source,
            format!("it is {len} bytes, more than a CA bundle's 64 MiB"),
        ));
    }
    let pem = std::fs::read(path).map_err(|e| unusable(source, e))?;
    let mut certs = Vec::new();
    for item in parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(cert)) => certs.push(cert),
            Ok(_) => {}
            Err(e) => {
                return Err(unusable(
                    source,
                    format!("'{}' is not valid PEM ({e})", path.display()),
                ))
            }
        }
    }
    Ok(certs)
}

/// Every certificate `sources` name.
pub fn load(sources: &[CaSource]) -> Result<Vec<Certificate<'static>>> {
    let mut all = Vec::new();
    for source in sources {
        let meta = std::fs::metadata(&source.path).map_err(|e| unusable(source, e))?;
        let before = all.len();
        if meta.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(&source.path)
                .map_err(|e| unusable(source, e))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            for file in files {
                // Other files may sit beside the certificates of a directory.
                if let Ok(certs) = certificates_in(&file, source) {
                    all.extend(certs);
                }
            }
        } else {
            all.extend(certificates_in(&source.path, source)?);
        }
        if all.len() == before {
            return Err(unusable(
                source,
                "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            ));
        }
    }
    Ok(all)
}

/// What identifies a configuration's agent: the sources and, for each, its
/// modification time and size (a bundle rewritten in place is read again).
type Key = Vec<(PathBuf, Option<SystemTime>, u64)>;

fn key(sources: &[CaSource]) -> Key {
    sources
        .iter()
        .map(|s| {
            let meta = std::fs::metadata(&s.path).ok();
            (
                s.path.clone(),
                meta.as_ref().and_then(|m| m.modified().ok()),
                meta.map_or(0, |m| m.len()),
            )
        })
        .collect()
}

/// The agent's settings but trust: idle connections kept for reuse (up to 64 per host,
/// more than the I/O pool has threads), no redirect followed by ureq (kvikpy's request
/// loop follows them, so that no credential reaches another host), proxies from the
/// usual environment variables, and HTTP error statuses handed back as responses so
/// that the retry rule sees them.
fn build(tls: Option<TlsConfig>) -> Agent {
    let mut config = Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_connections(256)
        .max_idle_connections_per_host(64)
        .user_agent(concat!("kvikpy/", env!("CARGO_PKG_VERSION")));
    if let Some(tls) = tls {
        config = config.tls_config(tls);
    }
    // Connections that notice cancellation while they wait (see `interrupt`).
    super::interrupt::agent(config.build())
}

/// The agent that trusts the public roots, and those of configured CA bundles. A forked
/// child makes its own (see [`forget_in_child`]): the parent's idle connections are
/// sockets the parent still uses, and a pool's lock may be held by a thread that does not
/// exist in the child.
static PUBLIC: ForkLocal<Agent> = ForkLocal::new(|| build(None));
static CONFIGURED: ForkLocal<Mutex<Vec<(Key, Agent)>>> = ForkLocal::new(|| Mutex::new(Vec::new()));

/// In a forked child: forget the parent's agents and their connections (leaked, never
/// closed: closing would end the parent's connections too). Async-signal-safe.
pub(crate) fn forget_in_child() {
    PUBLIC.forget();
    CONFIGURED.forget();
}

/// The most agents kept for CA configurations (each holds its idle connections).
const MAX_AGENTS: usize = 8;

/// The agent whose HTTPS requests trust `sources` (the public roots where empty).
pub fn agent(sources: &[CaSource]) -> Result<Agent> {
    if sources.is_empty() {
        return Ok(PUBLIC.get().clone());
    }
    let key = key(sources);
    let mut agents = CONFIGURED.get().lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, agent)) = agents.iter().find(|(k, _)| *k == key) {
        return Ok(agent.clone());
    }
    let certs = load(sources)?;
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::new_with_certs(&certs))
        .build();
    let agent = build(Some(tls));
    if agents.len() >= MAX_AGENTS {
        agents.remove(0);
    }
    agents.push((key, agent.clone()));
    Ok(agent)
}

/// The agent for requests to `url` of an endpoint (`s3` for S3 ones) under `setting`
/// (the `http_ca_bundle` setting): plain `http://` URLs get the public one without
/// looking at the CA configuration.
pub fn agent_for(url: &str, s3: bool, setting: Option<&Path>) -> Result<Agent> {
    let https = url
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"));
    if !https {
        return agent(&[]);
    }
    agent(&choose(setting, s3, &|name| std::env::var(name).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::remote::test_env as env;

    fn named(sources: &[CaSource]) -> Vec<(&str, &str)> {
        sources
            .iter()
            .map(|s| (s.path.to_str().unwrap(), s.named_by))
            .collect()
    }

    #[test]
    fn precedence_setting_aws_curl_requests_openssl() {
        let all = env(&[
            ("AWS_CA_BUNDLE", "/aws"),
            ("CURL_CA_BUNDLE", "/curl"),
            ("REQUESTS_CA_BUNDLE", "/req"),
            ("SSL_CERT_FILE", "/file"),
            ("SSL_CERT_DIR", "/d1:/d2"),
        ]);
        let setting = Some(Path::new("/set"));
        assert_eq!(named(&choose(setting, true, &all)), [("/set", SETTING)]);
        assert_eq!(
            named(&choose(None, true, &all)),
            [("/aws", "AWS_CA_BUNDLE")]
        );
        assert_eq!(
            named(&choose(None, false, &all)),
            [("/curl", "CURL_CA_BUNDLE")]
        );
        let openssl = env(&[
            ("AWS_CA_BUNDLE", "/aws"),
            ("CURL_CA_BUNDLE", ""),
            ("SSL_CERT_FILE", "/file"),
            ("SSL_CERT_DIR", "/d1::/d2"),
        ]);
        assert_eq!(
            named(&choose(None, false, &openssl)),
            [
                ("/file", "SSL_CERT_FILE"),
                ("/d1", "SSL_CERT_DIR"),
                ("/d2", "SSL_CERT_DIR")
            ]
        );
        assert!(choose(None, true, &env(&[])).is_empty());
        assert!(choose(Some(Path::new("")), false, &env(&[])).is_empty());
    }

    #[test]
    fn unusable_bundles_name_file_and_origin() {
        let dir = tempfile::tempdir().unwrap();
        let missing = CaSource {
            path: dir.path().join("missing.pem"),
            named_by: "SSL_CERT_FILE",
        };
        let err = load(std::slice::from_ref(&missing))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("missing.pem") && err.contains("SSL_CERT_FILE"),
            "{err}"
        );
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate").unwrap();
        let source = CaSource {
            path: garbage,
            named_by: SETTING,
        };
        let err = load(&[source]).unwrap_err().to_string();
        assert!(
            err.contains("garbage.pem") && err.contains("no PEM certificate"),
            "{err}"
        );
        let empty_dir = CaSource {
            path: dir.path().to_path_buf(),
            named_by: "SSL_CERT_DIR",
        };
        assert!(load(&[empty_dir]).is_err());
    }
}
