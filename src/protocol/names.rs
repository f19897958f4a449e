//! Names with rules: topics, consumer groups and the system topics the broker derives from
//! them (a group's retry and dead-letter topics, the broker's own internal topics). One
//! definition for the broker, the client and the admin command line.

/// Longest topic name (topic names are also directory names).
pub const TOPIC_NAME_BYTES_MAX: usize = 127;
/// Prefix of a consumer group's retry topic: `%RETRY%<group>`.
pub const RETRY_TOPIC_PREFIX: &str = "%RETRY%";
/// Prefix of a consumer group's dead-letter topic: `%DLQ%<group>`.
pub const DLQ_TOPIC_PREFIX: &str = "%DLQ%";
/// Prefix of the broker's internal topics: clients may neither send to nor read them.
pub const SYSTEM_TOPIC_PREFIX: &str = "%SYS_";
/// Longest consumer group name: its retry and dead-letter topics must be valid topics.
pub const GROUP_NAME_BYTES_MAX: usize = TOPIC_NAME_BYTES_MAX - RETRY_TOPIC_PREFIX.len();

const _: () = assert!(DLQ_TOPIC_PREFIX.len() <= RETRY_TOPIC_PREFIX.len());

/// A name as error messages show it: at most 64 characters, so a hostile name is not
/// echoed back whole.
pub fn shown(name: &str) -> String {
    const SHOWN_CHARS_MAX: usize = 64;
    if name.chars().count() <= SHOWN_CHARS_MAX {
        format!("{name:?}")
    } else {
        let head: String = name.chars().take(SHOWN_CHARS_MAX).collect();
        format!("{head:?}... ({} bytes)", name.len())
    }
}

/// Characters a topic or group name may hold.
fn name_byte_ok(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_-%|.".contains(&b)
}

/// Checks a topic name: 1 to 127 characters of `A-Z a-z 0-9 _ - % | .`, not `.` or `..`.
pub fn check_topic_name(topic: &str) -> Result<(), String> {
    let ok = !topic.is_empty()
        && topic.len() <= TOPIC_NAME_BYTES_MAX
        && topic != "."
        && topic != ".."
        && topic.bytes().all(name_byte_ok);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid topic name {}: use 1 to {TOPIC_NAME_BYTES_MAX} characters of A-Z a-z 0-9 _ - % | .",
            shown(topic)
        ))
    }
}

/// Checks a consumer group name: 1 to [`GROUP_NAME_BYTES_MAX`] characters of the topic
/// alphabet (the group's retry topic `%RETRY%<group>` must be a valid topic).
pub fn check_group_name(group: &str) -> Result<(), String> {
    if group.is_empty()
        || group.len() > GROUP_NAME_BYTES_MAX
        || !group.bytes().all(name_byte_ok)
        || group == "."
        || group == ".."
    {
        return Err(format!(
            "invalid group name {}: use 1 to {GROUP_NAME_BYTES_MAX} characters of A-Z a-z 0-9 _ - % | .",
            shown(group)
        ));
    }
    Ok(())
}

/// Longest client id.
pub const CLIENT_ID_BYTES_MAX: usize = 255;

/// Checks a client id: 1 to [`CLIENT_ID_BYTES_MAX`] bytes without control characters.
pub fn check_client_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > CLIENT_ID_BYTES_MAX || id.chars().any(char::is_control) {
        return Err(format!(
            "invalid client id {}: use 1 to {CLIENT_ID_BYTES_MAX} bytes without control characters",
            shown(id)
        ));
    }
    Ok(())
}

/// The retry topic of a consumer group.
pub fn retry_topic(group: &str) -> String {
    format!("{RETRY_TOPIC_PREFIX}{group}")
}

/// The dead-letter topic of a consumer group.
pub fn dlq_topic(group: &str) -> String {
    format!("{DLQ_TOPIC_PREFIX}{group}")
}

/// Whether a topic is one of the broker's internal topics.
pub fn is_system_topic(topic: &str) -> bool {
    topic.starts_with(SYSTEM_TOPIC_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_and_groups() {
        for ok in ["orders", "a.b-c_d|e%f", &"t".repeat(TOPIC_NAME_BYTES_MAX)] {
            assert!(check_topic_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            &"t".repeat(TOPIC_NAME_BYTES_MAX + 1),
        ] {
            assert!(check_topic_name(bad).is_err(), "{bad:?}");
        }
        let longest = "g".repeat(GROUP_NAME_BYTES_MAX);
        assert!(check_group_name(&longest).is_ok());
        assert!(check_topic_name(&retry_topic(&longest)).is_ok());
        assert!(check_topic_name(&dlq_topic(&longest)).is_ok());
        for bad in ["", "..", "g/1", "g 1", "g\u{1}", &format!("{longest}g")] {
            assert!(check_group_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(retry_topic("billing"), "%RETRY%billing");
        assert_eq!(dlq_topic("billing"), "%DLQ%billing");
        assert!(is_system_topic("%SYS_SCHEDULE%"));
        assert!(!is_system_topic("%RETRY%g"));
    }
}
