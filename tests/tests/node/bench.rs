//! The consistency benchmark (hack/bench-consistency.sh), ignored by default.

use super::*;
use crate::hooks::{Latencies, PG_BIN};
use crate::postgres::{Stage, finish_postgres, postgres_source, restore_postgres, sql, volume_mib};

/// Creates Backup `name` of Cluster orders (with `consistency`, else the Cluster's) and waits
/// until it completed: the Backup, and the time from its creation.
pub(crate) async fn timed_backup(
    namespace: &TestNamespace,
    name: &str,
    consistency: Option<serde_json::Value>,
) -> (Backup, Duration) {
    let mut spec = json!({"clusterRef": {"name": "orders"}});
    if let Some(consistency) = consistency {
        spec["consistency"] = consistency;
    }
    let started = std::time::Instant::now();
    create::<Backup>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Backup", "metadata": {"name": name},
               "spec": spec}),
    )
    .await;
    let backup = await_condition(
        &namespace.api::<Backup>(),
        name,
        "Completed",
        Duration::from_secs(3600),
        |backup: &Backup| {
            let phase = backup.status.as_ref().and_then(|status| status.phase);
            assert_ne!(phase, Some(BackupPhase::Failed), "{backup:?}");
            phase == Some(BackupPhase::Completed)
        },
    )
    .await;
    (backup, started.elapsed())
}

/// How long each container of Backup `backup`'s Job pod ran (started to finished, seconds),
/// by name: where a backup's time goes besides the Job's start.
pub(crate) async fn container_seconds(
    namespace: &TestNamespace,
    backup: &str,
) -> Vec<(String, f64)> {
    let pods: Api<Pod> = namespace.api();
    let listed = pods.list(&Default::default()).await.unwrap();
    let Some(pod) = listed.items.into_iter().find(|pod| {
        pod.metadata
            .name
            .as_deref()
            .is_some_and(|name| name.starts_with(&format!("{backup}-")))
    }) else {
        return Vec::new();
    };
    let status = pod.status.unwrap_or_default();
    status
        .init_container_statuses
        .into_iter()
        .flatten()
        .chain(status.container_statuses.into_iter().flatten())
        .filter_map(|container| {
            let ended = container.state?.terminated?;
            let took = ended
                .finished_at?
                .0
                .duration_since(ended.started_at?.0)
                .as_secs_f64();
            Some((container.name, took))
        })
        .collect()
}

