//! Engine-level round trips against std's file I/O, over random offsets, sizes, task sizes,
//! thread counts and buffer alignments, with and without O_DIRECT.

// A test file: its helpers unwrap as its tests do (clippy allows that in `#[test]`s only).
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use kvikpy_core::settings::DirectIoRead;
use kvikpy_core::{submit, Completion, Direction, Request};
use kvikpy_core::{FileHandle, HostSpan, Settings, Span};
use proptest::prelude::*;

mod common;
use common::{pattern, Placed};

/// Submit one request and wait for its byte count.
fn run(
    s: &Settings,
    handle: &FileHandle,
    direction: Direction,
    span: Span,
    offset: u64,
    task_size: Option<usize>,
    completion: Completion,
) -> usize {
    let mut request = Request::new(direction, span, offset);
    request.task_size = task_size;
    submit(s, handle, request, completion)
        .unwrap()
        .wait()
        .unwrap()
}

/// Read into `buf` from `offset` in tasks of `task_size`; the byte count.
fn read(
    s: &Settings,
    handle: &FileHandle,
    buf: &mut Placed,
    offset: u64,
    task_size: Option<usize>,
    completion: Completion,
) -> usize {
    run(
        s,
        handle,
        Direction::Read,
        buf.span(),
        offset,
        task_size,
        completion,
    )
}

/// A file `name` in `dir` holding `data`; its path.
fn file_with(dir: &tempfile::TempDir, name: impl AsRef<Path>, data: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    fs::write(&path, data).unwrap();
    path
}

fn settings(threads: usize, direct: bool, bounce: usize) -> Settings {
    Settings {
        num_threads: threads,
        auto_direct_io_read: DirectIoRead::forced(direct),
        auto_direct_io_write: direct,
        bounce_buffer_size: bounce,
        gds_threshold: 1024,
        ..Settings::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn read_matches_std(
        file_len in 0usize..(3 << 20),
        offset in 0u64..(4 << 20),
        size in 0usize..(3 << 20),
        task_size in prop_oneof![Just(4096usize), Just(1 << 20), Just(4 << 20), 1usize..200_000],
        threads in 1usize..6,
        direct in any::<bool>(),
        misalign in prop_oneof![Just(0usize), 1usize..4096],
        blocking in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let data = pattern(file_len, file_len as u64 + 7);
        let path = file_with(&dir, "data", &data);
        let handle = FileHandle::open(&path, "r").unwrap();
        let mut buf = Placed::new(size, misalign);
        let s = settings(threads, direct, 8192);
        // Blocking callers run one task inline, or the first of many themselves.
        let completion = if blocking { Completion::Blocking } else { Completion::Future };
        let n = read(&s, &handle, &mut buf, offset, Some(task_size), completion);
        let start = (offset as usize).min(file_len);
        let expected = &data[start..(start + size).min(file_len)];
        prop_assert_eq!(n, expected.len());
        prop_assert_eq!(&buf.bytes()[..n], expected);
        prop_assert!(buf.bytes()[n..].iter().all(|&b| b == 0xEE), "bytes past EOF untouched");
    }

    #[test]
    fn write_matches_std(
        initial_len in 0usize..(1 << 20),
        offset in 0u64..(2 << 20),
        size in 0usize..(2 << 20),
        task_size in prop_oneof![Just(4096usize), Just(1 << 20), 1usize..200_000],
        threads in 1usize..6,
        direct in any::<bool>(),
        misalign in prop_oneof![Just(0usize), 1usize..4096],
        preallocate in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let initial = pattern(initial_len, 3);
        let path = file_with(&dir, "data", &initial);
        let handle = FileHandle::open(&path, "r+").unwrap();
        let mut buf = Placed::new(size, misalign);
        let payload = pattern(size, size as u64 + 11);
        let start = buf.start;
        buf.storage[start..start + size].copy_from_slice(&payload);
        // Preallocation (fallocate before a write of several tasks) never changes what
        // the file holds or how long it is.
        let s = Settings { write_preallocate: preallocate, ..settings(threads, direct, 8192) };
        let n = run(&s, &handle, Direction::Write, buf.span(), offset, Some(task_size), Completion::Future);
        prop_assert_eq!(n, size);
        handle.close();
        let mut expected = initial.clone();
        if size > 0 {
            let end = offset as usize + size;
            if expected.len() < end {
                expected.resize(end, 0);
            }
            expected[offset as usize..end].copy_from_slice(&payload);
        }
        let got = fs::read(&path).unwrap();
        prop_assert_eq!(got.len(), expected.len());
        prop_assert!(got == expected);
    }
}

#[test]
fn preallocation_sizes_the_file_before_the_tasks_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(&dir, "data", b"");
    let handle = FileHandle::open(&path, "r+").unwrap();
    let source = handle.get().unwrap();
    for (preallocate, direct, want) in [(false, true, 0), (true, false, 0), (true, true, 1 << 20)] {
        let s = Settings {
            write_preallocate: preallocate,
            ..settings(4, direct, 8192)
        };
        source.prepare_write(0, 1 << 20, &s);
        let len = fs::metadata(&path).unwrap().len();
        // A filesystem without O_DIRECT is left as it was (no direct writes to help).
        if !source.direct_io_supported() {
            eprintln!("no O_DIRECT here; nothing to check");
            return;
        }
        assert_eq!(len, want, "preallocate={preallocate} direct={direct}");
    }
    // Never shrinks or grows a file the write stays inside.
    source.prepare_write(
        0,
        4096,
        &Settings {
            write_preallocate: true,
            ..settings(4, true, 8192)
        },
    );
    assert_eq!(fs::metadata(&path).unwrap().len(), 1 << 20);
}

