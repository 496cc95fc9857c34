//! The restart backoff of an MCP server: doubling from [`FIRST_DELAY`] up to [`MAX_DELAY`],
//! each delay jittered by ±25 %, and back to the first once a start ran for [`HEALTHY_AFTER`].

use std::time::Duration;

use rand::Rng;

/// The delay before the first restart.
pub const FIRST_DELAY: Duration = Duration::from_millis(250);
/// No delay is longer (before jitter).
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// A server that ran this long counts as healthy: its next restart waits [`FIRST_DELAY`] again.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// Consecutive failed (or short-lived) starts of one server.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// A start that ran for `ran` ended: the delay before the next one.
    pub fn next_delay(&mut self, ran: Duration) -> Duration {
        if ran >= HEALTHY_AFTER {
            self.failures = 0;
        }
        let delay = nominal(self.failures);
        self.failures = self.failures.saturating_add(1);
        jittered(delay, rand::rng().random_range(-0.25..=0.25))
    }
}

/// The delay after `failures` consecutive failures, before jitter.
fn nominal(failures: u32) -> Duration {
    FIRST_DELAY
        .saturating_mul(1u32 << failures.min(16))
        .min(MAX_DELAY)
}

fn jittered(delay: Duration, by: f64) -> Duration {
    delay.mul_f64(1.0 + by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_the_cap_and_reset_after_a_healthy_run() {
        let nominals: Vec<u64> = (0..10).map(|n| nominal(n).as_millis() as u64).collect();
        assert_eq!(
            nominals,
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(nominal(u32::MAX), MAX_DELAY);

        let mut backoff = Backoff::default();
        for _ in 0..5 {
            backoff.next_delay(Duration::ZERO);
        }
        let short = backoff.next_delay(Duration::from_secs(1));
        assert!(short >= Duration::from_secs(6), "{short:?}");
        let after_healthy = backoff.next_delay(HEALTHY_AFTER);
        assert!(
            after_healthy <= FIRST_DELAY.mul_f64(1.25),
            "{after_healthy:?}"
        );
    }

    #[test]
    fn jitter_stays_within_a_quarter() {
        let d = Duration::from_secs(4);
        assert_eq!(jittered(d, -0.25), Duration::from_secs(3));
        assert_eq!(jittered(d, 0.25), Duration::from_secs(5));
        for _ in 0..100 {
            let got = Backoff::default().next_delay(Duration::ZERO);
            assert!(got >= FIRST_DELAY.mul_f64(0.75) && got <= FIRST_DELAY.mul_f64(1.25));
        }
    }
}
