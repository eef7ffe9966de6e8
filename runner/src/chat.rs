//! `porter generate --chat`: the prompt as one user message, rendered with the model folder's
//! chat template the way transformers' `apply_chat_template(add_generation_prompt=True)`
//! renders it: jinja2 with `trim_blocks` and `lstrip_blocks`, the trailing newline of the
//! template dropped, `raise_exception` defined, and the tokenizer's special tokens
//! (`bos_token`, `eos_token`, ...) as variables.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::path::Path;

/// The chat template of a model folder: `chat_template.jinja`, else `chat_template` in
/// `tokenizer_config.json` (a string, or a list of `{name, template}` with a `default`).
fn template(dir: &Path, config: &Value) -> Result<String> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja).with_context(|| format!("reading {}", jinja.display()));
    }
    match config.get("chat_template") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
            .ok_or_else(|| anyhow!("tokenizer_config.json has named chat templates but none called `default`")),
        _ => bail!(
            "no chat template: {} has neither chat_template.jinja nor a chat_template in tokenizer_config.json",
            dir.display()
        ),
    }
}

/// A special token of `tokenizer_config.json` (a string or `{"content": ...}`).
fn special(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        v => v.get("content")?.as_str().map(str::to_owned),
    }
}

/// Renders `[{"role": "user", "content": user}]` with the generation prompt appended.
pub fn render(dir: &Path, user: &str) -> Result<String> {
    let messages = serde_json::json!([{"role": "user", "content": user}]);
    render_messages(dir, None, &messages, true, &serde_json::Map::new())
}

/// Renders OpenAI-style `messages` (a JSON array) with the model folder's chat template (or
/// `template_override`), `add_generation_prompt`, and extra template variables (`tools`,
/// `chat_template_kwargs` such as `enable_thinking`).
pub fn render_messages(
    dir: &Path,
    template_override: Option<&str>,
    messages: &Value,
    add_generation_prompt: bool,
    extra: &serde_json::Map<String, Value>,
) -> Result<String> {
    let path = dir.join("tokenizer_config.json");
    let config: Value = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| anyhow!("{} is not valid JSON: {e}", path.display()))?,
        Err(_) => Value::Null,
    };
    let source = match template_override {
        Some(t) => t.to_owned(),
        None => template(dir, &config)?,
    };
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
    env.set_syntax(syntax.map_err(|e| anyhow!("chat template syntax: {e}"))?);
    env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_template("chat", &source).map_err(|e| anyhow!("parsing the chat template: {e}"))?;
    let mut ctx: Vec<(String, minijinja::Value)> = vec![
        ("messages".into(), minijinja::Value::from(minijinja::value::Serde(messages))),
        ("add_generation_prompt".into(), minijinja::Value::from(add_generation_prompt)),
    ];
    for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
        if let Some(t) = special(&config, key) {
            ctx.push((key.into(), minijinja::Value::from(t)));
        }
    }
    for (k, v) in extra {
        ctx.push((k.clone(), minijinja::Value::from(minijinja::value::Serde(v))));
    }
    let tmpl = env.get_template("chat").map_err(|e| anyhow!("{e}"))?;
    let ctx: std::collections::BTreeMap<String, minijinja::Value> = ctx.into_iter().collect();
    tmpl.render(minijinja::Value::from(ctx)).map_err(|e| anyhow!("rendering the chat template: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renderings equal transformers' `apply_chat_template` for SmolLM2's template (the hub
    /// files of tests/fixtures/smollm2_ref/hub): default system message, explicit system,
    /// multi-turn with an assistant turn and non-ASCII text, no generation prompt
    /// (tests/gen_chat_golden.py wrote the goldens).
    #[test]
    fn smollm2_renderings_equal_transformers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = root.join("tests/fixtures/smollm2_ref/hub");
        let text = std::fs::read_to_string(root.join("tests/fixtures/chat_golden/smollm2.json")).unwrap();
        let golden: Value = serde_json::from_str(&text).unwrap();
        let chats = golden["chats"].as_array().unwrap();
        assert_eq!(chats.len(), 4);
        for (i, c) in chats.iter().enumerate() {
            let add = c["add_generation_prompt"].as_bool().unwrap();
            let got = render_messages(&dir, None, &c["messages"], add, &serde_json::Map::new()).unwrap();
            assert_eq!(got, c["rendered"].as_str().unwrap(), "chat {i}");
        }
    }
}
