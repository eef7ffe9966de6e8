//! JSON mode (OpenAI `response_format: {"type": "json_object"}`): the output is constrained to
//! one JSON object, byte by byte.
//!
//! [`JsonState`] is a pushdown recogniser of JSON (RFC 8259) prefixes over bytes, small enough
//! to be `Copy` (the container stack is a 128-bit set: at most [`MAX_DEPTH`] nested
//! containers). [`JsonVocab`] holds the bytes every token id contributes to the text, sorted,
//! so that the tokens allowed after a state are found in one walk that shares the work of
//! common prefixes (a token whose prefix is refused is skipped with every token that shares
//! that prefix). The sampler masks every other token to −∞; the end-of-sequence and stop ids
//! are allowed only once the text is complete, and then only they are.
//!
//! Strings are checked for their escapes and control characters, and their bytes ≥ 0x80 for
//! UTF-8 ([`Utf8`], RFC 3629: no stray continuation bytes, overlong forms, surrogates or code
//! points past U+10FFFF). Tokens carry whole or partial sequences; a sequence a token leaves
//! open must be finished by the next bytes, so the text is always valid UTF-8 and JSON.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// States whose allowed-token sets a [`MaskCache`] keeps (then it starts over).
const CACHE_STATES: usize = 256;

/// Most nested containers (objects and arrays) of a constrained output.
pub const MAX_DEPTH: u8 = 128;

/// What the recogniser expects next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mode {
    /// Before the top-level object (whitespace, then `{`).
    Start,
    /// A value (after `:`, or `,` in an array).
    Value,
    /// After `[`: a value or `]`.
    ArrFirst,
    /// After `{`: a key or `}`.
    ObjFirst,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value inside a container: `,` or the container's close.
    After,
    /// Inside a string (`key`: an object key, then `:` follows).
    Str { key: bool },
    /// Inside a multi-byte UTF-8 character of a string.
    Utf { key: bool, utf: Utf8 },
    /// After `\` in a string.
    Esc { key: bool },
    /// In `\uXXXX`, `left` hex digits to go.
    Hex { key: bool, left: u8 },
    /// In a number.
    Num(Num),
    /// In `true` / `false` / `null`: `lit` indexes [`LITERALS`], `at` bytes matched.
    Lit { lit: u8, at: u8 },
    /// The top-level object is complete: only whitespace.
    Done,
}

/// Where a number is: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?` (the one
/// number grammar of [`JsonState`] and of a schema's numbers, `sampling/schema.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Num {
    /// After `-`: a digit.
    Minus,
    /// After a leading `0`.
    Zero,
    /// In the integer digits.
    Int,
    /// After `.`: a digit.
    Dot,
    /// In the fraction digits.
    Frac,
    /// After `e` / `E`: a sign or a digit.
    E,
    /// After the exponent's sign: a digit.
    ESign,
    /// In the exponent digits.
    Exp,
}

impl Num {
    /// The place after a number's first byte `b` (`None`: no number starts so).
    pub(super) fn start(b: u8) -> Option<Self> {
        match b {
            b'-' => Some(Num::Minus),
            b'0' => Some(Num::Zero),
            b'1'..=b'9' => Some(Num::Int),
            _ => None,
        }
    }

    /// The place after byte `b` (`integer`: no fraction or exponent), or `None` where `b`
    /// does not continue the number.
    pub(super) fn next(self, b: u8, integer: bool) -> Option<Self> {
        match (self, b) {
            (Num::Minus, b'0') => Some(Num::Zero),
            (Num::Minus, b'1'..=b'9') => Some(Num::Int),
            (Num::Int, b'0'..=b'9') => Some(Num::Int),
            (Num::Zero | Num::Int, b'.') if !integer => Some(Num::Dot),
            (Num::Dot | Num::Frac, b'0'..=b'9') => Some(Num::Frac),
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') if !integer => Some(Num::E),
            (Num::E, b'+' | b'-') => Some(Num::ESign),
            (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Some(Num::Exp),
            _ => None,
        }
    }

    /// Whether the number may end here.
    pub(super) fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp)
    }
}

