//! What a read of an open file covers: its range checked against the file's size, and
//! files whose size says nothing of their end (devices, pipes, `/proc` and `/sys`
//! pseudo-files) read the one way they can be; and the shape a range's items take.

use crate::source::{unsized_file, Source};
use crate::{Error, Result, Settings};

/// The most bytes a read to the end takes of a file that reports a size of 0 (a `/proc`
/// or `/sys` pseudo-file) before it refuses: such files are small, and one that goes on
/// is no file to read whole (`/proc/self/pagemap`).
pub const UNSIZED_LIMIT: usize = 64 << 20;

/// What a read asks of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// Where the range starts, in bytes from the start of the file.
    pub offset: u64,
    /// How many bytes; `None` reads to the end.
    pub size: Option<u64>,
    /// `true`: a range past the end is an error (`kvikpy.read`); `false`: it is cut to
    /// what the file has (`numpy.fromfile`'s `count`).
    pub strict: bool,
    /// The bytes go to a GPU: a pseudo-file, which must be read to its end to be sized,
    /// is refused there.
    pub device: bool,
}

/// What the file holds for a [`Want`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extent {
    /// `size` bytes from the offset, all there (the file was sized).
    Sized(u64),
    /// Up to `size` bytes from the offset of a file with no size (a device, a pipe, a
    /// pseudo-file given a size): read them, and the file may end first.
    Open(u64),
    /// The range's bytes of a pseudo-file, already read to its end.
    Content(Vec<u8>),
}

impl Extent {
    /// The bytes the read covers (at most, for [`Extent::Open`]).
    pub fn size(&self) -> u64 {
        match self {
            Extent::Sized(n) | Extent::Open(n) => *n,
            Extent::Content(bytes) => bytes.len() as u64,
        }
    }
}

/// Size `want` against `source`: a regular file by its size; a file that reports 0 bytes
/// but is a device or pipe, or yields bytes (a pseudo-file), the way it can be read.
/// `name` is the path as the caller gave it, for messages.
pub fn extent(
    source: &(dyn Source + 'static),
    want: Want,
    name: &str,
    settings: &Settings,
) -> Result<Extent> {
    let file_size = source.size()?;
    if file_size != 0 || source.zero_size_is_empty() || !source.flags().readable {
        return cut(None, file_size, want, name);
    }
    let special = source.special_kind()?;
    if special.is_none() && !source.zero_but_yields(settings)? {
        return cut(None, 0, want, name); // an empty file
    }
    if let Some(size) = want.size {
        return Ok(Extent::Open(size));
    }
    if let Some(kind) = special {
        return Err(endless(name, kind));
    }
    if want.device {
        return Err(unsized_file(source.path(), "a device read"));
    }
    let whole = source.read_to_end(UNSIZED_LIMIT, settings)?;
    if whole.len() > UNSIZED_LIMIT {
        return Err(unbounded(name));
    }
    let file_size = whole.len() as u64;
    cut(Some(whole), file_size, want, name)
}

/// The range of `want` in a file of `file_size` bytes (whose bytes are `content` where
/// it was read whole), checked or cut as `want.strict` says.
fn cut(content: Option<Vec<u8>>, file_size: u64, want: Want, name: &str) -> Result<Extent> {
    let Want { offset, size, .. } = want;
    let size = match size {
        None if offset > file_size && want.strict => {
            return Err(Error::InvalidArgument(format!(
                "offset {offset} is past the end of '{name}', which has {file_size} bytes; \
                 pass an offset of at most {file_size}"
            )))
        }
        None => file_size.saturating_sub(offset),
        Some(size) => {
            let end = offset.checked_add(size).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "the range of {size} bytes at offset {offset} ends past 2**64"
                ))
            })?;
            if end > file_size && want.strict {
                return Err(Error::InvalidArgument(format!(
                    "bytes [{offset}, {end}) reach past the end of '{name}', which has \
                     {file_size} bytes; pass size={} or less (or leave size out to read to \
                     the end)",
                    file_size.saturating_sub(offset)
                )));
            }
            size.min(file_size.saturating_sub(offset))
        }
    };
    Ok(match content {
        Some(mut bytes) => {
            // Within the file: `size` was cut to what lies past `offset`.
            let start = offset.min(file_size) as usize;
            bytes.truncate(start + size as usize);
            bytes.drain(..start);
            Extent::Content(bytes)
        }
        None => Extent::Sized(size),
    })
}

/// The error for reading a device or pipe (`kind`) to its end.
fn endless(name: &str, kind: &str) -> Error {
    Error::InvalidArgument(format!(
        "'{name}' is {kind}: it has no size and may never end, so it cannot be read to its \
         end; pass size= (count= for numpy.fromfile) to read that many bytes"
    ))
}

