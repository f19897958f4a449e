//! I/O errors that name their operation and file and keep the OS's code readable.

use std::io;
use std::path::Path;

/// Whether an I/O error says the process (EMFILE) or the system (ENFILE) has no file
/// descriptor left.
pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(os_code(e), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// The OS error code of `e`, also through the operation and path [`with_context`] names.
fn os_code(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        let inner = e.get_ref()?.downcast_ref::<Contexted>()?;
        inner.source.raw_os_error()
    })
}

/// An I/O error with the operation and the file it was about; its OS code stays readable
/// (`is_disk_full`, `is_out_of_descriptors`).
#[derive(Debug)]
struct Contexted {
    what: String,
    source: io::Error,
}

impl std::fmt::Display for Contexted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

impl std::error::Error for Contexted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// An I/O call's error as an `io::Error` with its OS code: glommio's errors carry the code
/// in their source, which their own conversion to `io::Error` drops (an open that ran out
/// of descriptors, or that the filesystem refused O_DIRECT, could not be told apart).
pub(super) trait OsError {
    fn os_error(self) -> io::Error;
}

impl OsError for io::Error {
    fn os_error(self) -> io::Error {
        self
    }
}

impl<T> OsError for glommio::GlommioError<T> {
    fn os_error(self) -> io::Error {
        match self {
            glommio::GlommioError::EnhancedIoError { source, .. }
            | glommio::GlommioError::IoError(source) => source,
            other => other.into(),
        }
    }
}

/// `e`, saying it came from `op` on `path`.
pub(super) fn with_context(e: impl OsError, op: &str, path: &Path) -> io::Error {
    let source = e.os_error();
    let what = format!("{op} {}", path.display());
    io::Error::new(source.kind(), Contexted { what, source })
}

/// Whether an I/O error says the disk (or the quota) is full.
pub fn is_disk_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    ) || matches!(os_code(e), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

#[cfg(test)]
mod tests {
    /// An error that names its operation and file still says what the OS said.
    #[test]
    fn an_error_with_its_context_keeps_its_os_code() {
        use std::io::Error;
        let path = std::path::Path::new("/data/seg");
        let named = |code| super::with_context(Error::from_raw_os_error(code), "open", path);
        let no_fd = named(libc::EMFILE);
        assert!(super::is_out_of_descriptors(&no_fd) && !super::is_disk_full(&no_fd));
        assert!(no_fd.to_string().starts_with("open /data/seg: "), "{no_fd}");
        assert!(super::is_out_of_descriptors(&named(libc::ENFILE)));
        let full = named(libc::EDQUOT);
        assert!(super::is_disk_full(&full) && !super::is_out_of_descriptors(&full));
        assert!(!super::is_out_of_descriptors(&named(libc::EIO)));
        assert!(!super::is_out_of_descriptors(&Error::other("EMFILE")));
        // glommio's errors keep theirs too (its own conversion drops it).
        let dma_open = glommio::GlommioError::<()>::EnhancedIoError {
            source: Error::from_raw_os_error(libc::EMFILE),
            op: "Opening",
            path: Some(path.to_owned()),
            fd: None,
        };
        assert!(super::is_out_of_descriptors(&super::with_context(
            dma_open, "open", path
        )));
    }
}
