//! Whether glommio's polled ring serves the data directory's disk, decided once per
//! executor thread before its first DMA file opens.
//!
//! glommio decides per device by reading the first DMA file opened there through its
//! polled (IOPOLL) ring. On a disk whose queue has no poll support that read is wasted at
//! best, and at worst never ends: seen once on this project's 2-core VM (virtio disk,
//! `queue/io_poll` 0), a broker's start hung with its shard spinning in glommio's reactor
//! on the probe's completion while an io_uring worker spun beside it (the kernel's io-wq
//! issues a polled request again for as long as it answers EAGAIN); the probe's scratch
//! file was still in the data directory after ten minutes. So the disk's own word is
//! taken first: `/sys/dev/block/MAJOR:MINOR/queue/io_poll` (a partition's, its disk's)
//! reading 0 marks the device unpollable, and no read goes to the polled ring. Only
//! where sysfs does not say (or says 1) does the probe run, on a scratch file that holds
//! real data: on an empty file glommio's read succeeds without touching the device, the
//! device is wrongly marked pollable, and every later read fails with EOPNOTSUPP.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{blocking, IO_ALIGN};

thread_local! {
    static IOPOLL_DECIDED: std::rc::Rc<tokio::sync::OnceCell<()>> = std::rc::Rc::default();
}

#[cfg(test)]
thread_local! {
    /// Probes run on this thread (with a scratch file), for the tests.
    pub(super) static PROBES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Decides, once per executor thread, whether the device of the directory holding `near`
/// polls; other opens on the thread wait until it has (the work runs in the blocking pool).
pub(super) async fn probe_iopoll_once(near: &Path) {
    let decided = IOPOLL_DECIDED.with(|p| p.clone());
    decided
        .get_or_init(|| async {
            let near_owned = near.to_path_buf();
            match blocking(move || device_polls(&near_owned)).await {
                Some((major, minor, false)) => glommio::io::set_iopoll_support(major, minor, false),
                _ => probe_iopoll(near).await,
            }
        })
        .await;
}

/// The block device of the file `near` (of its directory while it does not exist yet:
/// glommio keys its answer by the file's device) and whether its queue says it polls (sysfs
/// `queue/io_poll`); `None` when sysfs names no block device for it (tmpfs, btrfs's
/// anonymous devices) or the file cannot be read.
fn device_polls(near: &Path) -> Option<(usize, usize, bool)> {
    let meta = std::fs::metadata(near)
        .or_else(|_| std::fs::metadata(near.parent().unwrap_or(near)))
        .ok()?;
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev) as usize, libc::minor(dev) as usize);
    let polls = queue_polls(&PathBuf::from(format!("/sys/dev/block/{major}:{minor}")))?;
    Some((major, minor, polls))
}

/// What `queue/io_poll` says under a block device's sysfs directory, or under its parent's
/// for a partition (which has no queue of its own).
fn queue_polls(device: &Path) -> Option<bool> {
    let device = std::fs::canonicalize(device).ok()?;
    let said = [Some(device.as_path()), device.parent()]
        .into_iter()
        .flatten()
        .find_map(|d| std::fs::read_to_string(d.join("queue/io_poll")).ok())?;
    match said.trim() {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

async fn probe_iopoll(near: &Path) {
    #[cfg(test)]
    PROBES.with(|p| p.set(p.get() + 1));
    let Some(dir) = near.parent() else { return };
    let probe = dir.join(format!(".ringmq-iopoll-probe-{}", std::process::id()));
    // The scratch file is written, synced and removed in the blocking pool: an fsync, and
    // an unlink that may discard blocks on the device, would stall the shard for
    // milliseconds (this runs at the first append of a fresh store).
    let path = probe.clone();
    let written = blocking(move || {
        std::fs::write(&path, vec![0xa5u8; IO_ALIGN]).and_then(|_| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.sync_all())
        })
    })
    .await;
    if written.is_ok() {
        if let Ok(f) = glommio::io::OpenOptions::new()
            .read(true)
            .dma_open(&probe)
            .await
        {
            let _ = f.close().await;
        }
    }
    blocking(move || {
        let _ = std::fs::remove_file(&probe);
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_that_cannot_poll_says_so_for_its_partitions_too() {
        let root = tempfile::tempdir().unwrap();
        let disk = root.path().join("devices/vda");
        std::fs::create_dir_all(disk.join("queue")).unwrap();
        std::fs::create_dir_all(disk.join("vda1")).unwrap();
        std::fs::write(disk.join("queue/io_poll"), "0\n").unwrap();
        assert_eq!(queue_polls(&disk), Some(false));
        assert_eq!(
            queue_polls(&disk.join("vda1")),
            Some(false),
            "a partition: its disk's"
        );
        std::fs::write(disk.join("queue/io_poll"), "1\n").unwrap();
        assert_eq!(queue_polls(&disk.join("vda1")), Some(true));
        std::fs::write(disk.join("queue/io_poll"), "maybe\n").unwrap();
        assert_eq!(queue_polls(&disk), None, "an answer it cannot read: probe");
        std::fs::remove_file(disk.join("queue/io_poll")).unwrap();
        assert_eq!(queue_polls(&disk), None);
        assert_eq!(queue_polls(&root.path().join("no-such-device")), None);
    }
}

#[cfg(test)]
mod on_this_machine {
    use super::*;

    /// The first log file an executor opens runs the scratch-file probe only where sysfs
    /// does not say the disk cannot poll: where it says so (this project's VMs: a virtio
    /// disk), glommio is told and no read goes to its polled ring.
    #[test]
    fn a_disk_that_says_it_cannot_poll_is_not_probed() {
        let dir = tempfile::tempdir().unwrap();
        let said = device_polls(&dir.path().join("segment"));
        let path = dir.path().join("segment");
        let probes = crate::io::run_local(move || async move {
            let file = crate::io::LogFile::open(&path, true, false).await.unwrap();
            let again = crate::io::LogFile::open(&dir.path().join("other"), true, false)
                .await
                .unwrap();
            let mut buf = file.alloc(IO_ALIGN);
            buf.as_bytes_mut().fill(7);
            file.write_at(buf, 0).await.unwrap();
            let read = file.read_at(0, IO_ALIGN).await.unwrap();
            assert!(
                read.iter().all(|&b| b == 7),
                "a DMA read after the decision"
            );
            file.close().await.unwrap();
            again.close().await.unwrap();
            PROBES.with(|p| p.get())
        });
        match said {
            Some((_, _, false)) => assert_eq!(probes, 0, "sysfs said no: {said:?}"),
            _ => assert_eq!(probes, 1, "sysfs did not say no ({said:?}): one probe"),
        }
    }
}
