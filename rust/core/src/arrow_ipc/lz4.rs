//! LZ4 frames walked block by block (the frame format: magic, descriptor, blocks, end
//! mark): where each block lies, whether blocks refer to earlier ones, and the block size.
//! The GPU plan hands independent blocks to nvCOMP; the host decodes blocks in place.

const LZ4_MAGIC: u32 = 0x184D_2204;

/// The blocks of one LZ4 frame: `(offset in frame, length, stored uncompressed)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lz4Frame {
    /// The data blocks in order.
    pub blocks: Vec<(u64, u64, bool)>,
    /// The frame's block size: every block decodes to at most this many bytes.
    pub block_max: u64,
    /// Whether blocks may refer to earlier blocks (they then cannot decode apart).
    pub linked: bool,
    /// The content size the header states, if it does.
    pub content_size: Option<u64>,
    /// Whether the frame carries checksums (of its blocks or its content).
    pub checksums: bool,
}

/// Walk one LZ4 frame that fills `frame` exactly, its header checksum checked: None for
/// anything else (a frame with a dictionary, skippable or several frames, a cut or damaged
/// frame; the frame decoder then takes it and names what is wrong).
pub fn lz4_frame(frame: &[u8]) -> Option<Lz4Frame> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(*frame.get(at..)?.first_chunk::<4>()?))
    };
    if u32_at(0)? != LZ4_MAGIC {
        return None;
    }
    let flags = *frame.get(4)?;
    let bd = *frame.get(5)?;
    // Version 01, reserved bit, no dictionary id; reserved bits of BD.
    if flags >> 6 != 0b01 || flags & 0b10 != 0 || flags & 0b1 != 0 || bd & 0b1000_1111 != 0 {
        return None;
    }
    let block_max: u64 = match bd >> 4 {
        4 => 64 << 10,
        5 => 256 << 10,
        6 => 1 << 20,
        7 => 4 << 20,
        _ => return None,
    };
    let block_checksum = flags & 0b1_0000 != 0;
    let content_checksum = flags & 0b100 != 0;
    let mut at = 6;
    let content_size = if flags & 0b1000 != 0 {
        let v = u64::from_le_bytes(*frame.get(at..)?.first_chunk::<8>()?);
        at += 8;
        Some(v)
    } else {
        None
    };
    // The header checksum: the second byte of the descriptor's xxHash32.
    let checksum = (twox_hash::XxHash32::oneshot(0, frame.get(4..at)?) >> 8) as u8;
    if *frame.get(at)? != checksum {
        return None;
    }
    at += 1;
    let mut blocks = Vec::new();
    loop {
        let word = u32_at(at)?;
        at += 4;
        if word == 0 {
            break;
        }
        let stored = word & 0x8000_0000 != 0;
        let len = u64::from(word & 0x7FFF_FFFF);
        if len > block_max {
            return None;
        }
        let end = at.checked_add(usize::try_from(len).ok()?)?;
        if end > frame.len() {
            return None;
        }
        blocks.push((at as u64, len, stored));
        at = end + if block_checksum { 4 } else { 0 };
    }
    if content_checksum {
        at += 4;
    }
    (at == frame.len()).then_some(Lz4Frame {
        blocks,
        block_max,
        linked: flags & 0b10_0000 == 0,
        content_size,
        checksums: block_checksum || content_checksum,
    })
}
