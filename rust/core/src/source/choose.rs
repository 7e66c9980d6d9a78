//! The one place where the source for a path is chosen: every source's opener, in order.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;

use super::base::{Source, Target};
#[cfg(doc)]
use super::URL_SCHEMES;
use super::{cufile, posix, remote};
use crate::error::{Error, Result};
use crate::settings::Settings;
use crate::vocab::OpenFlags;

/// A source opened by [`open`], with which source it is and why it was chosen.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The source.
    pub source: Arc<dyn Source>,
    /// Why this source reads the file (`"compat_mode is AUTO and cuFile refused the
    /// file: ..."`).
    pub reason: String,
}

/// A source's constructor: `None` when the source does not take this target (another
/// one is tried), else the opened source or the error that stops the open.
pub type Opener = fn(&Target<'_>) -> Option<Result<Arc<dyn Source>>>;

/// Every source, in the order a path is offered to them; the first that takes it opens
/// it. Remote files take URLs only, so they come first; POSIX takes every local path, so
/// it comes last.
pub const OPENERS: &[Opener] = &[remote::open, cufile::open, posix::open];

/// Open `path` with `flags`: the first source of [`OPENERS`] that takes it, and why.
pub fn open(path: &Path, flags: OpenFlags, settings: &Settings) -> Result<Opened> {
    let notes = RefCell::new(Vec::new());
    let target = Target {
        path,
        flags,
        compat_mode: settings.compat_mode,
        notes: &notes,
    };
    let source = OPENERS
        .iter()
        .find_map(|open| open(&target))
        .unwrap_or_else(|| {
            Err(Error::InvalidArgument(format!(
                "no source can open '{}'",
                path.display()
            )))
        })?;
    let notes = notes.into_inner();
    let reason = if notes.is_empty() {
        format!("the {} source takes every local path", source.name())
    } else {
        notes.join("; ")
    };
    Ok(Opened { source, reason })
}

/// Whether `path` is a URL that a remote source reads (`http`, `https`, `s3`, `webhdfs`;
/// see [`URL_SCHEMES`]) rather than a local path.
pub fn is_remote(path: &Path) -> bool {
    remote::as_url(path).is_some()
}

/// Open `path` for reading, read-only, as [`open`] does, where the caller may know its size
/// already (a batch element it sized): a URL then opens without asking its server again.
/// A URL's size is asked of its server otherwise (`nbytes` of `None`), under `settings`.
/// A URL opened with its size is pinned to `version`, the one it was sized at (see
/// [`super::Source::version`]), where it had one.
pub fn open_sized(
    path: &Path,
    nbytes: Option<u64>,
    version: Option<&str>,
    settings: &Settings,
) -> Result<Arc<dyn Source>> {
    match remote::as_url(path) {
        Some(url) => remote::open_sized(url, nbytes, version, settings),
        None => Ok(open(path, OpenFlags::READ_ONLY, settings)?.source),
    }
}
