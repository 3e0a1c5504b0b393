use super::*;

/// What is known of the Restores when the test's Restore is in the agent's watch.
fn watched(recorded: Recorded) -> Restores {
    Restores {
        recorded,
        watched: [("db".to_string(), "restore-uid".to_string())].into(),
        absences: Absences::new(),
    }
}
use crate::volume_state::{Absences, Outcome, Recorded, RecordedVolume};

fn pod(value: serde_json::Value) -> Pod {
    serde_json::from_value(value).expect("pod")
}

fn workload(claims: &str) -> Pod {
    pod(serde_json::json!({
        "metadata": {
            "name": "pg-0", "namespace": "db", "uid": "pod-uid",
            "labels": {"custody.io/restore-uid": "restore-uid"},
            "annotations": {
                "custody.io/restore": "pg-restore",
                "custody.io/restored-claims": claims,
            },
        },
        "spec": {"containers": [], "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-pg-0"}},
            {"name": "wal", "persistentVolumeClaim": {"claimName": "wal-pg-0"}},
        ]},
    }))
}

fn prepare(name: &str, claim: &str, phase: &str) -> Pod {
    pod(serde_json::json!({
        "metadata": {
            "name": name, "namespace": "db", "uid": format!("{name}-uid"),
            "labels": {"custody.io/role": "prepare-data", "custody.io/restore-uid": "restore-uid"},
        },
        "spec": {"containers": [], "volumes": [
            {"name": "target", "persistentVolumeClaim": {"claimName": claim}},
        ]},
        "status": {"phase": phase, "containerStatuses": [{
            "name": "mover", "image": "", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 3, "message": "no such key\n"}},
        }]},
    }))
}

fn bystander() -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "web", "namespace": "db", "uid": "web-uid"},
        "spec": {"containers": []},
    }))
}

#[test]
fn a_pod_is_released_only_when_each_restored_claim_is_verified() {
    let pods = [
        workload("data-pg-0,wal-pg-0"),
        prepare("prep-data", "data-pg-0", "Succeeded"),
        prepare("prep-wal", "wal-pg-0", "Running"),
        bystander(),
    ];
    let (view, starts) = compute(&pods, &BTreeMap::new(), &watched(Recorded::new()));
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0].key.prepare_pod_uid, "prep-data-uid");
    assert_eq!(starts[0].volume.volume, "data");
    let gated = &view.gated["pod-uid"];
    assert_eq!(
        gated
            .volumes
            .iter()
            .map(|v| v.state.name())
            .collect::<Vec<_>>(),
        ["Verifying", "Restoring"]
    );
    assert!(!gated.released());
    assert_eq!(
        view.counts(),
        BTreeMap::from([("Restoring", 1), ("Verifying", 1)])
    );

    let verified = |at| {
        Verification::Done(Outcome::Verified {
            at_unix_nanos: at,
            summary: String::new(),
        })
    };
    let key = |volume: &str, prepare: &str| VerificationKey {
        pod_uid: "pod-uid".into(),
        volume: volume.into(),
        prepare_pod_uid: format!("{prepare}-uid"),
    };
    let done = [
        workload("data-pg-0,wal-pg-0"),
        prepare("prep-data", "data-pg-0", "Succeeded"),
        prepare("prep-wal", "wal-pg-0", "Succeeded"),
    ];
    let verifications = BTreeMap::from([
        (key("data", "prep-data"), verified(10)),
        (key("wal", "prep-wal"), verified(20)),
    ]);
    let (view, starts) = compute(&done, &verifications, &watched(Recorded::new()));
    assert!(starts.is_empty());
    let progress = view.progress("pod-uid", "db", "pg-0").unwrap();
    assert!(progress.released);
    assert_eq!(progress.verified_at_unix_nanos, 20);
    assert_eq!(progress.pod, "db/pg-0");

    // One verified, one not: still gated.
    let half = BTreeMap::from([(key("data", "prep-data"), verified(10))]);
    let (view, _) = compute(&done, &half, &watched(Recorded::new()));
    let progress = view.progress("pod-uid", "db", "pg-0").unwrap();
    assert!(!progress.released);
    assert_eq!(progress.verified_at_unix_nanos, 0);
}

