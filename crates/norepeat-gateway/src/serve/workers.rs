//! One event loop per core: `workers` single-threaded tokio runtimes, each
//! on its own listening socket (`SO_REUSEPORT`: the kernel spreads new
//! connections between them) and with its own upstream connection pool, as
//! NGINX runs a worker process per core. A connection, its requests and
//! the upstream connections they use stay on one thread: no task wakes
//! another thread on the way through (on two cores, tokio's work-stealing
//! runtime spent about a sixth of the pass-through's CPU on those
//! wake-ups; BENCHMARKS.md, issue 39).
//!
//! The routes, the store and its connections, the detached-call tracker
//! and the connection cap are one for the whole process; the store's
//! connection tasks run on the first worker (the main thread).

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many workers the upstream pools are made for (set once at start,
/// before the gateway is built; 1 when nobody sets it).
static COUNT: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// This thread's worker (0 for any thread that is not one).
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Makes every upstream pool from now on `n` pools, one per worker.
pub(crate) fn set_count(n: usize) {
    COUNT.store(n.max(1), Ordering::Relaxed);
}

/// How many workers the pools are made for.
pub(crate) fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// The calling thread's worker (0 for a thread that is not one).
pub(crate) fn index() -> usize {
    INDEX.with(Cell::get)
}

/// Marks the calling thread as worker `i`.
pub(crate) fn enter(i: usize) {
    INDEX.with(|c| c.set(i));
}

/// One `T` per worker, each used by its worker's thread only.
#[derive(Debug)]
pub(crate) struct PerWorker<T>(Box<[T]>);

impl<T> PerWorker<T> {
    /// `make` called once per worker.
    pub(crate) fn new(mut make: impl FnMut() -> T) -> Self {
        Self((0..count()).map(|_| make()).collect())
    }

    /// The calling thread's.
    pub(crate) fn get(&self) -> &T {
        &self.0[index() % self.0.len()]
    }

    /// Every worker's.
    pub(crate) fn all(&self) -> impl Iterator<Item = &T> {
        self.0.iter()
    }
}

/// `n` listening sockets on `addr`, all with `SO_REUSEPORT` (the first
/// picks the port when `addr`'s is 0; the others take the same), each
/// handed back as a std listener to be registered by the runtime that
/// serves it.
///
/// # Errors
/// A socket cannot be made or bound.
#[cfg(unix)]
pub(crate) fn listeners(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    // `SO_REUSEPORT` would let this process join a group another process
    // of the same user already listens with (a second gateway started on
    // the same address): the kernel would split connections between them,
    // where a server is expected to refuse to start. A plain bind first
    // fails as any server's does ("address in use").
    if addr.port() != 0 {
        drop(std::net::TcpListener::bind(addr)?);
    }
    let mut addr = addr;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(LISTEN_BACKLOG)?.into_std()?;
        addr = listener.local_addr()?;
        out.push(listener);
    }
    Ok(out)
}

/// The listen queue of each worker's socket (NGINX's default on Linux is
/// 511; the kernel caps it at `net.core.somaxconn`).
#[cfg(unix)]
const LISTEN_BACKLOG: u32 = 1024;
