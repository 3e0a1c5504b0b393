//! MariaDB backed up and restored on the real node, frozen and by mariadb-backup while transfers run.

use super::*;
use crate::postgres::{Stage, finish_postgres, restore_shop};

/// Runs `query` as root in MariaDB in `pod`, waiting until it answers; the rows, tab-separated.
pub(crate) async fn mariadb(namespace: &str, pod: &str, query: &str) -> String {
    let (namespace, pod, query) = (namespace.to_string(), pod.to_string(), query.to_string());
    custody_tests::eventually("MariaDB answering", TIMEOUT, || {
        let (namespace, pod, query) = (namespace.clone(), pod.clone(), query.clone());
        async move {
            exec(
                &namespace,
                &pod,
                &["mariadb", "-uroot", "-N", "-B", "-e", &query],
            )
        }
    })
    .await
}

/// The bank: 1,000 InnoDB accounts of 1,000 each, a history of transfers and a counter of
/// them, 30 MB of random rows, and a procedure that moves money between two accounts in one
/// transaction (history row and counter with it) for as long as it is told, or until a row
/// in bank.stop says to stop ([`stop_transfers`]). In any consistent state the balances sum
/// to 1,000,000 and the counter equals the history's rows.
pub(crate) const BANK: &str = "
create database bank;
use bank;
create table bank.accounts (id int primary key, balance bigint not null) engine=InnoDB;
insert into bank.accounts select seq, 1000 from seq_1_to_1000;
create table bank.history (id bigint auto_increment primary key, a int not null, b int not null, amount int not null) engine=InnoDB;
create table bank.counter (id int primary key, n bigint not null) engine=InnoDB;
insert into bank.counter values (1, 0);
create table bank.filler (id int primary key, data varbinary(1024)) engine=InnoDB;
insert into bank.filler select seq, random_bytes(1024) from seq_1_to_30000;
create table bank.stop (id int primary key) engine=InnoDB;
delimiter //
create procedure bank.transfers(seconds int)
begin
  declare deadline datetime default now() + interval seconds second;
  declare a, b, x int;
  while now() < deadline and not exists (select 1 from bank.stop) do
    set a = 1 + floor(rand() * 1000), x = 1 + floor(rand() * 100);
    set b = a % 1000 + 1;
    start transaction;
    update bank.accounts set balance = balance + if(id = a, -x, x) where id in (a, b);
    insert into bank.history (a, b, amount) values (a, b, x);
    update bank.counter set n = n + 1 where id = 1;
    commit;
  end while;
end //
delimiter ;
";

/// Consistency method `Tool` by `mariadb-backup --backup` then `--prepare`, as root with the
/// password of Secret orders-credentials.
pub(crate) fn mariadb_backup_tool() -> serde_json::Value {
    json!({
        "method": "Tool",
        "tool": {
            "image": "localhost/custody/mariadb:10.11",
            "command": ["sh", "-c", "mariadb-backup --backup --target-dir=\"$CUSTODY_OUTPUT\" --host=\"$CUSTODY_POD_IP\" --user=root --password=\"$MARIADB_ROOT_PASSWORD\" && mariadb-backup --prepare --target-dir=\"$CUSTODY_OUTPUT\""],
            "mountPath": "/var/lib/mysql",
            "credentialsSecretRef": {"name": "orders-credentials"},
            "dataPath": "db",
            "scratchSize": "1Gi",
        },
    })
}

/// The bank's invariants, as `sum(balance) count(accounts) counter count(history)`.
pub(crate) const BANK_SUMS: &str = "select concat((select sum(balance) from bank.accounts), ' ', (select count(*) from bank.accounts), ' ', (select n from bank.counter), ' ', (select count(*) from bank.history))";

