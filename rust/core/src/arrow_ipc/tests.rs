//! Tests of IPC parsing and planning: files and streams written by arrow-rs read back to
//! the same bytes, and malformed files (cut, flipped, lying lengths) give errors, never a
//! panic or a plan larger than the file.

use std::sync::Arc;

use arrow_array::builder::{Int64Builder, ListBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BinaryViewArray, Float64Array, Int32Array, RecordBatch, StringArray,
    StringViewArray, StructArray, UnionArray,
};
use arrow_ipc::writer::{FileWriter, StreamWriter};
use arrow_schema::{DataType, Field, UnionFields};
use proptest::prelude::*;

use super::*;
use crate::error::Error;

fn sample(rows: usize, seed: i32) -> RecordBatch {
    let ints: ArrayRef = Arc::new(Int32Array::from_iter(
        (0..rows).map(|i| (i % 3 != 0).then_some(i as i32 * seed)),
    ));
    let strings: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows).map(|i| format!("s{}", i * 7)),
    ));
    let mut lists = ListBuilder::new(Int64Builder::new());
    for i in 0..rows {
        for j in 0..(i % 4) {
            lists.values().append_value((i * j) as i64);
        }
        lists.append(i % 5 != 1);
    }
    let lists: ArrayRef = Arc::new(lists.finish());
    let mut dict = StringDictionaryBuilder::<Int32Type>::new();
    for i in 0..rows {
        dict.append_value(["red", "green", "blue"][i % 3]);
    }
    let dict: ArrayRef = Arc::new(dict.finish());
    let inner: ArrayRef = Arc::new(Int32Array::from_iter_values(0..rows as i32));
    let structs: ArrayRef = Arc::new(StructArray::from(vec![(
        Arc::new(Field::new("x", DataType::Int32, false)),
        inner,
    )]));
    RecordBatch::try_from_iter([
        ("ints", ints),
        ("strings", strings),
        ("lists", lists),
        ("dict", dict),
        ("structs", structs),
    ])
    .unwrap()
}

fn file_bytes(batches: &[RecordBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = FileWriter::try_new(&mut out, &batches[0].schema()).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap();
    drop(w);
    out
}

fn stream_bytes(batches: &[RecordBatch]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new(&mut out, &batches[0].schema()).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap();
    drop(w);
    out
}

/// The bytes of range `i` of `plan` in `bytes`.
fn range<'a>(bytes: &'a [u8], plan: &ReadPlan, i: usize) -> &'a [u8] {
    let (o, l) = plan.ranges[i];
    &bytes[o as usize..(o + l) as usize]
}

fn check_roundtrip(bytes: &[u8], batches: &[RecordBatch]) {
    let file = IpcFile::read(bytes).unwrap();
    assert_eq!(file.schema.fields.len(), 5);
    let plan = file.plan(None, None).unwrap();
    assert_eq!(plan.batches.len(), batches.len());
    assert!(plan.bytes() <= bytes.len() as u64);
    for (layout, batch) in plan.batches.iter().zip(batches) {
        assert_eq!(layout.num_rows as usize, batch.num_rows());
        // ints: validity then values
        let ints = &layout.columns[0];
        let want = batch.column(0).to_data();
        assert_eq!(ints.null_count as usize, want.null_count());
        let values = range(bytes, &plan, ints.buffers[1].unwrap());
        assert_eq!(
            &values[..want.len() * 4],
            &want.buffers()[0].as_slice()[..want.len() * 4]
        );
        // strings: offsets and data
        let s = &layout.columns[1];
        let want = batch.column(1).to_data();
        let offsets = range(bytes, &plan, s.buffers[1].unwrap());
        assert_eq!(
            &offsets[..(want.len() + 1) * 4],
            want.buffers()[0].as_slice()
        );
        // lists have a child, dictionaries a dictionary, structs a field
        assert_eq!(layout.columns[2].children.len(), 1);
        let d = layout.columns[3].dictionary.as_ref().unwrap();
        assert_eq!(d.length, 3);
        assert_eq!(layout.columns[4].children.len(), 1);
    }
    // A subset reads only its own bytes.
    let sub = file
        .plan(Some(&[1]), Some(&[batches.len() as i64 - 1]))
        .unwrap();
    let from_end = file.plan(Some(&[1]), Some(&[-1])).unwrap();
    assert_eq!(from_end.ranges, sub.ranges, "-1 is the last record batch");
    assert!(file
        .plan(None, Some(&[-(batches.len() as i64) - 1]))
        .is_err());
    assert_eq!(sub.batches.len(), 1);
    assert_eq!(sub.batches[0].columns.len(), 1);
    assert!(sub.bytes() < plan.bytes());
    assert_eq!(sub.schema.fields().len(), 1);
    assert_eq!(sub.schema.field(0).name(), "strings");
}

