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

/// A bound on the bytes per second one mover moves in one direction (a repository's
/// `spec.bandwidth`), shared by every clone: the mover waits for it before a call sends its
/// bytes (uploads) or before it takes the next bytes of an answer (downloads), never inside
/// a call's [`Limits`], so that a bound below `minimumKiBPerSecond` slows the transfer
/// without failing it. Without a rate it never waits.
#[derive(Clone, Debug, Default)]
pub struct Throttle(Option<std::sync::Arc<Pacer>>);

#[derive(Debug)]
struct Pacer {
    bytes_per_second: u64,
    origin: tokio::time::Instant,
    /// When the bytes taken so far will have moved at the rate, after `origin` (the
    /// theoretical arrival time of the generic cell rate algorithm).
    due: std::sync::Mutex<std::time::Duration>,
}

/// How far ahead of the rate a transfer may run: one second's worth of bytes may go at once
/// after a pause, no more.
pub const THROTTLE_BURST: std::time::Duration = std::time::Duration::from_secs(1);

impl Throttle {
    /// At most `bytes_per_second` (`None` or 0: no bound).
    pub fn new(bytes_per_second: Option<u64>) -> Throttle {
        Throttle(
            bytes_per_second
                .filter(|rate| *rate > 0)
                .map(|bytes_per_second| {
                    std::sync::Arc::new(Pacer {
                        bytes_per_second,
                        origin: tokio::time::Instant::now(),
                        due: std::sync::Mutex::new(std::time::Duration::ZERO),
                    })
                }),
        )
    }

    /// The bound, in bytes per second.
    pub fn bytes_per_second(&self) -> Option<u64> {
        self.0.as_ref().map(|pacer| pacer.bytes_per_second)
    }

    /// Waits until `bytes` more may move, and counts them.
    pub async fn take(&self, bytes: u64) {
        let Some(pacer) = &self.0 else {
            return;
        };
        let wait = {
            let mut due = pacer.due.lock().expect("throttle");
            let (wait, next) = pace(
                *due,
                pacer.origin.elapsed(),
                bytes,
                pacer.bytes_per_second,
                THROTTLE_BURST,
            );
            *due = next;
            wait
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

impl PartialEq for Throttle {
    fn eq(&self, other: &Throttle) -> bool {
        self.bytes_per_second() == other.bytes_per_second()
    }
}

impl Eq for Throttle {}

/// The pace of a [`Throttle`] (the generic cell rate algorithm, a leaky bucket): `bytes`
/// asked for at `now` (both times after one origin), when the bytes taken before will have
/// moved at `bytes_per_second` by `due`, may go after the returned wait, at most `burst`
/// ahead of the rate; the second value is the new `due`. After a pause (`due` in the past)
/// the rate restarts from `now`: an idle link saves up nothing beyond `burst`.
pub fn pace(
    due: std::time::Duration,
    now: std::time::Duration,
    bytes: u64,
    bytes_per_second: u64,
    burst: std::time::Duration,
) -> (std::time::Duration, std::time::Duration) {
    let wait = due.saturating_sub(burst).saturating_sub(now);
    let start = due.max(now);
    let cost = std::time::Duration::from_secs_f64(bytes as f64 / bytes_per_second.max(1) as f64);
    (wait, start + cost)
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
        assert_eq!(Throttle::new(Some(0)), Throttle::new(None), "0 is no bound");
        assert_eq!(Throttle::new(Some(7)).bytes_per_second(), Some(7));
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

    #[test]
    fn a_throttle_keeps_to_its_rate_one_second_ahead_at_most() {
        let second = Duration::from_secs(1);
        let ms = Duration::from_millis;
        // (due, now, bytes, rate) -> (wait, new due)
        for (due, now, bytes, rate, wait, next) in [
            // The first bytes go at once; they are due after their time at the rate.
            (ms(0), ms(0), 1000, 1000, ms(0), ms(1000)),
            // Within the burst: no wait.
            (ms(1000), ms(0), 1000, 1000, ms(0), ms(2000)),
            // Two seconds ahead of the rate: wait until only one is left.
            (ms(2000), ms(0), 1000, 1000, ms(1000), ms(3000)),
            (ms(5000), ms(1500), 500, 1000, ms(2500), ms(5500)),
            // After a pause the rate restarts from now: nothing saved up.
            (ms(1000), ms(9000), 2000, 1000, ms(0), ms(11000)),
            // Exactly at the edge of the burst: no wait.
            (ms(3000), ms(2000), 1, 1000, ms(0), ms(3001)),
            // Just past it.
            (ms(3001), ms(2000), 1, 1000, ms(1), ms(3002)),
            // A large call is charged whole after it: the next waits for it.
            (ms(0), ms(0), 16_000, 1000, ms(0), ms(16000)),
            (ms(16000), ms(100), 16_000, 1000, ms(14900), ms(32000)),
        ] {
            assert_eq!(
                pace(due, now, bytes, rate, second),
                (wait, next),
                "due {due:?}, now {now:?}, {bytes} bytes at {rate} B/s"
            );
        }
        assert_eq!(
            pace(ms(0), ms(0), 10, 0, second).1,
            Duration::from_secs(10),
            "a zero rate counts as 1 B/s"
        );
        assert_eq!(Throttle::new(Some(0)), Throttle::new(None), "0 is no bound");
        assert_eq!(Throttle::new(Some(7)).bytes_per_second(), Some(7));
    }
}
