//! Arrays concatenated from parts into one array's buffers, for the types where that is a
//! copy of bits, bytes and rebased offsets: dictionaries extended by delta batches (the base
//! dictionary batch, then each delta) and a column's record batches joined into one array.
//! The parts' bytes come from the file, so every length and offset in them is checked
//! before it is used.

use arrow_schema::DataType;

use super::framing::malformed;
use super::schema::fixed_width;
use crate::error::Result;

/// Whether parts of type `t` can be concatenated here.
pub fn concatenable(t: &DataType) -> bool {
    fixed_width(t).is_some()
        || matches!(
            t,
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary
        )
}

/// One part: its length, null count, and its buffers' bytes in the C data interface's
/// order (empty for a buffer not read).
pub struct Part<'a> {
    /// Elements in the part.
    pub length: i64,
    /// Null elements in the part.
    pub null_count: i64,
    /// The buffers' bytes.
    pub buffers: Vec<&'a [u8]>,
}

fn buffer<'a>(part: &Part<'a>, i: usize, need: u64, what: &str) -> Result<&'a [u8]> {
    let b = part.buffers.get(i).copied().unwrap_or_default();
    usize::try_from(need)
        .ok()
        .and_then(|n| b.get(..n))
        .ok_or_else(|| {
            malformed(format!(
                "{what}: a part's buffer holds {} bytes where {need} are needed",
                b.len()
            ))
        })
}

fn length(part: &Part<'_>) -> Result<u64> {
    u64::try_from(part.length).map_err(|_| malformed("a part's length is negative"))
}

/// Bits `0..len` of each part's bitmap (`None`: all set), one after the other.
fn concat_bits<'a>(
    parts: impl Iterator<Item = Result<(u64, Option<&'a [u8]>)>>,
    total: u64,
) -> Result<Vec<u8>> {
    let bytes = usize::try_from(total.div_ceil(8)).map_err(|_| malformed("too long"))?;
    let mut out = vec![0u8; bytes];
    let mut at = 0u64;
    for part in parts {
        let (len, bits) = part?;
        for i in 0..len {
            let set = bits.is_none_or(|b| b[(i / 8) as usize] >> (i % 8) & 1 == 1);
            let j = at + i;
            if set {
                out[(j / 8) as usize] |= 1 << (j % 8);
            }
        }
        at += len;
    }
    Ok(out)
}

/// The buffers of the concatenation of `parts`, arrays of type `t` (see
/// [`concatenable`]): validity (empty without nulls), then values, or offsets and data.
pub fn concat(t: &DataType, parts: &[Part<'_>], what: &str) -> Result<Vec<Vec<u8>>> {
    let mut total = 0u64;
    let mut nulls = 0i64;
    for p in parts {
        total = total
            .checked_add(length(p)?)
            .ok_or_else(|| malformed(format!("{what} is too long")))?;
        nulls = nulls.saturating_add(p.null_count.max(0));
    }
    // Values first: their checks bound the lengths before the bitmaps are allocated.
    let mut out = vec![Vec::new()];
    match (t, fixed_width(t)) {
        (DataType::Boolean, _) => out.push(concat_bits(
            parts.iter().map(|p| {
                let len = length(p)?;
                Ok((len, Some(buffer(p, 1, len.div_ceil(8), what)?)))
            }),
            total,
        )?),
        (_, Some(width)) => {
            let mut values = Vec::new();
            for p in parts {
                let need = length(p)?
                    .checked_mul(width)
                    .ok_or_else(|| malformed(format!("{what} is too long")))?;
                values.extend_from_slice(buffer(p, 1, need, what)?);
            }
            out.push(values);
        }
        (DataType::Utf8 | DataType::Binary, None) => {
            let (offsets, data) = concat_offsets::<4>(parts, what)?;
            out.extend([offsets, data]);
        }
        (DataType::LargeUtf8 | DataType::LargeBinary, None) => {
            let (offsets, data) = concat_offsets::<8>(parts, what)?;
            out.extend([offsets, data]);
        }
        (other, None) => {
            return Err(malformed(format!(
                "{what}: arrays of {other} cannot be concatenated here"
            )))
        }
    }
    // Validity: each part's bitmap, or all valid where a part has no nulls.
    if nulls > 0 {
        out[0] = concat_bits(
            parts.iter().map(|p| {
                let len = length(p)?;
                let bits = if p.null_count > 0 {
                    Some(buffer(p, 0, len.div_ceil(8), what)?)
                } else {
                    None
                };
                Ok((len, bits))
            }),
            total,
        )?;
    }
    Ok(out)
}

fn read_offset<const W: usize>(bytes: &[u8], i: usize) -> u64 {
    let mut word = [0u8; 8];
    word[..W].copy_from_slice(&bytes[i * W..(i + 1) * W]);
    // A negative 32- or 64-bit offset reads as a huge one, which the checks below refuse.
    if W == 4 {
        i32::from_le_bytes([word[0], word[1], word[2], word[3]]) as i64 as u64
    } else {
        u64::from_le_bytes(word)
    }
}

/// Offsets (`W` bytes each) and data of variable-width parts: each part's values
/// `offsets[0]..offsets[len]` of its data, its offsets rebased after the values before.
fn concat_offsets<const W: usize>(parts: &[Part<'_>], what: &str) -> Result<(Vec<u8>, Vec<u8>)> {
    let limit = if W == 4 {
        i32::MAX as u64
    } else {
        i64::MAX as u64
    };
    let mut offsets = vec![0u8; W];
    let mut data = Vec::new();
    for p in parts {
        let len = length(p)?;
        if len == 0 {
            continue;
        }
        let need = (len + 1)
            .checked_mul(W as u64)
            .ok_or_else(|| malformed(format!("{what} is too long")))?;
        let offs = buffer(p, 1, need, what)?;
        let values = p.buffers.get(2).copied().unwrap_or_default();
        let (first, last) = (
            read_offset::<W>(offs, 0),
            read_offset::<W>(offs, len as usize),
        );
        if first > last || last > values.len() as u64 {
            return Err(malformed(format!(
                "{what}: a part's offsets run {first}..{last} over {} bytes of data",
                values.len()
            )));
        }
        let base = data.len() as u64;
        for i in 1..=len as usize {
            let o = read_offset::<W>(offs, i);
            if o < first || o > last {
                return Err(malformed(format!(
                    "{what}: a part's offset {o} lies outside {first}..{last}"
                )));
            }
            let rebased = base + (o - first);
            if rebased > limit {
                return Err(malformed(format!(
                    "{what}: the joined values pass the {limit} bytes its offsets can \
                     address"
                )));
            }
            offsets.extend_from_slice(&rebased.to_le_bytes()[..W]);
        }
        data.extend_from_slice(&values[first as usize..last as usize]);
    }
    Ok((offsets, data))
}
