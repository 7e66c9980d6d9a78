//! safetensors headers, read through any [`Source`] (a local file or a URL) and checked
//! once, before any of them is used: the 8-byte length against the format's limit and the
//! file's size before the header is read, then the JSON (nesting bounded before parsing,
//! no key twice), every tensor's fields, and offsets that cover the data section exactly.
//! Every number from the file is checked with bounded arithmetic before it sizes anything.
//! The loaders' read plan (merged reads, packed pieces, staging windows) is [`plan`]; the
//! header of a file to write, [`write`].

mod json;
pub mod plan;
#[cfg(test)]
mod plan_tests;
mod show;
#[cfg(test)]
mod tests;
pub mod write;
#[cfg(test)]
mod write_tests;

use crate::error::{Error, Result};
use crate::settings::Settings;
use crate::source::Source;
use crate::span::HostSpan;

use json::{Json, ParseError};
use show::{quoted, short, short_str};

/// The safetensors dtypes kvikpy reads, with their item sizes in bytes, in the order
/// messages list them.
pub const DTYPES: [(&str, u64); 19] = [
    ("F64", 8),
    ("F32", 4),
    ("F16", 2),
    ("BF16", 2),
    ("I64", 8),
    ("I32", 4),
    ("I16", 2),
    ("I8", 1),
    ("U64", 8),
    ("U32", 4),
    ("U16", 2),
    ("U8", 1),
    ("BOOL", 1),
    ("F8_E4M3", 1),
    ("F8_E5M2", 1),
    ("F8_E8M0", 1),
    ("F8_E4M3FNUZ", 1),
    ("F8_E5M2FNUZ", 1),
    ("C64", 8),
];

/// Dtypes the format defines that kvikpy does not read: floats narrower than a byte,
/// packed (a tensor's bytes are not whole items).
const SUB_BYTE: [&str; 3] = ["F4", "F6_E2M3", "F6_E3M2"];

/// The format caps the header at 100 MB; anything larger is a corrupt or hostile file.
pub const MAX_HEADER: u64 = 100_000_000;
/// numpy's limit on dimensions (torch has none lower).
const MAX_NDIM: usize = 64;
/// A dimension fits a signed 64-bit integer, as numpy and torch sizes do.
const MAX_DIM: i128 = i64::MAX as i128;
/// JSON nesting deeper than this is refused before parsing: a header needs 3 levels.
pub const MAX_DEPTH: usize = 64;
/// How many bytes the first read takes, so that most headers come in one read (one
/// request for a remote file).
const WINDOW: u64 = 1 << 16;

/// One tensor of a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Its name.
    pub name: String,
    /// Its dtype (one of [`DTYPES`]).
    pub dtype: String,
    /// Its dimensions, each from 0 to 2**63 - 1.
    pub shape: Vec<u64>,
    /// Where its bytes start in the data section.
    pub begin: u64,
    /// Where they end.
    pub end: u64,
}

/// A checked safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The byte offset of the data section in the file.
    pub data_start: u64,
    /// The tensors, in the order the header gives them.
    pub tensors: Vec<Tensor>,
    /// The `__metadata__` strings, in the order the header gives them.
    pub metadata: Vec<(String, String)>,
}

