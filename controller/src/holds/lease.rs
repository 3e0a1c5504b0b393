//! The Lease, read and written without a cache.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};

use super::{Claim, claim, lease_name};
use crate::error::{Error, Result};
use custody_kube::api::{Backup, BackupPhase, Restore, RestorePhase};

/// Whether the run a holder identity names still exists and is not over, read from the
/// API server (only the kind the identity names is listed).
async fn holder_live(client: &Client, namespace: &str, holder: &str) -> Result<bool> {
    let read = |kind: &str| {
        let object = format!("{kind}s in {namespace}");
        move |source| Error::Read { object, source }
    };
    let (backups, restores) = match holder.split_once('/') {
        Some(("Backup", _)) => (
            Api::<Backup>::namespaced(client.clone(), namespace)
                .list(&Default::default())
                .await
                .map_err(read("Backup"))?
                .items,
            Vec::new(),
        ),
        Some(("Restore", _)) => (
            Vec::new(),
            Api::<Restore>::namespaced(client.clone(), namespace)
                .list(&Default::default())
                .await
                .map_err(read("Restore"))?
                .items,
        ),
        _ => (Vec::new(), Vec::new()),
    };
    Ok(live_among(holder, &backups, &restores))
}

/// Whether `holder` (`Backup/<uid>` or `Restore/<uid>`) names a run among these that is
/// neither being deleted nor over.
fn live_among(holder: &str, backups: &[Backup], restores: &[Restore]) -> bool {
    let Some((kind, uid)) = holder.split_once('/') else {
        return false;
    };
    match kind {
        "Backup" => backups
            .iter()
            .find(|backup| backup.metadata.uid.as_deref() == Some(uid))
            .is_some_and(|backup| {
                running(
                    backup.metadata.deletion_timestamp.is_some(),
                    matches!(
                        backup.status.as_ref().and_then(|status| status.phase),
                        Some(BackupPhase::Completed | BackupPhase::Failed)
                    ),
                )
            }),
        "Restore" => restores
            .iter()
            .find(|restore| restore.metadata.uid.as_deref() == Some(uid))
            .is_some_and(|restore| {
                running(
                    restore.metadata.deletion_timestamp.is_some(),
                    matches!(
                        restore.status.as_ref().and_then(|status| status.phase),
                        Some(RestorePhase::Completed | RestorePhase::Failed)
                    ),
                )
            }),
        _ => false,
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// A holder's run keeps the claim while it is neither being deleted nor over.
fn running(deleting: bool, over: bool) -> bool {
    !deleting && !over
}

/// Label of custody's Leases: the UID of the Cluster a Lease claims.
pub const LABEL_CLUSTER_UID: &str = "custody.io/cluster-uid";
/// Annotation of custody's Leases: `namespace/name` of the Cluster, for people.
pub const ANNOTATION_CLUSTER: &str = "custody.io/cluster";

/// A new Lease `name` for the Cluster, held by `me` since `at`. It is in custody's
/// namespace, so the Cluster cannot own it: the run gives it back when it ends, also when
/// the Cluster went meanwhile ([`settle`]).
fn created(name: &str, cluster: &custody_kube::api::Cluster, me: &str, at: MicroTime) -> Lease {
    let mut lease = Lease::default();
    lease.metadata.name = Some(name.to_string());
    lease.metadata.labels = Some(
        [
            (
                LABEL_CLUSTER_UID.to_string(),
                cluster.metadata.uid.clone().unwrap_or_default(),
            ),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "custody".to_string(),
            ),
        ]
        .into(),
    );
    lease.metadata.annotations = Some(
        [(
            ANNOTATION_CLUSTER.to_string(),
            format!(
                "{}/{}",
                cluster.namespace().unwrap_or_default(),
                cluster.name_any()
            ),
        )]
        .into(),
    );
    lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
        holder_identity: Some(me.to_string()),
        acquire_time: Some(at),
        ..Default::default()
    });
    lease
}

/// `lease` handed to `me` at `at` (its resourceVersion, kept, guards the replace).
fn taken_over(mut lease: Lease, me: &str, at: MicroTime) -> Lease {
    let spec = lease.spec.get_or_insert_default();
    spec.holder_identity = Some(me.to_string());
    spec.acquire_time = Some(at);
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    lease
}

