//! How custody's Jobs run `custody-mover` (and a user's backup command): the image, a hard
//! bound on how long a Job may run, and the resources its container asks for. A Job past its
//! bound is failed by Kubernetes (`DeadlineExceeded`), and the Backup or Restore fails with
//! that reason and gives the Cluster's Lease back: nothing waits forever for a pod that never
//! starts or never ends.

/// The Jobs' settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoverJob {
    pub image: String,
    /// The Job's `activeDeadlineSeconds`.
    pub deadline_seconds: i64,
    pub cpu_request: String,
    pub memory_request: String,
    pub memory_limit: String,
}

impl MoverJob {
    /// The settings for `image` with the defaults of `custody-controller run`.
    pub fn new(image: impl Into<String>) -> MoverJob {
        MoverJob {
            image: image.into(),
            deadline_seconds: DEFAULT_DEADLINE_SECONDS,
            cpu_request: DEFAULT_CPU_REQUEST.into(),
            memory_request: DEFAULT_MEMORY_REQUEST.into(),
            memory_limit: DEFAULT_MEMORY_LIMIT.into(),
        }
    }

    /// A Job of `owner` running `container` once on its node, with its claim mounted as volume
    /// `data`: owned by `owner` (blocking its deletion), labelled on the Job and its pod,
    /// never retried by Kubernetes, bounded by the deadline, the container given the
    /// resources.
    pub fn job<K: kube::Resource<DynamicType = ()>>(
        &self,
        name: &str,
        owner: &K,
        labels: &std::collections::BTreeMap<String, String>,
        on: Placement<'_>,
        mut container: serde_json::Value,
    ) -> k8s_openapi::api::batch::v1::Job {
        container["resources"] = self.resources();
        // Writable scratch space under a read-only root filesystem: the backup's manifest is
        // spooled to a temporary file until the archive is uploaded.
        append(
            &mut container,
            "volumeMounts",
            [serde_json::json!({"name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH})],
        );
        append(
            &mut container,
            "env",
            [serde_json::json!({"name": "TMPDIR", "value": SCRATCH_PATH})],
        );
        let owner = crate::ownership::controller_reference(owner);
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": labels,
                "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
            },
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": self.deadline_seconds,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeName": on.node,
                        "restartPolicy": "Never",
                        "containers": [container],
                        "volumes": [
                            {"name": "data", "persistentVolumeClaim": {"claimName": on.claim, "readOnly": on.read_only}},
                            {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": SCRATCH_LIMIT}},
                        ],
                    },
                },
            },
        }))
        .expect("a valid Job")
    }

    /// The container's `resources`.
    pub fn resources(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": {"memory": self.memory_limit},
        })
    }
}

/// Appends `items` to the list `field` of a container (`env`, `volumeMounts`), creating it.
pub fn append(
    container: &mut serde_json::Value,
    field: &str,
    items: impl IntoIterator<Item = serde_json::Value>,
) {
    let mut list = container[field].as_array().cloned().unwrap_or_default();
    list.extend(items);
    container[field] = serde_json::Value::Array(list);
}

/// Where a Job runs and the claim it mounts.
#[derive(Clone, Copy, Debug)]
pub struct Placement<'a> {
    /// The node the pod runs on; `None` leaves it to the scheduler (the claim's volume
    /// topology decides).
    pub node: Option<&'a str>,
    pub claim: &'a str,
    pub read_only: bool,
}

/// The scratch volume of a Job's pod, its mount path (also `TMPDIR`) and its size bound: a
/// manifest line is about 150 bytes, so 1 GiB holds the manifest of some seven million files.
pub const SCRATCH_VOLUME: &str = "scratch";
pub const SCRATCH_PATH: &str = "/tmp";
pub const SCRATCH_LIMIT: &str = "1Gi";

/// A day: the largest volumes restore well within it on the hardware custody is measured on.
pub const DEFAULT_DEADLINE_SECONDS: i64 = 86_400;
/// The mover streams with two threads and bounded buffers (peak RSS about 60 MiB measured).
pub const DEFAULT_CPU_REQUEST: &str = "100m";
pub const DEFAULT_MEMORY_REQUEST: &str = "128Mi";
pub const DEFAULT_MEMORY_LIMIT: &str = "1Gi";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_has_bounded_scratch_space_for_a_read_only_root() {
        let owner: custody_kube::api::Restore = serde_json::from_value(serde_json::json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u"},
            "spec": {"clusterRef": {"name": "c"}, "backupRef": {"name": "b"}},
        }))
        .unwrap();
        let job = MoverJob::new("mover:1").job(
            "j",
            &owner,
            &Default::default(),
            Placement {
                node: Some("node-a"),
                claim: "data-db-0",
                read_only: true,
            },
            serde_json::json!({"name": "mover", "image": "mover:1",
                "env": [{"name": "A", "value": "1"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "securityContext": {"readOnlyRootFilesystem": true}}),
        );
        let pod = job.spec.unwrap().template.spec.unwrap();
        let scratch = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|volume| volume.name == SCRATCH_VOLUME)
            .and_then(|volume| volume.empty_dir)
            .expect("an emptyDir");
        assert_eq!(scratch.size_limit.unwrap().0, SCRATCH_LIMIT);
        let container = &pod.containers[0];
        let mounts: Vec<(&str, &str)> = container
            .volume_mounts
            .iter()
            .flatten()
            .map(|mount| (mount.name.as_str(), mount.mount_path.as_str()))
            .collect();
        assert_eq!(mounts, [("data", "/data"), (SCRATCH_VOLUME, SCRATCH_PATH)]);
        let env: Vec<(&str, Option<&str>)> = container
            .env
            .iter()
            .flatten()
            .map(|variable| (variable.name.as_str(), variable.value.as_deref()))
            .collect();
        assert_eq!(env, [("A", Some("1")), ("TMPDIR", Some(SCRATCH_PATH))]);
    }
}
