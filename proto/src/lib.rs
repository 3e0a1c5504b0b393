//! Wire contracts and kube-free types shared by the controller and the node agent.
//!
//! Nothing here talks to Kubernetes: it is plain data and the arithmetic both ends of a
//! connection must agree on.

pub mod clock;
pub mod manifest;
