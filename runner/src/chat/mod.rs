//! Chat templates, rendered the way transformers' `apply_chat_template(tokenize=False)` renders
//! them: jinja2 with `trim_blocks` and `lstrip_blocks`, the template's trailing newline dropped,
//! Python's str/dict methods (minijinja-contrib's `pycompat`), transformers' globals
//! `raise_exception` and `strftime_now`, its `tojson` filter (`json.dumps`, see [`pyjson`]), the
//! tokenizer's special tokens (`bos_token`, `eos_token`, ...) as variables, `tools` and
//! `documents` (none unless given), and the message clean-up transformers does first: keys whose
//! value is null are dropped, and `reasoning` / `thinking` / `reasoning_content` alias each other.
//! `porter generate --chat` renders the prompt as one user message; `porter serve` renders the
//! request's messages with its `tools` and `chat_template_kwargs`.

mod pyjson;
mod strftime;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// The chat template of a model folder: `chat_template.jinja`, else `chat_template` in
/// `tokenizer_config.json` (a string, or a list of `{name, template}`, see [`select_named`]).
fn template(dir: &Path, config: &Value, has_tools: bool) -> Result<String> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja).with_context(|| format!("reading {}", jinja.display()));
    }
    match config.get("chat_template") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(list)) => select_named(list, has_tools),
        _ => bail!(
            "no chat template: {} has neither chat_template.jinja nor a chat_template in tokenizer_config.json",
            dir.display()
        ),
    }
}

/// Picks one of the named templates `[{"name": ..., "template": ...}, ...]` of
/// `tokenizer_config.json` as transformers does: `tool_use` when the request has tools and the
/// list has one, else `default`, else an error listing the names.
fn select_named(list: &[Value], has_tools: bool) -> Result<String> {
    let named = |name: &str| {
        list.iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
    };
    if has_tools {
        if let Some(t) = named("tool_use") {
            return Ok(t);
        }
    }
    named("default").ok_or_else(|| {
        let mut names: Vec<&str> = list.iter().filter_map(|t| t.get("name")?.as_str()).collect();
        names.sort_unstable();
        anyhow!("tokenizer_config.json has named chat templates but none called `default` (it has {names:?})")
    })
}

/// A special token of `tokenizer_config.json` (a string or `{"content": ...}`).
fn special(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        v => v.get("content")?.as_str().map(str::to_owned),
    }
}

/// The jinja environment transformers renders chat templates in, holding `source` as `chat`.
fn environment(source: &str) -> Result<minijinja::Environment<'_>> {
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
    env.set_syntax(syntax.map_err(|e| anyhow!("chat template syntax: {e}"))?);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("the chat template raised an exception: {msg}"),
        ))
    });
    env.add_function("strftime_now", strftime::strftime_now);
    env.add_filter("tojson", pyjson::tojson_filter);
    env.add_template("chat", source).map_err(|e| anyhow!("parsing the chat template: {e}"))?;
    Ok(env)
}

/// The messages as transformers hands them to the template: in each message object, keys whose
/// value is null are dropped, and a reasoning text (the first non-null of `reasoning_content`,
/// `thinking`, `reasoning`) is also put under `thinking` (unless set) and `reasoning_content`.
fn normalize_messages(messages: &Value) -> Value {
    let Some(list) = messages.as_array() else { return messages.clone() };
    let out = list.iter().map(|m| {
        let Some(obj) = m.as_object() else { return m.clone() };
        let obj: Map<String, Value> =
            obj.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
        let reasoning = ["reasoning_content", "thinking", "reasoning"].iter().find_map(|k| obj.get(*k)).cloned();
        let Some(r) = reasoning else { return Value::Object(obj) };
        // Python: {"thinking": r, **message, "reasoning_content": r}
        let mut aliased = Map::new();
        aliased.insert("thinking".into(), r.clone());
        aliased.extend(obj);
        aliased.insert("reasoning_content".into(), r);
        Value::Object(aliased)
    });
    Value::Array(out.collect())
}

/// Renders `[{"role": "user", "content": user}]` with the generation prompt appended.
pub fn render(dir: &Path, user: &str) -> Result<String> {
    let messages = serde_json::json!([{"role": "user", "content": user}]);
    render_messages(dir, None, &messages, true, &Map::new())
}

/// Renders OpenAI-style `messages` (a JSON array) with the model folder's chat template (or
/// `template_override`), `add_generation_prompt`, and extra template variables: `tools` (a list
/// of tool schemas; it also picks a named `tool_use` template) and the request's
/// `chat_template_kwargs` (such as `enable_thinking`), which override the special tokens.
///
/// A template's `raise_exception(msg)` comes back as an error whose message contains `msg`.
pub fn render_messages(
    dir: &Path,
    template_override: Option<&str>,
    messages: &Value,
    add_generation_prompt: bool,
    extra: &Map<String, Value>,
) -> Result<String> {
    let path = dir.join("tokenizer_config.json");
    let config: Value = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| anyhow!("{} is not valid JSON: {e}", path.display()))?,
        Err(_) => Value::Null,
    };
    let has_tools = extra.get("tools").is_some_and(|t| !t.is_null());
    let source = match template_override {
        Some(t) => t.to_owned(),
        None => template(dir, &config, has_tools)?,
    };
    let env = environment(&source)?;
    let mut ctx = std::collections::BTreeMap::new();
    let value = |v: &Value| minijinja::Value::from(minijinja::value::Serde(v));
    ctx.insert("messages".to_owned(), value(&normalize_messages(messages)));
    ctx.insert("add_generation_prompt".into(), minijinja::Value::from(add_generation_prompt));
    ctx.insert("tools".into(), minijinja::Value::from(())); // transformers passes tools=None
    ctx.insert("documents".into(), minijinja::Value::from(()));
    for key in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"] {
        if let Some(t) = special(&config, key) {
            ctx.insert(key.into(), minijinja::Value::from(t));
        }
    }
    for (k, v) in extra {
        ctx.insert(k.clone(), value(v));
    }
    let tmpl = env.get_template("chat").map_err(|e| anyhow!("{e}"))?;
    tmpl.render(minijinja::Value::from(ctx)).map_err(|e| anyhow!("rendering the chat template: {e}"))
}

#[cfg(test)]
mod tests;
