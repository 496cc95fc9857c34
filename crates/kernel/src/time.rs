//! RFC 3339 UTC timestamps, the only time format of the protocol.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Now, as `2026-11-29T22:43:45.123Z`.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Milliseconds since the Unix epoch (as Redis `TIME` gives them) as RFC 3339.
pub fn ms_to_rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whole milliseconds since `since` (a `duration_ms`).
pub fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_epoch_ms() {
        assert_eq!(super::ms_to_rfc3339(1_000), "1970-01-01T00:00:01.000Z");
        assert!(super::now_rfc3339().ends_with('Z'));
    }
}
