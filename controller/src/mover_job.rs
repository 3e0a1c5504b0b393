//! How custody's Jobs run `custody-mover` (and a user's backup command): the image, a hard
//! bound on how long a Job may run, and the resources its container asks for. A Job past its
//! bound is failed by Kubernetes (`DeadlineExceeded`), and the Backup or Restore fails with
//! that reason and gives the Cluster's Lease back: nothing waits forever for a pod that never
//! starts or never ends.

use custody_proto::mover::EXIT_PERMANENT;

/// The Jobs' settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoverJob {
    pub image: String,
    /// The Job's `activeDeadlineSeconds`.
    pub deadline_seconds: i64,
    pub cpu_request: String,
    pub memory_request: String,
    pub memory_limit: String,
    /// How many times a prepareData Job tries its pod again after a failure of the moment
    /// (its `backoffLimit`); a backup Job never does (a second upload would race the first).
    pub restore_retries: i32,
    /// The most backup and prepareData Jobs on one node at once (0: no bound; see
    /// [`crate::node_slots`]).
    pub movers_per_node: u32,
    /// A running copy whose counts stand still longer than this is `Stalled`
    /// ([`crate::transfer::stalled`]).
    pub stalled_after: std::time::Duration,
    /// Gate certificates name their node ([`crate::inject::gate_env`]).
    pub per_node_gate_names: bool,
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
            restore_retries: DEFAULT_RESTORE_RETRIES,
            movers_per_node: 0,
            stalled_after: std::time::Duration::from_secs(
                crate::transfer::DEFAULT_STALLED_AFTER_SECONDS,
            ),
            per_node_gate_names: false,
        }
    }

    /// A Job of `owner` running `container` on its node, with its claim mounted as volume
    /// `data` (no node and no claim without a placement: a repository's maintenance): owned by `owner` (blocking its deletion), labelled on the Job and its pod,
    /// bounded by the deadline, the container given the resources. With `retries` 0 its pod
    /// runs once; otherwise a pod that failed is replaced up to `retries` times, except when
    /// the mover said trying again cannot help (exit code [`EXIT_PERMANENT`]: the Job fails
    /// at once), and a pod evicted or preempted (`DisruptionTarget`) does not count.
    pub fn job<K: kube::Resource<DynamicType = ()>>(
        &self,
        name: &str,
        owner: &K,
        labels: &std::collections::BTreeMap<String, String>,
        on: Option<Placement<'_>>,
        retries: i32,
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
            [
                serde_json::json!({"name": "TMPDIR", "value": SCRATCH_PATH}),
                // Read by the node agent under the kubelet's root: how far the mover is.
                serde_json::json!({"name": custody_proto::progress::ENV_FILE, "value": format!("{SCRATCH_PATH}/{}", custody_proto::progress::FILE_NAME)}),
            ],
        );
        let owner = crate::ownership::controller_reference(owner);
        let mut volumes = vec![
            serde_json::json!({"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": SCRATCH_LIMIT}}),
        ];
        if let Some(on) = on {
            volumes.insert(
                0,
                serde_json::json!({"name": "data", "persistentVolumeClaim": {"claimName": on.claim, "readOnly": on.read_only}}),
            );
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": labels,
                "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
            },
            "spec": {
                "backoffLimit": retries.max(0),
                "podFailurePolicy": (retries > 0).then(|| retry_policy(&container)),
                "activeDeadlineSeconds": self.deadline_seconds,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeName": on.and_then(|on| on.node),
                        "restartPolicy": "Never",
                        // No container of custody's Jobs talks to the API server (a frozen
                        // copy's mover has its own token for the agent, audience custody):
                        // a tool or command run here gets no token of the namespace.
                        "automountServiceAccountToken": false,
                        "containers": [container],
                        "volumes": volumes,
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

/// A Job of a repository that signs with a web identity: its pod runs as the identity's
/// ServiceAccount with the token for the STS's audience projected into it (and still no token
/// for the Kubernetes API), mounted where `AWS_WEB_IDENTITY_TOKEN_FILE` says in every
/// container given the repository's environment (the mover, or a user's command). A
/// repository that signs with keys changes nothing.
pub fn with_web_identity(
    mut job: k8s_openapi::api::batch::v1::Job,
    repository: &custody_kube::api::BackupRepositorySpec,
) -> k8s_openapi::api::batch::v1::Job {
    let (Some(identity), Some(volume)) = (
        repository.web_identity.as_ref(),
        custody_kube::s3::web_identity_volume(repository),
    ) else {
        return job;
    };
    let Some(pod) = job
        .spec
        .as_mut()
        .and_then(|spec| spec.template.spec.as_mut())
    else {
        return job;
    };
    pod.service_account_name = Some(identity.service_account_name.clone());
    pod.volumes
        .get_or_insert_default()
        .push(serde_json::from_value(volume).expect("a valid volume"));
    let mount = k8s_openapi::api::core::v1::VolumeMount {
        name: custody_kube::s3::WEB_IDENTITY_VOLUME.to_string(),
        mount_path: custody_kube::sts::TOKEN_DIRECTORY.to_string(),
        read_only: Some(true),
        ..Default::default()
    };
    let mut others = Vec::new();
    for container in pod
        .containers
        .iter_mut()
        .chain(pod.init_containers.iter_mut().flatten())
    {
        let signs =
            container.env.iter().flatten().any(|variable| {
                variable.name == custody_proto::mover::env::WEB_IDENTITY_TOKEN_FILE
            });
        if signs {
            container
                .volume_mounts
                .get_or_insert_default()
                .push(mount.clone());
        } else {
            others.push(container.name.clone());
        }
    }
    // EKS's pod identity webhook gives a pod's ServiceAccount role to every container it
    // does not skip: a tool's container must not get the repository's credentials that way.
    if !others.is_empty()
        && let Some(template) = job
            .spec
            .as_mut()
            .map(|spec| spec.template.metadata.get_or_insert_default())
    {
        template
            .annotations
            .get_or_insert_default()
            .insert(EKS_SKIP_CONTAINERS.to_string(), others.join(","));
    }
    job
}

/// The annotation by which EKS's pod identity webhook leaves containers of a pod alone.
pub const EKS_SKIP_CONTAINERS: &str = "eks.amazonaws.com/skip-containers";

/// Which failures a retried Job gives up on at once, and which it does not count.
fn retry_policy(container: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({"rules": [
        {"action": "FailJob", "onExitCodes": {
            "containerName": container["name"],
            "operator": "In",
            "values": [EXIT_PERMANENT],
        }},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]})
}

/// The mover container's `securityContext`: root (it reads, or writes, files of every owner
/// with their owners and modes), with a read-only root filesystem, no privilege escalation,
/// the runtime's default seccomp profile, and of the capabilities only `add`. This is what Pod
/// Security `baseline` admits and `restricted` refuses (it runs as root and adds
/// capabilities): a namespace enforcing `restricted` must allow `baseline` for custody's Jobs.
pub fn security_context(add: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "runAsUser": 0,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"], "add": add},
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// What the backup mover may do: read and traverse every file and directory, whatever its
/// owner and mode.
pub const BACKUP_CAPABILITIES: &[&str] = &["DAC_OVERRIDE"];
/// What the restore mover may do: write into directories of any mode, give files their
/// owners, then set modes, times and set-id bits on files it no longer owns.
pub const RESTORE_CAPABILITIES: &[&str] = &["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"];

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

/// The node a Job's pods are pinned to, if it names one.
pub fn node_of(job: &k8s_openapi::api::batch::v1::Job) -> Option<&str> {
    job.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .node_name
        .as_deref()
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
/// The default of `--restore-job-retries`.
pub const DEFAULT_RESTORE_RETRIES: i32 = 2;

/// The pods `job` created (its controller owner is that Job: a look-alike pod with the
/// `job-name` label is not one of them).
pub async fn pods_of(
    client: &kube::Client,
    namespace: &str,
    job_name: &str,
    job: Option<&k8s_openapi::api::batch::v1::Job>,
) -> crate::error::Result<Vec<k8s_openapi::api::core::v1::Pod>> {
    use kube::api::{Api, ListParams};
    let job_uid = job
        .and_then(|job| job.metadata.uid.as_deref())
        .unwrap_or_default();
    Ok(
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().labels(&format!("job-name={job_name}")))
            .await
            .map_err(crate::error::Error::read(format!(
                "pods of Job {namespace}/{job_name}"
            )))?
            .items
            .into_iter()
            .filter(|pod| crate::ownership::created_by_job(&pod.metadata, job_uid))
            .collect(),
    )
}

/// Why a running Job's pod does not start (see [`crate::backups::decide::pod_not_starting`]):
/// from its `pods` ([`pods_of`]) and, when it has none, the Job controller's latest
/// `FailedCreate` Event about it (a Pod Security or quota refusal leaves no pod, only that
/// Event).
pub async fn start_problem(
    client: &kube::Client,
    namespace: &str,
    job_name: &str,
    job: Option<&k8s_openapi::api::batch::v1::Job>,
    pods: &[k8s_openapi::api::core::v1::Pod],
) -> crate::error::Result<Option<String>> {
    use kube::api::{Api, ListParams};
    let mut refused = None;
    if pods.is_empty()
        && let Some(uid) = job.and_then(|job| job.metadata.uid.as_deref())
    {
        let events =
            Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), namespace)
                .list(
                    &ListParams::default()
                        .fields(&format!("involvedObject.uid={uid},reason=FailedCreate")),
                )
                .await
                .map_err(crate::error::Error::read(format!(
                    "Events of Job {namespace}/{job_name}"
                )))?
                .items;
        refused = latest_message(events);
    }
    Ok(crate::backups::decide::pod_not_starting(
        pods,
        refused.as_deref(),
    ))
}

