//! Reads by residency on real files: cold, warm and half-warm files read the same bytes in
//! every mode, and the counters show which path each part took (O_DIRECT bytes, probes).
//! One test per process state: the counters are process-wide, so the scenarios that
//! assert exact counts run one after another in a single test.

// A test file: its helpers unwrap as its tests do (clippy allows that in `#[test]`s only).
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

use kvikpy_core::page_cache::{drop_file, residency, FileRef};
use kvikpy_core::settings::DirectIoRead;
use kvikpy_core::source::residency::{Method, Prober};
use kvikpy_core::source::{direct_read_bytes, residency_probes};
use kvikpy_core::{submit, Completion, Direction, FileHandle, Request, Settings};

mod common;
use common::{pattern, Placed};

const MIB: usize = 1 << 20;
/// 24 MiB and a bit: the last block is partial, so O_DIRECT must stop before it.
const FILE_LEN: usize = 24 * MIB + 1234;

fn settings(mode: DirectIoRead) -> Settings {
    Settings {
        num_threads: 2,
        auto_direct_io_read: mode,
        task_size: 4 * MIB,
        gds_threshold: 0,
        ..Settings::default()
    }
}

/// Read `size` bytes at `offset` into a buffer `misalign` bytes past a page boundary
/// (filled with 0xEE first); the byte count and the buffer, whose bytes past the count
/// must still be 0xEE.
fn read(path: &Path, mode: DirectIoRead, offset: u64, size: usize, misalign: usize) -> Vec<u8> {
    let handle = FileHandle::open(path, "r").unwrap();
    let mut buf = Placed::new(size, misalign);
    let request = Request::new(Direction::Read, buf.span(), offset);
    let n = submit(&settings(mode), &handle, request, Completion::Future)
        .unwrap()
        .wait()
        .unwrap();
    handle.close();
    assert!(
        buf.bytes()[n..].iter().all(|&b| b == 0xEE),
        "bytes past EOF untouched"
    );
    buf.bytes()[..n].to_vec()
}

fn evict(path: &Path) {
    drop_file(FileRef::Path(path), 0, 0, true).unwrap();
}

fn resident_pages(path: &Path, offset: u64, len: u64) -> u64 {
    residency(FileRef::Path(path), offset, len).unwrap().0
}

/// Counter deltas `(O_DIRECT bytes, probes)` across `work`.
fn counted<T>(work: impl FnOnce() -> T) -> (T, u64, u64) {
    let (direct, probes) = (direct_read_bytes(), residency_probes());
    let out = work();
    (
        out,
        direct_read_bytes() - direct,
        residency_probes() - probes,
    )
}

