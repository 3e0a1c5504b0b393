use serde_json::{Value, json};

use super::*;

const NOW: &str = "2026-12-06T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn at(offset: i64) -> String {
    (now() + k8s_openapi::jiff::SignedDuration::from_secs(offset)).to_string()
}

fn ready(status: &str, reason: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": format!("{reason} message"),
           "lastTransitionTime": at(0)})
}

fn backup(namespace: &str, name: &str, cluster: &str, created: i64, status: Value) -> Backup {
    serde_json::from_value(
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": at(created)},
        "spec": {"clusterRef": {"name": cluster}}, "status": status}),
    )
    .unwrap()
}

fn completed(end: i64) -> Value {
    json!({"phase": "Completed", "completionTime": at(end),
           "transfer": {"summary": "", "bytesDone": 2048, "bytesTotal": 2048, "filesDone": 2},
           "conditions": [ready("True", "Completed")]})
}

fn cluster(namespace: &str, name: &str) -> Cluster {
    serde_json::from_value(
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"statefulSetRef": {"name": name}, "volumeClaimTemplates": ["data"]},
        "status": {"phase": "Running"}}),
    )
    .unwrap()
}

fn restore(name: &str, cluster: &str, created: i64, status: Value) -> Restore {
    serde_json::from_value(
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Restore",
        "metadata": {"name": name, "namespace": "shop", "creationTimestamp": at(created)},
        "spec": {"clusterRef": {"name": cluster}, "backupRef": {"name": "nightly"}},
        "status": status}),
    )
    .unwrap()
}

#[test]
fn ages_and_sizes_read_as_kubectl_prints_them() {
    for (seconds, text) in [
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (7_199, "119m"),
        (7_200, "2h"),
        (172_799, "47h"),
        (172_800, "2d"),
    ] {
        let then = now() - k8s_openapi::jiff::SignedDuration::from_secs(seconds);
        assert_eq!(age(then, now()), text, "{seconds}");
    }
    // A time in the future (a skewed clock) is not a negative age.
    assert_eq!(
        age(
            now() + k8s_openapi::jiff::SignedDuration::from_secs(5),
            now()
        ),
        "0s"
    );
    let transfer = |done, total| Transfer {
        bytes_done: done,
        bytes_total: total,
        ..Transfer::default()
    };
    assert_eq!(progress(None), "");
    assert_eq!(progress(Some(&transfer(512, None))), "512 B");
    assert_eq!(progress(Some(&transfer(512, Some(0)))), "512 B");
    assert_eq!(
        progress(Some(&transfer(1024, Some(4096)))),
        "1.0 KiB / 4.0 KiB (25%)"
    );
}

