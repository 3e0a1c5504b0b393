//! Issue 25 item 3 on the real node: scheduled restore drills of a BackupPlan's newest
//! completed Backup, into a throwaway Cluster, verified by the agent, then asked by the
//! engine's own check; the result on the plan and the Backup; everything made deleted after.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Patch, PatchParams};

use super::*;
use crate::mariadb::mariadb;
use crate::postgres::{Load, PGBENCH_SUMS, Stage, finish_postgres, postgres_source, sql};
use custody_kube::api::BackupPlan;

/// The engine check of these drills: pg_amcheck over every relation with its indexes, then
/// pgbench's own invariant (the four sums of a consistent state are equal), an error when not.
fn postgres_check() -> serde_json::Value {
    let sums_agree = PGBENCH_SUMS
        .trim_start_matches("select ")
        .split(" || ' ' || ")
        .collect::<Vec<_>>();
    // select 1/(a = b and b = c and c = d)::int : a division by zero when they differ.
    let query = format!(
        "select 1/(({a}) = ({b}) and ({b}) = ({c}) and ({c}) = ({d}))::int",
        a = sums_agree[0],
        b = sums_agree[1],
        c = sums_agree[2],
        d = sums_agree[3],
    );
    json!({
        "command": ["sh", "-c", format!(
            "pg_amcheck -h \"$CUSTODY_DRILL_HOST\" --heapallindexed postgres && psql -h \"$CUSTODY_DRILL_HOST\" -v ON_ERROR_STOP=1 -Atc '{query}' && echo sums agree")],
        // PGPASSWORD, for a connection from another host.
        "credentialsSecretRef": {"name": "orders-credentials"},
        "timeoutSeconds": 300,
    })
}

/// Secret orders-credentials in `namespace`: the database's password (a new PostgreSQL of
/// `postgres_statefulset` accepts connections from other hosts with it), for the check.
async fn credentials(namespace: &TestNamespace) {
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"PGPASSWORD": "drill-password"}}),
    )
    .await;
}

/// Lets custody run drills in `namespace` (its admin's RoleBinding of ClusterRole
/// custody-drills).
async fn allow_drills(namespace: &TestNamespace) {
    create::<RoleBinding>(
        &namespace.api(),
        json!({"metadata": {"name": "custody-drills"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "custody-drills"},
               "subjects": [{"kind": "ServiceAccount", "name": "custody-controller", "namespace": "custody-system"}]}),
    )
    .await;
}

/// Plan `nightly` of Cluster orders (`consistency`), runs only when asked, its drill every
/// minute with `drill` merged in (PostgreSQL's check unless it names one). Admitted once the
/// authorizer sees the drill namespace's RoleBinding.
async fn plan_with_drill(
    namespace: &TestNamespace,
    consistency: serde_json::Value,
    drill: serde_json::Value,
) {
    plan_named(namespace, "nightly", consistency, drill).await;
}

/// [`plan_with_drill`] of another name.
async fn plan_named(
    namespace: &TestNamespace,
    name: &str,
    consistency: serde_json::Value,
    drill: serde_json::Value,
) {
    let mut spec = json!({"schedule": "* * * * *", "check": postgres_check()});
    for (key, value) in drill.as_object().unwrap() {
        spec[key] = value.clone();
    }
    let plan: BackupPlan = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "BackupPlan", "metadata": {"name": name},
        "spec": {"clusterRef": {"name": "orders"}, "schedule": "0 0 1 1 *",
                 "consistency": consistency, "drill": spec},
    }))
    .unwrap();
    custody_tests::eventually("the plan with a drill admitted", TIMEOUT, || {
        let (plans, plan) = (namespace.api::<BackupPlan>(), plan.clone());
        async move {
            plans
                .create(&PostParams::default(), &plan)
                .await
                .map_err(|error| error.to_string())
        }
    })
    .await;
}

/// The plan's first finished drill (its drill then suspended with the plan, so that no other
/// starts), once everything it made is gone.
async fn first_drill(namespace: &TestNamespace) -> BackupPlan {
    first_drill_of(namespace, "nightly").await
}