#[test]
fn reads_beyond_4_gib_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse");
    let file = fs::File::create(&path).unwrap();
    let offset = (4u64 << 30) + 12_345;
    let payload = pattern(3 << 20, 99);
    file.write_all_at(&payload, offset).unwrap();
    drop(file);
    let handle = FileHandle::open(&path, "r").unwrap();
    for direct in [false, true] {
        let mut buf = Placed::new(payload.len(), 5);
        let s = settings(4, direct, 1 << 20);
        let n = read(
            &s,
            &handle,
            &mut buf,
            offset,
            Some(1 << 20),
            Completion::Blocking,
        );
        assert_eq!(n, payload.len());
        assert!(buf.bytes() == payload.as_slice());
    }
}

#[test]
fn wrong_direction_and_closed_file_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(&dir, "f", b"hello");
    let handle = FileHandle::open(&path, "r").unwrap();
    let mut buf = vec![1u8; 5];
    let s = Settings::default();
    let span = Span::Host(HostSpan::from_slice(&mut buf));
    let err = submit(&s, &handle, Request::write(span, 0), Completion::Future);
    assert!(matches!(
        err,
        Err(kvikpy_core::Error::UnsupportedOperation(_))
    ));
    handle.close();
    let err = submit(&s, &handle, Request::read(span, 0), Completion::Future);
    assert!(matches!(err, Err(kvikpy_core::Error::Closed)));
    assert_eq!(fs::read(&path).unwrap(), b"hello");
}

#[test]
fn direct_reads_leave_bytes_past_eof_untouched() {
    // O_DIRECT moves whole blocks; the block holding EOF must not spill its zeros into
    // the destination past the bytes the read reports (found by hypothesis in Python).
    let dir = tempfile::tempdir().unwrap();
    for file_len in [1usize, 100, 4095, 4096, 4097, 5000, 12288 + 7] {
        let data = pattern(file_len, 99);
        let path = file_with(&dir, format!("eof-{file_len}"), &data);
        let handle = FileHandle::open(&path, "r").unwrap();
        if !handle.get().unwrap().direct_io_supported() {
            eprintln!("skipped: this filesystem refuses O_DIRECT, so nothing here is direct");
            return;
        }
        let s = settings(1, true, 4096);
        let mut buf = Placed::new(16384, 0); // 4 KiB-aligned: the direct-to-user path
        let n = read(&s, &handle, &mut buf, 0, Some(16384), Completion::Blocking);
        assert_eq!(n, file_len);
        assert_eq!(&buf.bytes()[..n], &data[..]);
        assert!(
            buf.bytes()[n..].iter().all(|&b| b == 0xEE),
            "bytes past EOF changed for a {file_len}-byte file"
        );
    }
}

