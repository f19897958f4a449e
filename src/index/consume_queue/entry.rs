//! One consume-queue entry on disk: its layout, and the check it carries (see the
//! module above for the layout).

use std::path::Path;

use super::{read_u32, read_u64, write_u32, write_u64, IndexError};

/// Bytes of one consume-queue entry on disk.
pub const CQ_ENTRY_BYTES: u64 = 20;
const _: () = assert!(CQ_ENTRY_BYTES == 8 + 4 + 8);
const _: () = assert!(CQ_ENTRY_BYTES == 20);

const PHYSICAL_OFFSET_AT: usize = 0;
const SIZE_AT: usize = 8;
pub(super) const TAG_HASH_AT: usize = 12;
const _: () = assert!(TAG_HASH_AT + 8 == CQ_ENTRY_BYTES as usize);

/// Bits of the physical-offset field that hold the offset; the bits above hold the check.
const OFFSET_BITS: u32 = 48;
/// The highest log offset an entry can name (256 TiB).
pub const CQ_PHYSICAL_OFFSET_MAX: u64 = (1 << OFFSET_BITS) - 1;
/// Set in every entry written with a check.
const CHECKED: u64 = 1 << 63;
const CHECK_MASK: u64 = 0x7fff;

/// One consume-queue entry: where the message is in the commit log, and its tag hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    pub physical_offset: u64,
    /// Bytes of the record in the commit log; never 0.
    pub size: u32,
    /// [`super::tag_hash`] of the message's tag, or [`super::TAG_HASH_NONE`].
    pub tag_hash: u64,
}

impl CqEntry {
    /// The entry's bytes without the check (the physical offset below 2^48).
    fn plain_bytes(&self) -> [u8; CQ_ENTRY_BYTES as usize] {
        let mut out = [0u8; CQ_ENTRY_BYTES as usize];
        write_u64(&mut out, PHYSICAL_OFFSET_AT, self.physical_offset);
        write_u32(&mut out, SIZE_AT, self.size);
        write_u64(&mut out, TAG_HASH_AT, self.tag_hash);
        out
    }

    /// The top 16 bits of the physical-offset field: the flag and 15 bits of CRC32C.
    fn check_bits(&self) -> u64 {
        let crc = u64::from(crc32c::crc32c(&self.plain_bytes()));
        CHECKED | (crc & CHECK_MASK) << OFFSET_BITS
    }

    /// Writes the entry with its check; the physical offset is at most
    /// [`CQ_PHYSICAL_OFFSET_MAX`] (`put` refuses others).
    pub(super) fn encode(&self, out: &mut [u8]) {
        let plain = self.plain_bytes();
        out[..plain.len()].copy_from_slice(&plain);
        let field = self.physical_offset | self.check_bits();
        write_u64(out, PHYSICAL_OFFSET_AT, field);
    }

    /// The entry in `bytes` and whether its check holds (an entry written before checks
    /// were kept holds); `None` for an empty slot.
    pub(super) fn decode(bytes: &[u8]) -> Option<(CqEntry, bool)> {
        let field = read_u64(bytes, PHYSICAL_OFFSET_AT);
        let entry = CqEntry {
            physical_offset: field & CQ_PHYSICAL_OFFSET_MAX,
            size: read_u32(bytes, SIZE_AT),
            tag_hash: read_u64(bytes, TAG_HASH_AT),
        };
        // Size 0 is the empty marker. A torn page could leave a non-zero offset with size 0;
        // that is no entry either.
        if entry.size == 0 {
            return None;
        }
        let check = field & !CQ_PHYSICAL_OFFSET_MAX;
        Some((entry, check == 0 || check == entry.check_bits()))
    }

    /// The entry in `bytes`, `None` for an empty slot; one whose check fails is an error
    /// naming `path` and the entry's place in it.
    pub(super) fn decode_checked(
        bytes: &[u8],
        path: &Path,
        i: u64,
    ) -> Result<Option<CqEntry>, IndexError> {
        match Self::decode(bytes) {
            None => Ok(None),
            Some((entry, true)) => Ok(Some(entry)),
            Some((entry, false)) => Err(IndexError::Corrupt {
                path: path.to_owned(),
                reason: format!(
                    "entry {i} fails its check (reads as physical offset {}, size {}, tag hash {:#x}): the index is damaged; its messages are not served until it is rebuilt from the log: create an empty file named `reindex` in the shard's directory (beside its `checkpoint`), and its next start indexes the log again",
                    entry.physical_offset, entry.size, entry.tag_hash
                ),
            }),
        }
    }

    /// The first byte after the record.
    pub fn end(&self) -> u64 {
        self.physical_offset.saturating_add(u64::from(self.size))
    }
}