/// [`first_drill`] of plan `name`.
async fn first_drill_of(namespace: &TestNamespace, name: &str) -> BackupPlan {
    let plans = namespace.api::<BackupPlan>();
    let finished = await_condition(
        &plans,
        name,
        "a drill finished",
        Duration::from_secs(900),
        |plan: &BackupPlan| {
            plan.status
                .as_ref()
                .and_then(|status| status.drill.as_ref())
                .is_some_and(|drill| drill.last.is_some())
        },
    )
    .await;
    plans
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();
    let cleaned = await_condition(
        &plans,
        name,
        "the drill cleaned up",
        TIMEOUT,
        |plan: &BackupPlan| {
            plan.status
                .as_ref()
                .and_then(|status| status.drill.as_ref())
                .is_some_and(|drill| drill.current.is_none())
        },
    )
    .await;
    let drill = |plan: &BackupPlan| plan.status.clone().unwrap().drill.unwrap().last.unwrap();
    assert_eq!(drill(&finished), drill(&cleaned), "one drill only");
    cleaned
}

/// Nothing the drill made is left in `namespace`: no Cluster, StatefulSet, Job, claim or
/// imported Backup of `nightly-drill`.
async fn nothing_left(namespace: &TestNamespace) {
    nothing_left_of(namespace, "nightly").await;
}

/// [`nothing_left`] by plan `plan`'s drill.
async fn nothing_left_of(namespace: &TestNamespace, plan: &str) {
    let ns = &namespace.name;
    let base = format!("{plan}-drill");
    assert!(
        namespace
            .api::<Cluster>()
            .get_opt(&base)
            .await
            .unwrap()
            .is_none(),
        "Cluster in {ns}"
    );
    assert!(
        namespace
            .api::<StatefulSet>()
            .get_opt(&base)
            .await
            .unwrap()
            .is_none(),
        "StatefulSet in {ns}"
    );
    assert!(
        namespace
            .api::<Job>()
            .get_opt(&format!("{base}-check"))
            .await
            .unwrap()
            .is_none(),
        "Job in {ns}"
    );
    assert!(
        namespace
            .api::<Backup>()
            .get_opt(&base)
            .await
            .unwrap()
            .is_none(),
        "imported Backup in {ns}"
    );
    let claims = namespace
        .api::<PersistentVolumeClaim>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        claims
            .items
            .iter()
            .all(|claim| !claim.name_any().contains(&base)),
        "claims left in {ns}: {:?}",
        claims
            .items
            .iter()
            .map(|claim| claim.name_any())
            .collect::<Vec<_>>()
    );
}

/// The `Drilled` condition of Backup `name`: (status, reason, message).
async fn drilled(namespace: &TestNamespace, name: &str) -> (String, String, String) {
    let backup = namespace.api::<Backup>().get(name).await.unwrap();
    let condition = backup
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|condition| condition.type_ == "Drilled")
        .expect("the Backup's Drilled condition");
    (condition.status, condition.reason, condition.message)
}

/// pgbench, four clients at 250 transactions a second for `seconds`, and a CHECKPOINT every
/// two seconds meanwhile, against orders-0.
fn paced_load(namespace: &str, seconds: u64) -> Load {
    Load::with(namespace, seconds, &["-R", "250"], Duration::from_secs(2))
}

