//! Attributing a dump a user's backup command wrote into a shared prefix to the Backup that
//! ran it, as a pure decision. The dump's name carries a timestamp by the clock of the node
//! that ran the command; custody corrects it by the offset the node's agent measured, and
//! also requires the object's `LastModified` (the S3 server's clock) to fall in the Backup's
//! lifetime. The window is that lifetime, by the controller's clock, widened by the measured
//! uncertainty. A dump is recorded only when exactly one candidate fits and no other run of the
//! same prefix could have written it; otherwise nothing is recorded, and the reason says why.

use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::civil::DateTime;
use k8s_openapi::jiff::tz::TimeZone;

/// Nanoseconds since the Unix epoch.
pub type Nanos = i64;

const SECOND: Nanos = 1_000_000_000;
/// Resolution of a timestamp in a name (whole seconds).
pub const NAME_RESOLUTION: Nanos = SECOND;
/// How far the S3 server's `LastModified` (whole seconds, another clock) may lie outside the
/// window.
pub const SERVER_TOLERANCE: Nanos = 2 * SECOND;

/// The timestamp in a dump's name: `YYYYMMDDTHHMMSSZ` or `YYYY-MM-DDTHH:MM:SSZ` (UTC), the
/// last one in the name when there are several.
pub fn name_time(name: &str) -> Option<Nanos> {
    let bytes = name.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let slice = bytes.get(range)?;
        if slice.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(slice).ok()?.parse().ok()
        } else {
            None
        }
    };
    let mut found = None;
    for start in 0..bytes.len() {
        // Compact: 20261130T101500Z
        let compact = (|| {
            if bytes.get(start + 8) != Some(&b'T') || bytes.get(start + 15) != Some(&b'Z') {
                return None;
            }
            Some((
                digits(start..start + 4)?,
                digits(start + 4..start + 6)?,
                digits(start + 6..start + 8)?,
                digits(start + 9..start + 11)?,
                digits(start + 11..start + 13)?,
                digits(start + 13..start + 15)?,
            ))
        })();
        // Extended: 2026-11-30T10:15:00Z
        let extended = (|| {
            let at = |offset: usize, byte: u8| bytes.get(start + offset) == Some(&byte);
            if !(at(4, b'-')
                && at(7, b'-')
                && at(10, b'T')
                && at(13, b':')
                && at(16, b':')
                && at(19, b'Z'))
            {
                return None;
            }
            Some((
                digits(start..start + 4)?,
                digits(start + 5..start + 7)?,
                digits(start + 8..start + 10)?,
                digits(start + 11..start + 13)?,
                digits(start + 14..start + 16)?,
                digits(start + 17..start + 19)?,
            ))
        })();
        if let Some((year, month, day, hour, minute, second)) = compact.or(extended) {
            let civil = DateTime::new(
                i16::try_from(year).ok()?,
                i8::try_from(month).ok()?,
                i8::try_from(day).ok()?,
                i8::try_from(hour).ok()?,
                i8::try_from(minute).ok()?,
                i8::try_from(second).ok()?,
                0,
            );
            if let Ok(civil) = civil
                && let Ok(zoned) = civil.to_zoned(TimeZone::UTC)
            {
                found = Some(zoned.timestamp().as_nanosecond() as Nanos);
            }
        }
    }
    found
}

/// An object under the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub key: String,
    /// `LastModified`, by the S3 server's clock.
    pub last_modified: Nanos,
}

/// The node's clock as its agent measured it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offset {
    /// How far the node's clock is ahead of the controller's.
    pub offset: Nanos,
    pub round_trip: Nanos,
}

/// A run of the same prefix (another Backup), by the controller's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherRun {
    pub name: String,
    pub start: Nanos,
    /// `None` while it runs.
    pub end: Option<Nanos>,
    /// The key it recorded, if any.
    pub key: Option<String>,
    /// The clock offset of the node it ran on, if measured.
    pub offset: Option<Offset>,
}

/// This run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// When the Backup started and when it ended, by the controller's clock.
    pub start: Nanos,
    pub end: Nanos,
    pub offset: Option<Offset>,
}

