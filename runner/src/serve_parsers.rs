//! Output parsers for `porter serve`: the Qwen3 reasoning split (`--reasoning-parser qwen3`)
//! and the hermes tool-call parser (`--tool-call-parser hermes`).
//!
//! Both come in two forms that agree exactly: a non-streaming `parse` over the whole model
//! output, and a streaming state machine (`push` per decoded text delta, then `finish`) whose
//! concatenated output equals `parse` for every way of splitting the text into deltas. Partial
//! tags at the end of a delta are held back until the next delta resolves them.
//!
//! The server runs the reasoning parser first and feeds its `content` to the tool parser.
//! Formats follow vLLM (`vllm/reasoning/qwen3_reasoning_parser.py`,
//! `vllm/tool_parsers/hermes_tool_parser.py`); deviations are noted on each item.

// The server wires these in; until then parts of the API are only used by the tests.

use serde_json::Value;

/// Opening tag of a Qwen3 think block.
const THINK_START: &str = "<think>";
/// Closing tag of a Qwen3 think block.
const THINK_END: &str = "</think>";
/// Opening tag of a hermes tool-call block.
const TOOL_OPEN: &str = "<tool_call>";
/// Closing tag of a hermes tool-call block.
const TOOL_CLOSE: &str = "</tool_call>";

/// Length of the longest suffix of `text` that is a proper prefix of one of `tags`
/// (a tag that may still be completed by the next delta). Tags are ASCII and start with
/// `<`, so the returned split point is always a char boundary.
fn partial_tag_len(text: &str, tags: &[&str]) -> usize {
    let bytes = text.as_bytes();
    let mut best = 0;
    for tag in tags {
        let tag = tag.as_bytes();
        let max = (tag.len() - 1).min(bytes.len());
        for len in (best + 1..=max).rev() {
            if bytes[bytes.len() - len..] == tag[..len] {
                best = len;
                break;
            }
        }
    }
    best
}

/// The largest char boundary of `text` at or below `at` (used to resume a substring search
/// without re-scanning the whole buffer).
fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Where a Qwen3 think block starts, which decides how text without tags is classified.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ThinkMode {
    /// Detect from the output (vLLM's Qwen3 semantics): if `</think>` appears, everything
    /// before it is reasoning (a leading `<think>` is stripped; the template may have opened
    /// the block in the prompt); if only `<think>` appears, everything is reasoning (the
    /// output was truncated mid-thought); if neither appears, everything is content. While
    /// no tag has been seen the streaming parser must hold text back, since either outcome
    /// is still possible.
    #[default]
    Detect,
    /// The prompt opened the think block (Qwen3 thinking templates end with `<think>\n`):
    /// text streams as reasoning at once until `</think>`; without `</think>` everything is
    /// reasoning.
    Open,
}

/// One streamed increment of the reasoning split. Either field may be empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReasoningDelta {
    /// New text for `delta.reasoning_content`.
    pub reasoning: String,
    /// New text for `delta.content`.
    pub content: String,
}

/// Internal state of [`ReasoningParser`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ThinkState {
    /// [`ThinkMode::Detect`] before any tag: all text is held.
    Undecided,
    /// Inside the think block; `stripped` is set once the first `<think>` has been removed.
    Reasoning { stripped: bool },
    /// After `</think>` (or decided as plain content): text passes through.
    Content,
}

/// The Qwen3 reasoning parser: splits `<think>…</think>` from model text.
///
/// Only the first `</think>` ends reasoning and only the first `<think>` before it is
/// stripped; later tags stay in the text. Text before a `<think>` counts as reasoning
/// (vLLM drops it). Content is not trimmed.
#[derive(Clone, Debug)]
pub struct ReasoningParser {
    /// How the think block starts.
    mode: ThinkMode,
    /// Streaming state.
    state: ThinkState,
    /// Text received but not yet emitted (a partial tag, or everything while undecided).
    held: String,
    /// Byte offset in `held` before which no tag can start (undecided state only).
    scan_from: usize,
    /// Whether a think tag has been seen.
    tag_seen: bool,
}

