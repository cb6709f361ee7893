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
    raw_reset_peak_memory()
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
/// A mapping is left alone where it is writable, or where any of its pages is anonymous,
/// resident or swapped out (written since it was mapped: relocated read-only-after-relocation
/// data), since those pages' contents are not the file's. Linux only (`/proc/self/smaps`, `madvise`); elsewhere,
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
        for (start, end) in clean_file_mappings(&smaps) {
            // SAFETY: `start..end` is one whole mapping of a file, private, not writable, none
            // of whose pages is anonymous or swapped (the kernel's own account, just read;
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
    // The mapping being read (its range, where it qualifies so far) and whether its
    // `Anonymous` and `Swap` lines said 0.
    struct Cur {
        range: (usize, usize),
        anon_zero: Option<bool>,
        swap_zero: Option<bool>,
    }
    let mut out = Vec::new();
    let mut cur: Option<Cur> = None;
    fn finish(c: Option<Cur>, out: &mut Vec<(usize, usize)>) {
        if let Some(c) = c.filter(|c| c.anon_zero == Some(true) && c.swap_zero == Some(true)) {
            out.push(c.range);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