/// The error for a pseudo-file that went on past [`UNSIZED_LIMIT`].
fn unbounded(name: &str) -> Error {
    Error::InvalidArgument(format!(
        "'{name}' reports a size of 0 bytes and did not end within {UNSIZED_LIMIT} bytes \
         ({} MiB, kvikpy's bound for reading such a file to its end); pass size= (count= \
         for numpy.fromfile) to read that many bytes",
        UNSIZED_LIMIT >> 20
    ))
}

/// The error for a read of `size` bytes at `offset` of a file with no size that ended
/// after `got` of them.
pub fn ended_early(name: &str, offset: u64, size: u64, got: u64) -> Error {
    Error::InvalidArgument(format!(
        "bytes [{offset}, {}) reach past the end of '{name}', which ended after {} bytes; \
         pass size={got} or less",
        offset.saturating_add(size),
        offset.saturating_add(got)
    ))
}

/// The dimensions of `size` bytes of items of `itemsize` bytes (named `item` in
/// messages): `dims` as given, one `-1` inferred (as numpy's `reshape` does), or all the
/// items in one dimension (`None`). Dimensions are checked: none below -1, one -1 at most.
pub fn fit_shape(dims: Option<&[i64]>, size: u64, itemsize: usize, item: &str) -> Result<Vec<i64>> {
    let itemsize = itemsize.max(1) as u64;
    let (items, rest) = (size / itemsize, size % itemsize);
    let shown = |dims: &[i64]| tuple(dims);
    let Some(dims) = dims else {
        if rest != 0 {
            return Err(Error::InvalidArgument(format!(
                "{size} bytes are not a whole number of {item} items ({itemsize} bytes each); \
                 pass a size that is a multiple of {itemsize}"
            )));
        }
        return i64::try_from(items)
            .map(|n| vec![n])
            .map_err(|_| Error::InvalidArgument(format!("{items} items exceed 2**63 - 1")));
    };
    let mut dims = dims.to_vec();
    if let Some(at) = dims.iter().position(|&d| d == -1) {
        let known = dims
            .iter()
            .filter(|&&d| d != -1)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        match known {
            Some(known) if known != 0 && rest == 0 && items % known == 0 => {
                dims[at] = i64::try_from(items / known).map_err(|_| {
                    Error::InvalidArgument(format!("{items} items exceed 2**63 - 1"))
                })?;
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "shape {} of {item} cannot cover the range's {size} bytes ({items} whole \
                     items): the other dimensions multiply to {}; pass a shape whose -1 \
                     works out to a whole number of items",
                    shown(&dims),
                    known.map_or_else(|| "more than 2**64".to_owned(), |k| k.to_string())
                )))
            }
        }
    }
    let needed = dims
        .iter()
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d as u64));
    if needed != Some(size) {
        return Err(Error::InvalidArgument(format!(
            "shape {} of {item} needs {} bytes, but the range has {size}; pass a shape of \
             {items} items in all (or -1 for one dimension), or size={}",
            shown(&dims),
            needed.map_or_else(|| "more than 2**64".to_owned(), |n| n.to_string()),
            needed.map_or_else(|| "a smaller shape".to_owned(), |n| n.to_string()),
        )));
    }
    Ok(dims)
}

