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
                        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": on.claim, "readOnly": on.read_only}}],
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

/// Where a Job runs and the claim it mounts.
#[derive(Clone, Copy, Debug)]
pub struct Placement<'a> {
    pub node: &'a str,
    pub claim: &'a str,
    pub read_only: bool,
}

/// A day: the largest volumes restore well within it on the hardware custody is measured on.
pub const DEFAULT_DEADLINE_SECONDS: i64 = 86_400;
/// The mover streams with two threads and bounded buffers (peak RSS about 60 MiB measured).
pub const DEFAULT_CPU_REQUEST: &str = "100m";
pub const DEFAULT_MEMORY_REQUEST: &str = "128Mi";
pub const DEFAULT_MEMORY_LIMIT: &str = "1Gi";
