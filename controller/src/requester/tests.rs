use serde_json::json;

use super::*;

fn backup(spec: serde_json::Value) -> BackupSpec {
    serde_json::from_value(spec).expect("BackupSpec")
}

fn permissions(needed: &[Access]) -> Vec<String> {
    needed.iter().map(Access::permission).collect()
}

const HOOKS: &str = r#"{"method": "Hooks", "hooks": {"pre": {"command": ["sync"]}}}"#;
const TOOL: &str = r#"{"method": "Tool", "tool": {"image": "postgres:15", "command": ["pg_basebackup"], "credentialsSecretRef": {"name": "pg"}}}"#;

fn method(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

/// Each way an object makes custody act, and the permission its writer needs for it.
#[test]
fn an_object_needs_of_its_writer_every_permission_custody_would_use_for_it() {
    let cluster = |consistency: Option<&str>| {
        let mut spec = json!({"statefulSetRef": {"name": "db"}, "volumeClaimTemplates": ["data"]});
        if let Some(consistency) = consistency {
            spec["consistency"] = method(consistency);
        }
        serde_json::from_value::<ClusterSpec>(spec).unwrap()
    };
    let plan = |consistency: &str| {
        serde_json::from_value::<BackupPlanSpec>(json!({
            "clusterRef": {"name": "db"}, "schedule": "0 3 * * *", "consistency": method(consistency),
        }))
        .unwrap()
    };
    let repository = |encrypted: bool| {
        let mut spec = json!({"endpoint": "https://s3.example", "bucket": "bkp", "credentialsSecretRef": {"name": "s3"}});
        if encrypted {
            spec["encryption"] = json!({"keySecretRef": {"name": "keys"}});
        }
        serde_json::from_value::<BackupRepositorySpec>(spec).unwrap()
    };
    let command = backup(json!({"clusterRef": {"name": "db"}, "command": {
        "image": "dumper", "command": ["dump"], "prefix": "dumps"}}));
    let stopped = backup(json!({"clusterRef": {"name": "db"}}));
    let hooked = backup(json!({"clusterRef": {"name": "db"}, "consistency": method(HOOKS)}));
    let tool = backup(json!({"clusterRef": {"name": "db"}, "consistency": method(TOOL)}));
    let tool_without_secret = backup(json!({"clusterRef": {"name": "db"}, "consistency":
        {"method": "Tool", "tool": {"image": "t", "command": ["t"]}}}));
    let frozen = backup(json!({"clusterRef": {"name": "db"}, "consistency": {"method": "Freeze"}}));
    let unsafe_copy =
        backup(json!({"clusterRef": {"name": "db"}, "consistency": {"method": "CrashUnsafe"}}));
    let (plain_cluster, hooked_cluster) = (cluster(None), cluster(Some(HOOKS)));
    let (hooked_plan, tool_plan) = (plan(HOOKS), plan(TOOL));
    let (plain_repository, encrypted_repository) = (repository(false), repository(true));
    let other_secrets = [
        Signer::Secret("s3".to_string()),
        Signer::Secret("keys".to_string()),
    ];
    let identity: custody_kube::api::RepositoryWebIdentity =
        serde_json::from_value(json!({"serviceAccountName": "backups", "roleArn": "arn:r"}))
            .unwrap();
    let with_identity = Signer::WebIdentity(identity.clone());
    let other_with_identity = [with_identity.clone(), Signer::Secret("keys".to_string())];
    let identity_repository = serde_json::from_value::<BackupRepositorySpec>(json!({
        "endpoint": "https://s3.example", "bucket": "bkp",
        "webIdentity": {"serviceAccountName": "backups", "roleArn": "arn:r"},
        "encryption": {"keySecretRef": {"name": "keys"}}}))
    .unwrap();
    let (s3, mine_s3) = (
        Signer::Secret("s3".to_string()),
        Signer::Secret("mine-s3".to_string()),
    );
    let backup_of = |spec| Object::Backup {
        spec,
        command_credentials: None,
        cluster_repository: ClusterRepository::Named("main"),
    };
    let plan_of = |spec| Object::BackupPlan {
        spec,
        cluster_repository: ClusterRepository::Named("main"),
    };
    let command_plan = serde_json::from_value::<BackupPlanSpec>(json!({
        "clusterRef": {"name": "db"}, "schedule": "0 3 * * *",
        "command": {"image": "dumper", "command": ["dump"], "prefix": "dumps"}}))
    .unwrap();
    let to_main = backup(json!({"clusterRef": {"name": "db"}, "repositoryRef": {"name": "main"}}));
    let to_mine = backup(json!({"clusterRef": {"name": "db"}, "repositoryRef": {"name": "mine"}}));
    let command_to_mine = backup(
        json!({"clusterRef": {"name": "db"}, "repositoryRef": {"name": "mine"},
        "command": {"image": "dumper", "command": ["dump"], "prefix": "dumps"}}),
    );
    let plan_to_mine = serde_json::from_value::<BackupPlanSpec>(json!({
        "clusterRef": {"name": "db"}, "schedule": "0 3 * * *", "repositoryRef": {"name": "mine"}}))
    .unwrap();
    let cases: Vec<(&str, Object<'_>, Vec<&str>)> = vec![
        (
            "a Backup of a stopped application",
            backup_of(&stopped),
            vec![],
        ),
        ("a frozen copy", backup_of(&frozen), vec![]),
        ("a crash-unsafe copy", backup_of(&unsafe_copy), vec![]),
        ("hooks", backup_of(&hooked), vec!["create pods/exec"]),
        (
            "a tool with a Secret",
            backup_of(&tool),
            vec!["create pods", "get secrets pg"],
        ),
        (
            "a tool without one",
            backup_of(&tool_without_secret),
            vec!["create pods"],
        ),
        (
            "a command, its repository known",
            Object::Backup {
                spec: &command,
                command_credentials: Some(&s3),
                cluster_repository: ClusterRepository::Named("main"),
            },
            vec!["create pods", "get secrets s3"],
        ),
        (
            "a command, its repository not yet there: any Secret, any ServiceAccount's token",
            backup_of(&command),
            vec!["create pods", "get secrets", "create serviceaccounts/token"],
        ),
        (
            "a plan with hooks",
            plan_of(&hooked_plan),
            vec!["create pods/exec"],
        ),
        (
            "a plan whose runs dump with a command: any Secret (its runs use whichever repository is named when they run, and are not checked again)",
            plan_of(&command_plan),
            vec!["create pods", "get secrets", "create serviceaccounts/token"],
        ),
        (
            "a plan with a tool",
            plan_of(&tool_plan),
            vec!["create pods", "get secrets pg"],
        ),
        (
            "a Backup into its Cluster's repository, named",
            backup_of(&to_main),
            vec![],
        ),
        (
            "a Backup into another repository: reading the volumes",
            backup_of(&to_mine),
            vec!["create pods"],
        ),
        (
            "a Backup into a repository, its Cluster naming none or not there",
            Object::Backup {
                spec: &to_main,
                command_credentials: None,
                cluster_repository: ClusterRepository::Unknown,
            },
            vec!["create pods"],
        ),
        (
            "a command into another repository: create pods once",
            Object::Backup {
                spec: &command_to_mine,
                command_credentials: Some(&mine_s3),
                cluster_repository: ClusterRepository::Named("main"),
            },
            vec!["create pods", "get secrets mine-s3"],
        ),
        (
            "a plan into another repository",
            plan_of(&plan_to_mine),
            vec!["create pods"],
        ),
        (
            "a Cluster",
            Object::Cluster {
                spec: &plain_cluster,
                source: Source::OwnCluster,
            },
            vec!["update statefulsets.apps db"],
        ),
        (
            "a Cluster with hooks",
            Object::Cluster {
                spec: &hooked_cluster,
                source: Source::OwnCluster,
            },
            vec!["update statefulsets.apps db", "create pods/exec"],
        ),
        (
            "a Restore of a Cluster from its own Backup",
            Object::Restore {
                stateful_set: Some("db"),
                source: Source::OwnCluster,
            },
            vec!["update statefulsets.apps db"],
        ),
        (
            "a Restore of no Cluster yet: any StatefulSet",
            Object::Restore {
                stateful_set: None,
                source: Source::OwnCluster,
            },
            vec!["update statefulsets.apps"],
        ),
        (
            "a Restore from another Cluster's Backup: what opens its repository",
            Object::Restore {
                stateful_set: Some("db"),
                source: Source::OtherCluster {
                    cluster: "payroll",
                    secrets: &other_secrets,
                },
            },
            vec![
                "update statefulsets.apps db",
                "get secrets s3",
                "get secrets keys",
            ],
        ),
        (
            "a Restore from a Backup not known yet: any Secret",
            Object::Restore {
                stateful_set: Some("db"),
                source: Source::Unknown,
            },
            vec!["update statefulsets.apps db", "get secrets"],
        ),
        (
            "a Cluster that restores another Cluster's Backup",
            Object::Cluster {
                spec: &plain_cluster,
                source: Source::OtherCluster {
                    cluster: "payroll",
                    secrets: &other_secrets,
                },
            },
            vec![
                "update statefulsets.apps db",
                "get secrets s3",
                "get secrets keys",
            ],
        ),
        (
            "a command, its repository signing with a web identity: the ServiceAccount's tokens",
            Object::Backup {
                spec: &command,
                command_credentials: Some(&with_identity),
                cluster_repository: ClusterRepository::Named("main"),
            },
            vec!["create pods", "create serviceaccounts/token backups"],
        ),
        (
            "a Restore from another Cluster's Backup in a repository with a web identity",
            Object::Restore {
                stateful_set: Some("db"),
                source: Source::OtherCluster {
                    cluster: "payroll",
                    secrets: &other_with_identity,
                },
            },
            vec![
                "update statefulsets.apps db",
                "create serviceaccounts/token backups",
                "get secrets keys",
            ],
        ),
        (
            "a repository",
            Object::BackupRepository(&plain_repository),
            vec!["get secrets s3"],
        ),
        (
            "a repository with a web identity: its ServiceAccount's tokens",
            Object::BackupRepository(&identity_repository),
            vec!["create serviceaccounts/token backups", "get secrets keys"],
        ),
        (
            "an encrypted repository",
            Object::BackupRepository(&encrypted_repository),
            vec!["get secrets s3", "get secrets keys"],
        ),
    ];
    for (case, object, expected) in cases {
        assert_eq!(permissions(&required(object)), expected, "{case}");
    }
}

/// Admitted only when every permission is allowed; the refusal names each missing one and
/// what custody would have done with it, and none that is allowed.
#[test]
fn an_object_is_refused_naming_each_permission_its_writer_lacks() {
    let hooked = backup(json!({"clusterRef": {"name": "db"}, "consistency": method(TOOL)}));
    let needed = required(Object::Backup {
        spec: &hooked,
        command_credentials: None,
        cluster_repository: ClusterRepository::Unknown,
    });
    assert_eq!(needed.len(), 2);
    assert_eq!(verdict("alice", "shop", &needed, &[true, true]), None);
    assert_eq!(verdict("alice", "shop", &[], &[]), None);
    let refused = verdict("alice", "shop", &needed, &[true, false]).expect("refused");
    assert!(
        refused.contains("get secrets pg (its tool gets this Secret"),
        "{refused}"
    );
    assert!(!refused.contains("create pods ("), "{refused}");
    assert!(
        refused.contains("alice") && refused.contains("namespace shop"),
        "{refused}"
    );
    let refused = verdict("alice", "shop", &needed, &[false, false]).expect("refused");
    assert!(
        refused.contains("create pods (its tool runs image postgres:15")
            && refused.contains("get secrets pg"),
        "{refused}"
    );
    // An answer missing counts as a refusal.
    assert!(verdict("alice", "shop", &needed, &[true]).is_some());
}

/// Hooks are the one thing custody does only where a namespace's admin let it: every object
/// with method Hooks needs `create pods/exec` of custody itself, nothing else does.
#[test]
fn only_hooks_need_the_namespaces_consent() {
    let of_backup = |consistency: Option<&str>| {
        let mut spec = json!({"clusterRef": {"name": "db"}});
        if let Some(consistency) = consistency {
            spec["consistency"] = method(consistency);
        }
        backup(spec)
    };
    let cluster = |consistency: &str| {
        serde_json::from_value::<ClusterSpec>(json!({"statefulSetRef": {"name": "db"},
            "volumeClaimTemplates": ["data"], "consistency": method(consistency)}))
        .unwrap()
    };
    let plan = |consistency: &str| {
        serde_json::from_value::<BackupPlanSpec>(json!({"clusterRef": {"name": "db"},
            "schedule": "0 3 * * *", "consistency": method(consistency)}))
        .unwrap()
    };
    let repository = serde_json::from_value::<BackupRepositorySpec>(json!({
        "endpoint": "https://s3.example", "bucket": "bkp", "credentialsSecretRef": {"name": "s3"}}))
    .unwrap();
    let identity_repository = serde_json::from_value::<BackupRepositorySpec>(json!({
        "endpoint": "https://s3.example", "bucket": "bkp",
        "webIdentity": {"serviceAccountName": "backups", "roleArn": "arn:r"}}))
    .unwrap();
    let (hooked, tool, frozen, plain) = (
        of_backup(Some(HOOKS)),
        of_backup(Some(TOOL)),
        of_backup(Some(r#"{"method": "Freeze"}"#)),
        of_backup(None),
    );
    let (hooked_cluster, tool_cluster) = (cluster(HOOKS), cluster(TOOL));
    let (hooked_plan, tool_plan) = (plan(HOOKS), plan(TOOL));
    let backup_of = |spec| Object::Backup {
        spec,
        command_credentials: None,
        cluster_repository: ClusterRepository::Unknown,
    };
    let plan_of = |spec| Object::BackupPlan {
        spec,
        cluster_repository: ClusterRepository::Unknown,
    };
    let cluster_of = |spec| Object::Cluster {
        spec,
        source: Source::OwnCluster,
    };
    let exec = vec!["create pods/exec".to_string()];
    let cases: Vec<(&str, Object<'_>, Vec<String>)> = vec![
        ("Backup with hooks", backup_of(&hooked), exec.clone()),
        ("BackupPlan with hooks", plan_of(&hooked_plan), exec.clone()),
        (
            "Cluster with hooks",
            cluster_of(&hooked_cluster),
            exec.clone(),
        ),
        ("Backup with a tool", backup_of(&tool), vec![]),
        ("Backup frozen", backup_of(&frozen), vec![]),
        ("Backup of a stopped application", backup_of(&plain), vec![]),
        ("BackupPlan with a tool", plan_of(&tool_plan), vec![]),
        ("Cluster with a tool", cluster_of(&tool_cluster), vec![]),
        (
            "Restore",
            Object::Restore {
                stateful_set: Some("db"),
                source: Source::Unknown,
            },
            vec![],
        ),
        (
            "BackupRepository",
            Object::BackupRepository(&repository),
            vec![],
        ),
        (
            "BackupRepository with a web identity: custody asks for its tokens",
            Object::BackupRepository(&identity_repository),
            vec!["create serviceaccounts/token backups".to_string()],
        ),
    ];
    for (case, object, expected) in cases {
        assert_eq!(permissions(&opted_in(object)), expected, "{case}");
    }
}

/// Refused while the namespace has not granted it, naming the namespace and the exact command
/// its admin runs; admitted once granted; a missing answer counts as not granted.
#[test]
fn hooks_in_a_namespace_that_did_not_consent_are_refused_naming_the_rolebinding() {
    let hooked = backup(json!({"clusterRef": {"name": "db"}, "consistency": method(HOOKS)}));
    let needed = opted_in(Object::Backup {
        spec: &hooked,
        command_credentials: None,
        cluster_repository: ClusterRepository::Unknown,
    });
    let custody = "system:serviceaccount:custody-system:custody-controller";
    assert_eq!(opt_in_verdict(custody, "shop", &needed, &[true]), None);
    assert_eq!(opt_in_verdict(custody, "shop", &[], &[]), None);
    for answers in [&[false][..], &[][..]] {
        let refused = opt_in_verdict(custody, "shop", &needed, answers).expect("refused");
        assert!(
            refused.contains("namespace shop has not let custody run hooks")
                && refused.contains("create pods/exec (its hooks run commands")
                && refused.ends_with(
                    "kubectl create rolebinding custody-hooks --namespace shop --clusterrole custody-hooks --serviceaccount custody-system:custody-controller"
                ),
            "{refused}"
        );
    }
}

/// A web identity's repository in a namespace that did not let custody ask for its tokens is
/// refused naming that ClusterRole, not the hooks'.
#[test]
fn a_web_identity_in_a_namespace_that_did_not_consent_is_refused_naming_its_rolebinding() {
    let repository = serde_json::from_value::<BackupRepositorySpec>(json!({
        "endpoint": "https://s3.example", "bucket": "bkp",
        "webIdentity": {"serviceAccountName": "backups", "roleArn": "arn:r"}}))
    .unwrap();
    let needed = opted_in(Object::BackupRepository(&repository));
    let custody = "system:serviceaccount:custody-system:custody-controller";
    assert_eq!(opt_in_verdict(custody, "shop", &needed, &[true]), None);
    for answers in [&[false][..], &[][..]] {
        let refused = opt_in_verdict(custody, "shop", &needed, answers).expect("refused");
        assert!(
            refused.contains("namespace shop has not let custody ask for tokens of a web identity's ServiceAccount")
                && refused.contains("create serviceaccounts/token backups (custody's own calls")
                && refused.ends_with(
                    "kubectl create rolebinding custody-web-identity --namespace shop --clusterrole custody-web-identity --serviceaccount custody-system:custody-controller"
                ),
            "{refused}"
        );
    }
}

#[test]
fn custody_is_named_as_kubectl_names_a_subject() {
    for (user, flag) in [
        (
            "system:serviceaccount:custody-system:custody-controller",
            "--serviceaccount custody-system:custody-controller",
        ),
        (
            "system:serviceaccount:ns:",
            "--user system:serviceaccount:ns:",
        ),
        ("system:serviceaccount:", "--user system:serviceaccount:"),
        ("kubernetes-admin", "--user kubernetes-admin"),
    ] {
        assert_eq!(subject_flag(user), flag, "{user}");
    }
}

/// A plan's drill needs of its writer what the drill does in the drill's namespace, and of
/// that namespace's admin custody's right to create StatefulSets there (ClusterRole
/// custody-drills); without it the plan is refused naming the rolebinding in that namespace.
#[test]
fn a_drill_needs_its_writers_rights_and_the_drill_namespaces_consent() {
    let plan = |drill: serde_json::Value| -> BackupPlanSpec {
        serde_json::from_value(
            json!({"clusterRef": {"name": "db"}, "schedule": "0 3 * * *",
                                      "drill": drill}),
        )
        .unwrap()
    };
    let here = plan(json!({"schedule": "0 4 * * 0",
        "check": {"command": ["pg_amcheck"], "credentialsSecretRef": {"name": "pg"}}}));
    let there = plan(json!({"schedule": "0 4 * * 0", "namespace": "drills",
        "repositoryRef": {"name": "store"}, "check": {"image": "checker", "command": ["check"]}}));
    let object = |spec| Object::BackupPlan {
        spec,
        cluster_repository: ClusterRepository::Named("main"),
    };
    assert_eq!(
        permissions(&required(object(&here))),
        ["create statefulsets.apps", "create pods", "get secrets pg",]
    );
    assert_eq!(
        permissions(&required(object(&there))),
        [
            "create statefulsets.apps in namespace drills",
            "create pods in namespace drills",
            "get statefulsets.apps",
            "get secrets",
            "create clusters.custody.io in namespace drills",
            "get backuprepositories.custody.io store in namespace drills",
        ]
    );
    assert_eq!(
        permissions(&opted_in(object(&there))),
        [
            "create statefulsets.apps in namespace drills",
            "delete statefulsets.apps in namespace drills",
        ]
    );
    let custody = "system:serviceaccount:custody-system:custody-controller";
    let needed = opted_in(object(&there));
    assert_eq!(
        opt_in_verdict(custody, "shop", &needed, &[true, true]),
        None
    );
    let refused = opt_in_verdict(custody, "shop", &needed, &[true, false]).expect("refused");
    assert!(
        refused.starts_with("namespace drills has not let custody run restore drills")
            && refused.ends_with(
                "kubectl create rolebinding custody-drills --namespace drills --clusterrole custody-drills --serviceaccount custody-system:custody-controller"
            ),
        "{refused}"
    );
    // Hooks beside a drill that is allowed: still the hooks' rolebinding.
    let hooked: BackupPlanSpec = serde_json::from_value(json!({"clusterRef": {"name": "db"},
        "schedule": "0 3 * * *", "consistency": method(HOOKS),
        "drill": {"schedule": "0 4 * * 0", "check": {"command": ["c"]}}}))
    .unwrap();
    let needed = opted_in(object(&hooked));
    assert_eq!(needed.len(), 3);
    let refused = opt_in_verdict(custody, "shop", &needed, &[false, true, true]).unwrap();
    assert!(
        refused.contains("custody-hooks --namespace shop"),
        "{refused}"
    );
}
