//! The operating-system calls idemgate makes that the standard library and
//! tokio do not wrap, behind safe functions.
//!
//! This is the crate's one exception to `#![deny(unsafe_code)]` (see
//! `lib.rs`): every `unsafe` block lives here, small enough to review at a
//! glance, each with the argument for why it is sound.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, ReadBuf};

/// Raises the soft open-files limit to the hard one; returns the limit now
/// in force.
pub fn raise_open_files_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into a local struct of the type it expects.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit only reads the local struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok(lim.rlim_cur)
}

/// Shuts a socket down both ways, which wakes the task reading it; the
/// descriptor stays open (its owner closes it). Errors are ignored: a socket
/// the peer already closed has nothing left to shut.
pub fn shutdown_socket(fd: RawFd) {
    // SAFETY: shutdown touches no memory. A descriptor that is not a socket,
    // or not open, only makes it fail; the caller passes the descriptor of a
    // connection it still owns, so it cannot be another file's.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// Bytes available to an unprivileged process on the file system that
/// holds `dir`.
pub fn free_bytes(dir: &Path) -> io::Result<u64> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs is plain data; all-zero is a valid value of it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a struct statvfs to fill in.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Polls one read of at most `max` bytes into a new buffer, which is only
/// allocated while the read is attempted: a connection waiting for its first
/// byte holds no buffer. `Ready(Ok(empty))` is end of stream.
pub fn poll_read_new<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    cx: &mut Context<'_>,
    max: usize,
) -> Poll<io::Result<BytesMut>> {
    let mut buf = BytesMut::with_capacity(max);
    let mut rb = ReadBuf::uninit(&mut buf.spare_capacity_mut()[..max]);
    match Pin::new(reader).poll_read(cx, &mut rb) {
        Poll::Ready(Ok(())) => {
            let n = rb.filled().len();
            // SAFETY: ReadBuf only counts bytes as filled once they are
            // initialised, and n is at most `max`, within the capacity.
            unsafe { buf.set_len(n) };
            Poll::Ready(Ok(buf))
        }
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => Poll::Pending,
    }
}

/// `N` 64-bit counters in a file, mapped shared: every process that maps the
/// same file sees (and atomically updates) the same values.
pub struct SharedCounters<const N: usize> {
    cells: NonNull<[AtomicU64; N]>,
}

// SAFETY: the mapping is only ever accessed through atomics, and it lives
// (unmapped in `drop`) exactly as long as the struct.
unsafe impl<const N: usize> Send for SharedCounters<N> {}
// SAFETY: as above; `&AtomicU64` is safe to share between threads.
unsafe impl<const N: usize> Sync for SharedCounters<N> {}

impl<const N: usize> SharedCounters<N> {
    const LEN: usize = N * 8;

    /// Maps the first `N * 8` bytes of `file`, extending it with zeros when
    /// it is shorter (a new file, or one another process is creating now).
    pub fn map(file: &File) -> io::Result<Self> {
        if file.metadata()?.len() < Self::LEN as u64 {
            file.set_len(Self::LEN as u64)?;
        }
        // SAFETY: a fresh shared mapping of LEN bytes of a file at least that
        // long, readable and writable; failure is checked below. The
        // mapping outlives the descriptor, as mmap allows.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let cells = NonNull::new(ptr.cast::<[AtomicU64; N]>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(SharedCounters { cells })
    }

    /// Counter `i` (panics past `N`).
    pub fn get(&self, i: usize) -> &AtomicU64 {
        // SAFETY: a page-aligned mapping of N initialised (zero or written)
        // u64s, valid while `self` lives; AtomicU64 has u64's layout.
        unsafe { &self.cells.as_ref()[i] }
    }
}

impl<const N: usize> Drop for SharedCounters<N> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference from
        // `get` outlives `self`.
        unsafe {
            libc::munmap(self.cells.as_ptr().cast(), Self::LEN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::SeqCst;

    #[test]
    fn shared_counters_are_shared_between_mappings_and_persist() {
        let dir = std::env::temp_dir().join(format!("idemgate-sys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("counters");
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .unwrap()
        };
        let a = SharedCounters::<2>::map(&open()).unwrap();
        let b = SharedCounters::<2>::map(&open()).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 16);
        a.get(1).fetch_add(5, SeqCst);
        assert_eq!(b.get(1).load(SeqCst), 5);
        assert_eq!(b.get(0).load(SeqCst), 0);
        drop((a, b));
        let c = SharedCounters::<2>::map(&open()).unwrap();
        assert_eq!(c.get(1).load(SeqCst), 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn free_bytes_answers_for_a_directory_and_fails_for_a_missing_one() {
        assert!(free_bytes(&std::env::temp_dir()).unwrap() > 0);
        assert!(free_bytes(Path::new("/nonexistent/idemgate")).is_err());
        assert!(free_bytes(Path::new("a\0b")).is_err());
    }

    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        let soft = raise_open_files_limit().unwrap();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(soft, lim.rlim_cur);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
    }
}
