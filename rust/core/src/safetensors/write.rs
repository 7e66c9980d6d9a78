//! safetensors headers written: every tensor's name, dtype, shape and byte count (and the
//! metadata strings) checked once, then laid out and rendered as the header bytes that
//! start a file, with each tensor's offset in the data section.
//!
//! # Order
//!
//! Tensors are laid out by dtype in the order of [`WRITE_ORDER`] (8-byte items first,
//! then 4-, 2- and 1-byte ones), and tensors of one dtype by name (Unicode code point
//! order, which is the order of their UTF-8 bytes). Item sizes never grow along the
//! data section and each is a power of two, so every tensor starts at a multiple of its
//! item size (the bytes before it are whole items of sizes its own divides); the data
//! section starts at a multiple of 8 in the file, so each tensor is item-aligned in the
//! file too, and readers (kvikpy's, safetensors') take it as a view without copying it.
//! It is also the order safetensors 0.8 writes in, so that for the same tensors and at
//! most one metadata entry the file is byte for byte what `safetensors.torch.save_file`
//! writes (safetensors writes several metadata entries in no fixed order; this writes
//! them sorted by key, so that equal inputs give equal files).
//!
//! # Layout
//!
//! The 8-byte little-endian header length, then the JSON (no spaces, `__metadata__`
//! first when given, then the tensors as `{"dtype":…,"shape":[…],"data_offsets":[b,e]}`),
//! padded with spaces to a multiple of 8 bytes, so that the data section starts 8-aligned.
//! Strings are escaped as JSON requires and no more (`"`, `\`, and control characters
//! below U+0020, as `\n` where JSON has a short form and `\u00XX` otherwise); every other
//! character is written as its UTF-8 bytes.

use std::collections::HashSet;

use crate::error::{Error, Result};

use super::show::short_str;
use super::{DTYPES, MAX_DIM, MAX_HEADER, MAX_NDIM};

/// The safetensors dtypes in the order the data section holds them: item size
/// descending, and within one size the order safetensors 0.8 writes them in.
pub const WRITE_ORDER: [&str; 19] = [
    "U64",
    "I64",
    "F64",
    "C64",
    "F32",
    "U32",
    "I32",
    "BF16",
    "F16",
    "U16",
    "I16",
    "F8_E5M2FNUZ",
    "F8_E4M3FNUZ",
    "F8_E8M0",
    "F8_E4M3",
    "F8_E5M2",
    "I8",
    "U8",
    "BOOL",
];

/// The largest file a header may describe: offsets are signed 64-bit (`off_t`).
const MAX_FILE: u64 = i64::MAX as u64;

/// One tensor to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name.
    pub name: String,
    /// Its safetensors dtype (one of [`DTYPES`]).
    pub dtype: String,
    /// Its dimensions.
    pub shape: Vec<u64>,
    /// Its bytes: the product of the shape times the dtype's item size.
    pub nbytes: u64,
}

/// A header ready to write, and where each tensor's bytes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The file's first bytes: the 8-byte length, then the padded JSON.
    pub header: Vec<u8>,
    /// Each tensor's offset in the data section, in the order the tensors were given
    /// (the file offset is `header.len()` more).
    pub offsets: Vec<u64>,
    /// The data section's size in bytes.
    pub data_size: u64,
}

impl Written {
    /// The file's size in bytes: header and data section.
    pub fn file_size(&self) -> u64 {
        // Checked by `write_header`: at most 2**63 - 1.
        self.header.len() as u64 + self.data_size
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// The header of a safetensors file holding `tensors` (with `metadata` as its
/// `__metadata__` strings, if given; an empty list writes an empty object), laid out as
/// the module documentation says. Everything is checked before the header is rendered:
/// a dtype not in [`DTYPES`], more than 64 dimensions or one past 2**63 - 1, a byte
/// count other than the shape's, a name given twice or named `__metadata__`, a metadata
/// key given twice, a header past the format's 100 MB limit or a file past 2**63 - 1
/// bytes are each an [`Error::InvalidArgument`] naming what is wrong.
pub fn write_header(tensors: &[Entry], metadata: Option<&[(String, String)]>) -> Result<Written> {
    let mut names = HashSet::with_capacity(tensors.len());
    let mut ranks = Vec::with_capacity(tensors.len());
    for t in tensors {
        ranks.push(check(t)?);
        if !names.insert(t.name.as_str()) {
            return Err(invalid(format!(
                "tensor {} is given twice; a safetensors file names each tensor once",
                short_str(&t.name)
            )));
        }
    }
    let mut pairs: Vec<&(String, String)> = metadata.unwrap_or_default().iter().collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(invalid(format!(
            "metadata key {} is given twice; each key appears once",
            short_str(&w[0].0)
        )));
    }

    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| (ranks[a], &tensors[a].name).cmp(&(ranks[b], &tensors[b].name)));
    let mut offsets = vec![0u64; tensors.len()];
    let mut data_size = 0u64;
    for &i in &order {
        offsets[i] = data_size;
        data_size = data_size
            .checked_add(tensors[i].nbytes)
            .filter(|&end| end <= MAX_FILE)
            .ok_or_else(|| too_large("tensors"))?;
    }

