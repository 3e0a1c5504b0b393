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
