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

/// The job as the workers see it: its lifetime erased. Only dereferenced by a worker counted
/// in `Shared::active` while the job is open, which `run` (holding the real borrow) waits
/// for before it returns.
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
    /// The generation of the job workers may still join (0: none). The caller closes it when
    /// its own share is done: a worker that wakes late (descheduled on a busy machine) then
    /// skips the job instead of making the caller wait for it. Jobs hand out work
    /// dynamically, so the workers that did join leave nothing undone.
    open: AtomicU64,
    /// Workers inside the current job.
    active: AtomicUsize,
    panicked: AtomicBool,
    /// Workers asleep on `wake` (counted under the lock before they wait): `run` signals
    /// the condition variable only when one is, so a decode step's runs, which find the
    /// workers spinning, make no system call.
    sleepers: AtomicUsize,
    /// The caller is asleep on `done` (set under the lock before it waits, SeqCst): the last
    /// worker out signals only then.
    caller_waits: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a thread panicked while holding it; the state it guards
        // (plain values) is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Polls before sleeping, for the workers waiting for a job and for the caller waiting for
/// the workers: the first [`pauses`] are pause instructions (~10-40 ns each), the next
/// [`YIELDS`] yield the core (on a machine with more runnable threads than cores, the thread
/// being waited for may need it), then the thread sleeps.
const YIELDS: u32 = 1_900;

