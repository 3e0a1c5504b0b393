//! custody acts with its own ServiceAccount's rights, which are wider than most users': it
//! execs a Backup's hooks in the application's pods, runs a tool's image beside a claim with a
//! Secret in its environment, reads a repository's credentials and passwords, holds and
//! restores a StatefulSet's pods. An object that makes custody do such a thing is admitted
//! only when the user who wrote it may do each of them directly (asked of the API server with
//! a SubjectAccessReview), so that custody is never a way around RBAC: what custody would do
//! for an object is [`required`]; whether the writer may is [`verdict`].

use custody_kube::api::{
    BackupPlanSpec, BackupRepositorySpec, BackupSpec, ClusterSpec, Consistency, ConsistencyMethod,
    LocalObjectReference,
};
use custody_kube::s3::Signer;

/// One thing custody would do for an object, as the permission a user needs to do it directly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    pub verb: &'static str,
    /// API group (`""`: the core group).
    pub group: &'static str,
    pub resource: &'static str,
    pub subresource: Option<&'static str>,
    /// One object by name; `None`: any in the namespace.
    pub name: Option<String>,
    /// What custody would do with it (for the refusal's message).
    pub because: String,
    /// Another namespace than the object's (a drill's); `None`: the object's.
    pub namespace: Option<String>,
}

impl Access {
    /// The permission as `kubectl auth can-i` spells it: `create pods/exec`,
    /// `get secrets/tool-credentials`.
    pub fn permission(&self) -> String {
        let mut resource = self.resource.to_string();
        if !self.group.is_empty() {
            resource = format!("{resource}.{}", self.group);
        }
        if let Some(subresource) = self.subresource {
            resource = format!("{resource}/{subresource}");
        }
        let permission = match &self.name {
            Some(name) => format!("{} {resource} {name}", self.verb),
            None => format!("{} {resource}", self.verb),
        };
        match &self.namespace {
            Some(namespace) => format!("{permission} in namespace {namespace}"),
            None => permission,
        }
    }

    fn new(verb: &'static str, resource: &'static str, because: String) -> Access {
        Access {
            verb,
            group: "",
            resource,
            subresource: None,
            name: None,
            because,
            namespace: None,
        }
    }

    fn within(self, namespace: Option<&str>) -> Access {
        Access {
            namespace: namespace.map(str::to_string),
            ..self
        }
    }

    fn named(self, name: &str) -> Access {
        Access {
            name: Some(name.to_string()),
            ..self
        }
    }
}

/// A custody object as it was written, with what its check needs from other objects.
#[derive(Clone, Copy, Debug)]
pub enum Object<'a> {
    Backup {
        spec: &'a BackupSpec,
        /// The credentials Secret of the repository a `command` Backup writes to, when its
        /// repository exists: the command gets those credentials in its environment. `None`
        /// (no repository yet) asks for every Secret of the namespace.
        command_credentials: Option<&'a Signer>,
        /// The repository its Cluster names.
        cluster_repository: ClusterRepository<'a>,
    },
    /// A plan's runs, made later by the controller and not checked again, use whichever
    /// repository and credentials are named when each runs: its `command` asks for every
    /// Secret of the namespace.
    BackupPlan {
        spec: &'a BackupPlanSpec,
        cluster_repository: ClusterRepository<'a>,
    },
    /// A Cluster, with whose data its `spec.restore` restores (`OwnCluster` without one).
    Cluster {
        spec: &'a ClusterSpec,
        source: Source<'a>,
    },
    /// A Restore, with the StatefulSet of the Cluster it writes (`None`: no such Cluster yet,
    /// which asks for every StatefulSet of the namespace) and whose data it restores.
    Restore {
        stateful_set: Option<&'a str>,
        source: Source<'a>,
    },
    BackupRepository(&'a BackupRepositorySpec),
}

/// The repository a Backup's Cluster names, where its data goes by default.
#[derive(Clone, Copy, Debug)]
pub enum ClusterRepository<'a> {
    Named(&'a str),
    /// The Cluster names none, or does not exist.
    Unknown,
}

/// A Backup or BackupPlan that sends the Cluster's data to a repository other than the one
/// its Cluster names (one its writer may control) copies the volumes out as a pod of the
/// writer mounting them would: it needs `create pods`, unless its other permissions have it.
fn other_repository(
    needed: &mut Vec<Access>,
    repository: Option<&LocalObjectReference>,
    cluster_repository: ClusterRepository<'_>,
) {
    let Some(repository) = repository.map(|reference| reference.name.as_str()) else {
        return;
    };
    if matches!(cluster_repository, ClusterRepository::Named(named) if named == repository) {
        return;
    }
    if needed.iter().any(|access| {
        access.verb == "create" && access.resource == "pods" && access.subresource.is_none()
    }) {
        return;
    }
    needed.push(Access::new(
        "create",
        "pods",
        format!(
            "it copies the Cluster's volumes into repository {repository}, which the Cluster does not name, as a pod mounting them could"
        ),
    ));
}