/// A good backup passes its drill, in another namespace than the application's: PostgreSQL,
/// frozen while pgbench writes, backed up as the plan's run; the drill imports the snapshot
/// into the drill namespace through the BackupRepository there, restores it into Cluster
/// nightly-drill, the agent verifies the volume, PostgreSQL starts on it, and pg_amcheck
/// --heapallindexed and pgbench's sums pass. The result is on the plan (status, `Drilled`
/// True) and on the Backup; the drill namespace is left empty of what the drill made; the
/// application never stopped answering and its namespace was never marked under restore.
#[tokio::test]
async fn on_a_real_node_a_restore_drill_of_a_good_postgresql_backup_passes_its_engine_check() {
    let Stage {
        node,
        client,
        namespace,
        _agents,
        _installed,
        _relay,
    } = Stage::new("drill", false).await;
    let ns = namespace.name.clone();
    let frozen = json!({"method": "Freeze", "maxFreezeSeconds": 120});
    credentials(&namespace).await;
    let _source = postgres_source(&client, node, &namespace, Some(frozen.clone()), 2).await;

    // The drill namespace: the same repository attached (same bucket, same key), drills
    // allowed, a volume for the drill's claim.
    let drills = TestNamespace::create("drillto").await;
    let bucket = Api::<custody_kube::api::BackupRepository>::namespaced(client.clone(), &ns)
        .get("store")
        .await
        .unwrap()
        .spec
        .bucket;
    encrypted_repository(&drills, &s3_for_pods(), &bucket).await;
    allow_drills(&drills).await;
    credentials(&drills).await;
    let target = LoopVolume::new(crate::postgres::volume_mib(2));
    std::os::unix::fs::chown(target.path(), Some(999), Some(999)).unwrap();
    local_volume(
        &client,
        node,
        &drills.name,
        "data-nightly-drill-0",
        target.path(),
    )
    .await;
    plan_with_drill(
        &namespace,
        frozen,
        json!({"namespace": drills.name, "repositoryRef": {"name": "store"}}),
    )
    .await;

    let load = Load::start(&ns, 20);
    tokio::time::sleep(Duration::from_secs(3)).await;
    super::monitoring::kubectl_custody(&[
        "-n",
        &ns,
        "backup",
        "--plan",
        "nightly",
        "--name",
        "run-1",
        "--wait",
        "--timeout",
        "600",
    ]);
    load.finish().await;

    let plan = first_drill(&namespace).await;
    let status = plan.status.unwrap();
    let last = status.drill.clone().unwrap().last.unwrap();
    assert_eq!(
        (
            last.result.as_str(),
            last.reason.as_str(),
            last.backup.as_str()
        ),
        ("Passed", "Passed", "run-1"),
        "{last:?}"
    );
    assert!(status.drill.unwrap().last_success_time.is_some());
    let condition = status
        .conditions
        .iter()
        .find(|condition| condition.type_ == "Drilled")
        .expect("the plan's Drilled condition");
    assert_eq!(condition.status, "True", "{condition:?}");
    let (on_backup, reason, _) = drilled(&namespace, "run-1").await;
    assert_eq!((on_backup.as_str(), reason.as_str()), ("True", "Passed"));
    nothing_left(&drills).await;
    // The application: untouched, still answering, its namespace never marked.
    sql(&ns, "orders-0", "select 1").await;
    let labels = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get(&ns)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert!(
        !labels.contains_key("custody.io/restore-in-progress"),
        "{labels:?}"
    );
    eprintln!(
        "drill of run-1 into {}: {} ({} → {})",
        drills.name, last.message, last.started_at.0, last.finished_at.0
    );
    let drill_ns = drills.name.clone();
    drills.delete().await;
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete(
            &format!("{drill_ns}-data-nightly-drill-0"),
            &Default::default(),
        )
        .await;
    finish_postgres(&client, namespace).await;
}