/// Issue 14's benchmark, at ≥ 1 GiB (`CUSTODY_BENCH_SCALE`, default 70 pgbench scale units,
/// about 1.1 GB): PostgreSQL on the real node, each figure against a baseline measured in
/// the same run. Backup by the Tool method (pg_basebackup's tar stream read by the mover as it
/// is written; and, for comparison, its tree written to scratch space first), with no load as
/// the baseline ran, vs pg_basebackup to local disk alone; restore to a running database vs `cp -a` +
/// `sync` of the same tree onto a fresh volume; the write stall, as pgbench's longest
/// transaction, during a Tool and a Freeze backup vs with no backup. Run by
/// hack/bench-consistency.sh; it asserts only that each step worked.
#[tokio::test]
#[ignore = "a benchmark at 1 GiB: hack/bench-consistency.sh"]
async fn on_a_real_node_bench_postgresql_consistency() {
    let scale: u32 = std::env::var("CUSTODY_BENCH_SCALE")
        .ok()
        .and_then(|scale| scale.parse().ok())
        .unwrap_or(70);
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("pgbench", false).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"PGUSER": "postgres", "PGPASSWORD": "a-test-password"}}),
    )
    .await;
    let tool = json!({"method": "Tool", "tool": {
        "image": "localhost/custody/postgres:15",
        "command": ["pg_basebackup", "--host=$(CUSTODY_POD_IP)", "--pgdata=-", "--format=tar",
                    "--wal-method=fetch", "--checkpoint=fast", "--no-password"],
        "output": "TarStream",
        "credentialsSecretRef": {"name": "orders-credentials"},
        "dataPath": "pgdata",
    }});
    // The same tool writing a tree into scratch space first (what Tool did before issue 24).
    let directory = json!({"method": "Tool", "tool": {
        "image": "localhost/custody/postgres:15",
        "command": ["pg_basebackup", "--host=$(CUSTODY_POD_IP)", "--pgdata=$(CUSTODY_OUTPUT)",
                    "--wal-method=stream", "--checkpoint=fast", "--no-password"],
        "credentialsSecretRef": {"name": "orders-credentials"},
        "dataPath": "pgdata",
        "scratchSize": format!("{}Mi", volume_mib(scale)),
    }});
    let loading = std::time::Instant::now();
    let _source = postgres_source(&client, node, &namespace, Some(tool), scale).await;
    let loaded = loading.elapsed();
    // `--wal-method=fetch` needs the WAL of the copy's span kept.
    sql(&ns, "orders-0", "alter system set wal_keep_size = '1GB'").await;
    sql(&ns, "orders-0", "select pg_reload_conf()").await;
    let bytes: u64 = sql(&ns, "orders-0", "select pg_database_size('postgres')")
        .await
        .parse()
        .unwrap();
    let pods: Api<Pod> = namespace.api();
    let ip = pods
        .get("orders-0")
        .await
        .unwrap()
        .status
        .and_then(|status| status.pod_ip)
        .expect("the pod's address");
    let work = tempfile::tempdir().unwrap();

    // Baseline: pg_basebackup alone, to this machine's disk.
    let started = std::time::Instant::now();
    let tree = work.path().join("basebackup");
    let output = std::process::Command::new(format!("{PG_BIN}/pg_basebackup"))
        .args([
            "-h", &ip, "-U", "postgres", "-X", "stream", "-c", "fast", "-D",
        ])
        .arg(&tree)
        .env("PGPASSWORD", "a-test-password")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let local = started.elapsed();

    // Baseline: pgbench's longest transaction with no backup.
    let (quiet_count, quiet) = Latencies::start(&ip, &work.path().join("quiet"), Some(20))
        .finish()
        .await;

    // Speed, as the baseline ran: with no load. The first backup of the repository (nothing
    // to deduplicate against), then the same tool into scratch space first.
    let (tool_backup, tool_took) = timed_backup(&namespace, "streamed", None).await;
    let streamed_containers = container_seconds(&namespace, "streamed").await;
    let (directory_backup, directory_took) =
        timed_backup(&namespace, "directory", Some(directory)).await;
    let directory_containers = container_seconds(&namespace, "directory").await;

    // The write stall of a streamed Tool backup under load.
    let load = Latencies::start(&ip, &work.path().join("tool"), None);
    let (_, loaded_took) = timed_backup(&namespace, "tool", None).await;
    let (tool_count, tool_latency) = load.finish().await;
    let loaded_containers = container_seconds(&namespace, "tool").await;

    let load = Latencies::start(&ip, &work.path().join("frozen"), None);
    let (frozen_backup, frozen_took) = timed_backup(
        &namespace,
        "frozen",
        Some(json!({"method": "Freeze", "maxFreezeSeconds": 600})),
    )
    .await;
    let (frozen_count, frozen_latency) = load.finish().await;
    let frozen = frozen_backup.status.unwrap();

    // Restore to a running database vs copying the same tree.
    let (_target, restore_took) = restore_postgres(&client, node, &namespace, "tool", scale).await;
    let copy = LoopVolume::new(volume_mib(scale));
    let started = std::time::Instant::now();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&tree)
        .arg(copy.path().join("pgdata"))
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        std::process::Command::new("sync")
            .status()
            .unwrap()
            .success()
    );
    let copied = started.elapsed();

    let size = |status: Option<&custody_kube::api::BackupStatus>| {
        status
            .and_then(|status| status.artifact.as_ref())
            .and_then(|artifact| artifact.size_bytes)
            .unwrap_or_default() as f64
            / 1e6
    };
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-3);
    println!(
        "consistent capture of PostgreSQL, pgbench scale {scale}: database {:.2} GB (loaded in {:.0} s)",
        bytes as f64 / 1e9,
        loaded.as_secs_f64()
    );
    let speed = |took: Duration| local.as_secs_f64() / took.as_secs_f64().max(1e-3);
    println!(
        "  backup, method Tool streamed (pg_basebackup -F tar -D - read by the mover as written, {:.0} MB stored): {:.1} s from the Backup's creation; baseline pg_basebackup to local disk alone: {:.1} s (speed x{:.2} of the baseline)",
        size(tool_backup.status.as_ref()),
        tool_took.as_secs_f64(),
        local.as_secs_f64(),
        speed(tool_took)
    );
    println!(
        "  backup, method Tool into scratch space first (output: Directory, {:.0} MB stored): {:.1} s (speed x{:.2} of the baseline; the streamed one took x{:.2} of its time)",
        size(directory_backup.status.as_ref()),
        directory_took.as_secs_f64(),
        speed(directory_took),
        ratio(tool_took, directory_took)
    );
    let said = |containers: &[(String, f64)]| {
        containers
            .iter()
            .map(|(name, took)| format!("{name} {took:.1} s"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ran = |containers: &[(String, f64)], name: &str| {
        containers
            .iter()
            .find(|(found, _)| found == name)
            .map_or(0.0, |(_, took)| *took)
    };
    println!(
        "  in the Job's pod (whole seconds, as the kubelet records them): streamed: {}; into scratch space: {}. The streamed tool (pg_basebackup writing into the mover) ran x{:.2} the baseline's time",
        said(&streamed_containers),
        said(&directory_containers),
        ran(&streamed_containers, "tool") / local.as_secs_f64().max(1e-3)
    );
    println!(
        "  backup, method Tool streamed under pgbench -c 4: {:.1} s ({})",
        loaded_took.as_secs_f64(),
        said(&loaded_containers)
    );
    println!(
        "  backup, method Freeze ({:.0} MB): {:.1} s, filesystem frozen {} ms",
        size(Some(&frozen)),
        frozen_took.as_secs_f64(),
        frozen.frozen_millis.unwrap_or_default()
    );
    println!(
        "  restore to running (Tool backup, Cluster created to PostgreSQL answering): {:.1} s; baseline cp -a + sync of the same tree: {:.1} s (x{:.1})",
        restore_took.as_secs_f64(),
        copied.as_secs_f64(),
        ratio(restore_took, copied)
    );
    println!(
        "  write stall, pgbench -c 4's longest transaction: no backup {} ms ({quiet_count} transactions); during the Tool backup {} ms ({tool_count}); during the Freeze backup {} ms ({frozen_count})",
        quiet.as_millis(),
        tool_latency.as_millis(),
        frozen_latency.as_millis()
    );
    finish_postgres(&client, namespace).await;
}
