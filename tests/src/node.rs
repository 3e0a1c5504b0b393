//! The real local node (hack/node-up.sh: kubelet, containerd, runc, CNI, kube-proxy, CoreDNS)
//! with custody's images built from this repository and imported into its containerd
//! (hack/build-images.sh), and PostgreSQL and MariaDB as applications
//! (hack/build-postgres-image.sh, hack/build-mariadb-image.sh).
//! Its tests are named `on_a_real_node_…`: hack/test.sh runs them as a
//! tier of their own, after the fake-kubelet tiers (whose namespaces a cluster-wide install of
//! `deploy/` would otherwise intercept).

use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::{control_plane, repo_root};

/// Starts the node (or finds it running) and imports custody's images and the PostgreSQL and
/// MariaDB images, once per test process.
/// Returns the node's name.
pub fn real_node() -> &'static str {
    static NODE: OnceLock<String> = OnceLock::new();
    NODE.get_or_init(|| {
        control_plane();
        let output = Command::new(repo_root().join("hack/node-up.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running hack/node-up.sh");
        assert!(output.status.success(), "hack/node-up.sh failed");
        let node = String::from_utf8(output.stdout)
            .expect("utf-8")
            .lines()
            .last()
            .expect("node name")
            .trim()
            .to_string();
        let status = Command::new(repo_root().join("hack/build-images.sh"))
            .arg("--import")
            .stdout(Stdio::null())
            .status()
            .expect("running hack/build-images.sh");
        assert!(status.success(), "hack/build-images.sh --import failed");
        for script in ["build-postgres-image.sh", "build-mariadb-image.sh"] {
            let status = Command::new(repo_root().join("hack").join(script))
                .arg("--import")
                .stdout(Stdio::null())
                .status()
                .unwrap_or_else(|error| panic!("running hack/{script}: {error}"));
            assert!(status.success(), "hack/{script} --import failed");
        }
        node
    })
}

/// Runs a hack/ script with arguments; panics with its output when it fails.
pub fn hack(script: &str, args: &[&str]) {
    crate::run(Command::new(repo_root().join("hack").join(script)).args(args));
}
