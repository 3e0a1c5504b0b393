//! Types shared by several kinds.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// A reference to another custody object in the same namespace, by name.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// Name of the referenced object, in the same namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A reference to a Secret in the same namespace, by name.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Name of the Secret, in the same namespace as the object that refers to it.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// How the volumes of one restore are written: all at once, or one after another.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
pub enum VolumeRestorePolicy {
    /// Every volume is restored at the same time.
    #[default]
    Parallel,
    /// Volumes are restored one at a time, in the order of the Cluster's volume claim
    /// templates.
    Serial,
}

/// The schema of a `conditions` list: a list-map keyed by `type`, so that server-side apply
/// lets each writer own its own conditions.
pub(crate) fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema.insert(
        "description".into(),
        "Current state of the object, one entry per condition type, per the Kubernetes API \
         conventions."
            .into(),
    );
    schema
}