/// The attributed dump, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributed {
    pub key: String,
    /// The name's time corrected to the controller's clock.
    pub corrected: Nanos,
    pub last_modified: Nanos,
    /// The window it had to fall in.
    pub window: (Nanos, Nanos),
}

/// Why nothing was attributed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

fn widen(start: Nanos, end: Nanos, offset: Offset) -> (Nanos, Nanos) {
    // The corrected time is exact to within half the round trip, and the name to a second.
    let margin = offset.round_trip / 2 + NAME_RESOLUTION;
    (start - margin, end + margin)
}

fn show(nanos: Nanos) -> String {
    Timestamp::from_nanosecond(i128::from(nanos))
        .map(|time| time.to_string())
        .unwrap_or_else(|_| nanos.to_string())
}

/// Attributes one of `candidates` to `run`, or refuses.
pub fn attribute(
    run: &Run,
    candidates: &[Candidate],
    others: &[OtherRun],
) -> Result<Attributed, Refusal> {
    let Some(offset) = run.offset else {
        return Err(Refusal {
            reason: "NoClockOffset",
            message: "the node that ran the backup has no measured clock offset, so the time in a dump's name cannot be trusted; nothing is recorded".to_string(),
        });
    };
    let window = widen(run.start, run.end, offset);
    let recorded_elsewhere = |key: &str| {
        others
            .iter()
            .find(|other| other.key.as_deref() == Some(key))
            .map(|other| other.name.clone())
    };
    let fits: Vec<Attributed> = candidates
        .iter()
        .filter_map(|candidate| {
            let name = candidate.key.rsplit('/').next().unwrap_or(&candidate.key);
            let corrected = name_time(name)? - offset.offset;
            let in_window = corrected >= window.0 && corrected <= window.1;
            let modified_in = candidate.last_modified >= run.start - SERVER_TOLERANCE
                && candidate.last_modified <= run.end + SERVER_TOLERANCE;
            (in_window && modified_in).then(|| Attributed {
                key: candidate.key.clone(),
                corrected,
                last_modified: candidate.last_modified,
                window,
            })
        })
        .collect();
    let found = match fits.as_slice() {
        [] => {
            return Err(Refusal {
                reason: "NoDumpInWindow",
                message: format!(
                    "no object under the prefix has a name time (corrected by the node's offset {} ms) and a LastModified within the run, {} .. {}",
                    offset.offset / 1_000_000,
                    show(window.0),
                    show(window.1)
                ),
            });
        }
        [one] => one.clone(),
        many => {
            return Err(Refusal {
                reason: "AmbiguousDump",
                message: format!(
                    "{} objects fit the run: {}; nothing is recorded",
                    many.len(),
                    many.iter()
                        .map(|fit| fit.key.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    };
    if let Some(other) = recorded_elsewhere(&found.key) {
        return Err(Refusal {
            reason: "DumpClaimedByAnother",
            message: format!("{} is already recorded by Backup {other}", found.key),
        });
    }
    // Could another run of the prefix have written it? Its own window, widened by its own
    // uncertainty (or, unmeasured, by this run's), must not hold the dump's time.
    for other in others {
        let end = other.end.unwrap_or(i64::MAX / 2);
        let margin_offset = other.offset.unwrap_or(offset);
        let (from, to) = widen(other.start, end, margin_offset);
        // Its corrected name time, by the other run's node's offset.
        let name = found.key.rsplit('/').next().unwrap_or(&found.key);
        let theirs = name_time(name).map(|time| time - margin_offset.offset);
        let overlaps = theirs.is_some_and(|time| time >= from && time <= to)
            || (found.last_modified >= other.start - SERVER_TOLERANCE
                && found.last_modified <= end + SERVER_TOLERANCE);
        if overlaps {
            return Err(Refusal {
                reason: "OverlappingRun",
                message: format!(
                    "Backup {} of the same prefix ran at the same time and could have written {}; nothing is recorded",
                    other.name, found.key
                ),
            });
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests;
