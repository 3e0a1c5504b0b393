//! Issue 23: custody is never a way around RBAC. Against the real API server and the real
//! controller with its validating webhook registered for the test's namespace: a tenant's
//! Backup, BackupPlan, Cluster or BackupRepository that would make custody do what the tenant
//! may not do itself (exec a hook, run a tool with a Secret, read a repository's credentials,
//! hold another StatefulSet's pods) is refused at admission, naming what is missing; the same
//! object is admitted once the tenant holds the permission, and an update that leaves the spec
//! alone is not asked again.

use std::time::Duration;

use custody_kube::api::{Backup, BackupPlan, BackupRepository, Cluster};
use custody_proto::names;
use custody_tests::agent::{CONTROLLER_NAME, ControllerProcess};
use custody_tests::pki::Pki;
use custody_tests::{TestNamespace, eventually, free_port, tenant};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

/// The controller with only its webhook of interest here: the requester check, registered for
/// `namespace` alone.
async fn controller(namespace: &TestNamespace) -> (ControllerProcess, String, Pki) {
    let client = namespace.client.clone();
    let ns = &namespace.name;
    let port = free_port();
    let configuration = format!("custody-requester-{ns}");
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let _ = configurations
        .delete(&configuration, &DeleteParams::default())
        .await;
    configurations
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": configuration},
                "webhooks": [{
                    "name": "requester.custody.io",
                    "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate-requester")},
                    "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["custody.io"],
                               "apiVersions": ["v1alpha1"],
                               "resources": ["backups", "backupplans", "clusters", "backuprepositories", "restores"]}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 10,
                }],
            }))
            .unwrap(),
        )
        .await
        .expect("registering the webhook");
    let pki = Pki::new(&[CONTROLLER_NAME, names::AGENT_SERVER_NAME]);
    let process = ControllerProcess::start_as(
        ns,
        &pki,
        &[
            format!("--webhook-address=127.0.0.1:{port}"),
            format!("--webhook-configuration=custody-{ns}-no-gate"),
            format!("--validating-webhook-configuration={configuration}"),
            format!("--webhook-secret={ns}/custody-webhook-tls"),
            "--webhook-names=127.0.0.1".to_string(),
            format!("--agent-service-account={ns}:custody-agent"),
        ],
        custody_tests::control_plane(),
    );
    eventually("the webhook's caBundle", TIMEOUT, || {
        let configurations = configurations.clone();
        let configuration = configuration.clone();
        async move {
            let found = configurations
                .get(&configuration)
                .await
                .map_err(|error| error.to_string())?;
            match found.webhooks.unwrap_or_default().first() {
                Some(webhook) if webhook.client_config.ca_bundle.is_some() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    (process, configuration, pki)
}

/// Creates `value` as `client`; the API server's refusal message, if refused.
async fn refusal<K>(
    client: &kube::Client,
    namespace: &str,
    value: serde_json::Value,
) -> Option<String>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let object: K = serde_json::from_value(value).expect("object");
    match Api::<K>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
    {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.message),
        Err(error) => panic!("creating: {error}"),
    }
}

#[tokio::test]
async fn a_tenant_cannot_make_custody_do_what_it_may_not_do_itself() {
    let namespace = TestNamespace::create("tenants").await;
    let ns = namespace.name.clone();
    let (_controller, configuration, _pki) = controller(&namespace).await;
    // May write custody's kinds and update StatefulSet orders; nothing else.
    let writer = tenant(
        &namespace,
        "writer",
        json!([
            {"apiGroups": ["custody.io"], "resources": ["backups", "backupplans", "clusters", "backuprepositories", "restores"],
             "verbs": ["get", "list", "watch", "create", "update", "patch"]},
            {"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": ["orders"],
             "verbs": ["get", "update"]},
        ]),
    )
    .await;
    let user = format!("system:serviceaccount:{ns}:writer");
    let backup = |name: &str, consistency: serde_json::Value| {
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": name},
               "spec": {"clusterRef": {"name": "orders"}, "consistency": consistency}})
    };
    let token_hook = json!({"method": "Hooks", "hooks": {"pre": {"command":
        ["cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"]}}});
    let tool = json!({"method": "Tool", "tool": {"image": "postgres:15", "command": ["pg_basebackup"],
        "credentialsSecretRef": {"name": "db-admin"}}});

    // Refused, each naming the permission and the writer.
    let cases: Vec<(&str, Option<String>, Vec<&str>)> = vec![
        (
            "a hook that prints the pod's token",
            refusal::<Backup>(&writer, &ns, backup("exfiltrate", token_hook.clone())).await,
            vec!["create pods/exec", "its hooks run commands"],
        ),
        (
            "a tool with another's Secret",
            refusal::<Backup>(&writer, &ns, backup("tool", tool.clone())).await,
            vec!["create pods (its tool runs image postgres:15", "get secrets db-admin"],
        ),
        (
            "a Backup into a repository of the writer's choosing",
            refusal::<Backup>(&writer, &ns, json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "to-mine"},
                "spec": {"clusterRef": {"name": "orders"}, "repositoryRef": {"name": "mine"}}})).await,
            vec!["create pods (it copies the Cluster's volumes into repository mine"],
        ),
        (
            "a plan with hooks",
            refusal::<BackupPlan>(&writer, &ns, json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan", "metadata": {"name": "nightly"},
                "spec": {"clusterRef": {"name": "orders"}, "schedule": "0 3 * * *", "consistency": token_hook}})).await,
            vec!["create pods/exec"],
        ),
        (
            "a Cluster of a StatefulSet it may not change",
            refusal::<Cluster>(&writer, &ns, json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "payroll"},
                "spec": {"statefulSetRef": {"name": "payroll"}, "volumeClaimTemplates": ["data"]}})).await,
            vec!["update statefulsets.apps payroll"],
        ),
        (
            "a repository with credentials it may not read",
            refusal::<BackupRepository>(&writer, &ns, json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository", "metadata": {"name": "elsewhere"},
                "spec": {"endpoint": "https://attacker.example", "bucket": "loot",
                         "credentialsSecretRef": {"name": "production-s3"},
                         "encryption": {"keySecretRef": {"name": "production-keys"}}}})).await,
            vec!["get secrets production-s3", "get secrets production-keys", "https://attacker.example"],
        ),
        (
            "a repository signing with the tokens of a ServiceAccount it may not ask for",
            refusal::<BackupRepository>(&writer, &ns, json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository", "metadata": {"name": "borrowed"},
                "spec": {"endpoint": "https://attacker.example", "bucket": "loot",
                         "webIdentity": {"serviceAccountName": "production-backups",
                                         "roleArn": "arn:aws:iam::1:role/production"}}})).await,
            vec!["create serviceaccounts/token production-backups (custody signs its requests to https://attacker.example"],
        ),
        (
            "a plan whose drill would run the application's pod template and a check with another's Secret",
            refusal::<BackupPlan>(&writer, &ns, json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan", "metadata": {"name": "drilled"},
                "spec": {"clusterRef": {"name": "orders"}, "schedule": "0 3 * * *",
                         "consistency": {"method": "Freeze"},
                         "drill": {"schedule": "0 4 * * 0", "check": {"command": ["env"],
                                   "credentialsSecretRef": {"name": "db-admin"}}}}})).await,
            vec!["create statefulsets.apps (its drill runs a copy", "create pods (its drill's engine check",
                 "get secrets db-admin"],
        ),
        (
            "a plan whose drill restores into another tenant's namespace",
            refusal::<BackupPlan>(&writer, &ns, json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan", "metadata": {"name": "drilled-there"},
                "spec": {"clusterRef": {"name": "orders"}, "schedule": "0 3 * * *",
                         "consistency": {"method": "Freeze"},
                         "drill": {"schedule": "0 4 * * 0", "namespace": "kube-system",
                                   "repositoryRef": {"name": "store"},
                                   "check": {"command": ["true"]}}}})).await,
            vec!["create statefulsets.apps in namespace kube-system", "create clusters.custody.io in namespace kube-system",
                 "get secrets (its drill restores the Cluster's data in namespace kube-system"],
        ),
    ];
    for (case, refused, expected) in cases {
        let message = refused.unwrap_or_else(|| panic!("{case}: admitted"));
        for part in expected.iter().chain([&user.as_str()]) {
            assert!(message.contains(part), "{case}: {part:?} not in {message}");
        }
    }
    // Nothing of them was written.
    let backups: Api<Backup> = namespace.api();
    for name in ["exfiltrate", "tool", "to-mine"] {
        assert!(
            backups.get_opt(name).await.unwrap().is_none(),
            "Backup {name}"
        );
    }
    let plans: Api<BackupPlan> = namespace.api();
    assert!(plans.get_opt("nightly").await.unwrap().is_none());
    let clusters: Api<Cluster> = namespace.api();
    assert!(clusters.get_opt("payroll").await.unwrap().is_none());
    let repositories: Api<BackupRepository> = namespace.api();
    assert!(repositories.get_opt("elsewhere").await.unwrap().is_none());

    // Admitted: what needs nothing, and what the writer may do.
    assert_eq!(
        refusal::<Cluster>(
            &writer,
            &ns,
            json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "orders"},
            "spec": {"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"]}})
        )
        .await,
        None
    );
    assert_eq!(
        refusal::<Backup>(&writer, &ns, backup("frozen", json!({"method": "Freeze"}))).await,
        None
    );
    // A Restore writes the volumes of its Cluster's StatefulSet: only the writer's own.
    let restore = |name: &str, cluster: &str| {
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Restore", "metadata": {"name": name},
               "spec": {"clusterRef": {"name": cluster}, "backupRef": {"name": "frozen"}}})
    };
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "payroll"},
                "spec": {"statefulSetRef": {"name": "payroll"}, "volumeClaimTemplates": ["data"]}}))
            .unwrap(),
        )
        .await
        .expect("the namespace's admin creates Cluster payroll");
    let refused =
        refusal::<custody_kube::api::Restore>(&writer, &ns, restore("overwrite", "payroll"))
            .await
            .expect("a Restore into another's StatefulSet is refused");
    assert!(
        refused.contains("update statefulsets.apps payroll (custody writes the volumes"),
        "{refused}"
    );
    assert_eq!(
        refusal::<custody_kube::api::Restore>(&writer, &ns, restore("own", "orders")).await,
        None
    );
    // Restoring another Cluster's Backup into its own is reading that Cluster's data: the
    // writer must be able to open that Backup's repository itself.
    repositories
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository", "metadata": {"name": "payroll-repo"},
                "spec": {"endpoint": "https://s3.example", "bucket": "payroll",
                         "credentialsSecretRef": {"name": "payroll-s3"},
                         "encryption": {"keySecretRef": {"name": "payroll-keys"}}}}))
            .unwrap(),
        )
        .await
        .expect("the namespace's admin creates payroll's repository");
    backups
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": "payroll-nightly"},
                "spec": {"clusterRef": {"name": "payroll"}, "repositoryRef": {"name": "payroll-repo"}}}))
            .unwrap(),
        )
        .await
        .expect("the namespace's admin backs payroll up");
    let restore_from = |name: &str, backup: &str| {
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Restore", "metadata": {"name": name},
               "spec": {"clusterRef": {"name": "orders"}, "backupRef": {"name": backup}}})
    };
    let refused = refusal::<custody_kube::api::Restore>(
        &writer,
        &ns,
        restore_from("steal", "payroll-nightly"),
    )
    .await
    .expect("a Restore of another Cluster's Backup is refused");
    for part in [
        "get secrets payroll-s3 (it restores the data of Cluster payroll",
        "get secrets payroll-keys",
        user.as_str(),
    ] {
        assert!(refused.contains(part), "{part:?} not in {refused}");
    }
    assert!(!refused.contains("statefulsets"), "{refused}");
    // The same through a Cluster whose spec.restore names that Backup (custody then creates
    // the Restore itself).
    let refused = refusal::<Cluster>(
        &writer,
        &ns,
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "orders-copy"},
               "spec": {"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"],
                        "restore": {"backupRef": {"name": "payroll-nightly"}}}}),
    )
    .await
    .expect("a Cluster restoring another Cluster's Backup is refused");
    assert!(
        refused.contains("get secrets payroll-s3 (it restores the data of Cluster payroll"),
        "{refused}"
    );
    let refused =
        refusal::<custody_kube::api::Restore>(&writer, &ns, restore_from("later", "not-yet"))
            .await
            .expect("a Restore of a Backup not there yet is refused");
    assert!(
        refused.contains(
            "get secrets (it restores a Backup whose data and repository are not known yet)"
        ),
        "{refused}"
    );
    let bindings: Api<RoleBinding> = namespace.api();
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "writer-may-exec"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": "writer", "namespace": ns}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    eventually(
        "the hooked Backup admitted once the writer may exec",
        TIMEOUT,
        || {
            let (writer, ns) = (writer.clone(), ns.clone());
            let token_hook = backup(
                "hooked",
                json!({"method": "Hooks", "hooks": {"pre": {"command": ["sync"]}}}),
            );
            async move {
                match refusal::<Backup>(&writer, &ns, token_hook).await {
                    None => Ok(()),
                    Some(message) => Err(message),
                }
            }
        },
    )
    .await;

    // Its right taken away again, the writer may still label what it wrote: the spec is as it was.
    bindings
        .delete("writer-may-exec", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "a label on the hooked Backup, the writer's exec right gone",
        TIMEOUT,
        || {
            let (writer, ns) = (writer.clone(), ns.clone());
            async move {
                // The right is gone first (RBAC is read from a cache): a new hooked Backup is refused.
                if refusal::<Backup>(
                    &writer,
                    &ns,
                    backup(
                        "hooked-again",
                        json!({"method": "Hooks", "hooks": {"pre": {"command": ["sync"]}}}),
                    ),
                )
                .await
                .is_none()
                {
                    return Err("the writer may still exec".to_string());
                }
                Api::<Backup>::namespaced(writer, &ns)
                    .patch(
                        "hooked",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": {"team": "orders"}}})),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|error| error.to_string())
            }
        },
    )
    .await;

    let _ = Api::<ValidatingWebhookConfiguration>::all(namespace.client.clone())
        .delete(&configuration, &DeleteParams::default())
        .await;
    namespace.delete().await;
}