/// The pause polls of a wait: `MLX_CPU_SPIN` (read once), else [`PAUSES`].
fn pauses() -> u32 {
    static P: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *P.get_or_init(|| {
        std::env::var("MLX_CPU_SPIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(PAUSES)
    })
}

/// The default pause polls: tens of microseconds, longer than the gaps between a decode
/// step's pool runs (the caller's norms, RoPE, attention merge: a few microseconds) and than
/// most gaps between steps. A yield there handed the core to any other runnable process for
/// its time slice (milliseconds under load), so the worker missed the next runs and the
/// caller did their work alone.
const PAUSES: u32 = 4_000;

/// One poll of a wait loop (see [`YIELDS`]).
#[inline]
fn poll(i: u32, pauses: u32) {
    if i < pauses {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

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
            open: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            caller_waits: AtomicBool::new(false),
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

    /// Calls `f(worker, workers)` on the caller (`worker` 0) and on each other worker that
    /// picks the job up before the caller's own call returns (`worker` in `1..workers`), and
    /// returns when all those calls have returned. So `f` must hand out its work dynamically
    /// (an atomic counter): a worker may not take part. A panic in any call is raised again
    /// here, after every call has returned.
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
        {
            let mut st = self.shared.lock();
            st.job = Some(ptr);
            st.generation += 1;
            self.shared.open.store(st.generation, Ordering::SeqCst);
            self.shared
                .generation
                .store(st.generation, Ordering::SeqCst);
        }
        // A worker about to sleep counted itself under the lock taken above, so it is seen.
        if self.shared.sleepers.load(Ordering::SeqCst) != 0 {
            self.shared.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        // Close the job, then wait for the workers that joined before it closed (they hold
        // `f`) before returning or unwinding. SeqCst on `open` and `active` here and in
        // `worker`: a worker either counted itself before the close (waited for here) or
        // sees the job closed.
        self.shared.open.store(0, Ordering::SeqCst);
        let mut spins = 0;
        let pauses = pauses();
        while self.shared.active.load(Ordering::SeqCst) != 0 && spins < pauses + YIELDS {
            poll(spins, pauses);
            spins += 1;
        }
        if self.shared.active.load(Ordering::SeqCst) != 0 {
            let mut st = self.shared.lock();
            // Set before the check (SeqCst both sides): the last worker either is seen
            // still active here or sees the flag and signals under the lock.
            self.shared.caller_waits.store(true, Ordering::SeqCst);
            while self.shared.active.load(Ordering::SeqCst) != 0 {
                st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            self.shared.caller_waits.store(false, Ordering::SeqCst);
        }
        self.shared.lock().job = None;
        let worker_panicked = self.shared.panicked.swap(false, Ordering::SeqCst);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if worker_panicked {
            panic!("a CPU kernel worker thread panicked");
        }
    }
}

fn worker(shared: &Shared, index: usize, threads: usize) {
    let mut seen = 0u64;
    let pauses = pauses();
    loop {
        let mut spins = 0;
        while shared.generation.load(Ordering::Acquire) == seen && spins < pauses + YIELDS {
            poll(spins, pauses);
            spins += 1;
        }
        let job = {
            let mut st = shared.lock();
            while st.generation == seen && !st.shutdown {
                shared.sleepers.fetch_add(1, Ordering::SeqCst);
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                shared.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            st.job
        };
        shared.active.fetch_add(1, Ordering::SeqCst);
        if shared.open.load(Ordering::SeqCst) == seen {
            if let Some(JobPtr(p)) = job {
                // SAFETY: the job of generation `seen` is still open and this worker is
                // counted in `active`, so `run` (which holds the real borrow) waits for this
                // call to return.
                let f = unsafe { &*p };
                if catch_unwind(AssertUnwindSafe(|| f(index, threads))).is_err() {
                    shared.panicked.store(true, Ordering::SeqCst);
                }
            }
        }
        if shared.active.fetch_sub(1, Ordering::SeqCst) == 1
            && shared.caller_waits.load(Ordering::SeqCst)
        {
            let _st = shared.lock();
            shared.done.notify_all();
        }
    }
}

const STEAL_FRONT: bool = true;

/// At most this many regions in a [`Regions`] (workers past it share regions).
pub const MAX_REGIONS: usize = 16;

/// One region's unclaimed blocks, `[front, back)` packed as `front << 32 | back`, on its own
/// cache line.
#[repr(align(64))]
#[derive(Default)]
struct Region(AtomicU64);

/// Blocks `0..blocks` of one pool run handed out so that each worker streams through a
/// contiguous region of them: worker `w` claims its region's blocks from the front in order,
/// then takes blocks from the back of the others' regions (the last to be reached). Against
/// one shared counter (blocks of the two workers interleaved): each worker's weight rows
/// form one sequential stream (its next block is the one its prefetches ran into), and a
/// claim touches a cache line its core holds instead of moving one between cores. Which
/// worker computes a block changes no result.
pub struct Regions {
    regions: [Region; MAX_REGIONS],
    n: usize,
}

impl Regions {
    /// `blocks` split into `min(workers, MAX_REGIONS)` regions of consecutive blocks (at
    /// least one; `blocks` below 2^32).
    pub fn new(blocks: usize, workers: usize) -> Regions {
        let n = workers.clamp(1, MAX_REGIONS);
        let regions: [Region; MAX_REGIONS] = Default::default();
        for (i, r) in regions.iter().take(n).enumerate() {
            let (lo, hi) = (blocks * i / n, blocks * (i + 1) / n);
            r.0.store(((lo as u64) << 32) | hi as u64, Ordering::Relaxed);
        }
        Regions { regions, n }
    }

    /// The next block for `worker`: its own region's next from the front, else one from the
    /// back of another region (`None`: every block is claimed).
    #[inline]
    pub fn claim(&self, worker: usize) -> Option<usize> {
        let own = worker % self.n;
        if let Some(b) = self.take(own, true) {
            return Some(b);
        }
        (1..self.n).find_map(|i| self.take((own + i) % self.n, STEAL_FRONT))
    }

    fn take(&self, r: usize, front: bool) -> Option<usize> {
        let a = &self.regions[r].0;
        let mut cur = a.load(Ordering::Relaxed);
        loop {
            let (lo, hi) = (cur >> 32, cur & 0xffff_ffff);
            if lo >= hi {
                return None;
            }
            let (new, got) = if front {
                (((lo + 1) << 32) | hi, lo)
            } else {
                ((lo << 32) | (hi - 1), hi - 1)
            };
            match a.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(got as usize),
                Err(c) => cur = c,
            }
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

    /// Work handed out through a counter is done exactly once whichever workers join; each
    /// worker runs a job at most once; a panic in a call reaches the caller (the pool stays
    /// usable).
    #[test]
    fn dynamic_work_is_done_once_per_job() {
        let pool = ThreadPool::new(3).unwrap();
        for round in 0..300 {
            let next = AtomicUsize::new(0);
            let done = AtomicUsize::new(0);
            let calls = [
                AtomicUsize::new(0),
                AtomicUsize::new(0),
                AtomicUsize::new(0),
            ];
            pool.run(&|w, n| {
                assert_eq!(n, 3);
                calls[w].fetch_add(1, Ordering::SeqCst);
                while next.fetch_add(1, Ordering::SeqCst) < 50 + round % 7 {
                    done.fetch_add(1, Ordering::SeqCst);
                }
            });
            assert_eq!(done.load(Ordering::SeqCst), 50 + round % 7);
            assert_eq!(calls[0].load(Ordering::SeqCst), 1);
            assert!(calls.iter().all(|c| c.load(Ordering::SeqCst) <= 1));
        }
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(&|_, _| panic!("boom"))));
        assert!(r.is_err());
        let after = AtomicUsize::new(0);
        pool.run(&|_, _| {
            after.fetch_add(1, Ordering::SeqCst);
        });
        assert!((1..=3).contains(&after.load(Ordering::SeqCst)));
    }

    /// Every block is claimed exactly once whichever workers take part, each worker's own
    /// region in order first.
    #[test]
    fn regions_hand_out_every_block_once() {
        let pool = ThreadPool::new(3).unwrap();
        for blocks in [0usize, 1, 2, 5, 31, 96, 1537] {
            for workers in [1usize, 2, 3, 20] {
                let r = Regions::new(blocks, workers);
                let seen: Vec<AtomicUsize> = (0..blocks).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|w, _| {
                    let mut last = None;
                    let own = w % workers.clamp(1, MAX_REGIONS);
                    let n = workers.clamp(1, MAX_REGIONS);
                    let (lo, hi) = (blocks * own / n, blocks * (own + 1) / n);
                    while let Some(b) = r.claim(w) {
                        seen[b].fetch_add(1, Ordering::SeqCst);
                        if (lo..hi).contains(&b) {
                            // Own blocks come in increasing order.
                            assert!(last.is_none_or(|l| l < b));
                            last = Some(b);
                        }
                    }
                });
                assert!(seen.iter().all(|c| c.load(Ordering::SeqCst) == 1));
                assert_eq!(r.claim(0), None);
            }
        }
    }

    /// Jobs that find the workers asleep (idle past their spin) still reach them, and a
    /// caller that finishes first waits for a slow worker (both paths signal only when
    /// someone sleeps).
    #[test]
    fn sleeping_workers_and_a_waiting_caller() {
        let pool = ThreadPool::new(2).unwrap();
        for round in 0..4 {
            std::thread::sleep(std::time::Duration::from_millis(30));
            let joined = AtomicUsize::new(0);
            let done = AtomicUsize::new(0);
            pool.run(&|w, _| {
                joined.fetch_add(1, Ordering::SeqCst);
                if w == 0 {
                    // Give the sleeping worker time to wake and join.
                    std::thread::sleep(std::time::Duration::from_millis(5));
                } else {
                    std::thread::sleep(std::time::Duration::from_millis(10 * round));
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
            assert_eq!(done.load(Ordering::SeqCst), joined.load(Ordering::SeqCst));
            assert!(joined.load(Ordering::SeqCst) >= 1);
        }
    }
}
