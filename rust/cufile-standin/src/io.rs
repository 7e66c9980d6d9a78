//! Synchronous transfers between a file and a buffer: `pread`/`pwrite` on the registered
//! descriptor, straight into host memory, or through a host staging buffer and a CUDA
//! driver copy for device memory. Reads are short only at end of file, as `pread` is.

use crate::error::Fail;
use crate::memory::{self, Place};

/// The host staging buffer's size for device transfers: copies go in pieces of this size.
pub const STAGING: usize = 8 << 20;

/// Reads up to `buf.len()` bytes at `offset`, retrying short reads and EINTR until the
/// buffer is full or the file ends; returns the bytes read.
pub fn pread_full(fd: i32, buf: &mut [u8], offset: i64) -> Result<usize, Fail> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is a writable slice of `rest.len()` bytes.
        let n = unsafe {
            libc::pread(
                fd,
                rest.as_mut_ptr().cast(),
                rest.len(),
                offset + done as i64,
            )
        };
        if n < 0 {
            let fail = Fail::last_os();
            if fail.errno == libc::EINTR {
                continue;
            }
            return Err(fail);
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    Ok(done)
}

/// Writes all of `buf` at `offset`, retrying short writes and EINTR.
pub fn pwrite_all(fd: i32, buf: &[u8], offset: i64) -> Result<usize, Fail> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &buf[done..];
        // SAFETY: `rest` is a readable slice of `rest.len()` bytes.
        let n = unsafe { libc::pwrite(fd, rest.as_ptr().cast(), rest.len(), offset + done as i64) };
        if n < 0 {
            let fail = Fail::last_os();
            if fail.errno == libc::EINTR {
                continue;
            }
            return Err(fail);
        }
        if n == 0 {
            return Err(Fail::os(libc::EIO));
        }
        done += n as usize;
    }
    Ok(done)
}

/// A transfer of `size` bytes at `addr`, wherever it lives: `host()` for host memory;
/// for device memory, piece by piece through one host staging buffer with the memory's
/// context bound, `piece(staging, done)` moving the piece that starts `done` bytes in and
/// answering how many bytes it moved (a short piece, the end of the file, ends the
/// transfer).
fn by_place(
    addr: usize,
    size: usize,
    host: impl FnOnce() -> Result<usize, Fail>,
    mut piece: impl FnMut(&mut [u8], usize) -> Result<usize, Fail>,
) -> Result<usize, Fail> {
    let Place::Device(ctx) = memory::place(addr)? else {
        return host();
    };
    let _bound = memory::bind(ctx)?;
    let mut staging = vec![0u8; size.min(STAGING)];
    let mut done = 0;
    while done < size {
        let chunk = (size - done).min(staging.len());
        let n = piece(&mut staging[..chunk], done)?;
        done += n;
        if n < chunk {
            break; // end of file
        }
    }
    Ok(done)
}

/// Reads `size` bytes of the file at `offset` into the buffer at `addr` (host or device);
/// returns the bytes read (fewer only at end of file).
///
/// # Safety
/// `addr..addr + size` must be memory the caller may write: host memory, or device memory
/// of a live allocation.
pub unsafe fn read(fd: i32, addr: usize, size: usize, offset: i64) -> Result<usize, Fail> {
    let host = || {
        // SAFETY: the caller gives `size` writable host bytes at `addr`.
        let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, size) };
        pread_full(fd, buf, offset)
    };
    by_place(addr, size, host, |staging, done| {
        let n = pread_full(fd, staging, offset + done as i64)?;
        if n > 0 {
            memory::to_device(addr + done, staging.as_ptr(), n)?;
        }
        Ok(n)
    })
}

/// Writes `size` bytes from the buffer at `addr` (host or device) to the file at `offset`.
///
/// # Safety
/// `addr..addr + size` must be memory the caller may read: host memory, or device memory
/// of a live allocation.
pub unsafe fn write(fd: i32, addr: usize, size: usize, offset: i64) -> Result<usize, Fail> {
    let host = || {
        // SAFETY: the caller gives `size` readable host bytes at `addr`.
        let buf = unsafe { std::slice::from_raw_parts(addr as *const u8, size) };
        pwrite_all(fd, buf, offset)
    };
    by_place(addr, size, host, |staging, done| {
        memory::from_device(staging.as_mut_ptr(), addr + done, staging.len())?;
        pwrite_all(fd, staging, offset + done as i64)
    })
}
