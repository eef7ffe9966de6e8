//! Streaming text: UTF-8-safe incremental detokenization and stop strings matched across
//! token boundaries.

use tokenizers::Tokenizer;

/// Incremental detokenizer (the prefix / read-offset algorithm of vLLM and TGI): each new
/// token re-decodes a short window of ids and emits only the new text, holding back a piece
/// that ends in an incomplete UTF-8 sequence (U+FFFD) until the next token completes it, so
/// the concatenated deltas equal decoding all ids at once. Special tokens (`<|im_end|>`, EOS)
/// are left out of the text, as vLLM's default `skip_special_tokens=True` does.
pub struct Detok<'t> {
    tok: &'t Tokenizer,
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl<'t> Detok<'t> {
    /// A detokenizer that continues after `context` ids (the prompt: their text is not emitted,
    /// but they shape how the first generated tokens decode).
    pub fn new(tok: &'t Tokenizer, context: &[u32]) -> Self {
        let keep = context.len().saturating_sub(6);
        let ids = context[keep..].to_vec();
        let n = ids.len();
        Self { tok, ids, prefix: 0, read: n }
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.tok.decode(ids, true).unwrap_or_default()
    }

    /// The new text after `id` (possibly empty while a character is incomplete).
    pub fn push(&mut self, id: u32) -> String {
        self.ids.push(id);
        let before = self.decode(&self.ids[self.prefix..self.read]);
        let after = self.decode(&self.ids[self.prefix..]);
        if after.len() > before.len() && !after.ends_with('\u{FFFD}') && after.starts_with(&before) {
            let delta = after[before.len()..].to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            return delta;
        }
        String::new()
    }

    /// What is still held back (at the end of the request).
    pub fn finish(&mut self) -> String {
        let before = self.decode(&self.ids[self.prefix..self.read]);
        let after = self.decode(&self.ids[self.prefix..]);
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        if after.len() > before.len() && after.starts_with(&before) {
            after[before.len()..].to_string()
        } else {
            String::new()
        }
    }
}

