//! Conditions per the Kubernetes API conventions, computed as pure data.
//!
//! A reconciler says which condition it wants; [`next`] turns that into the condition to write,
//! keeping `lastTransitionTime` unless the status flips, and returns `None` when nothing would
//! change so that no patch is sent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition types custody writes.
pub mod types {
    /// Whether every `custody.io/` annotation on the object is one custody understands.
    pub const ANNOTATIONS_RECOGNIZED: &str = "AnnotationsRecognized";
    /// The object's overall readiness.
    pub const READY: &str = "Ready";
    /// A running copy's counts have not grown for longer than `--stalled-after-seconds`.
    pub const STALLED: &str = "Stalled";
}

/// Condition reasons custody writes (CamelCase, per the API conventions).
pub mod reasons {
    /// Every `custody.io/` annotation is known and valid for this kind.
    pub const ANNOTATIONS_RECOGNIZED: &str = "AnnotationsRecognized";
    /// At least one `custody.io/` annotation is unknown, misplaced or has a bad value.
    pub const UNKNOWN_ANNOTATION: &str = "UnknownAnnotation";
    /// The node's agent reported within the timeout.
    pub const HEARTBEAT_RECEIVED: &str = "HeartbeatReceived";
    /// The node's agent has not reported within the timeout.
    pub const HEARTBEAT_MISSED: &str = "HeartbeatMissed";
    /// The node's agent has never reported.
    pub const NO_HEARTBEAT: &str = "NoHeartbeat";
    /// A running copy's counts stood still past the bound.
    pub const NO_PROGRESS: &str = "NoProgress";
    /// A running copy's counts grow.
    pub const PROGRESSING: &str = "Progressing";
}

/// `True`, `False` (or `Unknown`) as the API spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// A condition a reconciler wants the object to carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
}

/// The condition to write for `desired`, or `None` when `current` already says the same
/// thing for this generation. `lastTransitionTime` is kept unless the status flips.
pub fn next(
    current: &[Condition],
    desired: &Desired,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Condition> {
    let existing = current
        .iter()
        .find(|condition| condition.type_ == desired.type_);
    if let Some(existing) = existing
        && existing.status == desired.status.as_str()
        && existing.reason == desired.reason
        && existing.message == desired.message
        && existing.observed_generation == generation
    {
        return None;
    }
    let last_transition_time = match existing {
        Some(existing) if existing.status == desired.status.as_str() => {
            existing.last_transition_time.clone()
        }
        _ => Time(now),
    };
    Some(Condition {
        type_: desired.type_.to_string(),
        status: desired.status.as_str().to_string(),
        reason: desired.reason.to_string(),
        message: desired.message.clone(),
        observed_generation: generation,
        last_transition_time,
    })
}

/// The conditions for `wanted`, in its order: each as [`next`] would write it, or as it is
/// when nothing changes.
pub fn wanted(
    current: &[Condition],
    wanted: &[Desired],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    wanted
        .iter()
        .map(|desired| {
            next(current, desired, generation, now).unwrap_or_else(|| {
                current
                    .iter()
                    .find(|condition| condition.type_ == desired.type_)
                    .cloned()
                    .expect("next() is None only when the condition exists")
            })
        })
        .collect()
}

/// Of `current`, the conditions of the types in `wanted`: the ones a writer owns (others,
/// such as `AnnotationsRecognized`, belong to other field managers).
pub fn owned(current: &[Condition], wanted: &[Desired]) -> Vec<Condition> {
    current
        .iter()
        .filter(|condition| {
            wanted
                .iter()
                .any(|desired| desired.type_ == condition.type_)
        })
        .cloned()
        .collect()
}

/// Whether writing `next` flips the status of its type (or adds the type).
pub fn flips(current: &[Condition], next: &Condition) -> bool {
    current
        .iter()
        .find(|condition| condition.type_ == next.type_)
        .is_none_or(|existing| existing.status != next.status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn condition(
        status: &str,
        reason: &str,
        message: &str,
        generation: i64,
        time: i64,
    ) -> Condition {
        Condition {
            type_: types::READY.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(generation),
            last_transition_time: Time(at(time)),
        }
    }

    fn desired(status: Status, reason: &'static str, message: &str) -> Desired {
        Desired {
            type_: types::READY,
            status,
            reason,
            message: message.into(),
        }
    }

    #[test]
    fn transitions() {
        struct Case {
            name: &'static str,
            current: Vec<Condition>,
            desired: Desired,
            generation: i64,
            // None: no write; Some(t): written with lastTransitionTime t
            expected_transition: Option<i64>,
        }
        let cases = [
            Case {
                name: "new condition is stamped now",
                current: vec![],
                desired: desired(Status::True, "Fine", "ok"),
                generation: 1,
                expected_transition: Some(100),
            },
            Case {
                name: "identical condition is not rewritten",
                current: vec![condition("True", "Fine", "ok", 1, 5)],
                desired: desired(Status::True, "Fine", "ok"),
                generation: 1,
                expected_transition: None,
            },
            Case {
                name: "flip moves the transition time",
                current: vec![condition("True", "Fine", "ok", 1, 5)],
                desired: desired(Status::False, "Broken", "no"),
                generation: 1,
                expected_transition: Some(100),
            },
            Case {
                name: "new message without a flip keeps the transition time",
                current: vec![condition("False", "Broken", "a", 1, 5)],
                desired: desired(Status::False, "Broken", "b"),
                generation: 1,
                expected_transition: Some(5),
            },
            Case {
                name: "new reason without a flip keeps the transition time",
                current: vec![condition("False", "Broken", "a", 1, 5)],
                desired: desired(Status::False, "Other", "a"),
                generation: 1,
                expected_transition: Some(5),
            },
            Case {
                name: "new generation is recorded without moving the transition time",
                current: vec![condition("True", "Fine", "ok", 1, 5)],
                desired: desired(Status::True, "Fine", "ok"),
                generation: 2,
                expected_transition: Some(5),
            },
        ];
        for case in cases {
            let written = next(&case.current, &case.desired, Some(case.generation), at(100));
            match (written, case.expected_transition) {
                (None, None) => {}
                (Some(written), Some(time)) => {
                    assert_eq!(
                        written.last_transition_time,
                        Time(at(time)),
                        "{}",
                        case.name
                    );
                    assert_eq!(
                        written.status,
                        case.desired.status.as_str(),
                        "{}",
                        case.name
                    );
                    assert_eq!(written.reason, case.desired.reason, "{}", case.name);
                    assert_eq!(written.message, case.desired.message, "{}", case.name);
                    assert_eq!(
                        written.observed_generation,
                        Some(case.generation),
                        "{}",
                        case.name
                    );
                }
                (written, expected) => {
                    panic!(
                        "{}: wrote {written:?}, expected transition {expected:?}",
                        case.name
                    )
                }
            }
        }
    }

    #[test]
    fn only_the_matching_type_is_considered() {
        let mut other = condition("False", "Broken", "x", 1, 5);
        other.type_ = "Other".into();
        let written = next(
            &[other],
            &desired(Status::True, "Fine", "ok"),
            Some(1),
            at(100),
        );
        assert_eq!(written.unwrap().last_transition_time, Time(at(100)));
    }

    #[test]
    fn flip_detection() {
        let current = vec![condition("True", "Fine", "ok", 1, 5)];
        assert!(!flips(
            &current,
            &condition("True", "Fine", "changed", 1, 5)
        ));
        assert!(flips(&current, &condition("False", "Broken", "ok", 1, 5)));
        assert!(flips(&[], &condition("True", "Fine", "ok", 1, 5)));
    }
}
