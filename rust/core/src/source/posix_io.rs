//! The raw pread/pwrite loops: retry on EINTR, continue after partial transfers, stop at
//! end of file (reads) or fail on a write that makes no progress.

use std::io;
use std::os::fd::RawFd;

use crate::span::HostSpan;
use crate::vocab::Direction;

/// Move all of `span` between it and `fd` at `offset`. Reads stop early only at end of
/// file (the count is then short); a write that makes no progress is an error
/// (`WriteZero`), never a silent short count.
pub fn transfer_full(
    fd: RawFd,
    direction: Direction,
    span: HostSpan,
    offset: u64,
) -> io::Result<usize> {
    let mut done = 0usize;
    while done < span.len() {
        let rest = span.sub(done, span.len() - done);
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        let n = match direction {
            // SAFETY: `rest` is valid writable memory for its length (HostSpan's
            // contract), and the kernel writes at most `rest.len()` bytes into it.
            Direction::Read => unsafe { libc::pread(fd, rest.as_ptr().cast(), rest.len(), at) },
            // SAFETY: `rest` is valid readable memory for its length (HostSpan's contract).
            Direction::Write => unsafe {
                libc::pwrite(fd, rest.as_ptr().cast_const().cast(), rest.len(), at)
            },
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            if direction == Direction::Read {
                break; // end of file
            }
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("pwrite wrote 0 of {} bytes", rest.len()),
            ));
        }
        done += n as usize;
    }
    Ok(done)
}

/// Read into `span` from `fd` at `offset` until the span is full or the file ends.
pub fn pread_full(fd: RawFd, span: HostSpan, offset: u64) -> io::Result<usize> {
    transfer_full(fd, Direction::Read, span, offset)
}

/// Read through an O_DIRECT descriptor: like [`pread_full`], but a transfer that ends off
/// the alignment grid means end of file (another O_DIRECT read from an unaligned offset
/// would fail with EINVAL rather than return 0).
pub fn pread_direct(fd: RawFd, span: HostSpan, offset: u64, align: usize) -> io::Result<usize> {
    let mut done = 0usize;
    while done < span.len() {
        let n = pread_full(fd, span.sub(done, span.len() - done), offset + done as u64)?;
        done += n;
        if n == 0 || n % align != 0 {
            break;
        }
    }
    Ok(done)
}

/// Move `span` through an O_DIRECT descriptor: [`pread_direct`] for reads, the plain
/// loop for writes (whose lengths the caller keeps aligned).
pub fn transfer_direct(
    fd: RawFd,
    direction: Direction,
    span: HostSpan,
    offset: u64,
    align: usize,
) -> io::Result<usize> {
    match direction {
        Direction::Read => pread_direct(fd, span, offset, align),
        Direction::Write => transfer_full(fd, direction, span, offset),
    }
}
