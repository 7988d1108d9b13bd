//! A fault-injecting TCP proxy for tests: put it between a worker and
//! PostgreSQL, or between a worker and the Baton server, and on command
//!
//! - **hold** traffic in one direction (bytes wait in the proxy until the
//!   hold is lifted: a slow network, a delayed request);
//! - **drop the response** to the next request: the request is delivered,
//!   whatever the server answers is discarded and the connection is reset,
//!   so the client sees an indeterminate failure for an operation that did
//!   take effect;
//! - **delay the response** to one request: it reaches the server at once,
//!   its answer arrives late (a grant that comes back after its TTL);
//! - **reset** every open connection.
//!
//! It works on bytes, not on protocol frames, so for
//! [`Proxy::drop_next_response`] one "request" is the next chunk the client
//! writes: let a connection finish its handshake (one full round trip) before
//! arming it, or a protocol housekeeping frame may be taken for the request.
//! [`Proxy::drop_response_to`] targets one request by a pattern in its bytes
//! instead (an operation id in a PostgreSQL Bind message, a resource name in a
//! gRPC request). [`FaultCounts`] tells a test how often each fault
//! fired: a fault test whose fault never fired proved nothing.
//!
#![doc = include_str!("../../../docs/fault-suite.md")]
#![warn(missing_docs)]

pub mod checker;
pub mod grants;
pub mod history;
pub mod signal;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Which way bytes flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Requests.
    ClientToServer,
    /// Responses.
    ServerToClient,
}

/// How often each fault fired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Chunks that waited in a hold.
    pub held_chunks: u64,
    /// Responses discarded (each followed by a reset of its connection).
    pub dropped_responses: u64,
    /// Connections reset on command.
    pub resets: u64,
    /// Connections accepted by the proxy.
    pub connections: u64,
    /// Responses held back by [`Proxy::delay_response_to`].
    pub delayed_responses: u64,
}

struct Control {
    hold_up: watch::Sender<bool>,
    hold_down: watch::Sender<bool>,
    drop_next: AtomicBool,
    /// Armed by [`Proxy::drop_response_to`]: the request to look for.
    drop_pattern: std::sync::Mutex<Option<Vec<u8>>>,
    /// Armed by [`Proxy::delay_response_to`]: the request and the delay.
    delay_pattern: std::sync::Mutex<Option<(Vec<u8>, Duration)>>,
    delayed_responses: AtomicU64,
    reset_epoch: watch::Sender<u64>,
    held_chunks: AtomicU64,
    dropped_responses: AtomicU64,
    resets: AtomicU64,
    connections: AtomicU64,
    open: AtomicU64,
}

/// Whether `chunk` holds the pattern armed in `slot`; disarms it and
/// returns what was armed if so.
fn take_armed<T>(
    slot: &std::sync::Mutex<Option<T>>,
    pattern: impl Fn(&T) -> &[u8],
    chunk: &[u8],
) -> Option<T> {
    let mut armed = slot.lock().unwrap_or_else(|e| e.into_inner());
    let hit = armed
        .as_ref()
        .map(&pattern)
        .is_some_and(|p| !p.is_empty() && chunk.windows(p.len()).any(|w| w == p));
    if hit {
        armed.take()
    } else {
        None
    }
}

impl Control {
    /// Whether `chunk` holds the armed drop pattern; disarms it if so.
    fn take_pattern_in(&self, chunk: &[u8]) -> bool {
        take_armed(&self.drop_pattern, |p| p.as_slice(), chunk).is_some()
    }

    /// If `chunk` holds the armed delay pattern: disarms it and holds every
    /// response for the armed delay, starting now (before the request
    /// reaches the server, so its answer cannot slip through first).
    fn delay_if_armed(self: &Arc<Self>, chunk: &[u8]) {
        if let Some((_, delay)) = take_armed(&self.delay_pattern, |(p, _)| p.as_slice(), chunk) {
            self.delayed_responses.fetch_add(1, SeqCst);
            self.hold_down.send_replace(true);
            let control = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                control.hold_down.send_replace(false);
            });
        }
    }

    fn hold_flag(&self, direction: Direction) -> &watch::Sender<bool> {
        match direction {
            Direction::ClientToServer => &self.hold_up,
            Direction::ServerToClient => &self.hold_down,
        }
    }
}

/// A running proxy. Dropping it stops accepting; open connections end when
/// either side closes.
pub struct Proxy {
    addr: SocketAddr,
    control: Arc<Control>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.reset_all();
    }
}

