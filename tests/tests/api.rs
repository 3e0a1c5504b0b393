//! The custody.io API against a real kube-apiserver: the CRDs install, valid objects of every
//! kind are accepted, invalid ones are refused with a message naming the field, and `kubectl
//! get` shows the printer columns.

use custody_kube::api::{Backup, BackupPlan, BackupRepository, Cluster, NodeAgent, Restore};
use custody_tests::{TestNamespace, client, committed_crds, kubectl};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn valid_objects() -> Vec<(ApiResource, Value)> {
    vec![
        (
            ApiResource::erase::<BackupRepository>(&()),
            json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
                "metadata": { "name": "repo" },
                "spec": {
                    "endpoint": "http://127.0.0.1:9000", "bucket": "backups", "prefix": "team-a",
                    "credentialsSecretRef": { "name": "s3-credentials" }, "forcePathStyle": true
                }
            }),
        ),
        (
            ApiResource::erase::<Cluster>(&()),
            json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
                "metadata": { "name": "db" },
                "spec": {
                    "statefulSetRef": { "name": "db" }, "volumeClaimTemplates": ["data"],
                    "repositoryRef": { "name": "repo" }
                }
            }),
        ),
        (
            ApiResource::erase::<Backup>(&()),
            json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
                "metadata": { "name": "db-1" },
                "spec": { "clusterRef": { "name": "db" }, "deletionPolicy": "Retain" }
            }),
        ),
        (
            ApiResource::erase::<BackupPlan>(&()),
            json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan",
                "metadata": { "name": "nightly" },
                "spec": {
                    "clusterRef": { "name": "db" }, "schedule": "0 3 * * *",
                    "startingDeadlineSeconds": 300,
                    "retention": { "keepLast": 7, "maxAge": "720h" }
                }
            }),
        ),
        (
            ApiResource::erase::<Restore>(&()),
            json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
                "metadata": { "name": "db-restore" },
                "spec": {
                    "clusterRef": { "name": "db" }, "backupRef": { "name": "db-1" },
                    "volumeRestorePolicy": "Serial"
                }
            }),
        ),
    ]
}

fn dynamic(namespace: &TestNamespace, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(namespace.client.clone(), &namespace.name, resource)
}

async fn create(api: &Api<DynamicObject>, object: Value) -> Result<DynamicObject, kube::Error> {
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).expect("object"),
    )
    .await
}

