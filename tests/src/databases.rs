//! The databases of the real-node tests, as their StatefulSets and a way into their pods:
//! PostgreSQL 15 (hack/build-postgres-image.sh), with its WAL on a volume of its own or not,
//! and MariaDB 10.11, each under the restricted Pod Security profile's container settings.

use serde_json::json;

use crate::kubectl;

/// A StatefulSet of one PostgreSQL pod (hack/build-postgres-image.sh) labelled for Cluster
/// `name`, its data directory on claim template `data`, under the restricted Pod Security
/// profile's container settings.
pub fn postgres_statefulset(name: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "custody.io/cluster": name}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 999, "runAsGroup": 999,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "db", "image": "localhost/custody/postgres:15",
                        "imagePullPolicy": "Never",
                        "securityContext": {"allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]}},
                        "readinessProbe": {"exec": {"command": ["pg_isready", "-q"]},
                                           "periodSeconds": 1},
                        // A new database's password, for a backup tool's connection.
                        "env": [{"name": "POSTGRES_PASSWORD", "valueFrom": {"secretKeyRef": {
                            "name": format!("{name}-credentials"), "key": "PGPASSWORD",
                            "optional": true}}}],
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "custody-real-node",
                         "resources": {"requests": {"storage": "64Mi"}}},
            }],
        },
    })
}

/// Runs `command` in the `db` container of `pod`; its standard output, or the failure.
pub fn exec(namespace: &str, pod: &str, command: &[&str]) -> Result<String, String> {
    let mut args = vec!["-n", namespace, "exec", pod, "-c", "db", "--"];
    args.extend_from_slice(command);
    let output = kubectl(&args);
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        Err(format!(
            "{command:?} in {pod}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The mounts of PostgreSQL's volumes: its data, and (`with_wal`) its WAL's volume.
pub fn wal_mounts(with_wal: bool) -> serde_json::Value {
    let mut mounts = vec![json!({"name": "data", "mountPath": "/var/lib/postgresql/data"})];
    if with_wal {
        mounts.push(json!({"name": "wal", "mountPath": "/var/lib/postgresql/wal"}));
    }
    json!(mounts)
}

/// The pod volumes of StatefulSet `set`'s first pod's claims: data, and (`with_wal`) wal.
pub fn wal_volumes(with_wal: bool, set: &str) -> serde_json::Value {
    let mut volumes = vec![
        json!({"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{set}-0")}}),
    ];
    if with_wal {
        volumes.push(
            json!({"name": "wal", "persistentVolumeClaim": {"claimName": format!("wal-{set}-0")}}),
        );
    }
    json!(volumes)
}

/// [`postgres_statefulset`] with its WAL on a volume of its own (claim template `wal`,
/// mounted at /var/lib/postgresql/wal; `pg_wal` a symlink into it), as CloudNativePG and
/// KubeBlocks lay PostgreSQL out.
pub fn postgres_statefulset_with_wal(name: &str) -> serde_json::Value {
    let mut set = postgres_statefulset(name);
    let container = &mut set["spec"]["template"]["spec"]["containers"][0];
    container["volumeMounts"] = wal_mounts(true);
    container["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "POSTGRES_INITDB_WALDIR", "value": "/var/lib/postgresql/wal/pg_wal"}));
    let template = set["spec"]["volumeClaimTemplates"][0].clone();
    let mut wal = template;
    wal["metadata"]["name"] = json!("wal");
    set["spec"]["volumeClaimTemplates"]
        .as_array_mut()
        .unwrap()
        .push(wal);
    set
}

/// A StatefulSet of one MariaDB on claim `data` (data directory `db` on it), its root
/// password for other hosts (a backup tool's connection) from Secret `<name>-credentials` if
/// it exists.
pub fn mariadb_statefulset(name: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "custody.io/cluster": name}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 999, "runAsGroup": 999,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "db", "image": "localhost/custody/mariadb:10.11",
                        "imagePullPolicy": "Never",
                        "securityContext": {"allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]}},
                        "readinessProbe": {"exec": {"command": ["mariadb-admin", "-uroot", "ping"]},
                                           "periodSeconds": 1},
                        "env": [{"name": "MARIADB_ROOT_PASSWORD", "valueFrom": {"secretKeyRef": {
                            "name": format!("{name}-credentials"), "key": "MARIADB_ROOT_PASSWORD",
                            "optional": true}}}],
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/mysql"}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "custody-real-node",
                         "resources": {"requests": {"storage": "64Mi"}}},
            }],
        },
    })
}