const LITERALS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// Where a string is in a UTF-8 character: between characters (the default), or the bytes
/// still to come and the range of the next one (RFC 3629's table of well-formed sequences).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct Utf8 {
    left: u8,
    lo: u8,
    hi: u8,
}

impl Utf8 {
    /// The place after byte `b` (≥ 0x80 between characters; any byte inside one) and whether
    /// `b` starts a character; `None` where `b` is not well-formed UTF-8 here.
    pub(super) fn next(self, b: u8) -> Option<(Self, bool)> {
        if self.left > 0 {
            return (self.lo..=self.hi)
                .contains(&b)
                .then_some((Utf8 { left: self.left - 1, lo: 0x80, hi: 0xbf }, false));
        }
        let (left, lo, hi) = match b {
            0xc2..=0xdf => (1, 0x80, 0xbf),
            0xe0 => (2, 0xa0, 0xbf),
            0xe1..=0xec | 0xee..=0xef => (2, 0x80, 0xbf),
            0xed => (2, 0x80, 0x9f),
            0xf0 => (3, 0x90, 0xbf),
            0xf1..=0xf3 => (3, 0x80, 0xbf),
            0xf4 => (3, 0x80, 0x8f),
            _ => return None,
        };
        Some((Utf8 { left, lo, hi }, true))
    }

    /// Between characters.
    pub(super) fn between(self) -> bool {
        self.left == 0
    }
}

/// A JSON-object prefix recogniser (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JsonState {
    mode: Mode,
    /// Bit `i`: the container at depth `i` is an object (else an array).
    stack: u128,
    depth: u8,
}

