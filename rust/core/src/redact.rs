//! Credentials taken out of text: the passwords, tokens and presigned-URL signatures of
//! every URL in a URL or a message, so that none reaches an exception, a repr or a log.
//! A leaf: the error type and the remote sources both use it, and it uses nothing of
//! the engine.

use std::borrow::Cow;

/// `text` (a URL, or a message that quotes URLs) with the credentials of every URL in
/// it redacted: the password of user info replaced by `***` (`http://user:***@host/`),
/// a user info without password (which may be a token) replaced whole
/// (`http://***@host/`), and the values of a presigned URL's `X-Amz-Signature` and
/// `X-Amz-Security-Token` query parameters replaced by `***`.
pub fn redact(text: &str) -> Cow<'_, str> {
    let user_info = redact_user_info(text);
    match redact_query_secrets(&user_info) {
        Cow::Owned(out) => Cow::Owned(out),
        Cow::Borrowed(_) => user_info,
    }
}

/// The query parameters whose values are credentials (a presigned URL's signature and
/// session token), lower-cased with their `=`.
const SECRET_PARAMETERS: [&str; 2] = ["x-amz-signature=", "x-amz-security-token="];

fn redact_query_secrets(text: &str) -> Cow<'_, str> {
    // ASCII lower-casing keeps byte offsets, so positions found in `lower` hold in `text`.
    let lower = text.to_ascii_lowercase();
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for name in SECRET_PARAMETERS {
        let mut from = 0;
        while let Some(i) = lower[from..].find(name) {
            let start = from + i + name.len();
            let preceded = start - name.len() == 0
                || matches!(lower.as_bytes()[start - name.len() - 1], b'?' | b'&');
            let end = text[start..]
                .find(|c: char| c.is_whitespace() || "&#'\"`<>(){}".contains(c))
                .map_or(text.len(), |j| start + j);
            if preceded && end > start {
                spans.push((start, end));
            }
            from = end.max(start);
        }
    }
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in spans {
        if start < at {
            continue;
        }
        out.push_str(&text[at..start]);
        out.push_str("***");
        at = end;
    }
    out.push_str(&text[at..]);
    Cow::Owned(out)
}

fn redact_user_info(text: &str) -> Cow<'_, str> {
    if !text.contains('@') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut changed = false;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        // The authority ends where a path, query or fragment starts, or where the text
        // around the URL resumes (space, quote, bracket).
        let end = after
            .find(|c: char| c.is_whitespace() || "/?#'\"`<>(){}".contains(c))
            .unwrap_or(after.len());
        let authority = &after[..end];
        match authority.rsplit_once('@') {
            Some((info, host)) => {
                changed = true;
                match info.split_once(':') {
                    Some((user, _)) => out.push_str(&format!("{user}:***@{host}")),
                    None => out.push_str(&format!("***@{host}")),
                }
            }
            None => out.push_str(authority),
        }
        rest = &after[end..];
    }
    if !changed {
        return Cow::Borrowed(text);
    }
    out.push_str(rest);
    Cow::Owned(out)
}
