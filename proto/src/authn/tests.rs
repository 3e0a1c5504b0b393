use super::*;

fn review() -> Review {
    Review {
        authenticated: true,
        error: None,
        audiences: vec![names::GATE_AUDIENCE.to_string()],
        username: "system:serviceaccount:db:pg".to_string(),
        extra: BTreeMap::from([
            (names::EXTRA_POD_UID.to_string(), vec!["uid-a".to_string()]),
            (names::EXTRA_POD_NAME.to_string(), vec!["pg-0".to_string()]),
            (
                names::EXTRA_NODE_NAME.to_string(),
                vec!["node-1".to_string()],
            ),
        ]),
    }
}

fn pods(uid: &str) -> Option<KnownPod> {
    match uid {
        "uid-a" => Some(KnownPod {
            namespace: "db".into(),
            name: "pg-0".into(),
            node_name: "node-1".into(),
        }),
        "uid-elsewhere" => Some(KnownPod {
            namespace: "db".into(),
            name: "pg-1".into(),
            node_name: "node-2".into(),
        }),
        "uid-other-namespace" => Some(KnownPod {
            namespace: "web".into(),
            name: "pg-0".into(),
            node_name: "node-1".into(),
        }),
        _ => None,
    }
}

fn with_extra(key: &str, values: &[&str]) -> Review {
    let mut review = review();
    if values.is_empty() {
        review.extra.remove(key);
    } else {
        review.extra.insert(
            key.to_string(),
            values.iter().map(|value| value.to_string()).collect(),
        );
    }
    review
}

#[test]
fn gate_callers_are_pods_on_this_node_asking_about_themselves() {
    assert_eq!(
        gate_caller(&review(), "node-1", pods),
        Ok(GateCaller {
            pod_uid: "uid-a".into(),
            namespace: "db".into(),
            name: "pg-0".into(),
        })
    );
    // Older API servers put no node in the token; the agent's own view of its node decides.
    assert!(gate_caller(&with_extra(names::EXTRA_NODE_NAME, &[]), "node-1", pods).is_ok());

    let rows: Vec<(&str, Review, &str)> = vec![
        (
            "rejected by the API server",
            Review {
                authenticated: false,
                error: Some("token has expired".into()),
                ..review()
            },
            "Unauthenticated",
        ),
        (
            "another audience",
            Review {
                audiences: vec!["https://kubernetes.default.svc".into()],
                ..review()
            },
            "WrongAudience",
        ),
        (
            "a user, not a ServiceAccount",
            Review {
                username: "alice".into(),
                ..review()
            },
            "NotAServiceAccount",
        ),
        (
            "a ServiceAccount token bound to no pod",
            with_extra(names::EXTRA_POD_UID, &[]),
            "NotBoundToPod",
        ),
        (
            "no pod name",
            with_extra(names::EXTRA_POD_NAME, &[]),
            "NotBoundToPod",
        ),
        (
            "two pod UIDs",
            with_extra(names::EXTRA_POD_UID, &["uid-a", "uid-b"]),
            "NotBoundToPod",
        ),
        (
            "the token says another node",
            with_extra(names::EXTRA_NODE_NAME, &["node-2"]),
            "OtherNode",
        ),
        (
            "a pod this agent does not see",
            with_extra(names::EXTRA_POD_UID, &["uid-unknown"]),
            "PodNotOnThisNode",
        ),
        (
            "the agent's view puts the pod on another node",
            {
                let mut review = with_extra(names::EXTRA_POD_UID, &["uid-elsewhere"]);
                review.extra.remove(names::EXTRA_NODE_NAME);
                review
            },
            "OtherNode",
        ),
        (
            "the UID belongs to a pod of another name",
            with_extra(names::EXTRA_POD_NAME, &["pg-9"]),
            "PodMismatch",
        ),
        (
            "the UID belongs to a pod in another namespace",
            with_extra(names::EXTRA_POD_UID, &["uid-other-namespace"]),
            "PodMismatch",
        ),
    ];
    for (name, review, reason) in rows {
        let refusal = gate_caller(&review, "node-1", pods).expect_err(name);
        assert_eq!(refusal.reason(), reason, "{name}: {refusal}");
    }
}

fn agent_review() -> Review {
    Review {
        audiences: vec![names::REPORT_AUDIENCE.to_string()],
        username: "system:serviceaccount:custody-system:custody-agent".into(),
        ..review()
    }
}

