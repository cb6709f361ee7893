// Maps and file I/O.
#include "internal.hpp"

using namespace mlxs;

struct mlxs_gguf_meta_ {
  std::vector<std::pair<std::string, mx::GGUFMetaData>> items;  // sorted by key
};

namespace {

std::pair<std::string, mx::GGUFMetaData>& gguf_item(mlxs_gguf_meta m, size_t i) {
  if (!m || i >= m->items.size()) throw std::out_of_range("[gguf_meta] index out of range");
  return m->items[i];
}

void gguf_insert(mlxs_gguf_meta m, const char* key, mx::GGUFMetaData v) {
  if (!m) throw std::invalid_argument("[gguf_meta] null map");
  sorted_insert(m->items, std::string(cstr(key, "key")), std::move(v));
}

// The std::unordered_map MLX's Python bindings pass to save_safetensors for a dict: nanobind's
// dict caster emplaces the items one at a time, in the dict's order, into a default-constructed
// map, and the file's tensor data follows that map's iteration order (which depends on the
// insertion sequence and the rehashes along it, not on the set of keys alone). A map filled by
// mlxs_map_insert replays its insertion order; a loaded one (no order) its key order.
std::unordered_map<std::string, mx::array> insertion_ordered(mlxs_map m) {
  std::unordered_map<std::string, mx::array> t;
  if (m->order.size() != m->items.size()) {
    for (const auto& [k, a] : m->items) t.emplace(k, a);
    return t;
  }
  for (const auto& k : m->order) {
    auto it = std::lower_bound(m->items.begin(), m->items.end(), k,
                               [](const auto& p, const std::string& s) { return p.first < s; });
    t.emplace(k, it->second);
  }
  return t;
}

}  // namespace