/// The API server's refusal of `object`, which must be a 422 naming `field`.
fn assert_refused(result: Result<DynamicObject, kube::Error>, field: &str) -> String {
    match result {
        Ok(object) => panic!("accepted an invalid object: {object:?}"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains(field),
                "message does not name {field}: {}",
                status.message
            );
            status.message.clone()
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[tokio::test]
async fn the_six_crds_install_and_become_established() {
    let api: Api<CustomResourceDefinition> = Api::all(client().await);
    let committed = committed_crds();
    let kinds: Vec<String> = committed
        .iter()
        .map(|crd| crd.spec.names.kind.clone())
        .collect();
    assert_eq!(
        kinds,
        [
            "BackupPlan",
            "BackupRepository",
            "Backup",
            "Cluster",
            "NodeAgent",
            "Restore"
        ],
        "deploy/crds holds one CRD per kind"
    );
    for crd in committed {
        let name = crd.metadata.name.expect("name");
        let live = api
            .get(&name)
            .await
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        let conditions = live
            .status
            .and_then(|status| status.conditions)
            .unwrap_or_default();
        let established = conditions
            .iter()
            .find(|condition| condition.type_ == "Established");
        assert_eq!(
            established.map(|condition| condition.status.as_str()),
            Some("True"),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_valid_object_of_each_kind_is_accepted_and_reads_back() {
    let namespace = TestNamespace::create("valid").await;
    for (resource, object) in valid_objects() {
        let api = dynamic(&namespace, &resource);
        let created = create(&api, object.clone())
            .await
            .unwrap_or_else(|error| panic!("{} refused: {error}", resource.kind));
        let name = created.metadata.name.clone().expect("name");
        let read = api.get(&name).await.expect("read back");
        for (field, value) in object["spec"].as_object().expect("spec") {
            assert_eq!(
                &read.data["spec"][field], value,
                "{}.spec.{field}",
                resource.kind
            );
        }
    }
    // Defaults are applied by the API server.
    let cluster = namespace
        .api::<Cluster>()
        .get("db")
        .await
        .expect("typed read of Cluster");
    assert!(cluster.spec.restore.is_none());
    let backup = namespace
        .api::<Backup>()
        .get("db-1")
        .await
        .expect("typed read of Backup");
    assert_eq!(
        backup.spec.deletion_policy,
        custody_kube::api::DeletionPolicy::Retain
    );
    let plan = namespace
        .api::<BackupPlan>()
        .get("nightly")
        .await
        .expect("typed read of BackupPlan");
    assert_eq!(
        plan.spec.concurrency_policy,
        custody_kube::api::ConcurrencyPolicy::Forbid
    );

    // NodeAgent is cluster-scoped.
    let agents: Api<DynamicObject> = Api::all_with(
        namespace.client.clone(),
        &ApiResource::erase::<NodeAgent>(&()),
    );
    let name = format!("{}-node", namespace.name);
    create(
        &agents,
        json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "NodeAgent",
            "metadata": { "name": name }, "spec": { "nodeName": name }
        }),
    )
    .await
    .expect("NodeAgent accepted");
    let read: NodeAgent = Api::all(namespace.client.clone())
        .get(&name)
        .await
        .expect("read back");
    assert_eq!(read.spec.node_name, name);
    agents
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete NodeAgent");
    namespace.delete().await;
}

#[tokio::test]
async fn invalid_objects_are_refused_with_the_field_named() {
    let namespace = TestNamespace::create("invalid").await;
    let clusters = dynamic(&namespace, &ApiResource::erase::<Cluster>(&()));
    let restores = dynamic(&namespace, &ApiResource::erase::<Restore>(&()));
    let plans = dynamic(&namespace, &ApiResource::erase::<BackupPlan>(&()));
    let backups = dynamic(&namespace, &ApiResource::erase::<Backup>(&()));
    let repositories = dynamic(&namespace, &ApiResource::erase::<BackupRepository>(&()));

    // A Restore without backupRef.
    assert_refused(
        create(
            &restores,
            json!({ "apiVersion": "custody.io/v1alpha1", "kind": "Restore", "metadata": { "name": "r" },
                    "spec": { "clusterRef": { "name": "db" } } }),
        )
        .await,
        "spec.backupRef",
    );

    // A bad enum value.
    let message = assert_refused(
        create(
            &restores,
            json!({ "apiVersion": "custody.io/v1alpha1", "kind": "Restore", "metadata": { "name": "r" },
                    "spec": { "clusterRef": { "name": "db" }, "backupRef": { "name": "b" },
                              "volumeRestorePolicy": "Sideways" } }),
        )
        .await,
        "spec.volumeRestorePolicy",
    );
    assert!(
        message.contains("Parallel") && message.contains("Serial"),
        "{message}"
    );
    assert_refused(
        create(
            &backups,
            json!({ "apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": { "name": "b" },
                    "spec": { "clusterRef": { "name": "db" }, "deletionPolicy": "Shred" } }),
        )
        .await,
        "spec.deletionPolicy",
    );

    // Bounds.
    assert_refused(
        create(
            &plans,
            json!({ "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan", "metadata": { "name": "p" },
                    "spec": { "clusterRef": { "name": "db" }, "schedule": "0 3 * * *",
                              "retention": { "keepLast": 0 } } }),
        )
        .await,
        "spec.retention.keepLast",
    );
    assert_refused(
        create(
            &plans,
            json!({ "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan", "metadata": { "name": "p" },
                    "spec": { "clusterRef": { "name": "db" }, "schedule": "0 3 * * *",
                              "startingDeadlineSeconds": 0 } }),
        )
        .await,
        "spec.startingDeadlineSeconds",
    );
    assert_refused(
        create(
            &plans,
            json!({ "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan", "metadata": { "name": "p" },
                    "spec": { "clusterRef": { "name": "db" }, "schedule": "0 3 * * *", "retention": {} } }),
        )
        .await,
        "spec.retention",
    );
    assert_refused(
        create(
            &repositories,
            json!({ "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository", "metadata": { "name": "x" },
                    "spec": { "endpoint": "s3.example.com", "bucket": "backups",
                              "credentialsSecretRef": { "name": "s" } } }),
        )
        .await,
        "spec.endpoint",
    );
    // Keys or a web identity: exactly one.
    for signer in [
        json!({}),
        json!({ "credentialsSecretRef": { "name": "s" },
                "webIdentity": { "serviceAccountName": "backups", "roleArn": "arn:r" } }),
    ] {
        let mut spec = json!({ "endpoint": "https://s3.example.com", "bucket": "backups" });
        spec.as_object_mut()
            .unwrap()
            .extend(signer.as_object().unwrap().clone());
        let message = assert_refused(
            create(
                &repositories,
                json!({ "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
                        "metadata": { "name": "x" }, "spec": spec }),
            )
            .await,
            "set exactly one of credentialsSecretRef (keys in a Secret) and webIdentity",
        );
        assert!(message.contains("spec"), "{message}");
    }
    assert_refused(
        create(
            &repositories,
            json!({ "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository", "metadata": { "name": "x" },
                    "spec": { "endpoint": "https://s3.example.com", "bucket": "backups",
                              "webIdentity": { "serviceAccountName": "backups", "roleArn": "arn:r",
                                               "stsEndpoint": "sts.example.com" } } }),
        )
        .await,
        "spec.webIdentity.stsEndpoint",
    );

    // Cluster.spec.restore is immutable once set, and cannot be added later.
    let restored = json!({ "apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": { "name": "restored" },
        "spec": { "statefulSetRef": { "name": "db" }, "volumeClaimTemplates": ["data"],
                  "restore": { "backupRef": { "name": "db-1" } } } });
    create(&clusters, restored)
        .await
        .expect("Cluster with restore accepted");
    let change = json!({ "spec": { "restore": { "backupRef": { "name": "db-2" } } } });
    let changed = clusters
        .patch("restored", &PatchParams::default(), &Patch::Merge(&change))
        .await;
    assert_refused(changed, "spec.restore");
    let remove = json!({ "spec": { "restore": null } });
    let removed = clusters
        .patch("restored", &PatchParams::default(), &Patch::Merge(&remove))
        .await;
    assert_refused(removed, "spec.restore");

    let plain = json!({ "apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": { "name": "plain" },
        "spec": { "statefulSetRef": { "name": "db" }, "volumeClaimTemplates": ["data"] } });
    create(&clusters, plain)
        .await
        .expect("Cluster without restore accepted");
    let add = json!({ "spec": { "restore": { "backupRef": { "name": "db-1" } } } });
    let added = clusters
        .patch("plain", &PatchParams::default(), &Patch::Merge(&add))
        .await;
    assert_refused(added, "spec.restore");
    // Other fields of the spec stay editable.
    let edit = json!({ "spec": { "repositoryRef": { "name": "repo" } } });
    clusters
        .patch("restored", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("editing another field of a restored Cluster");

    // Restore.spec.backupRef is immutable.
    create(
        &restores,
        json!({ "apiVersion": "custody.io/v1alpha1", "kind": "Restore", "metadata": { "name": "r" },
                "spec": { "clusterRef": { "name": "db" }, "backupRef": { "name": "b" } } }),
    )
    .await
    .expect("valid Restore accepted");
    let repoint = json!({ "spec": { "backupRef": { "name": "other" } } });
    let repointed = restores
        .patch("r", &PatchParams::default(), &Patch::Merge(&repoint))
        .await;
    assert_refused(repointed, "spec.backupRef");

    // Nothing invalid was stored.
    let names: Vec<String> = restores
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|object| object.metadata.name)
        .collect();
    assert_eq!(names, ["r"]);
    let stored = restores.get("r").await.expect("get");
    assert_eq!(stored.data["spec"]["backupRef"]["name"], "b");
    namespace.delete().await;
}

/// spec.consistency: each method's settings only with that method, and each method with the
/// settings it needs; paths and quantities checked by CEL; refused with what to fix (422).
#[tokio::test]
async fn a_consistency_method_is_refused_with_settings_it_does_not_take_or_without_those_it_needs()
{
    let namespace = TestNamespace::create("consistency").await;
    let backups = dynamic(&namespace, &ApiResource::erase::<Backup>(&()));
    let backup = |name: &str, consistency: Value| {
        json!({ "apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": { "name": name },
                "spec": { "clusterRef": { "name": "db" }, "consistency": consistency } })
    };
    let tool = json!({"image": "postgres:15", "command": ["pg_basebackup"]});
    let pre = json!({"pre": {"command": ["sync"]}});
    let rows: [(Value, &str); 10] = [
        (
            json!({"method": "CrashUnsafe", "maxFreezeSeconds": 30}),
            "maxFreezeSeconds applies to method Freeze only",
        ),
        (
            json!({"method": "Freeze", "maxFreezeSeconds": 601}),
            "spec.consistency.maxFreezeSeconds",
        ),
        (json!({"method": "Tool"}), "method Tool needs tool"),
        (
            json!({"method": "Freeze", "tool": tool}),
            "tool applies to method Tool only",
        ),
        (json!({"method": "Hooks"}), "method Hooks needs hooks"),
        (
            json!({"method": "Tool", "tool": tool, "hooks": pre}),
            "hooks apply to method Hooks only",
        ),
        (
            json!({"method": "Tool", "tool": {"image": "i", "command": ["c"], "dataPath": "../etc"}}),
            "dataPath is a relative path",
        ),
        (
            json!({"method": "Tool", "tool": {"image": "i", "command": ["c"], "mountPath": "data"}}),
            "mountPath is an absolute path",
        ),
        (
            json!({"method": "Tool", "tool": {"image": "i", "command": ["c"], "scratchSize": "lots"}}),
            "scratchSize is a positive quantity",
        ),
        (
            json!({"method": "Hooks", "hooks": {"pre": {"command": ["sync"], "onError": "Shrug"}}}),
            "spec.consistency.hooks.pre.onError",
        ),
    ];
    for (consistency, says) in rows {
        let message = assert_refused(
            create(&backups, backup("b", consistency.clone())).await,
            "spec.consistency",
        );
        assert!(message.contains(says), "{consistency}: {message}");
    }
    // And each method with what it needs is accepted.
    for (name, consistency) in [
        (
            "freeze",
            json!({"method": "Freeze", "maxFreezeSeconds": 30}),
        ),
        (
            "tool",
            json!({"method": "Tool", "tool": {"image": "i", "command": ["c"], "dataPath": "pgdata",
                   "mountPath": "/var/lib/mysql", "scratchSize": "2Gi",
                   "credentialsSecretRef": {"name": "s"}}}),
        ),
        (
            "hooks",
            json!({"method": "Hooks", "hooks": {"pre": {"container": "db", "command": ["sync"],
                   "timeoutSeconds": 5, "onError": "Continue"}, "post": {"command": ["true"]}}}),
        ),
        ("unsafe", json!({"method": "CrashUnsafe"})),
    ] {
        create(&backups, backup(name, consistency))
            .await
            .unwrap_or_else(|error| panic!("{name} refused: {error}"));
    }
    namespace.delete().await;
}

#[tokio::test]
async fn kubectl_get_shows_the_printer_columns() {
    let namespace = TestNamespace::create("columns").await;
    for (resource, object) in valid_objects() {
        create(&dynamic(&namespace, &resource), object)
            .await
            .expect("create");
    }
    let expected: [(&str, &[&str]); 5] = [
        (
            "backuprepositories",
            &[
                "NAME", "ENDPOINT", "BUCKET", "READY", "REASON", "CHECKED", "AGE",
            ],
        ),
        (
            "clusters",
            &[
                "NAME",
                "PHASE",
                "STATEFULSET",
                "RESTORED FROM",
                "READY",
                "AGE",
            ],
        ),
        (
            "backups",
            &[
                "NAME",
                "CLUSTER",
                "PHASE",
                "PROGRESS",
                "SIZE",
                "NODE",
                "CONSISTENCY",
                "COMPLETED",
                "AGE",
            ],
        ),
        (
            "backupplans",
            &[
                "NAME",
                "CLUSTER",
                "SCHEDULE",
                "SUSPEND",
                "LAST SCHEDULE",
                "LAST DRILL",
                "AGE",
            ],
        ),
        (
            "restores",
            &[
                "NAME",
                "CLUSTER",
                "BACKUP",
                "PHASE",
                "PROGRESS",
                "TRANSFERRED",
                "AGE",
            ],
        ),
    ];
    for (plural, columns) in expected {
        let output = kubectl(&[
            "get",
            &format!("{plural}.custody.io"),
            "-n",
            &namespace.name,
        ]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{plural}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let header: Vec<&str> = stdout
            .lines()
            .next()
            .expect("header line")
            .split("  ")
            .map(str::trim)
            .filter(|cell| !cell.is_empty())
            .collect();
        assert_eq!(header, columns, "{plural}:\n{stdout}");
        assert_eq!(
            stdout.lines().count(),
            2,
            "{plural} lists the one object:\n{stdout}"
        );
    }
    let output = kubectl(&[
        "get",
        "clusters.custody.io",
        "db",
        "-n",
        &namespace.name,
        "--no-headers",
    ]);
    let row = String::from_utf8_lossy(&output.stdout);
    assert!(
        row.split_whitespace().any(|cell| cell == "db"),
        "StatefulSet column: {row}"
    );

    // NodeAgent, cluster-scoped, by its short name.
    let name = format!("{}-node", namespace.name);
    let agents: Api<NodeAgent> = Api::all(namespace.client.clone());
    agents
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "NodeAgent",
                "metadata": { "name": name }, "spec": { "nodeName": name }
            }))
            .expect("NodeAgent"),
        )
        .await
        .expect("create NodeAgent");
    let output = kubectl(&["get", "na", &name]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let header = stdout.lines().next().unwrap_or_default();
    for column in [
        "NAME",
        "NODE",
        "READY",
        "CLOCK OFFSET",
        "PENDING",
        "VERIFYING",
        "VERIFIED",
        "FAILED",
        "HEARTBEAT",
    ] {
        assert!(
            header.contains(column),
            "nodeagents lacks {column}:\n{stdout}"
        );
    }
    assert!(
        !header.contains("VERSION"),
        "Version is a -o wide column:\n{stdout}"
    );
    let wide = kubectl(&["get", "na", &name, "-o", "wide"]);
    assert!(String::from_utf8_lossy(&wide.stdout).contains("VERSION"));
    agents
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete NodeAgent");
    namespace.delete().await;
}

/// Issue 25 item 4: every YAML block of the README's "Each kind, in YAML" is accepted by the
/// API server as it stands (server-side dry run: the CRDs' schema and CEL rules judge it).
#[tokio::test]
async fn the_readmes_yaml_of_each_kind_is_accepted_by_the_api_server() {
    let namespace = TestNamespace::create("readme").await;
    let readme = std::fs::read_to_string(custody_tests::repo_root().join("README.md")).unwrap();
    let start = readme
        .find("## Each kind, in YAML")
        .expect("the README's section");
    let section = &readme[start..];
    let section = &section[..section[3..]
        .find("\n## ")
        .map_or(section.len(), |end| end + 3)];
    let blocks: Vec<&str> = section
        .split("```yaml\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap())
        .collect();
    assert!(blocks.len() >= 6, "{} blocks", blocks.len());
    let scratch = tempfile::tempdir().unwrap();
    for (index, block) in blocks.iter().enumerate() {
        let path = scratch.path().join(format!("{index}.yaml"));
        std::fs::write(&path, block).unwrap();
        let output = kubectl(&[
            "apply",
            "--dry-run=server",
            "-n",
            &namespace.name,
            "-f",
            path.to_str().unwrap(),
        ]);
        assert!(
            output.status.success(),
            "block {index} refused:\n{block}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