impl Default for JsonState {
    fn default() -> Self {
        Self::new()
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonState {
    /// Nothing read yet.
    pub fn new() -> Self {
        Self { mode: Mode::Start, stack: 0, depth: 0 }
    }

    /// Nothing read yet, any JSON value expected (not only an object): the recogniser of a
    /// schema's unconstrained value (`sampling/schema.rs`).
    pub fn any_value() -> Self {
        Self { mode: Mode::Value, stack: 0, depth: 0 }
    }

    /// Whether a whole top-level value has been read.
    pub fn complete(&self) -> bool {
        self.mode == Mode::Done
    }

    /// Whether the input so far is a complete top-level number, which a byte it refuses
    /// ends (a number has no end of its own).
    pub fn may_end_number(&self) -> bool {
        self.depth == 0 && matches!(self.mode, Mode::Num(n) if n.complete())
    }

    /// The state after `bytes`, or `None` when they do not continue a JSON object.
    #[cfg(test)]
    pub fn feed(self, bytes: &[u8]) -> Option<Self> {
        bytes.iter().try_fold(self, |s, &b| s.step(b))
    }

    fn top_is_object(&self) -> bool {
        self.depth > 0 && (self.stack >> (self.depth - 1)) & 1 == 1
    }

    fn open(mut self, object: bool) -> Option<Self> {
        if self.depth >= MAX_DEPTH {
            return None;
        }
        if object {
            self.stack |= 1u128 << self.depth;
        } else {
            self.stack &= !(1u128 << self.depth);
        }
        self.depth += 1;
        self.mode = if object { Mode::ObjFirst } else { Mode::ArrFirst };
        Some(self)
    }

    fn close(mut self, object: bool) -> Option<Self> {
        if self.depth == 0 || self.top_is_object() != object {
            return None;
        }
        self.depth -= 1;
        Some(self.value_done())
    }

    /// The state after a value ended.
    fn value_done(mut self) -> Self {
        self.mode = if self.depth == 0 { Mode::Done } else { Mode::After };
        self
    }

    /// A value starting with `b`.
    fn value(mut self, b: u8) -> Option<Self> {
        self.mode = match b {
            b'{' => return self.open(true),
            b'[' => return self.open(false),
            b'"' => Mode::Str { key: false },
            b't' => Mode::Lit { lit: 0, at: 1 },
            b'f' => Mode::Lit { lit: 1, at: 1 },
            b'n' => Mode::Lit { lit: 2, at: 1 },
            _ => Mode::Num(Num::start(b)?),
        };
        Some(self)
    }

    /// One byte.
    pub fn step(mut self, b: u8) -> Option<Self> {
        match self.mode {
            Mode::Start
            | Mode::Done
            | Mode::Value
            | Mode::ArrFirst
            | Mode::ObjFirst
            | Mode::Key
            | Mode::Colon
            | Mode::After
                if is_ws(b) =>
            {
                Some(self)
            }
            Mode::Start => (b == b'{').then(|| self.open(true)).flatten(),
            Mode::Done => None,
            Mode::Value => self.value(b),
            Mode::ArrFirst if b == b']' => self.close(false),
            Mode::ArrFirst => self.value(b),
            Mode::ObjFirst if b == b'}' => self.close(true),
            Mode::ObjFirst | Mode::Key => (b == b'"').then_some(Self { mode: Mode::Str { key: true }, ..self }),
            Mode::Colon => (b == b':').then_some(Self { mode: Mode::Value, ..self }),
            Mode::After => match b {
                b',' => Some(Self { mode: if self.top_is_object() { Mode::Key } else { Mode::Value }, ..self }),
                b'}' => self.close(true),
                b']' => self.close(false),
                _ => None,
            },
            Mode::Str { key } => match b {
                b'"' if key => Some(Self { mode: Mode::Colon, ..self }),
                b'"' => Some(self.value_done()),
                b'\\' => Some(Self { mode: Mode::Esc { key }, ..self }),
                0..=0x1f => None,
                0x80.. => Utf8::default().next(b).map(|(utf, _)| Self { mode: Mode::Utf { key, utf }, ..self }),
                _ => Some(self),
            },
            Mode::Utf { key, utf } => utf.next(b).map(|(utf, _)| {
                let mode = if utf.between() { Mode::Str { key } } else { Mode::Utf { key, utf } };
                Self { mode, ..self }
            }),
            Mode::Esc { key } => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                    Some(Self { mode: Mode::Str { key }, ..self })
                }
                b'u' => Some(Self { mode: Mode::Hex { key, left: 4 }, ..self }),
                _ => None,
            },
            Mode::Hex { key, left } => b.is_ascii_hexdigit().then(|| {
                self.mode = if left == 1 { Mode::Str { key } } else { Mode::Hex { key, left: left - 1 } };
                self
            }),
            Mode::Num(n) => {
                match n.next(b, false) {
                    Some(n) => Some(Self { mode: Mode::Num(n), ..self }),
                    // The number ends; the byte belongs to what follows it (numbers only
                    // appear inside containers here, so something follows).
                    None if n.complete() => self.value_done().step(b),
                    None => None,
                }
            }
            Mode::Lit { lit, at } => {
                let word = LITERALS[lit as usize];
                (word[at as usize] == b).then(|| {
                    if at as usize + 1 == word.len() {
                        self.value_done()
                    } else {
                        Self { mode: Mode::Lit { lit, at: at + 1 }, ..self }
                    }
                })
            }
        }
    }
}

/// The bytes each token id adds to the text, for the masks of structured output
/// ([`JsonVocab::walk`]). Built once per tokenizer (the server does it from `tokenizer.json`);
/// ids without bytes (special tokens) are never allowed by a mask.
#[derive(Debug)]
pub struct JsonVocab {
    /// Every id's bytes, concatenated.
    bytes: Vec<u8>,
    /// Per id: `(start, len)` in `bytes` (`len` 0: no bytes).
    span: Vec<(u32, u32)>,
    /// Ids with bytes, sorted by their bytes.
    sorted: Vec<u32>,
}

impl JsonVocab {
    /// From `tokens[id]` = the bytes of token `id` (`None` or empty: a special token).
    pub fn new(tokens: &[Option<Vec<u8>>]) -> Self {
        let mut bytes = Vec::new();
        let mut span = Vec::with_capacity(tokens.len());
        for t in tokens {
            let b = t.as_deref().unwrap_or_default();
            span.push((bytes.len() as u32, b.len() as u32));
            bytes.extend_from_slice(b);
        }
        let mut v = Self { bytes, span, sorted: Vec::new() };
        let mut sorted: Vec<u32> = (0..tokens.len() as u32).filter(|&i| !v.of(i).is_empty()).collect();
        sorted.sort_unstable_by(|&a, &b| v.of(a).cmp(v.of(b)));
        v.sorted = sorted;
        v
    }

