//! The per-Cluster coordination Lease against the real API server: who takes it, who waits,
//! when it is taken over, and that only its holder gives it back; it lives in custody's own
//! namespace, not the Cluster's.

use custody_controller::holds::{lease, lease_name};
use custody_kube::api::{Backup, Cluster, Restore};
use custody_tests::TestNamespace;
use custody_tests::scenario::create;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

async fn backup(namespace: &TestNamespace, name: &str) -> Backup {
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": name},
               "spec": {"clusterRef": {"name": "orders"}}}),
    )
    .await
}

async fn restore(namespace: &TestNamespace, name: &str) -> Restore {
    create::<Restore>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Restore", "metadata": {"name": name},
               "spec": {"clusterRef": {"name": "orders"}, "backupRef": {"name": "b"}}}),
    )
    .await
}

async fn set_phase<K>(api: &Api<K>, name: &str, phase: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase}})),
    )
    .await
    .unwrap();
}

fn holder(kind: &str, uid: &Option<String>) -> String {
    format!("{kind}/{}", uid.as_deref().unwrap())
}

#[tokio::test]
async fn one_run_holds_a_clusters_lease_and_only_a_finished_runs_lease_is_taken_over() {
    let namespace = TestNamespace::create("lease").await;
    let client = namespace.client.clone();
    let ns = namespace.name.clone();
    let cluster = create::<Cluster>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster", "metadata": {"name": "orders"},
               "spec": {"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"],
                        "consistency": {"method": "CrashUnsafe"}}}),
    )
    .await;
    // custody's own namespace, where its Leases are (the Cluster's has none).
    let home = TestNamespace::create("lease-home").await;
    let custody = home.name.clone();
    let leases: Api<Lease> = home.api();
    let name = lease_name(cluster.metadata.uid.as_deref().unwrap());
    let first = backup(&namespace, "first").await;
    let second = restore(&namespace, "second").await;
    let (a, b) = (
        holder("Backup", &first.metadata.uid),
        holder("Restore", &second.metadata.uid),
    );
    set_phase(&namespace.api::<Backup>(), "first", "Running").await;
    set_phase(&namespace.api::<Restore>(), "second", "Pending").await;

    // Nobody holds it: the first run takes it, and holds it on asking again.
    assert_eq!(
        lease::acquire(&client, &custody, &ns, &cluster, &a)
            .await
            .unwrap(),
        None
    );
    let taken = leases.get(&name).await.unwrap();
    let spec = taken.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(a.as_str()));
    assert!(spec.acquire_time.is_some());
    assert_eq!(
        taken.labels().get(lease::LABEL_CLUSTER_UID),
        cluster.metadata.uid.as_ref()
    );
    assert_eq!(
        taken.annotations().get(lease::ANNOTATION_CLUSTER),
        Some(&format!("{ns}/orders"))
    );
    assert!(
        namespace
            .api::<Lease>()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no Lease in the Cluster's namespace"
    );
    assert_eq!(
        lease::acquire(&client, &custody, &ns, &cluster, &a)
            .await
            .unwrap(),
        None
    );

    // The other waits while the holder runs, naming it.
    assert_eq!(
        lease::acquire(&client, &custody, &ns, &cluster, &b)
            .await
            .unwrap(),
        Some(a.clone())
    );
    // Only the holder gives it back.
    lease::release(
        &client,
        &custody,
        cluster.metadata.uid.as_deref().unwrap(),
        &b,
    )
    .await
    .unwrap();
    assert!(leases.get_opt(&name).await.unwrap().is_some());

    // The holder's run is over: the lease is taken over, once.
    set_phase(&namespace.api::<Backup>(), "first", "Completed").await;
    assert_eq!(
        lease::acquire(&client, &custody, &ns, &cluster, &b)
            .await
            .unwrap(),
        None
    );
    let spec = leases.get(&name).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(b.as_str()));
    assert_eq!(spec.lease_transitions, Some(1));

    // A run that never existed does not keep it either; a third run waits for the second.
    let third = backup(&namespace, "third").await;
    let c = holder("Backup", &third.metadata.uid);
    assert_eq!(
        lease::acquire(&client, &custody, &ns, &cluster, &c)
            .await
            .unwrap(),
        Some(b.clone())
    );

    // The holder gives it back; giving back what is gone is not an error.
    let uid = cluster.metadata.uid.clone().unwrap();
    lease::release(&client, &custody, &uid, &b).await.unwrap();
    assert!(leases.get_opt(&name).await.unwrap().is_none());
    lease::release(&client, &custody, &uid, &b).await.unwrap();

    // Two runs asking at once: exactly one takes it, the other is told to wait.
    let fourth = restore(&namespace, "fourth").await;
    let d = holder("Restore", &fourth.metadata.uid);
    set_phase(&namespace.api::<Backup>(), "third", "Running").await;
    set_phase(&namespace.api::<Restore>(), "fourth", "Pending").await;
    let (one, other) = tokio::join!(
        lease::acquire(&client, &custody, &ns, &cluster, &c),
        lease::acquire(&client, &custody, &ns, &cluster, &d)
    );
    let (one, other) = (one.unwrap(), other.unwrap());
    assert!(
        one.is_none() != other.is_none(),
        "exactly one takes it: {one:?} {other:?}"
    );
    let holder_now = leases
        .get(&name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    assert_eq!(
        holder_now,
        if one.is_none() { c.clone() } else { d.clone() }
    );

    // Once the Cluster is gone, its holder still finds and gives back its claim; another
    // run's ask gives back nothing.
    let stranger = holder("Backup", &Some("not-a-run".to_string()));
    lease::release_any(&client, &custody, &stranger)
        .await
        .unwrap();
    assert!(leases.get_opt(&name).await.unwrap().is_some());
    lease::release_any(&client, &custody, &holder_now)
        .await
        .unwrap();
    assert!(leases.get_opt(&name).await.unwrap().is_none());
    namespace.delete().await;
    home.delete().await;
}