/// Read and check the header of the safetensors file behind `source`; `name` is the
/// file as the caller gave it, for messages. Most headers take one read.
pub fn read_header(source: &dyn Source, name: &str, settings: &Settings) -> Result<Header> {
    let shown = quoted(name);
    let file_size = source.size()?;
    let first = file_size.clamp(8, WINDOW) as usize; // within the window: no overflow
    let mut head = vec![0u8; first];
    let got = source.read_host(HostSpan::from_slice(&mut head), 0, settings)?;
    head.truncate(got);
    if got < 8 {
        return Err(invalid(format!(
            "{shown} is not a safetensors file: it has only {got} bytes, fewer than the 8 of \
             the header length"
        )));
    }
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&head[..8]);
    let header_size = u64::from_le_bytes(prefix);
    if header_size > MAX_HEADER {
        return Err(invalid(format!(
            "{shown} is not a valid safetensors file: its header claims {header_size} bytes, \
             more than the format's limit of {MAX_HEADER}"
        )));
    }
    if file_size
        .checked_sub(8)
        .is_none_or(|room| header_size > room)
    {
        return Err(invalid(format!(
            "{shown} is not a valid safetensors file: its header claims {header_size} bytes, \
             but the file has {file_size}"
        )));
    }
    // At most MAX_HEADER bytes, and within the file: the size is checked above.
    let len = header_size as usize;
    let raw = if head.len() >= 8 + len {
        head.truncate(8 + len);
        head.drain(..8);
        head
    } else {
        let mut raw = vec![0u8; len];
        let got = source.read_host(HostSpan::from_slice(&mut raw), 8, settings)?;
        if got != len {
            return Err(invalid(format!(
                "{shown}: the file was cut while its safetensors header was read ({got} of \
                 {header_size} bytes)"
            )));
        }
        raw
    };
    let data_start = 8 + header_size;
    parse_header(&shown, &raw, data_start, file_size - data_start)
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// The header of bytes `raw`, checked; `shown` is the file's name as messages quote it,
/// and the data section has `data_size` bytes from `data_start`.
fn parse_header(shown: &str, raw: &[u8], data_start: u64, data_size: u64) -> Result<Header> {
    let text = std::str::from_utf8(raw).map_err(|e| {
        invalid(format!(
            "{shown}: the safetensors header is not UTF-8 ({})",
            utf8_reason(raw, &e)
        ))
    })?;
    if !text.starts_with('{') {
        let start: String = text.chars().take(8).collect();
        return Err(invalid(format!(
            "{shown}: the safetensors header does not start with '{{' (it starts with {}); \
             the file is not safetensors or is corrupt",
            short_str(&start)
        )));
    }
    if json::nesting(raw, MAX_DEPTH) > MAX_DEPTH {
        return Err(invalid(format!(
            "{shown}: the safetensors header nests arrays or objects more than {MAX_DEPTH} \
             deep; a header is an object of tensor objects"
        )));
    }
    let header = match json::parse(text) {
        Ok(header) => header,
        Err(ParseError::Duplicate(key)) => {
            return Err(invalid(format!(
                "{shown}: the safetensors header gives key {} twice in one object; a tensor \
                 name (or field) appears once",
                short_str(&key)
            )))
        }
        Err(ParseError::Invalid(why)) => {
            return Err(invalid(format!(
                "{shown}: the safetensors header is not valid JSON ({why})"
            )))
        }
    };
    let Json::Obj(pairs) = header else {
        return Err(invalid(format!(
            "{shown}: the safetensors header is not a JSON object"
        )));
    };
    let mut metadata = Vec::new();
    let mut entries = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        if key != "__metadata__" {
            entries.push((key, value));
            continue;
        }
        match value {
            Json::Null => {}
            Json::Obj(items) if items.iter().all(|(_, v)| matches!(v, Json::Str(_))) => {
                metadata = items
                    .into_iter()
                    .filter_map(|(k, v)| match v {
                        Json::Str(s) => Some((k, s)),
                        _ => None,
                    })
                    .collect();
            }
            other => {
                return Err(invalid(format!(
                    "{shown}: the safetensors __metadata__ must be an object of strings, not {}",
                    short(&other)
                )))
            }
        }
    }
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, info) in &entries {
        tensors.push(check_tensor(shown, name, info, data_size)?);
    }
    let mut order: Vec<&Tensor> = tensors.iter().collect();
    order.sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
    let (mut at, mut last) = (0u64, None::<&str>);
    for t in order {
        if t.begin != at {
            let what = if t.begin < at {
                "overlap"
            } else {
                "leave a hole between them"
            };
            let first = match last {
                Some(last) => format!("tensors {} and {}", short_str(last), short_str(&t.name)),
                None => format!("the start of the data and {}", short_str(&t.name)),
            };
            return Err(invalid(format!(
                "{shown}: {first} {what} (bytes [{at}, {})); safetensors tensors cover the \
                 data section end to end",
                t.begin
            )));
        }
        at = t.end;
        last = Some(&t.name);
    }
    if at != data_size {
        return Err(invalid(format!(
            "{shown}: the tensors end at byte {at} of a {data_size}-byte data section; \
             safetensors tensors cover the data section to the end of the file"
        )));
    }
    Ok(Header {
        data_start,
        tensors,
        metadata,
    })
}

/// Why `raw` is not UTF-8, as Python's codec says it.
fn utf8_reason(raw: &[u8], e: &std::str::Utf8Error) -> String {
    let at = e.valid_up_to();
    let byte = raw.get(at).copied().unwrap_or(0);
    let why = match e.error_len() {
        None if raw.len() - at > 1 => {
            let last = raw.len() - 1;
            return format!(
                "'utf-8' codec can't decode bytes in position {at}-{last}: unexpected end of data"
            );
        }
        None => "unexpected end of data",
        Some(n) if n > 1 => {
            let last = at + n - 1;
            return format!(
                "'utf-8' codec can't decode bytes in position {at}-{last}: invalid \
                 continuation byte"
            );
        }
        Some(_) if (0x80..0xC2).contains(&byte) || byte > 0xF4 => "invalid start byte",
        Some(_) => "invalid continuation byte",
    };
    format!("'utf-8' codec can't decode byte 0x{byte:02x} in position {at}: {why}")
}

