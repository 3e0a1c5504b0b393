use super::*;
use crate::s3::Credentials;

const ANSWER: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <AssumedRoleUser><Arn/><AssumeRoleId/></AssumedRoleUser>
    <Credentials>
      <AccessKeyId>Y4RJU1RNFGK48LGO9I2S</AccessKeyId>
      <SecretAccessKey>sYLRKS1Z7hSjluf6gEbb9066hnx315wHTiACPAjg</SecretAccessKey>
      <Expiration>2026-12-05T20:26:12Z</Expiration>
      <SessionToken>eyJhbGciOiJIUzUxMiJ9.e30.c2ln&amp;x</SessionToken>
    </Credentials>
    <SubjectFromWebIdentityToken>system:serviceaccount:a:b</SubjectFromWebIdentityToken>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"#;

#[test]
fn the_sts_answer_gives_the_credentials_and_their_end() {
    let temporary = read_answer("http://sts", 200, ANSWER).expect("credentials");
    assert_eq!(temporary.access_key_id, "Y4RJU1RNFGK48LGO9I2S");
    assert_eq!(
        temporary.secret_access_key,
        "sYLRKS1Z7hSjluf6gEbb9066hnx315wHTiACPAjg"
    );
    // Entities are decoded.
    assert_eq!(temporary.session_token, "eyJhbGciOiJIUzUxMiJ9.e30.c2ln&x");
    assert_eq!(
        temporary
            .expires
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
        1_796_502_372
    );
}

#[test]
fn what_the_sts_answers_instead_of_credentials_is_said() {
    let refused = r#"<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code><Message>Incorrect token audience</Message></Error><RequestId>1</RequestId></ErrorResponse>"#;
    let cases: &[(u16, &str, &str)] = &[
        (
            400,
            refused,
            "the STS at http://sts refused the token: HTTP 400 InvalidIdentityToken: Incorrect token audience",
        ),
        (
            403,
            "<Error><Code>AccessDenied</Code></Error>",
            "the STS at http://sts refused the token: HTTP 403 AccessDenied",
        ),
        (
            503,
            "<html><body>busy</body></html>",
            "the STS at http://sts did not answer: HTTP 503",
        ),
        (
            429,
            "<Error><Code>Throttling</Code></Error>",
            "the STS at http://sts did not answer: HTTP 429 Throttling",
        ),
        (
            499,
            "<Error><Code>Odd</Code></Error>",
            "the STS at http://sts refused the token: HTTP 499 Odd",
        ),
        (
            500,
            "<Error><Code>InternalError</Code></Error>",
            "the STS at http://sts did not answer: HTTP 500 InternalError",
        ),
        (
            200,
            "not xml at all",
            "the STS at http://sts answered no credentials: HTTP 200: not XML",
        ),
        (
            200,
            &ANSWER
                .replace("<SessionToken>", "<Other>")
                .replace("</SessionToken>", "</Other>"),
            "the STS at http://sts answered no credentials: no SessionToken",
        ),
        (
            200,
            &ANSWER.replace("2026-12-05T20:26:12Z", "tomorrow"),
            "the STS at http://sts answered no credentials: Expiration \"tomorrow\" is not a time",
        ),
        (
            200,
            &ANSWER.replace("Y4RJU1RNFGK48LGO9I2S", " "),
            "the STS at http://sts answered no credentials: no AccessKeyId",
        ),
    ];
    for (status, body, said) in cases {
        let error = read_answer("http://sts", *status, body).expect_err(body);
        let text = error.to_string();
        assert!(text.starts_with(said), "{status} {body}: {text}");
    }
}

#[test]
fn the_request_is_form_encoded() {
    assert_eq!(
        form(&[("a", "b c"), ("Token", "x.y-z_~+/=&")]),
        "a=b%20c&Token=x.y-z_~%2B%2F%3D%26"
    );
    let identity = WebIdentity {
        role_arn: "arn:minio:iam:::role/abc".into(),
        sts_endpoint: "http://sts".into(),
        session_name: "custody-mover".into(),
        token: TokenSource::File("/t".into()),
    };
    assert_eq!(
        request_body(&identity, "t.o.k"),
        "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=arn%3Aminio%3Aiam%3A%3A%3Arole%2Fabc&RoleSessionName=custody-mover&WebIdentityToken=t.o.k&DurationSeconds=3600"
    );
}