/// Stop strings over a stream of text deltas: text that could still be the start of a stop
/// string is held back; on a match the text is cut before it (or, with `include`, vLLM's
/// `include_stop_str_in_output`, after it). The earliest match wins; at one position, the
/// first stop string in the list.
pub struct StopMatcher {
    stops: Vec<String>,
    include: bool,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>, include: bool) -> Self {
        Self { stops, include, held: String::new() }
    }

    /// Feeds a delta; returns the text that is safe to emit and whether a stop string matched
    /// (then nothing more may be emitted).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        self.held.push_str(delta);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        let first =
            self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s.len()))).min_by_key(|m| m.0);
        if let Some((at, len)) = first {
            let out = self.held[..if self.include { at + len } else { at }].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if self.held.ends_with(&s[..i]) {
                    keep = keep.max(i);
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// The held text at the end of a request (no stop string matched).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// The bytes each of the first `n` token ids adds to the text, for JSON mode
/// (`porter_core::engine::sampling::JsonVocab`): special tokens (and ids the tokenizer does
/// not know) have none. Byte-level BPE tokens (GPT-2's byte-to-character table, the Qwen /
/// Llama 3 / SmolLM2 tokenizers) map back character by character; SentencePiece-style
/// vocabularies take `▁` as a space and `<0xHH>` byte-fallback tokens as their byte; other
/// decoders give each token's own decode. Added (non-special) tokens are their content.
pub fn token_bytes(tok: &Tokenizer, n: usize) -> Vec<Option<Vec<u8>>> {
    let decoder = serde_json::to_string(&tok.get_decoder()).unwrap_or_default();
    let byte_level = decoder.contains("\"ByteLevel\"");
    let byte_fallback = decoder.contains("\"ByteFallback\"");
    let metaspace = decoder.contains("Metaspace") || decoder.contains('\u{2581}');
    let added = tok.get_added_tokens_decoder();
    // GPT-2's bytes_to_unicode, inverted: printable Latin-1 bytes are their own character,
    // the other 68 bytes are U+0100 onwards in byte order.
    let mut byte_of = std::collections::HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u32..256 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            extra += 1;
            255 + extra
        };
        if let Some(c) = char::from_u32(c) {
            byte_of.insert(c, b as u8);
        }
    }
    (0..n)
        .map(|id| {
            let id32 = u32::try_from(id).ok()?;
            if let Some(t) = added.get(&id32) {
                return (!t.special).then(|| t.content.as_bytes().to_vec());
            }
            let s = tok.id_to_token(id32)?;
            if byte_level {
                s.chars().map(|c| byte_of.get(&c).copied()).collect()
            } else if let Some(h) =
                s.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).filter(|h| byte_fallback && h.len() == 2)
            {
                u8::from_str_radix(h, 16).ok().map(|b| vec![b])
            } else if metaspace {
                Some(s.replace('\u{2581}', " ").into_bytes())
            } else {
                tok.decode(&[id32], false).ok().map(String::into_bytes)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_across_deltas_are_held_and_trimmed() {
        let mut m = StopMatcher::new(vec!["STOP".into(), "\n\n".into()], false);
        let mut out = String::new();
        for d in ["Hello S", "T", "ill going ", "ST", "OP and more"] {
            let (t, hit) = m.push(d);
            out.push_str(&t);
            if hit {
                break;
            }
        }
        assert_eq!(out, "Hello STill going ");
        let mut m = StopMatcher::new(vec!["ab".into()], false);
        assert_eq!(m.push("xa"), ("x".into(), false));
        assert_eq!(m.push("c"), ("ac".into(), false));
        assert_eq!(m.finish(), "");
        let mut m = StopMatcher::new(vec![], false);
        assert_eq!(m.push("a"), ("a".into(), false));
        // include_stop_str_in_output: cut after the earliest match (the first listed at a tie).
        let mut m = StopMatcher::new(vec!["cd".into(), "bc".into(), "b".into()], true);
        assert_eq!(m.push("a"), ("a".into(), false));
        assert_eq!(m.push("bcde"), ("bc".into(), true));
    }

    #[test]
    fn token_bytes_spell_what_the_tokenizer_decodes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3_next_mtp");
        let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let n = tok.get_vocab_size(true);
        let bytes = token_bytes(&tok, n + 3);
        assert_eq!(bytes.len(), n + 3);
        assert!(bytes[n..].iter().all(Option::is_none), "ids beyond the vocabulary have no bytes");
        let mut checked = 0;
        for (id, b) in bytes.iter().enumerate().take(n) {
            let Some(b) = b else { continue };
            // Whole UTF-8 tokens read back as the tokenizer's own decode of them.
            if let Ok(s) = std::str::from_utf8(b) {
                assert_eq!(s, tok.decode(&[id as u32], false).unwrap(), "id {id}");
                checked += 1;
            }
        }
        assert!(checked > n / 2, "{checked} of {n}");
        // A JSON text's ids spell its bytes (the encoder may add a leading space).
        let text = "{\"a\": [1, 2.5, true], \"b\": \"x\\ny\"}";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        let spelled: Vec<u8> = ids.iter().flat_map(|&i| bytes[i as usize].clone().unwrap_or_default()).collect();
        assert_eq!(String::from_utf8(spelled).unwrap().trim_start(), text);
    }

    #[test]
    fn token_bytes_of_a_sentencepiece_vocabulary() {
        // Llama 2 / Mistral style: `▁` for spaces, `<0xHH>` byte fallback, `<unk>` special.
        let json = r#"{"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                      "vocab": {"<unk>": 0, "<0x0A>": 1, "▁a": 2, "b": 3, "{": 4, "▁": 5}, "merges": []}}"#;
        let tok = Tokenizer::from_bytes(json.as_bytes()).unwrap();
        let got = token_bytes(&tok, 6);
        let want: Vec<Option<Vec<u8>>> = vec![
            None,
            Some(b"\n".to_vec()),
            Some(b" a".to_vec()),
            Some(b"b".to_vec()),
            Some(b"{".to_vec()),
            Some(b" ".to_vec()),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn detokenizer_deltas_join_to_the_full_decode() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer.json");
        let tok = Tokenizer::from_file(path).unwrap();
        let text = "Grüße, 世界! Привет 🙂 — ok";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        let mut d = Detok::new(&tok, &[]);
        let mut out = String::new();
        for &i in &ids {
            let piece = d.push(i);
            assert!(!piece.contains('\u{FFFD}'), "a split character leaked: {piece:?}");
            out.push_str(&piece);
        }
        out.push_str(&d.finish());
        assert_eq!(out, tok.decode(&ids, false).unwrap());
    }

    #[test]
    fn special_tokens_are_not_in_the_text() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer.json");
        let tok = Tokenizer::from_file(path).unwrap();
        let im_end = tok.token_to_id("<|im_end|>").unwrap();
        let mut ids = tok.encode("The capital is Paris.", false).unwrap().get_ids().to_vec();
        ids.push(im_end);
        let prompt = tok.encode("<|im_start|>assistant\n", false).unwrap().get_ids().to_vec();
        let mut d = Detok::new(&tok, &prompt);
        let mut out: String = ids.iter().map(|&i| d.push(i)).collect();
        out.push_str(&d.finish());
        assert_eq!(out, "The capital is Paris.");
    }
}
