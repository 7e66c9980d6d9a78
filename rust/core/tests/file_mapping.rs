//! The read-only file mappings behind page-cache DMA: placement, residency, refusals.

use std::io::Write;

use kvikpy_core::source::{page_size, FileMapping};
use std::os::fd::AsRawFd;

fn temp_file(len: usize) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    let path = std::env::temp_dir().join(format!(
        "kvikpy-mapping-{}-{len}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::File::create(&path)?.write_all(&bytes)?;
    let file = std::fs::File::open(&path)?;
    Ok((path, file))
}

#[test]
fn mapping_starts_at_the_page_holding_the_offset() {
    let page = page_size();
    let (path, file) = temp_file(3 * page + 100).unwrap();
    for (offset, len) in [(0u64, 10usize), (1, page), (page as u64 + 7, 2 * page)] {
        let m = FileMapping::map(file.as_raw_fd(), offset, len).expect("regular files map");
        assert_eq!(m.head(), offset as usize % page);
        assert_eq!(m.len(), m.head() + len);
        assert_eq!(m.base() as usize % page, 0);
        // Just written, so in the page cache.
        assert!(m.resident(), "offset {offset} len {len}");
    }
    std::fs::remove_file(path).unwrap();
}

#[test]
fn empty_ranges_and_unmappable_descriptors_are_refused() {
    let (path, file) = temp_file(100).unwrap();
    assert!(FileMapping::map(file.as_raw_fd(), 0, 0).is_none());
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe() returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    assert!(
        FileMapping::map(fds[0], 0, 4096).is_none(),
        "pipes cannot be mapped"
    );
    for fd in fds {
        // SAFETY: closing a descriptor pipe() just created, once.
        unsafe { libc::close(fd) };
    }
    std::fs::remove_file(path).unwrap();
}
