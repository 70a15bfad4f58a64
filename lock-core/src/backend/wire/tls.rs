//! TLS on lock-core's own connection.
//!
//! The connection works in non-blocking steps on its socket: whoever sends
//! writes what the socket takes, whoever holds the read turn reads what it
//! holds (see the parent module). rustls is a state machine without I/O of
//! its own, so TLS fits those same steps: a write hands the plaintext to the
//! session and writes the records it made; a read reads records and takes
//! the plaintext out. The session sits behind a mutex held only for such a
//! step, and the socket's readiness still says when to try again, so the read
//! turn, its takeover and the release written from a drop work as over plain
//! TCP.
//!
//! Only the handshake, before the connection is shared, goes through
//! tokio-rustls; the session is then taken out of its stream.

use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use rustls::ClientConnection;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::ReadBuf;

/// At most this much plaintext is taken out in one read step; the socket
/// stays readable for the next one.
const READ_AT_MOST: usize = 256 * 1024;

/// What a `rediss://` connection of lock-core's own trusts and presents:
/// built once, when the client is, so a bad certificate is a configuration
/// error then.
#[derive(Clone)]
pub(crate) struct TlsConfig(Arc<rustls::ClientConfig>);

impl TlsConfig {
    /// Trusts the root certificates of `certificates` when it has some, the
    /// system's trust store otherwise, and presents its client certificate
    /// when it has one. rustls' process-wide crypto provider must be
    /// installed first. The error says what is wrong with the
    /// certificates.
    pub(crate) fn new(certificates: Option<&redis::TlsCertificates>) -> Result<TlsConfig, String> {
        let roots = match certificates.and_then(|c| c.root_cert.as_deref()) {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in pem_certificates(pem, "tls_root_certificate")? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("a root certificate cannot be trusted: {e}"))?;
                }
                Arc::new(roots)
            }
            None => system_roots()?,
        };
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let config = match certificates.and_then(|c| c.client_tls.as_ref()) {
            Some(client) => {
                let chain = pem_certificates(&client.client_cert, "tls_client_certificate")?;
                let key = PrivateKeyDer::from_pem_slice(&client.client_key)
                    .map_err(|e| format!("the client key is not PEM: {e}"))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("the client certificate cannot be used: {e}"))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(TlsConfig(Arc::new(config)))
    }
}

/// The certificates of `pem`, given to the builder's `option`: at least
/// one. Bytes without any (a file mixed up with another, DER instead of
/// PEM) are refused here: with an empty trust store every handshake would
/// fail, far from the mistake.
fn pem_certificates(pem: &[u8], option: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{option} is not PEM: {e}"))?;
    if certificates.is_empty() {
        return Err(format!(
            "{option} was given no PEM certificate \
             (expected -----BEGIN CERTIFICATE----- blocks)"
        ));
    }
    Ok(certificates)
}

/// The system's trust store, read once per process: every `rediss://`
/// server without a root certificate of its own shares it.
fn system_roots() -> Result<Arc<rustls::RootCertStore>, String> {
    static ROOTS: OnceLock<Result<Arc<rustls::RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty()
                && let Some(err) = found.errors.first()
            {
                return Err(format!("the system's trust store cannot be read: {err}"));
            }
            // A certificate the store holds but rustls cannot use is left
            // out, as the `redis` crate's connection does.
            let mut roots = rustls::RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            Ok(Arc::new(roots))
        })
        .clone()
}

/// The TLS session of one connection.
pub(super) struct Session(Mutex<ClientConnection>);

impl Session {
    /// Runs the handshake with `host` over `tcp`; the socket and the session
    /// to drive over it. Not bounded here: the caller bounds connecting as a
    /// whole.
    pub(super) async fn handshake(
        tcp: TcpStream,
        host: &str,
        config: &TlsConfig,
    ) -> io::Result<(TcpStream, Session)> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let stream = tokio_rustls::TlsConnector::from(config.0.clone())
            .connect(name, tcp)
            .await?;
        let (tcp, mut conn) = stream.into_inner();
        // Everything sent is taken at once: the connection keeps its own
        // count of what is written, and bounds nothing by this buffer.
        conn.set_buffer_limit(None);
        Ok((tcp, Session(Mutex::new(conn))))
    }

    fn conn(&self) -> MutexGuard<'_, ClientConnection> {
        // Nothing panics while holding it; should something have, the
        // session reports its own state on the next step.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Encrypts `plain` and writes what the socket takes of the session's
    /// records; whether some are left (the socket's buffer is full).
    pub(super) fn write(&self, tcp: &TcpStream, plain: &[u8]) -> io::Result<bool> {
        let mut conn = self.conn();
        if !plain.is_empty() {
            conn.writer().write_all(plain)?;
        }
        let socket = socket2::SockRef::from(tcp);
        while conn.wants_write() {
            // Inside `try_io`, so a full buffer clears the write readiness
            // and the next wait for it really waits.
            match tcp.try_io(Interest::WRITABLE, || conn.write_tls(&mut &*socket)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(conn.wants_write())
    }

    /// Reads the records the socket holds and appends their plaintext to
    /// `reader`: how many bytes. The server closing the connection is an
    /// error once all it sent before is taken.
    pub(super) fn read(
        &self,
        tcp: &TcpStream,
        reader: &mut ReadBuf,
        direct: bool,
    ) -> io::Result<usize> {
        let mut conn = self.conn();
        let mut socket = Socket {
            socket: socket2::SockRef::from(tcp),
            short: false,
        };
        let mut got = 0;
        let mut closed = false;
        // Reads until the socket is drained or enough is in. A read that
        // came back short took all the socket held: `WouldBlock` then
        // clears the read readiness (as of when the read began) without a
        // last read to find the socket empty, as over plain TCP.
        let outcome = super::read_io(tcp, direct, || {
            while got < READ_AT_MOST {
                if conn.read_tls(&mut socket)? == 0 {
                    closed = true;
                    return Ok(());
                }
                conn.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                got += take_plaintext(&mut conn, reader, &mut closed)?;
                if closed {
                    return Ok(());
                }
                if socket.short {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
            }
            Ok(())
        });
        match outcome {
            Ok(()) | Err(_) if got > 0 => Ok(got),
            Ok(()) if closed => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )),
            Ok(()) => Ok(0),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }
}

/// The socket as rustls reads it, telling whether the last read came back
/// short.
struct Socket<'a> {
    socket: socket2::SockRef<'a>,
    short: bool,
}

impl Read for Socket<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let got = (&*self.socket).read(buf)?;
        self.short = got > 0 && got < buf.len();
        Ok(got)
    }
}

/// Moves the plaintext the session holds into `reader`: how many bytes.
/// Sets `closed` when the server ended the session.
fn take_plaintext(
    conn: &mut ClientConnection,
    reader: &mut ReadBuf,
    closed: &mut bool,
) -> io::Result<usize> {
    let mut got = 0;
    loop {
        // Always leaves room, so a read of 0 bytes means the end.
        reader.compact();
        match conn.reader().read(&mut reader.buf[reader.end..]) {
            Ok(0) => {
                *closed = true;
                return Ok(got);
            }
            Ok(n) => {
                reader.end += n;
                got += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(got),
            Err(e) => return Err(e),
        }
    }
}
