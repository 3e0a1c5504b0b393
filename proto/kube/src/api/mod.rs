//! The custody.io/v1alpha1 API: the six kinds, their specs and statuses.
//!
//! Doc comments on every field become the schema descriptions that `kubectl explain` shows.
//! Validation the API server enforces (required fields, enums, bounds, immutability) is
//! declared here too, so that a bad object is refused before any controller sees it.

mod backup;
mod backup_plan;
mod backup_repository;
mod cluster;
mod common;
mod node_agent;
mod restore;

pub use backup::*;
pub use backup_plan::*;
pub use backup_repository::*;
pub use cluster::*;
pub use common::*;
pub use node_agent::*;
pub use restore::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every custody kind.
pub const GROUP: &str = "custody.io";
/// The API version of every custody kind.
pub const VERSION: &str = "v1alpha1";

/// The CustomResourceDefinitions of all custody kinds, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        BackupRepository::crd(),
        Cluster::crd(),
        Backup::crd(),
        BackupPlan::crd(),
        Restore::crd(),
        NodeAgent::crd(),
    ]
    .into_iter()
    .map(known_formats)
    .collect()
}

/// `crd` with the unsigned formats schemars writes (`uint8` … `uint64`, which the API server
/// does not know and warns about on every apply) as `int64`; their `minimum: 0` stays.
fn known_formats(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(format)) = map.get_mut("format")
                    && format.starts_with("uint")
                {
                    *format = "int64".to_string();
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    walk(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

/// Common access to the conditions every custody status carries.
pub trait HasConditions {
    /// The conditions in the object's status, empty when it has no status yet.
    fn conditions(&self) -> &[Condition];
}

macro_rules! impl_has_conditions {
    ($($kind:ty),*) => {
        $(impl HasConditions for $kind {
            fn conditions(&self) -> &[Condition] {
                self.status.as_ref().map(|status| status.conditions.as_slice()).unwrap_or_default()
            }
        })*
    };
}

impl_has_conditions!(
    BackupRepository,
    Cluster,
    Backup,
    BackupPlan,
    Restore,
    NodeAgent
);

#[cfg(test)]
mod format_tests {
    /// Every `format` in the CRDs is one the API server knows: an unknown one makes it print
    /// `Warning: unrecognized format` on every `kubectl apply`.
    #[test]
    fn the_crds_use_only_formats_the_api_server_knows() {
        fn formats(value: &serde_json::Value, out: &mut Vec<String>) {
            match value {
                serde_json::Value::Object(map) => {
                    if let Some(serde_json::Value::String(format)) = map.get("format") {
                        out.push(format.clone());
                    }
                    map.values().for_each(|value| formats(value, out));
                }
                serde_json::Value::Array(items) => {
                    items.iter().for_each(|value| formats(value, out))
                }
                _ => {}
            }
        }
        let mut seen = Vec::new();
        for crd in super::crds() {
            formats(&serde_json::to_value(&crd).unwrap(), &mut seen);
        }
        assert!(seen.iter().any(|format| format == "int64"));
        let unknown: Vec<&String> = seen
            .iter()
            .filter(|format| {
                ![
                    "int32",
                    "int64",
                    "date-time",
                    "date",
                    "byte",
                    "double",
                    "float",
                ]
                .contains(&format.as_str())
            })
            .collect();
        assert!(unknown.is_empty(), "{unknown:?}");
    }
}