/// Deletes exactly the Lease that was read: not one created again meanwhile, nor one
/// another run took over since.
fn exactly(lease: &Lease) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: lease.metadata.uid.clone(),
            resource_version: lease.resource_version(),
        }),
        ..DeleteParams::default()
    }
}

/// Takes the Cluster's claim for `me`, a Lease in namespace `leases` (custody's own);
/// the Cluster and the runs are in `namespace`. Returns `None` when taken (or already
/// held), or the holder that keeps it.
pub async fn acquire(
    client: &Client,
    leases: &str,
    namespace: &str,
    cluster: &custody_kube::api::Cluster,
    me: &str,
) -> Result<Option<String>> {
    let cluster_uid = cluster.metadata.uid.clone().unwrap_or_default();
    let name = lease_name(&cluster_uid);
    let api: Api<Lease> = Api::namespaced(client.clone(), leases);
    let current = api.get_opt(&name).await.map_err(|source| Error::Read {
        object: format!("Lease {leases}/{name}"),
        source,
    })?;
    let holder = current
        .as_ref()
        .and_then(|lease| lease.spec.as_ref())
        .and_then(|spec| spec.holder_identity.clone());
    let live = match &holder {
        Some(holder) if holder != me => holder_live(client, namespace, holder).await?,
        _ => false,
    };
    let write_error = |source| Error::Create {
        object: format!("Lease {leases}/{name}"),
        source,
    };
    match claim(holder.as_deref(), me, live) {
        Claim::Held => Ok(None),
        Claim::Wait { holder } => Ok(Some(holder)),
        Claim::Create => {
            let lease = created(&name, cluster, me, now());
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(None),
                // Someone else created it first: they hold it.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    Ok(Some("another run (just now)".to_string()))
                }
                Err(source) => Err(write_error(source)),
            }
        }
        Claim::TakeOver => {
            let lease = taken_over(current.expect("a holder means a Lease"), me, now());
            match api.replace(&name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(None),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    Ok(Some("another run (just now)".to_string()))
                }
                Err(source) => Err(write_error(source)),
            }
        }
    }
}

/// Gives the claim back when `step` says the run is over; once the Cluster is gone, the
/// Lease is found by its holder (it is in custody's namespace: nothing deletes it with the
/// Cluster).
pub async fn settle(
    client: &Client,
    leases: &str,
    cluster: Option<&custody_kube::api::Cluster>,
    me: &str,
    step: &super::LeaseStep,
) -> Result<()> {
    if *step != super::LeaseStep::Release {
        return Ok(());
    }
    match cluster.and_then(|cluster| cluster.metadata.uid.as_deref()) {
        Some(cluster_uid) => release(client, leases, cluster_uid, me).await,
        None => release_any(client, leases, me).await,
    }
}

/// Gives back every claim `me` holds in `leases`, whichever Cluster it was for.
pub async fn release_any(client: &Client, leases: &str, me: &str) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), leases);
    let held = api
        .list(&ListParams::default().labels(LABEL_CLUSTER_UID))
        .await
        .map_err(|source| Error::Read {
            object: format!("Leases in {leases}"),
            source,
        })?;
    for lease in held.items {
        let holder = lease
            .spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.as_deref());
        if holder == Some(me) {
            delete_exactly(&api, leases, &lease).await?;
        }
    }
    Ok(())
}

/// Gives the claim on the Cluster `cluster_uid` back if `me` holds it.
pub async fn release(client: &Client, leases: &str, cluster_uid: &str, me: &str) -> Result<()> {
    let name = lease_name(cluster_uid);
    let api: Api<Lease> = Api::namespaced(client.clone(), leases);
    let Some(lease) = api.get_opt(&name).await.map_err(|source| Error::Read {
        object: format!("Lease {leases}/{name}"),
        source,
    })?
    else {
        return Ok(());
    };
    let holder = lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.as_deref());
    if holder != Some(me) {
        return Ok(());
    }
    delete_exactly(&api, leases, &lease).await
}

