//! MLX's allocator: active, peak and cache memory, limits.

use mlx_sys as sys;

use crate::error::Result;
use crate::ffi::{check, value_out};

/// Bytes held by live arrays.
pub fn active_memory() -> Result<usize> {
    // SAFETY: plain out value.
    value_out("get_active_memory", |o| unsafe {
        sys::mlxs_get_active_memory(o)
    })
}

/// MLX's own peak counter (since start, its last reset or the last [`restart_peak_window`]).
fn raw_peak_memory() -> Result<usize> {
    // SAFETY: plain out value.
    value_out("get_peak_memory", |o| unsafe {
        sys::mlxs_get_peak_memory(o)
    })
}

fn raw_reset_peak_memory() -> Result<()> {
    // SAFETY: no arguments.
    check("reset_peak_memory", unsafe {
        sys::mlxs_reset_peak_memory()
    })
}

/// The peak MLX's counter had reached when [`restart_peak_window`] last reset it (0 after
/// [`reset_peak_memory`]): [`peak_memory`] stays the process's peak across windows.
static EARLIER_PEAK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The most bytes held at once since start or the last [`reset_peak_memory`].
pub fn peak_memory() -> Result<usize> {
    Ok(raw_peak_memory()?.max(EARLIER_PEAK.load(std::sync::atomic::Ordering::Relaxed)))
}

pub fn reset_peak_memory() -> Result<()> {
    EARLIER_PEAK.store(0, std::sync::atomic::Ordering::Relaxed);
    DEVICE_PEAK.store(0, std::sync::atomic::Ordering::Relaxed);
    raw_reset_peak_memory()
}

