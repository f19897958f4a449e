//! Delayed delivery as the wire states it: the properties a producer sets to ask for it
//! (a delay level, a delay in ms, or a delivery time), the broker's table of delay levels,
//! and the rule that turns them into a delivery time. Pure: the broker checks a send with
//! [`DelayRule::deliver_at`], the client names the same properties.

use super::record::{prop, Properties};

/// RocketMQ's default delay levels (`messageDelayLevel`): level `n` is the `n`-th entry.
pub const DELAY_LEVELS_DEFAULT: &str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";
/// The longest delay a message may ask for by default: 3 days, as RocketMQ 5's
/// `timerMaxDelaySec`.
pub const DELAY_MAX_MS_DEFAULT: u64 = 3 * 24 * 3600 * 1000;
/// The longest delay a broker may be configured to accept: a year.
pub const DELAY_MAX_MS_LIMIT: u64 = 366 * 24 * 3600 * 1000;
/// Most delay levels a broker may be configured with.
pub const DELAY_LEVELS_MAX: usize = 64;
/// The delay level of a message's first retry; each retry after it takes the next level
/// (RocketMQ: `3 + reconsumeTimes`, so 10 s, 30 s, 1 m, ... with the default levels).
pub const RETRY_FIRST_LEVEL: u32 = 3;

/// Why a message's delay properties are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DelayError {
    #[error("property {name}={value:?} is not a number")]
    NotANumber { name: &'static str, value: String },
    #[error("delay level {level} does not exist: this broker has levels 1 to {levels}")]
    NoSuchLevel { level: u64, levels: usize },
    #[error("a delay of {delay_ms} ms is beyond this broker's limit of {max_ms} ms")]
    TooFar { delay_ms: u64, max_ms: u64 },
    #[error(
        "a message may name only one of {}, {} and {}",
        prop::DELAY,
        prop::TIMER_DELAY_MS,
        prop::TIMER_DELIVER_MS
    )]
    Conflicting,
}

/// Why a delay-level table does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("delay levels {text:?}: {reason}")]
pub struct DelayLevelsError {
    text: String,
    reason: String,
}

/// A duration written like `500ms`, `10s`, `5m`, `2h` or `1d` (RocketMQ's level syntax,
/// plus `ms` and `d`).
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// The broker's delay rules: the level table and the longest delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayRule {
    levels_ms: Vec<u64>,
    max_ms: u64,
}

impl Default for DelayRule {
    fn default() -> Self {
        DelayRule::new(DELAY_LEVELS_DEFAULT, DELAY_MAX_MS_DEFAULT)
            .expect("the default delay levels parse")
    }
}

impl DelayRule {
    /// `levels`: space-separated durations, level 1 first.
    pub fn new(levels: &str, max_ms: u64) -> Result<DelayRule, DelayLevelsError> {
        let bad = |reason: String| DelayLevelsError {
            text: levels.to_owned(),
            reason,
        };
        if max_ms == 0 || max_ms > DELAY_MAX_MS_LIMIT {
            return Err(bad(format!(
                "the longest delay must be 1 to {DELAY_MAX_MS_LIMIT} ms, not {max_ms}"
            )));
        }
        let mut levels_ms = Vec::new();
        for word in levels.split_whitespace() {
            let ms = parse_duration_ms(word).ok_or_else(|| {
                bad(format!(
                    "{word:?} is not a duration like 500ms, 10s, 5m, 2h or 1d"
                ))
            })?;
            if ms == 0 {
                return Err(bad(format!("{word:?}: a level must be longer than 0")));
            }
            if ms > max_ms {
                return Err(bad(format!(
                    "{word:?} is longer than the longest delay ({max_ms} ms)"
                )));
            }
            levels_ms.push(ms);
        }
        if levels_ms.is_empty() || levels_ms.len() > DELAY_LEVELS_MAX {
            return Err(bad(format!(
                "give 1 to {DELAY_LEVELS_MAX} levels, not {}",
                levels_ms.len()
            )));
        }
        Ok(DelayRule { levels_ms, max_ms })
    }

    pub fn levels(&self) -> usize {
        self.levels_ms.len()
    }

    pub fn max_ms(&self) -> u64 {
        self.max_ms
    }

    /// The delay of level `level` (1-based), the last level for anything above it.
    pub fn level_ms(&self, level: u32) -> u64 {
        let i = (level.max(1) as usize).min(self.levels_ms.len()) - 1;
        self.levels_ms[i]
    }

    /// The delay level of a retry after `reconsume_times` failed attempts, capped at the
    /// last level.
    pub fn retry_level(&self, reconsume_times: u32) -> u32 {
        (RETRY_FIRST_LEVEL.saturating_add(reconsume_times)).min(self.levels_ms.len() as u32)
    }

