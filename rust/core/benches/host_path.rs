//! Criterion benchmarks of the engine's host-memory path (no GPU needed), so that CI
//! machines without one still catch performance regressions: a warm 64 MiB parallel read,
//! open + 4 KiB read + close latency, and task splitting.
//!
//! Run with `make bench-engine` (or `cargo bench -p kvikpy-core --bench host_path`).

// Benchmark code is test code: a failed setup step stops the run loudly, as in the tests
// (clippy.toml allows `expect` there, but clippy does not count a bench target as tests).
#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvikpy_core::settings::DirectIoRead;
use kvikpy_core::tasks::split_tasks;
use kvikpy_core::{submit, Completion, FileHandle, HostSpan, Request, Settings, Span};

const LARGE: usize = 64 << 20;
const SMALL: usize = 4 << 10;

/// A file under the temp directory, removed on drop so an aborted run does not leave
/// 64 MiB behind on a CI machine.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, data: &[u8]) -> Self {
        // The pid keeps two concurrent runs (say, two worktrees) from sharing a file.
        let path =
            std::env::temp_dir().join(format!("kvikpy-bench-{}-{name}.bin", std::process::id()));
        std::fs::write(&path, data).expect("write benchmark file");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Pseudo-random bytes: zeros or a short repeating pattern could let a read that returns
/// the wrong pages (or none) still compare equal.
fn random_bytes(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// An explicit snapshot rather than `settings::current()`, so `KVIKIO_*` variables in the
/// environment cannot change what is measured.
fn settings(threads: usize) -> Settings {
    Settings {
        num_threads: threads,
        auto_direct_io_read: DirectIoRead::Buffered,
        ..Settings::default()
    }
}

fn read_all(s: &Settings, handle: &FileHandle, buf: &mut [u8]) -> usize {
    let span = Span::Host(HostSpan::from_slice(buf));
    submit(s, handle, Request::read(span, 0), Completion::Blocking)
        .expect("submit read")
        .wait()
        .expect("read")
}

fn warm_read_64mib(c: &mut Criterion) {
    let file = TempFile::new("large", &random_bytes(LARGE));
    let expected = std::fs::read(&file.0).expect("std read");
    let handle = FileHandle::open(&file.0, "r").expect("open");
    let mut group = c.benchmark_group("warm_read_64mib");
    group.throughput(Throughput::Bytes(LARGE as u64));
    for threads in [1, 4] {
        let s = settings(threads);
        // Allocated and faulted in once: the benchmark is about the engine, not the
        // kernel zeroing 64 MiB of fresh pages each iteration.
        let mut buf = vec![0u8; LARGE];
        // Also warms the page cache and starts the pool at this thread count.
        assert_eq!(read_all(&s, &handle, &mut buf), LARGE);
        assert!(buf == expected, "engine read differs from std::fs::read");
        group.bench_function(BenchmarkId::new("threads", threads), |b| {
            b.iter(|| assert_eq!(read_all(&s, &handle, &mut buf), LARGE))
        });
    }
    group.finish();
}

/// The small-file path as a blocking caller takes it: open, the single-task fast path
/// (no pool hop), close.
fn open_read_close(s: &Settings, file: &TempFile, buf: &mut [u8]) -> usize {
    let handle = FileHandle::open(&file.0, "r").expect("open");
    let span = Span::Host(HostSpan::from_slice(buf));
    let n = submit(s, &handle, Request::read(span, 0), Completion::Blocking)
        .expect("read")
        .wait()
        .expect("a 4 KiB read");
    handle.close();
    n
}

fn small_reads(c: &mut Criterion) {
    let file = TempFile::new("small", &random_bytes(SMALL));
    let expected = std::fs::read(&file.0).expect("std read");
    let s = settings(1);
    let mut buf = vec![0u8; SMALL];
    assert_eq!(open_read_close(&s, &file, &mut buf), SMALL);
    assert!(buf == expected, "engine read differs from std::fs::read");
    let mut group = c.benchmark_group("small_read_4kib");
    group.throughput(Throughput::Bytes(SMALL as u64));
    group.bench_function("open_read_close", |b| {
        b.iter(|| assert_eq!(open_read_close(&s, &file, &mut buf), SMALL))
    });
    group.finish();
}

fn split_large_range(c: &mut Criterion) {
    // 64 GiB at an unaligned offset, in default-sized tasks: a large checkpoint's worth of
    // tasks, with the short first task that the aligned grid produces.
    let (offset, size, task_size) = (100u64, 64usize << 30, 4usize << 20);
    let tile = |offset: u64, size: usize, task_size: usize| {
        split_tasks(offset, size, task_size).fold((0usize, 0usize), |(n, bytes), t| {
            (n + 1, bytes + black_box(t).len)
        })
    };
    assert_eq!(tile(offset, size, task_size), (size / task_size + 1, size));
    let mut group = c.benchmark_group("split_tasks");
    group.throughput(Throughput::Bytes(size as u64));
    group.bench_function("64gib_4mib_tasks", |b| {
        b.iter(|| tile(black_box(offset), black_box(size), black_box(task_size)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // Short enough that the whole suite runs in about a minute on a 2-core CI machine;
    // regressions worth catching here are large, not a few percent.
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = warm_read_64mib, small_reads, split_large_range
}
criterion_main!(benches);
