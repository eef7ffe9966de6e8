//! Structured output's shared state (`response_format` `json_object` / `json_schema`, vLLM's
//! `guided_json`): the tokenizer's token bytes and the compiled schemas.

use super::{text, Server};
use porter_core::engine::sampling::{JsonMode, JsonVocab, Schema};
use std::sync::{Arc, Mutex};

/// The shared state of structured output (`response_format`).
#[derive(Default)]
pub struct Structured {
    vocab: std::sync::OnceLock<Arc<JsonVocab>>,
    any_object: std::sync::OnceLock<Arc<Schema>>,
    /// Compiled schemas by their JSON text (their allowed-token caches live with them).
    schemas: Mutex<std::collections::HashMap<String, Arc<Schema>>>,
}

/// Compiled schemas a server keeps (then it starts over). Each holds up to 256 allowed-token
/// sets of a vocabulary's bits (19 KB at Qwen's 151k ids): at most ≈ 80 MB in all.
const KEPT_SCHEMAS: usize = 16;

impl Server {
    /// The token bytes of structured output, built once.
    fn json_vocab(&self) -> Arc<JsonVocab> {
        self.structured
            .vocab
            .get_or_init(|| Arc::new(JsonVocab::new(&text::token_bytes(&self.tok, self.vocab))))
            .clone()
    }

    /// The constraint of `response_format: {"type": "json_object"}`.
    pub fn json_object(&self) -> JsonMode {
        let schema = self.structured.any_object.get_or_init(|| Arc::new(Schema::any_object())).clone();
        JsonMode { vocab: self.json_vocab(), schema }
    }

    /// The constraint of a JSON schema (compiled once per distinct schema text); `Err`: why the
    /// schema is not supported.
    pub fn json_schema(&self, schema: &serde_json::Value) -> std::result::Result<JsonMode, String> {
        self.kept(format!("schema:{schema}"), || Schema::compile(schema))
    }

    /// The constraint of a schema of the server's own, whose root may be any type (the array
    /// of tool calls of `tool_choice: "required"`).
    pub fn json_schema_value(&self, schema: &serde_json::Value) -> std::result::Result<JsonMode, String> {
        self.kept(format!("value:{schema}"), || Schema::compile_value(schema))
    }

    /// The constraint of vLLM's `guided_choice` (the output is one of `choices`).
    pub fn json_choice(&self, choices: &[String]) -> std::result::Result<JsonMode, String> {
        let key = format!("choice:{}", serde_json::Value::from(choices.to_vec()));
        self.kept(key, || Schema::choice(choices))
    }

    /// The compiled schema kept under `key`, else `make`'s (then kept).
    fn kept(
        &self,
        key: String,
        make: impl FnOnce() -> std::result::Result<Schema, String>,
    ) -> std::result::Result<JsonMode, String> {
        let kept = self.structured.schemas.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        let schema = match kept {
            Some(s) => s,
            None => {
                let s = Arc::new(make()?);
                let mut all = self.structured.schemas.lock().unwrap_or_else(|e| e.into_inner());
                if all.len() >= KEPT_SCHEMAS {
                    all.clear();
                }
                all.insert(key, s.clone());
                s
            }
        };
        Ok(JsonMode { vocab: self.json_vocab(), schema })
    }
}
