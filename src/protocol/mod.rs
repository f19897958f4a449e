//! Wire protocol (filled by the broker issue).