async fn delete_exactly(api: &Api<Lease>, leases: &str, lease: &Lease) -> Result<()> {
    let name = lease.name_any();
    match api.delete(&name, &exactly(lease)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(source) => Err(Error::Delete {
            object: format!("Lease {leases}/{name}"),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    #[test]
    fn a_holder_is_live_only_while_its_own_run_goes_on() {
        let backup = |uid: &str, phase: Option<&str>, deleting: bool| {
            let mut backup: Backup = serde_json::from_value(serde_json::json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
                "metadata": {"name": uid, "uid": uid},
                "spec": {"clusterRef": {"name": "orders"}},
                "status": phase.map(|phase| serde_json::json!({"phase": phase})),
            }))
            .unwrap();
            if deleting {
                backup.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    ));
            }
            backup
        };
        let restore = |uid: &str, phase: Option<&str>| -> Restore {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
                "metadata": {"name": uid, "uid": uid},
                "spec": {"clusterRef": {"name": "orders"}, "backupRef": {"name": "b"}},
                "status": phase.map(|phase| serde_json::json!({"phase": phase})),
            }))
            .unwrap()
        };
        let backups = [
            backup("b-run", Some("Running"), false),
            backup("b-new", None, false),
            backup("b-done", Some("Completed"), false),
            backup("b-failed", Some("Failed"), false),
            backup("b-deleting", Some("Running"), true),
            backup("shared", Some("Completed"), false),
        ];
        let restores = [
            restore("r-run", Some("Running")),
            restore("r-done", Some("Completed")),
            restore("shared", Some("Running")),
        ];
        // (holder, live)
        let rows = [
            ("Backup/b-run", true),
            ("Backup/b-new", true),
            ("Backup/b-done", false),
            ("Backup/b-failed", false),
            ("Backup/b-deleting", false),
            ("Backup/b-gone", false),
            ("Restore/r-run", true),
            ("Restore/r-done", false),
            ("Restore/r-gone", false),
            ("Backup/r-run", false),
            ("Restore/b-run", false),
            ("Backup/shared", false),
            ("Restore/shared", true),
            ("b-run", false),
            ("Job/b-run", false),
        ];
        for (holder, live) in rows {
            assert_eq!(live_among(holder, &backups, &restores), live, "{holder}");
        }
    }

    #[test]
    fn a_run_holds_while_neither_deleted_nor_over() {
        // (being deleted, over, still running)
        for (deleting, over, expected) in [
            (false, false, true),
            (true, false, false),
            (false, true, false),
            (true, true, false),
        ] {
            assert_eq!(running(deleting, over), expected, "{deleting} {over}");
        }
    }

    #[test]
    fn leases_name_their_holder_and_cluster_and_deletes_are_exact() {
        let mut cluster = custody_kube::api::Cluster::new(
            "orders",
            serde_json::from_value(serde_json::json!({"statefulSetRef": {"name": "db"}, "volumeClaimTemplates": ["data"]}))
                .unwrap(),
        );
        cluster.metadata.uid = Some("c-1".into());
        cluster.metadata.namespace = Some("shop".into());
        let lease = created("custody-run-c-1", &cluster, "Backup/b-1", at(100));
        assert_eq!(lease.metadata.name.as_deref(), Some("custody-run-c-1"));
        // In custody's namespace: no owner (a Cluster elsewhere cannot own it), its
        // Cluster named by label and annotation.
        assert!(lease.metadata.owner_references.is_none());
        assert_eq!(
            lease.labels().get(LABEL_CLUSTER_UID).map(String::as_str),
            Some("c-1")
        );
        assert_eq!(
            lease
                .annotations()
                .get(ANNOTATION_CLUSTER)
                .map(String::as_str),
            Some("shop/orders")
        );
        let spec = lease.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("Backup/b-1"));
        assert_eq!(spec.acquire_time, Some(at(100)));

        let mut stored = lease;
        stored.metadata.uid = Some("l-1".into());
        stored.metadata.resource_version = Some("42".into());
        let moved = taken_over(stored.clone(), "Restore/r-1", at(200));
        let spec = moved.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("Restore/r-1"));
        assert_eq!(spec.acquire_time, Some(at(200)));
        assert_eq!(spec.lease_transitions, Some(1));
        assert_eq!(
            taken_over(moved.clone(), "Backup/b-2", at(300))
                .spec
                .unwrap()
                .lease_transitions,
            Some(2)
        );
        assert_eq!(moved.metadata.resource_version.as_deref(), Some("42"));

        let guard = exactly(&stored).preconditions.unwrap();
        assert_eq!(guard.uid.as_deref(), Some("l-1"));
        assert_eq!(guard.resource_version.as_deref(), Some("42"));
    }
}
