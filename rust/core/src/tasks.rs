//! Splitting a request into pool tasks, and the alignment arithmetic O_DIRECT needs.

/// The alignment O_DIRECT requires of file offsets, lengths and memory addresses.
/// 4096 covers every logical block size in common use (512 and 4096 bytes).
pub(crate) const DIRECT_IO_ALIGNMENT: usize = 4096;

/// `n` rounded down to a multiple of `align` (a power of two).
pub(crate) fn align_down(n: u64, align: usize) -> u64 {
    debug_assert!(align.is_power_of_two());
    n & !(align as u64 - 1)
}

/// `n` rounded up to a multiple of `align` (a power of two); saturates near `u64::MAX`.
pub(crate) fn align_up(n: u64, align: usize) -> u64 {
    debug_assert!(align.is_power_of_two());
    align_down(n.saturating_add(align as u64 - 1), align)
}

/// One piece of a request: `len` bytes at `file_offset`, to or from `buf_offset` of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    /// Where the piece starts in the file.
    pub file_offset: u64,
    /// Where the piece starts in the buffer.
    pub buf_offset: usize,
    /// The piece's length in bytes.
    pub len: usize,
}

/// Split `size` bytes at `file_offset` into tasks of at most `task_size` bytes.
///
/// When `task_size` is a multiple of [`DIRECT_IO_ALIGNMENT`], task boundaries sit on a grid
/// anchored at the aligned offset below `file_offset`, so every interior boundary is
/// aligned in the file: only the first and last task of a request can have unaligned
/// edges, and every other task can go through O_DIRECT whole. The first task may then be
/// shorter than `task_size`. An empty request yields no task.
pub fn split_tasks(file_offset: u64, size: usize, task_size: usize) -> TaskIter {
    assert!(task_size > 0, "task_size must be positive");
    let anchor = if task_size % DIRECT_IO_ALIGNMENT == 0 {
        align_down(file_offset, DIRECT_IO_ALIGNMENT)
    } else {
        file_offset
    };
    TaskIter {
        start: file_offset,
        next: file_offset,
        end: file_offset + size as u64,
        anchor,
        task_size: task_size as u64,
    }
}

/// Iterator returned by [`split_tasks`].
#[derive(Debug, Clone)]
pub struct TaskIter {
    start: u64,
    next: u64,
    end: u64,
    anchor: u64,
    task_size: u64,
}

impl Iterator for TaskIter {
    type Item = Task;

    fn next(&mut self) -> Option<Task> {
        if self.next >= self.end {
            return None;
        }
        let index = (self.next - self.anchor) / self.task_size;
        let boundary = self.anchor + (index + 1) * self.task_size;
        let stop = boundary.min(self.end);
        let task = Task {
            file_offset: self.next,
            buf_offset: (self.next - self.start) as usize,
            len: (stop - self.next) as usize,
        };
        self.next = stop;
        Some(task)
    }
}

/// A span `[offset, offset + len)` cut into an unaligned head, an aligned middle and an
/// unaligned tail (each possibly empty), as lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AlignedSplit {
    /// Bytes before the first multiple of the alignment.
    pub head: usize,
    /// Bytes from the first to the last multiple of the alignment.
    pub middle: usize,
    /// Bytes after the last multiple of the alignment.
    pub tail: usize,
}

impl AlignedSplit {
    /// Move the three parts in file order, skipping the empty ones: `part(at, len,
    /// aligned)` moves the `len` bytes `at` bytes into the span (`aligned` for the
    /// middle) and answers how many it moved. A short part (the end of the file) ends the
    /// transfer. The bytes moved in all.
    #[inline]
    pub(crate) fn move_in_order<E>(
        self,
        mut part: impl FnMut(usize, usize, bool) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let parts = [
            (0, self.head, false),
            (self.head, self.middle, true),
            (self.head + self.middle, self.tail, false),
        ];
        let mut done = 0;
        for (at, len, aligned) in parts {
            if len == 0 {
                continue;
            }
            let n = part(at, len, aligned)?;
            done += n;
            if n < len {
                break; // end of file
            }
        }
        Ok(done)
    }
}

