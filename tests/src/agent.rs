//! Running the real `custody-agent` and `custody-wait` binaries against the local control
//! plane, and the restore objects and volumes they work on.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use custody_agent::manifest_builder;
use custody_kube::api::{Backup, Restore};
use custody_proto::gate::WaitProgress;
use custody_proto::gate::gate_client::GateClient;
use custody_proto::manifest::Header;
use custody_proto::names;
use custody_proto::volume::{IDENTITY_PATH, MANIFEST_PATH, RestoreIdentity};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::kubelet::{FakeKubelet, PodSpec, create_pod, pod_token};
use crate::pki::Pki;
use crate::volumes::LoopVolume;
use crate::{ChildGuard, binary, control_plane, free_port};

/// A GET on loopback; `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())?;
    Some((code, body))
}

/// Waits until `GET /readyz` on `port` answers 200; fails at once, with the process's log,
/// if it exits first.
pub fn await_ready(port: u16, what: &str, child: &mut ChildGuard, logs: &Lines, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while http_get(port, "/readyz").is_none_or(|(code, _)| code != 200) {
        let process = child.0.as_mut().expect("running");
        if let Ok(Some(status)) = process.try_wait() {
            panic!("{what} exited ({status}):\n{}", logs.all().join("\n"));
        }
        assert!(
            Instant::now() < deadline,
            "{what} not ready on port {port} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Output lines of a child, collected by a thread.
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    /// Collects the lines of `pipe`.
    pub fn collect(pipe: impl Read + Send + 'static, echo: &'static str) -> Lines {
        let lines = Lines::default();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("[{echo}] {line}");
                sink.0.lock().expect("not poisoned").push(line);
            }
        });
        lines
    }

    pub fn all(&self) -> Vec<String> {
        self.0.lock().expect("not poisoned").clone()
    }

    /// Waits for a line containing `needle`.
    pub fn await_line(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.all().into_iter().find(|line| line.contains(needle)) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no line containing {needle:?} within {timeout:?}; got:\n{}",
                self.all().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A running `custody-agent`.
pub struct AgentProcess {
    pub child: ChildGuard,
    pub gate: SocketAddr,
    pub http_port: u16,
    pub logs: Lines,
}

/// How to start an agent beyond the defaults.
#[derive(Default)]
pub struct AgentArgs<'a> {
    /// Extra flags.
    pub flags: Vec<String>,
    /// A command to run the agent under, such as `faketime -f +30s`.
    pub wrapper: &'a [&'a str],
    /// Extra environment variables.
    pub envs: Vec<(&'a str, &'a str)>,
    /// Where the gate listens (default: a free port on 127.0.0.1).
    pub gate: Option<SocketAddr>,
    /// The agent's kubeconfig (default: the administrator's).
    pub kubeconfig: Option<std::path::PathBuf>,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

impl AgentProcess {
    /// Starts an agent for `kubelet`'s node with the gate certificate of `pki`, and waits until
    /// its pod watch is in sync.
    pub fn start(kubelet: &FakeKubelet, pki: &Pki, args: AgentArgs<'_>) -> AgentProcess {
        let gate: SocketAddr = args.gate.unwrap_or_else(|| {
            format!("127.0.0.1:{}", free_port())
                .parse()
                .expect("address")
        });
        let http_port = free_port();
        let agent = binary("custody-agent");
        let mut command = match args.wrapper {
            [] => Command::new(&agent),
            [program, rest @ ..] => {
                let mut command = Command::new(program);
                command.args(rest).arg(&agent);
                command
            }
        };
        command
            .arg(format!("--node-name={}", kubelet.node))
            .arg(format!(
                "--kubeconfig={}",
                args.kubeconfig
                    .as_deref()
                    .unwrap_or(control_plane())
                    .display()
            ))
            .arg(format!("--kubelet-root={}", kubelet.root().display()))
            // Its own notes of frozen filesystems, apart from every other agent's here.
            .arg(format!(
                "--state-dir={}",
                kubelet.root().join("custody-agent-state").display()
            ))
            .arg(format!("--gate-address={gate}"))
            .arg(format!("--gate-tls-cert={}", pki.cert().display()))
            .arg(format!("--gate-tls-key={}", pki.key().display()))
            .arg(format!("--http-address=127.0.0.1:{http_port}"))
            .arg("--mount-wait-seconds=2")
            .args(&args.flags)
            .envs(args.envs.iter().copied())
            .env("RUST_LOG", "info,custody_agent=debug")
            // A group of its own, so that stopping it stops a wrapper's child too
            // (see AgentProcess::stop).
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("starting custody-agent");
        let logs = Lines::collect(child.stderr.take().expect("stderr"), "agent");
        let process = AgentProcess {
            child: ChildGuard(Some(child)),
            gate,
            http_port,
            logs,
        };
        let mut process = process;
        await_ready(
            http_port,
            "custody-agent",
            &mut process.child,
            &process.logs,
            Duration::from_secs(20),
        );
        process
    }

