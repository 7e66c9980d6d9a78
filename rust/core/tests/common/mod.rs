//! What the engine's integration tests share: a file's test bytes and a host buffer
//! placed at a chosen distance past a page boundary.

use kvikpy_core::{HostSpan, Span};

/// `len` bytes from `seed`: cheap, non-zero, non-repeating at page granularity (xorshift).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A buffer of `len` bytes whose address is `misalign` bytes past a page boundary, filled
/// with 0xEE so that a test sees which bytes a read left untouched.
pub struct Placed {
    pub storage: Vec<u8>,
    pub start: usize,
    pub len: usize,
}

impl Placed {
    pub fn new(len: usize, misalign: usize) -> Self {
        let storage = vec![0xEEu8; len + 8192];
        let base = storage.as_ptr() as usize;
        let start = (4096 - base % 4096) % 4096 + misalign;
        Self {
            storage,
            start,
            len,
        }
    }

    pub fn span(&mut self) -> Span {
        Span::Host(HostSpan::from_slice(
            &mut self.storage[self.start..self.start + self.len],
        ))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}
