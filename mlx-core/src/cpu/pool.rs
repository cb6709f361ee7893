//! A persistent worker pool for the CPU kernels.
//!
//! Why not spawn threads (or a scoped pool) per call: a decode step runs ~200 matrix-vector
//! products, each of tens of microseconds; creating threads costs about as much as the work.
//! Here the workers live as long as the pool, wait for the next job spinning briefly (the next
//! job usually comes within microseconds) and then sleeping on a condition variable (so an idle
//! pool costs nothing), and the calling thread works as worker 0.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// A job borrowed for the length of one [`ThreadPool::run`]: `f(worker, workers)`.
type Job<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// The job as the workers see it: its lifetime erased. Only dereferenced between the
/// generation bump that publishes it and the `pending` count reaching zero, during which
/// `run` (which holds the real borrow) does not return.
#[derive(Clone, Copy)]
struct JobPtr(*const (dyn Fn(usize, usize) + Sync));

// SAFETY: the pointee is `Sync` (shared calls from several threads are fine) and outlives
// every use (see `JobPtr`).
unsafe impl Send for JobPtr {}

struct State {
    generation: u64,
    job: Option<JobPtr>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    done: Condvar,
    /// Mirrors `State::generation` for the workers' spin phase.
    generation: AtomicU64,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    panicked: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a thread panicked while holding it; the state it guards
        // (plain values) is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Spin iterations before sleeping, for the workers waiting for a job and for the caller
/// waiting for the workers (each iteration is one pause instruction, ~10-40 ns).
const SPIN: u32 = 4_000;

/// A fixed set of worker threads running one job at a time on all of them.
pub struct ThreadPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    threads: usize,
    /// One `run` at a time (the state holds one job).
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadPool({} threads)", self.threads)
    }
}

/// The number of hardware threads this process may use (1 when unknown).
pub fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl ThreadPool {
    /// A pool of `threads` workers in all, the caller included (`threads - 1` are spawned;
    /// 0 is taken as 1). Fails only when the OS refuses a thread.
    pub fn new(threads: usize) -> crate::Result<ThreadPool> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                job: None,
                shutdown: false,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
            generation: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
        });
        let mut pool = ThreadPool {
            shared: shared.clone(),
            handles: Vec::new(),
            threads,
            run_lock: Mutex::new(()),
        };
        for index in 1..threads {
            let shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("mlx-cpu-{index}"))
                .spawn(move || worker(&shared, index, threads))
                .map_err(|e| crate::Error::invalid("ThreadPool::new", e.to_string()))?;
            // On an early return the pool's Drop stops the threads spawned so far.
            pool.handles.push(handle);
        }
        Ok(pool)
    }

    /// Workers in all, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Calls `f(worker, workers)` once on every worker (`worker` in `0..workers`; the caller
    /// is worker 0) and returns when all calls have returned. A panic in any call is raised
    /// again here, after every worker has finished.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        let _one = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let job: Job<'_> = f;
        // SAFETY: a lifetime-only transmute of a fat reference to a raw pointer; see JobPtr.
        let ptr = JobPtr(unsafe {
            std::mem::transmute::<Job<'_>, *const (dyn Fn(usize, usize) + Sync + 'static)>(job)
        });
        self.shared.pending.store(n - 1, Ordering::SeqCst);
        {
            let mut st = self.shared.lock();
            st.job = Some(ptr);
            st.generation += 1;
            self.shared
                .generation
                .store(st.generation, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        // Wait for every worker before returning (or unwinding): they hold `f`.
        let mut spins = 0;
        while self.shared.pending.load(Ordering::Acquire) != 0 && spins < SPIN {
            std::hint::spin_loop();
            spins += 1;
        }
        if self.shared.pending.load(Ordering::Acquire) != 0 {
            let mut st = self.shared.lock();
            while self.shared.pending.load(Ordering::Acquire) != 0 {
                st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
        self.shared.lock().job = None;
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if self.shared.panicked.swap(false, Ordering::SeqCst) {
            panic!("a CPU kernel worker thread panicked");
        }
    }
}

fn worker(shared: &Shared, index: usize, threads: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0;
        while shared.generation.load(Ordering::Acquire) == seen && spins < SPIN {
            std::hint::spin_loop();
            spins += 1;
        }
        let job = {
            let mut st = shared.lock();
            while st.generation == seen && !st.shutdown {
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            st.job
        };
        if let Some(JobPtr(p)) = job {
            // SAFETY: `run` published this job for generation `seen` and does not return
            // before `pending` reaches zero, which needs this worker's decrement below.
            let f = unsafe { &*p };
            if catch_unwind(AssertUnwindSafe(|| f(index, threads))).is_err() {
                shared.panicked.store(true, Ordering::SeqCst);
            }
        }
        if shared.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _st = shared.lock();
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every worker runs each job once, jobs run one after another, and a panic in a worker
    /// reaches the caller after the others finished (the pool stays usable).
    #[test]
    fn runs_every_worker_once_per_job() {
        let pool = ThreadPool::new(3).unwrap();
        let hits = AtomicUsize::new(0);
        for round in 0..200 {
            pool.run(&|w, n| {
                assert_eq!(n, 3);
                hits.fetch_add(1 + w * 10, Ordering::SeqCst);
            });
            assert_eq!(hits.load(Ordering::SeqCst), (round + 1) * 33);
        }
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|w, _| {
                if w == 2 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let after = AtomicUsize::new(0);
        pool.run(&|_, _| {
            after.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(after.load(Ordering::SeqCst), 3);
    }
}
