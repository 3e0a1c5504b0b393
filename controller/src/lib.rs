//! custody's controller: the custody.io API types, the reconcilers, and the process that
//! runs them.

pub mod annotation_reconciler;
pub mod annotations;
pub mod artifacts;
pub mod attribution;
pub mod backups;
pub mod cli;
pub mod clusters;
pub mod conditions;
pub mod drills;
pub mod encryption;
pub mod error;
pub mod events;
pub mod finalizers;
pub mod gate_ca;
pub mod health;
pub mod holds;
pub mod imports;
pub mod inject;
pub mod leader;
pub mod maintenance;
pub mod metrics;
pub mod mover_job;
pub mod node_agents;
pub mod node_slots;
pub mod ownership;
pub mod pki;
pub mod plans;
pub mod quantity;
pub mod reconciler;
pub mod report_service;
pub mod repositories;
pub mod requester;
pub mod restores;
pub mod restoring;
pub mod run;
pub mod status;
pub mod transfer;
pub mod uninstall;
pub mod webhook;

pub use error::{Error, Result};
