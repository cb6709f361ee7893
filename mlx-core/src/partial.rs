//! Files written beside their target and renamed into place, and what an interrupted write
//! leaves behind.
//!
//! A write goes to `.<name>.<pid>.partial<suffix>` in the target's directory and is renamed
//! over the target only once complete, so the target is never half-written. Two kinds of
//! leftovers are removed:
//!
//! - a partial whose writer was killed outright (SIGKILL, a crash) stays on disk; the next
//!   write of the same target removes it once its writer process no longer runs
//!   ([`remove_stale_partials`]; where that cannot be told, once it is a day old);
//! - after [`cleanup_on_interrupt`], SIGINT or SIGTERM during a write removes the partial
//!   being written before the signal's default action ends the process. Inside an
//!   [`InterruptScope`] (a download that stops on its own when [`interrupted`] turns true)
//!   the signals only set that flag, and partials being written are still removed.
//!
//! The signal handlers are installed once per process and only on request (a server that
//! shuts down gracefully on SIGINT must not have them).

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The temporary name a write of `target` goes to: `.<name>.<pid>.partial<suffix>` (MLX
/// appends its own extension to names without it, so writers through MLX keep theirs in
/// `suffix`, e.g. `.safetensors`).
pub fn partial_path(target: &Path, suffix: &str) -> PathBuf {
    target.with_file_name(format!(
        ".{}.{}.partial{suffix}",
        target.file_name().and_then(|n| n.to_str()).unwrap_or("out"),
        std::process::id()
    ))
}

/// Whether process `pid` still runs (where that cannot be told: assume it does).
pub fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// Whether a leftover at `path` written by process `pid` (when its name tells) may be
/// removed: never this process's own; when the writer no longer runs (Linux), else when the
/// file is a day old.
pub fn is_stale(path: &Path, pid: Option<u32>) -> bool {
    match pid {
        Some(pid) if pid == std::process::id() => false,
        Some(pid) if cfg!(target_os = "linux") => !process_alive(pid),
        _ => std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(24 * 3600)),
    }
}