/// Cut `[offset, offset + len)` at the first and last multiple of `align` inside it.
pub(crate) fn aligned_split(offset: u64, len: usize, align: usize) -> AlignedSplit {
    let end = offset + len as u64;
    let first = align_up(offset, align).min(end);
    let last = align_down(end, align).max(first);
    AlignedSplit {
        head: (first - offset) as usize,
        middle: (last - first) as usize,
        tail: (end - last) as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        let t: Vec<_> = split_tasks(0, 10, 4).collect();
        assert_eq!(t.iter().map(|t| t.len).collect::<Vec<_>>(), [4, 4, 2]);
        assert_eq!(split_tasks(7, 0, 4).count(), 0);
        // Aligned grid: the first task ends at the next 8 KiB boundary.
        let t: Vec<_> = split_tasks(100, 20_000, 8192).collect();
        assert_eq!(t[0].len, 8192 - 100);
        assert_eq!(t[1].file_offset, 8192);
        let big = split_tasks(5 << 30, 1 << 20, 4096).count();
        assert_eq!(big, 256);
        assert_eq!(
            aligned_split(100, 10_000, 4096),
            AlignedSplit {
                head: 3996,
                middle: 4096,
                tail: 1908
            }
        );
        assert_eq!(
            aligned_split(10, 20, 4096),
            AlignedSplit {
                head: 20,
                middle: 0,
                tail: 0
            }
        );
    }

    #[test]
    fn parts_move_in_file_order_until_one_comes_up_short() {
        let split = AlignedSplit {
            head: 10,
            middle: 0,
            tail: 5,
        };
        let mut seen = Vec::new();
        let moved = split.move_in_order(|at, len, aligned| {
            seen.push((at, len, aligned));
            Ok::<_, ()>(len)
        });
        assert_eq!(
            (moved, seen),
            (Ok(15), vec![(0, 10, false), (10, 5, false)])
        );
        let split = aligned_split(100, 10_000, 4096);
        let mut seen = Vec::new();
        let moved = split.move_in_order(|at, len, aligned| {
            seen.push((at, aligned));
            Ok::<_, ()>(if aligned { len / 2 } else { len })
        });
        assert_eq!(
            (moved, seen),
            (Ok(3996 + 2048), vec![(0, false), (3996, true)])
        );
        assert_eq!(
            split.move_in_order(|_, _, _| Err("refused")),
            Err("refused")
        );
    }

    proptest! {
        #[test]
        fn tasks_tile_the_request(
            offset in 0u64..(1u64 << 40),
            size in 0usize..(1 << 24),
            task_size in prop_oneof![1usize..100_000, (1usize..64).prop_map(|k| k * 4096)],
        ) {
            let tasks: Vec<Task> = split_tasks(offset, size, task_size).collect();
            let mut expect_file = offset;
            let mut expect_buf = 0usize;
            for task in &tasks {
                prop_assert_eq!(task.file_offset, expect_file);
                prop_assert_eq!(task.buf_offset, expect_buf);
                prop_assert!(task.len > 0 && task.len <= task_size);
                expect_file += task.len as u64;
                expect_buf += task.len;
            }
            prop_assert_eq!(expect_buf, size);
            prop_assert!(tasks.len() <= size.div_ceil(task_size) + 1);
            if task_size % DIRECT_IO_ALIGNMENT == 0 {
                for task in tasks.iter().skip(1) {
                    prop_assert_eq!(task.file_offset % DIRECT_IO_ALIGNMENT as u64, 0);
                }
            } else {
                prop_assert_eq!(tasks.len(), size.div_ceil(task_size));
            }
        }

        #[test]
        fn aligned_split_is_exact(
            offset in 0u64..(1u64 << 40),
            len in 0usize..(1 << 20),
            shift in 9u32..14,
        ) {
            let align = 1usize << shift;
            let s = aligned_split(offset, len, align);
            prop_assert_eq!(s.head + s.middle + s.tail, len);
            prop_assert!(s.head < align);
            prop_assert!(s.tail < align);
            prop_assert_eq!(s.middle % align, 0);
            if s.middle > 0 {
                prop_assert_eq!((offset + s.head as u64) % align as u64, 0);
            }
        }

        #[test]
        fn align_roundtrip(n in 0u64..(1u64 << 62), shift in 0u32..20) {
            let align = 1usize << shift;
            let down = align_down(n, align);
            let up = align_up(n, align);
            prop_assert!(down <= n && n <= up);
            prop_assert!(n - down < align as u64 && up - n < align as u64);
            prop_assert_eq!(down % align as u64, 0);
            prop_assert_eq!(up % align as u64, 0);
        }
    }
}
