use super::*;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::ServerCertVerifier;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};

const DAY: i64 = 86_400;

#[test]
fn ca_steps() {
    let life = 3650 * DAY;
    let state = |not_after: Option<i64>, next: Option<i64>, rotate: bool| State {
        signing_not_after: not_after,
        next_promote_at: next,
        rotate_requested: rotate,
        promoted_at: None,
    };
    let leaf = 7 * DAY;
    let after_rotation = |promoted: i64, rotate: bool| State {
        promoted_at: Some(promoted),
        ..state(Some(life), None, rotate)
    };
    let rows: &[(&str, Option<State>, i64, Step)] = &[
        ("nothing stored", None, 0, Step::Create),
        ("unusable", Some(state(None, None, false)), 0, Step::Create),
        ("fresh", Some(state(Some(life), None, false)), 0, Step::Keep),
        (
            "just over a third left",
            Some(state(Some(life / 3 + 1), None, false)),
            0,
            Step::Keep,
        ),
        (
            "a third left",
            Some(state(Some(life / 3), None, false)),
            0,
            Step::AddNext,
        ),
        (
            "expired",
            Some(state(Some(-1), None, false)),
            0,
            Step::AddNext,
        ),
        (
            "rotation asked for",
            Some(state(Some(life), None, true)),
            0,
            Step::AddNext,
        ),
        (
            "next not trusted long enough",
            Some(state(Some(life), Some(120), false)),
            119,
            Step::Keep,
        ),
        (
            "next trusted long enough",
            Some(state(Some(life), Some(120), false)),
            120,
            Step::Promote,
        ),
        (
            "rotation asked for while a next is pending",
            Some(state(Some(life), Some(120), true)),
            1,
            Step::Keep,
        ),
        (
            "rotation asked for while the last one's certificates may live",
            Some(after_rotation(0, true)),
            leaf - 1,
            Step::Keep,
        ),
        (
            "rotation asked for once they cannot",
            Some(after_rotation(0, true)),
            leaf,
            Step::AddNext,
        ),
        (
            "nothing asked after a rotation",
            Some(after_rotation(0, false)),
            leaf,
            Step::Keep,
        ),
    ];
    for (name, stored, now, expected) in rows {
        assert_eq!(step(*stored, *now, life, leaf), *expected, "{name}");
    }
}

/// Whether `leaf` (PEM) verifies for `name` against the CAs in `bundle` (PEM) at `now`.
fn verifies(bundle: &str, leaf: &str, name: &str, now: i64) -> bool {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        std::sync::Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let leaf = CertificateDer::from_pem_slice(leaf.as_bytes()).unwrap();
    verifier
        .verify_server_cert(
            &leaf,
            &[],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::since_unix_epoch(std::time::Duration::from_secs(now as u64)),
        )
        .is_ok()
}

fn apply(current: Option<&Secret>, step: Step, now: i64, life: i64) -> (Secret, Authority) {
    let mut secret = next_secret(current, "custody-ca", step, now, life, 120).unwrap();
    secret.metadata.resource_version = None;
    let authority = authority_of(&secret, now).unwrap();
    (secret, authority)
}

/// Through a whole rotation every certificate in use verifies against the bundle in force,
/// and one signed by the next CA only once every holder has had it in its bundle.
#[test]
fn a_rotation_never_leaves_a_certificate_in_use_untrusted() {
    let life = 100 * DAY;
    let name = gate_name("node-1");
    let now = 1_800_000_000;
    let (created, first) = apply(None, Step::Create, now, life);
    assert_eq!(state_of(&created).signing_not_after, Some(now + life));
    let (old_leaf, _) = issue_own(&first, std::slice::from_ref(&name), now, DAY).unwrap();
    assert!(verifies(&first.bundle, &old_leaf.cert, &name, now + 1));
    assert!(
        !verifies(&first.bundle, &old_leaf.cert, &gate_name("node-2"), now + 1),
        "another node's name"
    );

    // The next CA is trusted but does not sign yet.
    let (added, second) = apply(Some(&created), Step::AddNext, now + 10, life);
    assert_eq!(second.cert, first.cert, "still the same signing CA");
    assert_eq!(second.reissue_after, first.reissue_after);
    assert!(verifies(&second.bundle, &old_leaf.cert, &name, now + 11));
    assert_eq!(state_of(&added).next_promote_at, Some(now + 130));

    // Promoted: the new CA signs, the old one stays trusted, holders are told to renew.
    let (promoted, third) = apply(Some(&added), Step::Promote, now + 200, life);
    assert_ne!(third.cert, first.cert);
    assert_eq!(third.reissue_after, now + 200);
    let (new_leaf, _) = issue_own(&third, std::slice::from_ref(&name), now + 200, DAY).unwrap();
    assert!(
        verifies(&second.bundle, &new_leaf.cert, &name, now + 201),
        "the bundle published before promotion trusts it"
    );
    assert!(
        verifies(&third.bundle, &old_leaf.cert, &name, now + 201),
        "the old certificate is still trusted"
    );
    assert!(
        !verifies(&first.bundle, &new_leaf.cert, &name, now + 201),
        "a bundle from before the rotation does not"
    );
    let state = state_of(&promoted);
    assert_eq!(state.next_promote_at, None);
    assert_eq!(state.signing_not_after, Some(now + 10 + life));

    // Once the old CA has expired it leaves the bundle.
    let (_, later) = apply(Some(&promoted), Step::Keep, now + life + 1, life);
    assert_eq!(
        CertificateDer::pem_slice_iter(later.bundle.as_bytes()).count(),
        1
    );
    assert_eq!(
        CertificateDer::pem_slice_iter(third.bundle.as_bytes()).count(),
        2
    );
}