impl ReasoningParser {
    /// A fresh parser (streaming state at the start of the output).
    pub fn new(mode: ThinkMode) -> Self {
        let state = match mode {
            ThinkMode::Detect => ThinkState::Undecided,
            ThinkMode::Open => ThinkState::Reasoning { stripped: false },
        };
        Self { mode, state, held: String::new(), scan_from: 0, tag_seen: false }
    }

    /// Split a complete output into `(reasoning, content)`. `reasoning` is `None` only when
    /// there is no reasoning at all ([`ThinkMode::Detect`] and neither tag present). Does
    /// not touch the streaming state.
    pub fn parse(&self, text: &str) -> (Option<String>, String) {
        let end = text.find(THINK_END);
        if self.mode == ThinkMode::Detect && end.is_none() && !text.contains(THINK_START) {
            return (None, text.to_string());
        }
        let (reasoning, content) = match end {
            Some(e) => (&text[..e], &text[e + THINK_END.len()..]),
            None => (text, ""),
        };
        (Some(reasoning.replacen(THINK_START, "", 1)), content.to_string())
    }

    /// Whether the output (so far) has a reasoning part: always true in [`ThinkMode::Open`],
    /// and in [`ThinkMode::Detect`] once a tag has been seen. After [`finish`](Self::finish)
    /// this equals `parse(text).0.is_some()`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn has_reasoning(&self) -> bool {
        self.mode == ThinkMode::Open || self.tag_seen
    }

    /// Consumes the first tag in `held` (`start` / `end`: positions of `<think>` and
    /// `</think>`): the text before an opening tag is reasoning and the block is open; the
    /// text before a closing tag is reasoning and the content starts. False when neither.
    fn take_tag(&mut self, start: Option<usize>, end: Option<usize>, out: &mut ReasoningDelta) -> bool {
        match (start, end) {
            (Some(s), e) if e.is_none_or(|e| s < e) => {
                out.reasoning.push_str(&self.held[..s]);
                self.held.drain(..s + THINK_START.len());
                self.state = ThinkState::Reasoning { stripped: true };
                self.tag_seen = true;
                true
            }
            (_, Some(e)) => {
                out.reasoning.push_str(&self.held[..e]);
                self.held.drain(..e + THINK_END.len());
                self.enter_content();
                true
            }
            _ => false,
        }
    }

    /// Feed the next decoded text delta; returns what can be emitted now.
    pub fn push(&mut self, delta: &str) -> ReasoningDelta {
        self.held.push_str(delta);
        let mut out = ReasoningDelta::default();
        loop {
            match self.state {
                ThinkState::Undecided => {
                    let from = floor_char_boundary(&self.held, self.scan_from);
                    let start = self.held[from..].find(THINK_START).map(|i| i + from);
                    let end = self.held[from..].find(THINK_END).map(|i| i + from);
                    if !self.take_tag(start, end, &mut out) {
                        // Neither tag yet: a tag could only start in the last few bytes.
                        self.scan_from = self.held.len().saturating_sub(THINK_END.len() - 1);
                        return out;
                    }
                }
                ThinkState::Reasoning { stripped } => {
                    let end = self.held.find(THINK_END);
                    let start = if stripped { None } else { self.held.find(THINK_START) };
                    if !self.take_tag(start, end, &mut out) {
                        let tags: &[&str] = if stripped { &[THINK_END] } else { &[THINK_END, THINK_START] };
                        let keep = partial_tag_len(&self.held, tags);
                        let cut = self.held.len() - keep;
                        out.reasoning.push_str(&self.held[..cut]);
                        self.held.drain(..cut);
                        return out;
                    }
                }
                ThinkState::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// The output has ended: flush everything still held (undecided text becomes content,
    /// a held partial tag inside the think block becomes reasoning).
    pub fn finish(&mut self) -> ReasoningDelta {
        let held = std::mem::take(&mut self.held);
        match self.state {
            ThinkState::Undecided => {
                self.state = ThinkState::Content;
                ReasoningDelta { reasoning: String::new(), content: held }
            }
            ThinkState::Reasoning { .. } => ReasoningDelta { reasoning: held, content: String::new() },
            ThinkState::Content => ReasoningDelta { reasoning: String::new(), content: held },
        }
    }

    /// Switch to content after `</think>`.
    fn enter_content(&mut self) {
        self.state = ThinkState::Content;
        self.tag_seen = true;
    }
}

/// One parsed tool call (OpenAI `tool_calls[i]` with `type: "function"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// `"call_"` followed by 24 lowercase hex digits; see [`tool_call_id`].
    pub id: String,
    /// `function.name`.
    pub name: String,
    /// `function.arguments`: the arguments as compact JSON text (whitespace outside strings
    /// removed, key order and literals as the model wrote them).
    pub arguments: String,
}

/// Result of [`ToolParser::parse`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolParse {
    /// All text outside the well-formed tool-call blocks (malformed blocks stay here
    /// verbatim, tags included). When there are calls, trailing whitespace is trimmed.
    /// `None` when it is empty after trimming.
    pub content: Option<String>,
    /// The well-formed calls in output order.
    pub calls: Vec<ToolCall>,
}

