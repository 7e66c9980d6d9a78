//! The header checks: each refusal with its message, and (proptest) any bytes at all are a
//! header or an `InvalidArgument`, never a panic, while well-formed headers round-trip.

use super::json::{nesting, parse, Json};
use super::show::{float, short};
use super::*;
use proptest::prelude::*;

/// A file held in memory, which may claim a size other than its length (a file that
/// shrank after it was sized).
#[derive(Debug)]
pub(super) struct Bytes(pub(super) Vec<u8>, pub(super) Option<u64>);

impl Source for Bytes {
    fn name(&self) -> &'static str {
        "bytes"
    }
    fn path(&self) -> &std::path::Path {
        std::path::Path::new("mem")
    }
    fn flags(&self) -> crate::OpenFlags {
        crate::OpenFlags::parse("r").unwrap()
    }
    fn size(&self) -> Result<u64> {
        Ok(self.1.unwrap_or(self.0.len() as u64))
    }
    fn read_host(&self, span: HostSpan, offset: u64, _: &Settings) -> Result<usize> {
        let start = (offset as usize).min(self.0.len());
        let n = span.len().min(self.0.len() - start);
        span.copy_from(&self.0[start..start + n]);
        Ok(n)
    }
    fn write_host(&self, _: HostSpan, _: u64, _: &Settings) -> Result<usize> {
        unreachable!("read only")
    }
}

fn file(text: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text);
    out.extend_from_slice(data);
    out
}

fn read(bytes: Vec<u8>) -> Result<Header> {
    read_header(&Bytes(bytes, None), "f.st", &Settings::default())
}