#[test]
fn cold_warm_and_half_warm_files_by_residency() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let data = pattern(FILE_LEN, 5);
    let mut f = fs::File::create(&path).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    evict(&path);
    if resident_pages(&path, 0, 0) != 0 {
        eprintln!("skipped: this file system keeps its pages after POSIX_FADV_DONTNEED");
        return;
    }
    let by_residency = DirectIoRead::ByResidency;

    // Cold: every whole block by O_DIRECT (the partial last block through the page
    // cache), one probe per MiB, and the middle is not left in the cache.
    let (got, direct, probes) = counted(|| read(&path, by_residency, 0, FILE_LEN + 5000, 0));
    assert!(got == data, "cold read by residency");
    assert_eq!(direct, (FILE_LEN / 4096 * 4096) as u64);
    assert_eq!(probes, 24);
    assert!(resident_pages(&path, 0, (FILE_LEN / 2) as u64) <= 1);

    // Warm: all through the page cache, still one probe per MiB.
    assert!(read(&path, DirectIoRead::Buffered, 0, FILE_LEN, 0) == data);
    let (got, direct, probes) = counted(|| read(&path, by_residency, 0, FILE_LEN, 0));
    assert!(got == data, "warm read by residency");
    assert_eq!((direct, probes), (0, 24));

    // Forced modes keep their meaning: O_DIRECT on a warm file, the page cache on a cold one.
    let (got, direct, probes) = counted(|| read(&path, DirectIoRead::Direct, 0, FILE_LEN, 0));
    assert!(got == data);
    assert_eq!((direct, probes), ((FILE_LEN / 4096 * 4096) as u64, 0));
    evict(&path);
    let (got, direct, probes) = counted(|| read(&path, DirectIoRead::Buffered, 0, FILE_LEN, 0));
    assert!(got == data);
    assert_eq!((direct, probes), (0, 0));

    // Half warm (the first half cached, the second evicted: reading the first half would
    // read ahead into the second): the cold half by O_DIRECT.
    let half = FILE_LEN / 2 / 4096 * 4096;
    assert!(read(&path, DirectIoRead::Buffered, 0, FILE_LEN, 0) == data);
    drop_file(FileRef::Path(&path), half as u64, 0, true).unwrap();
    assert_eq!(resident_pages(&path, half as u64, 0), 0);
    assert_eq!(resident_pages(&path, 0, half as u64), (half / 4096) as u64);
    let (got, direct, probes) = counted(|| read(&path, by_residency, 0, FILE_LEN, 0));
    assert!(got == data, "half-warm read by residency");
    let cold_half = (FILE_LEN / 4096 * 4096 - half) as u64;
    assert!(
        direct == cold_half,
        "{direct} bytes by O_DIRECT of a {cold_half}-byte cold half"
    );
    assert_eq!(probes, 24);

    // Unaligned offset, size and buffer on a cold file: same bytes, the middle by O_DIRECT.
    evict(&path);
    let (got, direct, _) = counted(|| read(&path, by_residency, 1000, 20 * MIB + 77, 3));
    assert!(got == data[1000..1000 + 20 * MIB + 77]);
    assert!(direct >= 19 * MIB as u64, "{direct}");

    // Small reads pay no probe and never go by O_DIRECT.
    evict(&path);
    let (got, direct, probes) = counted(|| read(&path, by_residency, 4096, MIB - 4096, 0));
    assert!(got == data[4096..MIB]);
    assert_eq!((direct, probes), (0, 0));

    // Reads running past the end of the file stop at it.
    evict(&path);
    let offset = (FILE_LEN - 3 * MIB - 10) as u64;
    let got = read(&path, by_residency, offset, 4 * MIB, 0);
    assert!(got == data[offset as usize..]);
}

#[test]
fn cachestat_and_mincore_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    fs::write(&path, pattern(8 * MIB, 9)).unwrap();
    let file = fs::File::open(&path).unwrap();
    fs::File::open(&path).unwrap().sync_all().unwrap();
    evict(&path);
    let fd = file.as_raw_fd();
    let ask = |method, offset: u64, len: usize| {
        Prober::new(fd, 0, 8 * MIB, method)
            .resident(offset, len)
            .unwrap()
    };
    let cold = ask(Method::Mincore, 0, 8 * MIB);
    if cold != 0 {
        eprintln!("skipped: this file system keeps its pages after POSIX_FADV_DONTNEED");
        return;
    }
    // Warm the 2nd and 3rd MiB only (pread does not read ahead past what it is asked
    // much; both methods see the same cache either way).
    let mut buf = vec![0u8; 2 * MIB];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, MIB as u64).unwrap();
    for (offset, len) in [
        (0, 8 * MIB),
        (0, MIB),
        (MIB as u64, 2 * MIB),
        (3 * MIB as u64, 5 * MIB),
        (4096, 12288),
    ] {
        let best = ask(Method::Best, offset, len);
        let mincore = ask(Method::Mincore, offset, len);
        assert_eq!(best, mincore, "{len} bytes at {offset}");
    }
    assert!(ask(Method::Best, MIB as u64, 2 * MIB) >= 512);
}
