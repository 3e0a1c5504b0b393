//! A real Prometheus (hack/build-prometheus.sh) scraping custody on the real node as
//! deploy/monitoring/monitors.yaml tells prometheus-operator to: the controller's pods with
//! their labels honoured, each agent on its node's address; and `kubectl custody`.

use super::*;

/// Runs `kubectl-custody ARGS` against the local control plane; its stdout (it must succeed).
pub(crate) fn kubectl_custody(args: &[&str]) -> String {
    let output = std::process::Command::new(custody_tests::binary("kubectl-custody"))
        .arg(format!(
            "--kubeconfig={}",
            custody_tests::control_plane().display()
        ))
        .args(args)
        .output()
        .expect("running kubectl-custody");
    assert!(
        output.status.success(),
        "kubectl-custody {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A Prometheus process scraping custody every second; stopped when dropped.
pub(crate) struct Prometheus {
    child: std::process::Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free port on the loopback address.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

impl Prometheus {
    /// Scrapes every custody-controller pod (port 8080) and the node's agent (port 9446).
    pub(crate) async fn scraping_custody(client: &kube::Client) -> Prometheus {
        let built = std::process::Command::new(repo_root().join("hack/build-prometheus.sh"))
            .output()
            .expect("running hack/build-prometheus.sh");
        assert!(
            built.status.success(),
            "hack/build-prometheus.sh: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        let binary = String::from_utf8(built.stdout)
            .unwrap()
            .lines()
            .rev()
            .nth(1)
            .expect("prometheus's path")
            .to_string();
        let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
        let controllers: Vec<String> = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=custody-controller"))
            .await
            .unwrap()
            .items
            .iter()
            .filter_map(|pod| pod.status.as_ref()?.pod_ip.clone())
            .map(|ip| format!("'{ip}:8080'"))
            .collect();
        assert!(
            !controllers.is_empty(),
            "no custody-controller pod has an IP"
        );
        let host = std::env::var("CUSTODY_HOST_IP").unwrap_or_else(|_| "10.250.0.1".into());
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: custody-controller
    honor_labels: true
    static_configs: [{{targets: [{}]}}]
  - job_name: custody-agent
    static_configs: [{{targets: ['{host}:9446'], labels: {{node: '{}'}}}}]
",
            controllers.join(", "),
            real_node()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let address = format!("127.0.0.1:{}", free_port());
        let child = std::process::Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("starting prometheus");
        Prometheus {
            child,
            address,
            _dir: dir,
        }
    }

    /// The samples of an instant `query` now: each series' labels and value.
    pub(crate) async fn query(&self, query: &str) -> Vec<(serde_json::Value, f64)> {
        let encoded: String = query
            .bytes()
            .map(|byte| match byte {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => {
                    (byte as char).to_string()
                }
                _ => format!("%{byte:02X}"),
            })
            .collect();
        let Some(response) = freeze::reqwest_get(&format!(
            "http://{}/api/v1/query?query={encoded}",
            self.address
        ))
        .await
        else {
            return Vec::new();
        };
        let Some((_, body)) = response.split_once("\r\n\r\n") else {
            return Vec::new();
        };
        let Ok(answer) = serde_json::from_str::<serde_json::Value>(body) else {
            return Vec::new();
        };
        answer["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|sample| {
                let value = sample["value"][1].as_str()?.parse().ok()?;
                Some((sample["metric"].clone(), value))
            })
            .collect()
    }

    /// Waits until `query` answers at least one sample for which `accept` holds; returns them.
    pub(crate) async fn wait_for(
        &self,
        query: &str,
        accept: impl Fn(&serde_json::Value, f64) -> bool,
    ) -> Vec<(serde_json::Value, f64)> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let samples = self.query(query).await;
            if samples.iter().any(|(labels, value)| accept(labels, *value)) {
                return samples;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "Prometheus at {} never answered `{query}` as expected within 60 s; last answer: {samples:?}",
                self.address
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
