//! What every request passes before a handler, and every error answer after it: the `Host`
//! check (DNS rebinding), the JSON media type of the API's POST endpoints (a web page can
//! only post `text/plain`, form or multipart bodies across sites without a CORS preflight),
//! the body read within a time limit and under the size limit, and an OpenAI error object
//! on every 4xx/5xx, including those answered below the handlers (405 from routing).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::args::ServeArgs;
use crate::error::ApiError;
use crate::state::Shared;

/// The rules, from the options.
pub(crate) struct Guard {
    /// `--allowed-hosts`, lower case, without a trailing dot.
    allowed: Vec<String>,
    any_host: bool,
    /// `--host`, lower case, brackets removed.
    bound_host: String,
    max_body: usize,
    body_timeout: Duration,
    body_timeout_secs: f64,
}

impl Guard {
    pub(crate) fn new(args: &ServeArgs) -> Guard {
        let norm = |s: &str| {
            let s = s.trim().to_ascii_lowercase();
            s.strip_suffix('.').map(str::to_string).unwrap_or(s)
        };
        let allowed: Vec<String> = args
            .allowed_hosts
            .iter()
            .map(|h| norm(h))
            .filter(|h| !h.is_empty())
            .collect();
        let bound = norm(&args.host);
        Guard {
            any_host: allowed.iter().any(|h| h == "*"),
            allowed,
            bound_host: bound
                .strip_prefix('[')
                .and_then(|b| b.strip_suffix(']'))
                .map(str::to_string)
                .unwrap_or(bound),
            max_body: args.max_body_bytes,
            body_timeout: args.conn_limits().header_timeout,
            body_timeout_secs: args.header_timeout,
        }
    }

    /// Whether a `Host` value (a name or address, with or without a port) names this server.
    /// IP addresses are accepted: a page that rebinds a DNS name to this machine sends that
    /// name, never an address; a name is accepted when it is `localhost`, `--host` or given
    /// by `--allowed-hosts`.
    pub(crate) fn host_allowed(&self, value: &str) -> bool {
        if self.any_host {
            return true;
        }
        let value = value.trim().to_ascii_lowercase();
        let name = strip_port(&value);
        let name = name.strip_suffix('.').unwrap_or(name);
        if name.is_empty() {
            return false;
        }
        if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
            return v6.parse::<Ipv6Addr>().is_ok();
        }
        if name == "localhost" || name.parse::<Ipv4Addr>().is_ok() || name == self.bound_host {
            return true;
        }
        self.allowed.iter().any(|a| match a.strip_prefix('.') {
            // `.example.com`: the domain and its subdomains.
            Some(domain) => name == domain || name.ends_with(a.as_str()),
            None => name == a,
        })
    }

    fn check_host(&self, req: &Request) -> Result<(), ApiError> {
        let hosts: Vec<_> = req.headers().get_all(header::HOST).iter().collect();
        if hosts.len() > 1 {
            return Err(ApiError::bad_request("More than one Host header."));
        }
        if let Some(h) = hosts.first() {
            let text = String::from_utf8_lossy(h.as_bytes());
            if !self.host_allowed(&text) {
                return Err(ApiError::host_not_allowed(&text));
            }
        }
        // An absolute-form target (`POST http://name/...`) names the host too.
        if let Some(a) = req.uri().authority() {
            if !self.host_allowed(a.as_str()) {
                return Err(ApiError::host_not_allowed(a.as_str()));
            }
        }
        Ok(())
    }
}

/// `name:port` -> `name`; `[v6]:port` -> `[v6]`; anything else unchanged.
fn strip_port(h: &str) -> &str {
    if h.starts_with('[') {
        return match h.find(']') {
            Some(i) => &h[..=i],
            None => h,
        };
    }
    match h.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => h,
    }
}

/// Whether a `Content-Type` is JSON (`application/json`, parameters such as `charset`
/// allowed).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The router with the checks in front of every route and the fallback.
pub(crate) fn layer(router: Router, guard: Arc<Guard>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(guard, check))
}

async fn check(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let resp = match admit(&g, req).await {
        Ok(req) => next.run(req).await,
        Err(e) => {
            tracing::warn!(%method, path, status = e.status.as_u16(), error = %e.message, "request refused");
            return e.into_response();
        }
    };
    with_error_body(resp, &method, &path)
}

/// The checks, and the body read whole (within the time limit, under the size limit).
async fn admit(g: &Guard, req: Request) -> Result<Request, ApiError> {
    g.check_host(&req)?;
    if req.method() == Method::POST
        && req.uri().path().starts_with("/v1/")
        && !is_json(req.headers())
    {
        let given = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return Err(ApiError::unsupported_media_type(given.as_deref()));
    }
    let (parts, body) = req.into_parts();
    // A client that sends its body slowly would hold its connection (and a slot of
    // --max-connections) for as long as it likes; the body gets the head's time limit.
    let bytes =
        match tokio::time::timeout(g.body_timeout, axum::body::to_bytes(body, g.max_body)).await {
            Err(_) => return Err(ApiError::body_timeout(g.body_timeout_secs)),
            Ok(Err(e)) => {
                let limited = std::error::Error::source(&e)
                    .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                    || e.to_string().contains("length limit exceeded");
                return Err(if limited {
                    ApiError::too_large(g.max_body)
                } else {
                    ApiError::bad_request(format!("reading the request body: {e}"))
                });
            }
            Ok(Ok(b)) => b,
        };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// An error status answered without a JSON body (405 from routing, for one) gets the
/// OpenAI error object; `Allow` and `Retry-After` are kept.
fn with_error_body(resp: Response, method: &Method, path: &str) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(resp.headers()) {
        return resp;
    }
    let detail = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allow = resp
                .headers()
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            format!("{method} is not allowed on {path} (allowed: {allow})")
        }
        _ => format!("{method} {path}"),
    };
    let mut out = ApiError::from_status(status, detail).into_response();
    for name in [header::ALLOW, header::RETRY_AFTER] {
        if let Some(v) = resp.headers().get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}

/// The API key check (`--api-key`: `Authorization: Bearer KEY`, compared in constant time).
pub(crate) fn authorize(state: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.args.api_key else {
        return Ok(());
    };
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compare without an early exit, so timing does not reveal a prefix of the key.
    let ok = given.is_some_and(|g| {
        g.len() == key.len()
            && g.bytes()
                .zip(key.bytes())
                .fold(0u8, |a, (x, y)| a | (x ^ y))
                == 0
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

/// The API key check and the body of a POST (413 past the size limit).
pub(crate) fn accept(
    state: &Shared,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    authorize(state, headers)?;
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(state.args.max_body_bytes)
        } else {
            ApiError::bad_request(format!("reading the request body: {e}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn guard(extra: &[&str]) -> Guard {
        let mut argv = vec!["mlx-serve"];
        argv.extend_from_slice(extra);
        Guard::new(&Cli::parse_from(argv).serve)
    }

    #[test]
    fn hosts() {
        let g = guard(&[]);
        for ok in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "localhost.",
            "[::1]",
            "[::1]:8080",
            "10.1.2.3:80",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "[not-v6]",
            "",
            ":8080",
            "::1",
        ] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
        let g = guard(&[
            "--allowed-hosts",
            "box.lan,.example.com",
            "--host",
            "myhost",
        ]);
        for ok in [
            "box.lan:8080",
            "example.com",
            "a.example.com",
            "myhost:8080",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in ["evil.example", "badexample.com", "box.lan.evil"] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
        assert!(guard(&["--allowed-hosts", "*"]).host_allowed("evil.example"));
    }
}
