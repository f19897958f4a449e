//! The checkpoint file: the log offset below which every index entry is on disk. Written
//! atomically (temp file, fsync, rename, fsync of the directory) with a CRC, so a torn
//! checkpoint is never trusted.

use std::path::Path;

const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"RMQC");
const CHECKPOINT_VERSION: u32 = 1;
const CHECKPOINT_BYTES: usize = 28;
const _: () = assert!(CHECKPOINT_BYTES == 4 + 4 + 8 + 8 + 4);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checkpoint {
    pub log_offset: u64,
    pub timestamp_ms: i64,
}

impl Checkpoint {
    fn encode(&self) -> [u8; CHECKPOINT_BYTES] {
        let mut b = [0u8; CHECKPOINT_BYTES];
        b[0..4].copy_from_slice(&CHECKPOINT_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.log_offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.timestamp_ms.to_le_bytes());
        let crc = crc32c::crc32c(&b[..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Checkpoint> {
        if b.len() != CHECKPOINT_BYTES {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        if u32_at(0) != CHECKPOINT_MAGIC || u32_at(4) != CHECKPOINT_VERSION {
            return None;
        }
        if u32_at(24) != crc32c::crc32c(&b[..24]) {
            return None;
        }
        Some(Checkpoint {
            log_offset: u64_at(8),
            timestamp_ms: u64_at(16) as i64,
        })
    }

    /// Reads the checkpoint in `dir`. A missing or damaged file reads as offset 0: recovery
    /// then re-indexes the whole log, which is slower but never wrong.
    pub fn read(dir: &Path) -> std::io::Result<Checkpoint> {
        let path = dir.join("checkpoint");
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Checkpoint::decode(&bytes).unwrap_or_else(|| {
                crate::warn!(
                    "ringmq: checkpoint {} is damaged; re-indexing from the start",
                    path.display()
                );
                Checkpoint::default()
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
            Err(e) => Err(std::io::Error::new(
                e.kind(),
                format!("read {}: {e}", path.display()),
            )),
        }
    }

    /// Writes the checkpoint atomically.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        crate::io::replace_file(&dir.join("checkpoint"), &self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Checkpoint::read(dir.path()).unwrap(), Checkpoint::default());
        let cp = Checkpoint {
            log_offset: 123_456,
            timestamp_ms: 99,
        };
        cp.write(dir.path()).unwrap();
        assert_eq!(Checkpoint::read(dir.path()).unwrap(), cp);
        let mut bytes = std::fs::read(dir.path().join("checkpoint")).unwrap();
        bytes[9] ^= 1;
        std::fs::write(dir.path().join("checkpoint"), &bytes).unwrap();
        assert_eq!(Checkpoint::read(dir.path()).unwrap(), Checkpoint::default());
    }
}
