// Maps and file I/O.
#include "internal.hpp"

using namespace mlxs;

extern "C" {

mlxs_map mlxs_map_new(void) { return new mlxs_map_{}; }
void mlxs_map_free(mlxs_map m) { delete m; }
int mlxs_map_insert(mlxs_map m, const char* key, mlxs_array a) {
  return guard([&] {
    if (!m) throw std::invalid_argument("[map_insert] null map");
    sorted_insert(m->items, std::string(cstr(key, "key")), A(a));
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

mlxs_strmap mlxs_strmap_new(void) { return new mlxs_strmap_{}; }
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
    std::unordered_map<std::string, mx::array> t(arrays->items.begin(), arrays->items.end());
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

}  // extern "C"