/// One streamed tool-call increment (OpenAI `delta.tool_calls[i]`). Fragments with the same
/// `index` are merged by the client: `id`/`name` arrive once, `arguments` concatenate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// Position of the call in the response (0, 1, …).
    pub index: usize,
    /// The call id, on the first fragment of a call.
    pub id: Option<String>,
    /// The function name, on the first fragment of a call.
    pub name: Option<String>,
    /// The next piece of the arguments JSON text.
    pub arguments: String,
}

/// One streamed increment of the tool-call parse. Either field may be empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolDelta {
    /// New text for `delta.content`.
    pub content: String,
    /// New tool-call fragments.
    pub calls: Vec<ToolCallDelta>,
}

/// The deterministic id of tool call `index` in a response whose id seed is `seed`:
/// `"call_"` + 24 lowercase hex digits (96 bits of a splitmix64 hash of both).
pub fn tool_call_id(seed: u64, index: usize) -> String {
    let a = splitmix64(seed ^ splitmix64(index as u64));
    let b = splitmix64(a);
    format!("call_{a:016x}{:08x}", b >> 32)
}

/// One step of the splitmix64 generator (a good 64-bit mixing function).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Internal state of [`ToolParser`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ToolState {
    /// Outside a block: text is content (a partial `<tool_call>` is held).
    Text,
    /// Inside a block: the body is buffered until `</tool_call>`.
    Block,
}

/// The hermes tool-call parser: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`
/// blocks, one or more, anywhere in the text.
///
/// Like vLLM, a block runs from `<tool_call>` to the next `</tool_call>`, and an unclosed
/// last block runs to the end of the text. A block whose body is not a JSON object with a
/// string `name` is left in the content verbatim. `arguments` may also be spelled
/// `parameters`; a missing one becomes `{}`; a string holding a JSON object is unwrapped.
/// Streaming buffers each block until it closes, then emits the whole call as one fragment.
#[derive(Clone, Debug)]
pub struct ToolParser {
    /// Seed for [`tool_call_id`].
    seed: u64,
    /// Streaming state.
    state: ToolState,
    /// Text not yet classified: a partial open tag (text state) or the block body so far.
    buf: String,
    /// Byte offset in `buf` before which `</tool_call>` cannot start (block state).
    scan_from: usize,
    /// Content whitespace not yet emitted (it may turn out to be trailing).
    ws: String,
    /// Whether any non-whitespace content has been emitted.
    content_emitted: bool,
    /// Number of calls emitted.
    calls: usize,
}