#[test]
fn reports_come_from_the_agent_on_the_node_they_describe() {
    let account = "custody-system:custody-agent";
    assert_eq!(report_caller(&agent_review(), account, "node-1"), Ok(()));
    let rows: Vec<(&str, Review, &str, &str)> = vec![
        (
            "rejected by the API server",
            Review {
                authenticated: false,
                ..agent_review()
            },
            "node-1",
            "Unauthenticated",
        ),
        (
            "the gate's audience",
            Review {
                audiences: vec![names::GATE_AUDIENCE.into()],
                ..agent_review()
            },
            "node-1",
            "WrongAudience",
        ),
        (
            "a workload's ServiceAccount",
            Review {
                username: "system:serviceaccount:db:pg".into(),
                ..agent_review()
            },
            "node-1",
            "NotTheAgent",
        ),
        (
            "a namespace that merely starts like the agent's",
            Review {
                username: "system:serviceaccount:custody-system:custody-agent:x".into(),
                ..agent_review()
            },
            "node-1",
            "NotAServiceAccount",
        ),
        (
            "a report about another node",
            agent_review(),
            "node-2",
            "OtherNode",
        ),
        (
            "a token without a node",
            {
                let mut review = agent_review();
                review.extra.remove(names::EXTRA_NODE_NAME);
                review
            },
            "node-1",
            "NoNode",
        ),
    ];
    for (name, review, node, reason) in rows {
        let refusal = report_caller(&review, account, node).expect_err(name);
        assert_eq!(refusal.reason(), reason, "{name}: {refusal}");
    }
}

/// A token's shape is checked before a TokenReview: junk, another audience, an expired or an
/// unbound token never costs one; a token that may be right goes on to the review.
#[test]
fn only_a_token_that_may_be_right_is_reviewed() {
    use base64::Engine;
    let encode = |value: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
    };
    let jwt = |claims: serde_json::Value| {
        format!(
            "{}.{}.c2lnbmF0dXJl",
            encode(&serde_json::json!({"alg": "RS256"})),
            encode(&claims)
        )
    };
    let claims = |aud: serde_json::Value, exp: serde_json::Value, pod: serde_json::Value| serde_json::json!({"aud": aud, "exp": exp, "kubernetes.io": {"pod": pod}});
    let now = 1_800_000_000;
    let pod = serde_json::json!({"name": "db-0", "uid": "u-1"});
    let good = jwt(claims(
        serde_json::json!([names::GATE_AUDIENCE]),
        serde_json::json!(now + 600),
        pod.clone(),
    ));
    let rows: Vec<(&str, String, Option<&str>)> = vec![
        ("a pod-bound token for the gate", good.clone(), None),
        (
            "an audience given as one string",
            jwt(claims(
                serde_json::json!(names::GATE_AUDIENCE),
                serde_json::json!(now + 1),
                pod.clone(),
            )),
            None,
        ),
        ("junk", "junk-1".into(), Some("MalformedToken")),
        ("four parts", format!("{good}.x"), Some("MalformedToken")),
        (
            "no signature",
            good.rsplit_once('.').unwrap().0.to_string() + ".",
            Some("MalformedToken"),
        ),
        (
            "claims not base64",
            "a.!!!.c".into(),
            Some("MalformedToken"),
        ),
        (
            "claims not JSON",
            format!(
                "a.{}.c",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("nope")
            ),
            Some("MalformedToken"),
        ),
        (
            "too long",
            format!("{good}{}", "A".repeat(MAX_TOKEN_BYTES)),
            Some("MalformedToken"),
        ),
        (
            "another audience",
            jwt(claims(
                serde_json::json!(["https://kubernetes.default.svc"]),
                serde_json::json!(now + 600),
                pod.clone(),
            )),
            Some("WrongAudience"),
        ),
        (
            "expired, past the leeway",
            jwt(claims(
                serde_json::json!([names::GATE_AUDIENCE]),
                serde_json::json!(now - EXPIRY_LEEWAY_SECONDS),
                pod.clone(),
            )),
            Some("TokenExpired"),
        ),
        (
            "expired by this clock, within the leeway: the API server decides",
            jwt(claims(
                serde_json::json!([names::GATE_AUDIENCE]),
                serde_json::json!(now - EXPIRY_LEEWAY_SECONDS + 1),
                pod.clone(),
            )),
            None,
        ),
        (
            "no expiry",
            jwt(claims(
                serde_json::json!([names::GATE_AUDIENCE]),
                serde_json::Value::Null,
                pod.clone(),
            )),
            Some("MalformedToken"),
        ),
        (
            "bound to no pod",
            jwt(claims(
                serde_json::json!([names::GATE_AUDIENCE]),
                serde_json::json!(now + 600),
                serde_json::Value::Null,
            )),
            Some("NotBoundToPod"),
        ),
    ];
    assert_eq!(
        token_shape(&good, names::GATE_AUDIENCE, now),
        Ok(Claimed {
            pod_uid: "u-1".into(),
            node: None
        })
    );
    for (name, token, expected) in rows {
        let found = token_shape(&token, names::GATE_AUDIENCE, now).err();
        assert_eq!(
            found.as_ref().map(Refusal::reason),
            expected,
            "{name}: {found:?}"
        );
    }
    // Which refusals mean "not who it says".
    assert!(Refusal::Malformed("x".into()).unauthenticated());
    assert!(Refusal::Expired.unauthenticated());
    assert!(Refusal::WrongAudience("a".into()).unauthenticated());
    assert!(Refusal::Unauthenticated("a".into()).unauthenticated());
    assert!(!Refusal::NotBoundToPod.unauthenticated());
    assert!(!Refusal::NoNode.unauthenticated());
}