/// The message of the most recent of `events` (by `lastTimestamp`, else `eventTime`): the Job
/// controller's latest word on why it could not create a pod.
fn latest_message(events: Vec<k8s_openapi::api::core::v1::Event>) -> Option<String> {
    events
        .into_iter()
        .max_by_key(|event| {
            event
                .last_timestamp
                .as_ref()
                .map(|time| time.0)
                .or(event.event_time.as_ref().map(|time| time.0))
        })
        .and_then(|event| event.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_refusal_is_the_one_named() {
        let event = |message: &str, last: Option<&str>, time: Option<&str>| {
            serde_json::from_value::<k8s_openapi::api::core::v1::Event>(serde_json::json!({
                "metadata": {"name": message},
                "involvedObject": {},
                "message": message,
                "lastTimestamp": last,
                "eventTime": time,
            }))
            .unwrap()
        };
        assert_eq!(latest_message(Vec::new()), None);
        let events = vec![
            event("quota", Some("2026-12-01T10:00:00Z"), None),
            event("pod security", Some("2026-12-01T10:05:00Z"), None),
            event("older", Some("2026-12-01T09:00:00Z"), None),
        ];
        assert_eq!(latest_message(events).as_deref(), Some("pod security"));
        // An event with only an eventTime (events.k8s.io) counts by that.
        let events = vec![
            event("quota", Some("2026-12-01T10:00:00Z"), None),
            event("new style", None, Some("2026-12-01T11:00:00.000000Z")),
        ];
        assert_eq!(latest_message(events).as_deref(), Some("new style"));
    }

    /// Only the containers given the repository's environment get the token (a backup's
    /// command does, a tool's container does not, and EKS's webhook is told to skip it); a
    /// repository with keys changes nothing.
    #[test]
    fn a_web_identity_is_mounted_only_where_the_repository_signs() {
        let repository = |signer: serde_json::Value| -> custody_kube::api::BackupRepositorySpec {
            let mut spec = serde_json::json!({"endpoint": "https://s3", "bucket": "b"});
            spec.as_object_mut()
                .unwrap()
                .extend(signer.as_object().unwrap().clone());
            serde_json::from_value(spec).unwrap()
        };
        let identity = repository(serde_json::json!({"webIdentity":
            {"serviceAccountName": "backups", "roleArn": "arn:r"}}));
        let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(serde_json::json!({
            "spec": {"template": {"spec": {
                "initContainers": [{"name": "tool", "env": [{"name": "PGUSER", "value": "x"}]}],
                "containers": [{"name": "backup",
                                "env": custody_kube::s3::mover_env(&identity)}],
            }}},
        }))
        .unwrap();
        let pod_of = |job: k8s_openapi::api::batch::v1::Job| job.spec.unwrap().template;
        let template = pod_of(with_web_identity(job.clone(), &identity));
        let pod = template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("backups"));
        let mounted = |container: &k8s_openapi::api::core::v1::Container| {
            container
                .volume_mounts
                .iter()
                .flatten()
                .any(|mount| mount.name == custody_kube::s3::WEB_IDENTITY_VOLUME)
        };
        assert!(mounted(&pod.containers[0]));
        assert!(!mounted(&pod.init_containers.unwrap()[0]));
        assert_eq!(
            template
                .metadata
                .unwrap()
                .annotations
                .unwrap()
                .get(EKS_SKIP_CONTAINERS)
                .map(String::as_str),
            Some("tool")
        );
        let keys = repository(serde_json::json!({"credentialsSecretRef": {"name": "s3"}}));
        assert_eq!(with_web_identity(job.clone(), &keys), job);
    }

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
            Some(Placement {
                node: Some("node-a"),
                claim: "data-db-0",
                read_only: true,
            }),
            0,
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
        assert_eq!(
            env,
            [
                ("A", Some("1")),
                ("TMPDIR", Some(SCRATCH_PATH)),
                // The progress file is in the scratch volume, where the agent reads it.
                ("CUSTODY_PROGRESS_FILE", Some("/tmp/custody-progress.json")),
            ]
        );
    }

    #[test]
    fn a_retried_job_gives_up_at_once_on_a_permanent_failure_and_never_counts_evictions() {
        let owner: custody_kube::api::Restore = serde_json::from_value(serde_json::json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u"},
            "spec": {"clusterRef": {"name": "c"}, "backupRef": {"name": "b"}},
        }))
        .unwrap();
        let job = |retries| {
            MoverJob::new("mover:1")
                .job(
                    "j",
                    &owner,
                    &Default::default(),
                    Some(Placement {
                        node: Some("node-a"),
                        claim: "data-db-0",
                        read_only: false,
                    }),
                    retries,
                    serde_json::json!({"name": "mover", "image": "mover:1"}),
                )
                .spec
                .unwrap()
        };
        let once = job(0);
        assert_eq!(once.backoff_limit, Some(0));
        assert!(once.pod_failure_policy.is_none());
        let retried = job(2);
        assert_eq!(retried.backoff_limit, Some(2));
        let rules = retried.pod_failure_policy.unwrap().rules;
        assert_eq!(rules[0].action, "FailJob");
        let codes = rules[0].on_exit_codes.as_ref().unwrap();
        assert_eq!(codes.container_name.as_deref(), Some("mover"));
        assert_eq!(
            (codes.operator.as_str(), codes.values.as_slice()),
            ("In", &[i32::from(EXIT_PERMANENT)][..])
        );
        assert_eq!(rules[1].action, "Ignore");
        assert_eq!(
            rules[1].on_pod_conditions.as_ref().unwrap()[0].type_,
            "DisruptionTarget"
        );
    }

    #[test]
    fn mover_pods_keep_only_the_capabilities_they_use() {
        let security = security_context(RESTORE_CAPABILITIES);
        assert_eq!(security["runAsUser"], 0);
        assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert_eq!(
            security["capabilities"]["add"],
            serde_json::json!(["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"])
        );
        assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(
            security_context(BACKUP_CAPABILITIES)["capabilities"]["add"],
            serde_json::json!(["DAC_OVERRIDE"])
        );
    }
}
