//! mlx-engine's integration tests as one test binary: each file of `tests/` is a module here,
//! so that the workspace links one test executable per crate instead of one per file (disk
//! and link time on CI's 2-core machine). Files that need a process of their own (the
//! global PRNG key, environment variables, re-running the test executable) or a feature
//! are separate `[[test]]` targets in Cargo.toml; xtask's `every_test_file_is_built`
//! checks that no file of `tests/` is left out of both.

mod common;

mod bad_files;
mod chat_session;
mod chunked_prefill;
mod compiled_decode;
mod cpu_decode;
mod cpu_decode_gemma3;
mod cpu_decode_smollm2;
mod cpu_spec;
mod gemma3_gguf;
mod prompt_dense;
mod smollm2_gguf;
mod smollm2_gguf_logits;
mod smollm2_tokenizer;
mod tokenizer_decoding_only;
mod tokenizer_gguf;
mod tokenizer_gguf_spm;
mod tokenizer_gguf_wpm;
mod tokenizer_goldens;
mod tokenizer_stream;
mod trellis_kv;