/// A `command` (a Backup's, or a BackupPlan's runs') runs the writer's image beside the
/// claims with the repository's credentials (`credentials`, every Secret while unknown).
fn command_needs(
    needed: &mut Vec<Access>,
    command: Option<&custody_kube::api::CommandBackup>,
    credentials: Option<&Signer>,
) {
    let Some(command) = command else {
        return;
    };
    needed.push(Access::new(
        "create",
        "pods",
        format!(
            "its command runs image {} in a pod that mounts the Cluster's claims",
            command.image
        ),
    ));
    let because = "its command gets the repository's credentials in its environment";
    match credentials {
        Some(signer) => needed.push(signer_access(signer, because.into())),
        // Keys of any Secret, or a token of any ServiceAccount (a web identity's).
        None => needed.extend([
            Access::new("get", "secrets", because.into()),
            Access {
                subresource: Some("token"),
                ..Access::new("create", "serviceaccounts", because.into())
            },
        ]),
    }
}

/// What reading with `signer` directly takes: `get` on its Secret, or `create` on its
/// ServiceAccount's `token` (custody would present that ServiceAccount's tokens to the STS).
pub fn signer_access(signer: &Signer, because: String) -> Access {
    match signer {
        Signer::Secret(name) => Access::new("get", "secrets", because).named(name),
        Signer::WebIdentity(identity) => Access {
            subresource: Some("token"),
            ..Access::new("create", "serviceaccounts", because)
        }
        .named(&identity.service_account_name),
    }
}

/// Whose data a Restore writes into its Cluster's volumes.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// A Backup of the Restore's own Cluster: its data is the Cluster's already.
    OwnCluster,
    /// A Backup of Cluster `cluster`, another: the writer must be able to read that data
    /// directly, that is to open its repository with these (credentials, passwords).
    OtherCluster {
        cluster: &'a str,
        secrets: &'a [Signer],
    },
    /// A Backup that does not exist yet, or whose repository cannot be found: whose data it
    /// holds is unknown, which asks for every Secret of the namespace.
    Unknown,
}

/// What custody would do for `object`, each as the permission its writer must have.
pub fn required(object: Object<'_>) -> Vec<Access> {
    match object {
        Object::Backup {
            spec,
            command_credentials,
            cluster_repository,
        } => {
            let mut needed = consistency(spec.consistency.as_ref());
            command_needs(&mut needed, spec.command.as_ref(), command_credentials);
            other_repository(
                &mut needed,
                spec.repository_ref.as_ref(),
                cluster_repository,
            );
            needed
        }
        Object::BackupPlan {
            spec,
            cluster_repository,
        } => {
            let mut needed = consistency(spec.consistency.as_ref());
            command_needs(&mut needed, spec.command.as_ref(), None);
            other_repository(
                &mut needed,
                spec.repository_ref.as_ref(),
                cluster_repository,
            );
            if let Some(drill) = &spec.drill {
                needed.extend(drill_needs(drill));
            }
            needed
        }
        Object::Cluster { spec, source } => {
            let mut needed = vec![Access {
                group: "apps",
                ..Access::new(
                    "update",
                    "statefulsets",
                    format!(
                        "custody holds the pods of StatefulSet {} until restored data is verified, and copies and writes its volumes",
                        spec.stateful_set_ref.name
                    ),
                )
                .named(&spec.stateful_set_ref.name)
            }];
            needed.extend(consistency(spec.consistency.as_ref()));
            needed.extend(restore_source(source));
            needed
        }
        Object::Restore {
            stateful_set,
            source,
        } => {
            let access = Access {
                group: "apps",
                ..Access::new(
                    "update",
                    "statefulsets",
                    "custody writes the volumes of the Cluster's StatefulSet and holds its pods"
                        .into(),
                )
            };
            let mut needed = vec![match stateful_set {
                Some(name) => access.named(name),
                None => access,
            }];
            needed.extend(restore_source(source));
            needed
        }
        Object::BackupRepository(spec) => {
            let mut needed = vec![signer_access(
                &Signer::of(spec),
                format!(
                    "custody signs its requests to {} with these credentials",
                    spec.endpoint
                ),
            )];
            if let Some(encryption) = &spec.encryption {
                needed.push(
                    Access::new(
                        "get",
                        "secrets",
                        "custody opens the repository with these passwords".into(),
                    )
                    .named(&encryption.key_secret_ref.name),
                );
            }
            needed
        }
    }
}

