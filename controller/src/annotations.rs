//! custody's annotations, and the rule that none under `custody.io/` is ignored silently.
//!
//! A restore annotation a controller quietly ignores is how a database comes up empty, so
//! every annotation in custody's domain must be one custody knows, on a kind it applies to,
//! with a value it understands. Anything else is reported on the object.

use std::collections::BTreeMap;

use crate::conditions::{Desired, Status, reasons, types};

/// Releases a Backup without deleting its artifact (`"true"` or `"false"`).
pub const SKIP_ARTIFACT_CLEANUP: &str = "custody.io/skip-artifact-cleanup";

/// The custody kinds, as far as annotations are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    BackupRepository,
    Cluster,
    Backup,
    BackupPlan,
    Restore,
    NodeAgent,
}

/// Starts a prune of a BackupRepository's encrypted repository now: any value not answered yet
/// (`status.maintenance.prune.request`).
pub const PRUNE_REQUESTED: &str = "custody.io/prune-requested";
/// Starts a check now, as [`PRUNE_REQUESTED`] does a prune.
pub const CHECK_REQUESTED: &str = "custody.io/check-requested";

/// An annotation custody understands: its key, the kinds it applies to, and its valid values
/// (none listed: any value).
struct Known {
    key: &'static str,
    kinds: &'static [Kind],
    values: &'static [&'static str],
}

const KNOWN: &[Known] = &[
    Known {
        key: SKIP_ARTIFACT_CLEANUP,
        kinds: &[Kind::Backup],
        values: &["true", "false"],
    },
    Known {
        key: PRUNE_REQUESTED,
        kinds: &[Kind::BackupRepository],
        values: &[],
    },
    Known {
        key: CHECK_REQUESTED,
        kinds: &[Kind::BackupRepository],
        values: &[],
    },
];

/// Why an annotation in custody's domain is not acted on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// custody has no annotation of this name.
    Unknown { key: String },
    /// The annotation exists but does nothing on this kind.
    WrongKind { key: String, kind: Kind },
    /// The value is not one the annotation accepts.
    InvalidValue {
        key: String,
        value: String,
        expected: &'static [&'static str],
    },
}

impl Problem {
    fn describe(&self) -> String {
        match self {
            Problem::Unknown { key } => {
                format!("annotation {key} is not a custody annotation and has no effect")
            }
            Problem::WrongKind { key, kind } => {
                format!("annotation {key} has no effect on a {kind:?}")
            }
            Problem::InvalidValue {
                key,
                value,
                expected,
            } => format!(
                "annotation {key} has value {value:?}, expected one of {}",
                expected.join(", ")
            ),
        }
    }
}

/// Whether an annotation key is in custody's domain (`custody.io/…` or `<sub>.custody.io/…`).
pub fn is_custody_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((domain, _)) => domain == "custody.io" || domain.ends_with(".custody.io"),
        None => false,
    }
}

/// Every custody-domain annotation on an object of `kind` that custody will not act on, in
/// key order.
pub fn problems(kind: Kind, annotations: &BTreeMap<String, String>) -> Vec<Problem> {
    annotations
        .iter()
        .filter(|(key, _)| is_custody_key(key))
        .filter_map(
            |(key, value)| match KNOWN.iter().find(|known| known.key == key) {
                None => Some(Problem::Unknown { key: key.clone() }),
                Some(known) if !known.kinds.contains(&kind) => Some(Problem::WrongKind {
                    key: key.clone(),
                    kind,
                }),
                Some(known)
                    if !known.values.is_empty() && !known.values.contains(&value.as_str()) =>
                {
                    Some(Problem::InvalidValue {
                        key: key.clone(),
                        value: value.clone(),
                        expected: known.values,
                    })
                }
                Some(_) => None,
            },
        )
        .collect()
}