/// Cluster `orders`: MariaDB on a real volume of the node with `consistency`, and the bank.
pub(crate) async fn mariadb_source(
    client: &kube::Client,
    node: &str,
    namespace: &TestNamespace,
    consistency: serde_json::Value,
) -> LoopVolume {
    let ns = namespace.name.clone();
    let source = LoopVolume::new(1024);
    std::os::unix::fs::chown(source.path(), Some(999), Some(999)).unwrap();
    local_volume(client, node, &ns, "data-orders-0", source.path()).await;
    create::<Cluster>(
        &namespace.api(),
        json!({"apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
               "metadata": {"name": "orders"},
               "spec": {"statefulSetRef": {"name": "orders"}, "volumeClaimTemplates": ["data"],
                        "repositoryRef": {"name": "store"}, "consistency": consistency}}),
    )
    .await;
    create::<StatefulSet>(&namespace.api(), mariadb_statefulset("orders")).await;
    mariadb(&ns, "orders-0", "select 1").await;
    exec(&ns, "orders-0", &["mariadb", "-uroot", "-e", BANK]).unwrap();
    source
}

/// Four clients moving money for `seconds`, each in its own `kubectl exec`.
pub(crate) fn transfers(
    namespace: &str,
    seconds: u32,
) -> Vec<std::thread::JoinHandle<Result<String, String>>> {
    (0..4)
        .map(|_| {
            let ns = namespace.to_string();
            std::thread::spawn(move || {
                exec(
                    &ns,
                    "orders-0",
                    &[
                        "mariadb",
                        "-uroot",
                        "-e",
                        &format!("call bank.transfers({seconds})"),
                    ],
                )
            })
        })
        .collect()
}

/// [`transfers`] that run until [`stop_transfers`] (at most 15 minutes): for a load that must
/// last through backups whose time a loaded machine makes hard to foresee.
pub(crate) fn transfers_until_stopped(
    namespace: &str,
) -> Vec<std::thread::JoinHandle<Result<String, String>>> {
    transfers(namespace, 900)
}

/// Ends `load` in orders-0 at its next transaction (a row in bank.stop) once it has run
/// through `what`: every client must still be running, and each then ends without an error.
pub(crate) async fn stop_transfers(
    namespace: &str,
    load: Vec<std::thread::JoinHandle<Result<String, String>>>,
    what: &str,
) {
    assert!(
        load.iter().all(|client| !client.is_finished()),
        "a transfer client ended before {what} did"
    );
    mariadb(
        namespace,
        "orders-0",
        "insert ignore into bank.stop values (1)",
    )
    .await;
    for client in load {
        let done = tokio::task::spawn_blocking(move || client.join().unwrap())
            .await
            .unwrap();
        done.unwrap_or_else(|error| panic!("the transfers kept running through {what}: {error}"));
    }
}

/// The acceptance checks of a MariaDB restored into shop-0: it started, the bank's invariants
/// hold, and `mariadb-check --all-databases --extended` finds every table OK. The sums.
pub(crate) async fn mariadb_consistent(namespace: &TestNamespace) -> String {
    let ns = namespace.name.clone();
    let sums = mariadb(&ns, "shop-0", BANK_SUMS).await;
    let parts: Vec<&str> = sums.split(' ').collect();
    assert_eq!(parts.len(), 4, "{sums}");
    assert_eq!(
        (parts[0], parts[1]),
        ("1000000", "1000"),
        "money or accounts lost: {sums}"
    );
    assert_eq!(
        parts[2], parts[3],
        "a torn transfer: counter vs history in {sums}"
    );
    let checked = exec(
        &ns,
        "shop-0",
        &["mariadb-check", "-uroot", "--all-databases", "--extended"],
    )
    .expect("mariadb-check ran");
    let bad: Vec<&str> = checked
        .lines()
        .filter(|line| !line.trim_end().ends_with("OK"))
        .collect();
    assert!(bad.is_empty(), "mariadb-check: {bad:?} in\n{checked}");
    assert!(checked.contains("bank.accounts"), "{checked}");
    sums
}

/// Issue 14 on a real MariaDB, both methods: four clients move money between InnoDB accounts
/// while a Backup copies the volume with its filesystem frozen (the upload throttled so the
/// copy spans many seconds of writes), and another while `mariadb-backup --backup` then
/// `--prepare` (method Tool) copies it. Each restores through the gate into a MariaDB that
/// starts without a manual step (crash recovery from one instant; a prepared backup), with the
/// money all there, every transfer whole, and `mariadb-check --all-databases --extended`
/// clean.
#[tokio::test]
async fn on_a_real_node_mariadb_frozen_while_transfers_run_restores_consistent() {
    mariadb_under_load(
        "mdbfreeze",
        json!({"method": "Freeze", "maxFreezeSeconds": 120}),
        Capture::Frozen,
    )
    .await;
}

