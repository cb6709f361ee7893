// A small CUDA runtime beside MLX (see mlxs/gpurt.h): the driver API and NVRTC through dlopen,
// so that nothing here needs CUDA headers or libraries at build time.
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>
#include <optional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "internal.hpp"

using namespace mlxs;

namespace {

// The few driver types and constants used here (their ABI is stable across CUDA versions).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUgraph = void*;
using CUgraphExec = void*;
using CUevent = void*;
using nvrtcResult = int;

// cuLaunchKernelEx's configuration (cuda.h, CUDA >= 12): one attribute is used,
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (6), an int in a 64-byte union.
struct LaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int programmatic_stream_serialization_allowed;
  } value;
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");
struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
  void* stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};
constexpr int kAttrProgrammaticStreamSerialization = 6;
using nvrtcProgram = void*;

// cuMemcpy2DAsync's description of a copy (cuda.h's CUDA_MEMCPY2D, unchanged since CUDA 3.2).
struct Memcpy2D {
  size_t srcXInBytes, srcY;
  int srcMemoryType;
  const void* srcHost;
  CUdeviceptr srcDevice;
  void* srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  int dstMemoryType;
  void* dstHost;
  CUdeviceptr dstDevice;
  void* dstArray;
  size_t dstPitch;
  size_t WidthInBytes, Height;
};
static_assert(sizeof(Memcpy2D) == 128, "CUDA_MEMCPY2D is 128 bytes");
// CUDA's virtual memory management (cuda.h, unchanged since CUDA 10.2): CUmemLocation,
// CUmemAllocationProp, CUmemAccessDesc.
using CUmemGenericAllocationHandle = unsigned long long;
struct MemLocation {
  int type;  // CUmemLocationType
  int id;
};
struct MemAllocationProp {
  int type;                  // CUmemAllocationType
  int requestedHandleTypes;  // CUmemAllocationHandleType
  MemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
static_assert(sizeof(MemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
struct MemAccessDesc {
  MemLocation location;
  int flags;  // CUmemAccess_flags
};
static_assert(sizeof(MemAccessDesc) == 12, "CUmemAccessDesc is 12 bytes");
constexpr int kMemAllocationTypePinned = 1;    // CU_MEM_ALLOCATION_TYPE_PINNED
constexpr int kMemLocationTypeDevice = 1;      // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kMemAccessReadWrite = 3;         // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
constexpr int kMemGranularityMinimum = 0;      // CU_MEM_ALLOC_GRANULARITY_MINIMUM

constexpr int kMemoryTypeDevice = 2;   // CU_MEMORYTYPE_DEVICE
constexpr int kMemoryTypeUnified = 4;  // CU_MEMORYTYPE_UNIFIED: any address of the process

constexpr int kAttrCcMajor = 75;            // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrCcMinor = 76;            // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr int kAttrSmCount = 16;            // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: a driver may export the VMM entry
// points for a device (or a vGPU/WSL setup) that refuses them.
constexpr int kAttrVmmSupported = 102;
constexpr int kFuncMaxDynamicShared = 8;    // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kFuncCarveout = 9;            // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
constexpr int kCaptureThreadLocal = 1;      // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
constexpr unsigned kEventDisableTiming = 2; // CU_EVENT_DISABLE_TIMING
constexpr size_t kSlotBytes = 1 << 20;
constexpr size_t kSlots = 16;

struct Driver {
  void* lib = nullptr;
  std::string error;
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*cuFuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*);  // CUDA >= 12.4
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemAllocHost)(void**, size_t);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuMemcpy2DAsync)(const Memcpy2D*, CUstream);
  // Virtual memory management (optional: without it a parkable region is plain memory).
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const MemAllocationProp*, int) = nullptr;
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                  unsigned long long) = nullptr;
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, size_t, const MemAllocationProp*,
                          unsigned long long) = nullptr;
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long) = nullptr;
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const MemAccessDesc*, size_t) = nullptr;
  bool vmm() const {
    return cuMemGetAllocationGranularity && cuMemAddressReserve && cuMemAddressFree &&
           cuMemCreate && cuMemRelease && cuMemMap && cuMemUnmap && cuMemSetAccess;
  }
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuLaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**);  // optional
  CUresult (*cuStreamBeginCapture)(CUstream, int);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
};

struct Nvrtc {
  void* lib = nullptr;
  std::string error;
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int,
                                    const char* const*, const char* const*);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
  const char* (*nvrtcGetErrorString)(nvrtcResult);
  // Optional: part of the on-disk cache's key.
  nvrtcResult (*nvrtcVersion)(int*, int*) = nullptr;
};

template <class T>
bool sym(void* lib, const char* name, T& out, std::string& error) {
  out = reinterpret_cast<T>(dlsym(lib, name));
  if (out == nullptr && error.empty()) error = std::string("symbol ") + name + " not found";
  return out != nullptr;
}