impl Proxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let control = Arc::new(Control {
            hold_up: watch::channel(false).0,
            hold_down: watch::channel(false).0,
            drop_next: AtomicBool::new(false),
            drop_pattern: std::sync::Mutex::new(None),
            delay_pattern: std::sync::Mutex::new(None),
            delayed_responses: AtomicU64::new(0),
            reset_epoch: watch::channel(0).0,
            held_chunks: AtomicU64::new(0),
            dropped_responses: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            open: AtomicU64::new(0),
        });
        let c = control.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        c.connections.fetch_add(1, SeqCst);
                        serve(client, server, c).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            control,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every byte in `direction` until [`Proxy::release`].
    pub fn hold(&self, direction: Direction) {
        self.control.hold_flag(direction).send_replace(true);
    }

    /// Lets the held direction flow again, held chunks first.
    pub fn release(&self, direction: Direction) {
        self.control.hold_flag(direction).send_replace(false);
    }

    /// Holds `direction` for `duration`, then releases it (in the background).
    pub fn hold_for(&self, direction: Direction, duration: Duration) {
        self.hold(direction);
        let control = self.control.clone();
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            control.hold_flag(direction).send_replace(false);
        });
    }

    /// The next chunk a client sends is delivered; the server's answer on
    /// that connection is discarded and the connection is reset.
    pub fn drop_next_response(&self) {
        self.control.drop_next.store(true, SeqCst);
    }

    /// Targets one request: the first client chunk that contains `pattern`
    /// (an operation id, a resource name: PostgreSQL's Bind message and a
    /// gRPC request body carry their parameters as plain bytes) is
    /// delivered, and the answer on that connection is discarded and the
    /// connection reset. The pattern must fall within one chunk, which holds
    /// for requests of a few kilobytes.
    pub fn drop_response_to(&self, pattern: &[u8]) {
        *self
            .control
            .drop_pattern
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(pattern.to_vec());
    }

    /// Delays one answer: when the first client chunk that contains
    /// `pattern` passes (see [`Proxy::drop_response_to`] for what a pattern
    /// can be), every response is held for `delay` from that moment, then
    /// delivered in order. The request itself reaches the server at once:
    /// a late reply to an operation that did take effect.
    pub fn delay_response_to(&self, pattern: &[u8], delay: Duration) {
        *self
            .control
            .delay_pattern
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((pattern.to_vec(), delay));
    }

    /// Resets every open connection.
    pub fn reset_all(&self) {
        self.control
            .resets
            .fetch_add(self.control.open.load(SeqCst), SeqCst);
        self.control.reset_epoch.send_modify(|e| *e += 1);
    }

    /// How often each fault fired so far.
    pub fn counts(&self) -> FaultCounts {
        let c = &self.control;
        FaultCounts {
            held_chunks: c.held_chunks.load(SeqCst),
            dropped_responses: c.dropped_responses.load(SeqCst),
            resets: c.resets.load(SeqCst),
            connections: c.connections.load(SeqCst),
            delayed_responses: c.delayed_responses.load(SeqCst),
        }
    }
}

async fn serve(client: TcpStream, server: TcpStream, c: Arc<Control>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Closing with linger 0 sends RST: the client sees a reset, not a clean close.
    let _ = socket_linger_zero(&client);
    c.open.fetch_add(1, SeqCst);
    let mut reset = c.reset_epoch.subscribe();
    reset.borrow_and_update();
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // Set once the next client chunk was delivered with a drop pending.
    let dropping = Arc::new(AtomicBool::new(false));
    tokio::select! {
        _ = pump(cr, sw, Direction::ClientToServer, c.clone(), dropping.clone()) => {}
        _ = pump(sr, cw, Direction::ServerToClient, c.clone(), dropping) => {}
        _ = reset.changed() => {}
    }
    c.open.fetch_sub(1, SeqCst);
    // Dropping both halves closes both connections.
}

/// Copies one direction of a connection, applying that direction's faults.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    direction: Direction,
    c: Arc<Control>,
    dropping: Arc<AtomicBool>,
) {
    let mut hold = c.hold_flag(direction).subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        if direction == Direction::ServerToClient && dropping.load(SeqCst) {
            c.dropped_responses.fetch_add(1, SeqCst);
            tracing::debug!(
                bytes = n,
                "proxy dropped a response and resets the connection"
            );
            return;
        }
        wait_released(&mut hold, &c).await;
        if direction == Direction::ClientToServer {
            c.delay_if_armed(&buf[..n]);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if direction == Direction::ClientToServer
            && (c.drop_next.swap(false, SeqCst) || c.take_pattern_in(&buf[..n]))
        {
            dropping.store(true, SeqCst);
        }
    }
}

async fn wait_released(hold: &mut watch::Receiver<bool>, c: &Control) {
    if *hold.borrow_and_update() {
        c.held_chunks.fetch_add(1, SeqCst);
        while *hold.borrow_and_update() {
            if hold.changed().await.is_err() {
                return;
            }
        }
    }
}

fn socket_linger_zero(stream: &TcpStream) -> std::io::Result<()> {
    #[allow(deprecated)] // the replacement needs socket2; this is test tooling
    stream.set_linger(Some(Duration::ZERO))
}