/// Descriptors of this process open on `path`.
fn descriptors_on(path: &std::path::Path) -> usize {
    let target = fs::canonicalize(path).unwrap();
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|p| *p == target)
        .count()
}

#[test]
fn the_direct_descriptor_is_opened_only_when_a_read_wants_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(1 << 20, 5);
    let path = file_with(&dir, "lazy", &data);
    let handle = FileHandle::open(&path, "r").unwrap();
    let mut buf = Placed::new(1 << 20, 0);
    let read_all = |s: &Settings, buf: &mut Placed| {
        read(s, &handle, buf, 0, Some(1 << 20), Completion::Blocking)
    };
    assert_eq!(read_all(&settings(1, false, 1 << 20), &mut buf), data.len());
    assert_eq!(
        descriptors_on(&path),
        1,
        "a buffered read opened a second descriptor"
    );
    assert_eq!(read_all(&settings(1, true, 1 << 20), &mut buf), data.len());
    assert_eq!(buf.bytes(), &data[..]);
    let direct = handle.get().unwrap().direct_io_supported();
    assert_eq!(descriptors_on(&path), 1 + usize::from(direct));
}

#[test]
fn direct_reads_follow_the_open_file_when_the_path_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 << 10, 11);
    let path = file_with(&dir, "kept", &data);
    let handle = FileHandle::open(&path, "r").unwrap();
    // Another file takes the path before the first direct read opens its descriptor.
    let other = dir.path().join("other");
    fs::write(&other, pattern(64 << 10, 12)).unwrap();
    fs::rename(&other, &path).unwrap();
    let mut buf = Placed::new(64 << 10, 0);
    let s = settings(1, true, 1 << 20);
    let n = read(
        &s,
        &handle,
        &mut buf,
        0,
        Some(1 << 20),
        Completion::Blocking,
    );
    assert_eq!(n, data.len());
    assert_eq!(
        buf.bytes(),
        &data[..],
        "read the file now at the path, not the one opened"
    );
}

#[test]
fn an_exact_read_that_reaches_the_end_of_the_file_is_truncated_not_short() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(100_000, 21);
    let path = file_with(&dir, "short", &data);
    let handle = FileHandle::open(&path, "r").unwrap();
    for (completion, threads) in [
        (Completion::Blocking, 1),
        (Completion::Future, 4),
        (Completion::Whole, 1),
    ] {
        let s = settings(threads, false, 8192);
        // Sized for more than the file holds, as after the file shrank.
        let mut buf = Placed::new(data.len() + 1, 0);
        let mut request = Request::read(buf.span(), 0);
        request.task_size = Some(16384);
        request.exact = true;
        let outcome = submit(&s, &handle, request, completion).and_then(|f| f.wait());
        match outcome {
            Err(kvikpy_core::Error::Truncated(m)) => {
                assert!(m.contains("shrank"), "{m}");
            }
            other => panic!("{completion:?}: {other:?}"),
        }
        // The same read, not exact, is short and fine.
        let n = read(&s, &handle, &mut buf, 0, Some(16384), completion);
        assert_eq!(n, data.len());
        assert_eq!(&buf.bytes()[..n], &data[..]);
    }
}