const Driver& driver() {
  static Driver d = [] {
    Driver d{};
    d.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (d.lib == nullptr) {
      const char* e = dlerror();
      d.error = std::string("the CUDA driver (libcuda.so.1) could not be loaded: ") +
                (e ? e : "unknown reason");
      return d;
    }
    std::string& err = d.error;
    sym(d.lib, "cuInit", d.cuInit, err);
    sym(d.lib, "cuDeviceGetCount", d.cuDeviceGetCount, err);
    sym(d.lib, "cuDeviceGet", d.cuDeviceGet, err);
    sym(d.lib, "cuDeviceGetName", d.cuDeviceGetName, err);
    sym(d.lib, "cuDeviceGetAttribute", d.cuDeviceGetAttribute, err);
    sym(d.lib, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain, err);
    sym(d.lib, "cuDevicePrimaryCtxRelease_v2", d.cuDevicePrimaryCtxRelease, err);
    sym(d.lib, "cuCtxSetCurrent", d.cuCtxSetCurrent, err);
    sym(d.lib, "cuModuleLoadData", d.cuModuleLoadData, err);
    sym(d.lib, "cuModuleUnload", d.cuModuleUnload, err);
    sym(d.lib, "cuModuleGetFunction", d.cuModuleGetFunction, err);
    sym(d.lib, "cuFuncSetAttribute", d.cuFuncSetAttribute, err);
    sym(d.lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        d.cuOccupancyMaxActiveBlocksPerMultiprocessor, err);
    d.cuFuncGetParamInfo = reinterpret_cast<decltype(d.cuFuncGetParamInfo)>(
        dlsym(d.lib, "cuFuncGetParamInfo"));  // optional
    sym(d.lib, "cuMemAlloc_v2", d.cuMemAlloc, err);
    sym(d.lib, "cuMemFree_v2", d.cuMemFree, err);
    sym(d.lib, "cuMemAllocHost_v2", d.cuMemAllocHost, err);
    sym(d.lib, "cuMemFreeHost", d.cuMemFreeHost, err);
    sym(d.lib, "cuMemcpyHtoDAsync_v2", d.cuMemcpyHtoDAsync, err);
    sym(d.lib, "cuMemcpyDtoHAsync_v2", d.cuMemcpyDtoHAsync, err);
    sym(d.lib, "cuMemsetD8Async", d.cuMemsetD8Async, err);
    sym(d.lib, "cuMemcpy2DAsync_v2", d.cuMemcpy2DAsync, err);
    {
      // Optional: a missing one leaves parking off (opt() does not set `err`).
      auto opt = [&](const char* name, auto& out) {
        out = reinterpret_cast<std::remove_reference_t<decltype(out)>>(dlsym(d.lib, name));
      };
      opt("cuMemGetAllocationGranularity", d.cuMemGetAllocationGranularity);
      opt("cuMemAddressReserve", d.cuMemAddressReserve);
      opt("cuMemAddressFree", d.cuMemAddressFree);
      opt("cuMemCreate", d.cuMemCreate);
      opt("cuMemRelease", d.cuMemRelease);
      opt("cuMemMap", d.cuMemMap);
      opt("cuMemUnmap", d.cuMemUnmap);
      opt("cuMemSetAccess", d.cuMemSetAccess);
    }
    sym(d.lib, "cuStreamCreate", d.cuStreamCreate, err);
    sym(d.lib, "cuStreamDestroy_v2", d.cuStreamDestroy, err);
    sym(d.lib, "cuStreamSynchronize", d.cuStreamSynchronize, err);
    sym(d.lib, "cuLaunchKernel", d.cuLaunchKernel, err);
    d.cuLaunchKernelEx =
        reinterpret_cast<decltype(d.cuLaunchKernelEx)>(dlsym(d.lib, "cuLaunchKernelEx"));
    sym(d.lib, "cuStreamBeginCapture_v2", d.cuStreamBeginCapture, err);
    sym(d.lib, "cuStreamEndCapture", d.cuStreamEndCapture, err);
    sym(d.lib, "cuGraphInstantiateWithFlags", d.cuGraphInstantiateWithFlags, err);
    sym(d.lib, "cuGraphLaunch", d.cuGraphLaunch, err);
    sym(d.lib, "cuGraphExecDestroy", d.cuGraphExecDestroy, err);
    sym(d.lib, "cuGraphDestroy", d.cuGraphDestroy, err);
    sym(d.lib, "cuEventCreate", d.cuEventCreate, err);
    sym(d.lib, "cuEventRecord", d.cuEventRecord, err);
    sym(d.lib, "cuEventSynchronize", d.cuEventSynchronize, err);
    sym(d.lib, "cuEventDestroy_v2", d.cuEventDestroy, err);
    sym(d.lib, "cuGetErrorName", d.cuGetErrorName, err);
    sym(d.lib, "cuGetErrorString", d.cuGetErrorString, err);
    if (!err.empty()) {
      err = "the CUDA driver is too old or incomplete: " + err;
      return d;
    }
    CUresult r = d.cuInit(0);
    if (r != 0) {
      const char* name = nullptr;
      d.cuGetErrorName(r, &name);
      err = std::string("cuInit failed: ") + (name ? name : std::to_string(r));
    }
    return d;
  }();
  return d;
}

// NVRTC: by soname (found when MLX's CUDA build already loaded it), then beside libmlx
// (the wheels' layout: site-packages/nvidia/cu13/lib), then $MLXS_NVRTC.
const Nvrtc& nvrtc() {
  static Nvrtc n = [] {
    Nvrtc n{};
    std::vector<std::string> tried;
    if (const char* p = std::getenv("MLXS_NVRTC")) tried.push_back(p);
    tried.push_back("libnvrtc.so.13");
    tried.push_back("libnvrtc.so.12");
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(static_cast<void (*)()>(&mx::synchronize)), &info) != 0 && info.dli_fname) {
      std::string lib = info.dli_fname;
      auto slash = lib.rfind('/');
      if (slash != std::string::npos) {
        std::string dir = lib.substr(0, slash);
        tried.push_back(dir + "/../../nvidia/cu13/lib/libnvrtc.so.13");
        tried.push_back(dir + "/../../nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
      }
    }
    for (const auto& t : tried) {
      n.lib = dlopen(t.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (n.lib) break;
    }
    if (n.lib == nullptr) {
      n.error = "NVRTC could not be loaded (tried";
      for (const auto& t : tried) n.error += " " + t;
      n.error += "; set MLXS_NVRTC to libnvrtc's path)";
      return n;
    }
    std::string& err = n.error;
    sym(n.lib, "nvrtcCreateProgram", n.nvrtcCreateProgram, err);
    sym(n.lib, "nvrtcCompileProgram", n.nvrtcCompileProgram, err);
    sym(n.lib, "nvrtcGetProgramLogSize", n.nvrtcGetProgramLogSize, err);
    sym(n.lib, "nvrtcGetProgramLog", n.nvrtcGetProgramLog, err);
    sym(n.lib, "nvrtcGetCUBINSize", n.nvrtcGetCUBINSize, err);
    sym(n.lib, "nvrtcGetCUBIN", n.nvrtcGetCUBIN, err);
    sym(n.lib, "nvrtcDestroyProgram", n.nvrtcDestroyProgram, err);
    sym(n.lib, "nvrtcGetErrorString", n.nvrtcGetErrorString, err);
    if (!err.empty()) {
      err = "NVRTC is incomplete: " + err;
      return n;
    }
    n.nvrtcVersion = reinterpret_cast<nvrtcResult (*)(int*, int*)>(dlsym(n.lib, "nvrtcVersion"));
    // NVRTC loads libnvrtc-builtins.so.* by name when it compiles; load the one beside it
    // first, so that it is found whatever the library search path is.
    Dl_info nv{};
    if (dladdr(reinterpret_cast<void*>(n.nvrtcCreateProgram), &nv) != 0 && nv.dli_fname) {
      std::string path = nv.dli_fname;
      auto slash = path.rfind('/');
      std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
      if (DIR* dp = opendir(dir.c_str())) {
        while (dirent* e = readdir(dp)) {
          if (std::strncmp(e->d_name, "libnvrtc-builtins.so", 20) == 0) {
            dlopen((dir + "/" + e->d_name).c_str(), RTLD_NOW | RTLD_GLOBAL);
          }
        }
        closedir(dp);
      }
    }
    return n;
  }();
  return n;
}

// The on-disk cache of compiled kernels (as MLX caches its PTX): one cubin a source, target
// architecture, option set and NVRTC version, in $MLXS_GPURT_CACHE (`off` or empty: no cache),
// else $XDG_CACHE_HOME/mlx-rs/gpurt, else $HOME/.cache/mlx-rs/gpurt. Every failure to read or
// write it is silent: the kernels are then compiled as without it. A cached file that the
// driver refuses is compiled again and replaced.
std::string kernel_cache_dir() {
  if (const char* p = std::getenv("MLXS_GPURT_CACHE")) {
    std::string v = p;
    if (v.empty() || v == "off" || v == "0") return "";
    return v;
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    return std::string(x) + "/mlx-rs/gpurt";
  }
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/mlx-rs/gpurt";
  return "";
}