/// The most device bytes a caller noted as held at once, MLX's and its own outside MLX's
/// allocator together ([`note_device_peak`]); 0 after [`reset_peak_memory`].
static DEVICE_PEAK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Notes `bytes` held on the device at once by MLX's allocator and memory outside it (the
/// graph decoder's own buffers), for [`device_peak_memory`].
pub fn note_device_peak(bytes: usize) {
    DEVICE_PEAK.fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// The process's device peak since start or the last [`reset_peak_memory`], as mlx-lm
/// reports `mx.get_peak_memory()` (the process's, never per generation): MLX's
/// [`peak_memory`], or the largest [`note_device_peak`] where memory outside MLX's allocator
/// made that more.
pub fn device_peak_memory() -> Result<usize> {
    Ok(peak_memory()?.max(DEVICE_PEAK.load(std::sync::atomic::Ordering::Relaxed)))
}

/// Starts a new peak window: returns the most bytes held at once in the window that ends
/// (since the previous restart, reset or start), and the bytes live now, the floor of the
/// new window's peak. [`peak_memory`] is unchanged: the process's peak is kept across
/// windows. A window is what a caller that holds device memory outside MLX's allocator for
/// part of a run (the graph decoder's cache) needs to add its bytes only to the peak of the
/// time it held them. One window at a time in a process: a restart by another thread cuts the
/// current window short (its peak is then too low).
pub fn restart_peak_window() -> Result<(usize, usize)> {
    let ended = raw_peak_memory()?;
    EARLIER_PEAK.fetch_max(ended, std::sync::atomic::Ordering::Relaxed);
    let live = active_memory()?;
    raw_reset_peak_memory()?;
    Ok((ended, live))
}

/// The most bytes held at once since the last [`restart_peak_window`] (or reset, or start);
/// `floor` is what [`restart_peak_window`] returned as live then (MLX's counter starts again
/// from 0 and rises only with the next allocation).
pub fn window_peak(floor: usize) -> Result<usize> {
    Ok(raw_peak_memory()?.max(floor))
}

/// Bytes kept in MLX's buffer cache for reuse.
pub fn cache_memory() -> Result<usize> {
    // SAFETY: plain out value.
    value_out("get_cache_memory", |o| unsafe {
        sys::mlxs_get_cache_memory(o)
    })
}

pub fn memory_limit() -> Result<usize> {
    // SAFETY: plain out value.
    value_out("get_memory_limit", |o| unsafe {
        sys::mlxs_get_memory_limit(o)
    })
}

/// Sets the memory limit; returns the previous one.
pub fn set_memory_limit(limit: usize) -> Result<usize> {
    // SAFETY: plain values.
    value_out("set_memory_limit", |o| unsafe {
        sys::mlxs_set_memory_limit(o, limit)
    })
}

/// Sets the buffer-cache limit; returns the previous one.
pub fn set_cache_limit(limit: usize) -> Result<usize> {
    // SAFETY: plain values.
    value_out("set_cache_limit", |o| unsafe {
        sys::mlxs_set_cache_limit(o, limit)
    })
}

/// Sets the wired-memory limit (Metal only; an error elsewhere); returns the previous one.
pub fn set_wired_limit(limit: usize) -> Result<usize> {
    // SAFETY: plain values.
    value_out("set_wired_limit", |o| unsafe {
        sys::mlxs_set_wired_limit(o, limit)
    })
}

/// Frees the buffers held in the cache.
pub fn clear_cache() -> Result<()> {
    // SAFETY: no arguments.
    check("clear_cache", unsafe { sys::mlxs_clear_cache() })
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" {
    fn malloc_trim(pad: usize) -> std::os::raw::c_int;
}

/// Hands memory nobody holds back to the operating system: MLX's buffer cache
/// ([`clear_cache`]), then, with glibc, the free pages inside every `malloc` arena and the top
/// of the main one (`malloc_trim(0)`). MLX's CPU allocator is plain `malloc`, and glibc keeps
/// freed blocks below its (adaptive) mmap threshold in its arenas, so without the trim a
/// process keeps much of the peak of one large computation resident long after the arrays
/// are gone. (The free top of a thread's arena stays, up to glibc's trim threshold.) Returns
/// whether the trim released anything (always `false` without glibc).
pub fn release_free_memory() -> Result<bool> {
    clear_cache()?;
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` takes a plain size, touches only the allocator's own state
        // under its own locks, and is safe to call from any thread at any time.
        let released = unsafe { malloc_trim(0) };
        Ok(released != 0)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        Ok(false)
    }
}

/// Whether [`release_file_pages`] acts in this process ([`allow_file_page_release`]).
static FILE_PAGE_RELEASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lets [`release_file_pages`] act in this process; off by default, so a library user's
/// program, whose other threads may map and unmap memory at any time, never has it. A program
/// that knows no other thread maps or unmaps where it calls it turns it on (`mlx generate`).
pub fn allow_file_page_release(on: bool) {
    FILE_PAGE_RELEASE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Unmaps the process's resident pages of read-only file mappings (the code and read-only
/// data of the binary and its libraries) that hold nothing but the file's own bytes: what a
/// later access needs comes back from the page cache on its first touch (a minor fault), as
/// after the kernel reclaims them. Once a run's loading and prompt are done, the pages only
/// they touched (the loaders, the tokenizer build, the prompt kernels: 3-4 MiB, each touch
/// mapping a 64 KiB window) stop counting in the resident set for the rest of the run (issue
/// #31's peak memory), while the decode steps' own code comes back at their first touch.
/// A mapping is left alone where it is writable or has a page swapped out. Where some of its
/// pages are anonymous (written since it was mapped: relocated read-only-after-relocation
/// data, `.data.rel.ro` and `.got`), only the runs of its pages that `/proc/self/pagemap`
/// shows present and file-backed are advised: the anonymous ones' contents are not the
/// file's. Linux only (`/proc/self/smaps`, `madvise`); elsewhere,
/// where `/proc` cannot be read, or with `MLX_KEEP_FILE_PAGES=1` in the environment, it does
/// nothing. Returns the bytes of the mappings advised (their whole size, resident or not).
/// It does nothing unless the program allowed it ([`allow_file_page_release`]).
///
/// Call it only where no other thread maps or unmaps memory between the `/proc/self/smaps`
/// read and the advice (`mlx generate` calls it after loading and after the prompt, with the
/// CPU decoder's workers parked and MLX's streams idle): a range unmapped and mapped again as
/// anonymous memory in that window would lose its contents to `MADV_DONTNEED`.
pub fn release_file_pages() -> usize {
    if !FILE_PAGE_RELEASE.load(std::sync::atomic::Ordering::Relaxed) {
        return 0;
    }
    #[cfg(target_os = "linux")]
    {
        if std::env::var_os("MLX_KEEP_FILE_PAGES").is_some_and(|v| v == "1") {
            return 0;
        }
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return 0;
        };
        let mut advised = 0;
        // In a relocated read-only mapping, the runs of pages that are still the file's
        // (`/proc/self/pagemap`: present and file-backed; a relocated page is anonymous, a
        // page not present is left alone).
        let mut runs = Vec::new();
        // The pagemap reads count in 4 KiB pages (`PAGE`): on a kernel of larger pages (arm64
        // with 16 or 64 KiB) they are skipped, not misread.
        // SAFETY: sysconf reads one of the system's constants; it takes no pointers.
        let page_4k = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } == PAGE as libc::c_long;
        let pagemap = if page_4k {
            std::fs::File::open("/proc/self/pagemap").ok()
        } else {
            None
        };
        if let Some(pagemap) = pagemap {
            use std::os::unix::fs::FileExt;
            for (start, end) in relocated_file_mappings(&smaps) {
                let pages = (end - start) / PAGE;
                let mut raw = vec![0u8; pages * 8];
                if pagemap
                    .read_exact_at(&mut raw, (start / PAGE * 8) as u64)
                    .is_err()
                {
                    continue;
                }
                let entries: Vec<u64> = raw
                    .chunks_exact(8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                    .collect();
                runs.extend(file_page_runs(start, &entries));
            }
        }
        for (start, end) in clean_file_mappings(&smaps).into_iter().chain(runs) {
            // SAFETY: `start..end` is one whole mapping of a file, private, not writable, none
            // of whose pages is anonymous or swapped, or a run of such a mapping's pages each
            // present and file-backed (the kernel's own account, just read;
            // nothing writes a read-only mapping in between): its resident
            // pages equal the file's bytes, so dropping them changes no byte any access
            // reads (each comes back from the file at its next touch); `MADV_DONTNEED` on
            // such a range neither frees memory anything owns nor unmaps the range.
            let r = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
            };
            if r == 0 {
                advised += end - start;
            }
        }
        advised
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// The `(start, end)` of each mapping in a `/proc/PID/smaps` text that is private, readable,
/// not writable, backed by a file (a path, not `[vdso]` and the like) and has no anonymous
/// page, resident or swapped out (`Anonymous: 0 kB` and `Swap: 0 kB`); device files
/// (`/dev/...`) are left out, as is a mapping whose record lacks either line or cannot be read.
pub fn clean_file_mappings(smaps: &str) -> Vec<(usize, usize)> {
    read_file_mappings(smaps, true)
}

/// The `(start, end)` of each mapping in a `/proc/PID/smaps` text that qualifies as in
/// [`clean_file_mappings`] but for holding anonymous pages (`Anonymous` above 0, `Swap: 0 kB`):
/// read-only data the dynamic linker relocated in part (`.data.rel.ro` and `.got` after
/// `RELRO`), whose other pages are still the file's.
pub fn relocated_file_mappings(smaps: &str) -> Vec<(usize, usize)> {
    read_file_mappings(smaps, false)
}

fn read_file_mappings(smaps: &str, clean: bool) -> Vec<(usize, usize)> {
    // The mapping being read (its range, where it qualifies so far) and whether its
    // `Anonymous` and `Swap` lines said 0.
    struct Cur {
        range: (usize, usize),
        anon_zero: Option<bool>,
        swap_zero: Option<bool>,
    }
    let mut out = Vec::new();
    let mut cur: Option<Cur> = None;
    let finish = |c: Option<Cur>, out: &mut Vec<(usize, usize)>| {
        if let Some(c) = c.filter(|c| c.anon_zero == Some(clean) && c.swap_zero == Some(true)) {
            out.push(c.range);
        }
    };
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let head = f.next().unwrap_or("");
        if !head.ends_with(':') {
            // A mapping's first line (`start-end perms offset dev inode [path]`).
            finish(cur.take(), &mut out);
            let Some((a, b)) = head.split_once('-') else {
                continue;
            };
            let perms = f.next().unwrap_or("");
            let path = f.nth(3).unwrap_or("");
            let range = usize::from_str_radix(a, 16)
                .ok()
                .zip(usize::from_str_radix(b, 16).ok())
                .filter(|(s, e)| s < e);
            let p = perms.as_bytes();
            let qualifies = p.len() == 4
                && p[0] == b'r'
                && p[1] == b'-'
                && p[3] == b'p'
                && path.starts_with('/')
                && !path.starts_with("/dev/");
            cur = range.filter(|_| qualifies).map(|range| Cur {
                range,
                anon_zero: None,
                swap_zero: None,
            });
        } else if let Some(c) = cur.as_mut() {
            let zero = f.next() == Some("0");
            match head {
                "Anonymous:" => c.anon_zero = Some(zero),
                "Swap:" => c.swap_zero = Some(zero),
                _ => {}
            }
        }
    }
    finish(cur.take(), &mut out);
    out
}

/// The page size `release_file_pages` reads `/proc/self/pagemap` in (x86-64 and most arm64
/// Linux kernels; on others that read is skipped).
#[cfg(target_os = "linux")]
const PAGE: usize = 4096;

/// The `(start, end)` runs of pages, from the mapping at `start` whose `/proc/PID/pagemap`
/// entries are `entries` (one a page), that are present (bit 63), file-backed (bit 61) and not
/// swapped (bit 62).
#[cfg(target_os = "linux")]
fn file_page_runs(start: usize, entries: &[u64]) -> Vec<(usize, usize)> {
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const FILE: u64 = 1 << 61;
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, &e) in entries.iter().enumerate() {
        if e & (PRESENT | SWAPPED | FILE) != PRESENT | FILE {
            continue;
        }
        let a = start + i * PAGE;
        match out.last_mut() {
            Some(last) if last.1 == a => last.1 = a + PAGE,
            _ => out.push((a, a + PAGE)),
        }
    }
    out
}

/// Element types whose all-zero bit pattern is the value zero, so that fresh zero pages hold
/// valid elements (`u16`, `f32`, `half::f16`, `half::bf16`).
pub trait ZeroBits: Copy + Send + Sync + 'static + private::Sealed {}

mod private {
    pub trait Sealed {}
}

macro_rules! zero_bits {
    ($($t:ty),*) => {$(
        impl private::Sealed for $t {}
        impl ZeroBits for $t {}
    )*};
}
zero_bits!(u16, f32, half::f16, half::bf16);

/// A buffer of `len` elements that start as zero, on pages taken fresh from the operating
/// system (an anonymous private mapping on Linux, for buffers of at least
/// [`ZeroedBuf::MAP_MIN_BYTES`]): a page costs resident memory only once something writes it,
/// whatever the allocator did before. `vec![0; n]` (`calloc`) has that only where `malloc`
/// carves the block from memory the system just gave it; a block reused from freed memory (the
/// holes a model's loading leaves between its weights) is cleared page by page, so the whole
/// buffer is resident at once. A KV cache sized for prompt plus generation then costs the
/// positions it has filled, not its capacity (issue #31's peak memory). Smaller buffers, a
/// failed mapping, and other systems use a `Vec`. Dereferences to `[T]`.
pub struct ZeroedBuf<T: ZeroBits> {
    inner: Zeroed<T>,
}

enum Zeroed<T> {
    Heap(Vec<T>),
    /// `len` elements at `ptr`, in a private anonymous mapping of `bytes` bytes this buffer
    /// owns.
    #[cfg(target_os = "linux")]
    Mapped {
        ptr: std::ptr::NonNull<T>,
        len: usize,
        bytes: usize,
    },
}

// SAFETY: a `Mapped` buffer owns its mapping exclusively (as a `Vec` owns its block: nothing
// else holds the pointer), and `T` is `Send + Sync`; shared access gives `&[T]` only.
unsafe impl<T: ZeroBits> Send for ZeroedBuf<T> {}
// SAFETY: as for `Send`: `&ZeroedBuf` gives out `&[T]` only.
unsafe impl<T: ZeroBits> Sync for ZeroedBuf<T> {}

impl<T: ZeroBits> ZeroedBuf<T> {
    /// Buffers from this size up are mapped (below it a page-sized `calloc` is cheaper and
    /// leaves nothing untouched to gain).
    pub const MAP_MIN_BYTES: usize = 64 << 10;

    /// `len` zeros.
    pub fn new(len: usize) -> ZeroedBuf<T> {
        ZeroedBuf {
            inner: Self::map(len).unwrap_or_else(|| Zeroed::Heap(Self::heap_zeros(len))),
        }
    }

    fn heap_zeros(len: usize) -> Vec<T> {
        let mut v = Vec::with_capacity(len);
        // SAFETY: `T: ZeroBits` is valid as all-zero bits, and the `len` elements were
        // reserved just above.
        unsafe {
            std::ptr::write_bytes(v.as_mut_ptr(), 0, len);
            v.set_len(len);
        }
        v
    }

    #[cfg(target_os = "linux")]
    fn map(len: usize) -> Option<Zeroed<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        if bytes < Self::MAP_MIN_BYTES {
            return None;
        }
        // SAFETY: a new private anonymous mapping (no address asked for, no file): it aliases
        // nothing, and the kernel gives its pages as zeros at their first touch.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // Page-aligned, so aligned for any `T` here.
        let ptr = std::ptr::NonNull::new(p.cast::<T>())?;
        Some(Zeroed::Mapped { ptr, len, bytes })
    }

    #[cfg(not(target_os = "linux"))]
    fn map(_len: usize) -> Option<Zeroed<T>> {
        None
    }

    /// Whether the buffer is on its own mapping (else on the heap).
    pub fn is_mapped(&self) -> bool {
        !matches!(self.inner, Zeroed::Heap(_))
    }
}

impl<T: ZeroBits> std::ops::Deref for ZeroedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.inner {
            Zeroed::Heap(v) => v,
            // SAFETY: `ptr` points to `len` initialized (zero or written) elements of a
            // mapping this buffer owns for its whole life.
            #[cfg(target_os = "linux")]
            Zeroed::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: ZeroBits> std::ops::DerefMut for ZeroedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.inner {
            Zeroed::Heap(v) => v,
            // SAFETY: as for `deref`, and `&mut self` makes this the only access.
            #[cfg(target_os = "linux")]
            Zeroed::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: ZeroBits> Clone for ZeroedBuf<T> {
    fn clone(&self) -> ZeroedBuf<T> {
        let mut c = ZeroedBuf::new(self.len());
        c.copy_from_slice(self);
        c
    }
}

impl<T: ZeroBits> Drop for ZeroedBuf<T> {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Zeroed::Mapped { ptr, bytes, .. } = &self.inner {
            // SAFETY: the mapping of `bytes` at `ptr` is this buffer's own, made by `map`, and
            // nothing refers to it once the buffer is dropped.
            unsafe {
                libc::munmap(ptr.as_ptr().cast(), *bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of present file pages; anonymous, swapped and absent pages split them.
    #[cfg(target_os = "linux")]
    #[test]
    fn file_page_runs_keep_present_file_pages() {
        let (p, s, f) = (1u64 << 63, 1u64 << 62, 1u64 << 61);
        let e = [p | f, p | f, p, 0, p | f, s | f, f, p | f | 5];
        assert_eq!(
            file_page_runs(0x10000, &e),
            vec![(0x10000, 0x12000), (0x14000, 0x15000), (0x17000, 0x18000)]
        );
        assert!(file_page_runs(0, &[]).is_empty());
    }

    /// A relocated read-only mapping (anonymous pages) is read apart from the clean ones.
    #[test]
    fn relocated_file_mappings_reads_smaps() {
        let smaps = "1000-3000 r--p 00000000 fd:00 42 /usr/lib/libx.so\nAnonymous: 4 kB\nSwap: 0 kB\n\
                     3000-5000 r--p 00000000 fd:00 42 /usr/lib/libx.so\nAnonymous: 0 kB\nSwap: 0 kB\n\
                     5000-7000 rw-p 00000000 fd:00 42 /usr/lib/libx.so\nAnonymous: 4 kB\nSwap: 0 kB\n\
                     7000-9000 r--p 00000000 fd:00 42 /usr/lib/libx.so\nAnonymous: 4 kB\nSwap: 4 kB\n";
        assert_eq!(relocated_file_mappings(smaps), vec![(0x1000, 0x3000)]);
        assert_eq!(clean_file_mappings(smaps), vec![(0x3000, 0x5000)]);
    }

    /// Zeros at first, writable, cloned equal, on a mapping from `MAP_MIN_BYTES` up (Linux)
    /// and on the heap below; a mapped buffer's untouched pages are not resident.
    #[test]
    fn zeroed_buf_starts_zero_and_maps_large_buffers() {
        for len in [0usize, 1, 1000, 40_000, 300_000] {
            let mut b = ZeroedBuf::<f32>::new(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0.0));
            if len > 0 {
                b[len - 1] = 2.5;
                b[0] = -1.0;
            }
            let c = b.clone();
            assert_eq!(&c[..], &b[..]);
            let big = len * 4 >= ZeroedBuf::<f32>::MAP_MIN_BYTES;
            assert_eq!(b.is_mapped(), cfg!(target_os = "linux") && big, "{len}");
            assert_eq!(c.is_mapped(), b.is_mapped());
        }
        let h = ZeroedBuf::<half::f16>::new(70_000);
        assert!(h.iter().all(|x| x.to_bits() == 0));
        #[cfg(target_os = "linux")]
        {
            // 64 MiB written in its first page only: far below it resident (the kernel's
            // own count of the mapping's pages, `mincore`).
            let mut m = ZeroedBuf::<u16>::new(32 << 20);
            m[0] = 7;
            let pages = (m.len() * 2).div_ceil(4096);
            let mut vec = vec![0u8; pages];
            // SAFETY: `m` is one mapping of `pages` pages; `vec` has a byte for each.
            let r = unsafe { libc::mincore(m.as_ptr() as *mut _, m.len() * 2, vec.as_mut_ptr()) };
            assert_eq!(r, 0);
            let resident = vec.iter().filter(|&&v| v & 1 == 1).count();
            assert!(resident < pages / 8, "{resident} of {pages} pages resident");
            assert_eq!(m[0], 7);
        }
    }

    /// Only private, read-only, file-backed mappings without an anonymous page qualify.
    #[test]
    fn clean_file_mappings_reads_smaps() {
        let rec = |range: &str, perms: &str, path: &str, anon: u32| {
            format!(
                "{range} {perms} 00000000 fd:00 42 {path}\nSize: 8 kB\nRss: 4 kB\n\
                 Anonymous: {anon} kB\nAnonHugePages: 0 kB\nSwap: {swap} kB\nVmFlags: rd mr\n",
                swap = if path.ends_with("swapped") { 4 } else { 0 }
            )
        };
        let smaps = [
            rec("1000-3000", "r-xp", "/usr/lib/libx.so", 0),
            rec("3000-4000", "r--p", "/usr/lib/libx.so", 4),
            rec("4000-5000", "rw-p", "/usr/lib/libx.so", 0),
            rec("5000-6000", "r--s", "/usr/lib/libx.so", 0),
            rec("6000-7000", "r--p", "[vdso]", 0),
            rec("7000-8000", "r--p", "", 0),
            rec("8000-9000", "r--p", "/dev/zero", 0),
            rec("9000-b000", "r--p", "/opt/m (deleted)", 0),
            rec("b000-c000", "r--p", "/opt/swapped", 0),
            "zz-yy r--p 0 0:0 0 /x\nAnonymous: 0 kB\nSwap: 0 kB\n".to_string(),
            "c000-d000 r--p 0 0:0 0 /no-anonymous-line\nSwap: 0 kB\n".to_string(),
            "d000-e000 r--p 0 0:0 0 /no-swap-line\nAnonymous: 0 kB\n".to_string(),
            rec("e000-f000", "r-xp", "/usr/lib/liby.so", 0),
        ]
        .concat();
        assert_eq!(
            clean_file_mappings(&smaps),
            vec![(0x1000, 0x3000), (0x9000, 0xb000), (0xe000, 0xf000)]
        );
    }

    /// Dropping the clean file pages changes nothing the process reads: its own code and
    /// read-only data come back at their next touch.
    #[test]
    fn release_file_pages_keeps_the_process_running() {
        // Not allowed (the default, as in a library user's program): nothing is advised. The
        // test harness's other threads map and unmap memory, so the advice itself is left to
        // `mlx generate`'s runs (the CLI's tests).
        assert_eq!(release_file_pages(), 0);
        #[cfg(target_os = "linux")]
        if let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") {
            // The process's own code is a clean file mapping it would advise.
            let _ = clean_file_mappings(&smaps);
        }
    }
}