/// A backup made inconsistent on purpose fails its drill though its content verifies:
/// PostgreSQL copied with method `CrashUnsafe` while four pgbench clients write and a
/// CHECKPOINT runs every second, through a relay limited to 3 MB/s (the copy spans many
/// seconds of writes). The drill, in the plan's own namespace, restores it and the agent
/// verifies every byte against the manifest (the copy is what was read), yet the engine check
/// (or PostgreSQL itself, refusing to start) says the data is torn: the drill fails
/// `CheckFailed` or `ApplicationNotReady`, never `RestoreFailed`, and says so on the plan and
/// the Backup.
#[tokio::test]
async fn on_a_real_node_a_restore_drill_catches_a_crash_unsafe_postgresql_copy_under_load() {
    let Stage {
        node,
        client,
        namespace,
        _agents,
        _installed,
        _relay,
    } = Stage::new("drilltorn", true).await;
    let ns = namespace.name.clone();
    let unsafe_copy = json!({"method": "CrashUnsafe"});
    credentials(&namespace).await;
    let _source = postgres_source(&client, node, &namespace, Some(unsafe_copy.clone()), 10).await;
    // The checkpoints during the copy are what tears it (pg_control newer than pages read
    // before it); they must not also recycle WAL segments under the copy, which fails it
    // (ReadVolumeFailed: a file that vanished): more WAL is kept than the load writes, and the
    // load is paced so that its WAL (a full page image of each page first written after a
    // checkpoint) fits the volume.
    exec(
        &ns,
        "orders-0",
        &["psql", "-c", "alter system set wal_keep_size = '768MB'"],
    )
    .unwrap();
    exec(&ns, "orders-0", &["psql", "-c", "select pg_reload_conf()"]).unwrap();
    // pgbench's tables compress to almost nothing, so they are read in a moment whatever the
    // upload's pace. A table of random bytes written after them (a higher relfilenode: read
    // after them) takes many seconds through the 3 MB/s relay, during which checkpoints
    // run: pg_control, read after it, is newer than the pgbench pages read before.
    exec(&ns, "orders-0", &["psql", "-c",
        "create table noise as select g, (select string_agg(md5(random()::text), '') from generate_series(1, 8) where g > 0) as junk from generate_series(1, 300000) g"]).unwrap();
    allow_drills(&namespace).await;
    let target = LoopVolume::new(crate::postgres::volume_mib(10));
    std::os::unix::fs::chown(target.path(), Some(999), Some(999)).unwrap();
    local_volume(&client, node, &ns, "data-nightly-drill-0", target.path()).await;
    plan_with_drill(&namespace, unsafe_copy, json!({})).await;

    let load = paced_load(&ns, 40);
    tokio::time::sleep(Duration::from_secs(5)).await;
    super::monitoring::kubectl_custody(&[
        "-n",
        &ns,
        "backup",
        "--plan",
        "nightly",
        "--name",
        "torn",
        "--wait",
        "--timeout",
        "900",
    ]);
    let (tps, checkpoints) = load.finish().await;

    let plan = first_drill(&namespace).await;
    let status = plan.status.unwrap();
    let last = status.drill.clone().unwrap().last.unwrap();
    eprintln!(
        "CrashUnsafe copy under pgbench ({tps}; {checkpoints} checkpoints): drill {} {}: {}",
        last.result, last.reason, last.message
    );
    assert_eq!(last.result, "Failed", "{last:?}");
    assert!(
        ["CheckFailed", "ApplicationNotReady"].contains(&last.reason.as_str()),
        "the restore verified and the engine caught it: {last:?}"
    );
    assert!(status.drill.unwrap().last_success_time.is_none());
    let (on_backup, reason, message) = drilled(&namespace, "torn").await;
    assert_eq!(
        (on_backup.as_str(), reason.as_str()),
        ("False", last.reason.as_str()),
        "{message}"
    );
    nothing_left(&namespace).await;
    // The application's own claim and pod are untouched.
    sql(&ns, "orders-0", "select 1").await;
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete(&format!("{ns}-data-nightly-drill-0"), &Default::default())
        .await;
    finish_postgres(&client, namespace).await;
}

/// The engine check of the MariaDB drills: `mariadb-check --extended` of every table (each
/// must say OK), then the bank's invariants (the money all there, the counter equal to the
/// history's rows).
fn mariadb_check() -> serde_json::Value {
    let connect = "-h \"$CUSTODY_DRILL_HOST\" -uroot -p\"$MARIADB_ROOT_PASSWORD\"";
    json!({
        "command": ["sh", "-c", format!(
            "out=$(mariadb-check {connect} --all-databases --extended) || {{ echo \"$out\"; exit 1; }}; echo \"$out\"; \
             if echo \"$out\" | grep -v 'OK$'; then exit 1; fi; \
             sums=$(mariadb {connect} -N -B -e \"select sum(balance) = 1000000 and (select n from bank.counter) = (select count(*) from bank.history) from bank.accounts\") || exit 1; \
             echo \"bank balanced: $sums\"; [ \"$sums\" = 1 ]")],
        "credentialsSecretRef": {"name": "orders-credentials"},
        "timeoutSeconds": 300,
    })
}

