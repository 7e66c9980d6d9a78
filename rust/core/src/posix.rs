//! The raw pread/pwrite loops: retry on EINTR, continue after partial transfers, stop at EOF.

use std::io;
use std::os::fd::RawFd;

use crate::memory::HostSpan;

/// Read into `span` from `fd` at `offset` until the span is full or the file ends.
/// Returns the bytes read (less than `span.len()` only at end of file).
pub fn pread_full(fd: RawFd, span: HostSpan, offset: u64) -> io::Result<usize> {
    let mut done = 0usize;
    while done < span.len() {
        let rest = span.sub(done, span.len() - done);
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: `rest` is valid writable memory for its length (HostSpan's contract), and
        // the kernel writes at most `rest.len()` bytes into it.
        let n = unsafe { libc::pread(fd, rest.as_ptr().cast(), rest.len(), at) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            break; // end of file
        }
        done += n as usize;
    }
    Ok(done)
}

/// Write all of `span` to `fd` at `offset`. A write that makes no progress is an error
/// (`WriteZero`), never a silent short count.
pub fn pwrite_full(fd: RawFd, span: HostSpan, offset: u64) -> io::Result<usize> {
    let mut done = 0usize;
    while done < span.len() {
        let rest = span.sub(done, span.len() - done);
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: `rest` is valid readable memory for its length (HostSpan's contract).
        let n = unsafe { libc::pwrite(fd, rest.as_ptr().cast_const().cast(), rest.len(), at) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("pwrite wrote 0 of {} bytes", rest.len()),
            ));
        }
        done += n as usize;
    }
    Ok(done)
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
