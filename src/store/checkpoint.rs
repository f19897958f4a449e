//! The checkpoint file: the log offset below which every index entry is on disk, and where
//! the key index's entries of those records end. Written atomically (temp file, fsync,
//! rename, fsync of the directory) with a CRC, so a torn checkpoint is never trusted.
//!
//! Layout (little-endian): magic "RMQC", version u32, log_offset u64, timestamp_ms i64,
//! then in version 2 the key index's synced entries (kind u32: 0 none, 1 up to, 2 not
//! known; file sequence u64; count u32), then the CRC32C of all before it. Version 1 (28 bytes, no key
//! index part) is still read.

use std::path::Path;

use crate::index::KeysSynced;

const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"RMQC");
const CHECKPOINT_VERSION: u32 = 2;
const CHECKPOINT_BYTES: usize = 44;
const _: () = assert!(CHECKPOINT_BYTES == 4 + 4 + 8 + 8 + 4 + 8 + 4 + 4);
const CHECKPOINT_V1_BYTES: usize = 28;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checkpoint {
    pub log_offset: u64,
    pub timestamp_ms: i64,
    /// The key index's entries of the records below `log_offset`, synced when this was
    /// written ([`KeysSynced::Unknown`] read from a version 1 file).
    pub keys: KeysSynced,
}

impl Checkpoint {
    fn encode(&self) -> [u8; CHECKPOINT_BYTES] {
        let mut b = [0u8; CHECKPOINT_BYTES];
        b[0..4].copy_from_slice(&CHECKPOINT_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.log_offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.timestamp_ms.to_le_bytes());
        let (kind, seq, count) = match self.keys {
            KeysSynced::Nothing => (0u32, 0u64, 0u32),
            KeysSynced::UpTo { seq, count } => (1, seq, count),
            KeysSynced::Unknown => (2, 0, 0),
        };
        b[24..28].copy_from_slice(&kind.to_le_bytes());
        b[28..36].copy_from_slice(&seq.to_le_bytes());
        b[36..40].copy_from_slice(&count.to_le_bytes());
        let crc = crc32c::crc32c(&b[..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Checkpoint> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let (crc_at, version) = match b.len() {
            CHECKPOINT_BYTES => (40, CHECKPOINT_VERSION),
            CHECKPOINT_V1_BYTES => (24, 1),
            _ => return None,
        };
        if u32_at(0) != CHECKPOINT_MAGIC || u32_at(4) != version {
            return None;
        }
        if u32_at(crc_at) != crc32c::crc32c(&b[..crc_at]) {
            return None;
        }
        let keys = match (crc_at, u32_at(24)) {
            (24, _) => KeysSynced::Unknown,
            (_, 0) => KeysSynced::Nothing,
            (_, 1) => KeysSynced::UpTo {
                seq: u64_at(28),
                count: u32_at(36),
            },
            (_, 2) => KeysSynced::Unknown,
            _ => return None,
        };
        Some(Checkpoint {
            log_offset: u64_at(8),
            timestamp_ms: u64_at(16) as i64,
            keys,
        })
    }

    /// Reads the checkpoint in `dir`. A missing or damaged file reads as offset 0: recovery
    /// then re-indexes the whole log, which is slower but never wrong.
    pub fn read(dir: &Path) -> std::io::Result<Checkpoint> {
        Ok(Checkpoint::read_found(dir)?.unwrap_or_default())
    }

    /// The checkpoint in `dir`; `None` if the file is missing or damaged.
    pub fn read_found(dir: &Path) -> std::io::Result<Option<Checkpoint>> {
        let path = dir.join("checkpoint");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let found = Checkpoint::decode(&bytes);
                if found.is_none() {
                    crate::warn!(
                        "ringmq: checkpoint {} is damaged; re-indexing from the start",
                        path.display()
                    );
                }
                Ok(found)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
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
        for keys in [
            KeysSynced::Unknown,
            KeysSynced::Nothing,
            KeysSynced::UpTo {
                seq: 7,
                count: 4_000_000,
            },
        ] {
            let cp = Checkpoint {
                log_offset: 123_456,
                timestamp_ms: 99,
                keys,
            };
            cp.write(dir.path()).unwrap();
            assert_eq!(Checkpoint::read(dir.path()).unwrap(), cp);
        }
        let good = std::fs::read(dir.path().join("checkpoint")).unwrap();
        for at in [9, 30, 41] {
            let mut bytes = good.clone();
            bytes[at] ^= 1;
            std::fs::write(dir.path().join("checkpoint"), &bytes).unwrap();
            assert_eq!(Checkpoint::read(dir.path()).unwrap(), Checkpoint::default());
        }
    }

    /// A checkpoint written before the key index's part was added is read, with that part
    /// unknown (an unclean start then leaves the key index as it finds it).
    #[test]
    fn a_version_1_checkpoint_is_read_with_its_keys_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = Vec::new();
        b.extend_from_slice(b"RMQC");
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&5_000u64.to_le_bytes());
        b.extend_from_slice(&42i64.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        std::fs::write(dir.path().join("checkpoint"), &b).unwrap();
        let cp = Checkpoint::read(dir.path()).unwrap();
        assert_eq!(
            (cp.log_offset, cp.timestamp_ms, cp.keys),
            (5_000, 42, KeysSynced::Unknown)
        );
        // Version 2's number on a file of version 1's length is damage.
        b[4..8].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&b[..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(dir.path().join("checkpoint"), &b).unwrap();
        assert_eq!(Checkpoint::read(dir.path()).unwrap(), Checkpoint::default());
    }
}