#[test]
fn status_names_each_clusters_last_success_its_newer_failure_and_what_runs() {
    let clusters = [
        cluster("shop", "orders"),
        cluster("shop", "users"),
        cluster("other", "orders"),
    ];
    let mut imported = backup("shop", "theirs", "orders", 500, completed(510));
    imported.spec.imported_snapshot = Some("abc".to_string());
    let backups = [
        backup("shop", "monday", "orders", 0, completed(10)),
        backup("shop", "tuesday", "orders", 100, completed(110)),
        backup(
            "shop",
            "wednesday",
            "orders",
            200,
            json!({"phase": "Failed", "conditions": [ready("False", "ToolFailed")]}),
        ),
        backup(
            "shop",
            "thursday",
            "orders",
            300,
            json!({"phase": "Running",
                   "transfer": {"summary": "", "bytesDone": 1024, "bytesTotal": 4096, "filesDone": 1}}),
        ),
        imported,
        backup("other", "elsewhere", "orders", 0, completed(20)),
        backup("shop", "u1", "users", 0, completed(30)),
    ];
    let restores = [
        restore(
            "r1",
            "users",
            0,
            json!({"phase": "Running", "conditions": [ready("False", "Verifying")],
                   "volumes": [{"claimName": "data-users-0", "state": "Verified", "attempts": 1},
                               {"claimName": "data-users-1", "state": "Verifying", "attempts": 1}]}),
        ),
        restore("r0", "users", -100, json!({"phase": "Completed"})),
    ];
    let views = status(&clusters, &backups, &restores);
    let names: Vec<(&str, &str)> = views
        .iter()
        .map(|view| (view.namespace.as_str(), view.cluster.as_str()))
        .collect();
    assert_eq!(
        names,
        [("other", "orders"), ("shop", "orders"), ("shop", "users")]
    );
    let orders = &views[1];
    assert_eq!(orders.last_success.as_ref().unwrap().name, "tuesday");
    assert_eq!(
        orders.last_success.as_ref().unwrap().at,
        Some(now() + k8s_openapi::jiff::SignedDuration::from_secs(110))
    );
    let newer = orders.last_backup.as_ref().expect("the newer failure");
    assert_eq!(
        (
            newer.name.as_str(),
            newer.phase.as_str(),
            newer.reason.as_deref()
        ),
        ("wednesday", "Failed", Some("ToolFailed"))
    );
    assert_eq!(orders.running.len(), 1);
    assert_eq!(orders.running[0].progress, "1.0 KiB / 4.0 KiB (25%)");
    assert!(orders.restoring.is_empty());
    // The other namespace's Cluster of the same name has its own.
    assert_eq!(views[0].last_success.as_ref().unwrap().name, "elsewhere");
    // users: its newest ended Backup is its last success (not repeated); one Restore runs.
    let users = &views[2];
    assert_eq!(users.last_success.as_ref().unwrap().name, "u1");
    assert_eq!(users.last_backup, None);
    assert_eq!(users.restoring.len(), 1);
    assert_eq!(users.restoring[0].volumes, "1/2 volumes verified");
    assert_eq!(users.restoring[0].reason.as_deref(), Some("Verifying"));
    let text = crate::status_text(&views, Some(&[]), now());
    assert!(
        text.contains("tuesday (0s ago)"),
        "a time ahead of the clock is no negative age: {text}"
    );
    assert!(text.contains("wednesday"), "{text}");
    assert!(
        text.contains("r1 Running (Verifying) 1/2 volumes verified"),
        "{text}"
    );
}