// FNV-1a, 64 bits: the file's name (the file also starts with the whole key, compared on read).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string kernel_cache_path(const std::string& dir, const std::string& key) {
  char name[64];
  std::snprintf(name, sizeof(name), "%016llx.cubin", static_cast<unsigned long long>(fnv1a(key)));
  return dir + "/" + name;
}

// The cached cubin for `key`, or empty.
std::string kernel_cache_read(const std::string& path, const std::string& key) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string all = ss.str();
  // Layout: the key's length (8 bytes), the key, the cubin.
  if (all.size() < 8) return "";
  uint64_t n = 0;
  std::memcpy(&n, all.data(), 8);
  if (n != key.size() || all.size() < 8 + n || all.compare(8, n, key) != 0) return "";
  return all.substr(8 + n);
}

void kernel_cache_write(const std::string& dir, const std::string& path, const std::string& key,
                        const std::string& cubin) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return;
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    uint64_t n = key.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(key.data(), std::streamsize(key.size()));
    f.write(cubin.data(), std::streamsize(cubin.size()));
    if (!f) {
      f.close();
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

void check(CUresult r, const char* what) {
  if (r == 0) return;
  const Driver& d = driver();
  const char* name = nullptr;
  const char* text = nullptr;
  d.cuGetErrorName(r, &name);
  d.cuGetErrorString(r, &text);
  throw std::runtime_error(std::string("[gpurt] ") + what + ": " +
                           (name ? name : std::to_string(r)) + " (" + (text ? text : "") + ")");
}

const Driver& ready_driver() {
  const Driver& d = driver();
  if (!d.error.empty()) throw std::runtime_error("[gpurt] " + d.error);
  return d;
}

}  // namespace

struct mlxs_gpurt_ {
  CUdevice device = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  // The modules of kernels: the one made with the runtime, then mlxs_gpurt_add_module's.
  std::vector<CUmodule> modules;
  std::string name;
  // The device's architecture, e.g. "sm_90".
  std::string arch;
  uint32_t sm_count = 0;
  std::vector<CUfunction> kernels;
  std::vector<uint32_t> arities;
  std::vector<std::pair<CUdeviceptr, size_t>> buffers;
  size_t allocated = 0;
  // Buffers that are MLX arrays' own device memory (mlxs_gpurt_borrow_array): the arrays,
  // kept alive here, own it; never freed by the runtime. Indexed like `buffers`, empty
  // (a null array) where the runtime allocated the buffer itself.
  std::vector<std::optional<mx::array>> borrowed;
  std::vector<uint32_t> borrowed_list;  // the indices of borrowed buffers
  size_t borrowed_bytes = 0;
  std::vector<std::pair<CUgraph, CUgraphExec>> graphs;
  // The parkable region (mlxs_gpurt_alloc_parkable): its buffers [park_first, park_end),
  // its reserved addresses (`park_base`, `park_size` bytes, 0: plain memory, no parking),
  // the physical memory mapped there (0 while parked).
  uint32_t park_first = 0, park_end = 0;
  CUdeviceptr park_base = 0;
  size_t park_size = 0;
  CUmemGenericAllocationHandle park_mem = 0;
  // Handles whose release failed when parking: released again when the runtime is destroyed.
  std::vector<CUmemGenericAllocationHandle> unreleased;
  bool parked = false;
  bool capturing = false;
  bool pdl = false;
  // Pinned read slots.
  void* pinned = nullptr;
  std::array<CUevent, kSlots> events{};
  std::array<uint64_t, kSlots> slot_ticket{};  // 0: free
  std::array<size_t, kSlots> slot_bytes{};
  uint64_t next_ticket = 1;

