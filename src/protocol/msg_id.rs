//! Message ids: where a stored message lives, as 32 uppercase hex characters.
//!
//! ```text
//! chars  0..8   broker_id        u32, big-endian hex
//! chars  8..16  store_id         u32 (the shard whose commit log holds the message)
//! chars 16..32  physical_offset  u64 (byte position in that commit log)
//! ```
//!
//! Big-endian hex makes ids of one store sort in log order. Only uppercase is accepted, so
//! one message has exactly one id spelling (ids are used as lookup keys).

/// Characters in an encoded message id.
pub const MSG_ID_CHARS: usize = 32;

const _: () = assert!(MSG_ID_CHARS == 2 * (4 + 4 + 8));

/// The decoded form of a message id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    pub broker_id: u32,
    pub store_id: u32,
    pub physical_offset: u64,
}

/// Why a string is not a message id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgIdError {
    #[error("message id is {found} bytes long, expected {expected}")]
    BadLength { found: usize, expected: usize },
    #[error("message id has {found:?} at byte {at}, expected an uppercase hex digit")]
    BadChar { at: usize, found: char },
}

impl MessageId {
    /// The 32-character form. Written digit by digit: a batch answer carries one id per
    /// message, and `format!`'s machinery took several percent of a broker's time.
    pub fn encode(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let value = (u128::from(self.broker_id) << 96)
            | (u128::from(self.store_id) << 64)
            | u128::from(self.physical_offset);
        let mut digits = [0u8; MSG_ID_CHARS];
        for (i, digit) in digits.iter_mut().enumerate() {
            let shift = 4 * (MSG_ID_CHARS - 1 - i);
            *digit = HEX[((value >> shift) & 0xF) as usize];
        }
        digits.iter().map(|&digit| char::from(digit)).collect()
    }

    /// Parses the 32-character form: exactly 32 of `0-9A-F`.
    pub fn parse(s: &str) -> Result<MessageId, MsgIdError> {
        if s.len() != MSG_ID_CHARS {
            return Err(MsgIdError::BadLength {
                found: s.len(),
                expected: MSG_ID_CHARS,
            });
        }
        let mut value: u128 = 0;
        for (at, c) in s.char_indices() {
            let digit = match c {
                '0'..='9' => c as u128 - '0' as u128,
                'A'..='F' => c as u128 - 'A' as u128 + 10,
                _ => return Err(MsgIdError::BadChar { at, found: c }),
            };
            value = (value << 4) | digit;
        }
        // 32 hex digits are exactly 128 bits: the shifts below take the three fields apart.
        Ok(MessageId {
            broker_id: (value >> 96) as u32,
            store_id: (value >> 64) as u32,
            physical_offset: value as u64,
        })
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.encode())
    }
}

impl std::str::FromStr for MessageId {
    type Err = MsgIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MessageId::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check_parse(s: &str, expected: Result<MessageId, MsgIdError>) {
        assert_eq!(MessageId::parse(s), expected, "{s:?}");
    }

    #[test]
    fn encodes_fields_in_order_big_endian() {
        let id = MessageId {
            broker_id: 0x0102_0304,
            store_id: 0xA,
            physical_offset: 0xDEAD_BEEF_0000_0042,
        };
        assert_eq!(id.encode(), "010203040000000ADEADBEEF00000042");
        assert_eq!(id.to_string(), id.encode());
        check_parse("010203040000000ADEADBEEF00000042", Ok(id));
    }

    #[test]
    fn extremes_round_trip() {
        for id in [
            MessageId {
                broker_id: 0,
                store_id: 0,
                physical_offset: 0,
            },
            MessageId {
                broker_id: u32::MAX,
                store_id: u32::MAX,
                physical_offset: u64::MAX,
            },
        ] {
            check_parse(&id.encode(), Ok(id));
        }
    }

    #[test]
    fn bad_inputs_give_typed_errors() {
        check_parse(
            "",
            Err(MsgIdError::BadLength {
                found: 0,
                expected: 32,
            }),
        );
        check_parse(
            "0102030400000000DEADBEEF0000004",
            Err(MsgIdError::BadLength {
                found: 31,
                expected: 32,
            }),
        );
        check_parse(
            "0102030400000000deadbeef00000042",
            Err(MsgIdError::BadChar { at: 16, found: 'd' }),
        );
        check_parse(
            "+102030400000000DEADBEEF00000042",
            Err(MsgIdError::BadChar { at: 0, found: '+' }),
        );
        // 32 bytes, but a multi-byte character.
        check_parse(
            "0102030400000000DEADBEEF000000é",
            Err(MsgIdError::BadChar {
                at: 30, found: 'é'
            }),
        );
        assert_eq!(
            "XYZ".parse::<MessageId>(),
            Err(MsgIdError::BadLength {
                found: 3,
                expected: 32
            })
        );
    }

    proptest! {
        #[test]
        fn encode_parse_round_trip(broker_id: u32, store_id: u32, physical_offset: u64) {
            let id = MessageId { broker_id, store_id, physical_offset };
            let s = id.encode();
            prop_assert_eq!(s.len(), MSG_ID_CHARS);
            prop_assert_eq!(MessageId::parse(&s), Ok(id));
        }

        #[test]
        fn encode_matches_the_formatted_spelling(broker_id: u32, store_id: u32, physical_offset: u64) {
            let id = MessageId { broker_id, store_id, physical_offset };
            prop_assert_eq!(id.encode(), format!("{broker_id:08X}{store_id:08X}{physical_offset:016X}"));
        }

        #[test]
        fn ids_sort_like_their_fields(a: (u32, u32, u64), b: (u32, u32, u64)) {
            let ia = MessageId { broker_id: a.0, store_id: a.1, physical_offset: a.2 };
            let ib = MessageId { broker_id: b.0, store_id: b.1, physical_offset: b.2 };
            prop_assert_eq!(ia.encode().cmp(&ib.encode()), ia.cmp(&ib));
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "\\PC{0,40}") {
            if let Ok(id) = MessageId::parse(&s) {
                prop_assert_eq!(id.encode(), s);
            }
        }
    }
}
