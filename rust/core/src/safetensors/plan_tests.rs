//! The read plan's tests: examples of each rule, and (proptest) every input byte in
//! exactly one merged run, runs that cannot merge further, windows that hold every read
//! once within their bound, results equal to a plain reference model of each routine,
//! and any numbers at all a plan or an `InvalidArgument`, never a panic.

use std::collections::BTreeMap;

use super::plan::*;
use crate::error::Error;
use proptest::prelude::*;

fn read(file: usize, file_offset: u64, length: u64, dest: u64, at: u64) -> Read {
    Read {
        file,
        file_offset,
        length,
        dest,
        at,
    }
}

fn piece(file: usize, file_offset: u64, length: u64) -> Piece {
    Piece {
        file,
        file_offset,
        length,
    }
}

/// Each run as `(file, file_offset, length, dest, at, input indices)`.
fn runs(m: &Merged) -> Vec<(usize, u64, u64, u64, u64, Vec<usize>)> {
    (0..m.runs.len())
        .map(|k| {
            let r = m.runs[k].read;
            (
                r.file,
                r.file_offset,
                r.length,
                r.dest,
                r.at,
                m.members(k).to_vec(),
            )
        })
        .collect()
}

/// Each window as `(file, offset, length, alone, input indices)`.
fn shown(w: &Windows) -> Vec<(usize, u64, u64, bool, Vec<usize>)> {
    (0..w.windows.len())
        .map(|k| {
            let x = &w.windows[k];
            (x.file, x.offset, x.length, x.alone, w.members(k).to_vec())
        })
        .collect()
}

