//! The steps of a Backup's deletion and what follows a delete, as rows.

use serde_json::json;

use super::*;

const UID: &str = "b0b0b0b0-0000-4000-8000-000000000002";

fn now() -> Timestamp {
    "2026-11-30T12:00:00Z".parse().unwrap()
}

fn artifact() -> Artifact {
    Artifact {
        repository: "store".into(),
        endpoint: "http://s3".into(),
        bucket: "bucket".into(),
        prefix: format!("p/{UID}"),
        key: format!("p/{UID}/data.tar.zst"),
        manifest_key: format!("p/{UID}/manifest.jsonl"),
        ..Artifact::default()
    }
}

/// A Backup being deleted, with its recorded artifact and `cleanup` status.
fn backup(cleanup: serde_json::Value) -> Backup {
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1",
        "kind": "Backup",
        "metadata": {"name": "nightly", "namespace": "ns", "uid": UID,
            "finalizers": [artifacts::FINALIZER], "deletionTimestamp": "2026-11-30T11:59:00Z"},
        "spec": {"clusterRef": {"name": "orders"}},
        "status": {"phase": "Completed", "artifact": artifact(), "cleanup": cleanup},
    }))
    .unwrap()
}

fn facts(backup: Backup, readers: &[&str], contest: Option<artifacts::Contest>) -> Facts {
    Facts {
        backup,
        now: now(),
        readers: readers.iter().map(|name| name.to_string()).collect(),
        contest,
    }
}

fn proven() -> Option<artifacts::Contest> {
    Some(artifacts::contest(&artifact(), UID, &[]))
}

fn keys() -> Vec<String> {
    vec![artifact().key, artifact().manifest_key]
}

#[test]
fn deletion_steps() {
    // A restore reads it: wait, said once.
    let waiting = plan(&facts(backup(json!(null)), &["orders"], None));
    let Plan::Wait { first: Some(note) } = &waiting else {
        panic!("{waiting:?}");
    };
    assert_eq!(note.reason, "DeletionWaitsForRestore");
    let said = backup(json!({"lastError": note.text}));
    assert_eq!(
        plan(&facts(said, &["orders"], None)),
        Plan::Wait { first: None }
    );
    // Proven its own: delete exactly the recorded keys.
    assert_eq!(
        plan(&facts(backup(json!(null)), &[], proven())),
        Plan::Delete { keys: keys() }
    );
    // A delete failed 2 s ago (attempt 1): back off 5 s from then, 3 s from now.
    let failed_once = backup(json!({"attempts": 1, "lastError": "503",
        "lastAttemptTime": "2026-11-30T11:59:58Z"}));
    assert_eq!(
        plan(&facts(failed_once, &[], proven())),
        Plan::Later(Duration::from_secs(3))
    );
    // Long enough ago: try again.
    let failed_long_ago = backup(json!({"attempts": 1, "lastError": "503",
        "lastAttemptTime": "2026-11-30T11:00:00Z"}));
    assert_eq!(
        plan(&facts(failed_long_ago, &[], proven())),
        Plan::Delete { keys: keys() }
    );
    // The skip annotation: released, nothing deleted.
    let mut skipped = backup(json!(null));
    skipped.metadata.annotations =
        Some([(artifacts::SKIP_ANNOTATION.to_string(), "true".to_string())].into());
    assert!(matches!(
        plan(&facts(skipped, &[], proven())),
        Plan::Release { note } if !note.warning && note.reason == "ArtifactKept"
    ));
    // The finalizer is gone: not ours.
    let mut released = backup(json!(null));
    released.metadata.finalizers = None;
    assert_eq!(plan(&facts(released, &[], None)), Plan::Nothing);
}

#[test]
fn what_follows_a_delete() {
    let facts = facts(backup(json!({"attempts": 2})), &[], proven());
    let done = after_delete(
        &facts,
        &artifact(),
        &keys(),
        &Outcome::Deleted {
            endpoint: "http://s3".into(),
            absent: vec![artifact().manifest_key],
        },
    );
    assert!(done.release);
    assert_eq!((done.record, done.requeue), (None, None));
    let reasons: Vec<&str> = done
        .events
        .iter()
        .map(|note| note.reason.as_str())
        .collect();
    assert_eq!(reasons, ["ArtifactAlreadyAbsent", "ArtifactDeleted"]);
    assert!(done.events[1].text.contains(&artifact().key));
    assert!(
        !done.events[1].text.contains("manifest.jsonl"),
        "{}",
        done.events[1].text
    );

    let all_gone = after_delete(
        &facts,
        &artifact(),
        &keys(),
        &Outcome::Deleted {
            endpoint: "http://s3".into(),
            absent: keys(),
        },
    );
    assert!(all_gone.release);
    assert!(
        all_gone
            .events
            .iter()
            .all(|note| note.reason == "ArtifactAlreadyAbsent")
    );

    let failed = after_delete(
        &facts,
        &artifact(),
        &keys(),
        &Outcome::Failed("the server answered HTTP 503".into()),
    );
    assert!(!failed.release);
    assert_eq!(
        failed.record,
        Some((3, "the server answered HTTP 503".to_string()))
    );
    assert_eq!(failed.requeue, Some(Duration::from_secs(20)));
    let warning = &failed.events[0];
    assert!(warning.warning && warning.reason == "ArtifactCleanupFailed");
    assert!(
        warning.text.contains("attempt 3") && warning.text.contains(artifacts::SKIP_ANNOTATION)
    );
}
