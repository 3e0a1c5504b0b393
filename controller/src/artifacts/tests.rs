use super::*;
use serde_json::json;

const UID: &str = "1b2f";

fn artifact(prefix: &str) -> Artifact {
    Artifact {
        repository: "store".into(),
        endpoint: "http://s3".into(),
        bucket: "b".into(),
        prefix: prefix.into(),
        key: format!("{prefix}/data.tar.zst"),
        manifest_key: format!("{prefix}/manifest.jsonl"),
        ..Artifact::default()
    }
}

fn other<'a>(uid: &'a str, artifact: Option<&'a Artifact>) -> Other<'a> {
    Other {
        namespace: "ns",
        name: "other",
        uid,
        artifact,
    }
}

#[test]
fn deletes_go_to_the_current_endpoint_while_the_repository_exists() {
    let repository = |endpoint: &str, bucket: &str, ca: Option<&str>, secret: &str| {
        BackupRepository::new(
            "store",
            serde_json::from_value(serde_json::json!({
                "endpoint": endpoint, "bucket": bucket, "caBundle": ca, "region": "eu-1",
                "forcePathStyle": true, "credentialsSecretRef": {"name": secret},
            }))
            .unwrap(),
        )
    };
    let then = repository("https://old:9000", "b", Some("OLD CA"), "old-keys");
    let recorded = Artifact {
        prefix: "p/1b2f".into(),
        key: "p/1b2f/data.tar.zst".into(),
        manifest_key: "p/1b2f/manifest.jsonl".into(),
        ..Artifact::located_in(&then)
    };
    assert_eq!(recorded.ca_bundle.as_deref(), Some("OLD CA"));
    assert_eq!(recorded.credentials_secret.as_deref(), Some("old-keys"));
    assert_eq!(
        (
            recorded.repository.as_str(),
            recorded.endpoint.as_str(),
            recorded.region.as_deref(),
            recorded.force_path_style,
            recorded.bucket.as_str()
        ),
        ("store", "https://old:9000", Some("eu-1"), true, "b")
    );
    let moved = repository("https://new:9000", "renamed", Some("NEW CA"), "new-keys");
    // (repository now, url, bucket, CA, Secret)
    let rows = [
        (
            Some(&then),
            "https://old:9000",
            "b",
            Some("OLD CA"),
            "old-keys",
        ),
        (
            Some(&moved),
            "https://new:9000",
            "b",
            Some("NEW CA"),
            "new-keys",
        ),
        (None, "https://old:9000", "b", Some("OLD CA"), "old-keys"),
    ];
    for (now, url, bucket, ca, secret) in rows {
        let (endpoint, secret_name) = delete_endpoint(&recorded, now);
        let row = format!("{now:?}");
        assert_eq!(endpoint.url, url, "{row}");
        assert_eq!(endpoint.bucket, bucket, "the recorded bucket: {row}");
        assert_eq!(
            endpoint.ca_bundle.as_deref(),
            ca.map(str::as_bytes),
            "{row}"
        );
        assert_eq!(endpoint.region, "eu-1", "{row}");
        assert!(endpoint.path_style, "{row}");
        assert_eq!(secret_name, Signer::Secret(secret.into()), "{row}");
    }
}

#[test]
fn a_web_identity_is_recorded_and_signs_deletes_once_the_repository_is_gone() {
    let identity = serde_json::json!({"serviceAccountName": "backups", "roleArn": "arn:r", "stsEndpoint": "http://sts"});
    let with_identity = BackupRepository::new(
        "store",
        serde_json::from_value(serde_json::json!({
            "endpoint": "https://s3", "bucket": "b", "webIdentity": identity,
        }))
        .unwrap(),
    );
    let recorded = Artifact {
        prefix: "p/1".into(),
        ..Artifact::located_in(&with_identity)
    };
    assert_eq!(recorded.credentials_secret, None);
    let recorded_identity: custody_kube::api::RepositoryWebIdentity =
        serde_json::from_value(identity).unwrap();
    assert_eq!(recorded.web_identity.as_ref(), Some(&recorded_identity));
    let with_keys = BackupRepository::new(
        "store",
        serde_json::from_value(serde_json::json!({
            "endpoint": "https://s3", "bucket": "b", "credentialsSecretRef": {"name": "keys"},
        }))
        .unwrap(),
    );
    for (now, signer) in [
        (
            Some(&with_identity),
            Signer::WebIdentity(recorded_identity.clone()),
        ),
        (Some(&with_keys), Signer::Secret("keys".into())),
        (None, Signer::WebIdentity(recorded_identity.clone())),
    ] {
        assert_eq!(delete_endpoint(&recorded, now).1, signer, "{now:?}");
    }
}