/// MariaDB under four clients moving money, both ways in one namespace: plan `good` backs it
/// up with `mariadb-backup --backup` then `--prepare` (method Tool), plan `torn` copies it
/// with `CrashUnsafe` through the 3 MB/s relay (its 30 MB of random rows take seconds, while
/// InnoDB's checkpoints move on). Each plan drills its Backup: `good` passes mariadb-check and
/// the bank's invariants; `torn`, verified on its volume all the same, fails (InnoDB refuses
/// to start, or the check finds the money or a transfer torn).
#[tokio::test]
async fn on_a_real_node_restore_drills_pass_a_mariadb_backup_copy_and_catch_a_crash_unsafe_one() {
    let Stage {
        node,
        client,
        namespace,
        _agents,
        _installed,
        _relay,
    } = Stage::new("mdbdrill", true).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"MARIADB_ROOT_PASSWORD": "a-test-password"}}),
    )
    .await;
    let tool = crate::mariadb::mariadb_backup_tool();
    let _source = crate::mariadb::mariadb_source(&client, node, &namespace, tool.clone()).await;
    allow_drills(&namespace).await;
    let mut volumes = Vec::new();
    for plan in ["good", "torn"] {
        let target = LoopVolume::new(1024);
        std::os::unix::fs::chown(target.path(), Some(999), Some(999)).unwrap();
        local_volume(
            &client,
            node,
            &ns,
            &format!("data-{plan}-drill-0"),
            target.path(),
        )
        .await;
        volumes.push(target);
    }
    plan_named(&namespace, "good", tool, json!({"check": mariadb_check()})).await;
    plan_named(
        &namespace,
        "torn",
        json!({"method": "CrashUnsafe"}),
        json!({"check": mariadb_check()}),
    )
    .await;

    // InnoDB flushes its few hot pages lazily, so its checkpoint (where crash recovery starts)
    // can stay older than the whole copy, which then recovers consistent by luck; flushing
    // continuously moves the checkpoint on while the copy reads: the accounts, read first,
    // end up older than the checkpoint the redo log, read after the random rows, names.
    exec(&ns, "orders-0", &["mariadb", "-uroot", "-e",
        "set global innodb_max_dirty_pages_pct_lwm = 0; set global innodb_max_dirty_pages_pct = 0"]).unwrap();
    // The transfers run until both backups are done: a fixed minute ended before the torn
    // copy when the Tool backup took long on a loaded CI machine, and a copy of an idle
    // MariaDB recovers consistent, so its drill passed.
    let load = crate::mariadb::transfers_until_stopped(&ns);
    tokio::time::sleep(Duration::from_secs(5)).await;
    for plan in ["good", "torn"] {
        super::monitoring::kubectl_custody(&[
            "-n",
            &ns,
            "backup",
            "--plan",
            plan,
            "--name",
            plan,
            "--wait",
            "--timeout",
            "900",
        ]);
    }
    crate::mariadb::stop_transfers(&ns, load, "both backups").await;

    let mut results = Vec::new();
    for plan in ["good", "torn"] {
        let plan = first_drill_of(&namespace, plan).await;
        results.push(plan.status.unwrap().drill.unwrap().last.unwrap());
    }
    eprintln!("mariadb drills: {results:#?}");
    let (good, torn) = (&results[0], &results[1]);
    assert_eq!(
        (good.result.as_str(), good.reason.as_str()),
        ("Passed", "Passed"),
        "{good:?}"
    );
    assert_eq!(torn.result, "Failed", "{torn:?}");
    assert!(
        ["CheckFailed", "ApplicationNotReady"].contains(&torn.reason.as_str()),
        "verified on its volume, caught by the engine: {torn:?}"
    );
    assert_eq!(drilled(&namespace, "good").await.0, "True");
    assert_eq!(drilled(&namespace, "torn").await.0, "False");
    for plan in ["good", "torn"] {
        nothing_left_of(&namespace, plan).await;
    }
    mariadb(&ns, "orders-0", "select 1").await;
    for plan in ["good", "torn"] {
        let _ = Api::<PersistentVolume>::all(client.clone())
            .delete(&format!("{ns}-data-{plan}-drill-0"), &Default::default())
            .await;
    }
    finish_postgres(&client, namespace).await;
}