/// Issue 23: the people who use custody get its objects through Kubernetes' own roles, as
/// `deploy/roles.yaml` aggregates them: `view` reads, `edit` and `admin` also write, and none of
/// them writes any `*/status` (custody's alone) or NodeAgents (the agents'). Asked of the real
/// API server with SubjectAccessReviews, the ClusterRoles aggregated by its controller-manager.
#[tokio::test]
async fn custody_objects_are_read_through_view_and_written_through_edit_never_their_status() {
    use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview};
    let namespace = TestNamespace::create("user-roles").await;
    let ns = namespace.name.clone();
    let _identities = custody_tests::scenario::deployed_identities(&namespace.client).await;
    let bindings: Api<RoleBinding> = namespace.api();
    for (user, role) in [("viewer", "view"), ("editor", "edit"), ("owner", "admin")] {
        bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": user},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
                }))
                .unwrap(),
            )
            .await
            .expect("binding a user");
    }
    let reviews: Api<SubjectAccessReview> = Api::all(namespace.client.clone());
    let rows: Vec<(&str, &str, &str, Option<&str>, bool)> = vec![
        ("viewer", "get", "backups", None, true),
        ("viewer", "list", "restores", None, true),
        ("viewer", "watch", "backuprepositories", None, true),
        ("viewer", "create", "backups", None, false),
        ("viewer", "delete", "restores", None, false),
        ("viewer", "patch", "backups", Some("status"), false),
        ("editor", "create", "backups", None, true),
        ("editor", "delete", "restores", None, true),
        ("editor", "update", "clusters", None, true),
        ("editor", "create", "backupplans", None, true),
        ("editor", "patch", "backuprepositories", None, true),
        ("editor", "patch", "backups", Some("status"), false),
        ("editor", "update", "restores", Some("status"), false),
        ("editor", "patch", "clusters", Some("status"), false),
        ("editor", "patch", "nodeagents", None, false),
        ("owner", "create", "restores", None, true),
        ("owner", "update", "backups", Some("status"), false),
        ("owner", "update", "backupplans", Some("status"), false),
        (
            "owner",
            "update",
            "backuprepositories",
            Some("status"),
            false,
        ),
    ];
    eventually(
        "the aggregated roles to answer as deploy/roles.yaml says",
        TIMEOUT,
        || {
            let (reviews, rows, ns) = (reviews.clone(), rows.clone(), ns.clone());
            async move {
                let mut wrong = Vec::new();
                for (user, verb, resource, subresource, expected) in rows {
                    let allowed = allows(
                        &reviews,
                        user,
                        vec!["system:authenticated".to_string()],
                        ResourceAttributes {
                            namespace: Some(ns.clone()),
                            verb: Some(verb.to_string()),
                            group: Some("custody.io".to_string()),
                            resource: Some(resource.to_string()),
                            subresource: subresource.map(str::to_string),
                            ..ResourceAttributes::default()
                        },
                    )
                    .await?;
                    if allowed != expected {
                        wrong.push(format!(
                            "{user} {verb} {resource}{}: {allowed}",
                            subresource.map(|sub| format!("/{sub}")).unwrap_or_default()
                        ));
                    }
                }
                if wrong.is_empty() {
                    Ok(())
                } else {
                    Err(wrong.join("; "))
                }
            }
        },
    )
    .await;
    namespace.delete().await;
}