#[test]
fn contests() {
    let mine = artifact("custody/ns/db/1b2f");
    let neighbour = artifact("custody/ns/db/9c9c");
    let parent = artifact("custody/ns/db");
    let child = artifact("custody/ns/db/1b2f/nested");
    let mut same_keys = artifact("custody/ns/db/7a7a");
    same_keys.key = mine.key.clone();
    let mut other_bucket = artifact("custody/ns/db");
    other_bucket.bucket = "elsewhere".into();
    let mut foreign = artifact("custody/ns/db/1b2f");
    foreign.key = "dumps/db-2026-11-30T10:00:00Z.sql".into();
    let mut dotted = artifact("custody/ns/db/1b2f");
    dotted.key = "custody/ns/db/1b2f/../9c9c/data.tar.zst".into();
    let mut doubled = artifact("custody/ns/db/1b2f");
    doubled.manifest_key = "custody/ns/db/1b2f//manifest.jsonl".into();
    let mut spelled = artifact("custody/ns/db/7a7a");
    spelled.key = "custody/ns/db/1b2f/data%2Etar.zst".into();
    let mut escaped_parent = artifact("custody%2Fns/db");
    escaped_parent.key = "custody%2Fns/db/data.tar.zst".into();
    let rows: Vec<(&str, &Artifact, Vec<Other>, Option<&str>)> = vec![
        ("alone", &mine, vec![], None),
        ("a .. segment", &dotted, vec![], Some("KeyNotNormal")),
        ("an empty segment", &doubled, vec![], Some("KeyNotNormal")),
        (
            "another recorded my key percent-escaped",
            &mine,
            vec![other("7a7a", Some(&spelled))],
            Some("KeyClaimedByAnother"),
        ),
        (
            "another's percent-escaped prefix holds my keys",
            &mine,
            vec![other("5d5d", Some(&escaped_parent))],
            Some("KeyClaimedByAnother"),
        ),
        (
            "a neighbour with its own prefix",
            &mine,
            vec![other("9c9c", Some(&neighbour))],
            None,
        ),
        (
            "itself in the list",
            &mine,
            vec![other(UID, Some(&mine))],
            None,
        ),
        (
            "another not started",
            &mine,
            vec![other("5d5d", None)],
            None,
        ),
        (
            "another bucket",
            &mine,
            vec![other("5d5d", Some(&other_bucket))],
            None,
        ),
        (
            "another's prefix holds my keys",
            &mine,
            vec![other("5d5d", Some(&parent))],
            Some("KeyClaimedByAnother"),
        ),
        (
            "another's keys under my prefix",
            &mine,
            vec![other("5d5d", Some(&child))],
            Some("KeyClaimedByAnother"),
        ),
        (
            "another recorded the same key",
            &mine,
            vec![other("7a7a", Some(&same_keys))],
            Some("KeyClaimedByAnother"),
        ),
        (
            "prefix without my UID",
            &parent,
            vec![],
            Some("KeyNotProvenOwn"),
        ),
        (
            "prefix ending in another UID",
            &neighbour,
            vec![],
            Some("KeyNotProvenOwn"),
        ),
        (
            "a key outside the prefix",
            &foreign,
            vec![],
            Some("KeyNotProvenOwn"),
        ),
    ];
    for (name, artifact, others, refused) in rows {
        match (contest(artifact, UID, &others), refused) {
            (Contest::Proven { keys }, None) => {
                assert_eq!(
                    keys,
                    [artifact.key.clone(), artifact.manifest_key.clone()],
                    "{name}"
                );
            }
            (Contest::Refused { reason, .. }, Some(expected)) => {
                assert_eq!(reason, expected, "{name}")
            }
            (outcome, _) => panic!("{name}: {outcome:?}"),
        }
    }
    // A UID that merely ends the same way is not this Backup's.
    assert!(matches!(
        contest(&artifact("custody/ns/db/x1b2f"), UID, &[]),
        Contest::Refused { .. }
    ));
    // Reserved characters are keys like any other.
    let odd = artifact("custody/ns/my db#1?x=%2F/1b2f");
    assert!(matches!(contest(&odd, UID, &[]), Contest::Proven { .. }));
}