#[test]
fn batches_plan_skip_and_check_ranges_in_the_engine() {
    use kvikpy_core::batch_plan::{plan_files, plan_ranges};
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    fs::write(&a, pattern(5000, 1)).unwrap();
    fs::write(&b, pattern(70_000, 2)).unwrap();
    let missing = dir.path().join("missing");
    let s = settings(3, false, 8192);
    let paths = vec![a.clone(), missing.clone(), b.clone()];
    // Without skip, the missing file fails the plan.
    assert!(matches!(
        plan_files(&s, paths.clone(), false),
        Err(kvikpy_core::Error::Os { .. })
    ));
    // With skip, it is an empty element, listed as failed.
    let plan = plan_files(&s, paths, true).unwrap();
    assert_eq!(plan.total(), 75_000);
    let mut dest = vec![0u8; plan.total()];
    let outcome = plan
        .read(&s, Span::Host(HostSpan::from_slice(&mut dest)), None)
        .unwrap();
    assert_eq!(outcome.offsets, vec![0, 5000, 5000, 75_000]);
    assert_eq!(outcome.failures.len(), 1);
    assert_eq!(outcome.failures[0].0, 1);
    assert_eq!(&dest[..5000], &fs::read(&a).unwrap()[..]);
    assert_eq!(&dest[5000..], &fs::read(&b).unwrap()[..]);
    // Ranges: inside the file they read, past its end they are refused, naming the range.
    let plan = plan_ranges(&s, &b, &[(10, 20), (69_990, 10)]).unwrap();
    let mut dest = vec![0u8; plan.total()];
    plan.read(&s, Span::Host(HostSpan::from_slice(&mut dest)), None)
        .unwrap();
    let whole = fs::read(&b).unwrap();
    assert_eq!(&dest[..20], &whole[10..30]);
    assert_eq!(&dest[20..], &whole[69_990..]);
    match plan_ranges(&s, &b, &[(0, 1), (69_999, 2)]) {
        Err(kvikpy_core::Error::InvalidArgument(m)) => assert!(m.contains("range 1"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A destination smaller than the plan is refused before any read.
    let plan = plan_ranges(&s, &b, &[(0, 100)]).unwrap();
    let mut small = vec![0u8; 99];
    assert!(plan
        .read(&s, Span::Host(HostSpan::from_slice(&mut small)), None)
        .is_err());
}

#[test]
fn every_local_path_opens_through_the_posix_source() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with(&dir, "f", b"bytes");
    let handle = FileHandle::open(&path, "r").unwrap();
    let source = handle.get().unwrap();
    assert_eq!(source.name(), "posix");
    assert_eq!(source.size().unwrap(), 5);
    assert!(source.descriptor().is_some());
}

/// A character device reports a size of 0 but never ends: a read into a given buffer
/// fills the buffer, however it is split into tasks and however it completes, and stops
/// there (it does not read on past the buffer).
#[test]
fn a_character_device_fills_the_buffer_whatever_the_split() {
    let handle = FileHandle::open("/dev/zero", "r").unwrap();
    for (threads, task_size, completion) in [
        (1, None, Completion::Blocking),
        (4, Some(4096), Completion::Blocking),
        (4, Some(4096), Completion::Future),
        (4, Some(65536), Completion::Future),
    ] {
        let s = settings(threads, false, 1 << 20);
        let mut buf = Placed::new(1 << 20, 0);
        let n = read(&s, &handle, &mut buf, 12345, task_size, completion);
        assert_eq!(n, 1 << 20, "{threads} threads, task size {task_size:?}");
        assert!(buf.bytes().iter().all(|&b| b == 0));
    }
}

/// A pseudo-file reports a size of 0 but has content: a read into a given buffer gets
/// that content whether it runs as one task or several, as a one-task read always did.
#[test]
fn a_pseudo_file_is_read_whatever_the_split() {
    let path = "/proc/self/cmdline";
    let Ok(expected) = fs::read(path) else {
        return; // no /proc here
    };
    let handle = FileHandle::open(path, "r").unwrap();
    for (threads, task_size) in [(1, None), (4, Some(4096))] {
        let s = settings(threads, false, 1 << 20);
        let mut buf = Placed::new(1 << 20, 0);
        let n = read(&s, &handle, &mut buf, 0, task_size, Completion::Future);
        assert_eq!(&buf.bytes()[..n], &expected[..], "{threads} threads");
    }
}