fn refused<T: std::fmt::Debug>(got: crate::error::Result<T>, needle: &str) {
    match got {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn reads_next_in_file_and_destination_merge_in_the_given_order() {
    let reads = [
        read(0, 0, 10, 0, 0),
        read(0, 10, 5, 0, 10),  // follows in both: merged
        read(0, 15, 5, 0, 64),  // follows in the file only
        read(0, 100, 4, 0, 69), // follows in the destination only
        read(1, 104, 4, 0, 73), // another file
        read(1, 108, 4, 1, 77), // another destination
    ];
    let m = merge(&reads, Order::Given).unwrap();
    assert_eq!(
        runs(&m),
        vec![
            (0, 0, 15, 0, 0, vec![0, 1]),
            (0, 15, 5, 0, 64, vec![2]),
            (0, 100, 4, 0, 69, vec![3]),
            (1, 104, 4, 0, 73, vec![4]),
            (1, 108, 4, 1, 77, vec![5]),
        ]
    );
    // Out of order, nothing merges as given; sorted by file and offset, it does.
    let shuffled = [reads[1], reads[0]];
    assert_eq!(merge(&shuffled, Order::Given).unwrap().runs.len(), 2);
    let sorted = merge(&shuffled, Order::ByFile).unwrap();
    assert_eq!(runs(&sorted), vec![(0, 0, 15, 0, 0, vec![1, 0])]);
}

#[test]
fn sorting_is_by_file_then_offset_and_keeps_ties_in_input_order() {
    let reads = [
        read(1, 0, 1, 0, 500),
        read(0, 7, 1, 0, 100),
        read(0, 7, 2, 0, 200),
        read(0, 3, 1, 0, 300),
    ];
    let m = merge(&reads, Order::ByFile).unwrap();
    assert_eq!(m.order, vec![3, 1, 2, 0]);
}

#[test]
fn zero_length_reads_merge_like_any_other() {
    let reads = [
        read(0, 0, 4, 0, 0),
        read(0, 4, 0, 0, 4),
        read(0, 4, 4, 0, 4),
    ];
    let m = merge(&reads, Order::Given).unwrap();
    assert_eq!(runs(&m), vec![(0, 0, 8, 0, 0, vec![0, 1, 2])]);
    assert_eq!(merge(&[], Order::ByFile).unwrap().runs, vec![]);
}

#[test]
fn an_end_past_two_to_the_64_is_refused() {
    let max = u64::MAX;
    refused(
        merge(&[read(0, max - 1, 2, 0, 0)], Order::Given),
        "read 0: file offset",
    );
    refused(
        merge(&[read(0, 0, 1, 0, 0), read(0, 0, 2, 0, max)], Order::ByFile),
        "read 1: destination offset",
    );
    // Ends of exactly 2**64 - 1 are fine, as is a read of nothing at the very end.
    assert!(merge(&[read(0, max - 2, 2, 0, max - 2)], Order::Given).is_ok());
    assert!(merge(&[read(0, max, 0, 0, max)], Order::Given).is_ok());
    refused(pack(&[piece(0, max, 1)], 64), "piece 0: file offset");
    refused(
        pack(&[piece(0, 0, max), piece(0, 0, 1)], 64),
        "more than 2**64 bytes",
    );
    refused(pack(&[piece(0, 0, 1)], 0), "alignment");
    refused(windows(&[piece(0, 1, max)], 10, 10), "read 0: file offset");
}

#[test]
fn pack_lays_pieces_at_aligned_places_and_merges_their_reads() {
    let pieces = [
        piece(0, 0, 64),
        piece(0, 64, 10), // next in the file, at place 64: merged with the first
        piece(0, 74, 0),  // no bytes: a place, no read
        piece(0, 74, 6),  // next in the file, but at 128 in the destination
        piece(2, 0, 1),
    ];
    let p = pack(&pieces, 64).unwrap();
    assert_eq!(p.places, vec![0, 64, 128, 128, 192]);
    assert_eq!(p.total, 193);
    assert_eq!(
        runs(&p.reads),
        vec![
            (0, 0, 74, 0, 0, vec![0, 1]),
            (0, 74, 6, 0, 128, vec![3]),
            (2, 0, 1, 0, 192, vec![4]),
        ]
    );
    let none = pack(&[], 64).unwrap();
    assert_eq!((none.places, none.total), (vec![], 0));
}

#[test]
fn a_file_that_fits_the_bound_is_one_window() {
    let reads: Vec<Piece> = [0, 100, 300, 2000].map(|o| piece(0, o, 100)).to_vec();
    let whole = windows(&reads, 2100, 2000).unwrap();
    assert_eq!(shown(&whole), vec![(0, 0, 2100, false, vec![0, 1, 2, 3])]);
    let split = windows(&reads, 2100, 1000).unwrap(); // the gap of 1600 bytes splits
    assert_eq!(
        shown(&split),
        vec![
            (0, 0, 400, false, vec![0, 1, 2]),
            (0, 2000, 100, false, vec![3])
        ]
    );
    let mut with_big = reads.clone();
    with_big.push(piece(0, 500, 3000));
    assert_eq!(
        shown(&windows(&with_big, 2100, 2000).unwrap()),
        vec![
            (0, 0, 400, false, vec![0, 1, 2]),
            (0, 500, 3000, true, vec![4]),
            (0, 2000, 100, false, vec![3]),
        ]
    );
}

#[test]
fn windows_sort_by_file_offset_and_length_and_read_through_overlaps() {
    let reads = [
        piece(1, 0, 4),
        piece(0, 10, 8),
        piece(0, 10, 2),
        piece(0, 12, 2),
    ];
    // Overlapping reads are within any gap, even 0; the bound counts the furthest end.
    let w = windows(&reads, 8, 0).unwrap();
    assert_eq!(
        shown(&w),
        vec![(0, 10, 8, false, vec![2, 1, 3]), (1, 0, 4, false, vec![0])]
    );
    // With a gap of 0, touching reads split; with 1 they join.
    let touching = [piece(0, 0, 2), piece(0, 2, 2)];
    assert_eq!(windows(&touching, 10, 0).unwrap().windows.len(), 2);
    assert_eq!(windows(&touching, 10, 1).unwrap().windows.len(), 1);
    // A gap near 2**64 does not overflow.
    let far = [piece(0, 0, 1), piece(0, u64::MAX - 1, 1)];
    assert_eq!(windows(&far, u64::MAX, u64::MAX).unwrap().windows.len(), 1);
}

/// Python's `coalesced` with `_joined`, transliterated: the reference the merge must equal.
fn merge_model(reads: &[Read], sort: bool) -> Vec<(usize, u64, u64, u64, u64, Vec<usize>)> {
    let mut seq: Vec<usize> = (0..reads.len()).collect();
    if sort {
        seq.sort_by_key(|&i| (reads[i].file, reads[i].file_offset));
    }
    let mut out: Vec<(usize, u64, u64, u64, u64, Vec<usize>)> = Vec::new();
    for i in seq {
        let r = reads[i];
        if let Some(last) = out.last_mut() {
            if last.0 == r.file
                && last.3 == r.dest
                && u128::from(last.1) + u128::from(last.2) == u128::from(r.file_offset)
                && u128::from(last.4) + u128::from(last.2) == u128::from(r.at)
            {
                last.2 += r.length;
                last.5.push(i);
                continue;
            }
        }
        out.push((r.file, r.file_offset, r.length, r.dest, r.at, vec![i]));
    }
    out
}

/// Python's `_windows`, transliterated with wide arithmetic.
fn windows_model(
    reads: &[Piece],
    bound: u64,
    gap: u64,
) -> Vec<(usize, u64, u64, bool, Vec<usize>)> {
    let mut seq: Vec<usize> = (0..reads.len()).collect();
    seq.sort_by_key(|&i| (reads[i].file, reads[i].file_offset, reads[i].length));
    let (bound, gap) = (i128::from(bound), i128::from(gap));
    let mut out = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let (mut start, mut end) = (0i128, 0i128);
    let flush = |cur: &[usize], start: i128, end: i128| {
        (
            reads[cur[0]].file,
            start as u64,
            (end - start) as u64,
            false,
            cur.to_vec(),
        )
    };
    for i in seq {
        let r = reads[i];
        let (off, len) = (i128::from(r.file_offset), i128::from(r.length));
        if len > bound {
            if !cur.is_empty() {
                out.push(flush(&cur, start, end));
                cur.clear();
            }
            out.push((r.file, r.file_offset, r.length, true, vec![i]));
            continue;
        }
        if !cur.is_empty()
            && r.file == reads[cur[0]].file
            && off - end < gap
            && end.max(off + len) - start <= bound
        {
            cur.push(i);
            end = end.max(off + len);
            continue;
        }
        if !cur.is_empty() {
            out.push(flush(&cur, start, end));
        }
        cur = vec![i];
        start = off;
        end = off + len;
    }
    if !cur.is_empty() {
        out.push(flush(&cur, start, end));
    }
    out
}

/// Reads of tensors laid out one after another (with gaps) in a few files, into a few
/// destinations, in a shuffled order: many of them mergeable.
fn layouts() -> impl Strategy<Value = Vec<Read>> {
    proptest::collection::vec((0usize..3, 0u64..3, 0u64..3, 0u64..40, 0u64..3), 0..24)
        .prop_map(|specs| {
            // Each (file, dest) pair keeps a cursor in the file and one in the destination;
            // small skips leave gaps in one or the other, or neither.
            let mut cursors: BTreeMap<(usize, u64), (u64, u64)> = BTreeMap::new();
            specs
                .into_iter()
                .map(|(file, dest, skip_file, length, skip_at)| {
                    let c = cursors.entry((file, dest)).or_insert((0, 0));
                    let r = read(file, c.0 + skip_file, length, dest, c.1 + skip_at);
                    *c = (r.file_offset + length, r.at + length);
                    r
                })
                .collect::<Vec<Read>>()
        })
        .prop_shuffle()
}

/// Reads of one to three files, tensors one after another with gaps, some overlapping.
fn spans() -> impl Strategy<Value = Vec<Piece>> {
    proptest::collection::vec((0usize..3, 0u64..40, 0u64..120, any::<bool>()), 0..30)
        .prop_map(|specs| {
            let mut at = [0u64; 3];
            specs
                .into_iter()
                .map(|(file, gap, length, back)| {
                    let start = if back {
                        at[file].saturating_sub(gap)
                    } else {
                        at[file] + gap
                    };
                    at[file] = start + length;
                    piece(file, start, length)
                })
                .collect::<Vec<Piece>>()
        })
        .prop_shuffle()
}

proptest! {
    #[test]
    fn merge_equals_the_reference_and_covers_every_byte_once(
        reads in layouts(),
        sort in any::<bool>(),
    ) {
        let m = merge(&reads, if sort { Order::ByFile } else { Order::Given }).unwrap();
        prop_assert_eq!(runs(&m), merge_model(&reads, sort));
        // Every input read is in exactly one run, and each run is its members end to end.
        let mut seen = m.order.clone();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..reads.len()).collect::<Vec<_>>());
        for (k, run) in m.runs.iter().enumerate() {
            let (mut file_at, mut dest_at) = (run.read.file_offset, run.read.at);
            for &i in m.members(k) {
                let r = reads[i];
                prop_assert_eq!((r.file, r.dest), (run.read.file, run.read.dest));
                prop_assert_eq!((r.file_offset, r.at), (file_at, dest_at));
                file_at += r.length;
                dest_at += r.length;
            }
            prop_assert_eq!(file_at - run.read.file_offset, run.read.length);
        }
        // Maximal: no run could merge into the one before it.
        for pair in m.runs.windows(2) {
            let (a, b) = (pair[0].read, pair[1].read);
            prop_assert!(
                a.file != b.file
                    || a.dest != b.dest
                    || a.file_offset + a.length != b.file_offset
                    || a.at + a.length != b.at
            );
        }
        if sort {
            let keys: Vec<_> = m.order.iter().map(|&i| (reads[i].file, reads[i].file_offset)).collect();
            prop_assert!(keys.windows(2).all(|k| k[0] <= k[1]));
        }
    }

    #[test]
    fn pack_places_every_byte_once_at_aligned_places(
        pieces in proptest::collection::vec((0usize..3, 0u64..300, 0u64..150), 0..20),
        align in prop_oneof![Just(64u64), 1u64..100],
    ) {
        let pieces: Vec<Piece> = pieces.into_iter().map(|(f, o, n)| piece(f, o, n)).collect();
        let p = pack(&pieces, align).unwrap();
        // The reference: places by wide arithmetic.
        let mut end = 0u128;
        let mut want = Vec::new();
        for q in &pieces {
            end = end.div_ceil(u128::from(align)) * u128::from(align);
            want.push(end as u64);
            end += u128::from(q.length);
        }
        prop_assert_eq!(&p.places, &want);
        prop_assert_eq!(u128::from(p.total), end);
        // Each destination byte is written by one read, with the byte its piece wants.
        let mut expected = vec![None; p.total as usize];
        for (q, &at) in pieces.iter().zip(&p.places) {
            prop_assert_eq!(at % align, 0);
            for k in 0..q.length {
                expected[(at + k) as usize] = Some((q.file, q.file_offset + k));
            }
        }
        let mut got = vec![None; p.total as usize];
        for run in &p.reads.runs {
            prop_assert_eq!(run.read.dest, 0);
            for k in 0..run.read.length {
                let slot = &mut got[(run.read.at + k) as usize];
                prop_assert!(slot.is_none(), "two reads write one byte");
                *slot = Some((run.read.file, run.read.file_offset + k));
            }
        }
        prop_assert_eq!(got, expected);
        // The members are the pieces with bytes, in order, and the merge is the reference's.
        let nonempty: Vec<usize> = (0..pieces.len()).filter(|&i| pieces[i].length > 0).collect();
        prop_assert_eq!(&p.reads.order, &nonempty);
        let as_reads: Vec<Read> = nonempty
            .iter()
            .map(|&i| read(pieces[i].file, pieces[i].file_offset, pieces[i].length, 0, p.places[i]))
            .collect();
        let model: Vec<_> = merge_model(&as_reads, false)
            .into_iter()
            .map(|(f, o, n, d, a, members)| (f, o, n, d, a, members.iter().map(|&k| nonempty[k]).collect()))
            .collect();
        prop_assert_eq!(runs(&p.reads), model);
    }

    #[test]
    fn windows_equal_the_reference_and_hold_every_read_once_within_the_bound(
        reads in spans(),
        bound in 1u64..300,
        gap in 0u64..50,
    ) {
        let w = windows(&reads, bound, gap).unwrap();
        prop_assert_eq!(shown(&w), windows_model(&reads, bound, gap));
        let mut seen = w.order.clone();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..reads.len()).collect::<Vec<_>>());
        let mut next = 0;
        for (k, x) in w.windows.iter().enumerate() {
            prop_assert_eq!(x.members.start, next); // consecutive, none left out
            next = x.members.end;
            let held = w.members(k);
            prop_assert!(!held.is_empty());
            prop_assert!(held.iter().all(|&i| reads[i].file == x.file));
            prop_assert_eq!(x.offset, reads[held[0]].file_offset);
            let end = held.iter().map(|&i| reads[i].file_offset + reads[i].length).max();
            prop_assert_eq!(Some(x.offset + x.length), end);
            if x.alone {
                prop_assert!(held.len() == 1 && reads[held[0]].length > bound);
            } else {
                prop_assert!(x.length <= bound);
            }
        }
        prop_assert_eq!(next, reads.len());
    }

    #[test]
    fn any_numbers_are_a_plan_or_an_invalid_argument(
        raw in proptest::collection::vec(
            (0usize..3, any::<u64>(), any::<u64>(), 0u64..2, any::<u64>()),
            0..8,
        ),
        bound in any::<u64>(),
        gap in any::<u64>(),
        align in any::<u64>(),
    ) {
        let reads: Vec<Read> = raw.iter().map(|&(f, o, n, d, a)| read(f, o, n, d, a)).collect();
        let pieces: Vec<Piece> = raw.iter().map(|&(f, o, n, _, _)| piece(f, o, n)).collect();
        let overflows = |r: &Read| r.file_offset.checked_add(r.length).is_none();
        for order in [Order::Given, Order::ByFile] {
            match merge(&reads, order) {
                Ok(m) => prop_assert!(!reads.iter().any(|r| overflows(r) || r.at.checked_add(r.length).is_none())
                    && m.order.len() == reads.len()),
                Err(e) => prop_assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}"),
            }
        }
        match windows(&pieces, bound, gap) {
            Ok(w) => prop_assert!(!reads.iter().any(overflows) && w.order.len() == pieces.len()),
            Err(e) => prop_assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}"),
        }
        if let Err(e) = pack(&pieces, align) {
            prop_assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        }
    }
}