#[test]
fn deletion_steps() {
    let mine = artifact("custody/ns/db/1b2f");
    let proven = Some(Contest::Proven {
        keys: vec![mine.key.clone(), mine.manifest_key.clone()],
    });
    let refused = Some(Contest::Refused {
        reason: "KeyClaimedByAnother",
        message: "x".into(),
    });
    let readers = vec!["shop".to_string()];
    let base = Deleting {
        has_finalizer: true,
        done: false,
        skip: false,
        policy: DeletionPolicy::Delete,
        artifact: Some(&mine),
        readers: &[],
        contest: proven.clone(),
    };
    let rows: Vec<(&str, Deleting, &str)> = vec![
        ("proven: delete", base.clone(), "Delete"),
        (
            "finalizer gone",
            Deleting {
                has_finalizer: false,
                ..base.clone()
            },
            "Nothing",
        ),
        (
            "a restore reads it",
            Deleting {
                readers: &readers,
                ..base.clone()
            },
            "Wait",
        ),
        (
            "cleanup done earlier (the Secret may be gone)",
            Deleting {
                done: true,
                ..base.clone()
            },
            "CleanupDone",
        ),
        (
            "cleanup done, even with a reader (its keys are gone already)",
            Deleting {
                done: true,
                readers: &readers,
                ..base.clone()
            },
            "CleanupDone",
        ),
        (
            "cleanup done, finalizer gone",
            Deleting {
                done: true,
                has_finalizer: false,
                ..base.clone()
            },
            "Nothing",
        ),
        (
            "a restore reads it, even with skip",
            Deleting {
                readers: &readers,
                skip: true,
                ..base.clone()
            },
            "Wait",
        ),
        (
            "skip annotation",
            Deleting {
                skip: true,
                ..base.clone()
            },
            "ArtifactKept",
        ),
        (
            "retain",
            Deleting {
                policy: DeletionPolicy::Retain,
                ..base.clone()
            },
            "ArtifactKept",
        ),
        (
            "nothing recorded",
            Deleting {
                artifact: None,
                ..base.clone()
            },
            "NoArtifact",
        ),
        (
            "contested",
            Deleting {
                contest: refused.clone(),
                ..base.clone()
            },
            "KeyClaimedByAnother",
        ),
        (
            "not contested",
            Deleting {
                contest: None,
                ..base.clone()
            },
            "KeyNotProvenOwn",
        ),
    ];
    for (name, facts, expected) in rows {
        let got = match step(&facts) {
            Step::Nothing => "Nothing",
            Step::Wait { .. } => "Wait",
            Step::Delete { .. } => "Delete",
            Step::Release {
                reason, warning, ..
            } => {
                assert_eq!(
                    warning,
                    matches!(reason, "KeyClaimedByAnother" | "KeyNotProvenOwn"),
                    "{name}"
                );
                reason
            }
        };
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn an_attributed_dump_is_contested_again() {
    use crate::attribution::{Offset, OtherRun, Run};
    use custody_kube::api::AttributionEvidence;
    const S: i64 = 1_000_000_000;
    let t = 1_796_000_000 * S;
    let run = Run {
        start: t,
        end: t + 20 * S,
        offset: Some(Offset {
            offset: 30 * S,
            round_trip: 1_000_000,
        }),
    };
    let mut mine = artifact("custody/pg-dumps");
    // Named by a node 30 s ahead, 5 s into the run.
    mine.key = "custody/pg-dumps/db-20261130T005355Z.dump".into();
    mine.manifest_key = String::new();
    mine.attribution = Some(AttributionEvidence {
        corrected_name_time_nanos: t + 5 * S,
        last_modified_nanos: t + 6 * S,
        window_start_nanos: t - S,
        window_end_nanos: t + 21 * S,
    });
    let other = |start: i64, end: i64, key: Option<&str>| OtherRun {
        name: "other".into(),
        start,
        end: Some(end),
        key: key.map(str::to_string),
        offset: None,
    };
    let unattributed = Artifact {
        attribution: None,
        ..mine.clone()
    };
    let outside = Artifact {
        key: "custody/other/db-20261130T005355Z.dump".into(),
        ..mine.clone()
    };
    let climbing = Artifact {
        key: "custody/pg-dumps/../db-20261130T005355Z.dump".into(),
        ..mine.clone()
    };
    let rows: Vec<(&str, &Artifact, Vec<OtherRun>, Option<&str>)> = vec![
        ("alone", &mine, vec![], None),
        (
            "an earlier run",
            &mine,
            vec![other(t - 100 * S, t - 50 * S, Some("custody/pg-dumps/old"))],
            None,
        ),
        (
            "a run at the same time",
            &mine,
            vec![other(t + 2 * S, t + 9 * S, None)],
            Some("OverlappingRun"),
        ),
        (
            "recorded by another",
            &mine,
            vec![other(t - 100 * S, t - 50 * S, Some(mine.key.as_str()))],
            Some("DumpClaimedByAnother"),
        ),
        (
            "a key outside the command's prefix",
            &outside,
            vec![],
            Some("KeyNotProvenOwn"),
        ),
        (
            "a key not in normal form",
            &climbing,
            vec![],
            Some("KeyNotProvenOwn"),
        ),
        (
            "never attributed",
            &unattributed,
            vec![],
            Some("KeyNotProvenOwn"),
        ),
    ];
    for (name, artifact, others, refused) in rows {
        match (contest_attributed(artifact, &run, &others), refused) {
            (Contest::Proven { keys }, None) => assert_eq!(keys, [mine.key.clone()], "{name}"),
            (Contest::Refused { reason, .. }, Some(expected)) => {
                assert_eq!(reason, expected, "{name}")
            }
            (outcome, _) => panic!("{name}: {outcome:?}"),
        }
    }
    // Without the node's offset the dump cannot be contested into proof.
    let unmeasured = Run {
        offset: None,
        ..run
    };
    assert!(matches!(
        contest_attributed(&mine, &unmeasured, &[]),
        Contest::Refused {
            reason: "NoClockOffset",
            ..
        }
    ));
}

#[test]
fn a_failed_delete_waits_out_its_backoff() {
    assert_eq!(wait_before_retry(0, Some(100), 100), None, "never failed");
    assert_eq!(wait_before_retry(1, None, 100), None, "no time recorded");
    assert_eq!(
        wait_before_retry(1, Some(100), 100),
        Some(Duration::from_secs(5))
    );
    assert_eq!(
        wait_before_retry(1, Some(100), 104),
        Some(Duration::from_secs(1))
    );
    assert_eq!(wait_before_retry(1, Some(100), 105), None);
    assert_eq!(
        wait_before_retry(3, Some(100), 110),
        Some(Duration::from_secs(10))
    );
    assert_eq!(
        wait_before_retry(20, Some(100), 399),
        Some(Duration::from_secs(1))
    );
    assert_eq!(wait_before_retry(20, Some(100), 400), None);
}

#[test]
fn backoff_doubles_and_is_capped() {
    let seconds: Vec<u64> = (0..9).map(|n| backoff(n).as_secs()).collect();
    assert_eq!(seconds, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
    assert_eq!(backoff(u32::MAX).as_secs(), 300);
}

#[test]
fn keys_in_normal_form_and_compared_spelling_aside() {
    for (key, normal) in [
        ("custody/ns/db/1b2f/data.tar.zst", true),
        ("team a/#1?x=%2F&y/data.tar.zst", true),
        ("a/.hidden/b", true),
        ("a/..b/c", true),
        ("", false),
        ("/custody/a", false),
        ("custody//a", false),
        ("custody/a/", false),
        ("custody/./a", false),
        ("custody/../a", false),
        ("..", false),
    ] {
        assert_eq!(normal_key(key), normal, "{key}");
    }
    for (key, form) in [
        ("a/b", "a/b"),
        ("a//b/", "a/b"),
        ("a/./b", "a/b"),
        ("a/x/../b", "a/b"),
        ("a%2Fb", "a/b"),
        ("a%2fb", "a/b"),
        ("%2E%2E/a", "a"),
        ("a%2", "a%2"),
        ("a%zz", "a%zz"),
        ("100%", "100%"),
    ] {
        assert_eq!(comparable(key), form, "{key}");
    }
}

fn holder(
    finalizer: bool,
    phase: Option<&str>,
    artifact_secret: Option<&str>,
    destination_secret: Option<&str>,
    done: bool,
) -> Backup {
    let mut status = json!({});
    if let Some(phase) = phase {
        status["phase"] = json!(phase);
    }
    if let Some(secret) = artifact_secret {
        status["artifact"] = json!({"repository": "store", "endpoint": "http://s3", "bucket": "b",
            "key": "k", "manifestKey": "m", "credentialsSecret": secret});
    }
    if let Some(secret) = destination_secret {
        status["destination"] = json!({"endpoint": "http://s3", "bucket": "b", "prefix": "p", "credentialsSecret": secret});
    }
    if done {
        status["cleanup"] = json!({"done": true});
    }
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "other", "namespace": "ns", "uid": "u",
                     "finalizers": if finalizer { vec![FINALIZER] } else { vec![] }},
        "spec": {"clusterRef": {"name": "db"}},
        "status": status,
    }))
    .unwrap()
}