    /// Stops the agent and whatever runs it (a wrapper such as faketime and its child): its
    /// whole process group, which it leads.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.0.as_mut() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill")
                .args(["-s", "TERM", "--", &group])
                .stderr(Stdio::null())
                .status();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &group])
                .stderr(Stdio::null())
                .status();
            let _ = child.wait();
        }
        self.child.0 = None;
    }

    /// The agent's `/metrics` text.
    pub fn metrics(&self) -> String {
        http_get(self.http_port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }
}

/// A running `custody-controller`.
pub struct ControllerProcess {
    pub child: ChildGuard,
    pub http_port: u16,
    pub report_address: SocketAddr,
    pub logs: Lines,
}

impl ControllerProcess {
    /// Starts a controller watching `namespace`, its report service on a free port with the
    /// certificate of `pki`, and waits until it is ready.
    pub fn start(namespace: &str, pki: &Pki, flags: &[String]) -> ControllerProcess {
        ControllerProcess::start_as(namespace, pki, flags, control_plane())
    }

    /// Like [`ControllerProcess::start`], with the controller's own kubeconfig.
    pub fn start_as(
        namespace: &str,
        pki: &Pki,
        flags: &[String],
        kubeconfig: &std::path::Path,
    ) -> ControllerProcess {
        let http_port = free_port();
        let report_address: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("address");
        let mut child = Command::new(binary("custody-controller"))
            .args(["run", "--namespace", namespace])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--http-address=127.0.0.1:{http_port}"))
            .arg(format!("--report-address={report_address}"))
            .arg(format!("--report-tls-cert={}", pki.cert().display()))
            .arg(format!("--report-tls-key={}", pki.key().display()))
            .args(flags)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting custody-controller");
        let logs = Lines::collect(child.stderr.take().expect("stderr"), "controller");
        let process = ControllerProcess {
            child: ChildGuard(Some(child)),
            http_port,
            report_address,
            logs,
        };
        let mut process = process;
        await_ready(
            http_port,
            "custody-controller",
            &mut process.child,
            &process.logs,
            Duration::from_secs(20),
        );
        process
    }

    /// The controller's `/metrics` text.
    pub fn metrics(&self) -> String {
        http_get(self.http_port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }
}

/// Name on the report service's test certificate.
pub const CONTROLLER_NAME: &str = "custody-controller";

/// The agent's own pod on `node` and a report token bound to it, written to a file.
pub async fn report_token(
    client: &kube::Client,
    namespace: &str,
    node: &str,
) -> tempfile::NamedTempFile {
    let pod = create_pod(
        client,
        namespace,
        PodSpec {
            name: &format!("custody-agent-{node}"),
            node,
            service_account: "custody-agent",
            ..PodSpec::default()
        },
    )
    .await;
    let token = pod_token(client, &pod, names::REPORT_AUDIENCE).await;
    let file = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(file.path(), token).expect("token");
    file
}

/// A client of the controller's report service, trusting `ca` for its certificate.
pub async fn report_client(
    controller: &ControllerProcess,
    ca: &std::path::Path,
) -> custody_proto::report::agent_report_client::AgentReportClient<tonic::transport::Channel> {
    let channel = Endpoint::from_shared(format!("https://{}", controller.report_address))
        .expect("address")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(std::fs::read(ca).expect("CA")))
                .domain_name(CONTROLLER_NAME),
        )
        .expect("TLS")
        .connect()
        .await
        .expect("report service");
    custody_proto::report::agent_report_client::AgentReportClient::new(channel)
}

