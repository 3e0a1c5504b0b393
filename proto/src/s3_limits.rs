//! Bounds on S3 calls, shared by the controller, the mover and the repository backend.

/// How long an S3 call may take, so that a server that stops answering, or trickles, fails the
/// call (and with it the Backup or Restore, freeing its Cluster's Lease) instead of holding it
/// until the Job's deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connecting, TCP and TLS.
    pub connect: std::time::Duration,
    /// The longest wait for an answer, or for the next bytes of one; also what every call may
    /// take beyond its transfer.
    pub stall: std::time::Duration,
    /// The slowest transfer accepted, in bytes per second: a call moving `n` bytes may take
    /// `stall + n / min_bytes_per_second`.
    pub min_bytes_per_second: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connect: std::time::Duration::from_secs(10),
            stall: std::time::Duration::from_secs(DEFAULT_STALL_SECONDS),
            min_bytes_per_second: DEFAULT_MIN_KIB_PER_SECOND * 1024,
        }
    }
}

/// [`Limits::stall`] unless a repository says otherwise.
pub const DEFAULT_STALL_SECONDS: u64 = 60;
/// [`Limits::min_bytes_per_second`] unless a repository says otherwise, in KiB/s (64 KiB/s:
/// one of custody's 16 MiB packs in 4 minutes 16 seconds).
pub const DEFAULT_MIN_KIB_PER_SECOND: u64 = 64;

impl Limits {
    /// How long a call moving `bytes` may take.
    pub fn bound(&self, bytes: u64) -> std::time::Duration {
        self.stall
            + std::time::Duration::from_secs_f64(
                bytes as f64 / self.min_bytes_per_second.max(1) as f64,
            )
    }

    /// `call`, moving `bytes`, within [`Limits::bound`]; [`Overdue`] when it takes longer.
    pub async fn bounded<T>(
        &self,
        bytes: u64,
        call: impl std::future::Future<Output = T>,
    ) -> Result<T, Overdue> {
        tokio::time::timeout(self.bound(bytes), call)
            .await
            .map_err(|_| self.overdue(bytes))
    }

    /// What a call moving `bytes` that outlasted its bound says.
    pub fn overdue(&self, bytes: u64) -> Overdue {
        Overdue {
            bound: self.bound(bytes),
            stall: self.stall,
            bytes,
            min_bytes_per_second: self.min_bytes_per_second,
        }
    }
}

/// An S3 call that took longer than its [`Limits`] allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the S3 server did not finish within {}s ({bytes} bytes to move, at {} KiB/s or faster, after at most {}s waiting for an answer): it stalls or is too slow for the repository's spec.timeouts",
    bound.as_secs(),
    min_bytes_per_second / 1024,
    stall.as_secs()
)]
pub struct Overdue {
    pub bound: std::time::Duration,
    pub stall: std::time::Duration,
    pub bytes: u64,
    pub min_bytes_per_second: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_call_may_take_the_stall_plus_its_bytes_at_the_slowest_rate() {
        let limits = Limits {
            connect: Duration::from_secs(10),
            stall: Duration::from_secs(60),
            min_bytes_per_second: 64 * 1024,
        };
        for (bytes, seconds) in [
            (0, 60.0),
            (64 * 1024, 61.0),
            (16 << 20, 316.0),
            (1, 60.0 + 1.0 / 65536.0),
        ] {
            assert_eq!(
                limits.bound(bytes),
                Duration::from_secs_f64(seconds),
                "{bytes} bytes"
            );
        }
        let slowest = Limits {
            min_bytes_per_second: 0,
            ..limits
        };
        assert_eq!(
            slowest.bound(10),
            Duration::from_secs(70),
            "a zero rate counts as 1 B/s"
        );
    }

    #[tokio::test]
    async fn a_call_past_its_bound_is_overdue_and_says_both_limits() {
        let limits = Limits {
            connect: Duration::from_secs(1),
            stall: Duration::from_secs(1),
            min_bytes_per_second: 1024,
        };
        assert_eq!(limits.bounded(1024, async { 7 }).await, Ok(7));
        let late = limits
            .bounded(1024, tokio::time::sleep(Duration::from_secs(10)))
            .await
            .unwrap_err();
        assert_eq!(late.bound, Duration::from_secs(2));
        let said = late.to_string();
        assert!(
            said.contains("within 2s") && said.contains("1 KiB/s") && said.contains("at most 1s"),
            "{said}"
        );
        assert!(
            limits
                .bounded(1024, tokio::time::sleep(Duration::from_millis(1500)))
                .await
                .is_ok()
        );
    }
}