#[test]
fn a_backup_holds_the_secret_it_recorded_or_else_its_repositorys() {
    let rows: Vec<(&str, Backup, Option<&str>, Vec<&str>)> = vec![
        (
            "artifact",
            holder(true, Some("Completed"), Some("s3"), None, false),
            Some("repo"),
            vec!["s3"],
        ),
        (
            "destination",
            holder(true, Some("Failed"), None, Some("s3"), false),
            Some("repo"),
            vec!["s3"],
        ),
        (
            "both, moved",
            holder(true, Some("Completed"), Some("old"), Some("s3"), false),
            None,
            vec!["old", "s3"],
        ),
        (
            "nothing recorded",
            holder(true, None, None, None, false),
            Some("repo"),
            vec!["repo"],
        ),
        (
            "nothing at all",
            holder(true, None, None, None, false),
            None,
            vec![],
        ),
    ];
    for (name, backup, repository, expected) in rows {
        assert_eq!(held_secrets(&backup, repository), expected, "{name}");
    }
}

#[test]
fn another_backup_needs_the_secret_until_its_cleanup_is_done() {
    let rows: Vec<(&str, Backup, bool)> = vec![
        (
            "recorded it",
            holder(true, Some("Completed"), Some("s3"), None, false),
            true,
        ),
        (
            "recorded it as destination",
            holder(true, Some("Failed"), None, Some("s3"), false),
            true,
        ),
        (
            "recorded another",
            holder(true, Some("Completed"), Some("other"), None, false),
            false,
        ),
        (
            "its cleanup is done",
            holder(true, Some("Completed"), Some("s3"), None, true),
            false,
        ),
        (
            "no finalizer",
            holder(false, Some("Completed"), Some("s3"), None, false),
            false,
        ),
        (
            "starting, nothing recorded yet",
            holder(true, None, None, None, false),
            true,
        ),
        (
            "running, nothing recorded",
            holder(true, Some("Running"), None, None, false),
            true,
        ),
        (
            "failed before recording",
            holder(true, Some("Failed"), None, None, false),
            false,
        ),
    ];
    for (name, backup, expected) in rows {
        assert_eq!(needs_secret(&backup, "s3"), expected, "{name}");
    }
    // A run signed by a web identity, recorded in its artifact or its destination, needs no
    // Secret while it runs (else it would keep every Secret's finalizer on for its whole run).
    let mut by_artifact = holder(true, Some("Running"), None, None, false);
    by_artifact.status.as_mut().unwrap().artifact = Some(Artifact {
        web_identity: Some(
            serde_json::from_value(json!({"serviceAccountName": "backups", "roleArn": "arn:r"}))
                .unwrap(),
        ),
        ..artifact("p/1")
    });
    let mut by_destination = holder(true, Some("Running"), None, None, false);
    by_destination.status.as_mut().unwrap().destination = Some(custody_kube::api::Destination {
        service_account: Some("backups".into()),
        ..Default::default()
    });
    for (name, backup) in [("artifact", by_artifact), ("destination", by_destination)] {
        assert!(!needs_secret(&backup, "s3"), "{name}");
    }
}