  const Driver& d() {
    const Driver& dr = ready_driver();
    check(dr.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    return dr;
  }
  CUdeviceptr at(uint32_t buffer, size_t offset, size_t bytes, const char* what) {
    if (buffer >= buffers.size()) {
      throw std::invalid_argument(std::string("[gpurt] ") + what + ": no buffer " +
                                  std::to_string(buffer));
    }
    if (parked && buffer >= park_first && buffer < park_end) {
      throw std::invalid_argument(std::string("[gpurt] ") + what + ": buffer " +
                                  std::to_string(buffer) +
                                  " is parked (its memory was given back; unpark first)");
    }
    auto [ptr, size] = buffers[buffer];
    if (offset > size || bytes > size - offset) {
      throw std::invalid_argument(std::string("[gpurt] ") + what + ": bytes [" +
                                  std::to_string(offset) + ", " +
                                  std::to_string(offset + bytes) + ") outside buffer " +
                                  std::to_string(buffer) + " of " + std::to_string(size) +
                                  " bytes");
    }
    return ptr + offset;
  }
  // A buffer the runtime may write (not an MLX array's memory).
  void writable(uint32_t buffer, const char* what) {
    if (buffer < borrowed.size() && borrowed[buffer]) {
      throw std::invalid_argument(std::string("[gpurt] ") + what + ": buffer " +
                                  std::to_string(buffer) + " is an MLX array's memory");
    }
  }
  CUfunction kernel(uint32_t k, const char* what) {
    if (k >= kernels.size()) {
      throw std::invalid_argument(std::string("[gpurt] ") + what + ": no kernel " +
                                  std::to_string(k));
    }
    return kernels[k];
  }
  void not_capturing(const char* what) {
    if (capturing) {
      throw std::logic_error(std::string("[gpurt] ") + what +
                             " is not allowed while a graph is being captured");
    }
  }
  ~mlxs_gpurt_() {
    const Driver& dr = driver();
    if (!dr.error.empty() || ctx == nullptr) return;
    dr.cuCtxSetCurrent(ctx);
    if (stream) dr.cuStreamSynchronize(stream);
    for (auto& [g, e] : graphs) {
      if (e) dr.cuGraphExecDestroy(e);
      if (g) dr.cuGraphDestroy(g);
    }
    for (auto ev : events) {
      if (ev) dr.cuEventDestroy(ev);
    }
    if (pinned) dr.cuMemFreeHost(pinned);
    for (size_t i = 0; i < buffers.size(); ++i) {
      const bool in_region = park_size > 0 && i >= park_first && i < park_end;
      if (!in_region && (i >= borrowed.size() || !borrowed[i])) dr.cuMemFree(buffers[i].first);
    }
    if (park_size > 0) {
      if (park_mem) {
        dr.cuMemUnmap(park_base, park_size);
        dr.cuMemRelease(park_mem);
      }
      dr.cuMemAddressFree(park_base, park_size);
    }
    for (auto h : unreleased) dr.cuMemRelease(h);
    for (auto m : modules) {
      if (m) dr.cuModuleUnload(m);
    }
    if (stream) dr.cuStreamDestroy(stream);
    dr.cuDevicePrimaryCtxRelease(device);
  }
};

namespace {

// Compiles `src` (or reads its cubin from the on-disk cache), loads it as one more module of
// `rt` and appends its kernels `kernel_names` (with their declared arities) to `rt.kernels`.
void load_module(mlxs_gpurt_& rt, const Driver& d, const std::string& src,
                 const char* const* kernel_names, const uint32_t* arities, size_t n_kernels) {
  // MLXS_GPURT_CARVEOUT=P (0..100): every kernel prefers P% of the unified L1 as shared
  // memory, so consecutive kernels ask for one configuration (an experiment switch; unset,
  // the driver chooses per kernel).
  int carveout = -1;
  if (const char* c = std::getenv("MLXS_GPURT_CARVEOUT"); c && *c) {
    char* end = nullptr;
    long v = std::strtol(c, &end, 10);
    if (c[0] < '0' || c[0] > '9' || *end != '\0' || v < 0 || v > 100) {
      throw std::invalid_argument(std::string("[gpurt] MLXS_GPURT_CARVEOUT=") + c +
                                  ": expected a percentage 0..100");
    }
    carveout = int(v);
  }
  const std::string& arch = rt.arch;
  CUmodule module = nullptr;
  bool from_cache = false;
  const Nvrtc& n = nvrtc();
  if (!n.error.empty()) throw std::runtime_error("[gpurt] " + n.error);
  std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {arch_opt.c_str(), "-std=c++17", "--fmad=true"};
  int nv_major = 0, nv_minor = 0;
  if (n.nvrtcVersion != nullptr) n.nvrtcVersion(&nv_major, &nv_minor);
  std::string key = "gpurt-cubin-1\n" + arch + "\nnvrtc " + std::to_string(nv_major) + "." +
                    std::to_string(nv_minor) + "\n";
  for (const char* o : opts) key += std::string(o) + "\n";
  key += src;
  const std::string cache_dir = kernel_cache_dir();
  const std::string cache_path = cache_dir.empty() ? "" : kernel_cache_path(cache_dir, key);
  if (!cache_path.empty()) {
    std::string cached = kernel_cache_read(cache_path, key);
    if (!cached.empty() && d.cuModuleLoadData(&module, cached.data()) == 0) {
      from_cache = true;
    }
  }
  if (!from_cache) {
    module = nullptr;
    nvrtcProgram prog = nullptr;
    nvrtcResult nr = n.nvrtcCreateProgram(&prog, src.c_str(), "gpurt.cu", 0, nullptr, nullptr);
    if (nr != 0) {
      throw std::runtime_error(std::string("[gpurt] nvrtcCreateProgram: ") +
                               n.nvrtcGetErrorString(nr));
    }
    nr = n.nvrtcCompileProgram(prog, 3, opts);
    std::string log;
    size_t log_size = 0;
    if (n.nvrtcGetProgramLogSize(prog, &log_size) == 0 && log_size > 1) {
      log.resize(log_size);
      n.nvrtcGetProgramLog(prog, log.data());
    }
    std::string cubin;
    if (nr == 0) {
      size_t size = 0;
      nr = n.nvrtcGetCUBINSize(prog, &size);
      if (nr == 0) {
        cubin.resize(size);
        nr = n.nvrtcGetCUBIN(prog, cubin.data());
      }
    }
    n.nvrtcDestroyProgram(&prog);
    if (nr != 0) {
      throw std::runtime_error(std::string("[gpurt] NVRTC could not compile the kernels for ") +
                               arch + ": " + n.nvrtcGetErrorString(nr) + "\n" + log);
    }
    check(d.cuModuleLoadData(&module, cubin.data()), "cuModuleLoadData");
    if (!cache_path.empty()) kernel_cache_write(cache_dir, cache_path, key, cubin);
  }
  rt.modules.push_back(module);
  // Appended only when every kernel is found: a failed module adds none.
  std::vector<CUfunction> found;
  for (size_t i = 0; i < n_kernels; ++i) {
    std::string kname = cstr(kernel_names[i], "kernel name");
    CUfunction f = nullptr;
    check(d.cuModuleGetFunction(&f, module, kname.c_str()),
          ("cuModuleGetFunction(" + kname + ")").c_str());
    if (d.cuFuncGetParamInfo != nullptr) {
      // Every parameter must be 8 bytes wide, and the declared count must be right.
      size_t k = 0;
      for (;; ++k) {
        size_t off = 0, size = 0;
        if (d.cuFuncGetParamInfo(f, k, &off, &size) != 0) break;
        if (size != 8 || off != 8 * k) {
          throw std::invalid_argument("[gpurt] kernel " + kname + ": parameter " +
                                      std::to_string(k) + " is " + std::to_string(size) +
                                      " bytes at offset " + std::to_string(off) +
                                      "; every parameter must be 8 bytes");
        }
      }
      if (k != arities[i]) {
        throw std::invalid_argument("[gpurt] kernel " + kname + " takes " + std::to_string(k) +
                                    " parameters, declared " + std::to_string(arities[i]));
      }
    }
    if (carveout >= 0) {
      check(d.cuFuncSetAttribute(f, kFuncCarveout, carveout),
            "cuFuncSetAttribute(preferred shared memory carveout)");
    }
    found.push_back(f);
  }
  for (size_t i = 0; i < n_kernels; ++i) {
    rt.kernels.push_back(found[i]);
    rt.arities.push_back(arities[i]);
  }
}

// The runtime behind a handle (as internal.hpp's A() for arrays).
mlxs_gpurt_& R(mlxs_gpurt rt) {
  if (rt == nullptr) throw std::invalid_argument("[gpurt] null runtime");
  return *rt;
}

}  // namespace

extern "C" {

bool mlxs_gpurt_available(void) {
  try {
    const Driver& d = driver();
    if (!d.error.empty()) return false;
    int n = 0;
    return d.cuDeviceGetCount(&n) == 0 && n > 0;
  } catch (...) {
    return false;
  }
}

int mlxs_gpurt_new(mlxs_gpurt* out, const char* source, const char* const* kernel_names,
                   const uint32_t* arities, size_t n_kernels) {
  return guard([&] {
    std::string src = cstr(source, "kernel source");
    if (n_kernels > 0 && (kernel_names == nullptr || arities == nullptr)) {
      throw std::invalid_argument("[gpurt] null kernel names or arities");
    }
    const Driver& d = ready_driver();
    int count = 0;
    check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count == 0) throw std::runtime_error("[gpurt] the CUDA driver sees no device");
    auto rt = std::make_unique<mlxs_gpurt_>();
    check(d.cuDeviceGet(&rt->device, 0), "cuDeviceGet");
    check(d.cuDevicePrimaryCtxRetain(&rt->ctx, rt->device), "cuDevicePrimaryCtxRetain");
    check(d.cuCtxSetCurrent(rt->ctx), "cuCtxSetCurrent");
    int major = 0, minor = 0;
    check(d.cuDeviceGetAttribute(&major, kAttrCcMajor, rt->device), "cuDeviceGetAttribute");
    check(d.cuDeviceGetAttribute(&minor, kAttrCcMinor, rt->device), "cuDeviceGetAttribute");
    int sms = 0;
    check(d.cuDeviceGetAttribute(&sms, kAttrSmCount, rt->device), "cuDeviceGetAttribute");
    rt->sm_count = uint32_t(sms);
    char name[256] = {0};
    check(d.cuDeviceGetName(name, sizeof(name) - 1, rt->device), "cuDeviceGetName");
    std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
    rt->name = std::string(name) + " (" + arch + ")";
    check(d.cuStreamCreate(&rt->stream, kStreamNonBlocking), "cuStreamCreate");

    rt->arch = arch;
    load_module(*rt, d, src, kernel_names, arities, n_kernels);
    *out = rt.release();
  });
}

int mlxs_gpurt_add_module(mlxs_gpurt rt, const char* source, const char* const* kernel_names,
                          const uint32_t* arities, size_t n_kernels, uint32_t* out_first) {
  return guard([&] {
    R(rt);
    std::string src = cstr(source, "kernel source");
    if (n_kernels > 0 && (kernel_names == nullptr || arities == nullptr)) {
      throw std::invalid_argument("[gpurt] null kernel names or arities");
    }
    if (out_first == nullptr) throw std::invalid_argument("[gpurt] null out_first");
    rt->not_capturing("add_module");
    const Driver& d = rt->d();
    uint32_t first = uint32_t(rt->kernels.size());
    load_module(*rt, d, src, kernel_names, arities, n_kernels);
    *out_first = first;
  });
}

void mlxs_gpurt_free(mlxs_gpurt rt) {
  try {
    delete rt;
  } catch (...) {
  }
}

int mlxs_gpurt_device_name(mlxs_gpurt rt, mlxs_string* out) {
  return guard([&] {
    R(rt);
    *out = new mlxs_string_{rt->name};
  });
}

namespace {

// A zeroed buffer of `bytes` (> 0) from cuMemAlloc; its index.
uint32_t alloc_buffer(mlxs_gpurt_& rt, size_t bytes) {
  rt.not_capturing("alloc");
  if (bytes == 0) throw std::invalid_argument("[gpurt] alloc: zero bytes");
  const Driver& d = rt.d();
  CUdeviceptr p = 0;
  check(d.cuMemAlloc(&p, bytes), ("cuMemAlloc(" + std::to_string(bytes) + " bytes)").c_str());
  CUresult r = d.cuMemsetD8Async(p, 0, bytes, rt.stream);
  if (r == 0) r = d.cuStreamSynchronize(rt.stream);
  if (r != 0) {
    d.cuMemFree(p);
    check(r, "cuMemsetD8Async");
  }
  rt.buffers.emplace_back(p, bytes);
  rt.borrowed.emplace_back(std::nullopt);
  rt.allocated += bytes;
  return static_cast<uint32_t>(rt.buffers.size() - 1);
}

}  // namespace

int mlxs_gpurt_alloc(mlxs_gpurt rt, size_t bytes, uint32_t* out_buffer) {
  return guard([&] { *out_buffer = alloc_buffer(R(rt), bytes); });
}

size_t mlxs_gpurt_allocated(mlxs_gpurt rt) { return rt ? rt->allocated : 0; }

size_t mlxs_gpurt_borrowed(mlxs_gpurt rt) { return rt ? rt->borrowed_bytes : 0; }

namespace {

// The region's allocation properties: pinned device memory of the runtime's device.
MemAllocationProp park_prop(const mlxs_gpurt_& rt) {
  MemAllocationProp p{};
  p.type = kMemAllocationTypePinned;
  p.location.type = kMemLocationTypeDevice;
  p.location.id = rt.device;
  return p;
}

// Creates the region's physical memory, maps it at its addresses with read-write access for
// the device, and zeroes it (waited for). On failure nothing stays created or mapped.
void park_map(mlxs_gpurt_& rt, const Driver& d) {
  MemAllocationProp prop = park_prop(rt);
  CUmemGenericAllocationHandle h = 0;
  check(d.cuMemCreate(&h, rt.park_size, &prop, 0),
        ("cuMemCreate(" + std::to_string(rt.park_size) + " bytes)").c_str());
  CUresult r = d.cuMemMap(rt.park_base, rt.park_size, 0, h, 0);
  if (r != 0) {
    d.cuMemRelease(h);
    check(r, "cuMemMap");
  }
  MemAccessDesc acc{};
  acc.location.type = kMemLocationTypeDevice;
  acc.location.id = rt.device;
  acc.flags = kMemAccessReadWrite;
  r = d.cuMemSetAccess(rt.park_base, rt.park_size, &acc, 1);
  if (r == 0) r = d.cuMemsetD8Async(rt.park_base, 0, rt.park_size, rt.stream);
  if (r == 0) r = d.cuStreamSynchronize(rt.stream);
  if (r != 0) {
    d.cuMemUnmap(rt.park_base, rt.park_size);
    d.cuMemRelease(h);
    check(r, "cuMemSetAccess / cuMemsetD8Async on the parkable region");
  }
  rt.park_mem = h;
}

}  // namespace

int mlxs_gpurt_alloc_parkable(mlxs_gpurt rt, const size_t* sizes, size_t n,
                              uint32_t* out_first) {
  return guard([&] {
    R(rt);
    rt->not_capturing("alloc_parkable");
    if (out_first == nullptr) throw std::invalid_argument("[gpurt] alloc_parkable: null out");
    if (n == 0 || sizes == nullptr) {
      throw std::invalid_argument("[gpurt] alloc_parkable: no buffers");
    }
    if (rt->park_end > rt->park_first) {
      throw std::logic_error("[gpurt] alloc_parkable: the runtime has its parkable region already");
    }
    // Each buffer at a 256-byte boundary (the kernels' vector loads).
    std::vector<size_t> offsets(n);
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      if (sizes[i] == 0) throw std::invalid_argument("[gpurt] alloc_parkable: zero bytes");
      if (sizes[i] > SIZE_MAX / 2 || total > SIZE_MAX / 2) {
        throw std::invalid_argument("[gpurt] alloc_parkable: size overflows");
      }
      offsets[i] = total;
      total += (sizes[i] + 255) / 256 * 256;
    }
    const Driver& d = rt->d();
    const uint32_t first = static_cast<uint32_t>(rt->buffers.size());
    // Plain buffers, never parked: where the driver or the device has no virtual memory
    // management, or refuses the region. A failure part way frees what it allocated.
    auto plain = [&] {
      try {
        for (size_t i = 0; i < n; ++i) alloc_buffer(*rt, sizes[i]);
      } catch (...) {
        while (rt->buffers.size() > first) {
          d.cuMemFree(rt->buffers.back().first);
          rt->allocated -= rt->buffers.back().second;
          rt->buffers.pop_back();
          rt->borrowed.pop_back();
        }
        throw;
      }
      rt->park_first = first;
      rt->park_end = static_cast<uint32_t>(rt->buffers.size());
      *out_first = first;
    };
    int vmm_on = 0;
    if (!d.vmm() || d.cuDeviceGetAttribute(&vmm_on, kAttrVmmSupported, rt->device) != 0 ||
        vmm_on == 0) {
      plain();
      return;
    }
    MemAllocationProp prop = park_prop(*rt);
    size_t gran = 0;
    if (d.cuMemGetAllocationGranularity(&gran, &prop, kMemGranularityMinimum) != 0) {
      plain();
      return;
    }
    if (gran == 0) gran = size_t(2) << 20;
    const size_t size = (total + gran - 1) / gran * gran;
    CUdeviceptr base = 0;
    if (d.cuMemAddressReserve(&base, size, 0, 0, 0) != 0) {
      plain();
      return;
    }
    rt->park_base = base;
    rt->park_size = size;
    try {
      park_map(*rt, d);
    } catch (...) {
      d.cuMemAddressFree(base, size);
      rt->park_base = 0;
      rt->park_size = 0;
      // The region refused (not supported there, or no memory): plain buffers, whose own
      // failure is the one reported.
      plain();
      return;
    }
    for (size_t i = 0; i < n; ++i) {
      rt->buffers.emplace_back(base + offsets[i], sizes[i]);
      rt->borrowed.emplace_back(std::nullopt);
    }
    rt->park_first = first;
    rt->park_end = static_cast<uint32_t>(rt->buffers.size());
    rt->allocated += size;
    *out_first = first;
  });
}

