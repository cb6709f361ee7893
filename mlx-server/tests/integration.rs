//! mlx-server's integration tests as one test binary: each file of `tests/` is a module here,
//! so that the workspace links one test executable per crate instead of one per file (disk
//! and link time on CI's 2-core machine). Files that need a process of their own (the
//! global PRNG key, environment variables, re-running the test executable) or a feature
//! are separate `[[test]]` targets in Cargo.toml; xtask's `every_test_file_is_built`
//! checks that no file of `tests/` is left out of both.

mod common;

mod chat_page;
mod embeddings;
mod http;
mod limits;
mod openai_client;
mod speculative;
mod template_bomb;
mod tools;