#[test]
fn nodes_say_which_agents_do_not_report_and_what_runs_there() {
    let agent = |name: &str, status: Value| -> NodeAgent {
        serde_json::from_value(
            json!({"apiVersion": "custody.io/v1alpha1", "kind": "NodeAgent",
            "metadata": {"name": name}, "spec": {"nodeName": name}, "status": status}),
        )
        .unwrap()
    };
    let agents = [
        agent(
            "b",
            json!({"conditions": [ready("False", "HeartbeatMissed")],
                   "lastHeartbeatTime": at(-600)}),
        ),
        agent(
            "a",
            json!({"conditions": [ready("True", "HeartbeatReceived")],
                   "volumes": {"pending": 0, "restoring": 1, "verifying": 0, "verified": 3, "failed": 0},
                   "movers": [{"namespace": "shop", "podName": "orders-backup-x", "podUid": "u",
                               "jobName": "j", "ownerUid": "o", "operation": "backup",
                               "volume": "data", "bytesDone": 50, "bytesTotal": 200,
                               "filesDone": 1, "bytesSent": 10}],
                   "agentVersion": "0.1.0", "clockOffset": "+1.0ms"}),
        ),
        agent("c", json!({})),
    ];
    let views = nodes(&agents);
    assert_eq!(
        views
            .iter()
            .map(|view| view.node.as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    assert_eq!(views[0].ready, "True");
    assert_eq!(views[0].reason, None);
    assert_eq!(
        views[0].volumes,
        BTreeMap::from([("restoring".to_string(), 1), ("verified".to_string(), 3)])
    );
    assert_eq!(views[0].movers, ["backup shop/orders-backup-x data 25%"]);
    assert_eq!(
        (views[1].ready.as_str(), views[1].reason.as_deref()),
        ("False", Some("HeartbeatMissed"))
    );
    assert_eq!(views[2].ready, "Unknown");
    let text = crate::status_text(&[], Some(&views), now());
    assert!(
        text.contains(
            "Node agents: 1 reporting, not reporting: b (HeartbeatMissed), c (no report)"
        ),
        "{text}"
    );
}

fn pod(init: Option<Value>, claims: &[&str]) -> Pod {
    let mut spec = json!({"nodeName": "node-1", "containers": [{"name": "db"}],
        "volumes": claims.iter().map(|claim| json!({"name": claim, "persistentVolumeClaim": {"claimName": claim}})).collect::<Vec<_>>()});
    let mut status = json!({});
    if let Some(state) = init {
        spec["initContainers"] = json!([{"name": WAIT_CONTAINER}]);
        status["initContainerStatuses"] = json!([{"name": WAIT_CONTAINER, "ready": false,
            "restartCount": 0, "image": "i", "imageID": "", "state": state}]);
    }
    serde_json::from_value(json!({"metadata": {"name": "shop-0", "namespace": "shop",
                                   "labels": {custody_proto::names::LABEL_CLUSTER: "shop"}},
        "spec": spec, "status": status}))
    .unwrap()
}

#[test]
fn why_says_whether_a_pod_is_held_and_by_which_volumes() {
    let running = json!({"running": {}});
    let writing = restore(
        "shop",
        "shop",
        0,
        json!({"phase": "Running", "conditions": [ready("False", "Restoring")],
               "volumes": [
                   {"claimName": "data-shop-0", "state": "Verifying", "attempts": 1, "nodeName": "node-1",
                    "reason": "Hashing", "jobName": "restore-data-shop-0",
                    "transfer": {"summary": "", "bytesDone": 1024, "bytesTotal": 2048, "filesDone": 1}},
                   {"claimName": "wal-shop-0", "state": "Verified", "attempts": 1},
                   {"claimName": "data-shop-1", "state": "Pending", "attempts": 0}]}),
    );
    let old = restore(
        "old",
        "shop",
        -1000,
        json!({"phase": "Completed", "volumes": [{"claimName": "data-shop-0", "state": "Verified", "attempts": 1}]}),
    );
    let restores = [old.clone(), writing.clone()];
    // (the pod's custody-wait state, its claims, restores, the verdict's start, volumes shown)
    type Case<'a> = (Option<Value>, Vec<&'a str>, Vec<Restore>, &'a str, usize);
    let cases: Vec<Case> = vec![
        (None, vec!["data-shop-0"], restores.to_vec(), "not held", 1),
        (
            Some(json!({"terminated": {"exitCode": 0}})),
            vec!["data-shop-0"],
            restores.to_vec(),
            "released",
            1,
        ),
        (
            Some(running.clone()),
            vec!["data-shop-0", "wal-shop-0", "scratch"],
            restores.to_vec(),
            "held by custody-wait until its volume is verified: data-shop-0 Verifying (Hashing)",
            2,
        ),
        (
            Some(running.clone()),
            vec!["wal-shop-0"],
            vec![writing.clone()],
            "held by custody-wait, though every volume is verified",
            1,
        ),
        (
            Some(running.clone()),
            vec!["data-other-0"],
            restores.to_vec(),
            "held by custody-wait: Restore shop (Running) has not reached its volumes yet",
            0,
        ),
        (
            Some(running.clone()),
            vec!["data-shop-0"],
            vec![],
            "held by custody-wait, and no Restore writes its claims",
            0,
        ),
        // Only a finished Restore writes it: that one is shown.
        (
            Some(running.clone()),
            vec!["data-shop-0"],
            vec![old.clone()],
            "held by custody-wait, though every volume is verified",
            1,
        ),
        // A new Restore of its Cluster that lists no volume yet is the one that holds it, not
        // an older finished one.
        (
            Some(running.clone()),
            vec!["data-shop-0"],
            vec![
                old.clone(),
                restore("fresh", "shop", 10, json!({"phase": "Pending"})),
            ],
            "held by custody-wait: Restore fresh (Pending) has not reached its volumes yet",
            0,
        ),
    ];
    for (index, (state, claims, restores, verdict, shown)) in cases.into_iter().enumerate() {
        let why = why(&pod(state, &claims), &restores);
        assert!(
            why.verdict.starts_with(verdict),
            "case {index}: {}",
            why.verdict
        );
        assert_eq!(why.volumes.len(), shown, "case {index}: {why:?}");
    }
    let why = why(&pod(Some(running), &["data-shop-0", "scratch"]), &restores);
    assert_eq!(
        why.restore.as_ref().unwrap().name,
        "shop",
        "the unfinished Restore, not the old one"
    );
    assert_eq!(why.restore_message.as_deref(), Some("Restoring message"));
    assert_eq!(why.unrestored_claims, ["scratch"]);
    assert_eq!(why.volumes[0].progress, "1.0 KiB / 2.0 KiB (50%)");
    assert_eq!(why.volumes[0].job.as_deref(), Some("restore-data-shop-0"));
    let text = crate::why_text(&why);
    assert!(
        text.starts_with("Pod shop/shop-0 on node node-1: held by custody-wait"),
        "{text}"
    );
    assert!(
        text.contains("data-shop-0   Verifying   node-1   Hashing   1.0 KiB / 2.0 KiB (50%)   1"),
        "{text}"
    );
    assert!(text.contains("Claims no Restore writes: scratch"), "{text}");
}

#[test]
fn a_backup_from_a_plan_is_made_as_the_plans_runs_are() {
    let plan: custody_kube::api::BackupPlan = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan",
        "metadata": {"name": "nightly", "namespace": "shop", "uid": "plan-uid"},
        "spec": {"clusterRef": {"name": "orders"}, "schedule": "0 1 * * *",
                 "repositoryRef": {"name": "vault"}, "consistency": {"method": "Freeze"}}}))
    .unwrap();
    let backup = backup_from_plan(&plan, "orders-now");
    assert_eq!(backup["metadata"]["name"], "orders-now");
    assert_eq!(backup["metadata"]["labels"][LABEL_PLAN], "nightly");
    assert_eq!(
        backup["metadata"]["labels"][custody_proto::names::LABEL_PLAN_UID],
        "plan-uid"
    );
    assert_eq!(backup["spec"]["clusterRef"]["name"], "orders");
    assert_eq!(backup["spec"]["repositoryRef"]["name"], "vault");
    assert_eq!(backup["spec"]["consistency"]["method"], "Freeze");
    let _: Backup = serde_json::from_value(backup).expect("a valid Backup");
    assert_eq!(
        crate::backup_name("orders", now()),
        "orders-20261206-120000"
    );
    let long = "x".repeat(300);
    assert_eq!(crate::backup_name(&long, now()).len(), 253);
}

#[test]
fn a_restores_name_is_cut_to_a_valid_name() {
    assert_eq!(crate::restore_name("shop", "nightly"), "shop-from-nightly");
    // Cut at 253 characters where a dash falls: the dash goes too.
    let cluster = "c".repeat(248);
    let name = crate::restore_name(&cluster, "nightly");
    assert_eq!(name, format!("{cluster}-from"));
    let cluster = "c".repeat(246);
    assert_eq!(
        crate::restore_name(&cluster, "b"),
        format!("{cluster}-from-b")
    );
    let cluster = "c".repeat(247);
    assert_eq!(
        crate::restore_name(&cluster, "b"),
        format!("{cluster}-from")
    );
    let cluster = "c".repeat(252);
    assert_eq!(crate::restore_name(&cluster, "b"), cluster);
}