/// `dims` as Python writes a tuple: `(3,)`, `(2, 3)`, `()`.
fn tuple(dims: &[i64]) -> String {
    match dims {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            dims.iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::HostSpan;
    use proptest::prelude::*;

    #[test]
    fn shapes_fit_as_numpy_reshapes_them() {
        assert_eq!(fit_shape(None, 12, 4, "int32").unwrap(), vec![3]);
        assert_eq!(fit_shape(Some(&[-1, 2]), 16, 2, "f2").unwrap(), vec![4, 2]);
        assert_eq!(fit_shape(Some(&[2, 3]), 24, 4, "f4").unwrap(), vec![2, 3]);
        assert_eq!(fit_shape(Some(&[]), 1, 1, "u1").unwrap(), Vec::<i64>::new());
        let e = fit_shape(None, 13, 4, "int32").unwrap_err().to_string();
        assert!(e.contains("not a whole number of int32 items"), "{e}");
        let e = fit_shape(Some(&[3, 3]), 24, 4, "f4")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("shape (3, 3) of f4 needs 36 bytes, but the range has 24"),
            "{e}"
        );
        let e = fit_shape(Some(&[0, -1]), 8, 1, "u1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiply to 0"), "{e}");
        let e = fit_shape(Some(&[i64::MAX, i64::MAX]), 8, 1, "u1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 2**64"), "{e}");
    }

    /// A source that reports 0 bytes and yields `fill` forever (or `len` bytes of it), or
    /// a device of `kind`.
    #[derive(Debug)]
    struct Endless {
        len: Option<u64>,
        kind: Option<&'static str>,
    }

    impl Source for Endless {
        fn name(&self) -> &'static str {
            "endless"
        }
        fn path(&self) -> &std::path::Path {
            std::path::Path::new("/proc/endless")
        }
        fn flags(&self) -> crate::OpenFlags {
            crate::OpenFlags::parse("r").unwrap()
        }
        fn size(&self) -> Result<u64> {
            Ok(0)
        }
        fn zero_size_is_empty(&self) -> bool {
            false
        }
        fn special_kind(&self) -> Result<Option<&'static str>> {
            Ok(self.kind)
        }
        fn read_host(&self, span: HostSpan, offset: u64, _: &Settings) -> Result<usize> {
            let left = self.len.map_or(u64::MAX, |len| len.saturating_sub(offset));
            let n = span.len().min(left.try_into().unwrap_or(usize::MAX));
            span.copy_from(&vec![0xAB; n]);
            Ok(n)
        }
        fn write_host(&self, _: HostSpan, _: u64, _: &Settings) -> Result<usize> {
            unreachable!("read only")
        }
    }

    fn want(offset: u64, size: Option<u64>, device: bool) -> Want {
        Want {
            offset,
            size,
            strict: true,
            device,
        }
    }

    #[test]
    fn files_with_no_size_are_read_the_one_way_they_can_be() {
        let settings = Settings::default();
        let endless = Endless {
            len: None,
            kind: None,
        };
        // A pseudo-file that goes on past the bound is refused, saying what to do.
        let e = extent(&endless, want(0, None, false), "f", &settings).unwrap_err();
        assert!(
            e.to_string()
                .contains("did not end within 67108864 bytes (64 MiB")
                && e.to_string().contains("pass size="),
            "{e}"
        );
        // With a size, it is read for that many bytes.
        let found = extent(&endless, want(5, Some(100), false), "f", &settings).unwrap();
        assert_eq!(found, Extent::Open(100));
        // One that ends is read whole, and the range cut from it.
        let short = Endless {
            len: Some(10),
            kind: None,
        };
        let found = extent(&short, want(4, None, false), "f", &settings).unwrap();
        assert_eq!(found, Extent::Content(vec![0xAB; 6]));
        let e = extent(&short, want(0, None, true), "f", &settings).unwrap_err();
        assert!(
            e.to_string().contains("a device read cannot be sized"),
            "{e}"
        );
        let e = extent(&short, want(11, None, false), "f", &settings).unwrap_err();
        assert!(
            e.to_string()
                .contains("offset 11 is past the end of 'f', which has 10 bytes"),
            "{e}"
        );
        // A device or pipe is never read to its end.
        let pipe = Endless {
            len: None,
            kind: Some("a pipe (FIFO)"),
        };
        let e = extent(&pipe, want(0, None, false), "f", &settings).unwrap_err();
        assert!(
            e.to_string()
                .contains("'f' is a pipe (FIFO): it has no size"),
            "{e}"
        );
        assert_eq!(
            extent(&pipe, want(0, Some(7), true), "f", &settings).unwrap(),
            Extent::Open(7)
        );
        // An empty one is empty.
        let empty = Endless {
            len: Some(0),
            kind: None,
        };
        assert_eq!(
            extent(&empty, want(0, None, true), "f", &settings).unwrap(),
            Extent::Sized(0)
        );
    }

    proptest! {
        #[test]
        fn a_fitted_shape_covers_the_bytes_exactly(
            dims in proptest::collection::vec(-1i64..50, 0..4),
            size in 0u64..100_000,
            itemsize in 1usize..9,
        ) {
            if let Ok(fitted) = fit_shape(Some(&dims), size, itemsize, "x") {
                let total = fitted.iter().try_fold(itemsize as u64, |a, &d| a.checked_mul(d as u64));
                prop_assert_eq!(total, Some(size));
                prop_assert!(fitted.iter().all(|&d| d >= 0));
            }
        }

        #[test]
        fn a_cut_range_stays_inside_the_file(
            file_size in 0u64..1000, offset in 0u64..1200, size in proptest::option::of(0u64..1200),
            strict: bool,
        ) {
            let want = Want { offset, size, strict, device: false };
            match cut(None, file_size, want, "f") {
                Ok(extent) => {
                    let n = extent.size();
                    prop_assert!(n == 0 || offset + n <= file_size);
                    if strict {
                        prop_assert_eq!(n, size.unwrap_or(file_size - offset));
                    }
                }
                Err(_) => prop_assert!(strict),
            }
            let content: Vec<u8> = (0..file_size).map(|i| i as u8).collect();
            if let Ok(Extent::Content(bytes)) = cut(Some(content.clone()), file_size, want, "f") {
                let start = offset.min(file_size) as usize;
                prop_assert_eq!(&bytes[..], &content[start..start + bytes.len()]);
            }
        }
    }
}
