//! The prepareData Job of one volume: `custody-mover restore` pinned to the node where the
//! volume is mounted, owned by the Restore and labelled with its UID.

use custody_proto::mover::{Invocation, RepositoryArgs};
use k8s_openapi::api::batch::v1::Job;

use super::TARGET_PATH;
use super::decide::{self, LABEL_RESTORE_UID};
use crate::backups::decide::LABEL_CLUSTER_UID;
use custody_kube::api::{Artifact, BackupRepository, Restore};

/// What a prepareData Job is made of.
pub struct JobInputs<'a> {
    pub restore: &'a Restore,
    pub cluster_uid: &'a str,
    pub create: &'a decide::CreateJob,
    pub artifact: &'a Artifact,
    /// The Backup's volume the claim gets (a snapshot's volume name).
    pub volume: &'a str,
    /// The manifest hash that volume is checked against.
    pub manifest_hash: &'a str,
    pub backup_uid: &'a str,
    pub repository: &'a BackupRepository,
    pub mover: &'a crate::mover_job::MoverJob,
}

/// The Job, as plain data.
pub fn spec(inputs: &JobInputs<'_>) -> Job {
    let uid = inputs.restore.metadata.uid.clone().unwrap_or_default();
    let labels = crate::ownership::labels(&[
        (
            custody_proto::names::LABEL_ROLE,
            custody_proto::names::ROLE_PREPARE_DATA,
        ),
        (LABEL_RESTORE_UID, uid.as_str()),
        (LABEL_CLUSTER_UID, inputs.cluster_uid),
    ]);
    // The repository's current endpoint and credentials (it may have moved), but the bucket
    // the artifact was written to: the same rule as deleting it.
    let mut repository = inputs.repository.spec.clone();
    repository.bucket = inputs.artifact.bucket.clone();
    let mut env = custody_kube::s3::mover_env(&repository);
    let manifest_hash = inputs.manifest_hash.to_string();
    let invocation = match &inputs.artifact.snapshot {
        // A snapshot: read from the repository the Backup recorded, with its master key.
        Some(snapshot) => {
            let master_key = inputs
                .repository
                .status
                .as_ref()
                .and_then(|status| status.repository.as_ref())
                .map(|repository| repository.master_key_secret.clone())
                .unwrap_or_else(|| {
                    crate::encryption::master_key_secret_name(
                        inputs
                            .repository
                            .metadata
                            .name
                            .as_deref()
                            .unwrap_or_default(),
                    )
                });
            env.push(serde_json::json!({
                "name": custody_proto::mover::env::REPOSITORY_KEY,
                "valueFrom": {"secretKeyRef": {"name": master_key, "key": custody_proto::mover::env::REPOSITORY_KEY}},
            }));
            Invocation::SnapshotRestore {
                target: TARGET_PATH.to_string(),
                repository: RepositoryArgs {
                    prefix: inputs.artifact.prefix.clone(),
                    id: Some(snapshot.repository_id.clone()),
                },
                snapshot: snapshot.id.clone().unwrap_or_default(),
                volume: inputs.volume.to_string(),
                manifest_hash,
                backup_uid: inputs.backup_uid.to_string(),
                restore_uid: uid.clone(),
            }
        }
        None => Invocation::Restore {
            target: TARGET_PATH.to_string(),
            key: inputs.artifact.key.clone(),
            manifest_key: inputs.artifact.manifest_key.clone(),
            manifest_hash,
            backup_uid: inputs.backup_uid.to_string(),
            restore_uid: uid.clone(),
        },
    };
    let container = serde_json::json!({
        "name": "mover",
        "image": inputs.mover.image,
        "command": ["custody-mover"],
        "args": invocation.args(),
        "env": env,
        "volumeMounts": [{"name": "data", "mountPath": TARGET_PATH}],
        // Writes files of every owner, with their owners and modes.
        "securityContext": crate::mover_job::security_context(crate::mover_job::RESTORE_CAPABILITIES),
    });
    let job = inputs.mover.job(
        &inputs.create.name,
        inputs.restore,
        &labels,
        Some(crate::mover_job::Placement {
            node: Some(&inputs.create.node),
            claim: &inputs.create.claim,
            read_only: false,
        }),
        inputs.mover.restore_retries,
        container,
    );
    crate::mover_job::with_web_identity(job, &repository)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_mover_reads_the_recorded_bucket_at_the_repositorys_current_endpoint() {
        let restore: Restore = serde_json::from_value(json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
            "metadata": {"name": "r", "namespace": "ns", "uid": "r-uid"},
            "spec": {"clusterRef": {"name": "c"}, "backupRef": {"name": "b"}},
        }))
        .unwrap();
        let repository: BackupRepository = serde_json::from_value(json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
            "metadata": {"name": "store", "namespace": "ns"},
            "spec": {"endpoint": "http://moved", "bucket": "now", "credentialsSecretRef": {"name": "s3"}},
        }))
        .unwrap();
        let artifact = Artifact {
            endpoint: "http://then".into(),
            bucket: "then".into(),
            key: "p/data.tar.zst".into(),
            manifest_key: "p/manifest.jsonl".into(),
            ..Artifact::default()
        };
        let job = spec_of(&restore, &artifact, &repository);
        let env = job.spec.unwrap().template.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap();
        let value = |name: &str| {
            env.iter()
                .find(|variable| variable.name == name)
                .and_then(|variable| variable.value.clone())
        };
        use custody_proto::mover::env;
        assert_eq!(value(env::BUCKET).as_deref(), Some("then"));
        assert_eq!(value(env::ENDPOINT).as_deref(), Some("http://moved"));
    }

    /// A repository with a web identity: the pod runs as its ServiceAccount, the mover signs
    /// with the role and the token projected for the STS's audience (no key Secret, no API
    /// token); with keys, none of that.
    #[test]
    fn a_web_identity_runs_the_mover_as_its_service_account_with_only_the_sts_token() {
        let restore: Restore = serde_json::from_value(json!({
            "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
            "metadata": {"name": "r", "namespace": "ns", "uid": "r-uid"},
            "spec": {"clusterRef": {"name": "c"}, "backupRef": {"name": "b"}},
        }))
        .unwrap();
        let artifact = Artifact {
            bucket: "b".into(),
            key: "p/data.tar.zst".into(),
            manifest_key: "p/manifest.jsonl".into(),
            ..Artifact::default()
        };
        let job_of = |signer: serde_json::Value| {
            let mut spec = json!({"endpoint": "http://minio:9000", "bucket": "b"});
            spec.as_object_mut()
                .unwrap()
                .extend(signer.as_object().unwrap().clone());
            let repository: BackupRepository = serde_json::from_value(json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
                "metadata": {"name": "store", "namespace": "ns"}, "spec": spec,
            }))
            .unwrap();
            let job = spec_of(&restore, &artifact, &repository);
            job.spec.unwrap().template.spec.unwrap()
        };
        let pod = job_of(json!({"webIdentity": {"serviceAccountName": "backups",
            "roleArn": "arn:minio:iam:::role/x", "audience": "minio", "stsEndpoint": "http://minio:9000"}}));
        assert_eq!(pod.service_account_name.as_deref(), Some("backups"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|volume| volume.name == custody_kube::s3::WEB_IDENTITY_VOLUME)
            .expect("the token's volume");
        let sources = volume.projected.as_ref().unwrap().sources.as_ref().unwrap();
        assert_eq!(sources.len(), 1);
        let token = sources[0].service_account_token.as_ref().unwrap();
        assert_eq!(token.audience.as_deref(), Some("minio"));
        assert_eq!(token.path, custody_kube::sts::TOKEN_FILE);
        let mover = &pod.containers[0];
        let mount = mover
            .volume_mounts
            .iter()
            .flatten()
            .find(|mount| mount.name == custody_kube::s3::WEB_IDENTITY_VOLUME)
            .expect("mounted");
        assert_eq!(mount.mount_path, custody_kube::sts::TOKEN_DIRECTORY);
        let env: std::collections::BTreeMap<String, Option<String>> = mover
            .env
            .iter()
            .flatten()
            .map(|variable| (variable.name.clone(), variable.value.clone()))
            .collect();
        use custody_proto::mover::env;
        assert_eq!(
            env.get(env::ROLE_ARN),
            Some(&Some("arn:minio:iam:::role/x".into()))
        );
        assert_eq!(
            env.get(env::WEB_IDENTITY_TOKEN_FILE),
            Some(&Some(format!(
                "{}/{}",
                custody_kube::sts::TOKEN_DIRECTORY,
                custody_kube::sts::TOKEN_FILE
            )))
        );
        assert_eq!(
            env.get(env::STS_ENDPOINT),
            Some(&Some("http://minio:9000".into()))
        );
        assert!(!env.contains_key(env::ACCESS_KEY_ID), "{env:?}");

        let pod = job_of(json!({"credentialsSecretRef": {"name": "s3"}}));
        assert_eq!(pod.service_account_name, None);
        assert!(
            pod.volumes
                .iter()
                .flatten()
                .all(|volume| volume.name != custody_kube::s3::WEB_IDENTITY_VOLUME)
        );
        let names: Vec<String> = pod.containers[0]
            .env
            .iter()
            .flatten()
            .map(|variable| variable.name.clone())
            .collect();
        assert!(names.contains(&env::ACCESS_KEY_ID.to_string()), "{names:?}");
        assert!(!names.contains(&env::ROLE_ARN.to_string()), "{names:?}");
    }

    fn spec_of(restore: &Restore, artifact: &Artifact, repository: &BackupRepository) -> Job {
        spec(&JobInputs {
            restore,
            cluster_uid: "c-uid",
            create: &decide::CreateJob {
                claim: "data-db-0".into(),
                node: "node-a".into(),
                name: "j".into(),
                attempt: 1,
            },
            artifact,
            volume: "data",
            manifest_hash: "h",
            backup_uid: "b-uid",
            repository,
            mover: &crate::mover_job::MoverJob::new("mover:1"),
        })
    }
}