    /// When a message with these properties is to be delivered: `None` for a message that
    /// asks for no delay (level 0 is no delay, as upstream), else the time in ms since the
    /// epoch (a time at or before `now_ms` means at once).
    pub fn deliver_at(
        &self,
        props: &Properties<'_>,
        now_ms: i64,
    ) -> Result<Option<i64>, DelayError> {
        let number = |name: &'static str| -> Result<Option<u64>, DelayError> {
            match props.get(name) {
                None => Ok(None),
                Some(value) => {
                    value
                        .trim()
                        .parse::<u64>()
                        .map(Some)
                        .map_err(|_| DelayError::NotANumber {
                            name,
                            value: value.to_owned(),
                        })
                }
            }
        };
        let level = number(prop::DELAY)?.filter(|&l| l > 0);
        let delay_ms = number(prop::TIMER_DELAY_MS)?;
        let at_ms = number(prop::TIMER_DELIVER_MS)?;
        let named = [level.is_some(), delay_ms.is_some(), at_ms.is_some()];
        if named.iter().filter(|&&n| n).count() > 1 {
            return Err(DelayError::Conflicting);
        }
        let delay_ms = if let Some(level) = level {
            if level > self.levels_ms.len() as u64 {
                return Err(DelayError::NoSuchLevel {
                    level,
                    levels: self.levels_ms.len(),
                });
            }
            self.levels_ms[level as usize - 1]
        } else if let Some(ms) = delay_ms {
            ms
        } else if let Some(at) = at_ms {
            at.saturating_sub(now_ms.max(0) as u64)
        } else {
            return Ok(None);
        };
        if delay_ms > self.max_ms {
            return Err(DelayError::TooFar {
                delay_ms,
                max_ms: self.max_ms,
            });
        }
        Ok(Some(now_ms.saturating_add(delay_ms as i64)))
    }
}

/// Whether properties ask for a delay at all (a cheap check before the full rule).
pub fn asks_for_delay(props: &Properties<'_>) -> bool {
    props.iter().any(|(name, value)| {
        (name == prop::DELAY && value != "0")
            || name == prop::TIMER_DELAY_MS
            || name == prop::TIMER_DELIVER_MS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record::PropertiesBuilder;

    fn props(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut b = PropertiesBuilder::new();
        for (k, v) in pairs {
            b.put(k, v).unwrap();
        }
        b.into_bytes()
    }

    fn check(pairs: &[(&str, &str)], expected: Result<Option<i64>, DelayError>) {
        let bytes = props(pairs);
        let rule = DelayRule::new("1s 5s 10s", 60_000).unwrap();
        assert_eq!(
            rule.deliver_at(&Properties::new(&bytes), 1_000_000),
            expected,
            "{pairs:?}"
        );
    }

    #[test]
    fn levels_times_and_delays() {
        check(&[], Ok(None));
        check(&[("DELAY", "0")], Ok(None));
        check(&[("DELAY", "1")], Ok(Some(1_001_000)));
        check(&[("DELAY", "3")], Ok(Some(1_010_000)));
        check(
            &[("DELAY", "4")],
            Err(DelayError::NoSuchLevel {
                level: 4,
                levels: 3,
            }),
        );
        check(&[("TIMER_DELAY_MS", "250")], Ok(Some(1_000_250)));
        check(&[("TIMER_DELIVER_MS", "1000300")], Ok(Some(1_000_300)));
        // A time in the past delivers at once.
        check(&[("TIMER_DELIVER_MS", "5")], Ok(Some(1_000_000)));
        check(
            &[("TIMER_DELAY_MS", "60001")],
            Err(DelayError::TooFar {
                delay_ms: 60_001,
                max_ms: 60_000,
            }),
        );
        check(
            &[("TIMER_DELAY_MS", "-5")],
            Err(DelayError::NotANumber {
                name: "TIMER_DELAY_MS",
                value: "-5".into(),
            }),
        );
        check(
            &[("DELAY", "1"), ("TIMER_DELAY_MS", "5")],
            Err(DelayError::Conflicting),
        );
    }

    #[test]
    fn level_tables_parse_and_refuse() {
        let rule = DelayRule::default();
        assert_eq!(rule.levels(), 18);
        assert_eq!(rule.level_ms(1), 1000);
        assert_eq!(rule.level_ms(18), 2 * 3_600_000);
        assert_eq!(rule.level_ms(99), 2 * 3_600_000);
        assert_eq!(rule.retry_level(0), 3);
        assert_eq!(rule.retry_level(15), 18);
        assert_eq!(rule.retry_level(100), 18);
        // 10 s up to 2 h over 16 retries: about 4 h 46 min in all, as upstream.
        let total: u64 = (0..16).map(|t| rule.level_ms(rule.retry_level(t))).sum();
        assert_eq!(total, (4 * 60 + 45) * 60_000 + 40_000);
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        assert_eq!(parse_duration_ms("2d"), Some(172_800_000));
        for bad in ["", "5", "5x", "s", "1s 0s", "1h", &"1s ".repeat(65)] {
            assert!(DelayRule::new(bad, 60_000).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn asks_for_delay_sees_every_form() {
        assert!(!asks_for_delay(&Properties::new(&props(&[("TAGS", "a")]))));
        assert!(!asks_for_delay(&Properties::new(&props(&[("DELAY", "0")]))));
        assert!(asks_for_delay(&Properties::new(&props(&[("DELAY", "2")]))));
        assert!(asks_for_delay(&Properties::new(&props(&[(
            "TIMER_DELIVER_MS",
            "2"
        )]))));
    }
}