#[test]
fn a_session_name_is_one_the_sts_accepts() {
    for (who, name) in [
        ("custody-mover", "custody-mover"),
        ("custody-ns/repo name", "custody-ns-repo-name"),
        ("", "--"),
        ("a", "a-"),
        ("user@x=1,2.3+4_5", "user@x=1,2.3+4_5"),
    ] {
        assert_eq!(session_name(who), name, "{who}");
    }
    assert_eq!(session_name(&"x".repeat(100)).len(), 64);
}

#[test]
fn the_default_sts_is_the_regions() {
    assert_eq!(default_sts_endpoint(""), "https://sts.amazonaws.com");
    assert_eq!(
        default_sts_endpoint("eu-west-1"),
        "https://sts.eu-west-1.amazonaws.com"
    );
}

/// The mover's chain: keys first, then a web identity; half of either is an error naming
/// what is missing.
#[test]
fn a_mover_signs_with_what_its_environment_gives() {
    use custody_proto::mover::env;
    enum Want {
        Keys,
        Identity {
            sts: &'static str,
            session: &'static str,
        },
        Error(&'static str),
    }
    let keys = [(env::ACCESS_KEY_ID, "AK"), (env::SECRET_ACCESS_KEY, "SK")];
    let identity = [
        (env::ROLE_ARN, "arn:r"),
        (env::WEB_IDENTITY_TOKEN_FILE, "/t/token"),
    ];
    let cases: Vec<(Vec<(&str, &str)>, Want)> = vec![
        (keys.to_vec(), Want::Keys),
        ([keys.as_slice(), identity.as_slice()].concat(), Want::Keys),
        (
            identity.to_vec(),
            Want::Identity {
                sts: "https://sts.eu-west-1.amazonaws.com",
                session: "custody-mover",
            },
        ),
        (
            [
                identity.as_slice(),
                &[
                    (env::STS_ENDPOINT, "http://minio:9000"),
                    (env::ROLE_SESSION_NAME, "a b"),
                ],
            ]
            .concat(),
            Want::Identity {
                sts: "http://minio:9000",
                session: "a-b",
            },
        ),
        (
            vec![(env::ACCESS_KEY_ID, "AK")],
            Want::Error("$AWS_SECRET_ACCESS_KEY is not set"),
        ),
        (
            vec![(env::SECRET_ACCESS_KEY, "SK"), (env::ACCESS_KEY_ID, " ")],
            Want::Error("$AWS_ACCESS_KEY_ID is not set"),
        ),
        (
            vec![(env::ROLE_ARN, "arn:r")],
            Want::Error("$AWS_ROLE_ARN is set but $AWS_WEB_IDENTITY_TOKEN_FILE is not"),
        ),
        (
            vec![(env::WEB_IDENTITY_TOKEN_FILE, "/t")],
            Want::Error("$AWS_WEB_IDENTITY_TOKEN_FILE is set but $AWS_ROLE_ARN is not"),
        ),
        (vec![], Want::Error("no S3 credentials")),
    ];
    for (variables, want) in cases {
        let lookup = |name: &str| {
            variables
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        };
        let chosen = from_env(lookup, "eu-west-1");
        match (want, chosen) {
            (Want::Keys, Ok(Credentials::Keys(secret))) => {
                assert_eq!(
                    (
                        secret.access_key_id.as_str(),
                        secret.secret_access_key.as_str()
                    ),
                    ("AK", "SK")
                );
            }
            (Want::Identity { sts, session }, Ok(Credentials::WebIdentity(identity))) => {
                assert_eq!(identity.role_arn, "arn:r");
                assert_eq!(identity.sts_endpoint, sts);
                assert_eq!(identity.session_name, session);
                assert!(
                    matches!(&identity.token, TokenSource::File(path) if path.to_str() == Some("/t/token"))
                );
            }
            (Want::Error(said), Err(error)) => {
                assert!(error.starts_with(said), "{variables:?}: {error}");
            }
            (_, chosen) => panic!("{variables:?}: {chosen:?}"),
        }
    }
}

#[tokio::test]
async fn a_token_file_is_read_at_every_exchange() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("token");
    let identity = WebIdentity {
        role_arn: "arn:r".into(),
        sts_endpoint: "http://sts".into(),
        session_name: "s".into(),
        token: TokenSource::File(path.clone()),
    };
    let missing = identity.token().await.expect_err("no file yet");
    assert!(
        missing
            .to_string()
            .contains("reading the web identity token")
    );
    std::fs::write(&path, "first\n").unwrap();
    assert_eq!(identity.token().await.unwrap(), "first");
    std::fs::write(&path, "second").unwrap();
    assert_eq!(identity.token().await.unwrap(), "second");
}

