//! The client's error type. Broker error frames keep their stable code and text; transport
//! failures say which address and what happened; retriable errors are told apart so a
//! producer knows when sending again may help.

use crate::protocol::{ErrorBody, ErrorCode, ProtocolError};

/// Everything a client call can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The broker answered with an error frame. `code` is `None` for a code this client does
    /// not know (a newer broker); `raw_code` always holds the number.
    #[error("broker error {}: {message}", display_code(*.code, *.raw_code))]
    Broker {
        code: Option<ErrorCode>,
        raw_code: u16,
        message: String,
    },
    /// No answer within the request's timeout. The request may still have been carried out
    /// (a send may be stored): retrying gives at-least-once delivery.
    #[error("request timed out after {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    /// The connection could not be opened, or broke with the request in flight.
    #[error("connection: {0}")]
    Connection(String),
    /// The broker sent bytes that are not a valid answer.
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    /// The broker's handshake answer is inconsistent (no shards, wrong address count).
    #[error("bad handshake: {0}")]
    BadHandshake(String),
    /// Refused before sending: the body is larger than a record may carry.
    #[error("message body of {len} bytes is larger than the limit of {max} bytes")]
    BodyTooLarge { len: usize, max: usize },
    /// Refused before sending: the caller's input breaks a limit or a rule.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The local offsets file of a broadcasting consumer could not be read or written (it
    /// names the file and the operation).
    #[error("local offsets: {0}")]
    OffsetStore(String),
    /// The first record a pull of the queue from `offset` read is damaged (its CRC or its
    /// structure fails): it is not delivered, and nothing after it is until the consumer
    /// moves past it (the records before it in the same answer were delivered).
    #[error(
        "the record at offset {offset} of {topic}[{queue_id}] (the first one a pull from there reads) is damaged: {reason}; nothing from there on is consumed until the group's offset is moved past it (its members stopped: `ringmq offset commit GROUP {topic} {queue_id} {}`)",
        .offset + 1
    )]
    DamagedRecord {
        topic: String,
        queue_id: u32,
        offset: u64,
        reason: String,
    },
}

fn display_code(code: Option<ErrorCode>, raw_code: u16) -> String {
    match code {
        Some(code) => code.to_string(),
        None => format!("{raw_code}"),
    }
}

impl ClientError {
    /// Whether the same request may succeed if sent again (after a pause, possibly on a new
    /// connection or to another queue): timeouts, broken connections, and the broker codes
    /// `ErrorCode::is_retriable` names.
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Broker { code, .. } => code.is_some_and(ErrorCode::is_retriable),
            ClientError::Timeout { .. } | ClientError::Connection(_) => true,
            ClientError::Protocol(_)
            | ClientError::DamagedRecord { .. }
            | ClientError::BadHandshake(_)
            | ClientError::BodyTooLarge { .. }
            | ClientError::InvalidArgument(_)
            | ClientError::OffsetStore(_) => false,
        }
    }

    /// The broker's error code, when this is a broker error with a known code.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Broker { code, .. } => *code,
            _ => None,
        }
    }
}

impl From<ErrorBody> for ClientError {
    fn from(e: ErrorBody) -> ClientError {
        ClientError::Broker {
            code: e.error_code(),
            raw_code: e.code,
            message: e.message,
        }
    }
}

/// The client's result type.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn check(e: ClientError, retriable: bool, text: &str) {
        assert_eq!(e.is_retriable(), retriable, "{e:?}");
        assert_eq!(e.to_string(), text);
    }

    #[test]
    fn retriable_and_messages() {
        check(
            ErrorBody::new(ErrorCode::ShardUnavailable, "stopping").into(),
            true,
            "broker error ShardUnavailable(41): stopping",
        );
        check(
            ErrorBody::new(ErrorCode::TopicNotFound, "no topic t").into(),
            false,
            "broker error TopicNotFound(10): no topic t",
        );
        check(
            ErrorBody {
                code: 4242,
                message: "new".into(),
            }
            .into(),
            false,
            "broker error 4242: new",
        );
        check(
            ClientError::Timeout { timeout_ms: 5 },
            true,
            "request timed out after 5 ms",
        );
        check(ClientError::Connection("x".into()), true, "connection: x");
        check(
            ClientError::BodyTooLarge { len: 5, max: 4 },
            false,
            "message body of 5 bytes is larger than the limit of 4 bytes",
        );
    }
}
