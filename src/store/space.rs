//! Free disk space: the floor below which sends are refused with `DiskFull`, looked at
//! every second off the shard thread, and the log's full flag cleared when space returns.

use std::path::Path;

use super::MessageStore;

impl MessageStore {
    /// Why sends are refused for lack of disk space, if they are.
    pub fn disk_full(&self) -> Option<String> {
        self.inner
            .space_low
            .borrow()
            .clone()
            .or_else(|| self.inner.log.full())
    }

    /// Free bytes of the data directory's filesystem, as last looked at (every second).
    pub fn disk_free_bytes(&self) -> u64 {
        self.inner.disk_free.get()
    }

    /// Looks at the free space of the data directory (off the shard thread): below the
    /// floor sends are refused; above it they are taken again.
    pub async fn check_disk_space(&self) {
        let dir = self.inner.dir.clone();
        let free = crate::io::blocking(move || free_bytes(&dir)).await;
        let Ok(free) = free else { return };
        self.inner.disk_free.set(free);
        let floor = self.inner.cfg.disk_free_min_bytes;
        let was_low = self.inner.space_low.borrow().is_some();
        // No space at all is low whatever the floor.
        if free < floor.max(1) {
            if !was_low {
                crate::warn!(
                    "ringmq: {}: {} MiB free, below the {} MiB floor (--disk-free-min-mb): sends refused with DiskFull until space is freed",
                    self.inner.dir.display(),
                    free >> 20,
                    floor >> 20
                );
            }
            *self.inner.space_low.borrow_mut() = Some(format!(
                "{} has {} MiB free, below the broker's floor of {} MiB",
                self.inner.dir.display(),
                free >> 20,
                floor >> 20
            ));
        } else {
            if was_low {
                crate::say!(
                    "ringmq: {}: {} MiB free again, taking sends",
                    self.inner.dir.display(),
                    free >> 20
                );
            }
            *self.inner.space_low.borrow_mut() = None;
            self.inner.log.space_returned();
        }
    }
}

/// Free bytes of the filesystem holding `dir`, for unprivileged users.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs writes only into the zeroed struct it is given; `path` is a valid C
    // string that outlives the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}
