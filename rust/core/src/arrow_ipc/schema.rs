//! An IPC schema flatbuffer turned into arrow-rs fields, one type at a time, with a clear
//! error (naming the column and the type) for the types kvikpy cannot place; the
//! dictionary id of each dictionary-encoded field is kept beside it.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_ipc::{
    DateUnit, IntervalUnit, Precision, TimeUnit as FbTimeUnit, Type, UnionMode as FbUnionMode,
};
use arrow_schema::{DataType, Field, IntervalUnit as Iu, Schema, TimeUnit, UnionFields, UnionMode};

use super::framing::malformed;
use crate::error::{Error, Result};

/// A field of the schema, with what arrow-rs's `Field` does not carry.
#[derive(Debug, Clone)]
pub struct SchemaNode {
    /// The Arrow field (a dictionary-encoded one has `DataType::Dictionary`).
    pub field: Field,
    /// The dictionary id, for a dictionary-encoded field.
    pub dictionary: Option<i64>,
    /// The child fields, in order (of the value type for a dictionary-encoded field).
    pub children: Vec<SchemaNode>,
}

/// The schema: its top-level fields and its metadata.
#[derive(Debug, Clone)]
pub struct IpcSchema {
    /// The top-level fields (the table's columns).
    pub fields: Vec<SchemaNode>,
    /// The schema's key/value metadata.
    pub metadata: HashMap<String, String>,
}

impl IpcSchema {
    /// The arrow-rs schema of the fields at `indices`.
    pub fn project(&self, indices: &[usize]) -> Schema {
        let fields: Vec<Field> = indices
            .iter()
            .map(|&i| self.fields[i].field.clone())
            .collect();
        Schema::new_with_metadata(fields, self.metadata.clone())
    }
}

fn metadata(
    list: Option<flatbuffers::Vector<'_, flatbuffers::ForwardsUOffset<arrow_ipc::KeyValue<'_>>>>,
) -> HashMap<String, String> {
    list.map(|kv| {
        kv.iter()
            .filter_map(|kv| Some((kv.key()?.to_owned(), kv.value().unwrap_or("").to_owned())))
            .collect()
    })
    .unwrap_or_default()
}

/// Convert the schema table.
pub fn convert(schema: arrow_ipc::Schema<'_>) -> Result<IpcSchema> {
    let mut fields = Vec::new();
    for (i, f) in schema.fields().iter().flatten().enumerate() {
        let name = f.name().map_or_else(|| format!("#{i}"), str::to_owned);
        fields.push(convert_field(f, &name)?);
    }
    Ok(IpcSchema {
        fields,
        metadata: metadata(schema.custom_metadata()),
    })
}

fn unsupported(path: &str, what: impl std::fmt::Display) -> Error {
    Error::UnsupportedOperation(format!(
        "column '{path}' has Arrow type {what}, which kvikpy cannot read onto the device; \
         leave the column out (columns=[...]) or read the file with pyarrow"
    ))
}

fn time_unit(unit: FbTimeUnit, path: &str) -> Result<TimeUnit> {
    Ok(match unit {
        FbTimeUnit::SECOND => TimeUnit::Second,
        FbTimeUnit::MILLISECOND => TimeUnit::Millisecond,
        FbTimeUnit::MICROSECOND => TimeUnit::Microsecond,
        FbTimeUnit::NANOSECOND => TimeUnit::Nanosecond,
        other => {
            return Err(malformed(format!(
                "column '{path}' has time unit {}",
                other.0
            )))
        }
    })
}

fn int_type(bits: i32, signed: bool, path: &str) -> Result<DataType> {
    Ok(match (bits, signed) {
        (8, true) => DataType::Int8,
        (16, true) => DataType::Int16,
        (32, true) => DataType::Int32,
        (64, true) => DataType::Int64,
        (8, false) => DataType::UInt8,
        (16, false) => DataType::UInt16,
        (32, false) => DataType::UInt32,
        (64, false) => DataType::UInt64,
        _ => {
            return Err(malformed(format!(
                "column '{path}' is an integer of {bits} bits"
            )))
        }
    })
}