int mlxs_gpurt_park(mlxs_gpurt rt) {
  return guard([&] {
    R(rt);
    rt->not_capturing("park");
    if (rt->park_size == 0) {
      throw std::runtime_error(
          "[gpurt] park: no parkable region (none allocated, or the driver has no virtual "
          "memory management)");
    }
    const Driver& d = rt->d();
    // Nothing queued may still use the memory (and the caller may let go of what its queued
    // copies read: the stream is waited for also when the region is parked already).
    check(d.cuStreamSynchronize(rt->stream), "park: cuStreamSynchronize");
    if (rt->parked) return;
    check(d.cuMemUnmap(rt->park_base, rt->park_size), "cuMemUnmap");
    // Unmapped: the region is unusable from here whatever the release says.
    rt->parked = true;
    CUmemGenericAllocationHandle h = rt->park_mem;
    rt->park_mem = 0;
    const CUresult r = d.cuMemRelease(h);
    // A handle not released still holds its memory: counted until the runtime releases it.
    if (r != 0) rt->unreleased.push_back(h);
    else rt->allocated -= rt->park_size;
    check(r, "cuMemRelease");
  });
}

int mlxs_gpurt_unpark(mlxs_gpurt rt) {
  return guard([&] {
    R(rt);
    rt->not_capturing("unpark");
    if (!rt->parked) return;
    const Driver& d = rt->d();
    park_map(*rt, d);
    rt->parked = false;
    rt->allocated += rt->park_size;
  });
}

