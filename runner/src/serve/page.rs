//! `GET /`: the chat page, one self-contained file (`chat.html`: HTML, CSS and vanilla JS, no
//! external assets, no build step) compiled into the binary.
//!
//! The page is open without the API key (like `/health`); it asks for the key itself, keeps it
//! in `localStorage` and sends it as `Authorization: Bearer` to `/v1/models` and
//! `/v1/chat/completions`, whose replies it streams (SSE read from the `fetch` body; the Stop
//! button aborts the fetch, and the server aborts the engine request on the disconnect).
//! `tests/python/test_chat_page.py` drives it in headless Chromium.

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

/// The page's source.
pub const CHAT_HTML: &str = include_str!("chat.html");

/// The handler of `GET /`: [`CHAT_HTML`] as `text/html; charset=utf-8`.
pub async fn page() -> Response {
    ([(CONTENT_TYPE, "text/html; charset=utf-8")], CHAT_HTML).into_response()
}

#[cfg(test)]
mod tests {
    use super::CHAT_HTML;

    #[test]
    fn has_the_ids_the_test_drives_and_no_external_assets() {
        for id in ["model", "input", "send", "stop", "messages", "status", "temperature", "max-tokens", "api-key"] {
            assert!(CHAT_HTML.contains(&format!("id=\"{id}\"")), "chat.html lacks #{id}");
        }
        for bad in ["http://", "https://", "innerHTML", "<link", "src="] {
            assert!(!CHAT_HTML.contains(bad), "chat.html contains `{bad}`");
        }
    }
}