#[test]
fn file_format_roundtrip() {
    let batches = [sample(100, 1), sample(37, 2), sample(3, 3)];
    let bytes = file_bytes(&batches);
    assert_eq!(scan(bytes.as_slice()).unwrap().format, Format::File);
    check_roundtrip(&bytes, &batches);
}

#[test]
fn stream_format_roundtrip() {
    let batches = [sample(100, 1), sample(37, 2), sample(5, 3)];
    let bytes = stream_bytes(&batches);
    assert_eq!(scan(bytes.as_slice()).unwrap().format, Format::Stream);
    check_roundtrip(&bytes, &batches);
}

#[test]
fn errors_name_what_is_wrong() {
    let bytes = file_bytes(&[sample(10, 1)]);
    let file = IpcFile::read(bytes.as_slice()).unwrap();
    let e = file
        .column_indices(&["nope".to_owned()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope") && e.contains("ints"), "{e}");
    assert!(file.plan(None, Some(&[1])).is_err());
    assert!(file.plan(Some(&[9]), None).is_err());
    let e = IpcFile::read(&bytes[..bytes.len() - 3])
        .unwrap_err()
        .to_string();
    assert!(e.contains("Arrow IPC"), "{e}");
    assert!(IpcFile::read(&[][..]).is_err());
}

/// [`check_malformed`] on `bytes` with `edits` made (a byte set at each index) and a
/// 64-bit `lie` written at its index, then on those bytes cut at `cut`.
fn check_damaged(
    mut bytes: Vec<u8>,
    edits: &[(prop::sample::Index, u8)],
    lie: Option<(prop::sample::Index, i64)>,
    cut: prop::sample::Index,
) {
    for (at, value) in edits {
        let i = at.index(bytes.len());
        bytes[i] = *value;
    }
    if let Some((at, value)) = lie {
        let i = at.index(bytes.len() - 8);
        bytes[i..i + 8].copy_from_slice(&value.to_le_bytes());
    }
    check_malformed(&bytes);
    let n = cut.index(bytes.len());
    check_malformed(&bytes[..n]);
}

fn check_malformed(bytes: &[u8]) {
    let Ok(file) = IpcFile::read(bytes) else {
        return;
    };
    if let Ok(plan) = file.plan(None, None) {
        assert!(plan.bytes() <= bytes.len() as u64);
        for &(o, l) in &plan.ranges {
            assert!(o + l <= bytes.len() as u64);
        }
        // Extended dictionaries concatenate, or fail, without a panic.
        for built in &plan.built {
            let parts: Vec<Part<'_>> = built
                .parts
                .iter()
                .map(|p| Part {
                    length: p.length,
                    null_count: p.null_count,
                    buffers: p
                        .buffers
                        .iter()
                        .map(|b| b.map_or(&[][..], |i| range(bytes, &plan, i)))
                        .collect(),
                })
                .collect();
            let _ = concat(&built.parts[0].data_type, &parts, "fuzz");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn malformed_files_never_panic(
        stream in any::<bool>(),
        cut in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        lie in prop::option::of((any::<prop::sample::Index>(), any::<i64>())),
    ) {
        let batches = [sample(20, 1), sample(7, 2)];
        let bytes = if stream { stream_bytes(&batches) } else { file_bytes(&batches) };
        check_damaged(bytes, &edits, lie, cut);
    }
}

#[test]
fn decode_checks_declared_lengths() {
    let mut raw = (-1i64).to_le_bytes().to_vec();
    raw.extend_from_slice(b"abcd");
    assert_eq!(decode(Codec::Zstd, &raw, 4, "b").unwrap(), b"abcd");
    assert!(decode(Codec::Zstd, &raw, 5, "b").is_err());
    // An LZ4 frame that says it holds more than it does.
    let mut frame = Vec::new();
    {
        use std::io::Write;
        let mut w = lz4_flex::frame::FrameEncoder::new(&mut frame);
        w.write_all(&[7u8; 1000]).unwrap();
        w.finish().unwrap();
    }
    let mut good = 1000i64.to_le_bytes().to_vec();
    good.extend_from_slice(&frame);
    assert_eq!(
        decode(Codec::Lz4Frame, &good, 1000, "b").unwrap(),
        vec![7u8; 1000]
    );
    let mut lying = (1i64 << 40).to_le_bytes().to_vec();
    lying.extend_from_slice(&frame);
    assert!(decode(Codec::Lz4Frame, &lying, 0, "b").is_err());
    let mut short = 999i64.to_le_bytes().to_vec();
    short.extend_from_slice(&frame);
    assert!(decode(Codec::Lz4Frame, &short, 0, "b").is_err());
    assert!(decode(Codec::Zstd, &[1, 2, 3], 0, "b").is_err());
}

/// `data` as an IPC ZSTD buffer declaring `declared` bytes: the length prefix, then the
/// frames of `parts` (one frame each).
fn zstd_buffer(declared: i64, parts: &[&[u8]]) -> Vec<u8> {
    let mut raw = declared.to_le_bytes().to_vec();
    for part in parts {
        raw.extend_from_slice(&zstd::bulk::compress(part, 3).unwrap());
    }
    raw
}

#[test]
fn zstd_buffers_decode_in_place_and_as_a_stream() {
    let text: Vec<u8> = (0..300_000u32)
        .flat_map(|i| (i % 251).to_le_bytes())
        .collect();
    // Within the reserved bound: decoded in place.
    let raw = zstd_buffer(text.len() as i64, &[&text]);
    assert_eq!(decode(Codec::Zstd, &raw, 0, "b").unwrap(), text);
    // Two frames in one buffer decode to both.
    let raw = zstd_buffer(2 * text.len() as i64, &[&text, &text]);
    assert_eq!(
        decode(Codec::Zstd, &raw, 0, "b").unwrap(),
        [&text[..], &text[..]].concat()
    );
    // Zeros compress over a thousandfold: still decoded, into exactly their size.
    let zeros = vec![0u8; 64 << 20];
    let raw = zstd_buffer(zeros.len() as i64, &[&zeros]);
    assert!(((raw.len() - 8) as u64) * 1000 < zeros.len() as u64);
    assert_eq!(decode(Codec::Zstd, &raw, 0, "b").unwrap(), zeros);
}

#[test]
fn zstd_buffers_that_misstate_their_length_say_so() {
    let data = vec![5u8; 1000];
    let message = |declared: i64| {
        let raw = zstd_buffer(declared, &[&data]);
        match decode(Codec::Zstd, &raw, 0, "batch 0, column x, buffer 1") {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("{declared}: {other:?}"),
        }
    };
    let more = message(999);
    assert!(more.contains("batch 0, column x, buffer 1"), "{more}");
    // The frame's own content size gives it away before anything is decoded.
    assert!(
        more.contains("says it holds 999 bytes uncompressed, its Zstd frame 1000"),
        "{more}"
    );
    let fewer = message(1001);
    assert!(
        fewer.contains("says it holds 1001 bytes uncompressed, decodes to 1000"),
        "{fewer}"
    );
    // A length its compressed bytes cannot hold is refused before decoding.
    let huge = message(1 << 50);
    assert!(huge.contains("compressed bytes can hold"), "{huge}");
    // Not ZSTD at all.
    let mut raw = 1000i64.to_le_bytes().to_vec();
    raw.extend_from_slice(&[0x55; 64]);
    assert!(decode(Codec::Zstd, &raw, 0, "b").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn decode_never_panics(
        zstd in any::<bool>(),
        declared in prop_oneof![Just(-1i64), 0i64..4096, any::<i64>()],
        body in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut raw = declared.to_le_bytes().to_vec();
        raw.extend_from_slice(&body);
        let codec = if zstd { Codec::Zstd } else { Codec::Lz4Frame };
        if let Ok(out) = decode(codec, &raw, 0, "b") {
            prop_assert!(declared == -1 || out.len() as i64 == declared);
        }
    }
}

/// A batch of view-typed columns (long values: data buffers) and unions (sparse, dense).
fn views_and_unions(rows: usize) -> RecordBatch {
    let text = |i: usize| format!("value {i} ").repeat(1 + i % 5);
    let sv: ArrayRef = Arc::new(StringViewArray::from_iter(
        (0..rows).map(|i| (i % 4 != 1).then(|| text(i))),
    ));
    let bv: ArrayRef = Arc::new(BinaryViewArray::from_iter_values(
        (0..rows).map(|i| text(i).into_bytes()),
    ));
    let fields = UnionFields::new(
        vec![2, 5],
        vec![
            Field::new("i", DataType::Int32, true),
            Field::new("f", DataType::Float64, true),
        ],
    );
    let ids: Vec<i8> = (0..rows).map(|i| if i % 3 == 0 { 5 } else { 2 }).collect();
    let sparse: ArrayRef = Arc::new(
        UnionArray::try_new(
            fields.clone(),
            ids.clone().into(),
            None,
            vec![
                Arc::new(Int32Array::from_iter_values(0..rows as i32)),
                Arc::new(Float64Array::from_iter_values((0..rows).map(|i| i as f64))),
            ],
        )
        .unwrap(),
    );
    let (mut ints, mut floats) = (0i32, 0i32);
    let offsets: Vec<i32> = ids
        .iter()
        .map(|&id| {
            let n = if id == 2 { &mut ints } else { &mut floats };
            *n += 1;
            *n - 1
        })
        .collect();
    let dense: ArrayRef = Arc::new(
        UnionArray::try_new(
            fields,
            ids.into(),
            Some(offsets.into()),
            vec![
                Arc::new(Int32Array::from_iter_values(0..ints)),
                Arc::new(Float64Array::from_iter_values((0..floats).map(f64::from))),
            ],
        )
        .unwrap(),
    );
    RecordBatch::try_from_iter([("sv", sv), ("bv", bv), ("sparse", sparse), ("dense", dense)])
        .unwrap()
}

#[test]
fn views_and_unions_are_planned() {
    let batches = [views_and_unions(40), views_and_unions(3)];
    for bytes in [file_bytes(&batches), stream_bytes(&batches)] {
        let file = IpcFile::read(bytes.as_slice()).unwrap();
        let plan = file.plan(None, None).unwrap();
        assert!(plan.bytes() <= bytes.len() as u64);
        for (layout, batch) in plan.batches.iter().zip(&batches) {
            let [sv, bv, sparse, dense] = &layout.columns[..] else {
                panic!("four columns")
            };
            // validity, views, then the data buffers arrow-rs wrote
            for (column, want) in [(sv, batch.column(0)), (bv, batch.column(1))] {
                let want = want.to_data();
                assert_eq!(column.buffers.len(), 1 + want.buffers().len());
                let views = range(&bytes, &plan, column.buffers[1].unwrap());
                assert_eq!(&views[..want.len() * 16], want.buffers()[0].as_slice());
                for (got, want) in column.buffers[2..].iter().zip(&want.buffers()[1..]) {
                    let got = got.map_or(&[][..], |i| range(&bytes, &plan, i));
                    assert_eq!(&got[..want.len()], want.as_slice());
                }
            }
            // unions: type ids (and offsets), no validity, two members
            assert_eq!((sparse.buffers.len(), sparse.children.len()), (1, 2));
            assert_eq!((dense.buffers.len(), dense.children.len()), (2, 2));
            let ids = range(&bytes, &plan, dense.buffers[0].unwrap());
            assert_eq!(
                &ids[..batch.num_rows()],
                batch.column(3).to_data().buffers()[0].as_slice()
            );
        }
        // A subset after the views walks past their data buffers.
        let sub = file.plan(Some(&[3]), Some(&[0])).unwrap();
        assert_eq!(sub.batches[0].columns[0].children.len(), 2);
    }
}

/// `bytes` (an IPC stream) re-framed message by message, each message of `kind` rebuilt:
/// `rebuild` is given a builder and the message, and returns the new header's type and
/// offset; the body stays as it was.
fn restream<F>(bytes: &[u8], kind: Kind, mut rebuild: F) -> Vec<u8>
where
    F: FnMut(
        &mut flatbuffers::FlatBufferBuilder<'static>,
        &arrow_ipc::Message<'_>,
    ) -> (
        arrow_ipc::MessageHeader,
        flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>,
    ),
{
    let messages = scan(bytes).unwrap();
    let SchemaBytes::Message(schema) = &messages.schema else {
        panic!("a stream")
    };
    let mut out = Vec::new();
    let mut frame = |meta: &[u8], body: &[u8]| {
        let padded = meta.len().div_ceil(8) * 8;
        out.extend_from_slice(&u32::MAX.to_le_bytes());
        out.extend_from_slice(&(padded as i32).to_le_bytes());
        out.extend_from_slice(meta);
        out.resize(out.len() + padded - meta.len(), 0);
        out.extend_from_slice(body);
    };
    frame(schema, &[]);
    for (k, m) in &messages.messages {
        let body = &bytes[m.body_offset as usize..(m.body_offset + m.body_len) as usize];
        if *k != kind {
            frame(&m.metadata, body);
            continue;
        }
        let parsed = m.message().unwrap();
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let (header_type, header) = rebuild(&mut fbb, &parsed);
        let message = arrow_ipc::Message::create(
            &mut fbb,
            &arrow_ipc::MessageArgs {
                version: parsed.version(),
                header_type,
                header: Some(header),
                bodyLength: parsed.bodyLength(),
                custom_metadata: None,
            },
        );
        fbb.finish(message, None);
        frame(fbb.finished_data(), body);
    }
    out.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
    out
}

/// `rb` copied into `fbb` uncompressed, with `variadicBufferCounts` set to `counts`.
fn copy_batch(
    fbb: &mut flatbuffers::FlatBufferBuilder<'static>,
    rb: &arrow_ipc::RecordBatch<'_>,
    counts: Option<&[i64]>,
) -> flatbuffers::WIPOffset<arrow_ipc::RecordBatch<'static>> {
    let nodes: Vec<_> = rb.nodes().unwrap().iter().copied().collect();
    let buffers: Vec<_> = rb.buffers().unwrap().iter().copied().collect();
    let nodes = fbb.create_vector(&nodes);
    let buffers = fbb.create_vector(&buffers);
    let counts = counts.map(|c| fbb.create_vector(c));
    arrow_ipc::RecordBatch::create(
        fbb,
        &arrow_ipc::RecordBatchArgs {
            length: rb.length(),
            nodes: Some(nodes),
            buffers: Some(buffers),
            compression: None,
            variadicBufferCounts: counts,
        },
    )
}

/// `bytes` (an IPC stream) with its record batches' `variadicBufferCounts` set to `counts`
/// (removed when `None`), every message re-framed.
fn with_variadic_counts(bytes: &[u8], counts: Option<&[i64]>) -> Vec<u8> {
    restream(bytes, Kind::RecordBatch, |fbb, parsed| {
        let rb = parsed.header_as_record_batch().unwrap();
        let batch = copy_batch(fbb, &rb, counts);
        (
            arrow_ipc::MessageHeader::RecordBatch,
            batch.as_union_value(),
        )
    })
}

#[test]
fn lying_variadic_counts_are_errors() {
    let bytes = stream_bytes(&[views_and_unions(30)]);
    let file = IpcFile::read(bytes.as_slice()).unwrap();
    let counts: Vec<i64> = {
        let (_, m) = &file.messages.messages[0];
        let parsed = m.message().unwrap();
        let rb = parsed.header_as_record_batch().unwrap();
        rb.variadicBufferCounts().unwrap().iter().collect()
    };
    assert_eq!(counts.len(), 2);
    // Re-framed as they were, the stream still reads.
    let same = with_variadic_counts(&bytes, Some(&counts));
    assert!(IpcFile::read(same.as_slice())
        .unwrap()
        .plan(None, None)
        .is_ok());
    let lies: [Option<&[i64]>; 7] = [
        None,
        Some(&[]),
        Some(&[counts[0]]),
        Some(&[-1, counts[1]]),
        Some(&[counts[0], i64::MAX]),
        Some(&[i64::MIN, 0]),
        Some(&[counts[0] + counts[1] + 100, 0]),
    ];
    for lie in lies {
        let bad = with_variadic_counts(&bytes, lie);
        let e = IpcFile::read(bad.as_slice())
            .unwrap()
            .plan(None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("variadic") || e.contains("buffers"),
            "{lie:?}: {e}"
        );
    }
    // Counts that shift buffers between the two columns give a plan no larger than
    // the file, or an error.
    if counts[0] > 0 {
        let shifted = with_variadic_counts(&bytes, Some(&[counts[0] - 1, counts[1] + 1]));
        check_malformed(&shifted);
    }
}

#[test]
fn union_type_ids_are_checked() {
    use super::schema::union_type_ids;
    assert_eq!(union_type_ids(None, 3, "u").unwrap(), vec![0, 1, 2]);
    assert_eq!(
        union_type_ids(Some(vec![127, 0]), 2, "u").unwrap(),
        vec![127, 0]
    );
    for (ids, n) in [
        (vec![0, 128], 2),
        (vec![-1], 1),
        (vec![3, 3], 2),
        (vec![1, 2], 3),
        (vec![i32::MAX], 1),
    ] {
        let e = union_type_ids(Some(ids.clone()), n, "u")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'u'"), "{ids:?}: {e}");
    }
    assert!(union_type_ids(None, 200, "u").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn malformed_views_and_unions_never_panic(
        stream in any::<bool>(),
        cut in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        lie in prop::option::of((any::<prop::sample::Index>(), any::<i64>())),
        counts in prop::option::of(prop::collection::vec(
            prop_oneof![0i64..8, any::<i64>()], 0..4)),
    ) {
        let batches = [views_and_unions(25), views_and_unions(4)];
        let mut bytes = if stream { stream_bytes(&batches) } else { file_bytes(&batches) };
        if let (true, Some(counts)) = (stream, &counts) {
            bytes = with_variadic_counts(&bytes, Some(counts));
        }
        check_damaged(bytes, &edits, lie, cut);
    }
}

/// `bytes` (an IPC stream) with its dictionary batches marked as deltas of dictionary `id`.
fn as_deltas(bytes: &[u8], id: i64) -> Vec<u8> {
    restream(bytes, Kind::Dictionary, |fbb, parsed| {
        let d = parsed.header_as_dictionary_batch().unwrap();
        let data = copy_batch(fbb, &d.data().unwrap(), None);
        let batch = arrow_ipc::DictionaryBatch::create(
            fbb,
            &arrow_ipc::DictionaryBatchArgs {
                id,
                data: Some(data),
                isDelta: true,
            },
        );
        (
            arrow_ipc::MessageHeader::DictionaryBatch,
            batch.as_union_value(),
        )
    })
}

/// A stream of dictionary-encoded batches whose dictionaries grow: written with deltas.
fn delta_stream(values: &[Vec<Option<&str>>]) -> (Vec<u8>, Vec<RecordBatch>) {
    use arrow_array::{DictionaryArray, Float64Array, Int8Array};
    use arrow_ipc::writer::{DictionaryHandling, IpcWriteOptions};
    let batches: Vec<RecordBatch> = values
        .iter()
        .map(|v| {
            let n = v.len() as i8;
            let keys = Int8Array::from_iter_values((0..n).rev());
            let strings: ArrayRef = Arc::new(
                DictionaryArray::try_new(keys.clone(), Arc::new(StringArray::from(v.clone())))
                    .unwrap(),
            );
            let floats = Float64Array::from_iter((0..n).map(|i| (i % 3 != 1).then_some(i as f64)));
            let floats: ArrayRef =
                Arc::new(DictionaryArray::try_new(keys, Arc::new(floats)).unwrap());
            RecordBatch::try_from_iter([("s", strings), ("f", floats)]).unwrap()
        })
        .collect();
    let mut out = Vec::new();
    let options = IpcWriteOptions::default().with_dictionary_handling(DictionaryHandling::Delta);
    let mut w =
        StreamWriter::try_new_with_options(&mut out, &batches[0].schema(), options).unwrap();
    for b in &batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap();
    drop(w);
    (out, batches)
}

/// The buffers of the planned array `column`'s built dictionary, concatenated.
fn built_buffers(bytes: &[u8], plan: &ReadPlan, column: &Column) -> Vec<Vec<u8>> {
    let built = &plan.built[column.built.unwrap()];
    let parts: Vec<Part<'_>> = built
        .parts
        .iter()
        .map(|p| Part {
            length: p.length,
            null_count: p.null_count,
            buffers: p
                .buffers
                .iter()
                .map(|b| b.map_or(&[][..], |i| range(bytes, plan, i)))
                .collect(),
        })
        .collect();
    concat(&column.data_type, &parts, "test").unwrap()
}

#[test]
fn delta_dictionaries_are_concatenated() {
    let (bytes, batches) = delta_stream(&[
        vec![Some("red"), Some("green")],
        vec![Some("red"), Some("green"), None, Some("blue")],
        vec![
            Some("red"),
            Some("green"),
            None,
            Some("blue"),
            Some("a longer value"),
        ],
    ]);
    let file = IpcFile::read(bytes.as_slice()).unwrap();
    let deltas = file
        .messages
        .messages
        .iter()
        .filter(|(k, m)| {
            *k == Kind::Dictionary
                && m.message()
                    .unwrap()
                    .header_as_dictionary_batch()
                    .unwrap()
                    .isDelta()
        })
        .count();
    assert_eq!(deltas, 4, "arrow-rs wrote deltas");
    let plan = file.plan(None, None).unwrap();
    for (layout, batch) in plan.batches.iter().zip(&batches) {
        for (column, want) in layout.columns.iter().zip(batch.columns()) {
            let want = want.to_data().child_data()[0].clone();
            let dictionary = column.dictionary.as_ref().unwrap();
            assert_eq!(dictionary.length as usize, want.len());
            assert_eq!(dictionary.null_count as usize, want.null_count());
            if dictionary.built.is_none() {
                continue; // the first batch: the base dictionary as it lies
            }
            let got = built_buffers(&bytes, &plan, dictionary);
            for (g, w) in got[1..].iter().zip(want.buffers()) {
                assert_eq!(&g[..], &w.as_slice()[..g.len()]);
                assert!(g.len() >= w.len().min(g.len()));
            }
            match want.nulls() {
                Some(n) => {
                    for i in 0..want.len() {
                        let bit = got[0][i / 8] >> (i % 8) & 1 == 1;
                        assert_eq!(bit, n.is_valid(i));
                    }
                }
                None => assert!(got[0].is_empty()),
            }
        }
    }
    // The base alone, before the first delta: read as it lies.
    let first = file.plan(None, Some(&[0])).unwrap();
    assert!(first.built.is_empty());
}

#[test]
fn delta_dictionaries_that_cannot_be_read_are_errors() {
    let bytes = stream_bytes(&[sample(10, 1)]);
    let file = IpcFile::read(bytes.as_slice()).unwrap();
    let id = file.schema.fields[3].dictionary.unwrap();
    // Every dictionary batch a delta: the column has no base dictionary...
    let deltas = as_deltas(&bytes, id);
    let file = IpcFile::read(deltas.as_slice()).unwrap();
    let e = file.plan(None, None).unwrap_err().to_string();
    assert!(
        e.contains("'dict'") && e.contains("no dictionary batch"),
        "{e}"
    );
    // ...and the other columns read.
    let plan = file.plan(Some(&[0, 1, 4]), None).unwrap();
    assert_eq!(plan.batches[0].columns.len(), 3);
    // A delta of a dictionary the schema lacks is malformed.
    let unknown = as_deltas(&bytes, id + 1000);
    let e = IpcFile::read(unknown.as_slice())
        .unwrap()
        .plan(Some(&[0]), None)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("lacks"),
        "{e}"
    );
}

#[test]
fn concat_checks_the_parts() {
    let t = DataType::Utf8;
    let offsets = |o: &[i32]| o.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let good = offsets(&[0, 2, 5]);
    let part = |offs: &'static [u8], data: &'static [u8]| Part {
        length: 2,
        null_count: 0,
        buffers: vec![&[], offs, data],
    };
    let good: &'static [u8] = Box::leak(good.into_boxed_slice());
    let out = concat(&t, &[part(good, b"abcde"), part(good, b"fghij")], "t").unwrap();
    assert_eq!(out[1], offsets(&[0, 2, 5, 7, 10]));
    assert_eq!(out[2], b"abcdefghij");
    assert!(out[0].is_empty());
    for bad in [&[0, 2, 9][..], &[3, 2, 5], &[0, -1, 5], &[0, 7, 5]] {
        let bad: &'static [u8] = Box::leak(offsets(bad).into_boxed_slice());
        assert!(concat(&t, &[part(good, b"abcde"), part(bad, b"fghij")], "t").is_err());
    }
    // Too few bytes for the lengths, for every layout.
    let short = Part {
        length: 100,
        null_count: 3,
        buffers: vec![&[0xFF], &[1, 2, 3], &[]],
    };
    for t in [
        DataType::Int32,
        DataType::Boolean,
        DataType::Utf8,
        DataType::LargeBinary,
    ] {
        assert!(concat(&t, &[short_clone(&short)], "t").is_err());
    }
    // Bitmaps at odd offsets.
    let bits = |len, bytes: &'static [u8]| Part {
        length: len,
        null_count: 1,
        buffers: vec![bytes, bytes],
    };
    let out = concat(
        &DataType::Boolean,
        &[bits(3, &[0b101]), bits(6, &[0b11_0110])],
        "t",
    )
    .unwrap();
    assert_eq!(out[0], vec![0b1011_0101, 0b1]);
    assert_eq!(out[1], out[0]);
}

fn short_clone<'a>(p: &Part<'a>) -> Part<'a> {
    Part {
        length: p.length,
        null_count: p.null_count,
        buffers: p.buffers.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn malformed_delta_streams_never_panic(
        cut in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        lie in prop::option::of((any::<prop::sample::Index>(), any::<i64>())),
    ) {
        let (bytes, _) = delta_stream(&[
            vec![Some("red"), None],
            vec![Some("red"), None, Some("a longer value than that")],
            vec![Some("red"), None, Some("a longer value than that"), Some("")],
        ]);
        check_damaged(bytes, &edits, lie, cut);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The reads that fill a layout put every byte of every range at its place, each
    /// place once, whatever the order of the places and the gaps in the file and in the
    /// table; neighbours join only where their spacing is the same in both.
    #[test]
    fn layout_reads_put_every_range_at_its_place(
        pieces in proptest::collection::vec((1u64..200, 0u64..100, 0usize..100), 0..40),
        seed in any::<u64>(),
    ) {
        // Ranges in file order, with gaps; places in a shuffled order, with gaps.
        let mut ranges = Vec::new();
        let mut at = 0u64;
        for &(len, gap, _) in &pieces {
            at += gap;
            ranges.push((at, len));
            at += len;
        }
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        let mut state = seed | 1;
        for i in (1..order.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut offsets = vec![0usize; ranges.len()];
        let mut end = 0usize;
        for &r in &order {
            end += pieces[r].2;
            offsets[r] = end;
            end += ranges[r].1 as usize;
        }
        let sizes: Vec<u64> = ranges.iter().map(|r| r.1).collect();
        let layout = Layout { offsets: offsets.clone(), total: end };
        let (reads, starts) = layout.reads(&ranges, &sizes);
        prop_assert_eq!(reads.len(), starts.len());
        // Each read's bytes land in the table without overlapping another's: the table
        // records which file byte each of its bytes came from.
        let mut table: Vec<Option<u64>> = vec![None; end];
        for (&(offset, len), &start) in reads.iter().zip(&starts) {
            prop_assert!(start + len as usize <= end);
            for (k, slot) in table[start..start + len as usize].iter_mut().enumerate() {
                prop_assert!(slot.is_none(), "a byte written twice");
                *slot = Some(offset + k as u64);
            }
        }
        // Every range's place holds its bytes. (A joined read also copies whatever lies
        // between its two ranges in the file, another range's bytes too, into the table's
        // gap between them, which no range uses.)
        for (r, &(ro, rl)) in ranges.iter().enumerate() {
            for k in 0..rl {
                prop_assert_eq!(table[offsets[r] + k as usize], Some(ro + k), "range {}", r);
            }
        }
    }
}

/// A host table's column over several record batches joins into one array: validity
/// bits one batch after another, offsets rebased; a list column says what to do instead.
#[test]
fn columns_join_over_record_batches() {
    let batches = [sample(20, 1), sample(7, 2), sample(0, 3), sample(13, 4)];
    let bytes = stream_bytes(&batches);
    let file = IpcFile::read(bytes.as_slice()).unwrap();
    let plan = file.plan(None, None).unwrap();
    // The ranges as read, in place in the file's bytes.
    let addresses: Vec<u64> = plan
        .ranges
        .iter()
        .map(|&(o, _)| bytes.as_ptr() as u64 + o)
        .collect();
    let sizes: Vec<u64> = plan.ranges.iter().map(|r| r.1).collect();
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let ints = join_column(&plan, &addresses, &sizes, 0).unwrap();
    assert_eq!(
        (ints.length, ints.data_type.clone()),
        (rows as i64, DataType::Int32)
    );
    let strings = join_column(&plan, &addresses, &sizes, 1).unwrap();
    let mut at = 0usize;
    for b in &batches {
        let want = b.column(0).as_any().downcast_ref::<Int32Array>().unwrap();
        let text = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        for i in 0..b.num_rows() {
            let j = at + i;
            let valid = ints.buffers[0][j / 8] >> (j % 8) & 1 == 1;
            assert_eq!(valid, want.is_valid(i), "row {j}");
            if valid {
                let v = &ints.buffers[1][j * 4..j * 4 + 4];
                assert_eq!(i32::from_le_bytes(v.try_into().unwrap()), want.value(i));
            }
            let offset = |k: usize| {
                let o = &strings.buffers[1][k * 4..k * 4 + 4];
                i32::from_le_bytes(o.try_into().unwrap()) as usize
            };
            let got = &strings.buffers[2][offset(j)..offset(j + 1)];
            assert_eq!(got, text.value(i).as_bytes(), "row {j}");
        }
        at += b.num_rows();
    }
    assert_eq!(
        ints.null_count,
        batches
            .iter()
            .map(|b| b.column(0).null_count() as i64)
            .sum()
    );
    // Lists are not joined: the error says what to do.
    let err = join_column(&plan, &addresses, &sizes, 2)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'lists'") && err.contains("column[i]"),
        "{err}"
    );
}
