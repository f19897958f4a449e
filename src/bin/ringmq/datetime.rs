//! Times on the command line: RFC 3339 in (`group reset-offset --time`) and out (message
//! timestamps, reset times), as milliseconds since the UNIX epoch. The calendar is the
//! `time` crate's; this file only pins down the accepted inputs and the output format.

use time::format_description::well_known::Rfc3339;
use time::format_description::BorrowedFormatItem;
use time::macros::format_description;
use time::OffsetDateTime;

/// What [`format_ms`] writes: UTC with milliseconds.
const UTC_MS: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// What [`format_ms`] writes for a time the `time` crate cannot represent (beyond the
/// years -9999..=9999).
const OUT_OF_RANGE: &str = "(out of range)";

const NS_PER_MS: i128 = 1_000_000;

/// ms since the epoch as RFC 3339 UTC with milliseconds.
pub(crate) fn format_ms(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * NS_PER_MS)
        .ok()
        .and_then(|t| t.format(UTC_MS).ok())
        .unwrap_or_else(|| OUT_OF_RANGE.to_owned())
}

/// Parses RFC 3339 (`YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)`; `t` or a space may stand
/// for `T`, `z` for `Z`) to ms since the epoch; fractions below a millisecond are dropped.
pub(crate) fn parse_rfc3339_ms(s: &str) -> Result<i64, String> {
    let bad = || format!("{s:?} is not an RFC 3339 time such as 2024-05-01T12:00:00Z");
    // The `time` crate takes any byte between date and time; this command always took only
    // these three.
    if !matches!(s.as_bytes().get(10), Some(b'T' | b't' | b' ')) {
        return Err(bad());
    }
    // A leap second (60) counts as the next second's start, at any time of day. The `time`
    // crate accepts 60 only as the last second of a month (UTC), as 59.999999999, so the
    // second is parsed as 59 and the second added back.
    let (input, leap_ms) = match s.get(17..19) {
        Some("60") => (format!("{}59{}", &s[..17], &s[19..]), 1000),
        _ => (s.to_owned(), 0),
    };
    let t = OffsetDateTime::parse(&input, &Rfc3339).map_err(|_| bad())?;
    let ms = t.unix_timestamp_nanos().div_euclid(NS_PER_MS);
    i64::try_from(ms).map(|ms| ms + leap_ms).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_rfc3339_ms("2024-05-01T12:00:00.123Z"),
            Ok(1_714_564_800_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-05-01T14:00:00.1234+02:00"),
            Ok(1_714_564_800_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29 00:00:00-00:30"),
            Ok(1_709_166_600_000)
        );
        assert_eq!(format_ms(1_714_564_800_123), "2024-05-01T12:00:00.123Z");
        assert_eq!(format_ms(-1), "1969-12-31T23:59:59.999Z");
        for ms in [0, 1, 951_782_400_000, 4_102_444_799_999, -86_400_001] {
            assert_eq!(parse_rfc3339_ms(&format_ms(ms)), Ok(ms), "{ms}");
        }
        for bad in [
            "",
            "2024-05-01",
            "2024-05-01T12:00:00",
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-05-01T24:00:00Z",
            "2024-05-01T12:00:00.Z",
            "2024-05-01T12:00:00+2:00",
            "2024-05-01T12:00:00Zx",
            "+024-05-01T12:00:00Z",
        ] {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rfc3339_edges_keep_their_meaning() {
        // Lower-case separators, any number of fraction digits (truncated), the extremes of
        // the offsets and of the four-digit years.
        assert_eq!(
            parse_rfc3339_ms("1970-01-01t00:00:00.0019999999999z"),
            Ok(1)
        );
        assert_eq!(parse_rfc3339_ms("1970-01-01T23:59:00+23:59"), Ok(0));
        assert_eq!(
            parse_rfc3339_ms("0000-01-01T00:00:00Z"),
            Ok(-62_167_219_200_000)
        );
        assert_eq!(
            parse_rfc3339_ms("9999-12-31T23:59:59.999Z"),
            Ok(253_402_300_799_999)
        );
        assert_eq!(format_ms(-62_167_219_200_000), "0000-01-01T00:00:00.000Z");
        assert_eq!(format_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        // A leap second, at any time of day, is the next second's start.
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:60.5Z"), Ok(60_500));
        assert_eq!(
            parse_rfc3339_ms("2016-12-31T23:59:60Z"),
            parse_rfc3339_ms("2017-01-01T00:00:00Z")
        );
        assert_eq!(format_ms(i64::MAX), OUT_OF_RANGE);
        for bad in [
            "2024-05-01x12:00:00Z",
            "2024-05-01T12:00:61Z",
            "2024-05-01T12:60:00Z",
            "2024-05-01T12:00:00+24:00",
            "2024-05-01T12:00:00+01:60",
            "2024-05-01T12:00:00+0100",
            "2024-05-01T12:00:00 Z",
            "2024-05-00T12:00:00Z",
            "-2024-05-01T12:00:00Z",
            "2024-5-01T12:00:00Z",
            "2024-05-01T12:00:00.1.2Z",
            "2024-05-01T12:00:00\u{e9}",
        ] {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad:?}");
        }
    }
}
