//! A TCP proxy for fault injection between a client and a server.
//!
//! The proxy runs on a thread of its own with its own current-thread Tokio
//! runtime, so it keeps working whatever the test's runtime does (a
//! `#[tokio::test]` runtime is single-threaded and ends with the test). The
//! [`Proxy`] handle talks to it through shared state: a `watch` channel for
//! the mode, a control channel for cuts and shutdown, and an atomic count of
//! open connections.

use std::future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{self, Instant};

use crate::TestkitError;

mod timer;

use timer::DeliveryTimer;

/// Bound on the proxy thread starting, acknowledging a cut, or shutting down.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on connecting to the upstream server for a new client.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Size of the read buffer of each direction of a connection.
const CHUNK_SIZE: usize = 16 * 1024;
/// Back-off after a failed accept (for instance when out of descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// How a [`Proxy`] treats traffic. Applies to new and existing connections
/// alike, from the moment it is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward bytes both ways as they come.
    #[default]
    Pass,
    /// Hold every chunk for this long after it was read before forwarding
    /// it, in both directions (added latency; order is kept): a round trip
    /// takes twice the delay more. Each chunk's hold counts from its own
    /// arrival, so pipelined traffic keeps flowing. The hold is precise to
    /// tens of microseconds on Linux (a timerfd per direction), to the
    /// millisecond elsewhere (tokio's timer).
    Delay(Duration),
    /// Forward nothing in either direction and never answer, while still
    /// accepting connections and reading what clients send: connections
    /// hang rather than fail. Bytes read meanwhile are held, not dropped, and
    /// are delivered in order once the mode changes back (like a healed
    /// partition: TCP loses nothing). Call [`Proxy::cut`] to discard them.
    Blackhole,
}

/// Requests from the [`Proxy`] handle to its thread.
enum Control {
    /// Close every connection, then acknowledge.
    Cut(std_mpsc::Sender<()>),
    /// Stop accepting, close everything and end the thread.
    Shutdown,
}

/// A TCP proxy on `127.0.0.1` in front of one upstream address, whose
/// behaviour a test switches with [`set_mode`](Self::set_mode) and
/// [`cut`](Self::cut).
///
/// Dropping it stops the listener and closes every connection.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    control: mpsc::UnboundedSender<Control>,
    open: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy to `upstream`, listening on a free port of `127.0.0.1`,
    /// in [`ProxyMode::Pass`].
    ///
    /// # Panics
    ///
    /// Panics if the listener or its thread cannot be set up.
    #[must_use = "the proxy stops when dropped"]
    pub fn start(upstream: SocketAddr) -> Proxy {
        Self::try_start(upstream)
            .unwrap_or_else(|e| panic!("lock-testkit: could not start the proxy: {e}"))
    }

    /// [`start`](Self::start), returning failures instead of panicking.
    ///
    /// # Errors
    ///
    /// Fails if the listener, the runtime or the thread cannot be set up.
    pub fn try_start(upstream: SocketAddr) -> Result<Proxy, TestkitError> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .map_err(|e| TestkitError::with_source("could not bind the proxy listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| TestkitError::with_source("could not read the proxy address", e))?;
        let (mode, mode_rx) = watch::channel(ProxyMode::Pass);
        let (control, control_rx) = mpsc::unbounded_channel();
        let open = Arc::new(AtomicUsize::new(0));
        let (started_tx, started_rx) = std_mpsc::channel();

        let thread_open = Arc::clone(&open);
        let thread = thread::Builder::new()
            .name(format!("lock-testkit-proxy-{}", addr.port()))
            .spawn(move || {
                // The runtime is built and dropped on this thread only, so
                // neither can happen inside the test's own runtime.
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let runtime = match runtime {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = started_tx.send(Err(TestkitError::with_source(
                            "could not build the proxy runtime",
                            e,
                        )));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(e) => {
                            let _ = started_tx.send(Err(TestkitError::with_source(
                                "could not register the proxy listener",
                                e,
                            )));
                            return;
                        }
                    };
                    let _ = started_tx.send(Ok(()));
                    accept_loop(listener, upstream, mode_rx, control_rx, thread_open).await;
                });
            })
            .map_err(|e| TestkitError::with_source("could not spawn the proxy thread", e))?;

        let proxy = Proxy {
            addr,
            upstream,
            mode,
            control,
            open,
            thread: Some(thread),
        };
        match started_rx.recv_timeout(CONTROL_TIMEOUT) {
            Ok(Ok(())) => Ok(proxy),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(TestkitError::new("the proxy thread did not start")),
        }
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `127.0.0.1:<port>` of the proxy.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// `redis://127.0.0.1:<port>` of the proxy (no password: build your own
    /// URL from [`port`](Self::port) if the server requires one).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.addr.port())
    }

    /// Switches the mode, for new and existing connections.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// Closes every current connection, on both sides, and returns once they
    /// are closed (bounded by a few seconds). Data held back by
    /// [`Delay`](ProxyMode::Delay) or [`Blackhole`](ProxyMode::Blackhole) is
    /// discarded. New connections are accepted afterwards and follow the mode.
    pub fn cut(&self) {
        let (done_tx, done_rx) = std_mpsc::channel();
        if self.control.send(Control::Cut(done_tx)).is_ok() {
            let _ = done_rx.recv_timeout(CONTROL_TIMEOUT);
        }
    }

    /// How many client connections are currently open through the proxy.
    ///
    /// A client's `connect` may return shortly before the proxy has accepted
    /// it; use [`wait_for_connection_count`](Self::wait_for_connection_count)
    /// to wait for a value.
    pub fn connection_count(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Waits until [`connection_count`](Self::connection_count) equals
    /// `count`, for at most `timeout`. Returns whether it did.
    pub fn wait_for_connection_count(&self, count: usize, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.connection_count() == count {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.control.send(Control::Shutdown);
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = std::time::Instant::now() + CONTROL_TIMEOUT;
        while !thread.is_finished() {
            if std::time::Instant::now() >= deadline {
                eprintln!("lock-testkit: proxy thread did not stop; leaving it behind");
                return;
            }
            thread::sleep(Duration::from_millis(1));
        }
        let _ = thread.join();
    }
}

/// Accepts clients and serves control requests until shut down. Dropping the
/// `JoinSet` (and then the runtime) closes every connection.
async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<ProxyMode>,
    mut control: mpsc::UnboundedReceiver<Control>,
    open: Arc<AtomicUsize>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            request = control.recv() => match request {
                Some(Control::Cut(done)) => {
                    connections.abort_all();
                    while connections.join_next().await.is_some() {}
                    let _ = done.send(());
                }
                Some(Control::Shutdown) | None => break,
            },
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    let counted = OpenConnection::new(&open);
                    connections.spawn(relay(client, upstream, mode.clone(), counted));
                }
                Err(_) => time::sleep(ACCEPT_BACKOFF).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts one open client connection for as long as it lives.
