//! Checks of the kit's TLS support: generated certificates and TLS servers.
//!
//! The TLS port is checked with `openssl s_client`, a client independent of
//! the code under test.

use std::error::Error;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use lock_testkit::{RedisServer, TestCertificates};

type TestResult = Result<(), Box<dyn Error>>;

/// Bound on one `openssl s_client` handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs a TLS handshake with `127.0.0.1:port` that verifies the server's
/// certificate against the CA in `ca_file` (and presents a client
/// certificate when given); its exit status, within [`HANDSHAKE_TIMEOUT`].
fn handshake(port: u16, ca_file: &Path, client: Option<(&Path, &Path)>) -> ExitStatus {
    let mut command = Command::new("openssl");
    command
        .args(["s_client", "-brief", "-verify_return_error", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-CAfile")
        .arg(ca_file);
    if let Some((cert, key)) = client {
        command.arg("-cert").arg(cert).arg("-key").arg(key);
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("could not run openssl s_client: {e}"));
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("wait: {e}")) {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("openssl s_client did not finish within {HANDSHAKE_TIMEOUT:?}");
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn certificates_are_pem_and_files() {
    let certs = TestCertificates::generate();
    for pem in [
        certs.ca_pem(),
        certs.other_ca_pem(),
        certs.server_cert_pem(),
        certs.client_cert_pem(),
    ] {
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
    }
    for key in [certs.server_key_pem(), certs.client_key_pem()] {
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    }
    assert_ne!(certs.ca_pem(), certs.other_ca_pem());
    for file in [
        "ca.crt",
        "other-ca.crt",
        "server.crt",
        "server.key",
        "client.crt",
        "client.key",
    ] {
        assert!(certs.dir().join(file).is_file(), "{file}");
    }
}

#[test]
fn tls_server_serves_the_generated_certificate() -> TestResult {
    let certs = TestCertificates::generate();
    let mut server = RedisServer::builder().tls(&certs).start();
    let tls_port = server.tls_port().ok_or("no TLS port")?;
    assert_ne!(tls_port, server.port());
    assert_eq!(server.tls_url(), format!("rediss://127.0.0.1:{tls_port}"));
    // The plain port still serves the kit.
    assert_eq!(server.cmd::<String>(&["PING"]), "PONG");

    let ca = certs.dir().join("ca.crt");
    assert!(handshake(tls_port, &ca, None).success());
    let other_ca = certs.dir().join("other-ca.crt");
    assert!(
        !handshake(tls_port, &other_ca, None).success(),
        "a client trusting an unrelated CA must refuse the server"
    );

    // A restart keeps both ports, and the server's copies of the
    // certificate files outlive `certs`.
    let ca_copy = server.dir().join("test-ca.crt");
    std::fs::write(&ca_copy, certs.ca_pem())?;
    drop(certs);
    server.restart();
    assert_eq!(server.tls_port(), Some(tls_port));
    assert!(handshake(tls_port, &ca_copy, None).success());
    Ok(())
}

#[test]
fn require_client_certificates_asks_for_one() -> TestResult {
    let certs = TestCertificates::generate();
    let server = RedisServer::builder()
        .tls(&certs)
        .require_client_certificates()
        .start();
    let tls_port = server.tls_port().ok_or("no TLS port")?;
    let ca = certs.dir().join("ca.crt");
    let client = (
        certs.dir().join("client.crt"),
        certs.dir().join("client.key"),
    );
    assert!(handshake(tls_port, &ca, Some((&client.0, &client.1))).success());
    Ok(())
}

#[test]
fn password_tls_servers_put_the_password_in_the_tls_url() {
    let certs = TestCertificates::generate();
    let server = RedisServer::builder().tls(&certs).password("p w").start();
    let tls_port = server.tls_port().unwrap_or_default();
    assert_eq!(
        server.tls_url(),
        format!("rediss://:p%20w@127.0.0.1:{tls_port}")
    );
}

#[test]
#[should_panic(expected = "started without ServerBuilder::tls")]
fn tls_url_of_a_plain_server_panics() {
    let server = RedisServer::start();
    let _ = server.tls_url();
}
