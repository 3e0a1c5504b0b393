//! `kubectl custody`: custody from the terminal. `status` (per Cluster: last backup, running
//! backups and restores, node agents), `backup CLUSTER` (now, or as a plan would), `restore
//! BACKUP --to CLUSTER`, `why POD` (why a pod is held, with everything needed to unblock it),
//! `nodes`; `-o json|yaml`; `completion SHELL`. Installed as `kubectl-custody` on the PATH.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, LogParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use custody_kube::api::{
    Backup, BackupPhase, BackupPlan, Cluster, NodeAgent, Restore, RestorePhase,
};

pub mod table;
pub mod view;

/// custody's errors, by what failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Connect(String),
    #[error("{0}")]
    Refused(String),
    #[error("writing the output: {0}")]
    Output(String),
}

type Result<T> = std::result::Result<T, Error>;

/// `kubectl custody`: backups and restores of stateful workloads, from the terminal.
#[derive(Debug, Parser)]
#[command(name = "kubectl-custody", bin_name = "kubectl custody", version)]
pub struct Cli {
    /// The kubeconfig to use (default: $KUBECONFIG, which may list several files, then
    /// ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    pub namespace: Option<String>,
    /// Every namespace (`status`).
    #[arg(short = 'A', long, global = true)]
    pub all_namespaces: bool,
    /// How to print: a table for people, or json / yaml for programs.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per Cluster: its last successful backup, its newest if that failed, backups and restores
    /// under way; then the node agents that do not report.
    Status {
        /// Only this Cluster.
        cluster: Option<String>,
    },
    /// Back a Cluster up now: a Backup with the Cluster's defaults, or as PLAN's runs are
    /// (its repository, consistency and command; counted in its retention).
    Backup {
        /// The Cluster (default with --plan: the plan's).
        cluster: Option<String>,
        /// Make the Backup as this BackupPlan makes its runs.
        #[arg(long)]
        plan: Option<String>,
        /// The Backup's name (default: `<cluster>-<UTC time>`).
        #[arg(long)]
        name: Option<String>,
        /// Follow it until it ends (at most --timeout), printing its progress.
        #[arg(long)]
        wait: bool,
        /// How long --wait follows, in seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Restore a completed Backup into a Cluster: into an existing Cluster (a Restore), or a
    /// new one made from the Backup's source Cluster (its pods held until verified). The Backup
    /// must be in the namespace restored into; to restore into another namespace, attach the
    /// repository there (a BackupRepository with `importSnapshots`) and restore the imported
    /// Backup.
    Restore {
        /// The completed Backup.
        backup: String,
        /// The Cluster to restore into.
        #[arg(long)]
        to: String,
        /// A new Cluster's StatefulSet (default: the Cluster's name).
        #[arg(long)]
        statefulset: Option<String>,
        /// A new Cluster's volume claim templates, when the source Cluster is not in this
        /// namespace to copy them from (comma-separated).
        #[arg(long, value_delimiter = ',')]
        claim_templates: Vec<String>,
        /// Follow it until it ends (at most --timeout).
        #[arg(long)]
        wait: bool,
        /// How long --wait follows, in seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Why a pod is held: each volume's state, reason, node and progress, the Restore's
    /// message, and the last lines of custody-wait and of each volume's mover.
    Why {
        /// The pod.
        pod: String,
        /// How many of each log's last lines to show.
        #[arg(long, default_value_t = 10)]
        lines: i64,
    },
    /// Every node's agent: reporting or not, last report, clock offset, volumes, movers.
    Nodes,
    /// Shell completions: `source <(kubectl-custody completion bash)`.
    Completion { shell: clap_complete::Shell },
}

/// Runs one command.
pub async fn run(cli: Cli) -> Result<()> {
    if let Command::Completion { shell } = &cli.command {
        let mut command = <Cli as clap::CommandFactory>::command();
        clap_complete::generate(
            *shell,
            &mut command,
            "kubectl-custody",
            &mut std::io::stdout(),
        );
        return Ok(());
    }
    let client = custody_kube::process::client(cli.kubeconfig.as_deref())
        .await
        .map_err(|error| Error::Connect(error.to_string()))?;
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let scope = (!cli.all_namespaces).then_some(namespace.as_str());
    match &cli.command {
        Command::Status { cluster } => status(&client, scope, cluster.as_deref(), cli.output).await,
        Command::Nodes => {
            let agents = Api::<NodeAgent>::all(client)
                .list(&ListParams::default())
                .await?;
            let views = view::nodes(&agents.items);
            print(cli.output, &views, || nodes_table(&views))
        }
        Command::Backup {
            cluster,
            plan,
            name,
            wait,
            timeout,
        } => {
            let backup = backup(
                &client,
                &namespace,
                cluster.as_deref(),
                plan.as_deref(),
                name.as_deref(),
            )
            .await?;
            println!("backup.custody.io/{backup} created in {namespace}");
            if *wait {
                follow_backup(&client, &namespace, &backup, Duration::from_secs(*timeout)).await?;
            }
            Ok(())
        }
        Command::Restore {
            backup,
            to,
            statefulset,
            claim_templates,
            wait,
            timeout,
        } => {
            let made = restore(
                &client,
                &namespace,
                backup,
                to,
                statefulset.as_deref(),
                claim_templates,
            )
            .await?;
            println!("{}", made.said);
            if *wait {
                follow_restore(
                    &client,
                    &namespace,
                    &made.following,
                    Duration::from_secs(*timeout),
                )
                .await?;
            }
            Ok(())
        }
        Command::Why { pod, lines } => {
            let why = why(&client, &namespace, pod, *lines).await?;
            print(cli.output, &why, || why_text(&why))
        }
        Command::Completion { .. } => Ok(()),
    }
}

fn print<T: Serialize>(output: Output, value: &T, table: impl FnOnce() -> String) -> Result<()> {
    let text = match output {
        Output::Table => table(),
        Output::Json => serde_json::to_string_pretty(value)
            .map(|text| text + "\n")
            .map_err(|error| Error::Output(error.to_string()))?,
        Output::Yaml => {
            serde_yaml::to_string(value).map_err(|error| Error::Output(error.to_string()))?
        }
    };
    print!("{text}");
    Ok(())
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

async fn status(
    client: &Client,
    namespace: Option<&str>,
    only: Option<&str>,
    output: Output,
) -> Result<()> {
    let params = ListParams::default();
    let (clusters, backups, restores, agents) = (
        scoped::<Cluster>(client, namespace),
        scoped::<Backup>(client, namespace),
        scoped::<Restore>(client, namespace),
        Api::<NodeAgent>::all(client.clone()),
    );
    let (clusters, backups, restores) = futures::try_join!(
        clusters.list(&params),
        backups.list(&params),
        restores.list(&params),
    )?;
    // NodeAgents are cluster-scoped, and custody's view and edit roles leave them out: a
    // tenant sees its Clusters without them.
    let agents = match agents.list(&params).await {
        Ok(list) => Some(list.items),
        Err(kube::Error::Api(status)) if status.code == 403 => None,
        Err(error) => return Err(error.into()),
    };
    let clusters: Vec<Cluster> = clusters
        .items
        .into_iter()
        .filter(|cluster| only.is_none_or(|only| cluster.name_any() == only))
        .collect();
    if let Some(only) = only
        && clusters.is_empty()
    {
        return Err(Error::Refused(format!(
            "no Cluster {only} in namespace {}",
            namespace.unwrap_or("(all)")
        )));
    }
    let views = view::status(&clusters, &backups.items, &restores.items);
    let nodes = agents.as_deref().map(view::nodes);
    #[derive(Serialize)]
    struct Status<'a> {
        clusters: &'a [view::ClusterStatusView],
        /// `None`: not permitted to list NodeAgents.
        nodes: Option<&'a [view::NodeView]>,
    }
    print(
        output,
        &Status {
            clusters: &views,
            nodes: nodes.as_deref(),
        },
        || status_text(&views, nodes.as_deref(), Timestamp::now()),
    )
}

fn backup_cell(line: Option<&view::BackupLine>, now: Timestamp) -> String {
    match line {
        None => "-".to_string(),
        Some(line) => {
            let mut text = line.name.clone();
            if let Some(at) = line.at {
                text.push_str(&format!(" ({} ago)", view::age(at, now)));
            }
            if let Some(reason) = &line.reason {
                text.push_str(&format!(" {reason}"));
            }
            text
        }
    }
}

/// The `status` table: a line per Cluster, then the agents that do not report.
pub fn status_text(
    views: &[view::ClusterStatusView],
    nodes: Option<&[view::NodeView]>,
    now: Timestamp,
) -> String {
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|view| {
            vec![
                view.namespace.clone(),
                view.cluster.clone(),
                view.phase.clone(),
                backup_cell(view.last_success.as_ref(), now),
                view.last_backup
                    .as_ref()
                    .map(|line| format!("{} {}", backup_cell(Some(line), now), line.phase))
                    .unwrap_or_else(|| "-".to_string()),
                if view.running.is_empty() {
                    "-".to_string()
                } else {
                    view.running
                        .iter()
                        .map(|line| {
                            format!("{} {} {}", line.name, line.phase, line.progress)
                                .trim_end()
                                .to_string()
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                if view.restoring.is_empty() {
                    "-".to_string()
                } else {
                    view.restoring
                        .iter()
                        .map(|line| {
                            format!(
                                "{} {}{} {}",
                                line.name,
                                line.phase,
                                line.reason
                                    .as_ref()
                                    .map(|reason| format!(" ({reason})"))
                                    .unwrap_or_default(),
                                line.volumes
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            ]
        })
        .collect();
    let mut text = if rows.is_empty() {
        "No Clusters.\n".to_string()
    } else {
        table::render(
            &[
                "NAMESPACE",
                "CLUSTER",
                "PHASE",
                "LAST SUCCESSFUL BACKUP",
                "NEWER, NOT COMPLETED",
                "BACKING UP",
                "RESTORING",
            ],
            &rows,
        )
    };
    let Some(nodes) = nodes else {
        text.push_str("\nNode agents: not shown (listing NodeAgents is not permitted)\n");
        return text;
    };
    let silent: Vec<String> = nodes
        .iter()
        .filter(|node| node.ready != "True")
        .map(|node| {
            format!(
                "{} ({})",
                node.node,
                node.reason.as_deref().unwrap_or("no report")
            )
        })
        .collect();
    text.push_str(&format!(
        "\nNode agents: {} reporting",
        nodes.len() - silent.len()
    ));
    if silent.is_empty() {
        text.push('\n');
    } else {
        text.push_str(&format!(", not reporting: {}\n", silent.join(", ")));
    }
    text
}

/// The `nodes` table.
pub fn nodes_table(views: &[view::NodeView]) -> String {
    let now = Timestamp::now();
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|node| {
            vec![
                node.node.clone(),
                match &node.reason {
                    Some(reason) => format!("{} ({reason})", node.ready),
                    None => node.ready.clone(),
                },
                node.last_heartbeat
                    .map(|at| format!("{} ago", view::age(at, now)))
                    .unwrap_or_else(|| "never".to_string()),
                node.clock_offset.clone().unwrap_or_else(|| "-".to_string()),
                if node.volumes.is_empty() {
                    "-".to_string()
                } else {
                    node.volumes
                        .iter()
                        .map(|(state, count)| format!("{count} {state}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                if node.movers.is_empty() {
                    "-".to_string()
                } else {
                    node.movers.join(", ")
                },
                node.version.clone().unwrap_or_else(|| "-".to_string()),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "No node agents have reported.\n".to_string();
    }
    table::render(
        &[
            "NODE",
            "REPORTING",
            "LAST REPORT",
            "CLOCK",
            "VOLUMES",
            "MOVERS",
            "VERSION",
        ],
        &rows,
    )
}

/// A Backup name from a Cluster's and the time: `orders-20261206-010203`.
pub fn backup_name(cluster: &str, now: Timestamp) -> String {
    let stamp = now.strftime("%Y%m%d-%H%M%S").to_string();
    // Names are at most 253 characters; leave room for the stamp.
    let cluster: String = cluster.chars().take(253 - stamp.len() - 1).collect();
    format!("{cluster}-{stamp}")
}

async fn backup(
    client: &Client,
    namespace: &str,
    cluster: Option<&str>,
    plan: Option<&str>,
    name: Option<&str>,
) -> Result<String> {
    let backups: Api<Backup> = Api::namespaced(client.clone(), namespace);
    let body = match plan {
        Some(plan) => {
            let plan: BackupPlan = Api::namespaced(client.clone(), namespace)
                .get(plan)
                .await
                .map_err(|error| not_found(error, "BackupPlan", plan, namespace))?;
            if let Some(cluster) = cluster
                && cluster != plan.spec.cluster_ref.name
            {
                return Err(Error::Refused(format!(
                    "BackupPlan {} backs up Cluster {}, not {cluster}",
                    plan.name_any(),
                    plan.spec.cluster_ref.name
                )));
            }
            let name = name
                .map(str::to_string)
                .unwrap_or_else(|| backup_name(&plan.spec.cluster_ref.name, Timestamp::now()));
            view::backup_from_plan(&plan, &name)
        }
        None => {
            let Some(cluster) = cluster else {
                return Err(Error::Refused(
                    "name the Cluster to back up, or --plan".to_string(),
                ));
            };
            Api::<Cluster>::namespaced(client.clone(), namespace)
                .get(cluster)
                .await
                .map_err(|error| not_found(error, "Cluster", cluster, namespace))?;
            let name = name
                .map(str::to_string)
                .unwrap_or_else(|| backup_name(cluster, Timestamp::now()));
            serde_json::json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
                "metadata": {"name": name},
                "spec": {"clusterRef": {"name": cluster}},
            })
        }
    };
    let backup: Backup =
        serde_json::from_value(body).map_err(|error| Error::Refused(error.to_string()))?;
    let made = backups.create(&PostParams::default(), &backup).await?;
    Ok(made.name_any())
}

fn not_found(error: kube::Error, kind: &str, name: &str, namespace: &str) -> Error {
    match error {
        kube::Error::Api(status) if status.code == 404 => {
            Error::Refused(format!("no {kind} {name} in namespace {namespace}"))
        }
        error => Error::Kube(error),
    }
}

/// How a followed object stands: still going, or ended well or badly.
enum Standing {
    Going,
    Completed,
    Failed,
}

/// Prints each new line `poll` gives until it says the object ended, at most `bound`.
async fn follow<F, Fut>(what: &str, bound: Duration, mut poll: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(String, Standing)>>,
{
    let deadline = tokio::time::Instant::now() + bound;
    let mut said = String::new();
    loop {
        let (line, standing) = poll().await?;
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if line != said {
            println!("{line}");
            said = line;
        }
        match standing {
            Standing::Completed => return Ok(()),
            Standing::Failed => return Err(Error::Refused(format!("{what} failed: {said}"))),
            Standing::Going => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Refused(format!(
                "{what} has not ended after {} s (--timeout); it goes on: {said}",
                bound.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn ready_text(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> String {
    view::ready(conditions)
        .map(|condition| format!("{}: {}", condition.reason, condition.message))
        .unwrap_or_default()
}

async fn follow_backup(
    client: &Client,
    namespace: &str,
    name: &str,
    bound: Duration,
) -> Result<()> {
    let api: Api<Backup> = Api::namespaced(client.clone(), namespace);
    follow(&format!("Backup {name}"), bound, || async {
        let status = api.get(name).await?.status.unwrap_or_default();
        let phase = status.phase.unwrap_or_default();
        let line = format!(
            "{phase:?} {} {}",
            view::progress(status.transfer.as_ref()),
            ready_text(&status.conditions)
        );
        let standing = match phase {
            BackupPhase::Completed => Standing::Completed,
            BackupPhase::Failed => Standing::Failed,
            _ => Standing::Going,
        };
        Ok((line, standing))
    })
    .await
}

async fn restore(
    client: &Client,
    namespace: &str,
    backup_name: &str,
    to: &str,
    statefulset: Option<&str>,
    claim_templates: &[String],
) -> Result<Made> {
    let backups: Api<Backup> = Api::namespaced(client.clone(), namespace);
    let backup = match backups.get_opt(backup_name).await? {
        Some(backup) => backup,
        None => {
            // Elsewhere? Say how to bring it here rather than only "not found".
            let elsewhere: Vec<String> = Api::<Backup>::all(client.clone())
                .list(&ListParams::default().fields(&format!("metadata.name={backup_name}")))
                .await
                .map(|list| list.items.iter().filter_map(|b| b.namespace()).collect())
                .unwrap_or_default();
            return Err(Error::Refused(if elsewhere.is_empty() {
                format!("no Backup {backup_name} in namespace {namespace}")
            } else {
                format!(
                    "Backup {backup_name} is in namespace{} {}, not {namespace}: a Restore reads a Backup of its own namespace. Attach the same repository in {namespace} (a BackupRepository with importSnapshots: true and the same bucket and key) and restore the Backup it imports",
                    if elsewhere.len() > 1 { "s" } else { "" },
                    elsewhere.join(", ")
                )
            }));
        }
    };
    if backup.spec.command.is_some() {
        return Err(Error::Refused(format!(
            "Backup {backup_name} is a command's dump: restore it with your own tool (custody restores the volumes it copied itself)"
        )));
    }
    let phase = backup.status.as_ref().and_then(|status| status.phase);
    if phase != Some(BackupPhase::Completed) {
        return Err(Error::Refused(format!(
            "Backup {backup_name} is {}, not Completed: only a completed Backup restores",
            phase
                .map(|phase| format!("{phase:?}"))
                .unwrap_or_else(|| "new".to_string())
        )));
    }
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), namespace);
    if clusters.get_opt(to).await?.is_some() {
        let restore: Restore = serde_json::from_value(serde_json::json!({
                    "apiVersion": "custody.io/v1alpha1", "kind": "Restore",
                    "metadata": {"name": restore_name(to, backup_name)
        },
                    "spec": {"clusterRef": {"name": to}, "backupRef": {"name": backup_name}},
                }))
        .map_err(|error| Error::Refused(error.to_string()))?;
        let made = Api::<Restore>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &restore)
            .await?;
        return Ok(Made {
            said: format!(
                "restore.custody.io/{} created: Cluster {to} from Backup {backup_name}",
                made.name_any()
            ),
            following: Following::Restore(made.name_any()),
        });
    }
    // A new Cluster: the source Cluster's templates (and its other settings) when it is here.
    let source = clusters.get_opt(&backup.spec.cluster_ref.name).await?;
    let mut spec = match &source {
        Some(source) => {
            serde_json::to_value(&source.spec).map_err(|error| Error::Refused(error.to_string()))?
        }
        None => serde_json::json!({}),
    };
    spec["statefulSetRef"] = serde_json::json!({"name": statefulset.unwrap_or(to)});
    if !claim_templates.is_empty() {
        spec["volumeClaimTemplates"] = serde_json::json!(claim_templates);
    } else if source.is_none() {
        return Err(Error::Refused(format!(
            "Cluster {} (the Backup's source) is not in namespace {namespace} to copy its volume claim templates from: name them with --claim-templates",
            backup.spec.cluster_ref.name
        )));
    }
    spec["restore"] = serde_json::json!({"backupRef": {"name": backup_name}});
    let cluster: Cluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": to}, "spec": spec,
    }))
    .map_err(|error| Error::Refused(error.to_string()))?;
    clusters.create(&PostParams::default(), &cluster).await?;
    Ok(Made {
        said: format!(
            "cluster.custody.io/{to} created from Backup {backup_name}: create (or scale up) StatefulSet {} with the same claim templates; its pods are held until every volume is verified",
            statefulset.unwrap_or(to)
        ),
        following: Following::Cluster(to.to_string()),
    })
}

/// What `restore` made, and what `--wait` follows.
struct Made {
    said: String,
    following: Following,
}

/// The Restore to follow: named, or the one custody makes for a new Cluster (its
/// `status.restoreName`), never another Restore of a Cluster of that name.
enum Following {
    Restore(String),
    Cluster(String),
}

/// A Restore's name: `<cluster>-from-<backup>`, cut to 253 characters (ending in a letter or
/// digit, as names must).
pub fn restore_name(cluster: &str, backup: &str) -> String {
    let name: String = format!("{cluster}-from-{backup}")
        .chars()
        .take(253)
        .collect();
    name.trim_end_matches(['-', '.']).to_string()
}

async fn follow_restore(
    client: &Client,
    namespace: &str,
    following: &Following,
    bound: Duration,
) -> Result<()> {
    let restores: Api<Restore> = Api::namespaced(client.clone(), namespace);
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), namespace);
    let what = match following {
        Following::Restore(name) => format!("Restore {name}"),
        Following::Cluster(name) => format!("the restore of Cluster {name}"),
    };
    follow(&what, bound, || async {
        let name = match following {
            Following::Restore(name) => Some(name.clone()),
            Following::Cluster(name) => clusters
                .get(name)
                .await?
                .status
                .and_then(|status| status.restore_name),
        };
        let Some(restore) = (match name {
            Some(name) => restores.get_opt(&name).await?,
            None => None,
        }) else {
            return Ok((
                "waiting for the controller to create the Restore".to_string(),
                Standing::Going,
            ));
        };
        let status = restore.status.clone().unwrap_or_default();
        let line = format!(
            "{} {:?} {} {}",
            restore.name_any(),
            status.phase.unwrap_or_default(),
            view::progress(status.transfer.as_ref()),
            ready_text(&status.conditions)
        );
        let standing = match status.phase {
            Some(RestorePhase::Completed) => Standing::Completed,
            Some(RestorePhase::Failed) => Standing::Failed,
            _ => Standing::Going,
        };
        Ok((line, standing))
    })
    .await
}

async fn why(client: &Client, namespace: &str, pod_name: &str, lines: i64) -> Result<view::Why> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods
        .get(pod_name)
        .await
        .map_err(|error| not_found(error, "pod", pod_name, namespace))?;
    let restores = Api::<Restore>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    let mut why = view::why(&pod, &restores.items);
    let tail = |container: &str| LogParams {
        container: Some(container.to_string()),
        tail_lines: Some(lines),
        ..LogParams::default()
    };
    let has_wait = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.init_containers.as_ref())
        .is_some_and(|containers| containers.iter().any(|c| c.name == view::WAIT_CONTAINER));
    if has_wait {
        let text = pods
            .logs(pod_name, &tail(view::WAIT_CONTAINER))
            .await
            .unwrap_or_else(|error| format!("(no log: {error})"));
        why.logs.insert(
            view::WAIT_CONTAINER.to_string(),
            text.lines().map(str::to_string).collect(),
        );
    }
    for volume in &why.volumes.clone() {
        let Some(job) = &volume.job else { continue };
        let movers = pods
            .list(&ListParams::default().labels(&format!("job-name={job}")))
            .await?;
        let Some(mover) = movers
            .items
            .iter()
            .max_by_key(|pod| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
        else {
            continue;
        };
        let container = mover
            .spec
            .as_ref()
            .and_then(|spec| spec.containers.first())
            .map(|container| container.name.clone())
            .unwrap_or_default();
        let text = pods
            .logs(&mover.name_any(), &tail(&container))
            .await
            .unwrap_or_else(|error| format!("(no log: {error})"));
        why.logs.insert(
            format!(
                "{} (mover of {}, pod {})",
                job,
                volume.claim,
                mover.name_any()
            ),
            text.lines().map(str::to_string).collect(),
        );
    }
    Ok(why)
}

/// The `why` report for people.
pub fn why_text(why: &view::Why) -> String {
    let mut text = format!(
        "Pod {}/{}{}: {}\n",
        why.namespace,
        why.pod,
        why.node
            .as_ref()
            .map(|node| format!(" on node {node}"))
            .unwrap_or_default(),
        why.verdict
    );
    if let Some(restore) = &why.restore {
        text.push_str(&format!(
            "Restore {}: {}{}, {}\n",
            restore.name,
            restore.phase,
            restore
                .reason
                .as_ref()
                .map(|reason| format!(" ({reason})"))
                .unwrap_or_default(),
            restore.volumes
        ));
        if let Some(message) = &why.restore_message {
            text.push_str(&format!("  {message}\n"));
        }
    }
    if !why.volumes.is_empty() {
        text.push('\n');
        let rows: Vec<Vec<String>> = why
            .volumes
            .iter()
            .map(|volume| {
                vec![
                    volume.claim.clone(),
                    volume.state.clone(),
                    volume.node.clone().unwrap_or_else(|| "-".to_string()),
                    volume.reason.clone().unwrap_or_else(|| "-".to_string()),
                    if volume.progress.is_empty() {
                        "-".to_string()
                    } else {
                        volume.progress.clone()
                    },
                    volume.attempts.to_string(),
                ]
            })
            .collect();
        text.push_str(&table::render(
            &["CLAIM", "STATE", "NODE", "REASON", "PROGRESS", "ATTEMPTS"],
            &rows,
        ));
        for volume in &why.volumes {
            if let Some(message) = &volume.message {
                text.push_str(&format!("  {}: {message}\n", volume.claim));
            }
        }
    }
    if !why.unrestored_claims.is_empty() {
        text.push_str(&format!(
            "Claims no Restore writes: {}\n",
            why.unrestored_claims.join(", ")
        ));
    }
    for (source, lines) in &why.logs {
        text.push_str(&format!("\nLast lines of {source}:\n"));
        for line in lines {
            text.push_str(&format!("  {line}\n"));
        }
    }
    text
}
