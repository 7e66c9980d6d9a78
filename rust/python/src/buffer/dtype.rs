//! A buffer's element type, parsed once from the numpy typestr and DLPack code that
//! `Buffer.view` receives; every export (DLPack, CUDA Array Interface, Arrow, buffer
//! protocol, pickle, numpy) reads this instead of the string.

use kvikpy_macros::boundary;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// DLPack's type code of bfloat16 (`kDLBfloat`), which numpy has no dtype for.
const DLPACK_BFLOAT: u8 = 4;

/// Every item type a buffer exports as a typed one, the one table of them: numpy's kind
/// letter, the item size in bytes, the DLPack type code, and the struct-module code the
/// buffer protocol gives it. bfloat16 is `V2` (numpy's raw 2-byte items), shown to the
/// buffer protocol as its bits (uint16). `kvikpy.read` asks for it through
/// [`item_types`] to decide which dtypes it exports.
const ITEM_TYPES: [(u8, usize, u8, &str); 15] = [
    (b'b', 1, 6, "?"),
    (b'i', 1, 0, "b"),
    (b'i', 2, 0, "h"),
    (b'i', 4, 0, "i"),
    (b'i', 8, 0, "q"),
    (b'u', 1, 1, "B"),
    (b'u', 2, 1, "H"),
    (b'u', 4, 1, "I"),
    (b'u', 8, 1, "Q"),
    (b'f', 2, 2, "e"),
    (b'f', 4, 2, "f"),
    (b'f', 8, 2, "d"),
    (b'c', 8, 5, "Zf"),
    (b'c', 16, 5, "Zd"),
    (b'V', 2, DLPACK_BFLOAT, "H"),
];

/// The item types as `(kind, item size, DLPack code)`, kind as a one-letter string.
#[boundary]
#[pyfunction]
pub fn item_types() -> Vec<(char, usize, u8)> {
    ITEM_TYPES
        .iter()
        .map(|&(kind, size, code, _)| (char::from(kind), size, code))
        .collect()
}

/// The byte order of multi-byte items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteOrder {
    /// Least significant byte first (`<`).
    Little,
    /// Most significant byte first (`>`).
    Big,
    /// Single-byte items, for which order means nothing (`|`).
    NotApplicable,
}

impl ByteOrder {
    /// This machine's order.
    pub const NATIVE: Self = if cfg!(target_endian = "little") {
        Self::Little
    } else {
        Self::Big
    };

    /// The order that is not this one (single-byte items have no other).
    const fn other(self) -> Self {
        match self {
            Self::Little => Self::Big,
            Self::Big => Self::Little,
            Self::NotApplicable => Self::NotApplicable,
        }
    }
}

/// One element's type: numpy's typestr (`"<f4"`), its parts, and the DLPack code and
/// bit width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dtype {
    typestr: String,
    /// numpy's kind letter (`b'f'` for `"<f4"`).
    kind: u8,
    itemsize: usize,
    order: ByteOrder,
    /// DLPack type code (`kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLBfloat` 4, ...).
    code: u8,
    bits: u8,
}

impl Dtype {
    /// Raw bytes (`"|u1"`), the type of a fresh allocation.
    pub fn bytes() -> Self {
        Self {
            typestr: "|u1".into(),
            kind: b'u',
            itemsize: 1,
            order: ByteOrder::NotApplicable,
            code: 1,
            bits: 8,
        }
    }

    /// Parse `typestr` (a byte order `<`, `>`, `|` or `=`, a kind letter and an item size
    /// in bytes) together with its DLPack `code` and `bits`, which must give the same item
    /// size. `ValueError` otherwise.
    pub fn parse(typestr: String, code: u8, bits: u8) -> PyResult<Self> {
        let malformed = |why: &str| {
            PyValueError::new_err(format!(
                "typestr {typestr:?} with DLPack code {code} and {bits} bits is not an item \
                 type: {why}; pass a numpy array-interface type string such as '<f4' or '|u1' \
                 and its DLPack code and bit width"
            ))
        };
        let bytes = typestr.as_bytes();
        if bytes.len() < 3 || !bytes[1].is_ascii_alphabetic() {
            return Err(malformed(
                "expected a byte order, a kind letter and an item size",
            ));
        }
        let order = match bytes[0] {
            b'<' => ByteOrder::Little,
            b'>' => ByteOrder::Big,
            b'|' => ByteOrder::NotApplicable,
            b'=' => ByteOrder::NATIVE,
            _ => return Err(malformed("the byte order must be '<', '>', '|' or '='")),
        };
        let itemsize: usize = typestr[2..]
            .parse()
            .map_err(|_| malformed("the item size is not a number"))?;
        if itemsize == 0 || itemsize != usize::from(bits).div_ceil(8) {
            return Err(malformed("the item size and the bit width disagree"));
        }
        Ok(Self {
            kind: bytes[1],
            typestr,
            itemsize,
            order,
            code,
            bits,
        })
    }

    /// numpy's typestr, as given.
    pub fn typestr(&self) -> &str {
        &self.typestr
    }

    /// Bytes per item.
    pub fn itemsize(&self) -> usize {
        self.itemsize
    }

    /// DLPack type code.
    pub fn code(&self) -> u8 {
        self.code
    }

    /// Bits per item.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Whether the items are bfloat16, which numpy has no dtype for.
    pub fn is_bfloat16(&self) -> bool {
        self.code == DLPACK_BFLOAT
    }

    /// Whether multi-byte items are in the other byte order than this machine's.
    pub fn is_foreign_order(&self) -> bool {
        self.bits > 8 && self.order == ByteOrder::NATIVE.other()
    }

    /// The struct-module format of the items for the buffer protocol (`"<f4"` -> `"<f"`).
    /// bfloat16 (`"<V2"`), which the buffer protocol has no type for, is its bits as
    /// uint16; kinds it cannot describe are bytes.
    pub fn struct_format(&self) -> String {
        let code = ITEM_TYPES
            .iter()
            .find(|&&(kind, size, _, _)| kind == self.kind && size == self.itemsize)
            .map_or("B", |&(_, _, _, code)| code);
        let order = match self.order {
            ByteOrder::Little => "<",
            ByteOrder::Big => ">",
            ByteOrder::NotApplicable => "",
        };
        format!("{order}{code}")
    }
}
