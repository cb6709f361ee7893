// llama.cpp's own detokenizer for the GGUF tokenizer goldens: `llama_detokenize` of the ids on
// stdin (one line, space-separated) with the vocabulary of argv[1], special tokens rendered,
// printed as raw bytes. Built by `goldens_gguf_rwkv.detokenize` against the llama.cpp the
// goldens run (`llama-tokenize`'s build).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf < ids\n", argv[0]);
        return 2;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    auto params = llama_model_default_params();
    params.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], params);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> ids;
    long v;
    while (std::cin >> v) {
        ids.push_back((llama_token) v);
    }
    std::string out(16 * ids.size() + 16, '\0');
    int32_t n = llama_detokenize(vocab, ids.data(), (int32_t) ids.size(), out.data(),
                                 (int32_t) out.size(), false, false);
    if (n < 0) {
        out.resize(-n);
        n = llama_detokenize(vocab, ids.data(), (int32_t) ids.size(), out.data(),
                             (int32_t) out.size(), false, false);
    }
    out.resize(n);
    std::fwrite(out.data(), 1, out.size(), stdout);
    llama_model_free(model);
    return 0;
}