/// The field `key` of object `pairs`.
fn field<'a>(pairs: &'a [(String, Json)], key: &str) -> Option<&'a Json> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Header entry `info` of tensor `name`, every field checked.
fn check_tensor(shown: &str, name: &str, info: &Json, data_size: u64) -> Result<Tensor> {
    let place = format!("{shown}: tensor {}", short_str(name));
    let Json::Obj(pairs) = info else {
        return Err(invalid(format!(
            "{place} must be an object with dtype, shape and data_offsets, not {}",
            short(info)
        )));
    };
    let fields = ["dtype", "shape", "data_offsets"].map(|k| (k, field(pairs, k)));
    let missing: Vec<&str> = fields
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| *k)
        .collect();
    let [(_, Some(dtype)), (_, Some(shape)), (_, Some(offsets))] = fields else {
        return Err(invalid(format!("{place} lacks {}", missing.join(", "))));
    };
    let known = || DTYPES.map(|(d, _)| d).join(", ");
    if let Json::Str(d) = dtype {
        if SUB_BYTE.contains(&d.as_str()) {
            return Err(invalid(format!(
                "{place} has dtype {d}, a float narrower than a byte, which kvikpy does not \
                 read; supported: {}",
                known()
            )));
        }
    }
    let found = match dtype {
        Json::Str(d) => DTYPES.iter().find(|(k, _)| k == d),
        _ => None,
    };
    let Some(&(dtype, itemsize)) = found else {
        return Err(invalid(format!(
            "{place} has unknown dtype {}; known: {}",
            short(dtype),
            known()
        )));
    };
    let dims: Option<Vec<u64>> = match shape {
        Json::Arr(items) if items.len() <= MAX_NDIM => items
            .iter()
            .map(|d| {
                d.int()
                    .filter(|d| (0..=MAX_DIM).contains(d))
                    .map(|d| d as u64) // from 0 to 2**63 - 1: fits
            })
            .collect(),
        _ => None,
    };
    let Some(dims) = dims else {
        return Err(invalid(format!(
            "{place} has invalid shape {}: a list of at most {MAX_NDIM} integers from 0 to \
             {MAX_DIM}",
            short(shape)
        )));
    };
    let (begin, end) = match offsets {
        Json::Arr(pair) => match pair.as_slice() {
            [b @ Json::Int(_), e @ Json::Int(_)] => (b, e),
            _ => return Err(bad_offsets(&place, offsets)),
        },
        _ => return Err(bad_offsets(&place, offsets)),
    };
    // Element count times item size, stopping once past the data section (so that it
    // stays below 2**64 * 2**63).
    let mut expected: u128 = if dims.contains(&0) {
        0
    } else {
        itemsize.into()
    };
    for &d in &dims {
        if expected > data_size.into() {
            break;
        }
        expected *= u128::from(d);
    }
    let span = match (begin.int(), end.int()) {
        (Some(b), Some(e)) if 0 <= b && b <= e && e <= data_size.into() => {
            // Within 0..=data_size: both fit.
            Some((b as u64, e as u64)).filter(|(b, e)| u128::from(e - b) == expected)
        }
        _ => None,
    };
    let Some((begin, end)) = span else {
        let needs = if expected <= data_size.into() {
            format!("{expected} bytes")
        } else {
            "more bytes than that".to_owned()
        };
        let text = |v: &Json| match v {
            Json::Int(t) => t.clone(),
            _ => short(v),
        };
        return Err(invalid(format!(
            "{place} ({dtype}{}) claims bytes [{}, {}) of a {data_size}-byte data section; \
             it needs {needs}",
            short(shape),
            text(begin),
            text(end)
        )));
    };
    Ok(Tensor {
        name: name.to_owned(),
        dtype: dtype.to_owned(),
        shape: dims,
        begin,
        end,
    })
}

fn bad_offsets(place: &str, offsets: &Json) -> Error {
    invalid(format!(
        "{place} has invalid data_offsets {}: a list of two integers [begin, end]",
        short(offsets)
    ))
}
