//! Errors as the OpenAI API returns them: an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use mlx_engine::batch::SubmitError;
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// The answer to a request the engine's queue refused (503 with `Retry-After` when full: the
    /// server is overloaded, not this client over a rate limit).
    pub fn refused(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull(_) => ApiError::overloaded(
                format!("The server is busy: {e}. Retry later."),
                "queue_full",
            ),
            SubmitError::TooManyTokens { .. } => {
                let mut busy = ApiError::busy(format!(
                    "The server is busy: {e} (--max-queued-tokens). Retry later."
                ));
                busy.code = Some("too_many_queued_tokens");
                busy
            }
            SubmitError::Stopped => ApiError::server(e.to_string()),
        }
    }

    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// OpenAI's `context_length_exceeded`: the prompt plus `max_tokens` do not fit.
    pub fn context_length(
        limit: usize,
        models_own: bool,
        prompt: usize,
        max_tokens: usize,
        chat: bool,
    ) -> Self {
        let (what, param) = if chat {
            ("messages", "messages")
        } else {
            ("prompt", "prompt")
        };
        let whose = if models_own {
            "This model's maximum context length"
        } else {
            "This server's maximum context length (--max-context)"
        };
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "{whose} is {limit} tokens. However, you requested {} tokens ({prompt} in the \
                 {what}, {max_tokens} in the completion). Please reduce the length of the \
                 {what} or completion.",
                prompt + max_tokens
            ),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: Some("context_length_exceeded"),
        }
    }

    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Incorrect or missing API key: send `Authorization: Bearer <key>`.".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist on this server."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    pub fn not_found(path: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("Unknown endpoint {path}"),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("The request body exceeds the limit of {limit} bytes."),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    pub fn busy(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    /// 503: the server cannot take the request now (its queue or its connections are
    /// full); the response carries `Retry-After`. OpenAI's clients retry 503s, honouring it.
    pub fn overloaded(message: impl Into<String>, code: &'static str) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some(code),
        }
    }

    /// 403: a `Host` header that names neither this server nor an allowed host (a page on
    /// another site reaching a local server through DNS rebinding sends its own name).
    pub fn host_not_allowed(host: &str) -> Self {
        ApiError {
            status: StatusCode::FORBIDDEN,
            message: format!(
                "The Host header {host:?} is not allowed: this server answers to localhost, IP \
                 addresses, its --host name and the names given with --allowed-hosts."
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("host_not_allowed"),
        }
    }

    /// 415: a JSON endpoint given another media type (`text/plain` is how a web page posts
    /// across sites without a CORS preflight).
    pub fn unsupported_media_type(given: Option<&str>) -> Self {
        let given = match given {
            Some(t) => format!("got Content-Type {t:?}"),
            None => "no Content-Type was given".to_string(),
        };
        ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: format!(
                "This endpoint takes a JSON body: send Content-Type: application/json ({given})."
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("unsupported_media_type"),
        }
    }

    /// 408: the request body did not arrive within the time allowed.
    pub fn body_timeout(secs: f64) -> Self {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!("The request body did not arrive within {secs} s (--header-timeout)."),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_timeout"),
        }
    }

    /// The error object for a status that a layer below the handlers answered without one
    /// (405 from routing, for one).
    pub fn from_status(status: StatusCode, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        let reason = status.canonical_reason().unwrap_or("Error");
        ApiError {
            status,
            message: if detail.is_empty() {
                reason.to_string()
            } else {
                format!("{reason}: {detail}")
            },
            kind: if status.is_server_error() {
                "server_error"
            } else {
                "invalid_request_error"
            },
            param: None,
            code: None,
        }
    }

    pub fn server(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if matches!(
            self.status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        ) {
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        r
    }
}

/// Seconds a client is asked to wait before retrying a 503 or 429.
pub const RETRY_AFTER_SECS: &str = "1";
