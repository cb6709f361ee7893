//! `POST /v1/embeddings`: sentence embeddings (last-token pooling, L2-normalised, float32) from
//! [`mlx_models::embed::embed`], run on the engine thread, in the OpenAI API's shape.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::guard::accept;
use crate::request::too_large;
use crate::state::{AppState, Shared};

/// A validated embeddings request.
struct EmbedRequest {
    model: String,
    inputs: Vec<Vec<i32>>,
    base64: bool,
}

fn parse(state: &AppState, bytes: &[u8]) -> Result<EmbedRequest, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("The request body is not valid JSON: {e}")))?;
    let body = value
        .as_object()
        .ok_or_else(|| ApiError::bad_request("The request body must be a JSON object"))?;
    let model = match body.get("model") {
        None | Some(Value::Null) => state.model_id.clone(),
        Some(Value::String(m)) if state.knows_model(m) => m.clone(),
        Some(Value::String(m)) => return Err(ApiError::model_not_found(m)),
        Some(v) => {
            return Err(ApiError::invalid(
                "model",
                format!("`model` must be a string, got {v}"),
            ))
        }
    };
    let base64 = match body.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(v) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("`encoding_format` must be \"float\" or \"base64\", got {v}"),
            ))
        }
    };
    if let Some(d) = body.get("dimensions").filter(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("`dimensions` is not supported (got {d}): embeddings have the model's width"),
        ));
    }
    let bad = || {
        ApiError::invalid(
            "input",
            "`input` must be a string, a list of strings, a list of token ids or a list of \
             lists of token ids",
        )
    };
    let vocab = state.engine.vocab_size();
    let ids = |v: &Value| -> Result<Vec<i32>, ApiError> {
        let items = v.as_array().ok_or_else(bad)?;
        items
            .iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| (t as usize) < vocab)
                    .map(|t| t as i32)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "input",
                            format!("token {t} is not an id in the vocabulary of {vocab}"),
                        )
                    })
            })
            .collect()
    };
    let tokenizer = state.engine.tokenizer();
    let text = |s: &str| -> Result<Vec<i32>, ApiError> {
        let ids = tokenizer
            .encode(s, true)
            .map_err(|e| ApiError::invalid("input", format!("tokenizing the input: {e}")))?;
        Ok(ids.into_iter().map(|t| t as i32).collect())
    };
    // Counted before anything is tokenized.
    let max_inputs = state.args.max_embedding_inputs;
    if let Some(Value::Array(items)) = body.get("input") {
        if items.len() > max_inputs && !items[0].is_number() {
            return Err(too_large(
                "input",
                format!(
                    "`input` has {} items, more than this server's limit of {max_inputs} \
                     (--max-embedding-inputs)",
                    items.len()
                ),
            ));
        }
    }
    let inputs: Vec<Vec<i32>> = match body.get("input") {
        Some(Value::String(s)) => vec![text(s)?],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid("input", "`input` must not be empty"))
        }
        Some(Value::Array(items)) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|v| v.as_str().ok_or_else(bad).and_then(text))
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![ids(&Value::Array(items.clone()))?],
            Value::Array(_) => items.iter().map(ids).collect::<Result<_, _>>()?,
            _ => return Err(bad()),
        },
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "`input` is required")),
        Some(_) => return Err(bad()),
    };
    for (i, x) in inputs.iter().enumerate() {
        if x.is_empty() {
            return Err(ApiError::invalid(
                "input",
                format!("input {i} encodes to no tokens"),
            ));
        }
        if x.len() > state.max_context {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "input {i} has {} tokens, more than the context of {} tokens",
                    x.len(),
                    state.max_context
                ),
            ));
        }
        let limit = state.args.max_embedding_input_tokens;
        if x.len() > limit {
            return Err(too_large(
                "input",
                format!(
                    "input {i} has {} tokens, more than this server's limit of {limit} tokens \
                     per input (--max-embedding-input-tokens)",
                    x.len()
                ),
            ));
        }
    }
    let total: usize = inputs.iter().map(Vec::len).sum();
    if total > state.args.max_request_tokens {
        return Err(too_large(
            "input",
            format!(
                "the inputs have {total} tokens together, more than this server's limit of {} \
                 tokens per request (--max-request-tokens)",
                state.args.max_request_tokens
            ),
        ));
    }
    Ok(EmbedRequest {
        model,
        inputs,
        base64,
    })
}

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The handler of `POST /v1/embeddings`.
pub async fn embeddings(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let bytes = accept(&state, &headers, body)?;
        let st = state.clone();
        let req = tokio::task::spawn_blocking(move || parse(&st, &bytes))
            .await
            .map_err(|e| ApiError::server(format!("parsing the request: {e}")))??;
        let tokens: usize = req.inputs.iter().map(Vec::len).sum();
        let (tx, rx) = tokio::sync::oneshot::channel();
        state
            .engine
            .submit_embed(
                req.inputs,
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            )
            .map_err(ApiError::refused)?;
        let rows = rx
            .await
            .map_err(|_| ApiError::server("the engine dropped the request"))?
            .map_err(ApiError::bad_request)?;
        let data: Vec<Value> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let embedding = if req.base64 {
                    let bytes: Vec<u8> = row.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64(&bytes))
                } else {
                    json!(row)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        tracing::info!(
            route = "/v1/embeddings",
            inputs = rows.len(),
            tokens,
            status = 200,
            "request"
        );
        Ok::<_, ApiError>(json!({
            "object": "list",
            "data": data,
            "model": req.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
    }
    .await;
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            tracing::warn!(route = "/v1/embeddings", status = e.status.as_u16(), error = %e.message, "request rejected");
            e.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_as_python_encodes_it() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(super::base64(&[0xff, 0xfe, 0x00, 0x01]), "//4AAQ==");
    }
}
