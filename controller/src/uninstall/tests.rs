use serde_json::json;

use super::*;

fn backup(namespace: &str, artifact: Option<&str>, destination: Option<&str>) -> Backup {
    let mut status = json!({});
    if let Some(secret) = artifact {
        status["artifact"] = json!({"repository": "r", "endpoint": "https://s3", "bucket": "b",
                                    "key": "k", "manifestKey": "m", "credentialsSecret": secret});
    }
    if let Some(secret) = destination {
        status["destination"] = json!({"endpoint": "https://s3", "bucket": "b", "prefix": "p",
                                       "credentialsSecret": secret});
    }
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": "b", "namespace": namespace},
        "spec": {"clusterRef": {"name": "db"}},
        "status": status,
    }))
    .expect("Backup")
}

fn repository(namespace: &str, credentials: &str, keys: Option<&str>) -> BackupRepository {
    let mut spec = json!({"endpoint": "https://s3", "bucket": "b",
                          "credentialsSecretRef": {"name": credentials}});
    if let Some(keys) = keys {
        spec["encryption"] = json!({"keySecretRef": {"name": keys}});
    }
    serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
        "metadata": {"name": "r", "namespace": namespace}, "spec": spec,
    }))
    .expect("BackupRepository")
}

/// Every Secret custody may have marked is found through what names it, in its own namespace,
/// once; none other.
#[test]
fn the_marked_secrets_are_those_backups_and_repositories_name() {
    let pairs = |items: &[(&str, &str)]| {
        items
            .iter()
            .map(|(namespace, name)| (namespace.to_string(), name.to_string()))
            .collect::<BTreeSet<_>>()
    };
    type Row = (
        &'static str,
        Vec<Backup>,
        Vec<BackupRepository>,
        BTreeSet<(String, String)>,
    );
    let rows: Vec<Row> = vec![
        ("nothing", vec![], vec![], pairs(&[])),
        (
            "a Backup's artifact and destination",
            vec![backup("shop", Some("s3"), Some("dumps"))],
            vec![],
            pairs(&[("shop", "s3"), ("shop", "dumps")]),
        ),
        (
            "a Backup that recorded none",
            vec![backup("shop", None, None)],
            vec![],
            pairs(&[]),
        ),
        (
            "a repository's credentials and key Secret",
            vec![],
            vec![repository("shop", "s3", Some("keys"))],
            pairs(&[("shop", "s3"), ("shop", "keys")]),
        ),
        (
            "the same name in two namespaces, and once when named twice",
            vec![
                backup("shop", Some("s3"), None),
                backup("crm", Some("s3"), None),
            ],
            vec![repository("shop", "s3", None)],
            pairs(&[("shop", "s3"), ("crm", "s3")]),
        ),
    ];
    for (case, backups, repositories, expected) in rows {
        assert_eq!(marked_secrets(&backups, &repositories), expected, "{case}");
    }
}

/// A pod is held while its injected custody-wait has not finished successfully and the pod
/// is not over.
#[test]
fn a_pod_is_held_until_its_custody_wait_succeeded() {
    let pod = |injected: bool, exit: Option<i32>, phase: &str| -> Pod {
        let mut value = json!({
            "metadata": {"name": "db-0", "namespace": "shop"},
            "spec": {"containers": [{"name": "db"}], "initContainers": []},
            "status": {"phase": phase},
        });
        if injected {
            value["spec"]["initContainers"] = json!([{"name": crate::inject::WAIT_CONTAINER}]);
        }
        if let Some(code) = exit {
            value["status"]["initContainerStatuses"] = json!([{
                "name": crate::inject::WAIT_CONTAINER, "ready": false, "restartCount": 0,
                "image": "i", "imageID": "",
                "state": {"terminated": {"exitCode": code}},
            }]);
        }
        serde_json::from_value(value).expect("Pod")
    };
    let rows = [
        ("not injected", pod(false, None, "Running"), false),
        ("waiting", pod(true, None, "Pending"), true),
        (
            "its wait failed, to run again",
            pod(true, Some(1), "Pending"),
            true,
        ),
        ("released", pod(true, Some(0), "Running"), false),
        ("over", pod(true, None, "Failed"), false),
        ("completed", pod(true, None, "Succeeded"), false),
    ];
    for (case, pod, expected) in rows {
        assert_eq!(held(&pod), expected, "{case}");
    }
}
