//! Arrow types: the type of an n-dimensional buffer of one element type (nested in
//! fixed-size lists for 2-D and higher shapes), and the C schema of any type kvikpy exports
//! (arrow-rs's, completed with the list views it cannot describe).

use std::sync::Arc;

use arrow_schema::ffi::{FFI_ArrowSchema, Flags};
use arrow_schema::{ArrowError, DataType, Field, Schema, UnionMode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The Arrow type of a buffer of `element`s with `shape`: the element type for 0-D and
/// 1-D buffers (a 0-D buffer is one element long), nested fixed-size lists of it for
/// more dimensions, one level per dimension after the first, so `(n, a, b)` becomes
/// `fixed_size_list<fixed_size_list<element>[b]>[a]` of length `n`.
pub fn buffer_type(element: DataType, shape: &[i64]) -> PyResult<DataType> {
    let mut t = element;
    for &d in shape.iter().skip(1).rev() {
        let size = i32::try_from(d).map_err(|_| {
            PyValueError::new_err(format!(
                "dimension {d} of shape {shape:?} is longer than an Arrow fixed-size list \
                 can be (2^31 - 1); view the buffer with fewer, shorter inner dimensions"
            ))
        })?;
        t = DataType::FixedSizeList(Arc::new(Field::new_list_field(t, true)), size);
    }
    Ok(t)
}

/// Whether `t` holds a list view anywhere in it (arrow-rs's C schema export lacks them).
fn has_list_view(t: &DataType) -> bool {
    match t {
        DataType::ListView(_) | DataType::LargeListView(_) => true,
        DataType::List(c)
        | DataType::LargeList(c)
        | DataType::FixedSizeList(c, _)
        | DataType::Map(c, _) => has_list_view(c.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| has_list_view(f.data_type())),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| has_list_view(f.data_type())),
        DataType::Dictionary(_, v) => has_list_view(v),
        _ => false,
    }
}

/// The C schema of type `t`: arrow-rs's, and for the types it cannot describe (list
/// views, `+vl` and `+vL`, at any depth) built here, level by level.
pub fn ffi_type(t: &DataType) -> Result<FFI_ArrowSchema, ArrowError> {
    if !has_list_view(t) {
        return FFI_ArrowSchema::try_from(t);
    }
    let one = |c: &Field| ffi_field(c).map(|c| vec![c]);
    let (format, children, dictionary, flags) = match t {
        DataType::ListView(c) => ("+vl".to_owned(), one(c)?, None, Flags::empty()),
        DataType::LargeListView(c) => ("+vL".to_owned(), one(c)?, None, Flags::empty()),
        DataType::List(c) => ("+l".to_owned(), one(c)?, None, Flags::empty()),
        DataType::LargeList(c) => ("+L".to_owned(), one(c)?, None, Flags::empty()),
        DataType::FixedSizeList(c, n) => (format!("+w:{n}"), one(c)?, None, Flags::empty()),
        DataType::Map(c, sorted) => {
            let flags = if *sorted {
                Flags::MAP_KEYS_SORTED
            } else {
                Flags::empty()
            };
            ("+m".to_owned(), one(c)?, None, flags)
        }
        DataType::Struct(fields) => {
            let children = fields
                .iter()
                .map(|f| ffi_field(f))
                .collect::<Result<_, _>>()?;
            ("+s".to_owned(), children, None, Flags::empty())
        }
        DataType::Union(fields, mode) => {
            let ids: Vec<String> = fields.iter().map(|(id, _)| id.to_string()).collect();
            let kind = match mode {
                UnionMode::Dense => "+ud",
                UnionMode::Sparse => "+us",
            };
            let children = fields
                .iter()
                .map(|(_, f)| ffi_field(f))
                .collect::<Result<_, _>>()?;
            (
                format!("{kind}:{}", ids.join(",")),
                children,
                None,
                Flags::empty(),
            )
        }
        DataType::Dictionary(index, value) => {
            let format = FFI_ArrowSchema::try_from(index.as_ref())?
                .format()
                .to_owned();
            (format, Vec::new(), Some(ffi_type(value)?), Flags::empty())
        }
        other => return FFI_ArrowSchema::try_from(other),
    };
    FFI_ArrowSchema::try_new(&format, children, dictionary)?.with_flags(flags)
}

/// The C schema of field `f` (its type, name, nullability and metadata).
pub fn ffi_field(f: &Field) -> Result<FFI_ArrowSchema, ArrowError> {
    let mut flags = if f.is_nullable() {
        Flags::NULLABLE
    } else {
        Flags::empty()
    };
    if f.dict_is_ordered() == Some(true) {
        flags |= Flags::DICTIONARY_ORDERED;
    }
    let schema = ffi_type(f.data_type())?;
    let flags = schema.flags().unwrap_or(Flags::empty()) | flags;
    schema
        .with_name(f.name())?
        .with_flags(flags)?
        .with_metadata(f.metadata())
}

/// The C schema of a record batch of `schema` (a struct of its fields, with its metadata).
pub fn ffi_schema(schema: &Schema) -> Result<FFI_ArrowSchema, ArrowError> {
    ffi_type(&DataType::Struct(schema.fields().clone()))?.with_metadata(schema.metadata())
}