/// `report` as a request carrying `token`.
pub fn report_request(
    token: &str,
    report: custody_proto::report::NodeReport,
) -> tonic::Request<custody_proto::report::NodeReport> {
    let mut request = tonic::Request::new(report);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

pub fn report_flags(
    controller: &ControllerProcess,
    pki: &Pki,
    token: &std::path::Path,
) -> Vec<String> {
    vec![
        format!("--report-url=https://{}", controller.report_address),
        format!("--report-ca={}", pki.ca().display()),
        format!("--report-server-name={CONTROLLER_NAME}"),
        format!("--report-token-file={}", token.display()),
        "--heartbeat-seconds=0.5".to_string(),
        "--clock-interval-seconds=1".to_string(),
    ]
}

/// A running `custody-wait`.
pub struct WaitProcess {
    pub child: ChildGuard,
    pub output: Lines,
    _token: tempfile::NamedTempFile,
}

impl WaitProcess {
    /// Starts `custody-wait` against `agent`, presenting `token`.
    pub fn start(agent: &AgentProcess, pki: &Pki, token: &str) -> WaitProcess {
        let mut token_file = tempfile::NamedTempFile::new().expect("token file");
        token_file.write_all(token.as_bytes()).expect("token");
        let mut child = Command::new(binary("custody-wait"))
            .arg(format!("--agent={}", agent.gate))
            .arg(format!("--token-file={}", token_file.path().display()))
            .arg(format!("--ca-file={}", pki.ca().display()))
            .arg("--retry-seconds=0.2")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting custody-wait");
        let output = Lines::collect(child.stdout.take().expect("stdout"), "wait");
        WaitProcess {
            child: ChildGuard(Some(child)),
            output,
            _token: token_file,
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .0
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Waits for the exit and returns the status.
    pub fn await_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        let child = self.child.0.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("waiting") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "custody-wait still running after {timeout:?}; printed:\n{}",
                self.output.all().join("\n")
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Asks the gate once, with `token` (or none), and returns the first answer.
pub async fn ask_gate(
    gate: SocketAddr,
    pki: &Pki,
    token: Option<&str>,
) -> Result<WaitProgress, tonic::Status> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(pki.ca()).expect("ca")))
        .domain_name(custody_proto::names::AGENT_SERVER_NAME);
    let channel = Endpoint::from_shared(format!("https://{gate}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connecting to the gate");
    let mut request = tonic::Request::new(custody_proto::gate::WaitRequest {});
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
    }
    let mut stream = GateClient::new(channel).wait(request).await?.into_inner();
    Ok(stream.message().await?.expect("a first message"))
}

/// A completed Backup and a Restore reading it.
pub struct RestoreObjects {
    pub backup: Backup,
    pub restore: Restore,
}

impl RestoreObjects {
    pub fn backup_uid(&self) -> String {
        self.backup.metadata.uid.clone().expect("uid")
    }

    pub fn restore_uid(&self) -> String {
        self.restore.metadata.uid.clone().expect("uid")
    }

    pub fn restore_name(&self) -> String {
        self.restore.metadata.name.clone().expect("name")
    }
}

/// Creates Backup `<name>-backup` of Cluster `name` and Restore `<name>-restore` of it.
pub async fn restore_objects(client: &kube::Client, namespace: &str, name: &str) -> RestoreObjects {
    let backups: Api<Backup> = Api::namespaced(client.clone(), namespace);
    let backup: Backup = serde_json::from_value(serde_json::json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": format!("{name}-backup")},
        "spec": {"clusterRef": {"name": name}},
    }))
    .expect("backup");
    let backup = backups
        .create(&PostParams::default(), &backup)
        .await
        .expect("creating Backup");
    let restores: Api<Restore> = Api::namespaced(client.clone(), namespace);
    let restore: Restore = serde_json::from_value(serde_json::json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
        "metadata": {"name": format!("{name}-restore")},
        "spec": {"clusterRef": {"name": name}, "backupRef": {"name": format!("{name}-backup")}},
    }))
    .expect("restore");
    let restore = restores
        .create(&PostParams::default(), &restore)
        .await
        .expect("creating Restore");
    RestoreObjects { backup, restore }
}

/// Records the manifest hash in the Backup's status, as a completed backup does.
pub async fn record_manifest_hash(client: &kube::Client, backup: &Backup, hash: &blake3::Hash) {
    let name = backup.metadata.name.clone().expect("name");
    let namespace = backup.metadata.namespace.clone().expect("namespace");
    Api::<Backup>::namespaced(client.clone(), &namespace)
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {
                "phase": "Completed",
                "artifact": {
                    "repository": "repo", "endpoint": "http://127.0.0.1:9000", "bucket": "b",
                    "prefix": "p", "key": format!("p/{name}/data.tar"),
                    "manifestKey": format!("p/{name}/manifest.jsonl"),
                    "manifestHash": hash.to_hex().to_string(),
                },
            }})),
        )
        .await
        .expect("recording the manifest hash");
}

/// A volume as a restore leaves it: `files` files of data, the manifest of Backup
/// `backup_uid`, and the identity of Restore `restore_uid`. Returns the volume and the
/// manifest's hash.
pub fn restored_volume(
    backup_uid: &str,
    restore_uid: &str,
    files: usize,
) -> (LoopVolume, blake3::Hash) {
    let volume = LoopVolume::new(32);
    let root = volume.path();
    std::fs::remove_dir_all(root.join("lost+found")).ok();
    std::fs::create_dir_all(root.join("base")).expect("data directory");
    for index in 0..files {
        std::fs::write(
            root.join(format!("base/{index:05}")),
            format!("row {index} {}", "x".repeat(index % 4096)),
        )
        .expect("data file");
    }
    let header = Header::new(backup_uid, "cluster-uid", "2026-11-30T06:00:00Z");
    let (manifest, summary) = manifest_builder::build(root, &header, Vec::new()).expect("manifest");
    std::fs::create_dir_all(root.join(".custody")).expect(".custody");
    std::fs::write(root.join(MANIFEST_PATH), manifest).expect("manifest");
    let identity = RestoreIdentity {
        restore_uid: restore_uid.into(),
        backup_uid: backup_uid.into(),
    };
    std::fs::write(
        root.join(IDENTITY_PATH),
        serde_json::to_vec(&identity).expect("identity"),
    )
    .expect("identity");
    (volume, summary.hash)
}

/// The cluster's ServiceAccount signing key (to mint tokens the API server must refuse).
pub fn service_account_signing_key() -> PathBuf {
    let key = control_plane()
        .parent()
        .map(|dir| dir.join("pki/sa.key"))
        .expect("cluster directory");
    assert!(key.exists(), "{} missing", key.display());
    key
}
