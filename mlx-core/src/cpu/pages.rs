//! Transparent huge pages for the weights a decode step streams.
//!
//! A decode step reads every weight once (SmolLM2-135M: ~97 MB a step, three times the L3),
//! and with 4 KB pages every 4 KB of it costs a TLB miss and a page walk, in a virtual machine
//! a two-dimensional one. The loader's buffers are ordinary heap memory, which Linux backs with
//! huge pages only where a range is advised (`transparent_hugepage=madvise`, the common
//! default). [`prefer_huge_pages`] advises the 2 MB-aligned interior of the weights' ranges
//! (`MADV_HUGEPAGE`) and collapses what is already there (`MADV_COLLAPSE`, Linux 6.1+). Both
//! are hints: the contents are unchanged, and where the kernel refuses, nothing changes.
//! Elsewhere than Linux this does nothing.

/// The huge page size Linux's transparent huge pages use on x86-64 and most arm64 kernels.
const HUGE: usize = 2 << 20;

/// Ranges closer than this are advised as one (the heap between two buffers is mapped).
const GAP: usize = 1 << 20;

/// The 2 MB-aligned ranges that cover `spans` (address ranges `[start, end)`, any order):
/// spans closer than [`GAP`] merged, each merged range's aligned interior, empty ones dropped.
pub(crate) fn huge_ranges(spans: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut s: Vec<(usize, usize)> = spans.iter().copied().filter(|(a, b)| b > a).collect();
    s.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (a, b) in s {
        match merged.last_mut() {
            Some(last) if a <= last.1.saturating_add(GAP) => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
        .into_iter()
        .filter_map(|(a, b)| {
            let a = a.checked_add(HUGE - 1)? & !(HUGE - 1);
            let b = b & !(HUGE - 1);
            (b > a).then_some((a, b))
        })
        .collect()
}

/// Advises the 2 MB-aligned interior of `spans` (the weights' buffers, [`super::Matrix::spans`])
/// for transparent huge pages and collapses the pages already there. Returns the bytes the
/// kernel accepted (0 where it refused, or off Linux). `MLX_CPU_HUGEPAGES=0` turns it off.
pub fn prefer_huge_pages(spans: &[(usize, usize)]) -> usize {
    if std::env::var("MLX_CPU_HUGEPAGES").is_ok_and(|v| v == "0") {
        return 0;
    }
    advise(&huge_ranges(spans))
}

#[cfg(target_os = "linux")]
fn advise(ranges: &[(usize, usize)]) -> usize {
    let mut done = 0;
    for &(a, b) in ranges {
        // SAFETY: `madvise` with these advice values changes no contents and no mapping's
        // protection: MADV_HUGEPAGE marks the range, MADV_COLLAPSE copies its pages into huge
        // pages transparently (the kernel keeps concurrent accesses correct). A range with
        // unmapped holes only fails (ENOMEM) for the holes.
        let ok = unsafe {
            libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) == 0
                && libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_COLLAPSE) == 0
        };
        if ok {
            done += b - a;
        }
    }
    done
}

#[cfg(not(target_os = "linux"))]
fn advise(_: &[(usize, usize)]) -> usize {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_close_spans_and_keep_aligned_interiors() {
        const M: usize = 1 << 20;
        // Two buffers 4 KB apart merge; a third far away stays apart; a small one is dropped.
        let spans = [
            (3 * M + 16, 5 * M),
            (5 * M + 4096, 9 * M + 8),
            (100 * M + 5, 101 * M),
            (40 * M, 44 * M),
        ];
        assert_eq!(huge_ranges(&spans), vec![(4 * M, 8 * M), (40 * M, 44 * M)]);
        assert!(huge_ranges(&[]).is_empty());
        assert!(huge_ranges(&[(7, 3)]).is_empty());
    }

    #[test]
    fn advising_a_buffer_keeps_its_contents() {
        let v: Vec<u64> = (0..(3 << 20) as u64).collect();
        let a = v.as_ptr() as usize;
        let _ = prefer_huge_pages(&[(a, a + v.len() * 8)]);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    }
}
