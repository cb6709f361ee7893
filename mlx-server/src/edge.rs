//! The outermost layer: CORS as mlx_lm.server answers it (`--allowed-origins`; preflight
//! `OPTIONS` answered 204 on every path; `Access-Control-Allow-Origin` on every response,
//! errors and streams included), and the `/metrics` request count by endpoint and status.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::state::Shared;

pub(crate) fn layer(router: Router, state: Shared) -> Router {
    router.layer(axum::middleware::from_fn_with_state(state, edge))
}

async fn edge(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let requested = req
        .headers()
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned();
    let path = req.uri().path().to_string();
    let preflight = req.method() == Method::OPTIONS;
    let mut resp = if preflight {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    state.metrics.count_request(&path, resp.status().as_u16());
    let allowed = &state.args.allowed_origins;
    let h = resp.headers_mut();
    if allowed.iter().any(|o| o.trim() == "*") {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
    } else if let Some(o) = origin.filter(|o| {
        o.to_str()
            .is_ok_and(|o| allowed.iter().any(|a| a.trim() == o))
    }) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("*"),
    );
    // `*` does not cover `Authorization` in browsers: the headers a preflight asks for are
    // named too.
    let headers = match requested {
        Some(r) if !r.is_empty() => {
            HeaderValue::from_str(&format!("*, {}", r.to_str().unwrap_or("")))
                .unwrap_or(HeaderValue::from_static("*"))
        }
        _ => HeaderValue::from_static("*"),
    };
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, headers);
    resp
}
