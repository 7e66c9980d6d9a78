//! Read scheduling of a plan's byte ranges: neighbouring buffers of a record batch body
//! are read as one run (one element of the batch read) wherever that keeps every buffer
//! at its alignment in the allocation, so a whole-table read asks the file for a few
//! large reads per body rather than one per buffer.

/// A plan's ranges grouped into runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runs {
    /// `(file offset, length)` of each run, in the ranges' order.
    pub runs: Vec<(u64, u64)>,
    /// For each range, its run and its offset inside the run.
    pub place: Vec<(usize, u64)>,
}

/// Group `ranges` (`(offset, length)`, in the order they are placed) into runs: a range
/// joins the run before it when it starts at most `align - 1` bytes (a body's padding)
/// after that run's end and at the same offset modulo `align` as the run's start, so
/// that, with each run placed at a multiple of `align`, each range still is (`align` a
/// power of two). The runs cover every range and read at most `align - 1` bytes between
/// two of them.
pub fn coalesce(ranges: &[(u64, u64)], align: u64) -> Runs {
    let align = align.max(1);
    let mut runs: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    let mut place = Vec::with_capacity(ranges.len());
    for &(offset, len) in ranges {
        let last = runs.len().wrapping_sub(1);
        if let Some((start, run_len)) = runs.last_mut() {
            let end = *start + *run_len;
            let joins = offset >= end
                && offset - end < align
                && (offset - *start) % align == 0
                && offset.checked_add(len).is_some();
            if joins {
                *run_len = offset + len - *start;
                place.push((last, offset - *start));
                continue;
            }
        }
        runs.push((offset, len));
        place.push((runs.len() - 1, 0));
    }
    Runs { runs, place }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_body_of_padded_buffers_is_one_run() {
        // Buffers at 8 mod 64, each padded to 64: one run.
        let r = coalesce(&[(8, 100), (136, 64), (200, 0), (200, 3)], 64);
        assert_eq!(r.runs, vec![(8, 195)]);
        assert_eq!(r.place, vec![(0, 0), (0, 128), (0, 192), (0, 192)]);
        // Padded to 8 only: the run breaks where the alignment would.
        let r = coalesce(&[(0, 12), (16, 64), (80, 8)], 64);
        assert_eq!(r.runs, vec![(0, 12), (16, 72)]);
        // Far apart, or out of order: separate.
        let r = coalesce(&[(0, 64), (4096, 64), (0, 64)], 64);
        assert_eq!(r.runs.len(), 3);
    }

    proptest! {
        #[test]
        fn runs_keep_every_range_aligned_and_read_little_more(
            ranges in proptest::collection::vec((0u64..1 << 20, 0u64..5000), 0..60),
        ) {
            let r = coalesce(&ranges, 64);
            prop_assert_eq!(r.place.len(), ranges.len());
            let mut extra = 0u64;
            for (&(offset, len), &(run, within)) in ranges.iter().zip(&r.place) {
                let (start, run_len) = r.runs[run];
                prop_assert_eq!(start + within, offset);
                prop_assert!(within + len <= run_len);
                prop_assert_eq!(within % 64, 0);
            }
            for (i, &(_, run_len)) in r.runs.iter().enumerate() {
                let inside: u64 = ranges
                    .iter()
                    .zip(&r.place)
                    .filter(|(_, p)| p.0 == i)
                    .map(|(g, _)| g.1)
                    .sum();
                extra += run_len.saturating_sub(inside);
            }
            prop_assert!(extra <= 63 * ranges.len() as u64);
        }
    }
}