#[test]
fn a_prepare_pod_killed_is_not_a_failed_volume_its_job_tries_again() {
    let mut killed = prepare("prep-data", "data-pg-0", "Failed");
    killed
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .state
        .as_mut()
        .unwrap()
        .terminated
        .as_mut()
        .unwrap()
        .exit_code = 137;
    let pods = [workload("data-pg-0"), killed];
    let (view, _) = compute(&pods, &BTreeMap::new(), &watched(Recorded::new()));
    let volume = &view.gated["pod-uid"].volumes[0];
    assert_eq!(volume.state, State::Restoring, "{}", volume.message);
    assert!(
        volume.message.contains("exit code 137") && volume.message.contains("may try again"),
        "{}",
        volume.message
    );
}

#[test]
fn a_failed_prepare_pod_names_its_exit() {
    let pods = [
        workload("data-pg-0"),
        prepare("prep-data", "data-pg-0", "Failed"),
    ];
    let (view, _) = compute(&pods, &BTreeMap::new(), &watched(Recorded::new()));
    let volume = &view.gated["pod-uid"].volumes[0];
    assert!(
        matches!(&volume.state, State::Failed { reason, .. } if reason.as_str() == "PrepareDataFailed")
    );
    assert!(
        volume.message.contains("exit code 3: no such key"),
        "{}",
        volume.message
    );
}

#[test]
fn pods_not_under_restore_pass_and_unknown_pods_get_no_answer() {
    let pods = [bystander()];
    let (view, _) = compute(&pods, &BTreeMap::new(), &watched(Recorded::new()));
    let progress = view.progress("web-uid", "db", "web").unwrap();
    assert!(progress.released && progress.volumes.is_empty());
    assert_eq!(view.progress("gone-uid", "db", "gone"), None);
}

#[test]
fn inconsistent_restore_annotations_keep_the_pod_gated() {
    let pods = [workload("data-pg-0,not-mounted")];
    let (view, starts) = compute(&pods, &BTreeMap::new(), &watched(Recorded::new()));
    assert!(starts.is_empty());
    let progress = view.progress("pod-uid", "db", "pg-0").unwrap();
    assert!(!progress.released);
    assert_eq!(progress.volumes.len(), 1);
    assert_eq!(progress.volumes[0].reason, "InvalidRestoreAnnotations");
    assert_eq!(progress.volumes[0].state, VolumeState::Failed as i32);
}

/// A workload pod as the webhook admits it: `custody-wait` names the Restore and claims; the
/// labels and annotations were removed afterwards by a patch.
fn injected_then_stripped() -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "pg-0", "namespace": "db", "uid": "pod-uid"},
        "spec": {
            "initContainers": [{"name": names::WAIT_CONTAINER, "env": [
                {"name": names::ENV_RESTORE, "value": "pg-restore"},
                {"name": names::ENV_RESTORE_UID, "value": "restore-uid"},
                {"name": names::ENV_RESTORED_CLAIMS, "value": "data-pg-0"},
                {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            ]}],
            "containers": [],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-pg-0"}}],
        },
    }))
}

#[test]
fn removing_labels_and_annotations_does_not_release_a_held_pod() {
    let pods = [injected_then_stripped()];
    let (view, starts) = compute(&pods, &BTreeMap::new(), &watched(Recorded::new()));
    assert!(starts.is_empty());
    let progress = view.progress("pod-uid", "db", "pg-0").unwrap();
    assert!(!progress.released, "{progress:?}");
    assert_eq!(progress.volumes.len(), 1);
    assert_eq!(progress.volumes[0].claim_name, "data-pg-0");
    // custody-wait with nothing to wait for holds the pod too.
    let mut empty = injected_then_stripped();
    empty
        .spec
        .as_mut()
        .unwrap()
        .init_containers
        .as_mut()
        .unwrap()[0]
        .env = None;
    let (view, _) = compute(&[empty], &BTreeMap::new(), &watched(Recorded::new()));
    assert!(!view.progress("pod-uid", "db", "pg-0").unwrap().released);
}

#[test]
fn a_pod_whose_volume_the_restore_records_verified_is_released_without_a_verification() {
    let pods = [injected_then_stripped()];
    let recorded: Recorded = [(
        (
            "db".to_string(),
            "restore-uid".to_string(),
            "data-pg-0".to_string(),
        ),
        RecordedVolume::Verified,
    )]
    .into();
    let (view, starts) = compute(&pods, &BTreeMap::new(), &watched(recorded.clone()));
    assert!(starts.is_empty(), "{starts:?}");
    let progress = view.progress("pod-uid", "db", "pg-0").unwrap();
    assert!(progress.released, "{progress:?}");
    assert_eq!(view.counts().get("Failed"), None);
}