#[test]
fn a_public_key_that_is_not_a_p256_point_is_refused() {
    let (_, authority) = apply(None, Step::Create, 1_800_000_000, 100 * DAY);
    let names = vec![gate_name("n")];
    for key in [vec![], vec![4u8; 64], vec![3u8; 65]] {
        assert!(
            sign(&authority, &names, &key, 1_800_000_000, DAY).is_err(),
            "{} bytes",
            key.len()
        );
    }
    let key = KeyPair::generate().unwrap();
    let issued = sign(&authority, &names, key.public_key_raw(), 1_800_000_000, DAY).unwrap();
    assert_eq!(issued.not_after, 1_800_000_000 + DAY);
    assert!(verifies(
        &authority.bundle,
        &issued.cert,
        &names[0],
        1_800_000_001
    ));
}

#[test]
fn leaf_renewals() {
    let life = 7 * DAY;
    type Row<'a> = (
        &'a str,
        Option<(i64, i64, &'a str)>,
        &'a str,
        i64,
        i64,
        bool,
    );
    let rows: &[Row] = &[
        ("none held", None, "ca-1", 0, 0, true),
        ("fresh", Some((0, life, "ca-1")), "ca-1", 0, 1, false),
        (
            "a third left",
            Some((0, life, "ca-1")),
            "ca-1",
            0,
            life - life / 3,
            true,
        ),
        (
            "just over a third",
            Some((0, life, "ca-1")),
            "ca-1",
            0,
            life - life / 3 - 1,
            false,
        ),
        (
            "another CA signs now",
            Some((0, life, "ca-1")),
            "ca-2",
            0,
            1,
            true,
        ),
        (
            "issued before reissue-after",
            Some((0, life, "ca-1")),
            "ca-1",
            1,
            2,
            true,
        ),
        (
            "issued at reissue-after",
            Some((1, life, "ca-1")),
            "ca-1",
            1,
            2,
            false,
        ),
    ];
    for (name, held, signing, reissue_after, now, expected) in rows {
        assert_eq!(
            renew_leaf(*held, signing, *reissue_after, *now, life),
            *expected,
            "{name}"
        );
    }
}

/// `custody.io/rotate-ca` asks for a new CA; its value, when a number, is the wait before it
/// signs.
#[test]
fn a_rotation_asked_for_waits_as_long_as_it_says() {
    let now = 1_800_000_000;
    let (mut created, _) = apply(None, Step::Create, now, 100 * DAY);
    let annotations = created.metadata.annotations.get_or_insert_default();
    annotations.insert(ANNOTATION_ROTATE.into(), "30".into());
    let state = state_of(&created);
    assert!(state.rotate_requested);
    assert_eq!(step(Some(state), now + 1, 100 * DAY, DAY), Step::AddNext);
    let (added, _) = apply(Some(&created), Step::AddNext, now + 1, 100 * DAY);
    let state = state_of(&added);
    assert!(!state.rotate_requested, "the request is taken off");
    assert_eq!(state.next_promote_at, Some(now + 31));
    assert_eq!(step(Some(state), now + 30, 100 * DAY, DAY), Step::Keep);
    assert_eq!(step(Some(state), now + 31, 100 * DAY, DAY), Step::Promote);
}

#[test]
fn a_reissue_time_far_ahead_is_ignored_and_a_key_that_does_not_parse_is_unusable() {
    let now = 1_800_000_000;
    let (mut secret, authority) = apply(None, Step::Create, now, 100 * DAY);
    assert_eq!(authority.reissue_after, now);
    fn reissue_after(secret: &mut Secret, value: i64) {
        secret
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(ANNOTATION_REISSUE_AFTER.into(), value.to_string());
    }
    reissue_after(&mut secret, now * 1000);
    assert_eq!(authority_of(&secret, now).unwrap().reissue_after, 0);
    reissue_after(&mut secret, now + 30);
    assert_eq!(
        authority_of(&secret, now).unwrap().reissue_after,
        now + 30,
        "a replica's clock ahead"
    );
    assert!(state_of(&secret).signing_not_after.is_some());
    secret.data.as_mut().unwrap().insert(
        CA_KEY.into(),
        ByteString(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".to_vec()),
    );
    assert_eq!(state_of(&secret).signing_not_after, None);
    assert_eq!(
        step(Some(state_of(&secret)), now, 100 * DAY, DAY),
        Step::Create
    );
    assert!(
        !format!("{authority:?}").contains("PRIVATE KEY"),
        "the key stays out of logs"
    );
}
