//! Certificates for TLS tests, made with the `openssl` command-line tool.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::TestkitError;

/// The environment variable that names the `openssl` binary to use.
pub const OPENSSL_BIN_ENV: &str = "OPENSSL_BIN";

/// Bound on each `openssl` run (key generation and signing take
/// milliseconds).
const OPENSSL_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between checks on a running `openssl`.
const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// Validity of every certificate made, from now.
const VALID_DAYS: &str = "30";

/// The `openssl` configuration used for every request and signature, so the
/// system's own configuration (default extensions, prompts) plays no part.
const OPENSSL_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = lock-testkit

[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// A private certificate authority and the certificates it issued, for a
/// TLS [`RedisServer`](crate::RedisServer) and its clients.
///
/// [`generate`](Self::generate) makes, with the `openssl` command (set
/// `OPENSSL_BIN` or put it on `PATH`; nothing is downloaded), P-256 keys
/// and:
///
/// - a CA ([`ca_pem`](Self::ca_pem)), the one a client must trust;
/// - a server certificate for `127.0.0.1` and `localhost`, issued by it
///   (handed to the server by [`ServerBuilder::tls`](crate::ServerBuilder::tls));
/// - a client certificate and key issued by it, for mutual TLS;
/// - a second, unrelated CA ([`other_ca_pem`](Self::other_ca_pem)) that
///   issued nothing here: trusting it instead is the "wrong CA" case.
///
/// All are valid for 30 days from now. The files live in a temporary
/// directory removed on drop; servers keep copies of their own.
#[derive(Debug)]
pub struct TestCertificates {
    dir: TempDir,
    ca: String,
    other_ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

impl TestCertificates {
    /// Makes a fresh set of certificates.
    ///
    /// # Panics
    ///
    /// Panics with `openssl`'s complaint if any step fails.
    pub fn generate() -> TestCertificates {
        Self::try_generate()
            .unwrap_or_else(|e| panic!("lock-testkit: could not make TLS certificates: {e}"))
    }

    /// [`generate`](Self::generate), returning failures instead of panicking.
    ///
    /// # Errors
    ///
    /// Fails when `openssl` is missing, fails, or takes longer than 20 s.
    pub fn try_generate() -> Result<TestCertificates, TestkitError> {
        let openssl = openssl_binary();
        let dir = tempfile::Builder::new()
            .prefix("lock-testkit-tls-")
            .tempdir()
            .map_err(|e| TestkitError::with_source("could not create a temporary directory", e))?;
        let path = dir.path();
        fs::write(path.join("openssl.cnf"), OPENSSL_CONFIG)
            .map_err(|e| TestkitError::with_source("could not write openssl.cnf", e))?;
        // Every argument is one word: the command lines are split on spaces.
        let run = |line: String| {
            let args: Vec<&str> = line.split_whitespace().collect();
            run_openssl(&openssl, path, &args)
        };
        let new_key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        for (name, subject) in [
            ("ca", "/CN=lock-testkit-CA"),
            ("other-ca", "/CN=unrelated-CA"),
        ] {
            run(format!(
                "req -config openssl.cnf -x509 {new_key} -keyout {name}.key -out {name}.crt \
                 -days {VALID_DAYS} -subj {subject} -extensions ca_ext"
            ))?;
        }
        for (name, subject, extensions, serial) in [
            ("server", "/CN=localhost", "server_ext", 1001),
            ("client", "/CN=lock-testkit-client", "client_ext", 1002),
        ] {
            run(format!(
                "req -config openssl.cnf -new {new_key} -keyout {name}.key -out {name}.csr \
                 -subj {subject}"
            ))?;
            run(format!(
                "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -set_serial {serial} \
                 -days {VALID_DAYS} -out {name}.crt -extfile openssl.cnf -extensions {extensions}"
            ))?;
        }

        let read = |name: &str| {
            fs::read_to_string(path.join(name))
                .map_err(|e| TestkitError::with_source(format!("could not read {name}"), e))
        };
        Ok(TestCertificates {
            ca: read("ca.crt")?,
            other_ca: read("other-ca.crt")?,
            server_cert: read("server.crt")?,
            server_key: read("server.key")?,
            client_cert: read("client.crt")?,
            client_key: read("client.key")?,
            dir,
        })
    }

    /// The CA that issued the server and client certificates (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// A CA that issued none of these certificates (PEM): a client trusting
    /// only it must refuse the server.
    pub fn other_ca_pem(&self) -> &str {
        &self.other_ca
    }

    /// The server's certificate (PEM), for `127.0.0.1` and `localhost`.
    pub fn server_cert_pem(&self) -> &str {
        &self.server_cert
    }

    /// The server's private key (PEM, PKCS#8).
    pub fn server_key_pem(&self) -> &str {
        &self.server_key
    }

    /// A client certificate issued by the CA (PEM), for mutual TLS.
    pub fn client_cert_pem(&self) -> &str {
        &self.client_cert
    }

    /// The client certificate's private key (PEM, PKCS#8).
    pub fn client_key_pem(&self) -> &str {
        &self.client_key
    }

    /// The directory holding the files (`ca.crt`, `server.crt`,
    /// `server.key`, `client.crt`, `client.key`, `other-ca.crt`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The `openssl` binary: `OPENSSL_BIN` when set, else `openssl` on `PATH`.
fn openssl_binary() -> PathBuf {
    std::env::var_os(OPENSSL_BIN_ENV)
        .filter(|value| !value.is_empty())
        .map_or_else(|| PathBuf::from("openssl"), PathBuf::from)
}

/// Runs `openssl args` in `dir`, bounded by [`OPENSSL_TIMEOUT`]; its stderr
/// goes into the error when it fails.
fn run_openssl(openssl: &Path, dir: &Path, args: &[&str]) -> Result<(), TestkitError> {
    let shown = format!("{} {}", openssl.display(), args.join(" "));
    let stderr_path = dir.join("openssl.stderr");
    let stderr = File::create(&stderr_path)
        .map_err(|e| TestkitError::with_source("could not create openssl.stderr", e))?;
    let mut child = Command::new(openssl)
        .args(args)
        .current_dir(dir)
        .env_remove("OPENSSL_CONF")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| {
            TestkitError::with_source(
                format!(
                    "could not run `{}` (install OpenSSL or set {OPENSSL_BIN_ENV})",
                    openssl.display()
                ),
                e,
            )
        })?;
    let deadline = Instant::now() + OPENSSL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TestkitError::new(format!(
                    "`{shown}` did not finish within {OPENSSL_TIMEOUT:?}"
                )));
            }
            Ok(None) => thread::sleep(POLL_INTERVAL),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TestkitError::with_source(
                    format!("could not wait for `{shown}`"),
                    e,
                ));
            }
        }
    };
    if status.success() {
        Ok(())
    } else {
        let complaint = fs::read_to_string(&stderr_path).unwrap_or_default();
        Err(TestkitError::new(format!(
            "`{shown}` failed ({status}): {}",
            complaint.trim()
        )))
    }
}