/// Removes the partial files of `target` (`.<name>.<pid>.partial*`, as [`partial_path`]
/// names them) whose writer no longer runs. Partials of other targets and of live writers
/// are left alone. Returns how many were removed.
pub fn remove_stale_partials(target: &Path) -> usize {
    let Some(name) = target.file_name().and_then(|n| n.to_str()) else {
        return 0;
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let prefix = format!(".{name}.");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(file) = file.to_str() else {
            continue;
        };
        let Some((digits, _)) = file
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split_once(".partial"))
        else {
            continue;
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let is_file = e.file_type().is_ok_and(|t| t.is_file());
        if is_file
            && is_stale(&e.path(), digits.parse().ok())
            && std::fs::remove_file(e.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// `bytes` written to `target` through a partial file renamed into place (stale partials of
/// the target removed first).
pub fn write_atomic(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    remove_stale_partials(target);
    let guard = PartialGuard::new(target, "");
    std::fs::write(guard.path(), bytes)?;
    guard.commit(target)
}

/// A partial file being written: removed on drop unless committed, and removed by SIGINT or
/// SIGTERM meanwhile (once [`cleanup_on_interrupt`] was called).
pub struct PartialGuard {
    path: PathBuf,
    slot: Option<usize>,
    committed: bool,
}

impl PartialGuard {
    /// The guard of [`partial_path`]`(target, suffix)` (the file itself is not created).
    pub fn new(target: &Path, suffix: &str) -> PartialGuard {
        let path = partial_path(target, suffix);
        let slot = register(&path);
        PartialGuard {
            path,
            slot,
            committed: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the partial file over `target`.
    pub fn commit(mut self, target: &Path) -> std::io::Result<()> {
        let r = std::fs::rename(&self.path, target);
        self.committed = r.is_ok();
        r
    }

    fn unregister(&mut self) {
        if let Some(i) = self.slot.take() {
            unregister(i);
        }
    }
}

impl Drop for PartialGuard {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
        self.unregister();
    }
}

// ---------------------------------------------------------------------------------------
// Signals
// ---------------------------------------------------------------------------------------

/// How many partial files the signal handler can know of at once (writes beyond that are
/// still cleaned by the next write of their target).
const SLOTS: usize = 64;

/// The partial files being written, as C strings the handler can `unlink` without
/// allocating (a signal handler may not allocate or lock).
static PARTIALS: [AtomicPtr<c_char>; SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];

/// Set by the handler before it reads any slot: a path unregistered after that is leaked,
/// not freed, so the handler never reads freed memory.
static IN_HANDLER: AtomicBool = AtomicBool::new(false);

fn register(path: &Path) -> Option<usize> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes()).ok()?.into_raw();
    for (i, slot) in PARTIALS.iter().enumerate() {
        if slot
            .compare_exchange(std::ptr::null_mut(), c, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Some(i);
        }
    }
    // SAFETY: `c` came from `CString::into_raw` above and was published nowhere.
    drop(unsafe { CString::from_raw(c) });
    None
}

fn unregister(i: usize) {
    let p = PARTIALS[i].swap(std::ptr::null_mut(), Ordering::SeqCst);
    if !p.is_null() && !IN_HANDLER.load(Ordering::SeqCst) {
        // SAFETY: `p` came from `CString::into_raw` in `register`, and the swap took it out
        // of the table; the handler, which reads the table, has not started (checked after
        // the swap, both SeqCst), so nothing else holds it.
        drop(unsafe { CString::from_raw(p) });
    }
}

/// The handler's action: unlink every partial being written. Async-signal-safe: atomics and
/// `unlink` only.
fn unlink_partials() {
    IN_HANDLER.store(true, Ordering::SeqCst);
    for slot in &PARTIALS {
        let p = slot.load(Ordering::SeqCst);
        if !p.is_null() {
            // SAFETY: a NUL-terminated string from `register`, never freed once the handler
            // has started (see `unregister`); `unlink` is async-signal-safe.
            unsafe { libc::unlink(p) };
        }
    }
}

struct Signals {
    /// True outside every [`InterruptScope`]: the signal's default action runs.
    outside_scope: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
    /// How many scopes are open now (threads may open them concurrently).
    active: Mutex<usize>,
}

fn signals() -> &'static Signals {
    static SIGNALS: OnceLock<Signals> = OnceLock::new();
    SIGNALS.get_or_init(|| {
        let s = Signals {
            outside_scope: Arc::new(AtomicBool::new(true)),
            interrupted: Arc::new(AtomicBool::new(false)),
            active: Mutex::new(0),
        };
        #[cfg(unix)]
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // Order matters: the partials go first, then (outside a scope) the default
            // action ends the process.
            // SAFETY: `unlink_partials` only touches atomics and calls `unlink`, both
            // async-signal-safe, and never panics.
            let _ = unsafe { signal_hook::low_level::register(sig, unlink_partials) };
            let _ = signal_hook::flag::register_conditional_default(sig, s.outside_scope.clone());
            let _ = signal_hook::flag::register(sig, s.interrupted.clone());
        }
        s
    })
}

/// Installs the SIGINT/SIGTERM handlers (once per process): partial files being written are
/// removed, then the signal's default action runs (outside an [`InterruptScope`]).
pub fn cleanup_on_interrupt() {
    signals();
}

/// Whether SIGINT or SIGTERM arrived since the first open [`InterruptScope`] was entered.
pub fn interrupted() -> bool {
    signals().interrupted.load(Ordering::SeqCst)
}

/// While alive, SIGINT and SIGTERM only set [`interrupted`] (and remove partials being
/// written): the work in the scope polls the flag and stops on its own.
pub struct InterruptScope(());

impl InterruptScope {
    pub fn enter() -> InterruptScope {
        let s = signals();
        let mut n = s.active.lock().unwrap_or_else(|e| e.into_inner());
        if *n == 0 {
            s.interrupted.store(false, Ordering::SeqCst);
            s.outside_scope.store(false, Ordering::SeqCst);
        }
        *n += 1;
        InterruptScope(())
    }
}

impl Drop for InterruptScope {
    fn drop(&mut self) {
        let s = signals();
        let mut n = s.active.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            s.outside_scope.store(true, Ordering::SeqCst);
        }
    }
}