size_t mlxs_gpurt_parkable_bytes(mlxs_gpurt rt) { return rt ? rt->park_size : 0; }

bool mlxs_gpurt_parked(mlxs_gpurt rt) { return rt ? rt->parked : false; }

int mlxs_gpurt_upload(mlxs_gpurt rt, uint32_t buffer, size_t offset, const void* src,
                      size_t bytes) {
  return guard([&] {
    R(rt);
    rt->not_capturing("upload");
    if (bytes == 0) return;
    if (src == nullptr) throw std::invalid_argument("[gpurt] upload: null source");
    rt->writable(buffer, "upload");
    CUdeviceptr p = rt->at(buffer, offset, bytes, "upload");
    const Driver& d = rt->d();
    check(d.cuMemcpyHtoDAsync(p, src, bytes, rt->stream), "cuMemcpyHtoDAsync");
    check(d.cuStreamSynchronize(rt->stream), "upload: cuStreamSynchronize");
  });
}

int mlxs_gpurt_download(mlxs_gpurt rt, uint32_t buffer, size_t offset, void* dst, size_t bytes) {
  return guard([&] {
    R(rt);
    rt->not_capturing("download");
    if (bytes == 0) return;
    if (dst == nullptr) throw std::invalid_argument("[gpurt] download: null destination");
    CUdeviceptr p = rt->at(buffer, offset, bytes, "download");
    const Driver& d = rt->d();
    check(d.cuMemcpyDtoHAsync(dst, p, bytes, rt->stream), "cuMemcpyDtoHAsync");
    check(d.cuStreamSynchronize(rt->stream), "download: cuStreamSynchronize");
  });
}

// MLX's CUDA allocator's buffer (mlx/backend/cuda/allocator.h, CudaBuffer): what an array's
// Buffer::ptr() points to in MLX's CUDA build. Read only for its address and size, and only
// where MLX runs on a GPU (its other builds have other buffers).
struct MlxCudaBuffer {
  void* data;
  size_t size;
  int device;  // -1: managed (unified) memory
};

// Where an evaluated, row-contiguous array's bytes are on the device, or 0 where they are not
// in its MLX buffer.
static CUdeviceptr array_device_ptr(const mx::array& a) {
  const auto* b = static_cast<const MlxCudaBuffer*>(a.buffer().ptr());
  const size_t at = size_t(a.offset());
  if (b == nullptr || b->data == nullptr || at > b->size || a.nbytes() > b->size - at) return 0;
  return CUdeviceptr(static_cast<const char*>(b->data) + at);
}

// A borrowed buffer's array still has its bytes where the buffer says (MLX moves a buffer to
// unified memory when the host reads it, freeing the device memory): a launch or a graph
// that would read freed memory is refused instead, and the caller falls back to MLX's path.
static void check_borrowed(mlxs_gpurt_& rt, uint32_t buffer, const char* what) {
  if (buffer >= rt.borrowed.size() || !rt.borrowed[buffer]) return;
  if (array_device_ptr(*rt.borrowed[buffer]) != rt.buffers[buffer].first) {
    throw std::runtime_error(std::string("[gpurt] ") + what + ": MLX moved the memory of borrowed buffer " +
                             std::to_string(buffer));
  }
}