/// Whether the API server allows `user` (in `groups`) what `attributes` ask.
async fn allows(
    reviews: &Api<k8s_openapi::api::authorization::v1::SubjectAccessReview>,
    user: &str,
    groups: Vec<String>,
    attributes: k8s_openapi::api::authorization::v1::ResourceAttributes,
) -> Result<bool, String> {
    use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewSpec};
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(groups),
            resource_attributes: Some(attributes),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    Ok(reviews
        .create(&PostParams::default(), &review)
        .await
        .map_err(|error| error.to_string())?
        .status
        .is_some_and(|status| status.allowed))
}

/// One permission asked of the API server for a subject: `(verb, group, resource[/sub],
/// namespace, name)`.
type Permission = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
);

/// Issue 23, least privilege: custody's two ServiceAccounts, with exactly the RBAC of `deploy/`,
/// asked of the real API server with SubjectAccessReviews: every permission a code path of
/// theirs uses is allowed, and each dangerous one of a list is refused (secrets listed or
/// watched, exec without the namespace's consent, ConfigMaps and Leases of other owners,
/// kube-system's and kube-node-lease's objects, RBAC, the agent writing anything). A
/// namespace that binds `custody-hooks` gives the controller `pods/exec` there and nowhere else.
#[tokio::test]
async fn privilege_of_custodys_accounts_is_what_their_code_needs_and_no_more() {
    use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview};
    let namespace = TestNamespace::create("privilege").await;
    let consenting = TestNamespace::create("privilege-hooks").await;
    let _identities = custody_tests::scenario::deployed_identities(&namespace.client).await;
    Api::<RoleBinding>::namespaced(consenting.client.clone(), &consenting.name)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "custody-hooks"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "custody-hooks"},
                "subjects": [{"kind": "ServiceAccount", "name": "custody-controller", "namespace": "custody-system"}],
            }))
            .unwrap(),
        )
        .await
        .expect("the namespace's consent to hooks");
    Api::<RoleBinding>::namespaced(consenting.client.clone(), &consenting.name)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "custody-web-identity"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "custody-web-identity"},
                "subjects": [{"kind": "ServiceAccount", "name": "custody-controller", "namespace": "custody-system"}],
            }))
            .unwrap(),
        )
        .await
        .expect("the namespace's consent to web identities");
    Api::<RoleBinding>::namespaced(consenting.client.clone(), &consenting.name)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "custody-drills"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "custody-drills"},
                "subjects": [{"kind": "ServiceAccount", "name": "custody-controller", "namespace": "custody-system"}],
            }))
            .unwrap(),
        )
        .await
        .expect("the namespace's consent to restore drills");
    // `NS`: a user's namespace; `HOOKS`: one that consented to hooks.
    let (ns, hooks) = (namespace.name.clone(), consenting.name.clone());
    const NS: Option<&str> = Some("NS");
    const HOOKS: Option<&str> = Some("HOOKS");
    const SYSTEM: Option<&str> = Some("custody-system");
    const KUBE: Option<&str> = Some("kube-system");
    const ALL: Option<&str> = None;
    let controller_needs: Vec<Permission> = vec![
        ("watch", "custody.io", "backups", ALL, None),
        ("update", "custody.io", "backups/status", NS, None),
        ("patch", "custody.io", "restores/status", NS, None),
        ("patch", "custody.io", "clusters", NS, None),
        ("patch", "custody.io", "nodeagents/status", ALL, None),
        ("create", "batch", "jobs", NS, None),
        ("patch", "batch", "jobs", NS, None),
        ("delete", "batch", "jobs", NS, None),
        ("watch", "", "pods", ALL, None),
        ("patch", "", "pods/status", NS, None),
        ("patch", "", "persistentvolumeclaims", NS, None),
        ("get", "", "secrets", NS, Some("s3-credentials")),
        ("patch", "", "secrets", NS, Some("s3-credentials")),
        ("create", "", "secrets", NS, None),
        ("get", "", "configmaps", NS, Some("custody-gate-ca")),
        ("create", "", "configmaps", NS, Some("custody-gate-ca")),
        ("patch", "", "configmaps", NS, Some("custody-gate-ca")),
        ("get", "coordination.k8s.io", "leases", SYSTEM, None),
        ("list", "coordination.k8s.io", "leases", SYSTEM, None),
        ("create", "coordination.k8s.io", "leases", SYSTEM, None),
        ("update", "coordination.k8s.io", "leases", SYSTEM, None),
        ("delete", "coordination.k8s.io", "leases", SYSTEM, None),
        ("create", "", "secrets", SYSTEM, None),
        ("update", "", "secrets", SYSTEM, Some("custody-webhook-tls")),
        // custody's CA and its trust bundle (#23 item 5).
        ("get", "", "secrets", SYSTEM, Some("custody-ca")),
        ("update", "", "secrets", SYSTEM, Some("custody-ca")),
        ("patch", "", "configmaps", SYSTEM, Some("custody-ca")),
        ("get", "", "namespaces", ALL, Some("kube-system")),
        // The restore mark only (ValidatingAdmissionPolicy custody-controller-namespaces:
        // `the_controller_changes_nothing_of_a_namespace_but_its_restore_mark`).
        ("patch", "", "namespaces", ALL, None),
        ("list", "", "namespaces", ALL, None),
        ("get", "", "nodes", ALL, None),
        ("list", "", "events", NS, None),
        ("create", "events.k8s.io", "events", NS, None),
        ("watch", "apps", "statefulsets", ALL, None),
        ("create", "authentication.k8s.io", "tokenreviews", ALL, None),
        (
            "create",
            "authorization.k8s.io",
            "subjectaccessreviews",
            ALL,
            None,
        ),
        (
            "patch",
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            ALL,
            Some("custody-restore-gate"),
        ),
        (
            "patch",
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            ALL,
            Some("custody-requester-check"),
        ),
        ("create", "", "pods/exec", HOOKS, None),
        ("get", "", "pods/exec", HOOKS, None),
        // A web identity's tokens, where the namespace bound custody-web-identity.
        (
            "create",
            "",
            "serviceaccounts/token",
            HOOKS,
            Some("backups"),
        ),
        // A restore drill's StatefulSet, where the namespace bound custody-drills.
        ("create", "apps", "statefulsets", HOOKS, None),
        ("delete", "apps", "statefulsets", HOOKS, None),
        // `custody-controller uninstall`, run as the controller's account by the Helm hook.
        (
            "delete",
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            ALL,
            Some("custody-restore-gate"),
        ),
        (
            "patch",
            "apps",
            "deployments/scale",
            SYSTEM,
            Some("custody-controller"),
        ),
    ];
    let controller_refused: Vec<Permission> = vec![
        ("delete", "", "namespaces", ALL, None),
        ("update", "", "namespaces/finalize", ALL, None),
        ("patch", "", "namespaces/status", ALL, None),
        ("list", "", "secrets", ALL, None),
        ("list", "", "secrets", NS, None),
        ("watch", "", "secrets", ALL, None),
        ("list", "", "secrets", KUBE, None),
        ("create", "", "pods/exec", NS, None),
        ("create", "", "pods/exec", KUBE, None),
        ("create", "", "pods", KUBE, None),
        ("delete", "", "pods", NS, None),
        ("patch", "", "configmaps", KUBE, Some("coredns")),
        ("create", "", "configmaps", KUBE, None),
        ("patch", "", "configmaps", NS, Some("app-settings")),
        ("patch", "", "configmaps", SYSTEM, Some("another-config")),
        (
            "update",
            "coordination.k8s.io",
            "leases",
            KUBE,
            Some("kube-scheduler"),
        ),
        (
            "delete",
            "coordination.k8s.io",
            "leases",
            Some("kube-node-lease"),
            None,
        ),
        ("create", "coordination.k8s.io", "leases", NS, None),
        ("update", "coordination.k8s.io", "leases", NS, None),
        ("update", "", "nodes", ALL, None),
        ("delete", "", "persistentvolumeclaims", NS, None),
        (
            "create",
            "rbac.authorization.k8s.io",
            "rolebindings",
            NS,
            None,
        ),
        (
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            ALL,
            None,
        ),
        (
            "bind",
            "rbac.authorization.k8s.io",
            "clusterroles",
            ALL,
            None,
        ),
        (
            "escalate",
            "rbac.authorization.k8s.io",
            "clusterroles",
            ALL,
            None,
        ),
        ("impersonate", "", "serviceaccounts", ALL, None),
        ("patch", "apps", "deployments/scale", KUBE, Some("coredns")),
        (
            "patch",
            "apps",
            "deployments",
            SYSTEM,
            Some("another-deployment"),
        ),
        ("create", "", "serviceaccounts/token", KUBE, None),
        // StatefulSets only where a namespace bound custody-drills.
        ("create", "apps", "statefulsets", NS, None),
        ("create", "apps", "statefulsets", KUBE, None),
        ("delete", "apps", "statefulsets", NS, None),
        ("update", "apps", "statefulsets", HOOKS, None),
        // A web identity's tokens only where a namespace bound custody-web-identity.
        ("create", "", "serviceaccounts/token", NS, None),
        (
            "patch",
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            ALL,
            Some("another-webhook"),
        ),
        (
            "delete",
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            ALL,
            Some("another-webhook"),
        ),
    ];
    let agent_needs: Vec<Permission> = vec![
        ("watch", "", "pods", ALL, None),
        ("get", "", "persistentvolumeclaims", NS, None),
        ("watch", "custody.io", "restores", ALL, None),
        ("get", "custody.io", "backups", NS, None),
        ("get", "batch", "jobs", NS, None),
        ("create", "authentication.k8s.io", "tokenreviews", ALL, None),
        // custody's CA bundle, watched (#23 item 5).
        ("watch", "", "configmaps", SYSTEM, Some("custody-ca")),
    ];
    let agent_refused: Vec<Permission> = vec![
        ("watch", "", "configmaps", SYSTEM, None),
        ("patch", "", "configmaps", SYSTEM, Some("custody-ca")),
        ("get", "", "secrets", SYSTEM, Some("custody-ca")),
        ("get", "", "secrets", NS, None),
        ("list", "", "secrets", ALL, None),
        ("create", "batch", "jobs", NS, None),
        ("patch", "", "pods/status", NS, None),
        ("create", "", "pods/exec", HOOKS, None),
        ("delete", "", "pods", NS, None),
        ("update", "coordination.k8s.io", "leases", SYSTEM, None),
        ("patch", "custody.io", "restores/status", NS, None),
        ("patch", "custody.io", "backups", NS, None),
        ("create", "", "configmaps", NS, None),
    ];
    let account = |name: &str| {
        (
            format!("system:serviceaccount:custody-system:{name}"),
            vec![
                "system:serviceaccounts".to_string(),
                "system:serviceaccounts:custody-system".to_string(),
                "system:authenticated".to_string(),
            ],
        )
    };
    let mut rows = Vec::new();
    for (name, needs, refused) in [
        ("custody-controller", &controller_needs, &controller_refused),
        ("custody-agent", &agent_needs, &agent_refused),
    ] {
        let (user, groups) = account(name);
        for (permission, expected) in needs
            .iter()
            .map(|permission| (permission, true))
            .chain(refused.iter().map(|permission| (permission, false)))
        {
            rows.push((user.clone(), groups.clone(), *permission, expected));
        }
    }
    let reviews: Api<SubjectAccessReview> = Api::all(namespace.client.clone());
    let place = move |namespace: Option<&str>| match namespace {
        Some("NS") => Some(ns.clone()),
        Some("HOOKS") => Some(hooks.clone()),
        other => other.map(str::to_string),
    };
    eventually(
        "custody's accounts allowed exactly what deploy/ grants",
        TIMEOUT,
        || {
            let (reviews, rows, place) = (reviews.clone(), rows.clone(), place.clone());
            async move {
                let mut wrong = Vec::new();
                for (user, groups, (verb, group, resource, namespace, name), expected) in rows {
                    let (resource, subresource) = match resource.split_once('/') {
                        Some((resource, subresource)) => (resource, Some(subresource)),
                        None => (resource, None),
                    };
                    let allowed = allows(
                        &reviews,
                        &user,
                        groups,
                        ResourceAttributes {
                            namespace: place(namespace),
                            verb: Some(verb.to_string()),
                            group: Some(group.to_string()),
                            resource: Some(resource.to_string()),
                            subresource: subresource.map(str::to_string),
                            name: name.map(str::to_string),
                            ..ResourceAttributes::default()
                        },
                    )
                    .await?;
                    if allowed != expected {
                        wrong.push(format!(
                            "{user}: {verb} {resource}{}{} in {}: {}",
                            subresource.map(|sub| format!("/{sub}")).unwrap_or_default(),
                            name.map(|name| format!(" {name}")).unwrap_or_default(),
                            namespace.unwrap_or("every namespace"),
                            if allowed { "allowed" } else { "refused" }
                        ));
                    }
                }
                if wrong.is_empty() {
                    Ok(())
                } else {
                    Err(wrong.join("; "))
                }
            }
        },
    )
    .await;
    consenting.delete().await;
    namespace.delete().await;
}

