//! The header writer: exact bytes, the order and alignment of the data section, each
//! refusal with its message, and (proptest) any tensors and metadata written are read
//! back by the engine's own reader as given, while any input at all is a header or an
//! `InvalidArgument`, never a panic.

use super::tests::Bytes;
use super::write::{write_header, Entry, Written, WRITE_ORDER};
use super::*;
use proptest::prelude::*;

fn entry(name: &str, dtype: &str, shape: &[u64]) -> Entry {
    let itemsize = DTYPES.iter().find(|(d, _)| *d == dtype).map_or(1, |d| d.1);
    Entry {
        name: name.to_owned(),
        dtype: dtype.to_owned(),
        shape: shape.to_vec(),
        // Wrapped where it overflows (the tests of any input want that refused).
        nbytes: shape.iter().fold(itemsize, |n, &d| n.wrapping_mul(d)),
    }
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The JSON of a written header, without its length and padding.
fn json(w: &Written) -> &str {
    let len = u64::from_le_bytes(w.header[..8].try_into().unwrap()) as usize;
    assert_eq!(w.header.len(), 8 + len);
    std::str::from_utf8(&w.header[8..])
        .unwrap()
        .trim_end_matches(' ')
}

/// `w`'s header read back by the engine's reader, from a file of `w`'s size (the data
/// section is not read, so it is not held).
fn read_back(w: &Written) -> Header {
    let file = Bytes(w.header.clone(), Some(w.file_size()));
    read_header(&file, "f.st", &Settings::default()).unwrap()
}

fn refused(tensors: &[Entry], metadata: Option<&[(String, String)]>, needle: &str) {
    match write_header(tensors, metadata) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn one_tensor_is_written_as_safetensors_writes_it() {
    let w = write_header(&[entry("b", "U8", &[3])], None).unwrap();
    let mut expected = 56u64.to_le_bytes().to_vec();
    expected.extend_from_slice(br#"{"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}   "#);
    assert_eq!(w.header, expected);
    assert_eq!((w.offsets.as_slice(), w.data_size), (&[0][..], 3));
    assert_eq!(w.file_size(), 67);
    // No tensors: the smallest header, padded to 8 bytes.
    let w = write_header(&[], None).unwrap();
    assert_eq!(w.header, b"\x08\0\0\0\0\0\0\0{}      ");
    assert_eq!(w.data_size, 0);
}

#[test]
fn larger_items_come_first_then_dtype_then_name() {
    let given = [
        entry("ai", "I32", &[1]),
        entry("zf", "F32", &[1]),
        entry("c", "C64", &[1]),
        entry("d", "F64", &[1]),
        entry("u", "U64", &[1]),
        entry("b", "U8", &[3]),
        entry("a", "U8", &[]),
        entry("e", "BOOL", &[0, 5]),
        entry("h", "BF16", &[3]),
    ];
    let w = write_header(&given, None).unwrap();
    assert_eq!(w.offsets, [28, 24, 16, 8, 0, 39, 38, 42, 32]);
    assert_eq!(w.data_size, 42);
    let h = read_back(&w);
    let names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["u", "d", "c", "zf", "ai", "h", "a", "b", "e"]);
    assert_eq!(h.data_start % 8, 0);
}

#[test]
fn the_write_order_holds_every_dtype_once_by_item_size() {
    let size = |d: &str| DTYPES.iter().find(|(k, _)| *k == d).unwrap().1;
    let mut sorted = WRITE_ORDER.to_vec();
    sorted.sort_unstable();
    let mut known = DTYPES.map(|(d, _)| d).to_vec();
    known.sort_unstable();
    assert_eq!(sorted, known);
    for pair in WRITE_ORDER.windows(2) {
        assert!(size(pair[0]) >= size(pair[1]), "{pair:?}");
    }
    assert!(WRITE_ORDER.iter().all(|d| size(d).is_power_of_two()));
}

#[test]
fn strings_are_escaped_as_json_requires() {
    let name = "\n\t\r\u{8}\u{c}/\u{1f}\u{0}\"\\é\u{2028}😀\u{7f}";
    let w = write_header(&[entry(name, "U8", &[1])], Some(&pairs(&[("\u{1}", "\"")]))).unwrap();
    assert_eq!(
        json(&w),
        "{\"__metadata__\":{\"\\u0001\":\"\\\"\"},\"\\n\\t\\r\\b\\f/\\u001f\\u0000\\\"\\\\é\u{2028}😀\u{7f}\":\
         {\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"
    );
    let h = read_back(&w);
    assert_eq!(h.tensors[0].name, name);
    assert_eq!(h.metadata, pairs(&[("\u{1}", "\"")]));
}

#[test]
fn metadata_comes_first_sorted_by_key() {
    let meta = pairs(&[("k", "v"), ("a", "1"), ("", "")]);
    let w = write_header(&[entry("t", "F16", &[2, 0])], Some(&meta)).unwrap();
    assert_eq!(
        json(&w),
        r#"{"__metadata__":{"":"","a":"1","k":"v"},"t":{"dtype":"F16","shape":[2,0],"data_offsets":[0,0]}}"#
    );
    assert_eq!(
        read_back(&w).metadata,
        pairs(&[("", ""), ("a", "1"), ("k", "v")])
    );
    // Given but empty, it is written; not given, it is not.
    let w = write_header(&[], Some(&[])).unwrap();
    assert_eq!(json(&w), r#"{"__metadata__":{}}"#);
    assert!(read_back(&w).metadata.is_empty());
}

#[test]
fn each_refusal_says_what_is_wrong() {
    let bytes = |name: &str, dtype: &str, shape: &[u64], nbytes: u64| Entry {
        name: name.to_owned(),
        dtype: dtype.to_owned(),
        shape: shape.to_vec(),
        nbytes,
    };
    let big = i64::MAX as u64;
    let cases: &[(Vec<Entry>, &str)] = &[
        (vec![entry("__metadata__", "U8", &[1])], "may not be named '__metadata__'"),
        (vec![entry("t", "F4", &[1])], "tensor 't' has dtype 'F4', which is not a safetensors dtype kvikpy writes; supported: F64, F32,"),
        (vec![entry("t", "f32", &[1])], "has dtype 'f32'"),
        (vec![bytes("t", "F32", &[2, 3], 20)], "tensor 't' (F32 of shape [2, 3]) has 20 bytes; its shape and dtype make 24 (4 bytes an item)"),
        (vec![bytes("t", "F64", &[1 << 62, 1 << 62], 0)], "its shape and dtype make more than 2**64"),
        (vec![bytes("t", "F64", &[big, 0, big], 8)], "has 8 bytes; its shape and dtype make 0"),
        (vec![entry("t", "U8", &[1; 65])], "tensor 't' has 65 dimensions; a safetensors tensor has at most 64"),
        (vec![bytes("t", "U8", &[1 << 63], 1 << 63)], "has dimension 9223372036854775808; dimensions go up to 9223372036854775807"),
        (vec![entry("a", "U8", &[1]), entry("a", "F32", &[1])], "tensor 'a' is given twice"),
        (vec![bytes("a", "U8", &[big], big), bytes("b", "U8", &[1], 1)], "the tensors come to more than 9223372036854775807 bytes"),
        (vec![bytes("a", "U8", &[big - 100], big - 100)], "the header and tensors come to more than"),
    ];
    for (tensors, needle) in cases {
        refused(tensors, None, needle);
    }
    let twice = pairs(&[("k", "1"), ("j", "2"), ("k", "3")]);
    refused(&[], Some(&twice), "metadata key 'k' is given twice");
}

#[test]
fn the_header_is_at_most_the_formats_limit() {
    let base = r#"{"__metadata__":{"k":""}}"#.len();
    let at_limit = pairs(&[("k", &"x".repeat(MAX_HEADER as usize - base))]);
    let w = write_header(&[], Some(&at_limit)).unwrap();
    assert_eq!(w.header.len() as u64, 8 + MAX_HEADER);
    assert_eq!(read_back(&w).metadata, at_limit);
    let over = pairs(&[("k", &"x".repeat(MAX_HEADER as usize - base + 1))]);
    refused(&[], Some(&over), "the safetensors header would have 100000008 bytes, more than the format's limit of 100000000");
    // Escapes count: 17 million control characters take 102 million bytes.
    let name = "\u{1}".repeat(17_000_000);
    refused(
        &[entry(&name, "U8", &[1])],
        None,
        "more than the format's limit",
    );
}

/// Tensor names: any text, and text made of what JSON escapes.
fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[\"\\\\/\\x00-\\x1f\\x7f a-c\u{e9}\u{1F600}]{0,6}"
    ]
    .prop_filter("the metadata key", |n| n != "__metadata__")
}

fn tensors() -> impl Strategy<Value = Vec<Entry>> {
    let one = (0..DTYPES.len(), prop::collection::vec(0u64..5, 0..4));
    prop::collection::hash_map(names(), one, 0..10).prop_map(|map| {
        map.into_iter()
            .map(|(name, (d, shape))| entry(&name, DTYPES[d].0, &shape))
            .collect()
    })
}

fn metadata() -> impl Strategy<Value = Option<Vec<(String, String)>>> {
    prop::option::of(
        prop::collection::hash_map(names(), any::<String>(), 0..5)
            .prop_map(|m| m.into_iter().collect()),
    )
}

proptest! {
    #[test]
    fn what_is_written_reads_back_as_given(tensors in tensors(), metadata in metadata()) {
        let w = write_header(&tensors, metadata.as_deref()).unwrap();
        prop_assert_eq!(w.header.len() % 8, 0);
        let h = read_back(&w);
        prop_assert_eq!(h.data_start, w.header.len() as u64);
        prop_assert_eq!(h.tensors.len(), tensors.len());
        let rank = |d: &str| WRITE_ORDER.iter().position(|k| *k == d).unwrap();
        for pair in h.tensors.windows(2) {
            prop_assert!((rank(&pair[0].dtype), &pair[0].name) < (rank(&pair[1].dtype), &pair[1].name));
        }
        for (t, &offset) in tensors.iter().zip(&w.offsets) {
            let read = h.tensors.iter().find(|r| r.name == t.name).unwrap();
            prop_assert_eq!(&read.dtype, &t.dtype);
            prop_assert_eq!(&read.shape, &t.shape);
            prop_assert_eq!((read.begin, read.end), (offset, offset + t.nbytes));
            let itemsize = DTYPES.iter().find(|(d, _)| *d == t.dtype).unwrap().1;
            prop_assert_eq!((h.data_start + offset) % itemsize, 0);
        }
        prop_assert_eq!(w.data_size, tensors.iter().map(|t| t.nbytes).sum::<u64>());
        let mut expected = metadata.clone().unwrap_or_default();
        expected.sort();
        prop_assert_eq!(h.metadata, expected);
        prop_assert_eq!(json(&w).starts_with("{\"__metadata__\":"), metadata.is_some());
    }

    #[test]
    fn any_input_is_a_header_or_a_refusal(
        raw in prop::collection::vec(
            (names(), prop_oneof![Just("F32".to_owned()), Just("U8".to_owned()), ".{0,4}"],
             prop::collection::vec(prop_oneof![0u64..3, any::<u64>()], 0..4), any::<u64>()),
            0..5),
        metadata in metadata(),
    ) {
        let tensors: Vec<Entry> = raw
            .into_iter()
            .map(|(name, dtype, shape, nbytes)| {
                let exact = entry(&name, &dtype, &shape);
                // Mostly the right byte count (when it fits), sometimes any.
                let nbytes = if nbytes % 4 == 0 { nbytes } else { exact.nbytes };
                Entry { nbytes, ..exact }
            })
            .collect();
        match write_header(&tensors, metadata.as_deref()) {
            Ok(w) => prop_assert_eq!(read_back(&w).tensors.len(), tensors.len()),
            Err(Error::InvalidArgument(_)) => {}
            Err(other) => prop_assert!(false, "{other:?}"),
        }
    }
}