#[test]
fn an_answer_nested_deeper_than_credentials_ever_are_is_refused() {
    let nested = |wrappers: usize| {
        format!(
            "<R>{}<Code>Deep</Code>{}</R>",
            "<a>".repeat(wrappers),
            "</a>".repeat(wrappers)
        )
    };
    let deep_enough = read_answer("http://sts", 400, &nested(8)).expect_err("refused");
    assert!(
        deep_enough.to_string().contains("HTTP 400 Deep"),
        "{deep_enough}"
    );
    let too_deep = read_answer("http://sts", 400, &nested(9)).expect_err("refused");
    assert!(
        too_deep.to_string().contains("nested too deep"),
        "{too_deep}"
    );
}

/// What a TokenRequest's answer gives: its token, a refusal that names the ServiceAccount and
/// the binding to make, or the API server's error.
#[test]
fn a_token_requests_answer_is_the_token_or_why_not() {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
    let answer = |token: Option<&str>| TokenRequest {
        status: token.map(|token| TokenRequestStatus {
            token: token.to_string(),
            expiration_timestamp: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }),
        ..TokenRequest::default()
    };
    let refusal = |code: u16| {
        kube::Error::Api(
            kube::core::Status::failure("refused", "Forbidden")
                .with_code(code)
                .boxed(),
        )
    };
    assert_eq!(
        answered_token("shop", "backups", Ok(answer(Some("t.o.k")))).unwrap(),
        "t.o.k"
    );
    for (answered, said) in [
        (
            Ok(answer(Some(""))),
            "the API server gave no token of ServiceAccount shop/backups",
        ),
        (
            Ok(answer(None)),
            "the API server gave no token of ServiceAccount shop/backups",
        ),
        (
            Err(refusal(403)),
            "custody may not ask for tokens of ServiceAccount shop/backups: the namespace's admin lets it with kubectl create rolebinding custody-web-identity --namespace shop --clusterrole custody-web-identity",
        ),
        (
            Err(refusal(404)),
            "ServiceAccount shop/backups does not exist",
        ),
        (
            Err(refusal(500)),
            "asking for a token of ServiceAccount shop/backups:",
        ),
    ] {
        let error = answered_token("shop", "backups", answered).expect_err(said);
        assert!(error.to_string().starts_with(said), "{error}");
    }
    let request = token_request("minio");
    assert_eq!(request.spec.audiences, ["minio"]);
    assert_eq!(request.spec.expiration_seconds, Some(TOKEN_SECONDS));
}

#[test]
fn what_is_printed_of_credentials_keeps_their_secrets() {
    let temporary = read_answer("http://sts", 200, ANSWER).unwrap();
    let printed = format!("{temporary:?}");
    assert!(printed.contains("Y4RJU1RNFGK48LGO9I2S"), "{printed}");
    assert!(
        !printed.contains("sYLRKS1Z") && !printed.contains("eyJhbGci"),
        "{printed}"
    );
    assert_eq!(
        format!("{:?}", TokenSource::File("/t/token".into())),
        "the token in /t/token"
    );
}

