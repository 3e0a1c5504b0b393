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

    /// The container's `resources`.
    pub fn resources(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": {"memory": self.memory_limit},
        })
    }
}

/// A day: the largest volumes restore well within it on the hardware custody is measured on.
pub const DEFAULT_DEADLINE_SECONDS: i64 = 86_400;
/// The mover streams with two threads and bounded buffers (peak RSS about 60 MiB measured).
pub const DEFAULT_CPU_REQUEST: &str = "100m";
pub const DEFAULT_MEMORY_REQUEST: &str = "128Mi";
pub const DEFAULT_MEMORY_LIMIT: &str = "1Gi";