/// What a plan's restore drill does in its namespace (`None`: the plan's), as its writer's
/// permissions: a StatefulSet running the application's pod template and a Cluster restored
/// from the plan's Backup, the check's pod (its image, its Secret); elsewhere, an imported
/// view of the Backup through that namespace's repository.
fn drill_needs(drill: &custody_kube::api::Drill) -> Vec<Access> {
    let namespace = drill.namespace.as_deref();
    let mut needed = vec![
        Access {
            group: "apps",
            ..Access::new(
                "create",
                "statefulsets",
                "its drill runs a copy of the Cluster's StatefulSet on the restored data".into(),
            )
        }
        .within(namespace),
        Access::new(
            "create",
            "pods",
            format!(
                "its drill's engine check runs image {}",
                drill
                    .check
                    .image
                    .as_deref()
                    .unwrap_or("of the application's first container")
            ),
        )
        .within(namespace),
    ];
    if let Some(secret) = &drill.check.credentials_secret_ref {
        needed.push(
            Access::new(
                "get",
                "secrets",
                "its drill's engine check gets this Secret in its environment".into(),
            )
            .named(&secret.name)
            .within(namespace),
        );
    }
    if let Some(elsewhere) = namespace {
        // Out of the plan's namespace go the Cluster's data and its pod template (with
        // whatever its environment holds): what reading them there directly takes.
        needed.push(Access {
            group: "apps",
            ..Access::new(
                "get",
                "statefulsets",
                format!("its drill copies the Cluster's StatefulSet to namespace {elsewhere}"),
            )
        });
        needed.push(Access::new(
            "get",
            "secrets",
            format!(
                "its drill restores the Cluster's data in namespace {elsewhere}, as reading its repository's Secrets here would"
            ),
        ));
        needed.push(
            Access {
                group: custody_kube::api::GROUP,
                ..Access::new(
                    "create",
                    "clusters",
                    "its drill restores the Backup into a Cluster there".into(),
                )
            }
            .within(namespace),
        );
        if let Some(repository) = &drill.repository_ref {
            needed.push(
                Access {
                    group: custody_kube::api::GROUP,
                    ..Access::new(
                        "get",
                        "backuprepositories",
                        "its drill opens the Backup's snapshot with this repository".into(),
                    )
                }
                .named(&repository.name)
                .within(namespace),
            );
        }
    }
    needed
}

/// The ClusterRole a namespace's admin binds to custody's ServiceAccount in a namespace to let
/// custody run restore drills there (create and delete the drill's StatefulSet): custody
/// creates StatefulSets nowhere else.
pub const DRILLS_ROLE: &str = "custody-drills";

/// The ClusterRole a namespace's admin binds to custody's ServiceAccount in the namespace to
/// let custody run hooks there: custody has no `pods/exec` anywhere else.
pub const HOOKS_ROLE: &str = "custody-hooks";

/// What custody itself needs in the object's namespace that only the namespace's admin grants
/// it: `create pods/exec`, for hooks (ClusterRole [`HOOKS_ROLE`]), and `create
/// serviceaccounts/token` of a repository's web identity (ClusterRole
/// [`custody_kube::sts::WEB_IDENTITY_ROLE`]), each bound in that namespace. Everything else
/// custody does, its own ClusterRole grants everywhere.
pub fn opted_in(object: Object<'_>) -> Vec<Access> {
    let consistency = match object {
        Object::Backup { spec, .. } => spec.consistency.as_ref(),
        Object::BackupPlan { spec, .. } => {
            let mut needed = hooks(spec.consistency.as_ref());
            if let Some(drill) = &spec.drill {
                let namespace = drill.namespace.as_deref();
                needed.extend(["create", "delete"].map(|verb| {
                    Access {
                        group: "apps",
                        ..Access::new(
                            verb,
                            "statefulsets",
                            "its drill runs a copy of the Cluster's StatefulSet".into(),
                        )
                    }
                    .within(namespace)
                }));
            }
            return needed;
        }
        Object::Cluster { spec, .. } => spec.consistency.as_ref(),
        Object::BackupRepository(spec) => {
            return spec
                .web_identity
                .iter()
                .map(|identity| {
                    signer_access(
                        &Signer::WebIdentity(identity.clone()),
                        "custody's own calls to the repository present its tokens to the STS"
                            .into(),
                    )
                })
                .collect();
        }
        Object::Restore { .. } => None,
    };
    hooks(consistency)
}

/// What hooks need of custody's own rights: `create pods/exec`.
fn hooks(consistency: Option<&Consistency>) -> Vec<Access> {
    match consistency.map(|consistency| consistency.method) {
        Some(ConsistencyMethod::Hooks) => vec![Access {
            subresource: Some("exec"),
            ..Access::new(
                "create",
                "pods",
                "its hooks run commands in the application's pods".into(),
            )
        }],
        _ => Vec::new(),
    }
}