/// The whole exchange against an STS on a socket: the token file read, the form posted, the
/// answer read; an STS that never answers fails within the endpoint's bounds.
#[tokio::test]
async fn a_token_is_exchanged_at_the_sts_and_a_silent_sts_fails_in_time() {
    use std::io::{Read, Write};
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("token");
    std::fs::write(&path, "t.o.k\n").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let received = std::thread::spawn(move || {
        let (mut connection, _) = listener.accept().unwrap();
        connection
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        while !String::from_utf8_lossy(&request).contains("DurationSeconds=3600") {
            let read = connection.read(&mut buffer).unwrap();
            assert!(read > 0, "{}", String::from_utf8_lossy(&request));
            request.extend_from_slice(&buffer[..read]);
        }
        // An answer of exactly the longest read, 64 KiB (whitespace between elements).
        let at = ANSWER.find("<AssumeRoleWithWebIdentityResult>").unwrap();
        let padded = format!(
            "{}{}{}",
            &ANSWER[..at],
            " ".repeat(65_536 - ANSWER.len()),
            &ANSWER[at..]
        );
        write!(
            connection,
            "HTTP/1.1 200 OK\r\ncontent-type: text/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{padded}",
            padded.len()
        )
        .unwrap();
        String::from_utf8_lossy(&request).into_owned()
    });
    let identity = WebIdentity {
        role_arn: "arn:r".into(),
        sts_endpoint: format!("http://{address}/"),
        session_name: "custody-mover".into(),
        token: TokenSource::File(path),
    };
    let endpoint = crate::s3::Endpoint::default();
    let temporary = identity.assume(&endpoint).await.expect("credentials");
    assert_eq!(temporary.access_key_id, "Y4RJU1RNFGK48LGO9I2S");
    let request = received.join().unwrap();
    assert!(request.starts_with("POST / HTTP/1.1"), "{request}");
    assert!(
        request.contains("application/x-www-form-urlencoded")
            && request.contains("WebIdentityToken=t.o.k&"),
        "{request}"
    );

    // Accepts, never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let identity = WebIdentity {
        sts_endpoint: format!("http://{}/", silent.local_addr().unwrap()),
        ..identity
    };
    let endpoint = crate::s3::Endpoint {
        limits: crate::s3::Limits {
            connect: std::time::Duration::from_secs(1),
            stall: std::time::Duration::from_secs(1),
            ..crate::s3::Limits::default()
        },
        ..crate::s3::Endpoint::default()
    };
    let started = std::time::Instant::now();
    let error = identity.assume(&endpoint).await.expect_err("no answer");
    assert!(
        error
            .to_string()
            .contains("did not answer: no answer within 2s"),
        "{error}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    drop(silent);
}

/// An STS answer longer than any credentials is not read whole (the endpoint is the
/// repository writer's to choose; the controller serves every tenant).
#[tokio::test]
async fn an_endless_answer_is_cut_short() {
    use std::io::{Read, Write};
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("token");
    std::fs::write(&path, "t.o.k").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut connection, _) = listener.accept().unwrap();
        let mut buffer = [0u8; 4096];
        let _ = connection.read(&mut buffer);
        let _ = connection.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/xml\r\n\r\n");
        let chunk = vec![b'x'; 16 * 1024];
        // Until the client hangs up.
        while connection.write_all(&chunk).is_ok() {}
    });
    let identity = WebIdentity {
        role_arn: "arn:r".into(),
        sts_endpoint: format!("http://{address}/"),
        session_name: "s".into(),
        token: TokenSource::File(path),
    };
    let error = identity
        .assume(&crate::s3::Endpoint::default())
        .await
        .expect_err("cut short");
    assert!(
        error.to_string().contains(&format!(
            "its answer is longer than {MAX_ANSWER_BYTES} bytes"
        )),
        "{error}"
    );
}
