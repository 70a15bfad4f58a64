//! The readiness check run while a `redis-server` starts.
//!
//! It speaks RESP over a plain [`std::net::TcpStream`] so it needs no runtime
//! and no client library, and it checks that the server answering is the
//! process just spawned (another test may have grabbed the port meanwhile).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Bound on connecting to the port being probed.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// Bound on each read or write of a probe.
const IO_TIMEOUT: Duration = Duration::from_millis(500);
/// Upper bound on the INFO reply read, far above what Redis sends.
const MAX_INFO_LEN: usize = 1 << 20;

/// What a probe of the port found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The expected server answers and has finished loading its data set.
    Ready,
    /// Nothing usable answers yet (not listening, or still loading).
    NotReady,
    /// A different process answers on the port; its pid is given.
    Foreign(u32),
}

/// Probes `127.0.0.1:port`, expecting the server with process id `pid`.
///
/// Sends `AUTH` (when a password is known), `PING` and `INFO server
/// persistence`. `+PONG` or `-NOAUTH` means the server is up; the INFO reply,
/// when it can be read, must carry `process_id:<pid>` and `loading:0`.
pub(crate) fn probe(port: u16, password: Option<&str>, pid: u32) -> Probe {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(stream) = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) else {
        return Probe::NotReady;
    };
    if stream.set_read_timeout(Some(IO_TIMEOUT)).is_err()
        || stream.set_write_timeout(Some(IO_TIMEOUT)).is_err()
    {
        return Probe::NotReady;
    }

    let mut request = Vec::new();
    if let Some(password) = password {
        request.extend(encode_command(&["AUTH", password]));
    }
    request.extend(encode_command(&["PING"]));
    request.extend(encode_command(&["INFO", "server", "persistence"]));
    if (&stream).write_all(&request).is_err() {
        return Probe::NotReady;
    }

    let mut reader = BufReader::new(stream);
    if password.is_some() && read_line(&mut reader).is_none() {
        return Probe::NotReady;
    }
    match read_line(&mut reader).as_deref() {
        Some("+PONG") => {}
        // Up, but the credentials are not ours to know: nothing more to check.
        Some(line) if line.starts_with("-NOAUTH") => return Probe::Ready,
        _ => return Probe::NotReady,
    }
    let Some(header) = read_line(&mut reader) else {
        return Probe::NotReady;
    };
    let Some(len) = header
        .strip_prefix('$')
        .and_then(|len| len.parse::<usize>().ok())
        .filter(|&len| len <= MAX_INFO_LEN)
    else {
        // INFO is unavailable (renamed or denied); PONG is all we can check.
        return Probe::Ready;
    };
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return Probe::NotReady;
    }
    let info = String::from_utf8_lossy(&body);
    inspect_info(&info, pid)
}

/// Judges an `INFO` reply from the server expected to have process id `pid`.
fn inspect_info(info: &str, pid: u32) -> Probe {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    match field("process_id").and_then(|value| value.parse::<u32>().ok()) {
        Some(other) if other != pid => return Probe::Foreign(other),
        _ => {}
    }
    if field("loading") == Some("1") {
        Probe::NotReady
    } else {
        Probe::Ready
    }
}

/// Encodes a command as a RESP array of bulk strings.
fn encode_command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n", arg.len()).into_bytes());
        out.extend(arg.as_bytes());
        out.extend(b"\r\n");
    }
    out
}

/// Reads one CRLF-terminated line, without the terminator.
fn read_line(reader: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim_end_matches(['\r', '\n']).to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_from_the_expected_process_is_ready() {
        let info = "# Server\r\nprocess_id:42\r\n# Persistence\r\nloading:0\r\n";
        assert_eq!(inspect_info(info, 42), Probe::Ready);
    }

    #[test]
    fn info_from_another_process_is_foreign() {
        let info = "# Server\r\nprocess_id:7\r\nloading:0\r\n";
        assert_eq!(inspect_info(info, 42), Probe::Foreign(7));
    }

    #[test]
    fn loading_server_is_not_ready() {
        let info = "process_id:42\r\nloading:1\r\n";
        assert_eq!(inspect_info(info, 42), Probe::NotReady);
    }

    #[test]
    fn commands_are_encoded_as_resp_arrays() {
        assert_eq!(
            encode_command(&["AUTH", "pw"]),
            b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n".to_vec()
        );
    }
}