impl ToolParser {
    /// A fresh parser whose call ids derive from `seed` (give each response its own).
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            state: ToolState::Text,
            buf: String::new(),
            scan_from: 0,
            ws: String::new(),
            content_emitted: false,
            calls: 0,
        }
    }

    /// Parse a complete output. Does not touch the streaming state.
    pub fn parse(&self, text: &str) -> ToolParse {
        let mut outside = String::new();
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find(TOOL_OPEN) {
            outside.push_str(&rest[..i]);
            let after = &rest[i + TOOL_OPEN.len()..];
            let (body, closed) = match after.find(TOOL_CLOSE) {
                Some(j) => {
                    rest = &after[j + TOOL_CLOSE.len()..];
                    (&after[..j], true)
                }
                None => {
                    rest = "";
                    (after, false)
                }
            };
            match parse_call(body) {
                Some((name, arguments)) => {
                    calls.push(ToolCall { id: tool_call_id(self.seed, calls.len()), name, arguments })
                }
                None => push_raw_block(&mut outside, body, closed),
            }
        }
        outside.push_str(rest);
        if !calls.is_empty() {
            outside.truncate(outside.trim_end().len());
        }
        let content = (!outside.trim().is_empty()).then_some(outside);
        ToolParse { content, calls }
    }

    /// Whether any tool call has been emitted (the server then reports
    /// `finish_reason: "tool_calls"`).
    pub fn has_calls(&self) -> bool {
        self.calls > 0
    }

    /// Feed the next text delta; returns what can be emitted now.
    pub fn push(&mut self, delta: &str) -> ToolDelta {
        self.buf.push_str(delta);
        let mut out = ToolDelta::default();
        loop {
            match self.state {
                ToolState::Text => {
                    if let Some(i) = self.buf.find(TOOL_OPEN) {
                        let text: String = self.buf.drain(..i + TOOL_OPEN.len()).collect();
                        self.add_content(&text[..i], &mut out);
                        self.state = ToolState::Block;
                        self.scan_from = 0;
                    } else {
                        let cut = self.buf.len() - partial_tag_len(&self.buf, &[TOOL_OPEN]);
                        let text: String = self.buf.drain(..cut).collect();
                        self.add_content(&text, &mut out);
                        return out;
                    }
                }
                ToolState::Block => {
                    let from = floor_char_boundary(&self.buf, self.scan_from);
                    if let Some(j) = self.buf[from..].find(TOOL_CLOSE).map(|j| j + from) {
                        let body: String = self.buf.drain(..j + TOOL_CLOSE.len()).collect();
                        self.end_block(&body[..j], true, &mut out);
                        self.state = ToolState::Text;
                    } else {
                        self.scan_from = self.buf.len().saturating_sub(TOOL_CLOSE.len() - 1);
                        return out;
                    }
                }
            }
        }
    }

    /// The output has ended: flush held text, parse an unclosed last block, and drop trailing
    /// content whitespace when there were calls (or when the content is all whitespace).
    pub fn finish(&mut self) -> ToolDelta {
        let mut out = ToolDelta::default();
        let buf = std::mem::take(&mut self.buf);
        match self.state {
            ToolState::Text => self.add_content(&buf, &mut out),
            ToolState::Block => self.end_block(&buf, false, &mut out),
        }
        self.state = ToolState::Text;
        let ws = std::mem::take(&mut self.ws);
        if self.calls == 0 && self.content_emitted {
            out.content.push_str(&ws);
        }
        out
    }

    /// Emit content text, holding back trailing whitespace until non-whitespace follows.
    fn add_content(&mut self, text: &str, out: &mut ToolDelta) {
        let body = text.trim_end();
        if body.is_empty() {
            self.ws.push_str(text);
            return;
        }
        out.content.push_str(&self.ws);
        out.content.push_str(body);
        self.ws.clear();
        self.ws.push_str(&text[body.len()..]);
        self.content_emitted = true;
    }

    /// A block body is complete: emit a call, or the raw block as content if malformed.
    fn end_block(&mut self, body: &str, closed: bool, out: &mut ToolDelta) {
        match parse_call(body) {
            Some((name, arguments)) => {
                out.calls.push(ToolCallDelta {
                    index: self.calls,
                    id: Some(tool_call_id(self.seed, self.calls)),
                    name: Some(name),
                    arguments,
                });
                self.calls += 1;
            }
            None => {
                let mut raw = String::new();
                push_raw_block(&mut raw, body, closed);
                self.add_content(&raw, out);
            }
        }
    }
}

/// Append a malformed block verbatim, tags included.
fn push_raw_block(out: &mut String, body: &str, closed: bool) {
    out.push_str(TOOL_OPEN);
    out.push_str(body);
    if closed {
        out.push_str(TOOL_CLOSE);
    }
}

