//! Frames in pieces: message bodies kept by reference instead of copied into the frame
//! (the client's requests), byte for byte the frame the copying encoder makes.

use bytes::Bytes;
use rkyv::rancor;
use rkyv::ser::Writer;
use rkyv::vec::{ArchivedVec, VecResolver};
use rkyv::with::{ArchiveWith, DeserializeWith, SerializeWith};
use rkyv::Place;

use super::{encode_head_with, Flags, Message, ProtocolError};

/// A writer that can take bytes by reference (a clone of their [`Bytes`]) instead of
/// copying them: what [`SharedBytes`] fields are serialized through.
pub trait ShareBytes {
    /// Appends `bytes` at the current position.
    fn share(&mut self, bytes: &Bytes);
}

impl<W: ShareBytes, A, S, E> ShareBytes for rancor::Strategy<rkyv::ser::Serializer<W, A, S>, E> {
    fn share(&mut self, bytes: &Bytes) {
        self.writer.share(bytes);
    }
}

/// An rkyv `with` wrapper: a [`Bytes`] field archived exactly as a `Vec<u8>` is (the wire
/// does not change), which [`Message::write_meta_parts`] keeps by reference: a batch's
/// bodies go from the caller's buffers to the socket without being copied into the frame.
pub struct SharedBytes;

impl ArchiveWith<Bytes> for SharedBytes {
    type Archived = ArchivedVec<u8>;
    type Resolver = VecResolver;

    fn resolve_with(field: &Bytes, resolver: VecResolver, out: Place<ArchivedVec<u8>>) {
        ArchivedVec::resolve_from_len(field.len(), resolver, out);
    }
}

impl<S> SerializeWith<Bytes, S> for SharedBytes
where
    S: rancor::Fallible + Writer + ShareBytes + ?Sized,
{
    fn serialize_with(field: &Bytes, serializer: &mut S) -> Result<VecResolver, S::Error> {
        // As `[u8]::serialize_unsized`: bytes need no alignment, the vector points at them.
        let pos = serializer.pos();
        serializer.share(field);
        Ok(VecResolver::from_pos(pos))
    }
}

impl<D: rancor::Fallible + ?Sized> DeserializeWith<ArchivedVec<u8>, Bytes, D> for SharedBytes {
    fn deserialize_with(field: &ArchivedVec<u8>, _: &mut D) -> Result<Bytes, D::Error> {
        Ok(Bytes::copy_from_slice(field.as_slice()))
    }
}

/// A frame in pieces: its own bytes, with shared bytes (message bodies, by reference) to be
/// inserted at their indexes. Written with one vectored write, it is byte for byte the frame
/// [`encode_frame`](super::encode_frame) makes.
#[derive(Debug, Default)]
pub struct FrameParts {
    pub bytes: Vec<u8>,
    /// (index in `bytes` the shared bytes go before, the bytes), indexes in order.
    pub shared: Vec<(usize, Bytes)>,
}

impl FrameParts {
    /// The whole frame's length.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.shared.iter().map(|(_, b)| b.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` with the frame's non-empty pieces in order (for a vectored write).
    pub fn for_each_slice<'a>(&'a self, mut f: impl FnMut(&'a [u8])) {
        let mut from = 0;
        for (at, b) in &self.shared {
            if *at > from {
                f(&self.bytes[from..*at]);
            }
            from = *at;
            f(b);
        }
        if from < self.bytes.len() {
            f(&self.bytes[from..]);
        }
    }
}

/// Encodes a frame of no raw tail into `FrameParts`: [`SharedBytes`] fields are kept by
/// reference instead of copied. Returns the frame's length.
pub fn encode_frame_parts<M: Message>(
    request_id: u64,
    flags: Flags,
    meta: &M,
    out: &mut FrameParts,
) -> Result<usize, ProtocolError> {
    let FrameParts { bytes, shared } = out;
    let before = shared.len();
    encode_head_with(M::KIND, request_id, flags, 0, bytes, |bytes| {
        meta.write_meta_parts(bytes, shared)?;
        Ok(shared[before..].iter().map(|(_, b)| b.len()).sum())
    })
    .inspect_err(|_| shared.truncate(before))
}