/// See [`on_a_real_node_mariadb_frozen_while_transfers_run_restores_consistent`].
#[tokio::test]
async fn on_a_real_node_mariadb_backed_up_by_mariadb_backup_while_transfers_run_restores_consistent()
 {
    mariadb_under_load("mdbtool", mariadb_backup_tool(), Capture::Tool).await;
}

pub(crate) async fn mariadb_under_load(
    name: &str,
    consistency: serde_json::Value,
    capture: Capture,
) {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new(name, true).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"MARIADB_ROOT_PASSWORD": "a-test-password"}}),
    )
    .await;
    let _source = mariadb_source(&client, node, &namespace, consistency).await;

    // Until the backup is done: a copy of an idle MariaDB would prove nothing about one that
    // writes.
    let load = transfers_until_stopped(&ns);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = std::time::Instant::now();
    nightly_completed(&namespace).await;
    let backup_took = started.elapsed();
    let during = mariadb(&ns, "orders-0", "select n from bank.counter").await;
    stop_transfers(&ns, load, "the backup").await;
    let total = mariadb(&ns, "orders-0", "select n from bank.counter").await;
    let nightly = namespace.api::<Backup>().get("nightly").await.unwrap();
    let status = nightly.status.unwrap();
    assert_eq!(status.consistency, Some(capture), "{status:?}");

    let started = std::time::Instant::now();
    let target = restore_shop(
        &client,
        node,
        &namespace,
        "nightly",
        mariadb_statefulset("shop"),
        1024,
    )
    .await;
    let sums = mariadb_consistent(&namespace).await;
    let restore_to_answer = started.elapsed();
    if capture == Capture::Tool {
        assert!(
            target.path().join("db/xtrabackup_info").exists(),
            "not the tree mariadb-backup prepared"
        );
    }
    eprintln!(
        "mariadb {capture:?} copy under 4 transfer clients ({during} transfers when the backup ended, {total} in all): Backup created to Completed {:.1} s, frozen {} ms, artifact {} bytes; restored sums {sums}; restore to checked {:.1} s",
        backup_took.as_secs_f64(),
        status.frozen_millis.unwrap_or_default(),
        status
            .artifact
            .and_then(|artifact| artifact.size_bytes)
            .unwrap_or_default(),
        restore_to_answer.as_secs_f64()
    );
    finish_postgres(&client, namespace).await;
}