fn snapshot_artifact(id: Option<&str>, origin: &str) -> Artifact {
    Artifact {
        repository: "store".into(),
        bucket: "bucket".into(),
        prefix: "custody/custody_repository".into(),
        snapshot: Some(custody_kube::api::SnapshotRef {
            repository_id: "r".repeat(64),
            id: id.map(str::to_string),
            origin_cluster: origin.into(),
            volumes: vec!["data".into()],
            volume_manifests: Vec::new(),
            written_by: None,
        }),
        ..Artifact::default()
    }
}

/// A snapshot is forgotten only when this cluster wrote it and no other Backup records it;
/// a run that wrote none has nothing to forget.
#[test]
fn snapshots_are_forgotten_only_when_proven_own() {
    let id = "c".repeat(64);
    let mine = snapshot_artifact(Some(&id), "here");
    let same_elsewhere = snapshot_artifact(Some(&id), "here");
    let another_snapshot = snapshot_artifact(Some(&"d".repeat(64)), "here");
    let mut same_in_other_repository = snapshot_artifact(Some(&id), "here");
    same_in_other_repository
        .snapshot
        .as_mut()
        .unwrap()
        .repository_id = "s".repeat(64);
    // (case, artifact, this cluster's origin, the other Backups, the keys to delete or the refusal)
    type Case<'a> = (
        &'a str,
        Artifact,
        Option<&'a str>,
        Vec<Other<'a>>,
        Result<Vec<String>, &'a str>,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "its own, alone",
            mine.clone(),
            Some("here"),
            vec![
                other("other", Some(&another_snapshot)),
                other(UID, Some(&mine)),
            ],
            Ok(vec![format!("custody/custody_repository/snapshots/{id}")]),
        ),
        (
            "another cluster's",
            mine.clone(),
            Some("there"),
            vec![],
            Err("SnapshotOfAnotherCluster"),
        ),
        (
            "this cluster unknown",
            mine.clone(),
            None,
            vec![],
            Err("SnapshotOfAnotherCluster"),
        ),
        (
            "another Backup records it (an import)",
            mine.clone(),
            Some("here"),
            vec![other("other", Some(&same_elsewhere))],
            Err("KeyClaimedByAnother"),
        ),
        (
            "the same ID in another repository is another file",
            mine.clone(),
            Some("here"),
            vec![other("other", Some(&same_in_other_repository))],
            Ok(vec![format!("custody/custody_repository/snapshots/{id}")]),
        ),
        (
            "no snapshot written",
            snapshot_artifact(None, "here"),
            Some("here"),
            vec![],
            Ok(vec![]),
        ),
        (
            "not a snapshot ID",
            snapshot_artifact(Some("../../config"), "here"),
            Some("here"),
            vec![],
            Err("KeyNotNormal"),
        ),
        (
            "not a snapshot at all",
            artifact("custody/ns/db/x"),
            Some("here"),
            vec![],
            Err("KeyNotProvenOwn"),
        ),
    ];
    for (what, artifact, here, others, expected) in cases {
        let found = match contest_snapshot(&artifact, here, UID, &others) {
            Contest::Proven { keys } => Ok(keys),
            Contest::Refused { reason, .. } => Err(reason),
        };
        assert_eq!(found, expected, "{what}");
    }
    // Nothing written: the Backup is released, not deleted from.
    let step = step(&Deleting {
        has_finalizer: true,
        done: false,
        skip: false,
        policy: DeletionPolicy::Delete,
        artifact: Some(&snapshot_artifact(None, "here")),
        readers: &[],
        contest: Some(Contest::Proven { keys: vec![] }),
    });
    assert!(
        matches!(
            step,
            Step::Release {
                reason: "NoArtifact",
                ..
            }
        ),
        "{step:?}"
    );
}