/// Parse a block body into `(name, arguments JSON text)`; `None` if malformed.
fn parse_call(body: &str) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(body).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    if name.is_empty() {
        return None;
    }
    // The body is valid JSON, so the raw member spans can be read off the text directly,
    // which keeps the model's key order (serde_json's map would sort it).
    let members = object_members(body)?;
    let raw = ["arguments", "parameters"].iter().find_map(|key| {
        members
            .iter()
            .rev()
            .find(|(k, _)| serde_json::from_str::<String>(k).ok().as_deref() == Some(*key))
            .map(|(_, v)| *v)
    });
    let arguments = match raw {
        None => "{}".to_string(),
        Some(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(Value::String(inner)) if matches!(serde_json::from_str::<Value>(&inner), Ok(Value::Object(_))) => {
                minify_json(&inner)
            }
            _ => minify_json(raw),
        },
    };
    Some((name, arguments))
}

/// The `(raw key, raw value)` text spans of the members of a top-level JSON object, in
/// order. `json` must already be valid JSON; returns `None` if it is not an object.
fn object_members(json: &str) -> Option<Vec<(&str, &str)>> {
    let bytes = json.as_bytes();
    let skip_ws = |mut i: usize| {
        while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
            i += 1;
        }
        i
    };
    let mut i = skip_ws(0);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    let mut members = Vec::new();
    i = skip_ws(i + 1);
    if bytes.get(i) == Some(&b'}') {
        return Some(members);
    }
    loop {
        let key_end = string_end(bytes, i)?;
        let key = json.get(i..key_end)?;
        i = skip_ws(key_end);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(i + 1);
        let end = value_end(bytes, start)?;
        members.push((key, json.get(start..end)?.trim_end()));
        i = skip_ws(end);
        match bytes.get(i) {
            Some(b',') => i = skip_ws(i + 1),
            Some(b'}') => return Some(members),
            _ => return None,
        }
    }
}

/// Byte index just past the JSON string starting at `start` (which must be `"`).
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    if bytes.get(start) != Some(&b'"') {
        return None;
    }
    let mut i = start + 1;
    loop {
        match bytes.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// Byte index of the `,` or `}` ending the JSON value starting at `start`, or the end of the
/// text for a top-level value.
fn value_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = start;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                i = string_end(bytes, i)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth == 0 => return Some(i),
            b'}' | b']' => depth -= 1,
            b',' if depth == 0 => return Some(i),
            _ => {}
        }
        i += 1;
    }
    Some(i)
}