/// Issue 24 item 2's report: after a `mariadb-backup` Tool backup of a MariaDB 10.11 taking a
/// mixed load (InnoDB transfers, an Aria and a MyISAM table written in the same loop, an
/// `ALTER TABLE … ADD COLUMN` loop), two source transactions sat in `Commit` for minutes.
/// This runs that load through such a backup and then watches the source for a minute:
/// commits must go on (the transfer counter grows between looks) and every client of the
/// mixed load and the ALTER loop must finish an iteration every 10 s; a failure prints the
/// process list and InnoDB's log status. Ignored: a reproduction (hack/repro-mariadb-commit.sh), not a check of custody.
#[tokio::test]
#[ignore = "a reproduction on the real node: hack/repro-mariadb-commit.sh"]
async fn on_a_real_node_mariadb_commits_go_on_after_a_mariadb_backup_under_a_mixed_load() {
    let Stage {
        node,
        client,
        namespace,
        // Held to the end of the test: the install, the agents' lock and the relay.
        _agents,
        _installed,
        _relay,
    } = Stage::new("mdbmixed", true).await;
    let ns = namespace.name.clone();
    create::<k8s_openapi::api::core::v1::Secret>(
        &namespace.api(),
        json!({"metadata": {"name": "orders-credentials"},
               "stringData": {"MARIADB_ROOT_PASSWORD": "a-test-password"}}),
    )
    .await;
    let tool = mariadb_backup_tool();
    let _source = mariadb_source(&client, node, &namespace, tool).await;
    exec(
        &ns,
        "orders-0",
        &["mariadb", "-uroot", "-e", "
create table bank.aria_log (id bigint auto_increment primary key, a int, amount int) engine=Aria;
create table bank.myisam_log (id bigint auto_increment primary key, a int, amount int) engine=MyISAM;
create table bank.altered (id int primary key, v int) engine=InnoDB;
create table bank.progress (conn bigint primary key, n bigint) engine=InnoDB;
insert into bank.altered select seq, seq from bank.seq_1_to_20000;
delimiter //
create procedure bank.mixed(seconds int)
begin
  declare deadline datetime default now() + interval seconds second;
  declare a, x int;
  while now() < deadline do
    set a = 1 + floor(rand() * 1000), x = 1 + floor(rand() * 100);
    start transaction;
    update bank.accounts set balance = balance + if(id = a, -x, x) where id in (a, a % 1000 + 1);
    insert into bank.history (a, b, amount) values (a, a % 1000 + 1, x);
    update bank.counter set n = n + 1 where id = 1;
    commit;
    insert into bank.aria_log (a, amount) values (a, x);
    insert into bank.myisam_log (a, amount) values (a, x);
    insert into bank.progress values (connection_id(), 1) on duplicate key update n = n + 1;
  end while;
end //
create procedure bank.alters(seconds int)
begin
  declare deadline datetime default now() + interval seconds second;
  while now() < deadline do
    alter table bank.altered add column extra int;
    alter table bank.altered drop column extra;
    insert into bank.progress values (connection_id(), 1) on duplicate key update n = n + 1;
  end while;
end //
delimiter ;
"],
    )
    .unwrap();
    // Long enough that the load still runs through the backup and the minute of watching.
    let seconds = 150;
    let mut load = transfers(&ns, seconds);
    for call in ["mixed", "mixed", "alters"] {
        let ns = ns.clone();
        load.push(std::thread::spawn(move || {
            exec(
                &ns,
                "orders-0",
                &[
                    "mariadb",
                    "-uroot",
                    "-e",
                    &format!("call bank.{call}({seconds})"),
                ],
            )
        }));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    nightly_completed(&namespace).await;
    eprintln!("the mariadb-backup Tool backup completed; watching the source's commits");
    // Each client of the mixed load and of the ALTER loop counts its iterations in
    // bank.progress (a processlist's TIME counts from the CALL, not from the statement
    // inside it, so it cannot tell a stuck commit from a long procedure).
    let progress = "select group_concat(conn, ':', n order by conn) from bank.progress";
    let mut before: u64 = mariadb(&ns, "orders-0", "select n from bank.counter")
        .await
        .parse()
        .unwrap();
    let mut clients_before = mariadb(&ns, "orders-0", progress).await;
    for look in 0..6 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let now: u64 = mariadb(&ns, "orders-0", "select n from bank.counter")
            .await
            .parse()
            .unwrap();
        let clients = mariadb(&ns, "orders-0", progress).await;
        let stalled: Vec<&str> = clients_before
            .split(',')
            .filter(|client| clients.split(',').any(|now| now == *client))
            .collect();
        let sitting = format!("clients that made no iteration in 10 s (conn:n): {stalled:?}");
        if now == before || !stalled.is_empty() {
            let status = mariadb(&ns, "orders-0", "show engine innodb status").await;
            let log: Vec<&str> = status
                .split("\\n")
                .filter(|line| {
                    line.contains("Log sequence number")
                        || line.contains("flushed up to")
                        || line.contains("checkpoint")
                })
                .collect();
            let threads = mariadb(&ns, "orders-0", "show full processlist").await;
            panic!(
                "look {look}, {} s after the backup: commits {before} then {now}; {sitting}\nInnoDB log: {log:?}\nprocess list:\n{threads}",
                10 * (look + 1)
            );
        }
        before = now;
        clients_before = clients;
    }
    eprintln!(
        "commits went on for 60 s after the backup (counter {before}; clients {clients_before})"
    );
    for client in load {
        let _ = tokio::task::spawn_blocking(move || client.join().unwrap()).await;
    }
    finish_postgres(&client, namespace).await;
}
