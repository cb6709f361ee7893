// LD_PRELOAD: function-level record of the code a run executes. At start every function entry
// listed in $FTRACE_SYMS (ELF vaddrs, hex, one a line) gets an int3; the first execution of each
// traps once, is recorded (first-execution order) and the original byte goes back. At exit
// the executed entries go to $FTRACE_OUT. The text stays writable for the run (tracing only).
#define _GNU_SOURCE
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
static uintptr_t lo, hi, bias;
static uintptr_t *addrs; static unsigned char *orig, *hit; static int n;
static int *order; static volatile int nhit;
static int find(uintptr_t a) { int l = 0, h = n - 1; while (l <= h) { int m = (l + h) / 2; if (addrs[m] == a) return m; if (addrs[m] < a) l = m + 1; else h = m - 1; } return -1; }
static void handler(int sig, siginfo_t *si, void *ucv) {
  ucontext_t *uc = ucv; uintptr_t a = uc->uc_mcontext.gregs[REG_RIP] - 1;
  int i = find(a);
  if (i < 0) { signal(sig, SIG_DFL); return; }
  *(volatile unsigned char *)a = orig[i];
  __builtin_ia32_mfence();
  uc->uc_mcontext.gregs[REG_RIP] = a;
  if (!__atomic_exchange_n(&hit[i], 1, __ATOMIC_SEQ_CST)) { int k = __atomic_fetch_add(&nhit, 1, __ATOMIC_SEQ_CST); order[k] = i; }
}
static int cb(struct dl_phdr_info *info, size_t sz, void *d) {
  if (info->dlpi_name && info->dlpi_name[0]) return 0;
  bias = info->dlpi_addr;
  for (int i = 0; i < info->dlpi_phnum; i++) { const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) { lo = (bias + ph->p_vaddr) & ~(uintptr_t)4095; hi = (bias + ph->p_vaddr + ph->p_memsz + 4095) & ~(uintptr_t)4095; } }
  return 1;
}
static int cmp(const void *x, const void *y) { uintptr_t a = *(uintptr_t *)x, b = *(uintptr_t *)y; return a < b ? -1 : a > b; }
__attribute__((constructor)) static void init(void) {
  const char *sf = getenv("FTRACE_SYMS"); if (!sf || !getenv("FTRACE_OUT")) return;
  dl_iterate_phdr(cb, 0);
  FILE *f = fopen(sf, "r"); if (!f) return;
  int cap = 1 << 18; addrs = malloc(cap * sizeof *addrs); unsigned long v;
  while (n < cap && fscanf(f, "%lx", &v) == 1) { uintptr_t a = bias + v; if (a >= lo && a < hi) addrs[n++] = a; }
  fclose(f);
  qsort(addrs, n, sizeof *addrs, cmp);
  int m = 0; for (int i = 0; i < n; i++) if (!m || addrs[m - 1] != addrs[i]) addrs[m++] = addrs[i]; n = m;
  orig = malloc(n); hit = calloc(n, 1); order = malloc(n * sizeof *order);
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = handler; sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGTRAP, &sa, 0);
  mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE | PROT_EXEC);
  for (int i = 0; i < n; i++) { orig[i] = *(unsigned char *)addrs[i]; *(unsigned char *)addrs[i] = 0xCC; }
}
__attribute__((destructor)) static void fini(void) {
  const char *o = getenv("FTRACE_OUT"); if (!o || !n) return;
  FILE *f = fopen(o, "w"); if (!f) return;
  fprintf(f, "# functions %d executed %d\n", n, nhit);
  for (int k = 0; k < nhit; k++) fprintf(f, "%lx\n", addrs[order[k]] - bias);
  fclose(f);
}