// copy_from_array, waiting for the copy (`wait`) or only queueing it.
static int copy_from_array(mlxs_gpurt rt, uint32_t buffer, size_t offset, size_t dst_pitch,
                           mlxs_array src, size_t width, size_t height, bool wait) {
  return guard([&] {
    R(rt);
    rt->not_capturing("copy_from_array");
    if (width == 0 || height == 0) return;
    if (!mx::is_available(mx::Device::gpu)) {
      throw std::invalid_argument(
          "[gpurt] copy_from_array: MLX runs without a GPU here (its arrays are in host memory)");
    }
    mx::array& a = A(src);
    // One row: the pitch is not used.
    if (height == 1) dst_pitch = width;
    if (dst_pitch < width) {
      throw std::invalid_argument("[gpurt] copy_from_array: rows of " + std::to_string(width) +
                                  " bytes overlap at a pitch of " + std::to_string(dst_pitch));
    }
    if (width > SIZE_MAX / height || (height - 1) > (SIZE_MAX - width) / dst_pitch) {
      throw std::invalid_argument("[gpurt] copy_from_array: size overflows");
    }
    mx::eval(a);  // waits for MLX's GPU work on it
    if (!a.flags().row_contiguous) {
      throw std::invalid_argument("[gpurt] copy_from_array: the array is not row-contiguous");
    }
    if (a.nbytes() != width * height) {
      throw std::invalid_argument("[gpurt] copy_from_array: the array has " +
                                  std::to_string(a.nbytes()) + " bytes, the copy takes " +
                                  std::to_string(width * height));
    }
    const CUdeviceptr src_ptr = array_device_ptr(a);
    if (src_ptr == 0) {
      throw std::invalid_argument("[gpurt] copy_from_array: the array's data is not in its buffer");
    }
    rt->writable(buffer, "copy_from_array");
    CUdeviceptr dst = rt->at(buffer, offset, (height - 1) * dst_pitch + width, "copy_from_array");
    Memcpy2D c{};
    c.srcMemoryType = kMemoryTypeUnified;
    c.srcDevice = src_ptr;
    c.srcPitch = width;
    c.dstMemoryType = kMemoryTypeDevice;
    c.dstDevice = dst;
    c.dstPitch = dst_pitch;
    c.WidthInBytes = width;
    c.Height = height;
    const Driver& d = rt->d();
    check(d.cuMemcpy2DAsync(&c, rt->stream), "cuMemcpy2DAsync");
    if (wait) check(d.cuStreamSynchronize(rt->stream), "copy_from_array: cuStreamSynchronize");
  });
}

int mlxs_gpurt_copy_from_array(mlxs_gpurt rt, uint32_t buffer, size_t offset, size_t dst_pitch,
                               mlxs_array src, size_t width, size_t height) {
  return copy_from_array(rt, buffer, offset, dst_pitch, src, width, height, true);
}

int mlxs_gpurt_copy_from_array_queued(mlxs_gpurt rt, uint32_t buffer, size_t offset,
                                      size_t dst_pitch, mlxs_array src, size_t width,
                                      size_t height) {
  return copy_from_array(rt, buffer, offset, dst_pitch, src, width, height, false);
}

// A buffer that is an MLX array's own device memory, no copy: the array (evaluated first; it
// must be row-contiguous, its bytes in its MLX buffer, 256-byte aligned as the kernels' vector
// loads want) is kept alive by the runtime until it is freed, and its memory is never freed
// or written by the runtime. Fails where MLX has no GPU; the caller copies instead.
int mlxs_gpurt_borrow_array(mlxs_gpurt rt, mlxs_array src, uint32_t* out_buffer) {
  return guard([&] {
    R(rt);
    rt->not_capturing("borrow_array");
    if (out_buffer == nullptr) throw std::invalid_argument("[gpurt] borrow_array: null out");
    if (!mx::is_available(mx::Device::gpu)) {
      throw std::invalid_argument(
          "[gpurt] borrow_array: MLX runs without a GPU here (its arrays are in host memory)");
    }
    mx::array a = A(src);
    mx::eval(a);  // waits for MLX's GPU work on it
    if (!a.flags().row_contiguous) {
      throw std::invalid_argument("[gpurt] borrow_array: the array is not row-contiguous");
    }
    if (a.nbytes() == 0) throw std::invalid_argument("[gpurt] borrow_array: zero bytes");
    CUdeviceptr p = array_device_ptr(a);
    if (p == 0) {
      throw std::invalid_argument("[gpurt] borrow_array: the array's data is not in its buffer");
    }
    if (p % 256 != 0) {
      throw std::invalid_argument("[gpurt] borrow_array: the array's data is not 256-byte aligned");
    }
    rt->buffers.emplace_back(p, a.nbytes());
    rt->borrowed.emplace_back(a);
    rt->borrowed_list.push_back(static_cast<uint32_t>(rt->buffers.size() - 1));
    rt->borrowed_bytes += a.nbytes();
    *out_buffer = static_cast<uint32_t>(rt->buffers.size() - 1);
  });
}

int mlxs_gpurt_set_shared_limit(mlxs_gpurt rt, uint32_t kernel, uint32_t bytes) {
  return guard([&] {
    CUfunction f = R(rt).kernel(kernel, "set_shared_limit");
    const Driver& d = rt->d();
    check(d.cuFuncSetAttribute(f, kFuncMaxDynamicShared, int(bytes)),
          "cuFuncSetAttribute(max dynamic shared memory)");
  });
}

int mlxs_gpurt_launch(mlxs_gpurt rt, uint32_t kernel, const uint32_t* grid3,
                      const uint32_t* block3, uint32_t shared_bytes, const mlxs_gpurt_arg* args,
                      size_t n_args) {
  return guard([&] {
    R(rt);
    if (grid3 == nullptr || block3 == nullptr) {
      throw std::invalid_argument("[gpurt] launch: null grid or block");
    }
    CUfunction f = rt->kernel(kernel, "launch");
    if (n_args != rt->arities[kernel]) {
      throw std::invalid_argument("[gpurt] launch: kernel " + std::to_string(kernel) + " takes " +
                                  std::to_string(rt->arities[kernel]) + " arguments, got " +
                                  std::to_string(n_args));
    }
    if (n_args > 0 && args == nullptr) throw std::invalid_argument("[gpurt] launch: null args");
    for (int i = 0; i < 3; ++i) {
      if (grid3[i] == 0 || block3[i] == 0) {
        throw std::invalid_argument("[gpurt] launch: zero grid or block dimension");
      }
    }
    if (uint64_t(block3[0]) * block3[1] * block3[2] > 1024) {
      throw std::invalid_argument("[gpurt] launch: more than 1024 threads in a block");
    }
    std::vector<uint64_t> vals(n_args);
    std::vector<void*> ptrs(n_args);
    for (size_t i = 0; i < n_args; ++i) {
      if (args[i].kind == MLXS_GPURT_ARG_BUFFER) {
        vals[i] = rt->at(args[i].buffer, args[i].value, 0, "launch argument");
        check_borrowed(*rt, args[i].buffer, "launch");
      } else if (args[i].kind == MLXS_GPURT_ARG_BITS) {
        vals[i] = args[i].value;
      } else {
        throw std::invalid_argument("[gpurt] launch: unknown argument kind");
      }
      ptrs[i] = &vals[i];
    }
    const Driver& d = rt->d();
    if (rt->pdl) {
      LaunchAttribute attr{};
      attr.id = kAttrProgrammaticStreamSerialization;
      attr.value.programmatic_stream_serialization_allowed = 1;
      LaunchConfig cfg{grid3[0], grid3[1], grid3[2], block3[0], block3[1], block3[2],
                       shared_bytes, rt->stream, &attr, 1};
      check(d.cuLaunchKernelEx(&cfg, f, n_args ? ptrs.data() : nullptr, nullptr),
            "cuLaunchKernelEx");
    } else {
      check(d.cuLaunchKernel(f, grid3[0], grid3[1], grid3[2], block3[0],
                             block3[1], block3[2], shared_bytes, rt->stream,
                             n_args ? ptrs.data() : nullptr, nullptr),
            "cuLaunchKernel");
    }
  });
}