    let render = |out: &mut dyn Out| {
        out.put(b"{");
        let mut first = true;
        let mut comma = |out: &mut dyn Out| {
            if !std::mem::take(&mut first) {
                out.put(b",");
            }
        };
        if metadata.is_some() {
            comma(out);
            out.put(b"\"__metadata__\":{");
            for (k, (key, value)) in pairs.iter().map(|p| (&p.0, &p.1)).enumerate() {
                if k > 0 {
                    out.put(b",");
                }
                string(out, key);
                out.put(b":");
                string(out, value);
            }
            out.put(b"}");
        }
        for &i in &order {
            let t = &tensors[i];
            comma(out);
            string(out, &t.name);
            out.put(b":{\"dtype\":");
            string(out, &t.dtype);
            out.put(b",\"shape\":[");
            for (k, &d) in t.shape.iter().enumerate() {
                if k > 0 {
                    out.put(b",");
                }
                number(out, d);
            }
            out.put(b"],\"data_offsets\":[");
            number(out, offsets[i]);
            out.put(b",");
            number(out, offsets[i] + t.nbytes); // within data_size: checked above
            out.put(b"]}");
        }
        out.put(b"}");
    };

    // Measure first, so that nothing past the limit is allocated.
    let mut count = Count(0);
    render(&mut count);
    let padded = count.0.checked_next_multiple_of(8).unwrap_or(u64::MAX);
    if padded > MAX_HEADER {
        return Err(invalid(format!(
            "the safetensors header would have {padded} bytes, more than the format's limit \
             of {MAX_HEADER}; use shorter tensor names or less metadata, or write the \
             tensors to several files"
        )));
    }
    if (8 + padded)
        .checked_add(data_size)
        .is_none_or(|n| n > MAX_FILE)
    {
        return Err(too_large("header and tensors"));
    }
    // At most 8 + MAX_HEADER bytes: fits.
    let mut header = Vec::with_capacity(8 + padded as usize);
    header.extend_from_slice(&padded.to_le_bytes());
    render(&mut header);
    header.resize(8 + padded as usize, b' ');
    Ok(Written {
        header,
        offsets,
        data_size,
    })
}

/// Tensor `t` checked; its dtype's place in [`WRITE_ORDER`].
fn check(t: &Entry) -> Result<usize> {
    let place = format!("tensor {}", short_str(&t.name));
    if t.name == "__metadata__" {
        return Err(invalid(
            "a tensor may not be named '__metadata__': the header keeps that key for the \
             metadata strings; rename the tensor (pass the strings as metadata=)"
                .to_owned(),
        ));
    }
    let (Some(rank), Some(&(_, itemsize))) = (
        WRITE_ORDER.iter().position(|&d| d == t.dtype),
        DTYPES.iter().find(|(d, _)| *d == t.dtype),
    ) else {
        return Err(invalid(format!(
            "{place} has dtype {}, which is not a safetensors dtype kvikpy writes; \
             supported: {}",
            short_str(&t.dtype),
            DTYPES.map(|(d, _)| d).join(", ")
        )));
    };
    if t.shape.len() > MAX_NDIM {
        return Err(invalid(format!(
            "{place} has {} dimensions; a safetensors tensor has at most {MAX_NDIM}",
            t.shape.len()
        )));
    }
    if let Some(d) = t.shape.iter().find(|&&d| i128::from(d) > MAX_DIM) {
        return Err(invalid(format!(
            "{place} has dimension {d}; dimensions go up to {MAX_DIM}"
        )));
    }
    // None: more than 2**64 (a shape with a 0 has no bytes, however large the others).
    let needs = if t.shape.contains(&0) {
        Some(0)
    } else {
        t.shape.iter().try_fold(itemsize, |n, &d| n.checked_mul(d))
    };
    if needs != Some(t.nbytes) {
        let needs = needs.map_or_else(|| "more than 2**64".to_owned(), |n| n.to_string());
        return Err(invalid(format!(
            "{place} ({} of shape {:?}) has {} bytes; its shape and dtype make {needs} \
             ({itemsize} bytes an item)",
            t.dtype, t.shape, t.nbytes
        )));
    }
    Ok(rank)
}

fn too_large(what: &str) -> Error {
    invalid(format!(
        "the {what} come to more than {MAX_FILE} bytes, more than a file can hold; write \
         them to several files"
    ))
}

/// Where rendered bytes go: counted, or kept.
trait Out {
    fn put(&mut self, bytes: &[u8]);
}

/// Counts the bytes rendered.
struct Count(u64);

impl Out for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 = self.0.saturating_add(bytes.len() as u64);
    }
}

impl Out for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// `n` in decimal.
fn number(out: &mut dyn Out, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put(&digits[at..]);
}

/// `s` as a JSON string: quoted, with `"`, `\` and control characters escaped.
fn string(out: &mut dyn Out, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.put(b"\"");
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x08 => b'b',
            0x0c => b'f',
            0..=0x1f => 0,
            _ => continue,
        };
        out.put(&bytes[run..i]);
        run = i + 1;
        if short != 0 {
            out.put(&[b'\\', short]);
        } else {
            out.put(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ]);
        }
    }
    out.put(&bytes[run..]);
    out.put(b"\"");
}
