//! `kvikpy.Mmap`'s handle (kvikio's `MmapHandle`): kvikio's rules for which reads a mapped
//! region takes, and its reads submitted through the one request path. The mapping itself
//! is a source ([`crate::source::mmap::MappedFile`]); this handle stands above the request
//! path as [`crate::file::FileHandle`] does.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::file::FileHandle;
use crate::future::IoFuture;
use crate::request::{submit, Completion, Request};
use crate::settings::Settings;
use crate::source::mmap::{MappedFile, Region};
use crate::source::Keepalive;
use crate::span::Span;
use crate::vocab::Direction;

pub use crate::source::mmap::MmapOptions;

/// An open `kvikpy.Mmap`: the mapped file until it is closed, and kvikio's rules for which
/// reads it takes.
#[derive(Debug)]
pub struct MmapHandle {
    file: FileHandle,
    region: Region,
    /// The file's size when it was mapped: kvikio's bound for read offsets.
    size_at_open: u64,
}

impl MmapHandle {
    /// Open `path` read-only (`flags` `"r"` or `"rb"`) and map the region `options` asks
    /// for: [`Error::Os`] (`open`) when the file cannot be opened, [`Error::OutOfRange`] or
    /// [`Error::InvalidArgument`] (kvikio's `out_of_range` and `invalid_argument`) for a
    /// region the file does not hold, [`Error::Os`] when `mmap` fails.
    pub fn open(path: impl AsRef<Path>, flags: &str, options: MmapOptions) -> Result<Self> {
        let (source, size_at_open) = MappedFile::map(path.as_ref(), flags, options)?;
        let region = source.region();
        let reason = format!(
            "kvikpy.Mmap maps bytes {}..{} of the file",
            region.offset,
            region.end()
        );
        Ok(Self {
            file: FileHandle::from_source(Arc::new(source), reason),
            region,
            size_at_open,
        })
    }

    /// The size of the mapped region; 0 once closed (as kvikio).
    pub fn initial_map_size(&self) -> u64 {
        if self.is_closed() {
            0
        } else {
            self.region.size
        }
    }

    /// The file offset of the mapped region; 0 once closed (as kvikio).
    pub fn initial_map_offset(&self) -> u64 {
        if self.is_closed() {
            0
        } else {
            self.region.offset
        }
    }

    /// The file's current size; 0 once closed (as kvikio).
    pub fn file_size(&self) -> Result<u64> {
        match self.file.get() {
            Ok(source) => source.size(),
            Err(_) => Ok(0),
        }
    }

    /// The path given to [`MmapHandle::open`].
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Unmap and close. Idempotent; reads in flight finish on their own reference.
    pub fn close(&self) {
        self.file.close();
    }