/// The `AnnotationsRecognized` condition for a set of problems.
pub fn condition(problems: &[Problem]) -> Desired {
    if problems.is_empty() {
        return Desired {
            type_: types::ANNOTATIONS_RECOGNIZED,
            status: Status::True,
            reason: reasons::ANNOTATIONS_RECOGNIZED,
            message: "every custody.io annotation is recognized".into(),
        };
    }
    let described: Vec<String> = problems.iter().map(Problem::describe).collect();
    Desired {
        type_: types::ANNOTATIONS_RECOGNIZED,
        status: Status::False,
        reason: reasons::UNKNOWN_ANNOTATION,
        message: format!("{}; remove or correct it", described.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn custody_domain() {
        let table = [
            ("custody.io/restore", true),
            ("restore.custody.io/source", true),
            ("custody.io/", true),
            ("notcustody.io/x", false),
            ("custody.io.evil.com/x", false),
            ("example.com/custody.io", false),
            ("custody.io", false),
            ("kubectl.kubernetes.io/last-applied-configuration", false),
        ];
        for (key, expected) in table {
            assert_eq!(is_custody_key(key), expected, "{key}");
        }
    }

    /// The kind, its annotations, and the problems expected.
    type Case = (Kind, &'static [(&'static str, &'static str)], Vec<Problem>);

    #[test]
    fn problems_by_kind_key_and_value() {
        let table: &[Case] = &[
            (Kind::Backup, &[], vec![]),
            (
                Kind::Backup,
                &[("app.kubernetes.io/name", "db"), ("other.io/x", "y")],
                vec![],
            ),
            (Kind::Backup, &[(SKIP_ARTIFACT_CLEANUP, "true")], vec![]),
            (Kind::Backup, &[(SKIP_ARTIFACT_CLEANUP, "false")], vec![]),
            (
                Kind::Backup,
                &[(SKIP_ARTIFACT_CLEANUP, "yes")],
                vec![Problem::InvalidValue {
                    key: SKIP_ARTIFACT_CLEANUP.into(),
                    value: "yes".into(),
                    expected: &["true", "false"],
                }],
            ),
            (
                Kind::Cluster,
                &[(SKIP_ARTIFACT_CLEANUP, "true")],
                vec![Problem::WrongKind {
                    key: SKIP_ARTIFACT_CLEANUP.into(),
                    kind: Kind::Cluster,
                }],
            ),
            (
                Kind::BackupRepository,
                &[(PRUNE_REQUESTED, "2026-12-02T06:00"), (CHECK_REQUESTED, "")],
                vec![],
            ),
            (
                Kind::Backup,
                &[(CHECK_REQUESTED, "now")],
                vec![Problem::WrongKind {
                    key: CHECK_REQUESTED.into(),
                    kind: Kind::Backup,
                }],
            ),
            (
                Kind::Cluster,
                &[("custody.io/restore-from", "backup-1")],
                vec![Problem::Unknown {
                    key: "custody.io/restore-from".into(),
                }],
            ),
            (
                Kind::NodeAgent,
                &[("b.custody.io/x", ""), ("a.custody.io/y", "")],
                vec![
                    Problem::Unknown {
                        key: "a.custody.io/y".into(),
                    },
                    Problem::Unknown {
                        key: "b.custody.io/x".into(),
                    },
                ],
            ),
        ];
        for (kind, pairs, expected) in table {
            assert_eq!(
                &problems(*kind, &annotations(pairs)),
                expected,
                "{kind:?} {pairs:?}"
            );
        }
    }

    #[test]
    fn condition_names_every_problem() {
        let ok = condition(&[]);
        assert_eq!(
            (ok.status, ok.reason),
            (Status::True, reasons::ANNOTATIONS_RECOGNIZED)
        );

        let bad = condition(&[
            Problem::Unknown {
                key: "custody.io/restore-from".into(),
            },
            Problem::WrongKind {
                key: SKIP_ARTIFACT_CLEANUP.into(),
                kind: Kind::Cluster,
            },
        ]);
        assert_eq!(
            (bad.status, bad.reason),
            (Status::False, reasons::UNKNOWN_ANNOTATION)
        );
        assert!(
            bad.message.contains("custody.io/restore-from"),
            "{}",
            bad.message
        );
        assert!(
            bad.message.contains("no effect on a Cluster"),
            "{}",
            bad.message
        );
    }
}