struct OpenConnection(Arc<AtomicUsize>);

impl OpenConnection {
    fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(open))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves one client: connects upstream and forwards both ways under the
/// current mode. Returns (closing both sockets) when the client goes away,
/// or when the server goes away and what it sent has been delivered.
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    mode: watch::Receiver<ProxyMode>,
    _counted: OpenConnection,
) {
    let _ = client.set_nodelay(true);
    let connecting = time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream));
    let Ok(Ok(server)) = connecting.await else {
        return hold_while_blackholed(client, mode).await;
    };
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = forward(client_read, server_write, mode.clone(), Eof::Close) => {}
        () = forward(server_read, client_write, mode, Eof::Deliver) => {}
    }
}

/// When the upstream cannot be reached: in [`ProxyMode::Blackhole`] the
/// client must see a hang, so keep reading (and discarding) until the mode
/// changes or the client leaves; otherwise close at once.
async fn hold_while_blackholed(mut client: TcpStream, mut mode: watch::Receiver<ProxyMode>) {
    let mut buf = vec![0; CHUNK_SIZE];
    while *mode.borrow_and_update() == ProxyMode::Blackhole {
        tokio::select! {
            read = client.read(&mut buf) => if matches!(read, Ok(0) | Err(_)) { return },
            changed = mode.changed() => if changed.is_err() { return },
        }
    }
}

/// What one direction of a connection does when its source ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Eof {
    /// End at once, dropping what is still held (the client left).
    Close,
    /// Deliver what is held, as the mode allows, then end (the server left;
    /// the client still gets its replies, or keeps hanging if blackholed).
    Deliver,
}

/// Copies `from` to `to`, each chunk gated by the mode at delivery time.
///
/// Reading and writing run concurrently through a queue, so the source is
/// read even while delivery is held back, and each chunk's delay counts from
/// when it was read.
async fn forward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
    on_eof: Eof,
) {
    let (queue, mut queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0; CHUNK_SIZE];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if queue.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let write = async move {
        let mut timer = DeliveryTimer::new();
        while let Some((read_at, chunk)) = queued.recv().await {
            wait_for_delivery(read_at, &mut mode, &mut timer).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    match on_eof {
        Eof::Close => tokio::select! {
            () = read => {}
            () = write => {}
        },
        Eof::Deliver => {
            tokio::join!(read, write);
        }
    }
}

/// Waits until a chunk read at `read_at` may be forwarded under the mode,
/// following mode changes while it waits.
async fn wait_for_delivery(
    read_at: Instant,
    mode: &mut watch::Receiver<ProxyMode>,
    timer: &mut DeliveryTimer,
) {
    loop {
        let current = *mode.borrow_and_update();
        let changed = match current {
            ProxyMode::Pass => return,
            ProxyMode::Delay(delay) => match read_at.checked_add(delay) {
                Some(due) => tokio::select! {
                    () = timer.sleep_until(due) => return,
                    changed = mode.changed() => changed,
                },
                None => mode.changed().await,
            },
            ProxyMode::Blackhole => mode.changed().await,
        };
        if changed.is_err() {
            // The proxy is shutting down; this task is about to be dropped.
            future::pending::<()>().await;
        }
    }
}