/// Issue 23, items 1 and 4: the controller patches namespaces to mark one as under restore,
/// and a ValidatingAdmissionPolicy of `deploy/` lets it change nothing else (not a Pod
/// Security label, not another annotation).
#[tokio::test]
async fn the_controller_changes_nothing_of_a_namespace_but_its_restore_mark() {
    use kube::api::{Patch, PatchParams};
    let namespace = TestNamespace::create("namespace-guard").await;
    let (controller, _agent) =
        custody_tests::scenario::deployed_identities(&namespace.client).await;
    let as_controller: Api<k8s_openapi::api::core::v1::Namespace> =
        Api::all(custody_tests::client_from(controller.path()).await);
    let patch = |value: serde_json::Value| {
        let api = as_controller.clone();
        let name = namespace.name.clone();
        async move {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(value))
                .await
                .map(|_| ())
                .map_err(|error| error.to_string())
        }
    };
    // A Pod Security label the namespace's admin set.
    Api::<k8s_openapi::api::core::v1::Namespace>::all(namespace.client.clone())
        .patch(
            &namespace.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})),
        )
        .await
        .unwrap();
    let forbidden = [
        json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": null}}}),
        json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "00000000-0000-0000-0000-000000000001"}]}}),
        json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
        json!({"metadata": {"labels": {"pod-security.kubernetes.io/warn": "privileged"}}}),
        json!({"metadata": {"labels": {"team": "other"}}}),
        json!({"metadata": {"annotations": {"scheduler.alpha.kubernetes.io/node-selector": "a=b"}}}),
        json!({"metadata": {"finalizers": ["custody.io/forever"]}}),
    ];
    for change in forbidden {
        eventually(&format!("{change} refused"), TIMEOUT, || {
            let attempt = patch(change.clone());
            async move {
                match attempt.await {
                    Err(error) if error.contains("custody-controller may") => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        })
        .await;
    }
    patch(json!({"metadata": {
        "labels": {"custody.io/restore-in-progress": "true"},
        "annotations": {"custody.io/restore-marked-at": "2026-12-04T00:00:00Z"},
    }}))
    .await
    .expect("the restore mark");
    patch(json!({"metadata": {
        "labels": {"custody.io/restore-in-progress": null},
        "annotations": {"custody.io/restore-marked-at": null},
    }}))
    .await
    .expect("the restore mark taken off");
    let labels = namespace_labels(&namespace).await;
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted"),
        "{labels:?}"
    );
    assert!(!labels.contains_key("team"), "{labels:?}");
    assert!(
        labels.contains_key("kubernetes.io/metadata.name"),
        "{labels:?}"
    );
}

async fn namespace_labels(namespace: &TestNamespace) -> std::collections::BTreeMap<String, String> {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(namespace.client.clone())
        .get(&namespace.name)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default()
}
