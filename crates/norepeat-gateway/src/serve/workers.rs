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
pub(super) fn set_count(n: usize) {
    COUNT.store(n.max(1), Ordering::Relaxed);
}

/// How many workers the pools are made for.
pub(super) fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// The calling thread's worker (0 for a thread that is not one).
pub(super) fn index() -> usize {
    INDEX.with(Cell::get)
}

/// Marks the calling thread as worker `i`.
pub(super) fn enter(i: usize) {
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
pub(super) fn listeners(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
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

/// How far ahead a worker keeps a timer due while its store is in use:
/// below the store's smallest time budget (`Resilient`'s floor, 50 ms).
const TICK: std::time::Duration = std::time::Duration::from_millis(20);

/// A worker's heartbeat: the store calls made on its thread, how many
/// times it has beaten, whether it sleeps idle, and what wakes it.
struct Beat {
    calls: Cell<u64>,
    beats: Cell<u64>,
    idle: Cell<bool>,
    wake: std::sync::Arc<tokio::sync::Notify>,
}

thread_local! {
    static BEAT: Beat = Beat {
        calls: Cell::new(0),
        beats: Cell::new(0),
        idle: Cell::new(false),
        wake: std::sync::Arc::new(tokio::sync::Notify::new()),
    };
}

/// Notes a store call made on this thread, and wakes the thread's
/// [`heartbeat`] if it sleeps idle.
pub(super) fn note_store_call() {
    let _ = BEAT.try_with(|b| {
        b.calls.set(b.calls.get().wrapping_add(1));
        if b.idle.replace(false) {
            b.wake.notify_one();
        }
    });
}

/// Keeps a timer due within [`TICK`] on this thread's (current-thread)
/// runtime while the store is in use, and none while it is not.
///
/// Why: tokio's current-thread runtime unparks its driver (a `write` to
/// its `eventfd`, and an `epoll_wait` that returns at once for it) each
/// time a timer is registered that is due before every other one, though
/// the thread is running. Every store call registers one, its time budget
/// (`Resilient`), due long before the routes' 30 s timeouts: 0.7 system
/// calls of that kind per fingerprint request, by `strace` (BENCHMARKS.md,
/// issue 39). With this timer always nearer, no store call's is the
/// first. A worker whose store was not called for a whole tick sleeps on
/// a notification instead (the next store call wakes it): an idle
/// gateway does not wake for it.
pub(super) async fn heartbeat() {
    let wake = BEAT.with(|b| std::sync::Arc::clone(&b.wake));
    let mut seen = BEAT.with(|b| b.calls.get());
    loop {
        tokio::time::sleep(TICK).await;
        let calls = BEAT.with(|b| {
            b.beats.set(b.beats.get() + 1);
            b.calls.get()
        });
        if calls == seen {
            BEAT.with(|b| b.idle.set(true));
            wake.notified().await;
        }
        seen = BEAT.with(|b| b.calls.get());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn beats() -> u64 {
        BEAT.with(|b| b.beats.get())
    }

    /// The heartbeat beats while the store is called and stops within a
    /// tick of the last call: an idle worker is not woken by it.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_heartbeat_beats_only_while_the_store_is_in_use() {
        let task = tokio::spawn(heartbeat());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = beats();
        assert!(idle <= 1, "beat {idle} times in an idle second");

        for _ in 0..20 {
            note_store_call();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let busy = beats() - idle;
        assert!(
            (8..=12).contains(&busy),
            "beat {busy} times in 200 ms of store calls"
        );

        let before = beats();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            beats() - before <= 2,
            "beat {} times in 5 idle seconds",
            beats() - before
        );
        task.abort();
    }
}