/// A union's type ids (0, 1, ... when the schema gives none), one per child, each in
/// 0..=127 and distinct, as the format requires.
pub(super) fn union_type_ids(
    given: Option<Vec<i32>>,
    children: usize,
    path: &str,
) -> Result<Vec<i8>> {
    let ids: Vec<i32> = match given {
        Some(v) => v,
        None => (0..i32::try_from(children).unwrap_or(i32::MAX)).collect(),
    };
    if ids.len() != children {
        return Err(malformed(format!(
            "column '{path}' is a union of {children} types with {} type ids",
            ids.len()
        )));
    }
    let mut seen = 0u128;
    ids.iter()
        .map(|&id| {
            let ok = u8::try_from(id).ok().filter(|&b| b <= 127);
            let Some(bit) = ok.map(|b| 1u128 << b).filter(|bit| seen & bit == 0) else {
                return Err(malformed(format!(
                    "column '{path}' has union type ids {ids:?} (each must be 0..=127, \
                     and distinct)"
                )));
            };
            seen |= bit;
            Ok(id as i8)
        })
        .collect()
}

fn convert_field(f: arrow_ipc::Field<'_>, path: &str) -> Result<SchemaNode> {
    let mut children = Vec::new();
    for (i, c) in f.children().iter().flatten().enumerate() {
        let name = c.name().map_or_else(|| format!("#{i}"), str::to_owned);
        children.push(convert_field(c, &format!("{path}.{name}"))?);
    }
    let child = |n: usize| -> Result<Arc<Field>> {
        if children.len() != n {
            return Err(malformed(format!(
                "column '{path}' has {} child fields where its type has {n}",
                children.len()
            )));
        }
        Ok(Arc::new(children[0].field.clone()))
    };
    let missing = || malformed(format!("column '{path}' lacks its type's parameters"));
    let t = f.type_type();
    let data_type = match t {
        Type::Null => DataType::Null,
        Type::Int => {
            let i = f.type_as_int().ok_or_else(missing)?;
            int_type(i.bitWidth(), i.is_signed(), path)?
        }
        Type::FloatingPoint => match f.type_as_floating_point().ok_or_else(missing)?.precision() {
            Precision::HALF => DataType::Float16,
            Precision::SINGLE => DataType::Float32,
            Precision::DOUBLE => DataType::Float64,
            p => {
                return Err(malformed(format!(
                    "column '{path}' has float precision {}",
                    p.0
                )))
            }
        },
        Type::Bool => DataType::Boolean,
        Type::Binary => DataType::Binary,
        Type::Utf8 => DataType::Utf8,
        Type::LargeBinary => DataType::LargeBinary,
        Type::LargeUtf8 => DataType::LargeUtf8,
        Type::BinaryView => DataType::BinaryView,
        Type::Utf8View => DataType::Utf8View,
        Type::FixedSizeBinary => {
            let w = f
                .type_as_fixed_size_binary()
                .ok_or_else(missing)?
                .byteWidth();
            if w < 0 {
                return Err(malformed(format!("column '{path}' has byte width {w}")));
            }
            DataType::FixedSizeBinary(w)
        }
        Type::Decimal => {
            let d = f.type_as_decimal().ok_or_else(missing)?;
            let (p, s) = (d.precision(), d.scale());
            let p8 = u8::try_from(p).ok().filter(|&p| p > 0);
            let s8 = i8::try_from(s).ok();
            let (Some(p8), Some(s8)) = (p8, s8) else {
                return Err(malformed(format!("column '{path}' has decimal({p}, {s})")));
            };
            match d.bitWidth() {
                128 if p8 <= 38 => DataType::Decimal128(p8, s8),
                256 if p8 <= 76 => DataType::Decimal256(p8, s8),
                32 if p8 <= 9 => DataType::Decimal32(p8, s8),
                64 if p8 <= 18 => DataType::Decimal64(p8, s8),
                w => {
                    return Err(malformed(format!(
                        "column '{path}' has a decimal({p}, {s}) of {w} bits"
                    )))
                }
            }
        }
        Type::Date => match f.type_as_date().ok_or_else(missing)?.unit() {
            DateUnit::DAY => DataType::Date32,
            DateUnit::MILLISECOND => DataType::Date64,
            u => return Err(malformed(format!("column '{path}' has date unit {}", u.0))),
        },
        Type::Time => {
            let tm = f.type_as_time().ok_or_else(missing)?;
            match (time_unit(tm.unit(), path)?, tm.bitWidth()) {
                (u @ (TimeUnit::Second | TimeUnit::Millisecond), 32) => DataType::Time32(u),
                (u @ (TimeUnit::Microsecond | TimeUnit::Nanosecond), 64) => DataType::Time64(u),
                (u, w) => {
                    return Err(malformed(format!(
                        "column '{path}' has a time of {u:?} in {w} bits"
                    )))
                }
            }
        }
        Type::Timestamp => {
            let ts = f.type_as_timestamp().ok_or_else(missing)?;
            DataType::Timestamp(time_unit(ts.unit(), path)?, ts.timezone().map(Arc::from))
        }
        Type::Duration => DataType::Duration(time_unit(
            f.type_as_duration().ok_or_else(missing)?.unit(),
            path,
        )?),
        Type::Interval => match f.type_as_interval().ok_or_else(missing)?.unit() {
            IntervalUnit::YEAR_MONTH => DataType::Interval(Iu::YearMonth),
            IntervalUnit::DAY_TIME => DataType::Interval(Iu::DayTime),
            IntervalUnit::MONTH_DAY_NANO => DataType::Interval(Iu::MonthDayNano),
            u => {
                return Err(malformed(format!(
                    "column '{path}' has interval unit {}",
                    u.0
                )))
            }
        },
        Type::List => DataType::List(child(1)?),
        Type::LargeList => DataType::LargeList(child(1)?),
        Type::FixedSizeList => {
            let n = f.type_as_fixed_size_list().ok_or_else(missing)?.listSize();
            if n < 0 {
                return Err(malformed(format!("column '{path}' has list size {n}")));
            }
            DataType::FixedSizeList(child(1)?, n)
        }
        Type::ListView => DataType::ListView(child(1)?),
        Type::LargeListView => DataType::LargeListView(child(1)?),
        Type::Union => {
            let u = f.type_as_union().ok_or_else(missing)?;
            let mode = match u.mode() {
                FbUnionMode::Sparse => UnionMode::Sparse,
                FbUnionMode::Dense => UnionMode::Dense,
                m => return Err(malformed(format!("column '{path}' has union mode {}", m.0))),
            };
            let given = u.typeIds().map(|v| v.iter().collect());
            let ids = union_type_ids(given, children.len(), path)?;
            let fields = children.iter().map(|c| c.field.clone());
            DataType::Union(UnionFields::new(ids, fields), mode)
        }
        Type::Struct_ => DataType::Struct(children.iter().map(|c| c.field.clone()).collect()),
        Type::Map => {
            let entries = child(1)?;
            match entries.data_type() {
                DataType::Struct(kv) if kv.len() == 2 => {}
                _ => {
                    return Err(malformed(format!(
                        "column '{path}' is a map whose entries are not a struct of key and value"
                    )))
                }
            }
            DataType::Map(entries, f.type_as_map().ok_or_else(missing)?.keysSorted())
        }
        other => {
            return Err(unsupported(path, other.variant_name().unwrap_or("unknown")));
        }
    };
    let name = path.rsplit('.').next().unwrap_or(path);
    let name = f.name().unwrap_or(name);
    let (data_type, dictionary) = match f.dictionary() {
        Some(d) => {
            let index = d.indexType().ok_or_else(missing)?;
            let index = int_type(index.bitWidth(), index.is_signed(), path)?;
            (
                DataType::Dictionary(Box::new(index), Box::new(data_type)),
                Some(d.id()),
            )
        }
        None => (data_type, None),
    };
    let field =
        Field::new(name, data_type, f.nullable()).with_metadata(metadata(f.custom_metadata()));
    let field = match f.dictionary() {
        Some(d) if d.isOrdered() => {
            #[allow(deprecated)]
            let field = field.with_dict_is_ordered(true);
            field
        }
        _ => field,
    };
    Ok(SchemaNode {
        field,
        dictionary,
        children,
    })
}

/// Byte width of a fixed-width type's values (0 for bit-packed booleans), or None.
pub(super) fn fixed_width(t: &DataType) -> Option<u64> {
    use DataType::*;
    Some(match t {
        Boolean => 0,
        Int8 | UInt8 => 1,
        Int16 | UInt16 | Float16 => 2,
        Int32 | UInt32 | Float32 | Date32 | Time32(_) | Decimal32(..) => 4,
        Int64 | UInt64 | Float64 | Date64 | Time64(_) | Timestamp(..) | Duration(_)
        | Decimal64(..) => 8,
        Decimal128(..) => 16,
        Decimal256(..) => 32,
        Interval(arrow_schema::IntervalUnit::YearMonth) => 4,
        Interval(arrow_schema::IntervalUnit::DayTime) => 8,
        Interval(arrow_schema::IntervalUnit::MonthDayNano) => 16,
        FixedSizeBinary(w) => *w as u64,
        _ => return None,
    })
}
