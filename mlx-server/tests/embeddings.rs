//! `POST /v1/embeddings` on the dense qwen3 fixture: equal bit for bit to mlx-lm's last-token,
//! L2-normalised hidden states (`cargo xtask goldens serve`) and to the library's
//! `mlx_models::embed::embed`, as floats and as base64; bad inputs get 400s.

use crate::common;

use common::{post, serve_golden, server_fixture, TestServer};
use mlx_models::embed::{embed, to_vecs};
use serde_json::{json, Value};

fn rows(v: &Value) -> Vec<Vec<f32>> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(
                (d["object"].as_str(), d["index"].as_u64()),
                (Some("embedding"), Some(i as u64))
            );
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn unbase64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .filter(|&&c| c != b'=')
            .fold((0u32, 0), |(n, k), &c| {
                (n | u32::from(val(c)) << (18 - 6 * k), k + 1)
            });
        let bytes = [(n.0 >> 16) as u8, (n.0 >> 8) as u8, n.0 as u8];
        out.extend_from_slice(&bytes[..n.1 - 1]);
    }
    out
}

#[test]
fn embeddings_equal_mlx_lm_and_the_library_call() {
    let g = &serve_golden()["embeddings"];
    let want: Vec<Vec<f32>> = g["float32"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    let dir = server_fixture("embed_qwen3");
    let s = TestServer::start_model(&dir, &[]);

    // Token ids.
    let r = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": g["inputs"], "model": "embed_qwen3"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "embed_qwen3");
    let ids: Vec<Vec<i32>> = serde_json::from_value(g["token_ids"].clone()).unwrap();
    let n_ids = g["inputs"].as_array().unwrap().len();
    let got = rows(&v);
    assert_eq!(bits(&got), bits(&want[..n_ids]));
    let tokens: usize = ids[..n_ids].iter().map(Vec::len).sum();
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": tokens, "total_tokens": tokens})
    );

    // Texts, tokenized by the server as mlx-lm's tokenizer encodes them.
    let v = post(s.addr, "/v1/embeddings", &json!({"input": g["texts"]})).json();
    assert_eq!(bits(&rows(&v)), bits(&want[n_ids..]));
    // One text, one id list.
    let v = post(s.addr, "/v1/embeddings", &json!({"input": g["texts"][1]})).json();
    assert_eq!(bits(&rows(&v)), bits(&want[n_ids + 1..]));
    let v = post(s.addr, "/v1/embeddings", &json!({"input": g["inputs"][0]})).json();
    assert_eq!(bits(&rows(&v)), bits(&want[..1]));

    // base64: the float32 values, little-endian.
    let v = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": g["inputs"], "encoding_format": "base64"}),
    )
    .json();
    for (i, d) in v["data"].as_array().unwrap().iter().enumerate() {
        let b = unbase64(d["embedding"].as_str().unwrap());
        let x: Vec<u32> = b
            .chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(x, bits(&want[i..i + 1])[0]);
    }

    // The library call on the same model gives the same rows.
    let (model, _) = mlx_models::load::load_model_dir(&dir, &Default::default()).unwrap();
    let ids: Vec<Vec<u32>> = ids
        .iter()
        .map(|r| r.iter().map(|&t| t as u32).collect())
        .collect();
    let lib = to_vecs(&embed(model.as_ref(), &ids).unwrap()).unwrap();
    assert_eq!(bits(&lib), bits(&want));

    // Bad inputs: 400s naming the field; the server keeps serving.
    for (body, param) in [
        (json!({"input": [[1, 96]]}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": [[]]}), "input"),
        (json!({"input": [1.5]}), "input"),
        (json!({"input": {"a": 1}}), "input"),
        (json!({}), "input"),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": "a", "dimensions": 8}), "dimensions"),
    ] {
        let r = post(s.addr, "/v1/embeddings", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    let r = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": "a", "model": "other"}),
    );
    assert_eq!(r.status, 404);
    let r = post(s.addr, "/v1/embeddings", &json!({"input": "ok"}));
    assert_eq!(r.status, 200);
}