/// Remove JSON whitespace outside strings from valid JSON text.
fn minify_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic split plans over the char boundaries of `text`: every single split
    /// point, plus random multi-splits from a fixed LCG.
    fn split_plans(text: &str) -> Vec<Vec<&str>> {
        let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let mut plans: Vec<Vec<&str>> = bounds.iter().map(|&i| vec![&text[..i], &text[i..]]).collect();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..200 {
            let mut cuts = vec![0, text.len()];
            for _ in 0..1 + (state % 8) {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                cuts.push(bounds[(state >> 33) as usize % bounds.len()]);
            }
            cuts.sort_unstable();
            plans.push(cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect());
        }
        plans.push(text.split_inclusive(|_| true).collect()); // one char per delta
        plans
    }

    /// Parse `text` and check every streamed split against the non-streaming result.
    fn reasoning(mode: ThinkMode, text: &str) -> (Option<String>, String) {
        let want = ReasoningParser::new(mode).parse(text);
        for plan in split_plans(text) {
            let mut p = ReasoningParser::new(mode);
            let (mut r, mut c) = (String::new(), String::new());
            let mut deltas: Vec<_> = plan.iter().map(|d| p.push(d)).collect();
            deltas.push(p.finish());
            for d in deltas {
                r.push_str(&d.reasoning);
                c.push_str(&d.content);
            }
            let got = (p.has_reasoning().then_some(r), c);
            assert_eq!(got, want, "{mode:?} {plan:?}");
        }
        want
    }

    fn some(reasoning: &str, content: &str) -> (Option<String>, String) {
        (Some(reasoning.to_string()), content.to_string())
    }

    #[test]
    fn reasoning_split_matches_qwen3_semantics_for_every_split() {
        let d = ThinkMode::Detect;
        let full = "<think>\nLet me think: 2+2=4.\n</think>\n\nThe answer is 4.";
        assert_eq!(reasoning(d, full), some("\nLet me think: 2+2=4.\n", "\n\nThe answer is 4."));
        assert_eq!(reasoning(d, "I reason.</think>Answer"), some("I reason.", "Answer"));
        let plain = "Plain answer < with </thin and <thi inside";
        assert_eq!(reasoning(d, plain), (None, plain.to_string()));
        assert_eq!(reasoning(d, "<think>思考🤔 é</think>答案：四 🎉"), some("思考🤔 é", "答案：四 🎉"));
        assert_eq!(reasoning(d, "<think>still going </thi"), some("still going </thi", ""));
        let later = "a</think>b<think>c</think>d";
        assert_eq!(reasoning(d, later), some("a", "b<think>c</think>d"));
        assert_eq!(reasoning(d, "x<think>y<think>z</think>"), some("xy<think>z", ""));
        assert_eq!(reasoning(d, "<think></think>"), some("", ""));
        assert_eq!(reasoning(d, ""), (None, String::new()));
        let o = ThinkMode::Open;
        assert_eq!(reasoning(o, "why 🤔</think>\n\nok"), some("why 🤔", "\n\nok"));
        assert_eq!(reasoning(o, "cut off <thi"), some("cut off <thi", ""));
        assert_eq!(reasoning(o, "<think>a</think>b"), some("a", "b"));
        assert_eq!(reasoning(o, ""), some("", ""));
    }

    #[test]
    fn reasoning_stream_holds_only_partial_tags() {
        let mut p = ReasoningParser::new(ThinkMode::Open);
        assert_eq!(p.push("abc</thi").reasoning, "abc");
        let d = p.push("nk>\n\nHi");
        assert_eq!((d.reasoning.as_str(), d.content.as_str()), ("", "\n\nHi"));
        let mut p = ReasoningParser::new(ThinkMode::Detect);
        assert_eq!(p.push("<think>ab<"), ReasoningDelta { reasoning: "ab".into(), ..Default::default() });
        // Without any tag yet, Detect must hold text: it may still become reasoning.
        let mut p = ReasoningParser::new(ThinkMode::Detect);
        assert_eq!(p.push("hello"), ReasoningDelta::default());
        assert_eq!(p.finish().content, "hello");
    }

    /// Parse `text` and check every streamed split against the non-streaming result.
    fn tools(text: &str) -> ToolParse {
        let want = ToolParser::new(7).parse(text);
        for plan in split_plans(text) {
            let mut p = ToolParser::new(7);
            let mut content = String::new();
            let mut calls: Vec<ToolCall> = Vec::new();
            let mut deltas: Vec<_> = plan.iter().map(|d| p.push(d)).collect();
            deltas.push(p.finish());
            for d in deltas {
                content.push_str(&d.content);
                for c in d.calls {
                    if c.index == calls.len() {
                        let (id, name) = (c.id.clone(), c.name.clone());
                        let (id, name) = (id.unwrap_or_default(), name.unwrap_or_default());
                        calls.push(ToolCall { id, name, arguments: String::new() });
                    }
                    assert!(c.index < calls.len(), "{plan:?}");
                    calls[c.index].arguments.push_str(&c.arguments);
                }
            }
            assert_eq!(p.has_calls(), !calls.is_empty());
            let got = ToolParse { content: (!content.is_empty()).then_some(content), calls };
            assert_eq!(got, want, "{plan:?}");
        }
        want
    }

    fn call(index: usize, name: &str, arguments: &str) -> ToolCall {
        let (name, arguments) = (name.to_string(), arguments.to_string());
        ToolCall { id: tool_call_id(7, index), name, arguments }
    }

    #[test]
    fn hermes_calls_match_for_every_split() {
        let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
        let got = tools(one);
        assert_eq!(got.content, None);
        assert_eq!(got.calls, [call(0, "get_weather", r#"{"city":"Paris","unit":"c"}"#)]);

        let two = "Let me check.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": [1.5, true]}}\n</tool_call>\n";
        let got = tools(two);
        assert_eq!(got.content.as_deref(), Some("Let me check."));
        assert_eq!(got.calls, [call(0, "a", r#"{"x":1}"#), call(1, "b", r#"{"y":[1.5,true]}"#)]);

        // `}` and `]` inside strings, nested values, key order kept (not sorted), UTF-8.
        let nested = r#"<tool_call>{"name": "run", "arguments": {"zeta": "fn main() { println!(\"}\"); }", "alpha": {"list": [1, {"k": "]} \" ,"}], "z": null}, "city": "東京 🗼"}}</tool_call>"#;
        let want = r#"{"zeta":"fn main() { println!(\"}\"); }","alpha":{"list":[1,{"k":"]} \" ,"}],"z":null},"city":"東京 🗼"}"#;
        let got = tools(nested);
        assert_eq!(got.calls, [call(0, "run", want)]);
        // Same JSON value as serde_json's reading of the model's arguments.
        let args: Value = serde_json::from_str(&got.calls[0].arguments).unwrap_or_default();
        let body: Value = serde_json::from_str(&nested[11..nested.len() - 12]).unwrap_or_default();
        assert_eq!(Some(&args), body.get("arguments"));

        // An unclosed last block still parses (as vLLM's `<tool_call>(.*)` alternative).
        let got = tools("<tool_call>{\"name\":\"f\",\"arguments\":{}}");
        assert_eq!(got.calls, [call(0, "f", "{}")]);
        // Stringified arguments are unwrapped; `parameters` is accepted; missing → `{}`.
        let got = tools(r#"<tool_call>{"name":"f","arguments":"{\"a\": 1}"}</tool_call>"#);
        assert_eq!(got.calls, [call(0, "f", r#"{"a":1}"#)]);
        let got =
            tools(r#"<tool_call>{"name":"g","parameters":{"b": 2}}</tool_call><tool_call>{"name":"h"}</tool_call>"#);
        assert_eq!(got.calls, [call(0, "g", r#"{"b":2}"#), call(1, "h", "{}")]);
    }

    #[test]
    fn hermes_malformed_blocks_and_plain_text_stay_content() {
        let bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>";
        assert_eq!(tools(bad), ToolParse { content: Some(bad.to_string()), calls: vec![] });
        let mixed = "A <tool_call>[1]</tool_call> <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call> B ";
        let got = tools(mixed);
        assert_eq!(got.content.as_deref(), Some("A <tool_call>[1]</tool_call>  B"));
        assert_eq!(got.calls, [call(0, "f", "{}")]);
        let text = "Hello <tool and 日本 </tool_call> \n";
        assert_eq!(tools(text).content.as_deref(), Some(text));
        assert_eq!(tools(" \n\t"), ToolParse::default());
        assert_eq!(tools("<tool_call>{\"name\": \"\"}</tool_call>").calls, []);
        assert_eq!(tools("<tool_call>{\"name\": \"f\"").content.as_deref(), Some("<tool_call>{\"name\": \"f\""));
    }

    #[test]
    fn hermes_stream_emits_call_when_block_closes() {
        let mut p = ToolParser::new(3);
        assert_eq!(p.push("Hi <tool_").content, "Hi");
        assert_eq!(p.push("call>{\"name\":\"f\",").calls, []);
        let d = p.push("\"arguments\":{\"a\": 1}}</tool_call>");
        let id = Some(tool_call_id(3, 0));
        let want = ToolCallDelta { index: 0, id, name: Some("f".into()), arguments: r#"{"a":1}"#.into() };
        assert_eq!(d.calls, [want]);
        assert!(p.has_calls());
        assert_eq!(p.finish(), ToolDelta::default());
    }

    #[test]
    fn tool_call_ids_are_deterministic_and_distinct() {
        let id = tool_call_id(42, 0);
        assert_eq!(id.len(), 5 + 24);
        assert!(id.starts_with("call_") && id[5..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(id, tool_call_id(42, 0));
        assert_ne!(id, tool_call_id(42, 1));
        assert_ne!(id, tool_call_id(43, 0));
    }
}
