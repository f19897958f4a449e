//! The answers to storage errors: each `StoreError` as the error code and message a
//! client gets, and, for a request whose records were appended already, whether they may
//! be stored.

use super::err;
use crate::log::LogError;
use crate::protocol::{ErrorBody, ErrorCode};
use crate::store::StoreError;

/// The answer to a request whose records were appended, when waiting for their write (or
/// fdatasync) failed: only a cut that dropped them says nothing was stored; any other
/// failure leaves them perhaps stored, perhaps read by consumers already (`StoreUnsure`:
/// a producer that sends again may store them twice, and says so if it gives up).
pub(crate) fn unsure_error(e: StoreError) -> ErrorBody {
    match &e {
        StoreError::Log(LogError::DiskFull { .. }) => store_error(e),
        _ => err(
            ErrorCode::StoreUnsure,
            format!("{e} (after the request's records were appended: they may be stored)"),
        ),
    }
}

pub(crate) fn store_error(e: StoreError) -> ErrorBody {
    match &e {
        StoreError::InvalidTopic(_) => err(ErrorCode::InvalidTopic, e.to_string()),
        StoreError::OffsetTooSmall { .. } => err(ErrorCode::OffsetTooSmall, e.to_string()),
        StoreError::OffsetTooBig { .. } => err(ErrorCode::OffsetTooBig, e.to_string()),
        StoreError::QueueOpening { .. } => err(ErrorCode::BrokerBusy, e.to_string()),
        StoreError::Log(LogError::DiskFull { .. })
        | StoreError::Index(crate::index::IndexError::DiskFull { .. }) => {
            err(ErrorCode::DiskFull, e.to_string())
        }
        StoreError::Log(LogError::Poisoned { .. }) => {
            err(ErrorCode::StoreUnavailable, e.to_string())
        }
        StoreError::Log(LogError::CutUnknown { .. }) => err(ErrorCode::StoreUnsure, e.to_string()),
        StoreError::Log(LogError::InvalidRecord(_))
        | StoreError::Log(LogError::RecordTooLarge { .. }) => {
            err(ErrorCode::InvalidMessage, e.to_string())
        }
        StoreError::Log(LogError::Corrupt { .. })
        | StoreError::Index(crate::index::IndexError::Corrupt { .. }) => {
            err(ErrorCode::StoreCorrupt, e.to_string())
        }
        StoreError::Log(LogError::NoRecord { .. }) => err(ErrorCode::OffsetNotFound, e.to_string()),
        StoreError::Log(LogError::OffsetTooSmall { .. }) => {
            err(ErrorCode::OffsetTooSmall, e.to_string())
        }
        StoreError::Log(LogError::OffsetTooBig { .. }) => {
            err(ErrorCode::OffsetTooBig, e.to_string())
        }
        _ => err(ErrorCode::StoreIo, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After an append, only a cut says nothing was stored: a failed write or fdatasync
    /// (the log poisoned), an I/O error or a cut too long ago to tell may have kept it.
    #[test]
    fn a_failure_after_an_append_says_the_records_may_be_stored_unless_a_cut_dropped_them() {
        let code = |e: StoreError| ErrorCode::from_u16(unsure_error(e).code);
        let cut = LogError::DiskFull {
            reason: "full".into(),
        };
        assert_eq!(code(StoreError::Log(cut)), Some(ErrorCode::DiskFull));
        let unsure = [
            LogError::Poisoned {
                reason: "fdatasync: EIO".into(),
            },
            LogError::Io(std::io::Error::other("EIO")),
            LogError::CutUnknown {
                reason: "full".into(),
            },
        ];
        for e in unsure {
            let body = unsure_error(StoreError::Log(e));
            assert_eq!(ErrorCode::from_u16(body.code), Some(ErrorCode::StoreUnsure));
            assert!(body.message.contains("may be stored"), "{}", body.message);
        }
        // Not after an append, a poisoned log refuses: nothing was stored.
        let refused = store_error(StoreError::Log(LogError::Poisoned {
            reason: "EIO".into(),
        }));
        assert_eq!(
            ErrorCode::from_u16(refused.code),
            Some(ErrorCode::StoreUnavailable)
        );
    }
}
