// LD_PRELOAD: make the executable's text PROT_NONE at start; each first touch of a 4 KiB page
// faults once, is recorded (ELF vaddr, first-touch order) and the page is made r-x again.
// At exit the list goes to $TRACE_OUT. Exact page-level record of the code a run touches
// (no fault-around).
#define _GNU_SOURCE
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static uintptr_t lo, hi, bias;
static uintptr_t *pages; static volatile int npages; static int cap = 1 << 16;
static void handler(int sig, siginfo_t *si, void *uc) {
  uintptr_t a = (uintptr_t)si->si_addr;
  if (a >= lo && a < hi) {
    uintptr_t p = a & ~(uintptr_t)4095;
    mprotect((void *)p, 4096, PROT_READ | PROT_EXEC);
    int i = __atomic_fetch_add(&npages, 1, __ATOMIC_SEQ_CST);
    if (i < cap) pages[i] = p - bias;
    return;
  }
  signal(sig, SIG_DFL);
}
static int cb(struct dl_phdr_info *info, size_t sz, void *d) {
  if (info->dlpi_name && info->dlpi_name[0]) return 0; // main program has empty name
  bias = info->dlpi_addr;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
      lo = (bias + ph->p_vaddr) & ~(uintptr_t)4095;
      hi = (bias + ph->p_vaddr + ph->p_memsz + 4095) & ~(uintptr_t)4095;
    }
  }
  return 1;
}
__attribute__((constructor)) static void init(void) {
  if (!getenv("TRACE_OUT")) return;
  pages = mmap(0, cap * sizeof(uintptr_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  dl_iterate_phdr(cb, 0);
  struct sigaction sa; memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler; sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
  mprotect((void *)lo, hi - lo, PROT_NONE);
}
__attribute__((destructor)) static void fini(void) {
  const char *o = getenv("TRACE_OUT"); if (!o) return;
  FILE *f = fopen(o, "w"); if (!f) return;
  int n = npages < cap ? npages : cap;
  fprintf(f, "# text %lx-%lx (vaddr %lx-%lx) pages touched %d\n", lo, hi, lo - bias, hi - bias, n);
  for (int i = 0; i < n; i++) fprintf(f, "%lx\n", pages[i]);
  fclose(f);
}
