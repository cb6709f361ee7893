// Helpers shared by the shim's translation units. Not part of the C ABI.
#pragma once

#include <mlx/mlx.h>

#include <exception>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "mlxs.h"

namespace mx = mlx::core;

struct mlxs_array_ {
  mx::array a;
};
struct mlxs_vec_ {
  std::vector<mx::array> v;
};
struct mlxs_stream_ {
  mx::Stream s;
};
struct mlxs_device_ {
  mx::Device d;
};
struct mlxs_string_ {
  std::string s;
};

namespace mlxs {

void set_error(std::string msg);

// Once per process: makes exit() wait for every MLX stream before MLX's statics are
// destroyed (see core.cpp). Cheap after the first call.
void drain_streams_at_exit() noexcept;

// Runs f, turning every exception into a status and a stored message.
template <class F>
int guard(F&& f) noexcept {
  try {
    drain_streams_at_exit();
    f();
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error("unknown C++ exception");
  }
  return 1;
}

inline mx::array& A(mlxs_array a) {
  if (a == nullptr) throw std::invalid_argument("[mlxs] null array handle");
  return a->a;
}
inline std::optional<mx::array> opt(mlxs_array a) {
  return a ? std::optional<mx::array>(a->a) : std::nullopt;
}
inline mlxs_array wrap(mx::array a) { return new mlxs_array_{std::move(a)}; }
inline void put(mlxs_array* out, mx::array a) { *out = wrap(std::move(a)); }
inline mx::StreamOrDevice S(mlxs_stream s) {
  return s ? mx::StreamOrDevice(s->s) : mx::StreamOrDevice{};
}
mx::Dtype dtype_of(mlxs_dtype d);
mlxs_dtype dtype_to(mx::Dtype d);
inline mx::Shape shape_of(const int32_t* shape, size_t ndim) {
  return mx::Shape(shape, shape + ndim);
}
inline std::vector<int> ints(const int32_t* p, size_t n) { return std::vector<int>(p, p + n); }
inline std::vector<mx::array>& V(mlxs_vec v) {
  if (v == nullptr) throw std::invalid_argument("[mlxs] null vector handle");
  return v->v;
}
inline mlxs_vec wrap_vec(std::vector<mx::array> v) { return new mlxs_vec_{std::move(v)}; }

}  // namespace mlxs

#include <algorithm>
#include <unordered_map>
#include <utility>

struct mlxs_map_ {
  std::vector<std::pair<std::string, mx::array>> items;  // sorted by key
  // The keys in the order they were first inserted (maps built by mlxs_map_insert): what a
  // Python dict's order is to MLX's bindings, which fill an std::unordered_map one emplace at
  // a time in that order; the writers' files follow that map's iteration order.
  std::vector<std::string> order;
};
struct mlxs_strmap_ {
  std::vector<std::pair<std::string, std::string>> items;  // sorted by key
};

namespace mlxs {

template <class V>
void sorted_insert(std::vector<std::pair<std::string, V>>& items, std::string key, V value) {
  auto it = std::lower_bound(items.begin(), items.end(), key,
                             [](const auto& p, const std::string& k) { return p.first < k; });
  if (it != items.end() && it->first == key) {
    it->second = std::move(value);
  } else {
    items.insert(it, {std::move(key), std::move(value)});
  }
}

template <class V>
std::vector<std::pair<std::string, V>> sorted_items(const std::unordered_map<std::string, V>& m) {
  std::vector<std::pair<std::string, V>> items(m.begin(), m.end());
  std::sort(items.begin(), items.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return items;
}

inline const char* cstr(const char* s, const char* what) {
  if (s == nullptr) throw std::invalid_argument(std::string("[mlxs] null ") + what);
  return s;
}

}  // namespace mlxs
