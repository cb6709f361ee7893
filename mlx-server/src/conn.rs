//! Serving connections: hyper's HTTP/1 over the tokio listener with the axum router as the
//! service, and the limits `axum::serve` lacks, as trusted servers set them:
//!
//! - a request head must arrive within `--header-timeout` (hyper's timer, counted from when
//!   the connection is ready for a request), and an idle keep-alive connection closes after
//!   `--keep-alive-timeout`;
//! - at most `--max-connections` are open: past it the connection idle longest (no request in
//!   progress: keep-alive, or a head not complete) is closed to make room, so clients that
//!   open connections and send nothing only displace each other; when every connection has a
//!   request in progress, new ones get 503 with `Retry-After` and are closed;
//! - a response whose client stops reading (its socket full for `--write-timeout`) is dropped,
//!   which cancels its generation: nothing buffers without bound;
//! - shutdown stops accepting, closes idle and half-sent connections at once, lets requests in
//!   progress finish within `--shutdown-timeout` and then drops them (cancelling their rows).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify, Semaphore};

use crate::error::{ApiError, RETRY_AFTER_SECS};

/// The connection limits (see `ServeArgs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub keep_alive_timeout: Duration,
    pub write_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_timeout: Duration,
}

/// Connections being refused (answered 503 and drained) at once at most; past it a new
/// connection is closed without an answer, so refusing never holds more descriptors.
const REFUSING: usize = 64;

/// Bytes of a connection's socket send buffer (the kernel doubles it) and of hyper's buffers
/// (which also bounds a request head).
const SEND_BUFFER: usize = 64 * 1024;

/// Milliseconds on the server's clock, kept in atomics.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now(&self) -> u64 {
        self.0.elapsed().as_millis() as u64
    }
}

/// Set in [`Conn::busy`] once the connection was chosen to close.
const CLOSING: usize = 1 << (usize::BITS - 1);
/// [`Conn::write_blocked`] when no write waits.
const NOT_BLOCKED: u64 = u64::MAX;

/// What the accept loop, the connection's task and its requests share about a connection.
struct Conn {
    /// Requests in progress (until their response body is sent or dropped), with
    /// [`CLOSING`] set once the connection was chosen to close.
    busy: AtomicUsize,
    /// Wakes the connection's task to close it.
    close: Notify,
    /// When the last request ended (or the connection opened).
    idle_since: AtomicU64,
    /// When bytes last arrived (0: never).
    last_read: AtomicU64,
    /// Since when a write has waited on a full socket ([`NOT_BLOCKED`]: none waits).
    write_blocked: AtomicU64,
}

impl Conn {
    fn new(now: u64) -> Conn {
        Conn {
            busy: AtomicUsize::new(0),
            close: Notify::new(),
            idle_since: AtomicU64::new(now),
            last_read: AtomicU64::new(0),
            write_blocked: AtomicU64::new(NOT_BLOCKED),
        }
    }