    /// Token ids this vocabulary covers.
    pub fn len(&self) -> usize {
        self.span.len()
    }

    /// Whether it covers no id.
    pub fn is_empty(&self) -> bool {
        self.span.is_empty()
    }

    /// The bytes of token `id` (empty for special tokens and ids beyond the vocabulary).
    pub fn of(&self, id: u32) -> &[u8] {
        match self.span.get(id as usize) {
            Some(&(s, l)) => &self.bytes[s as usize..(s + l) as usize],
            None => &[],
        }
    }

    /// Calls `allow(id)` for every token whose bytes `step` takes from `state`, in one walk
    /// of the byte-sorted ids that steps each shared prefix once.
    pub fn walk<S: Copy>(&self, state: S, step: impl Fn(S, u8) -> Option<S>, mut allow: impl FnMut(u32)) {
        // states[d]: the state after the first d bytes of the previous token (valid for
        // d <= ok); `prev` that token's bytes.
        let mut states: Vec<S> = vec![state];
        let mut prev: &[u8] = &[];
        let mut ok = 0usize;
        let mut failed = false;
        for &id in &self.sorted {
            let b = self.of(id);
            let common = prev.iter().zip(b).take_while(|(x, y)| x == y).count();
            if failed && common > ok {
                // Shares the byte the previous token was refused at.
                prev = b;
                continue;
            }
            let mut d = common.min(ok);
            states.truncate(d + 1);
            failed = false;
            while d < b.len() {
                match step(states[d], b[d]) {
                    Some(s) => {
                        states.push(s);
                        d += 1;
                    }
                    None => {
                        failed = true;
                        break;
                    }
                }
            }
            ok = d;
            prev = b;
            if !failed {
                allow(id);
            }
        }
    }
}

/// Allowed-token bit sets (bit `id % 64` of word `id / 64`) of recent states of one
/// constraint: a generation revisits few states (inside a string at one depth, after a
/// value, ...), so most steps are a lookup.
#[derive(Debug)]
pub struct MaskCache<S>(Mutex<HashMap<S, Arc<Vec<u64>>>>);

impl<S> Default for MaskCache<S> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<S: Copy + Eq + Hash> MaskCache<S> {
    /// The set of `state` (`words` 64-bit words), from the cache or filled in by `fill`.
    pub fn get(&self, state: S, words: usize, fill: impl FnOnce(&mut Vec<u64>)) -> Arc<Vec<u64>> {
        if let Some(b) = self.0.lock().unwrap_or_else(|e| e.into_inner()).get(&state) {
            return b.clone();
        }
        let mut bits = vec![0u64; words];
        fill(&mut bits);
        let bits = Arc::new(bits);
        let mut cache = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_STATES {
            cache.clear();
        }
        cache.insert(state, bits.clone());
        bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &str) -> Option<JsonState> {
        JsonState::new().feed(s.as_bytes())
    }

    #[test]
    fn objects_and_their_prefixes() {
        for good in [
            r#"{}"#,
            r#" { "a" : 1 } "#,
            r#"{"a":[1,-2.5e+3,0,0.25E-1,true,false,null,"x\"\\\/\b\f\n\r\tq\u00e9"],"b":{"c":{}}}"#,
            "{\"k\":[[],[{}],\"é ü\"]}\n",
            r#"{"n":-0}"#,
        ] {
            let s = run(good).unwrap_or_else(|| panic!("{good}"));
            assert!(s.complete(), "{good}");
            // Every prefix is accepted and incomplete (before the last `}`).
            let (b, end) = (good.as_bytes(), good.rfind('}').unwrap_or(0));
            for i in 0..end {
                let p = JsonState::new().feed(&b[..i]).unwrap_or_else(|| panic!("prefix {:?}", &b[..i]));
                assert!(!p.complete(), "{:?}", &b[..i]);
            }
        }
    }