fn refused(bytes: Vec<u8>, needle: &str) {
    match read(bytes) {
        Err(Error::InvalidArgument(m)) => {
            assert!(m.contains(needle), "{m}");
            assert!(m.contains("'f.st'"), "{m}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_good_header_reads_in_order_with_its_metadata() {
    let text = br#"{"b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6], "x": [1]},
        "__metadata__": {"z": "1", "a": "2"},
        "a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}"#;
    let h = read(file(text, &[0; 6])).unwrap();
    assert_eq!(h.data_start, 8 + text.len() as u64);
    let names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["b", "a"]);
    assert_eq!(h.tensors[0].shape, [2]);
    assert_eq!((h.tensors[1].begin, h.tensors[1].end), (0, 4));
    let meta = [("z", "1"), ("a", "2")].map(|(k, v)| (k.to_owned(), v.to_owned()));
    assert_eq!(h.metadata, meta);
    // A header longer than the first read takes a second one.
    let pad = format!(r#"{{"__metadata__": {{"p": "{}"}}}}"#, "x".repeat(200_000));
    let h = read(file(pad.as_bytes(), &[])).unwrap();
    assert_eq!(h.metadata[0].1.len(), 200_000);
}

#[test]
fn each_refusal_says_what_is_wrong() {
    refused(vec![0; 7], "only 7 bytes");
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    refused(huge, "more than the format's limit of 100000000");
    let mut long = 100u64.to_le_bytes().to_vec();
    long.extend_from_slice(b"{}");
    refused(long, "header claims 100 bytes, but the file has 10");
    let deep = format!(r#"{{"t": {}{}}}"#, "[".repeat(100), "]".repeat(100));
    let digits = format!(r#"{{"t": 1{}}}"#, "0".repeat(5000));
    // (header, data section bytes, what the message says)
    let cases: &[(&[u8], usize, &str)] = &[
        (b"", 1, "does not start with"),
        (b"\xff{}", 0, "not UTF-8 ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)"),
        (b" {}", 0, "does not start with '{' (it starts with ' {}')"),
        (b"{", 0, "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        (br#"{"t": NaN}"#, 0, "tensor 't' must be an object with dtype, shape and data_offsets, not nan"),
        (br#"{"a": 1, "a": 2}"#, 0, "gives key 'a' twice"),
        (br#"{"__metadata__": {"a": 1}}"#, 0, "__metadata__ must be an object of strings, not {'a': 1}"),
        (br#"{"t": {"dtype": "F32"}}"#, 0, "tensor 't' lacks shape, data_offsets"),
        (br#"{"t": {"dtype": "F4", "shape": [], "data_offsets": [0, 1]}}"#, 1, "has dtype F4, a float narrower than a byte"),
        (br#"{"t": {"dtype": ["F32"], "shape": [], "data_offsets": [0, 4]}}"#, 4, "has unknown dtype ['F32']; known: F64, F32,"),
        (br#"{"t": {"dtype": "F32", "shape": [true], "data_offsets": [0, 4]}}"#, 4, "has invalid shape [True]: a list of at most 64 integers from 0 to 9223372036854775807"),
        (br#"{"t": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4]}}"#, 4, "has invalid data_offsets [0.0, 4]: a list of two integers [begin, end]"),
        (br#"{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}"#, 8, "tensor 't' (F32[2]) claims bytes [0, 4) of a 8-byte data section; it needs 8 bytes"),
        (br#"{"t": {"dtype": "F64", "shape": [4611686018427387904, 4611686018427387904, 4], "data_offsets": [0, 100000000000000000000000000000000000000000]}}"#, 4, "claims bytes [0, 100000000000000000000000000000000000000000) of a 4-byte data section; it needs more bytes than that"),
        (br#"{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "b": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]}}"#, 10, "tensors 'a' and 'b' leave a hole between them (bytes [4, 6))"),
        (br#"{"a": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}"#, 6, "the start of the data and 'a' leave a hole"),
        (br#"{"a": {"dtype": "U8", "shape": [6], "data_offsets": [0, 6]}, "b": {"dtype": "U8", "shape": [6], "data_offsets": [4, 10]}}"#, 10, "tensors 'a' and 'b' overlap (bytes [6, 4))"),
        (br#"{"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}"#, 10, "the tensors end at byte 8 of a 10-byte data section"),
        (br#"{"\ud800": 1, "\udbff": 2}"#, 0, "not valid JSON (Lone surrogate \\ud800 in string: line 1 column 3 (char 2))"),
        (deep.as_bytes(), 0, "nests arrays or objects more than 64 deep"),
        (digits.as_bytes(), 0, "not valid JSON (Exceeds the limit (4300 digits)"),
    ];
    for &(text, data, needle) in cases {
        refused(file(text, &vec![0; data]), needle);
    }
}

#[test]
fn a_short_read_of_the_header_is_an_error() {
    let mut bytes = 200_000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[b' '; 100_000]);
    let e = read_header(&Bytes(bytes, Some(1 << 20)), "f", &Settings::default()).unwrap_err();
    assert!(
        e.to_string().contains(
            "the file was cut while its safetensors header was read (100000 of 200000 bytes)"
        ),
        "{e}"
    );
}

#[test]
fn values_are_shown_as_python_shows_them() {
    assert_eq!(float(1e16), "1e+16");
    assert_eq!(float(1.5e-5), "1.5e-05");
    assert_eq!(float(0.0001), "0.0001");
    assert_eq!(float(-0.0), "-0.0");
    assert_eq!(float(123.0), "123.0");
    assert_eq!(float(0.1), "0.1");
    let v = parse(
        r#"{"b": [1, 2, 3, 4, 5, 6, 7], "a": {"x": [[1]]}, "c": "it's", "d": null, "e": true}"#,
    )
    .unwrap();
    assert_eq!(
        short(&v),
        r#"{'a': {'x': [...]}, 'b': [1, 2, 3, 4, 5, 6, ...], 'c': "it's", 'd': None, ...}"#
    );
    let Json::Obj(pairs) = v else { panic!() };
    assert_eq!(short(&pairs[0].1), "[1, 2, 3, 4, 5, 6, ...]");
    let long = Json::Str("a".repeat(100));
    assert_eq!(
        short(&long),
        format!("'{}...{}'", "a".repeat(37), "a".repeat(38))
    );
    assert_eq!(
        short(&Json::Int("1".repeat(50))),
        format!("{}...{}", "1".repeat(18), "1".repeat(19))
    );
    assert_eq!(short(&Json::Str("\u{0}\n\u{e9}".into())), r"'\x00\né'");
}

#[test]
fn nesting_is_counted_outside_strings() {
    assert_eq!(nesting(br#"[["\"[[[", "\\", "]]]"]]"#, 100), 2);
    assert_eq!(nesting(b"{}", 100), 1);
    assert_eq!(nesting(b"1", 100), 0);
    assert_eq!(nesting(&[b'['; 1000], 64), 65); // stops just past the limit
}

/// JSON values of a few levels, as text.
fn values() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z\"\\\\\\[\\]{}]{0,4}".prop_map(|s| serde_like_quote(&s)),
    ];
    leaf.prop_recursive(4, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|v| format!("[{}]", v.join(", "))),
            proptest::collection::vec(("[a-z]{0,3}", inner), 0..4).prop_map(|v| {
                let mut seen = std::collections::HashSet::new();
                let pairs: Vec<String> = v
                    .into_iter()
                    .filter(|(k, _)| seen.insert(k.clone()))
                    .map(|(k, v)| format!("{}: {v}", serde_like_quote(&k)))
                    .collect();
                format!("{{{}}}", pairs.join(", "))
            }),
        ]
    })
}

/// `s` as a JSON string.
fn serde_like_quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn depth(v: &Json) -> usize {
    match v {
        Json::Arr(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Json::Obj(pairs) => 1 + pairs.iter().map(|(_, v)| depth(v)).max().unwrap_or(0),
        _ => 0,
    }
}

proptest! {
    #[test]
    fn the_nesting_scan_is_exact(text in values()) {
        let parsed = parse(&text).unwrap();
        prop_assert_eq!(nesting(text.as_bytes(), usize::MAX), depth(&parsed));
    }

    #[test]
    fn any_bytes_are_a_header_or_an_invalid_argument(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        text in values(),
        length in prop_oneof![any::<u64>(), 0u64..300],
        data in proptest::collection::vec(any::<u8>(), 0..24),
    ) {
        for file in [
            bytes.clone(),
            file(&bytes, &data),
            file(text.as_bytes(), &data),
            [length.to_le_bytes().as_slice(), &bytes].concat(),
        ] {
            if let Err(e) = read(file) {
                prop_assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
            }
        }
    }

    #[test]
    fn a_valid_file_cut_anywhere_is_refused(cut in 0usize..80) {
        let whole = file(br#"{"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}"#, &[0; 12]);
        let cut = cut.min(whole.len() - 1);
        prop_assert!(matches!(read(whole[..cut].to_vec()), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn well_formed_headers_round_trip(
        tensors in proptest::collection::vec(
            ("[a-z]{1,6}", 0usize..DTYPES.len(), proptest::collection::vec(0u64..5, 0..4)),
            0..6,
        ),
        meta in proptest::collection::vec(("[a-z]{1,4}", "[ -~]{0,6}"), 0..3),
    ) {
        let mut seen = std::collections::HashSet::new();
        let mut at = 0u64;
        let mut want = Vec::new();
        for (name, d, shape) in tensors {
            if !seen.insert(name.clone()) {
                continue;
            }
            let (dtype, itemsize) = DTYPES[d];
            let n = shape.iter().product::<u64>() * itemsize;
            want.push(Tensor { name, dtype: dtype.to_owned(), shape, begin: at, end: at + n });
            at += n;
        }
        let mut keys = std::collections::HashSet::new();
        let meta: Vec<(String, String)> =
            meta.into_iter().filter(|(k, _)| keys.insert(k.clone())).collect();
        let mut parts: Vec<String> = want
            .iter()
            .rev() // the header's order is not the data's
            .map(|t| format!(
                r#"{}: {{"dtype": "{}", "shape": {:?}, "data_offsets": [{}, {}]}}"#,
                serde_like_quote(&t.name), t.dtype, t.shape, t.begin, t.end
            ))
            .collect();
        let m: Vec<String> = meta
            .iter()
            .map(|(k, v)| format!("{}: {}", serde_like_quote(k), serde_like_quote(v)))
            .collect();
        parts.push(format!(r#""__metadata__": {{{}}}"#, m.join(", ")));
        let text = format!("{{{}}}", parts.join(", "));
        let h = read(file(text.as_bytes(), &vec![7; at as usize])).unwrap();
        want.reverse();
        prop_assert_eq!(h.tensors, want);
        prop_assert_eq!(h.metadata, meta);
        prop_assert_eq!(h.data_start, 8 + text.len() as u64);
    }
}