    /// Marks an idle connection (no request in progress) as closing; false when a request is
    /// in progress or it was already claimed.
    fn claim_idle(&self) -> bool {
        self.busy
            .compare_exchange(0, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A request in progress on a connection, until its response body is sent or dropped.
struct Busy {
    conn: Arc<Conn>,
    clock: Clock,
}

impl Busy {
    fn enter(conn: Arc<Conn>, clock: Clock) -> Busy {
        conn.busy.fetch_add(1, Ordering::AcqRel);
        Busy { conn, clock }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.conn
            .idle_since
            .store(self.clock.now(), Ordering::Release);
        self.conn.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The open connections, by accept order.
struct Registry {
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    max: usize,
}

impl Registry {
    /// Admits a connection, closing the one idle longest when full; false when every
    /// connection has a request in progress.
    fn admit(&self, id: u64, conn: Arc<Conn>) -> bool {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        while conns.len() >= self.max {
            let victim = conns
                .iter()
                .filter(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
                .min_by_key(|(_, c)| c.idle_since.load(Ordering::Acquire))
                .map(|(&k, c)| (k, c.clone()));
            let Some((k, c)) = victim else {
                return false;
            };
            // A request may have started since the scan: then look again.
            if c.claim_idle() {
                conns.remove(&k);
                c.close.notify_one();
            }
        }
        conns.insert(id, conn);
        true
    }

    fn remove(&self, id: u64) {
        self.conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    fn len(&self) -> usize {
        self.conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The socket, noting when bytes arrive and how long writes wait.
struct Tracked {
    inner: TcpStream,
    conn: Arc<Conn>,
    clock: Clock,
}

impl Tracked {
    fn note_write<T>(&self, r: &Poll<T>) {
        match r {
            Poll::Pending => {
                let _ = self.conn.write_blocked.compare_exchange(
                    NOT_BLOCKED,
                    self.clock.now(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
            Poll::Ready(_) => self
                .conn
                .write_blocked
                .store(NOT_BLOCKED, Ordering::Release),
        }
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.conn
                .last_read
                .store(this.clock.now().max(1), Ordering::Release);
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.note_write(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.note_write(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.note_write(&r);
        r
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What every connection task gets.
#[derive(Clone)]
struct Shared {
    router: Router,
    limits: Limits,
    clock: Clock,
    registry: Arc<Registry>,
    /// `Some(deadline)` once shutdown began.
    shutdown: watch::Receiver<Option<Instant>>,
    /// Dropped when the task ends: shutdown waits for every clone to go.
    _alive: mpsc::Sender<()>,
}

/// Accepts and serves connections until `shutdown` completes, then shuts down as the module
/// documentation says. Returns once every connection is closed (within the grace).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let clock = Clock(Instant::now());
    let registry = Arc::new(Registry {
        conns: Mutex::new(BTreeMap::new()),
        max: limits.max_connections.max(1),
    });
    let (shutdown_tx, shutdown_rx) = watch::channel(None);
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    let shared = Shared {
        router,
        limits,
        clock,
        registry: registry.clone(),
        shutdown: shutdown_rx,
        _alive: alive_tx,
    };
    let refusing = Arc::new(Semaphore::new(REFUSING));
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors or memory: back off instead of spinning; a reset before
                // the accept completed is the client's and needs no pause.
                if !matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // The kernel grows a send buffer up to megabytes for a client that does not read:
        // bounded, a stalled reader is seen (and dropped) after a few hundred KiB at most, and
        // --max-connections stalled clients cannot pin gigabytes of kernel memory.
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER);
        next_id += 1;
        let conn = Arc::new(Conn::new(clock.now()));
        if registry.admit(next_id, conn.clone()) {
            tokio::spawn(serve_conn(stream, next_id, conn, shared.clone()));
        } else if let Ok(permit) = refusing.clone().try_acquire_owned() {
            let alive = shared._alive.clone();
            tokio::spawn(async move {
                refuse(stream).await;
                drop((permit, alive));
            });
        } else {
            drop(stream);
        }
    }
    drop(listener);
    let deadline = Instant::now() + limits.shutdown_timeout;
    tracing::info!(
        connections = registry.len(),
        grace_s = limits.shutdown_timeout.as_secs_f64(),
        "shutting down: no new connections; requests in progress get the grace"
    );
    let _ = shutdown_tx.send(Some(deadline));
    drop(shared);
    // Every task ends by the deadline (it drops its connection then); the slack covers the
    // tasks' last wake-up.
    let slack = Duration::from_secs(1);
    let _ = tokio::time::timeout_at((deadline + slack).into(), alive_rx.recv()).await;
}

/// The answer to a connection past `--max-connections` when every connection is busy: a 503
/// with `Retry-After`, then the request read and dropped (bounded) so that closing does not
/// reset the connection before the client read the answer.
async fn refuse(mut stream: TcpStream) {
    let body = ApiError::overloaded(
        "The server has too many connections open; retry later.",
        "too_many_connections",
    )
    .body()
    .to_string();
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: {RETRY_AFTER_SECS}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(reply.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut left: usize = 64 * 1024;
        while left > 0 {
            let n = stream.read(&mut sink).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        Ok::<_, io::Error>(())
    })
    .await;
}

async fn serve_conn(stream: TcpStream, id: u64, conn: Arc<Conn>, shared: Shared) {
    let Shared {
        router,
        limits,
        clock,
        registry,
        mut shutdown,
        _alive,
    } = shared;
    let io = TokioIo::new(Tracked {
        inner: stream,
        conn: conn.clone(),
        clock,
    });
    let inner = TowerToHyperService::new(router);
    let svc_conn = conn.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let busy = Busy::enter(svc_conn.clone(), clock);
        let fut = hyper::service::Service::call(&inner, req);
        async move {
            let resp = match fut.await {
                Ok(r) => r,
                Err(e) => match e {},
            };
            // The request stays in progress until its body is sent (or dropped).
            Ok::<_, Infallible>(resp.map(|b| {
                Body::new(b.map_frame(move |f| {
                    let _in_progress = &busy;
                    f
                }))
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(SEND_BUFFER)
        .keep_alive(true);
    let served = builder.serve_connection(io, service);
    tokio::pin!(served);
    let period = [
        limits.header_timeout,
        limits.keep_alive_timeout,
        limits.write_timeout,
    ]
    .into_iter()
    .min()
    .unwrap_or(Duration::from_secs(1))
    .div_f64(4.0)
    .clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ms = |d: Duration| d.as_millis() as u64;
    let mut deadline: Option<Instant> = *shutdown.borrow_and_update();
    if deadline.is_some() && conn.claim_idle() {
        registry.remove(id);
        return;
    }
    loop {
        tokio::select! {
            r = served.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended");
                }
                break;
            }
            _ = conn.close.notified() => break,
            changed = shutdown.changed(), if deadline.is_none() => {
                let d = match changed {
                    Ok(()) => *shutdown.borrow_and_update(),
                    Err(_) => Some(Instant::now()),
                };
                if let Some(d) = d {
                    deadline = Some(d);
                    // Idle or half-sent: close now; a request in progress finishes first.
                    if conn.claim_idle() {
                        break;
                    }
                    served.as_mut().graceful_shutdown();
                }
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now).into()), if deadline.is_some() => {
                tracing::warn!("shutdown grace over: dropping a request in progress");
                break;
            }
            _ = tick.tick() => {
                let now = clock.now();
                let blocked = conn.write_blocked.load(Ordering::Acquire);
                if blocked != NOT_BLOCKED && now.saturating_sub(blocked) >= ms(limits.write_timeout) {
                    tracing::warn!(
                        write_timeout_s = limits.write_timeout.as_secs_f64(),
                        "the client stopped reading its response: dropping the connection"
                    );
                    break;
                }
                let idle_since = conn.idle_since.load(Ordering::Acquire);
                if conn.busy.load(Ordering::Acquire) == 0
                    && conn.last_read.load(Ordering::Acquire) <= idle_since
                    && now.saturating_sub(idle_since) >= ms(limits.keep_alive_timeout)
                    && conn.claim_idle()
                {
                    break;
                }
            }
        }
    }
    registry.remove(id);
}