    #[test]
    fn refuses_what_is_not_a_json_object() {
        for bad in [
            "[1]",
            "1",
            "\"s\"",
            "x",
            "{a:1}",
            "{\"a\" 1}",
            "{\"a\":01}",
            "{\"a\":1.}",
            "{\"a\":-}",
            "{\"a\":1e}",
            "{\"a\":tru}x",
            "{\"a\":[1,]}",
            "{\"a\":1,}",
            "{\"a\":1]",
            "{\"a\":[1}",
            "{}{}",
            "{} x",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\\u12G4\"}",
            "{\"a\":\"\n\"}",
            "{,}",
            "{\"a\"::1}",
            "{\"a\":nul",
            "{\"a\":.5}",
        ] {
            let s = run(bad);
            assert!(s.is_none_or(|s| !s.complete()), "{bad:?} accepted");
        }
        for refused in ["[1]", "x", "{a", "{\"a\":01", "{\"a\":[1,]", "{}{", "{\"a\":\"\\x", "{\"a\":\"\n"] {
            assert!(run(refused).is_none(), "{refused:?} should be refused at once");
        }
        // Depth: MAX_DEPTH containers nest, one more does not.
        let deep = "{\"a\":".to_string() + &"[".repeat(MAX_DEPTH as usize - 1);
        assert!(run(&deep).is_some());
        assert!(run(&(deep + "[")).is_none());
    }

    /// Strings are well-formed UTF-8 (RFC 3629): whole characters of 2, 3 and 4 bytes pass,
    /// split anywhere; a stray continuation byte, a cut character, an overlong form, a
    /// surrogate or a code point past U+10FFFF do not.
    #[test]
    fn strings_are_well_formed_utf8() {
        let obj = |s: &[u8]| [&b"{\"a\":\""[..], s, b"\"}"].concat();
        for good in ["é", "€", "😀", "aé€😀z", "\u{7ff}\u{800}\u{ffff}\u{10000}\u{10ffff}"] {
            let bytes = obj(good.as_bytes());
            assert!(JsonState::new().feed(&bytes).is_some_and(|s| s.complete()), "{good}");
        }
        for bad in [
            &b"\x80"[..],
            b"\xbf",
            b"\xc3(",
            b"\xc3",
            b"\xc0\x80",
            b"\xe0\x80\x80",
            b"\xed\xa0\x80",
            b"\xf0\x80\x80\x80",
            b"\xf4\x90\x80\x80",
            b"\xf5\x80\x80\x80",
            b"\xe2\x82",
        ] {
            let bytes = obj(bad);
            assert!(JsonState::new().feed(&bytes).is_none_or(|s| !s.complete()), "{bad:x?} accepted");
        }
    }

    #[test]
    fn allowed_tokens_by_walk_equal_one_by_one() {
        let words = [
            "{", "}", "{\"", "\"", "\":", ":", " ", "\n", "a", "ab", "abc", "1", "12", "1.", ".5", "-", "tr", "true",
            "ue", "rue", "null", ",", ", \"", "[", "]", "[]", "}}", "x", "\\", "\\n", "\\u", "00e9", "é", "\"}",
        ];
        let mut toks: Vec<Option<Vec<u8>>> = words.iter().map(|w| Some(w.as_bytes().to_vec())).collect();
        toks.push(None); // a special token
        let v = JsonVocab::new(&toks);
        let mut seen_states = 0;
        for prefix in ["", "{", "{\"a", "{\"a\\", "{\"a\":", "{\"a\":1", "{\"a\":[", "{\"a\":t", "{\"a\":{}", "{}"] {
            let st = run(prefix).expect(prefix);
            let mut got = Vec::new();
            v.walk(st, |s, b| s.step(b), |id| got.push(id));
            got.sort_unstable();
            let want: Vec<u32> =
                (0..toks.len() as u32).filter(|&i| !v.of(i).is_empty() && st.feed(v.of(i)).is_some()).collect();
            assert_eq!(got, want, "after {prefix:?}");
            seen_states += usize::from(!got.is_empty());
        }
        assert_eq!(seen_states, 10);
        assert!(v.of(toks.len() as u32 - 1).is_empty() && v.of(999).is_empty());
    }
}
