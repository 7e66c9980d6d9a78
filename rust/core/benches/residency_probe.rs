//! Criterion benchmarks of the residency probes that reads by residency make per task
//! (one per MiB, about a 64 KiB sample each): by `cachestat(2)` and by `mincore` over a
//! fresh mapping, for 4 MiB and 16 MiB tasks of a cold and a warm file, next to one
//! `cachestat` of the whole range; and a warm 64 MiB read by residency against one
//! through the page cache (what the probes add to the default on a warm file).
//!
//! Run with `cargo bench -p kvikpy-core --bench residency_probe` (`make bench-engine`).

// Benchmark code is test code: a failed setup step stops the run loudly, as in the tests.
#![allow(clippy::expect_used)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvikpy_core::page_cache::{drop_file, residency, FileRef};
use kvikpy_core::settings::DirectIoRead;
use kvikpy_core::source::residency::{cachestat, plan, Method, Prober};
use kvikpy_core::{submit, Completion, FileHandle, HostSpan, Request, Settings, Span};

const LEN: usize = 64 << 20;

/// A file under the temp directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, len: usize) -> Self {
        let path =
            std::env::temp_dir().join(format!("kvikpy-bench-{}-{name}.bin", std::process::id()));
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, data).expect("write benchmark file");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The probes of one task's plan: one per MiB granule, each about a 64 KiB sample.
fn plan_task(fd: i32, len: usize, method: Method) -> usize {
    let mut prober = Prober::new(fd, 8 << 20, len, method);
    let mut runs = 0;
    plan(
        8 << 20,
        len,
        4096,
        |at, n| prober.resident(at, n),
        |_| {
            runs += 1;
            Ok::<bool, ()>(true)
        },
    )
    .expect("plan");
    runs
}

fn probes(c: &mut Criterion) {
    let file = TempFile::new("probe", LEN);
    let f = File::open(&file.0).expect("open");
    let fd = f.as_raw_fd();
    let has_cachestat = cachestat(fd, 0, 4096).is_ok();
    let mut group = c.benchmark_group("residency_probe");
    for warm in [false, true] {
        if warm {
            std::fs::read(&file.0).expect("warm the file");
        } else {
            drop_file(FileRef::Path(&file.0), 0, 0, true).expect("evict");
        }
        let state = if warm { "warm" } else { "cold" };
        let resident = residency(FileRef::Path(&file.0), 0, 0)
            .expect("residency")
            .0;
        eprintln!("{state} file: {resident} of {} pages resident", LEN / 4096);
        for mib in [4usize, 16] {
            let len = mib << 20;
            if has_cachestat {
                // One question about the whole range (what the plan avoids: on a warm
                // file it walks every cached page).
                group.bench_function(
                    BenchmarkId::new(format!("cachestat_whole_{state}"), mib),
                    |b| b.iter(|| cachestat(fd, 8 << 20, len).expect("cachestat")),
                );
                group.bench_function(
                    BenchmarkId::new(format!("task_cachestat_{state}"), mib),
                    |b| b.iter(|| plan_task(fd, len, Method::Best)),
                );
            }
            // What a task pays without cachestat: map the range, mincore the samples, unmap.
            group.bench_function(
                BenchmarkId::new(format!("task_mincore_{state}"), mib),
                |b| b.iter(|| plan_task(fd, len, Method::Mincore)),
            );
        }
    }
    group.finish();
}

fn warm_read(c: &mut Criterion) {
    let file = TempFile::new("warm", LEN);
    let handle = FileHandle::open(&file.0, "r").expect("open");
    let mut buf = vec![0u8; LEN];
    let mut group = c.benchmark_group("warm_read_64mib_by_mode");
    group.throughput(Throughput::Bytes(LEN as u64));
    for (name, mode) in [
        ("page_cache", DirectIoRead::Buffered),
        ("by_residency", DirectIoRead::ByResidency),
    ] {
        let s = Settings {
            num_threads: 2,
            auto_direct_io_read: mode,
            ..Settings::default()
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                let span = Span::Host(HostSpan::from_slice(&mut buf));
                let n = submit(&s, &handle, Request::read(span, 0), Completion::Blocking)
                    .expect("submit")
                    .wait()
                    .expect("read");
                assert_eq!(n, LEN);
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = probes, warm_read
}
criterion_main!(benches);