extern "C" {

mlxs_map mlxs_map_new(void) { return new (std::nothrow) mlxs_map_{}; }
void mlxs_map_free(mlxs_map m) { delete m; }
int mlxs_map_insert(mlxs_map m, const char* key, mlxs_array a) {
  return guard([&] {
    if (!m) throw std::invalid_argument("[map_insert] null map");
    std::string k(cstr(key, "key"));
    auto it = std::lower_bound(m->items.begin(), m->items.end(), k,
                               [](const auto& p, const std::string& s) { return p.first < s; });
    if (it == m->items.end() || it->first != k) m->order.push_back(k);
    sorted_insert(m->items, std::move(k), A(a));
  });
}
size_t mlxs_map_size(mlxs_map m) { return m ? m->items.size() : 0; }
const char* mlxs_map_key(mlxs_map m, size_t i) {
  return (m && i < m->items.size()) ? m->items[i].first.c_str() : nullptr;
}
int mlxs_map_value(mlxs_array* out, mlxs_map m, size_t i) {
  return guard([&] {
    if (!m || i >= m->items.size()) throw std::out_of_range("[map_value] index out of range");
    put(out, m->items[i].second);
  });
}

mlxs_strmap mlxs_strmap_new(void) { return new (std::nothrow) mlxs_strmap_{}; }
void mlxs_strmap_free(mlxs_strmap m) { delete m; }
int mlxs_strmap_insert(mlxs_strmap m, const char* key, const char* value) {
  return guard([&] {
    if (!m) throw std::invalid_argument("[strmap_insert] null map");
    sorted_insert(m->items, std::string(cstr(key, "key")), std::string(cstr(value, "value")));
  });
}
size_t mlxs_strmap_size(mlxs_strmap m) { return m ? m->items.size() : 0; }
const char* mlxs_strmap_key(mlxs_strmap m, size_t i) {
  return (m && i < m->items.size()) ? m->items[i].first.c_str() : nullptr;
}
const char* mlxs_strmap_value(mlxs_strmap m, size_t i) {
  return (m && i < m->items.size()) ? m->items[i].second.c_str() : nullptr;
}

int mlxs_load_safetensors(mlxs_map* arrays, mlxs_strmap* metadata, const char* path,
                          mlxs_stream s) {
  return guard([&] {
    auto [tensors, meta] = mx::load_safetensors(std::string(cstr(path, "path")), S(s));
    auto a = std::make_unique<mlxs_map_>();
    a->items = sorted_items(tensors);
    auto m = std::make_unique<mlxs_strmap_>();
    m->items = sorted_items(meta);
    *arrays = a.release();
    *metadata = m.release();
  });
}

int mlxs_save_safetensors(const char* path, mlxs_map arrays, mlxs_strmap metadata) {
  return guard([&] {
    if (!arrays) throw std::invalid_argument("[save_safetensors] null map");
    auto t = insertion_ordered(arrays);
    std::unordered_map<std::string, std::string> m;
    if (metadata) m = {metadata->items.begin(), metadata->items.end()};
    mx::save_safetensors(std::string(cstr(path, "path")), std::move(t), std::move(m));
  });
}

int mlxs_load_npy(mlxs_array* out, const char* path, mlxs_stream s) {
  return guard([&] { put(out, mx::load(std::string(cstr(path, "path")), S(s))); });
}
int mlxs_save_npy(const char* path, mlxs_array a) {
  return guard([&] { mx::save(std::string(cstr(path, "path")), A(a)); });
}

mlxs_gguf_meta mlxs_gguf_meta_new(void) { return new (std::nothrow) mlxs_gguf_meta_{}; }
void mlxs_gguf_meta_free(mlxs_gguf_meta m) { delete m; }
size_t mlxs_gguf_meta_size(mlxs_gguf_meta m) { return m ? m->items.size() : 0; }
const char* mlxs_gguf_meta_key(mlxs_gguf_meta m, size_t i) {
  return (m && i < m->items.size()) ? m->items[i].first.c_str() : nullptr;
}
mlxs_gguf_kind mlxs_gguf_meta_kind(mlxs_gguf_meta m, size_t i) {
  if (!m || i >= m->items.size()) return MLXS_GGUF_NONE;
  const auto& v = m->items[i].second;
  if (std::holds_alternative<mx::array>(v)) return MLXS_GGUF_ARRAY;
  if (std::holds_alternative<std::string>(v)) return MLXS_GGUF_STRING;
  if (std::holds_alternative<std::vector<std::string>>(v)) return MLXS_GGUF_STRINGS;
  return MLXS_GGUF_NONE;
}
int mlxs_gguf_meta_array(mlxs_array* out, mlxs_gguf_meta m, size_t i) {
  return guard([&] {
    auto& item = gguf_item(m, i);
    auto* a = std::get_if<mx::array>(&item.second);
    if (!a) throw std::invalid_argument("[gguf_meta] " + item.first + " is not an array");
    put(out, *a);
  });
}
int mlxs_gguf_meta_string(const char** data, size_t* len, mlxs_gguf_meta m, size_t i) {
  return guard([&] {
    auto& item = gguf_item(m, i);
    auto* str = std::get_if<std::string>(&item.second);
    if (!str) throw std::invalid_argument("[gguf_meta] " + item.first + " is not a string");
    *data = str->data();
    *len = str->size();
  });
}
int mlxs_gguf_meta_strings_len(size_t* out, mlxs_gguf_meta m, size_t i) {
  return guard([&] {
    auto& item = gguf_item(m, i);
    auto* v = std::get_if<std::vector<std::string>>(&item.second);
    if (!v) throw std::invalid_argument("[gguf_meta] " + item.first + " is not a string list");
    *out = v->size();
  });
}
int mlxs_gguf_meta_strings_get(const char** data, size_t* len, mlxs_gguf_meta m, size_t i,
                               size_t j) {
  return guard([&] {
    auto& item = gguf_item(m, i);
    auto* v = std::get_if<std::vector<std::string>>(&item.second);
    if (!v) throw std::invalid_argument("[gguf_meta] " + item.first + " is not a string list");
    if (j >= v->size()) throw std::out_of_range("[gguf_meta] string index out of range");
    *data = (*v)[j].data();
    *len = (*v)[j].size();
  });
}
int mlxs_gguf_meta_insert_none(mlxs_gguf_meta m, const char* key) {
  return guard([&] { gguf_insert(m, key, std::monostate{}); });
}
int mlxs_gguf_meta_insert_array(mlxs_gguf_meta m, const char* key, mlxs_array a) {
  return guard([&] { gguf_insert(m, key, A(a)); });
}
int mlxs_gguf_meta_insert_string(mlxs_gguf_meta m, const char* key, const char* data,
                                 size_t len) {
  return guard([&] {
    if (!data && len) throw std::invalid_argument("[gguf_meta] null string");
    gguf_insert(m, key, std::string(data ? data : "", len));
  });
}
int mlxs_gguf_meta_insert_strings(mlxs_gguf_meta m, const char* key, const char* const* data,
                                  const size_t* lens, size_t n) {
  return guard([&] {
    if (n && (!data || !lens)) throw std::invalid_argument("[gguf_meta] null string list");
    std::vector<std::string> v;
    v.reserve(n);
    for (size_t j = 0; j < n; ++j) {
      if (!data[j] && lens[j]) throw std::invalid_argument("[gguf_meta] null string");
      v.emplace_back(data[j] ? data[j] : "", lens[j]);
    }
    gguf_insert(m, key, std::move(v));
  });
}

int mlxs_load_gguf(mlxs_map* arrays, mlxs_gguf_meta* metadata, const char* path,
                   mlxs_stream s) {
  return guard([&] {
    auto [tensors, meta] = mx::load_gguf(std::string(cstr(path, "path")), S(s));
    auto a = std::make_unique<mlxs_map_>();
    a->items = sorted_items(tensors);
    auto m = std::make_unique<mlxs_gguf_meta_>();
    m->items = sorted_items(meta);
    *arrays = a.release();
    *metadata = m.release();
  });
}

int mlxs_save_gguf(const char* path, mlxs_map arrays, mlxs_gguf_meta metadata) {
  return guard([&] {
    if (!arrays) throw std::invalid_argument("[save_gguf] null map");
    std::unordered_map<std::string, mx::array> t(arrays->items.begin(), arrays->items.end());
    std::unordered_map<std::string, mx::GGUFMetaData> m;
    if (metadata) m = {metadata->items.begin(), metadata->items.end()};
    mx::save_gguf(std::string(cstr(path, "path")), std::move(t), std::move(m));
  });
}

}  // extern "C"
