//! A fault-injecting TCP proxy.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a [`TcpProxy`] does with traffic; switchable at any time with
/// [`TcpProxy::set_mode`], and applied to existing connections too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward bytes in both directions as they arrive.
    Pass,
    /// Forward each chunk read from either side only after this delay
    /// (a request/reply round trip therefore takes at least twice the delay).
    Delay(Duration),
    /// Reach the upstream for a connection accepted now only after this
    /// delay (a slow handshake: a client's first command waits that long);
    /// connections already made forward as in `Pass`.
    DelayNew(Duration),
    /// Accept connections and read from them, but never forward anything or
    /// answer: a hanging server. Data read while swallowing is discarded.
    Swallow,
    /// Close new connections immediately after accepting them, and close
    /// existing ones: a dead server.
    Refuse,
}

/// A TCP proxy on `127.0.0.1:<random port>` in front of `upstream`, with
/// runtime-switchable faults (see [`ProxyMode`]).
///
/// Dropping the proxy stops the accept loop and every connection task.
///
/// Note that a `redis` client's default response timeout is 500 ms; use
/// `redis::AsyncConnectionConfig::set_response_timeout` when testing long
/// delays through the proxy.
///
/// ```no_run
/// use norepeat_testkit::{ProxyMode, RedisServer, TcpProxy};
/// use std::time::Duration;
///
/// # async fn demo() {
/// let redis = RedisServer::start().await;
/// let proxy = TcpProxy::start(redis.addr()).await;
/// let client = redis::Client::open(proxy.url_for_redis()).expect("valid url");
/// proxy.set_mode(ProxyMode::Delay(Duration::from_millis(300))); // slow server
/// proxy.set_mode(ProxyMode::Swallow);                           // hanging server
/// proxy.set_mode(ProxyMode::Refuse);                            // dead server
/// proxy.set_mode(ProxyMode::Pass);                              // healthy again
/// # }
/// ```
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    shutdown: watch::Sender<bool>,
    accepted: Arc<AtomicUsize>,
    to_upstream: Arc<AtomicUsize>,
    accept_task: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts the proxy in [`ProxyMode::Pass`], listening on `127.0.0.1:0`.
    ///
    /// # Panics
    ///
    /// Panics when no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap_or_else(|e| panic!("norepeat-testkit: proxy cannot bind 127.0.0.1:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("norepeat-testkit: proxy local_addr: {e}"));
        let (mode, _) = watch::channel(ProxyMode::Pass);
        let (shutdown, _) = watch::channel(false);
        let accepted = Arc::new(AtomicUsize::new(0));
        let to_upstream = Arc::new(AtomicUsize::new(0));
        let accept_task = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode.subscribe(),
            shutdown.subscribe(),
            Arc::clone(&accepted),
            Arc::clone(&to_upstream),
        ));
        tracing::debug!(%addr, %upstream, "tcp proxy started");
        TcpProxy {
            addr,
            upstream,
            mode,
            shutdown,
            accepted,
            to_upstream,
            accept_task,
        }
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url_for_redis(&self) -> String {
        format!("redis://127.0.0.1:{}", self.addr.port())
    }

    /// Switches the mode; takes effect immediately, for new and existing connections.
    pub fn set_mode(&self, mode: ProxyMode) {
        tracing::debug!(addr = %self.addr, ?mode, "tcp proxy mode");
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// How many client connections were accepted so far (including refused ones).
    pub fn accepted_connections(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// How many chunks the proxy has read from its clients and forwarded
    /// to the upstream so far, over every connection: the clients' writes
    /// as the proxy saw them. On loopback a write of up to 16 KiB (the
    /// proxy's read buffer) is usually read as one chunk, a larger one in
    /// several, and writes that arrive before the proxy reads are read as
    /// one. Data swallowed or refused is not counted.
    ///
    /// ```no_run
    /// use norepeat_testkit::{RedisServer, TcpProxy};
    /// use redis::AsyncCommands;
    ///
    /// # async fn demo() {
    /// let redis = RedisServer::start().await;
    /// let proxy = TcpProxy::start(redis.addr()).await;
    /// let client = redis::Client::open(proxy.url_for_redis()).expect("valid url");
    /// let mut con = client.get_multiplexed_async_connection().await.expect("connects");
    /// let before = proxy.forwarded_writes();
    /// let _: () = con.set("k", "v").await.expect("set");
    /// assert!(proxy.forwarded_writes() > before, "the SET was one write");
    /// # }
    /// ```
    pub fn forwarded_writes(&self) -> usize {
        self.to_upstream.load(Ordering::Relaxed)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        self.accept_task.abort();
    }
}

/// True once shutdown was requested (or the proxy is gone).
fn is_shutdown(rx: &watch::Receiver<bool>) -> bool {
    *rx.borrow() || rx.has_changed().is_err()
}

/// Resolves when shutdown is requested or the proxy handle is dropped.
async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    // `wait_for` errors when the sender is gone: that is a shutdown too.
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Resolves when the mode becomes `Refuse` or the proxy handle is dropped.
async fn wait_refuse(rx: &mut watch::Receiver<ProxyMode>) {
    let _ = rx.wait_for(|m| *m == ProxyMode::Refuse).await;
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<ProxyMode>,
    mut shutdown: watch::Receiver<bool>,
    accepted: Arc<AtomicUsize>,
    to_upstream: Arc<AtomicUsize>,
) {
    loop {
        let (client, peer) = tokio::select! {
            () = wait_shutdown(&mut shutdown) => return,
            res = listener.accept() => match res {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::debug!(error = %e, "proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        if *mode.borrow() == ProxyMode::Refuse {
            tracing::trace!(%peer, "proxy refusing connection");
            drop(client);
            continue;
        }
        tokio::spawn(connection(
            client,
            upstream,
            mode.clone(),
            shutdown.clone(),
            Arc::clone(&to_upstream),
        ));
    }
}

/// How a pump ended.
#[derive(Debug, PartialEq, Eq)]
enum PumpEnd {
    /// The reading side closed cleanly; the write side was shut down.
    Eof,
    /// Error, refuse or shutdown: the whole connection must be torn down.
    Abort,
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
    mut shutdown: watch::Receiver<bool>,
    to_upstream: Arc<AtomicUsize>,
) {
    let mode_at_accept = *mode.borrow();
    if let ProxyMode::DelayNew(delay) = mode_at_accept {
        tokio::select! {
            () = wait_shutdown(&mut shutdown) => return,
            () = wait_refuse(&mut mode) => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
    let upstream = tokio::select! {
        () = wait_shutdown(&mut shutdown) => return,
        () = wait_refuse(&mut mode) => return,
        res = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(upstream)) => match res {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                tracing::debug!(%upstream, error = %e, "proxy cannot reach upstream");
                None
            }
            Err(_) => {
                tracing::debug!(%upstream, "proxy upstream connect timed out");
                None
            }
        },
    };
    let Some(upstream) = upstream else {
        if *mode.borrow() == ProxyMode::Swallow {
            // A hanging server does not need an upstream: just read forever.
            swallow_only(client, mode, shutdown).await;
        }
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let to_upstream = pump(
        client_read,
        upstream_write,
        mode.clone(),
        shutdown.clone(),
        Some(to_upstream),
    );
    let to_client = pump(upstream_read, client_write, mode, shutdown, None);
    tokio::pin!(to_upstream, to_client);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        tokio::select! {
            end = &mut to_upstream, if !up_done => {
                if end == PumpEnd::Abort { return; }
                up_done = true;
            }
            end = &mut to_client, if !down_done => {
                if end == PumpEnd::Abort { return; }
                down_done = true;
            }
        }
    }
}

/// Copies chunks from `reader` to `writer`, applying the current mode;
/// counts each chunk forwarded in `forwarded`, if given.
async fn pump(
    mut reader: tokio::net::tcp::OwnedReadHalf,
    mut writer: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
    mut shutdown: watch::Receiver<bool>,
    forwarded: Option<Arc<AtomicUsize>>,
) -> PumpEnd {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            () = wait_shutdown(&mut shutdown) => return PumpEnd::Abort,
            () = wait_refuse(&mut mode) => return PumpEnd::Abort,
            res = reader.read(&mut buf) => match res {
                Ok(0) => {
                    let _ = writer.shutdown().await;
                    return PumpEnd::Eof;
                }
                Ok(n) => n,
                Err(_) => return PumpEnd::Abort,
            },
        };
        let current = *mode.borrow();
        match current {
            ProxyMode::Pass | ProxyMode::DelayNew(_) => {}
            ProxyMode::Swallow => continue,
            ProxyMode::Refuse => return PumpEnd::Abort,
            ProxyMode::Delay(delay) => {
                tokio::select! {
                    () = wait_shutdown(&mut shutdown) => return PumpEnd::Abort,
                    () = wait_refuse(&mut mode) => return PumpEnd::Abort,
                    () = tokio::time::sleep(delay) => {}
                }
                // The mode may have changed while we slept.
                match *mode.borrow() {
                    ProxyMode::Swallow => continue,
                    ProxyMode::Refuse => return PumpEnd::Abort,
                    ProxyMode::Pass | ProxyMode::Delay(_) | ProxyMode::DelayNew(_) => {}
                }
            }
        }
        if is_shutdown(&shutdown) {
            return PumpEnd::Abort;
        }
        if let Some(count) = &forwarded {
            count.fetch_add(1, Ordering::Relaxed);
        }
        if writer.write_all(&buf[..n]).await.is_err() {
            return PumpEnd::Abort;
        }
    }
}

/// Reads and discards from `client` until EOF, refuse or shutdown.
async fn swallow_only(
    mut client: TcpStream,
    mut mode: watch::Receiver<ProxyMode>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            () = wait_shutdown(&mut shutdown) => return,
            () = wait_refuse(&mut mode) => return,
            res = client.read(&mut buf) => match res {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
        }
    }
}