    /// Whether [`MmapHandle::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.file.is_closed()
    }

    /// kvikio's checks of a read of `size` bytes (`None`: to the end of the file) at
    /// `offset`, and the count it reads: [`Error::MmapClosed`] once closed, else
    /// [`Error::OutOfRange`] for an offset past the end of the file (as it was when
    /// mapped) or a range outside the mapped region.
    pub fn check_read(&self, size: Option<u64>, offset: u64) -> Result<u64> {
        if self.is_closed() {
            return Err(Error::MmapClosed(self.path().to_path_buf()));
        }
        if offset > self.size_at_open {
            return Err(Error::OutOfRange(format!(
                "Offset is past the end of file: offset {offset}, file size {}; read at an \
                 offset of at most {}",
                self.size_at_open, self.size_at_open
            )));
        }
        let size = size.unwrap_or(self.size_at_open - offset);
        let (start, end) = (self.region.offset, self.region.end());
        if offset < start || offset.checked_add(size).is_none_or(|e| e > end) {
            return Err(Error::OutOfRange(format!(
                "Read is out of bound: offset {offset} and size {size} ask for bytes \
                 {offset}..{} of the file, but only {start}..{end} are mapped \
                 (initial_map_offset {start}, initial_map_size {}); read inside that range \
                 or map one that covers the read",
                offset.saturating_add(size),
                self.region.size
            )));
        }
        Ok(size)
    }

    /// Read into `span` (sized by [`MmapHandle::check_read`]) from `offset`, completed as
    /// `completion` asks, through the one request path; the span must be filled, so a
    /// file that shrank since it was mapped is an [`Error::Truncated`].
    pub fn submit(
        &self,
        settings: &Settings,
        span: Span,
        offset: u64,
        task_size: Option<usize>,
        keepalive: Keepalive,
        completion: Completion,
    ) -> Result<IoFuture> {
        let request = Request {
            direction: Direction::Read,
            span,
            file_offset: offset,
            task_size,
            exact: true,
            keepalive,
        };
        submit(settings, &self.file, request, completion).map_err(|e| match e {
            Error::Closed => Error::MmapClosed(self.path().to_path_buf()),
            e => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::HostSpan;
    use proptest::prelude::*;
    use std::io;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn options(size: Option<u64>, offset: u64) -> MmapOptions {
        MmapOptions {
            initial_map_size: size,
            initial_map_offset: offset,
            map_flags: None,
        }
    }

    /// Read `size` at `offset` through the request path into a fresh buffer.
    fn read(
        handle: &MmapHandle,
        size: Option<u64>,
        offset: u64,
        completion: Completion,
    ) -> Result<Vec<u8>> {
        let settings = crate::settings::current()?;
        let n = handle.check_read(size, offset)? as usize;
        let mut out = vec![0u8; n];
        let span = Span::Host(HostSpan::from_slice(&mut out));
        let got = handle
            .submit(&settings, span, offset, Some(4096), None, completion)?
            .wait()?;
        assert_eq!(got, n);
        Ok(out)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn reads_inside_the_region_match_the_file(
            len in 1usize..40_000,
            region in (0.0f64..1.0, 0.0f64..1.0),
            read in (0.0f64..1.0, 0.0f64..1.0),
            flags in prop::sample::select(vec![
                None,
                Some(i64::from(libc::MAP_SHARED)),
                Some(i64::from(libc::MAP_SHARED | libc::MAP_POPULATE)),
            ]),
            future in any::<bool>(),
        ) {
            let data = pattern(len);
            let (_dir, path) = file_with(&data);
            let map_offset = (region.0 * len as f64) as u64 % len as u64;
            let map_size = 1 + (region.1 * (len as u64 - map_offset - 1) as f64) as u64;
            let mut opts = options(Some(map_size), map_offset);
            opts.map_flags = flags;
            let handle = MmapHandle::open(&path, "r", opts).unwrap();
            let offset = map_offset + (read.0 * map_size as f64) as u64 % map_size;
            let size = (read.1 * (map_offset + map_size - offset) as f64) as u64;
            let completion = if future { Completion::Future } else { Completion::Blocking };
            let got = read_fn(&handle, Some(size), offset, completion).unwrap();
            let start = offset as usize;
            prop_assert_eq!(&got[..], &data[start..start + size as usize]);
            // One byte past the region either side is refused.
            let past = read_fn(&handle, Some(size + 1), offset + map_size - size, completion);
            prop_assert!(matches!(past, Err(Error::OutOfRange(_))), "{:?}", past);
            if map_offset > 0 {
                let before = read_fn(&handle, Some(1), map_offset - 1, completion);
                prop_assert!(matches!(before, Err(Error::OutOfRange(_))), "{:?}", before);
            }
        }
    }

    // proptest's macro shadows `read` with the strategy's name inside the test body.
    fn read_fn(h: &MmapHandle, s: Option<u64>, o: u64, c: Completion) -> Result<Vec<u8>> {
        read(h, s, o, c)
    }

    #[test]
    fn the_default_maps_the_whole_file_and_reads_it_all() {
        let data = pattern(3 * 4096 + 17);
        let (_dir, path) = file_with(&data);
        let handle = MmapHandle::open(&path, "r", MmapOptions::default()).unwrap();
        assert_eq!(handle.initial_map_size(), data.len() as u64);
        assert_eq!(handle.initial_map_offset(), 0);
        assert_eq!(handle.file_size().unwrap(), data.len() as u64);
        assert_eq!(read(&handle, None, 0, Completion::Blocking).unwrap(), data);
        assert_eq!(
            read(&handle, None, 100, Completion::Future).unwrap(),
            &data[100..]
        );
        assert_eq!(
            read(&handle, Some(0), data.len() as u64, Completion::Blocking).unwrap(),
            b""
        );
    }

    #[test]
    fn region_errors_follow_kvikio() {
        let (_dir, path) = file_with(&pattern(1000));
        let open = |size, offset| MmapHandle::open(&path, "r", options(size, offset));
        assert!(
            matches!(open(None, 1000), Err(Error::OutOfRange(m)) if m.starts_with("Offset must be less"))
        );
        assert!(
            matches!(open(Some(1001), 0), Err(Error::OutOfRange(m)) if m.starts_with("Mapped region is past"))
        );
        assert!(matches!(open(Some(2), 999), Err(Error::OutOfRange(_))));
        assert!(matches!(open(Some(u64::MAX), 1), Err(Error::OutOfRange(_))));
        assert!(
            matches!(open(Some(0), 0), Err(Error::InvalidArgument(m)) if m.starts_with("Mapped region should not be zero"))
        );
        let h = open(Some(100), 500).unwrap();
        assert!(
            matches!(h.check_read(Some(1), 1001), Err(Error::OutOfRange(m)) if m.starts_with("Offset is past"))
        );
        assert!(
            matches!(h.check_read(Some(100), 501), Err(Error::OutOfRange(m)) if m.starts_with("Read is out of bound"))
        );
        assert!(matches!(h.check_read(None, 500), Err(Error::OutOfRange(_))));
        assert!(matches!(
            h.check_read(Some(u64::MAX), 500),
            Err(Error::OutOfRange(_))
        ));
        assert_eq!(h.check_read(Some(0), 500).unwrap(), 0);
        assert_eq!(h.check_read(Some(0), 600).unwrap(), 0);
        assert_eq!(h.check_read(Some(100), 500).unwrap(), 100);
    }

    #[test]
    fn flags_and_map_flags_are_checked() {
        let (_dir, path) = file_with(&pattern(10));
        for bad in ["", "z", "x"] {
            let e = MmapHandle::open(&path, bad, MmapOptions::default()).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidArgument(m) if m.starts_with("Unknown file open flag")),
                "{bad}: {e}"
            );
        }
        for write in ["w", "w+", "a", "r+"] {
            let e = MmapHandle::open(&path, write, MmapOptions::default()).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidArgument(m) if m.contains("write is not supported")),
                "{write}: {e}"
            );
        }
        assert!(MmapHandle::open(&path, "rb", MmapOptions::default()).is_ok());
        let with = |flags: i64| {
            let o = MmapOptions {
                map_flags: Some(flags),
                ..Default::default()
            };
            MmapHandle::open(&path, "r", o)
        };
        for bad in [
            0,
            libc::MAP_POPULATE.into(),
            (libc::MAP_PRIVATE | libc::MAP_FIXED).into(),
            (libc::MAP_SHARED | libc::MAP_ANONYMOUS).into(),
            1 << 40,
            -1,
        ] {
            assert!(
                matches!(with(bad), Err(Error::InvalidArgument(_))),
                "{bad:#x}"
            );
        }
        assert!(with(libc::MAP_SHARED_VALIDATE.into()).is_ok());
        assert!(with((libc::MAP_PRIVATE | libc::MAP_NORESERVE).into()).is_ok());
    }

    #[test]
    fn an_empty_file_maps_nothing_and_reads_nothing() {
        let (_dir, path) = file_with(b"");
        let h = MmapHandle::open(&path, "r", MmapOptions::default()).unwrap();
        assert_eq!((h.initial_map_size(), h.file_size().unwrap()), (0, 0));
        assert_eq!(read(&h, None, 0, Completion::Blocking).unwrap(), b"");
        assert_eq!(read(&h, None, 0, Completion::Future).unwrap(), b"");
        assert!(matches!(
            h.check_read(Some(1), 0),
            Err(Error::OutOfRange(_))
        ));
        assert!(matches!(h.check_read(None, 1), Err(Error::OutOfRange(_))));
        assert!(MmapHandle::open(&path, "r", options(Some(0), 0)).is_ok());
        assert!(matches!(
            MmapHandle::open(&path, "r", options(Some(1), 0)),
            Err(Error::OutOfRange(_))
        ));
        assert!(matches!(
            MmapHandle::open(&path, "r", options(None, 1)),
            Err(Error::OutOfRange(_))
        ));
    }

    #[test]
    fn open_failures_and_closed_handles() {
        let dir = tempfile::tempdir().unwrap();
        match MmapHandle::open(dir.path().join("missing"), "r", MmapOptions::default()) {
            Err(Error::Os {
                op: "open", source, ..
            }) => {
                assert_eq!(source.kind(), io::ErrorKind::NotFound)
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            MmapHandle::open(dir.path(), "r", MmapOptions::default()),
            Err(Error::Os { op: "open", .. })
        ));
        let (_d, path) = file_with(&pattern(5000));
        let h = MmapHandle::open(&path, "r", options(Some(4000), 1000)).unwrap();
        let settings = crate::settings::current().unwrap();
        let mut out = vec![0u8; 10];
        h.close();
        h.close();
        assert!(h.is_closed());
        assert_eq!(
            (
                h.initial_map_size(),
                h.initial_map_offset(),
                h.file_size().unwrap()
            ),
            (0, 0, 0)
        );
        assert!(matches!(
            h.check_read(Some(10), 1000),
            Err(Error::MmapClosed(_))
        ));
        let span = Span::Host(HostSpan::from_slice(&mut out));
        let e = h.submit(&settings, span, 1000, None, None, Completion::Blocking);
        assert!(matches!(e, Err(Error::MmapClosed(_))));
    }

    #[test]
    fn a_file_truncated_after_mapping_is_an_error_not_a_crash() {
        let page = crate::source::page_size();
        let data = pattern(4 * page);
        let (_dir, path) = file_with(&data);
        for flags in [libc::MAP_PRIVATE, libc::MAP_SHARED] {
            std::fs::write(&path, &data).unwrap();
            let o = MmapOptions {
                map_flags: Some(flags.into()),
                ..Default::default()
            };
            let h = MmapHandle::open(&path, "r", o).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(page as u64)
                .unwrap();
            // The copy reaches the pages that no longer exist: the kernel says EFAULT.
            let mut out = vec![0u8; 2 * page];
            let source = h.file.get().unwrap();
            let settings = crate::settings::current().unwrap();
            let n = source
                .read_host(HostSpan::from_slice(&mut out), 0, &settings)
                .unwrap();
            assert_eq!(n, page);
            assert_eq!(&out[..page], &data[..page]);
            let e = read(&h, Some(2 * page as u64), 0, Completion::Blocking).unwrap_err();
            assert!(matches!(e, Error::Truncated(_)), "{e:?}");
            let e = read(&h, Some(2 * page as u64), 0, Completion::Future).unwrap_err();
            assert!(matches!(e, Error::Truncated(_)), "{e:?}");
        }
    }
}