int mlxs_gpurt_resident_blocks(mlxs_gpurt rt, uint32_t kernel, uint32_t block_threads,
                               uint32_t shared_bytes, uint32_t* out) {
  return guard([&] {
    CUfunction f = R(rt).kernel(kernel, "resident_blocks");
    const Driver& d = rt->d();
    int per_sm = 0;
    check(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, int(block_threads),
                                                        shared_bytes),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    *out = uint32_t(per_sm) * rt->sm_count;
  });
}

int mlxs_gpurt_sm_count(mlxs_gpurt rt, uint32_t* out) {
  return guard([&] { *out = R(rt).sm_count; });
}

int mlxs_gpurt_set_programmatic_launch(mlxs_gpurt rt, bool on) {
  return guard([&] {
    R(rt);
    if (on && ready_driver().cuLaunchKernelEx == nullptr) {
      throw std::runtime_error("[gpurt] this CUDA driver has no cuLaunchKernelEx (CUDA < 12)");
    }
    rt->pdl = on;
  });
}

int mlxs_gpurt_capture_begin(mlxs_gpurt rt) {
  return guard([&] {
    R(rt);
    rt->not_capturing("capture_begin");
    const Driver& d = rt->d();
    check(d.cuStreamBeginCapture(rt->stream, kCaptureThreadLocal), "cuStreamBeginCapture");
    rt->capturing = true;
  });
}

int mlxs_gpurt_capture_end(mlxs_gpurt rt, uint32_t* out_graph) {
  return guard([&] {
    R(rt);
    if (!rt->capturing) throw std::logic_error("[gpurt] capture_end without capture_begin");
    const Driver& d = rt->d();
    rt->capturing = false;
    CUgraph g = nullptr;
    check(d.cuStreamEndCapture(rt->stream, &g), "cuStreamEndCapture");
    CUgraphExec e = nullptr;
    CUresult r = d.cuGraphInstantiateWithFlags(&e, g, 0);
    if (r != 0) {
      d.cuGraphDestroy(g);
      check(r, "cuGraphInstantiateWithFlags");
    }
    rt->graphs.emplace_back(g, e);
    *out_graph = static_cast<uint32_t>(rt->graphs.size() - 1);
  });
}

int mlxs_gpurt_graph_launch(mlxs_gpurt rt, uint32_t graph, uint32_t times) {
  return guard([&] {
    R(rt);
    rt->not_capturing("graph_launch");
    if (graph >= rt->graphs.size()) {
      throw std::invalid_argument("[gpurt] graph_launch: no graph " + std::to_string(graph));
    }
    if (rt->parked) {
      throw std::invalid_argument(
          "[gpurt] graph_launch: the runtime is parked (its parkable region's memory was given "
          "back; unpark first)");
    }
    for (uint32_t b : rt->borrowed_list) check_borrowed(*rt, b, "graph_launch");
    const Driver& d = rt->d();
    for (uint32_t i = 0; i < times; ++i) {
      check(d.cuGraphLaunch(rt->graphs[graph].second, rt->stream), "cuGraphLaunch");
    }
  });
}

int mlxs_gpurt_read_begin(mlxs_gpurt rt, uint32_t buffer, size_t offset, size_t bytes,
                          uint64_t* out_ticket) {
  return guard([&] {
    R(rt);
    rt->not_capturing("read_begin");
    if (bytes == 0 || bytes > kSlotBytes) {
      throw std::invalid_argument("[gpurt] read_begin: " + std::to_string(bytes) +
                                  " bytes; a read takes 1 to " + std::to_string(kSlotBytes));
    }
    CUdeviceptr p = rt->at(buffer, offset, bytes, "read_begin");
    const Driver& d = rt->d();
    if (rt->pinned == nullptr) {
      check(d.cuMemAllocHost(&rt->pinned, kSlotBytes * kSlots), "cuMemAllocHost");
      for (auto& ev : rt->events) check(d.cuEventCreate(&ev, kEventDisableTiming), "cuEventCreate");
    }
    uint64_t ticket = rt->next_ticket;
    size_t slot = ticket % kSlots;
    if (rt->slot_ticket[slot] != 0) {
      throw std::logic_error("[gpurt] read_begin: " + std::to_string(kSlots) +
                             " reads are already in flight; end one first");
    }
    char* host = static_cast<char*>(rt->pinned) + slot * kSlotBytes;
    check(d.cuMemcpyDtoHAsync(host, p, bytes, rt->stream), "cuMemcpyDtoHAsync");
    check(d.cuEventRecord(rt->events[slot], rt->stream), "cuEventRecord");
    rt->slot_ticket[slot] = ticket;
    rt->slot_bytes[slot] = bytes;
    rt->next_ticket++;
    *out_ticket = ticket;
  });
}

int mlxs_gpurt_read_end(mlxs_gpurt rt, uint64_t ticket, void* dst, size_t bytes) {
  return guard([&] {
    R(rt);
    size_t slot = ticket % kSlots;
    if (ticket == 0 || rt->slot_ticket[slot] != ticket) {
      throw std::invalid_argument("[gpurt] read_end: no read in flight with ticket " +
                                  std::to_string(ticket));
    }
    if (bytes != rt->slot_bytes[slot] || (bytes > 0 && dst == nullptr)) {
      throw std::invalid_argument("[gpurt] read_end: the read holds " +
                                  std::to_string(rt->slot_bytes[slot]) + " bytes, asked for " +
                                  std::to_string(bytes));
    }
    const Driver& d = rt->d();
    rt->slot_ticket[slot] = 0;
    check(d.cuEventSynchronize(rt->events[slot]), "cuEventSynchronize");
    std::memcpy(dst, static_cast<char*>(rt->pinned) + slot * kSlotBytes, bytes);
  });
}

int mlxs_gpurt_synchronize(mlxs_gpurt rt) {
  return guard([&] {
    R(rt);
    rt->not_capturing("synchronize");
    const Driver& d = rt->d();
    check(d.cuStreamSynchronize(rt->stream), "cuStreamSynchronize");
  });
}

}  // extern "C"