/// How `kubectl create rolebinding` names custody's own user: `--serviceaccount NS:NAME`
/// for a ServiceAccount, else `--user NAME`.
pub fn subject_flag(user: &str) -> String {
    match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|account| account.split_once(':'))
    {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
            format!("--serviceaccount {namespace}:{name}")
        }
        _ => format!("--user {user}"),
    }
}

/// The refusal of an object that needs what `namespace` has not granted custody's own user
/// `custody` (`allowed[i]`: whether the API server allows `needed[i]` to it), naming the
/// command its admin runs to grant it; `None` when every one is granted.
pub fn opt_in_verdict(
    custody: &str,
    namespace: &str,
    needed: &[Access],
    allowed: &[bool],
) -> Option<String> {
    let missing = missing(needed, allowed);
    if missing.is_empty() {
        return None;
    }
    let refused: Vec<&Access> = needed
        .iter()
        .zip(allowed.iter().chain(std::iter::repeat(&false)))
        .filter(|(_, allowed)| !**allowed)
        .map(|(access, _)| access)
        .collect();
    let (what, role) = if refused
        .iter()
        .any(|access| access.subresource == Some("token"))
    {
        (
            "ask for tokens of a web identity's ServiceAccount",
            custody_kube::sts::WEB_IDENTITY_ROLE,
        )
    } else if refused
        .iter()
        .any(|access| access.resource == "statefulsets")
    {
        ("run restore drills", DRILLS_ROLE)
    } else {
        ("run hooks", HOOKS_ROLE)
    };
    let namespace = refused
        .iter()
        .find_map(|access| access.namespace.as_deref())
        .unwrap_or(namespace);
    Some(format!(
        "namespace {namespace} has not let custody {what}: custody would need {}, which it has only where a namespace's admin grants it: kubectl create rolebinding {role} --namespace {namespace} --clusterrole {role} {}",
        missing.join("; "),
        subject_flag(custody)
    ))
}

/// What restoring another Cluster's data takes: the rights that read it directly.
fn restore_source(source: Source<'_>) -> Vec<Access> {
    match source {
        Source::OwnCluster => Vec::new(),
        Source::OtherCluster { cluster, secrets } => secrets
            .iter()
            .map(|signer| {
                signer_access(
                    signer,
                    format!(
                        "it restores the data of Cluster {cluster}, read from the repository these credentials open"
                    ),
                )
            })
            .collect(),
        Source::Unknown => vec![Access::new(
            "get",
            "secrets",
            "it restores a Backup whose data and repository are not known yet".into(),
        )],
    }
}

/// What a consistency method makes custody do in the application's namespace.
fn consistency(consistency: Option<&Consistency>) -> Vec<Access> {
    let Some(consistency) = consistency else {
        return Vec::new();
    };
    match consistency.method {
        ConsistencyMethod::Hooks => vec![Access {
            subresource: Some("exec"),
            ..Access::new(
                "create",
                "pods",
                "its hooks run commands in the application's pods".into(),
            )
        }],
        ConsistencyMethod::Tool => {
            let Some(tool) = &consistency.tool else {
                return Vec::new();
            };
            let mut needed = vec![Access::new(
                "create",
                "pods",
                format!(
                    "its tool runs image {} in a pod that mounts the Cluster's claims",
                    tool.image
                ),
            )];
            if let Some(secret) = &tool.credentials_secret_ref {
                needed.push(
                    Access::new(
                        "get",
                        "secrets",
                        "its tool gets this Secret in its environment".into(),
                    )
                    .named(&secret.name),
                );
            }
            needed
        }
        // The freeze is the agent's, bounded by it and asked for only by custody's own Job;
        // a copy reads what a Backup of a stopped application reads.
        ConsistencyMethod::Freeze | ConsistencyMethod::CrashUnsafe => Vec::new(),
    }
}

/// The refusal of an object whose writer `user` lacks some of `required` in `namespace`
/// (`allowed[i]`: whether the API server allows `required[i]`), naming every missing
/// permission and what custody would have done with it; `None` when every one is allowed.
pub fn verdict(
    user: &str,
    namespace: &str,
    required: &[Access],
    allowed: &[bool],
) -> Option<String> {
    let missing = missing(required, allowed);
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "custody would act for {user} with rights {user} does not have in namespace {namespace}: {}. Ask for these permissions, or leave out what needs them",
        missing.join("; ")
    ))
}

/// Each of `needed` not allowed (`allowed[i]`; a missing answer is a refusal), as the
/// permission and what custody would do with it.
fn missing(needed: &[Access], allowed: &[bool]) -> Vec<String> {
    needed
        .iter()
        .zip(allowed.iter().chain(std::iter::repeat(&false)))
        .filter(|(_, allowed)| !**allowed)
        .map(|(access, _)| format!("{} ({})", access.permission(), access.because))
        .collect()
}

#[cfg(test)]
mod tests;
