//! Structured outputs: the output constrained to a JSON schema (OpenAI `response_format:
//! {"type": "json_schema", ...}`, vLLM's `guided_json`), or to any JSON object
//! (`{"type": "json_object"}`).
//!
//! [`Schema::compile`] turns a schema into nodes; [`SchemaState`] recognises, byte by byte,
//! the prefixes of the texts the schema accepts: objects with their `properties` in any order
//! (each at most once, every `required` one present, none added), arrays of `items`
//! (`minItems` / `maxItems`), strings (`minLength` / `maxLength`), integers, numbers,
//! booleans, null, `enum` / `const` values, and unions (`anyOf` / `oneOf`, or a list of
//! `type`s) whose alternatives differ in their first byte (pydantic's `Optional[T]` is
//! `anyOf` T and null) — several objects among them being told apart by a property each
//! requires with distinct `const` / `enum` values (a discriminated union, OpenAPI's
//! `discriminator` an annotation), which is then read first. `$ref`s to the root's `$defs` / `definitions` compile in place (a
//! schema that refers to itself is refused at the depth limit). A value the schema leaves open
//! (no `type`, or an object without `properties`) is any JSON value ([`JsonState`]).
//! `format` is what JSON Schema's default vocabulary makes it, an annotation (pydantic writes
//! it for dates, e-mails, URLs): not enforced. Every other keyword (`pattern`, `minimum`,
//! `uniqueItems`, `allOf`, ...) is refused at compile time with its path, never ignored. The
//! state is `Copy` (at most [`MAX_FRAMES`] nested values of the schema), so that
//! [`JsonVocab::walk`] can find the allowed tokens; the sets are cached per state.
//!
//! Keys are matched as `serde_json` writes them (the name as a JSON string, no escapes beyond
//! JSON's own), literals as `serde_json` writes the `enum` / `const` value. String lengths
//! count characters, an escape as one (a `\uXXXX` surrogate pair as two).

use super::json::{JsonState, JsonVocab, MaskCache, Num, Utf8};
use serde_json::Value;
use std::sync::Arc;

/// Most nested values of a schema (objects, arrays and their leaves) a state tracks.
pub const MAX_FRAMES: usize = 16;
/// Most properties of one object, and most `enum` values of one node.
const MAX_ALTS: usize = 64;

/// One property of an object node.
#[derive(Debug)]
struct Prop {
    /// The key as JSON text, quotes included.
    key: Vec<u8>,
    node: u16,
    required: bool,
}

/// A compiled schema node.
#[derive(Debug)]
enum Node {
    /// Any JSON value; `object`: any object.
    Any {
        object: bool,
    },
    /// An object with these properties (in any order).
    Object(Vec<Prop>),
    /// An array of `item`s, `min ..= max` of them.
    Array {
        item: u16,
        min: u16,
        max: u16,
    },
    /// A string of `min ..= max` characters (an escape is one).
    String {
        min: u16,
        max: u16,
    },
    Number {
        integer: bool,
    },
    /// One of these JSON texts (`enum`, `const`, `boolean`, `null`).
    Literals(Vec<Vec<u8>>),
    /// The whole output is one of these texts, as they are (vLLM's `guided_choice`; only at
    /// the root, no whitespace around).
    Choice(Vec<Vec<u8>>),
    /// One of these nodes, told apart by the value's first byte.
    Union(Vec<u16>),
    /// Objects told apart by a property each of them requires with `const` / `enum` values (a
    /// discriminated union: pydantic's tagged models, tool calls by `name`), read with that
    /// property first — `{`, `key`, `:`, one of `tags` — and then as the tag's branch, an
    /// object node, with that property written (`branches[j]`: its node and the property's
    /// index). No tag is a prefix of another.
    Tagged {
        key: Vec<u8>,
        tags: Vec<Vec<u8>>,
        branches: Vec<(u16, u16)>,
    },
}

/// A compiled schema (see the module docs) with the allowed-token sets of its states.
#[derive(Debug)]
pub struct Schema {
    nodes: Vec<Node>,
    root: u16,
    cache: MaskCache<SchemaState>,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The bytes a value of `node` may start with.
fn first_bytes(nodes: &[Node], node: u16) -> [bool; 256] {
    let mut set = [false; 256];
    match &nodes[node as usize] {
        Node::Any { object: false } => {
            for b in b"{[\"-0123456789tfn" {
                set[*b as usize] = true;
            }
        }
        Node::Any { object: true } | Node::Object(_) | Node::Tagged { .. } => set[b'{' as usize] = true,
        Node::Array { .. } => set[b'[' as usize] = true,
        Node::String { .. } => set[b'"' as usize] = true,
        Node::Number { .. } => {
            for b in b"-0123456789" {
                set[*b as usize] = true;
            }
        }
        Node::Literals(l) | Node::Choice(l) => l.iter().filter_map(|x| x.first()).for_each(|&b| set[b as usize] = true),
        Node::Union(alts) => {
            for &a in alts {
                for (s, f) in set.iter_mut().zip(first_bytes(nodes, a)) {
                    *s |= f;
                }
            }
        }
    }
    set
}

/// The candidates of `cands` (bit `j`: text `j`) whose byte `c` is `x`: the texts still
/// matching after one more byte (object keys, literals, choices).
fn narrow<'a>(texts: impl Iterator<Item = &'a [u8]>, cands: u64, c: usize, x: u8) -> u64 {
    texts.enumerate().filter(|(j, t)| cands >> j & 1 == 1 && t.get(c) == Some(&x)).fold(0, |m, (j, _)| m | 1 << j)
}

/// Whether a candidate of `cands` (bit `j`: `texts[j]`) has been read whole (`c` bytes).
fn whole(texts: &[Vec<u8>], cands: u64, c: usize) -> bool {
    texts.iter().enumerate().any(|(j, t)| cands >> j & 1 == 1 && t.len() == c)
}

impl Schema {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub fn any_object() -> Self {
        Self { nodes: vec![Node::Any { object: true }], root: 0, cache: MaskCache::default() }
    }

    /// The output is exactly one of `choices` (vLLM's `guided_choice`): 1 to 64 distinct,
    /// non-empty texts.
    pub fn choice(choices: &[String]) -> Result<Self, String> {
        let mut lits: Vec<Vec<u8>> = choices.iter().map(|c| c.as_bytes().to_vec()).collect();
        lits.sort();
        lits.dedup();
        if lits.is_empty() || lits.len() > MAX_ALTS || lits.iter().any(Vec::is_empty) {
            return Err(format!("a list of 1 to {MAX_ALTS} non-empty strings"));
        }
        Ok(Self { nodes: vec![Node::Choice(lits)], root: 0, cache: MaskCache::default() })
    }

    /// Compiles a JSON schema whose root is an object (see the module docs for what is
    /// supported). `Err`: what is not, with the keyword's path (`$.properties.a.pattern`).
    pub fn compile(schema: &Value) -> Result<Self, String> {
        let s = Self::compile_value(schema)?;
        if !matches!(s.nodes[s.root as usize], Node::Object(_) | Node::Any { object: true } | Node::Tagged { .. }) {
            return Err("`$`: the root of the schema must be `\"type\": \"object\"`".into());
        }
        Ok(s)
    }

    /// [`Schema::compile`] for a root of any type (the server's own schemas: an array of
    /// tool calls for `tool_choice: "required"`).
    pub fn compile_value(schema: &Value) -> Result<Self, String> {
        let mut c = Compiler { root: schema, nodes: Vec::new() };
        let root = c.node(schema, "$", 0)?;
        Ok(Self { nodes: c.nodes, root, cache: MaskCache::default() })
    }

    /// The state before any output.
    pub fn start(&self) -> SchemaState {
        let mut s = SchemaState { frames: [Frame::default(); MAX_FRAMES], depth: 0, any: JsonState::new() };
        s.push(self, self.root);
        s
    }

    /// The tokens of `vocab` whose bytes continue `state`, as a bit set over the ids.
    pub fn allowed_set(&self, vocab: &JsonVocab, state: SchemaState) -> Arc<Vec<u64>> {
        self.cache.get(state, vocab.len().div_ceil(64), |bits| {
            vocab.walk(state, |s, b| s.step(self, b), |id| bits[id as usize / 64] |= 1 << (id % 64))
        })
    }
}

/// Compiles a schema into nodes, resolving `$ref`s against the root's `$defs` /
/// `definitions`.
struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
}

/// A `minX` / `maxX` bound of `o` (`None` when absent), at most 65535.
fn bound(o: &serde_json::Map<String, Value>, k: &str, path: &str) -> Result<Option<u16>, String> {
    match o.get(k) {
        None => Ok(None),
        Some(x) => x
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("`{path}.{k}`: an integer in 0..=65535")),
    }
}

impl Compiler<'_> {
    fn add(&mut self, n: Node, path: &str) -> Result<u16, String> {
        self.nodes.push(n);
        u16::try_from(self.nodes.len() - 1).map_err(|_| format!("`{path}`: the schema has too many nodes"))
    }

    /// Compiles `v` (at `path`, `depth` values deep); returns its node.
    fn node(&mut self, v: &Value, path: &str, depth: usize) -> Result<u16, String> {
        if depth >= MAX_FRAMES {
            return Err(format!("`{path}`: the schema nests deeper than {MAX_FRAMES} values (or refers to itself)"));
        }
        let o = match v {
            Value::Bool(true) => return self.add(Node::Any { object: false }, path),
            Value::Object(o) => o,
            _ => return Err(format!("`{path}`: a schema must be an object")),
        };
        // `format` is an annotation in JSON Schema's default vocabulary (validators need not
        // assert it): accepted, not enforced.
        const KNOWN: [&str; 25] = [
            "format",
            "discriminator",
            "type",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "enum",
            "const",
            "anyOf",
            "oneOf",
            "$ref",
            "$defs",
            "definitions",
            "minItems",
            "maxItems",
            "minLength",
            "maxLength",
            "title",
            "description",
            "$schema",
            "$id",
            "default",
            "examples",
            "$comment",
        ];
        if let Some(k) = o.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(format!("`{path}.{k}`: the keyword `{k}` is not supported"));
        }
        if let Some(r) = o.get("$ref") {
            // `#/$defs/Name` or `#/definitions/Name` of the root, compiled in place.
            let r = r.as_str().ok_or_else(|| format!("`{path}.$ref`: a string"))?;
            let target = r
                .strip_prefix("#/")
                .and_then(|p| p.split('/').try_fold(self.root, |v, k| v.get(k.replace("~1", "/").replace("~0", "~"))))
                .filter(|_| r.starts_with("#/$defs/") || r.starts_with("#/definitions/"));
            let target = target.ok_or_else(|| format!("`{path}.$ref`: `{r}` is not a `#/$defs/...` of this schema"))?;
            if o.keys().any(|k| !matches!(k.as_str(), "$ref" | "title" | "description" | "default" | "$comment")) {
                return Err(format!("`{path}`: `$ref` beside other keywords is not supported"));
            }
            return self.node(target, &format!("{path}.$ref({r})"), depth + 1);
        }
        if let Some((k, alts)) = o.get("anyOf").map(|x| ("anyOf", x)).or_else(|| o.get("oneOf").map(|x| ("oneOf", x))) {
            let list = alts.as_array().filter(|l| !l.is_empty() && l.len() <= MAX_ALTS);
            let list = list.ok_or_else(|| format!("`{path}.{k}`: a list of 1 to {MAX_ALTS} schemas"))?;
            if o.keys().any(|x| {
                !matches!(
                    x.as_str(),
                    "anyOf"
                        | "oneOf"
                        | "title"
                        | "description"
                        | "default"
                        | "$comment"
                        | "$defs"
                        | "definitions"
                        | "$schema"
                        // OpenAPI's (pydantic writes it for tagged unions): an annotation here,
                        // the property is found from the alternatives themselves.
                        | "discriminator"
                )
            }) {
                return Err(format!("`{path}`: `{k}` beside other keywords is not supported"));
            }
            let mut nodes = Vec::with_capacity(list.len());
            for (i, x) in list.iter().enumerate() {
                nodes.push(self.node(x, &format!("{path}.{k}[{i}]"), depth + 1)?);
            }
            return self.union(nodes, &format!("{path}.{k}"));
        }
        if o.contains_key("discriminator") {
            return Err(format!("`{path}.discriminator`: only beside `oneOf` / `anyOf`"));
        }
        let literal = |x: &Value, at: &str| -> Result<Vec<u8>, String> {
            match x {
                Value::Object(_) | Value::Array(_) => {
                    Err(format!("`{at}`: only string, number, boolean and null values"))
                }
                x => serde_json::to_vec(x).map_err(|e| format!("`{at}`: {e}")),
            }
        };
        if let Some(c) = o.get("const") {
            return self.add(Node::Literals(vec![literal(c, &format!("{path}.const"))?]), path);
        }
        if let Some(e) = o.get("enum") {
            let list = e.as_array().filter(|l| !l.is_empty() && l.len() <= MAX_ALTS);
            let list = list.ok_or_else(|| format!("`{path}.enum`: a list of 1 to {MAX_ALTS} values"))?;
            let mut lits = list.iter().map(|x| literal(x, &format!("{path}.enum"))).collect::<Result<Vec<_>, _>>()?;
            lits.sort();
            lits.dedup();
            return self.add(Node::Literals(lits), path);
        }
        let types: Vec<&str> = match o.get("type") {
            None if o.contains_key("properties") => vec!["object"],
            None if o.contains_key("items") => vec!["array"],
            None => return self.add(Node::Any { object: false }, path),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) if !ts.is_empty() => ts
                .iter()
                .map(|t| t.as_str().ok_or_else(|| format!("`{path}.type`: a string or a list of strings")))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(format!("`{path}.type`: a string or a non-empty list of strings")),
        };
        // The bounds belong to one type each.
        for (k, t) in [("minItems", "array"), ("maxItems", "array"), ("minLength", "string"), ("maxLength", "string")] {
            if o.contains_key(k) && !types.contains(&t) {
                return Err(format!("`{path}.{k}`: only for `\"type\": \"{t}\"`"));
            }
        }
        let mut alts = Vec::with_capacity(types.len());
        for t in &types {
            let n = match *t {
                "object" => self.object(o, path, depth)?,
                "array" => {
                    let item = match o.get("items") {
                        Some(i) => self.node(i, &format!("{path}.items"), depth + 1)?,
                        None => self.add(Node::Any { object: false }, path)?,
                    };
                    let (min, max) = (bound(o, "minItems", path)?.unwrap_or(0), bound(o, "maxItems", path)?);
                    if max.is_some_and(|m| m < min) {
                        return Err(format!("`{path}.maxItems`: below minItems"));
                    }
                    Node::Array { item, min, max: max.unwrap_or(u16::MAX) }
                }
                "string" => {
                    let (min, max) = (bound(o, "minLength", path)?.unwrap_or(0), bound(o, "maxLength", path)?);
                    if max.is_some_and(|m| m < min) {
                        return Err(format!("`{path}.maxLength`: below minLength"));
                    }
                    Node::String { min, max: max.unwrap_or(u16::MAX) }
                }
                "integer" => Node::Number { integer: true },
                "number" => Node::Number { integer: false },
                "boolean" => Node::Literals(vec![b"false".to_vec(), b"true".to_vec()]),
                "null" => Node::Literals(vec![b"null".to_vec()]),
                other => return Err(format!("`{path}.type`: unknown type `{other}`")),
            };
            alts.push(self.add(n, path)?);
        }
        if alts.len() == 1 {
            return Ok(alts[0]);
        }
        // With `integer` in the same list, a number covers both.
        if types.contains(&"integer") && types.contains(&"number") {
            alts.retain(|&a| !matches!(self.nodes[a as usize], Node::Number { integer: true }));
        }
        self.union(alts, &format!("{path}.type"))
    }

    /// The union of `alts`, which must differ in their first byte (one alternative: itself);
    /// several objects among them become one [`Node::Tagged`].
    fn union(&mut self, alts: Vec<u16>, path: &str) -> Result<u16, String> {
        if let [one] = alts[..] {
            return Ok(one);
        }
        let objects: Vec<u16> =
            alts.iter().copied().filter(|&a| matches!(self.nodes[a as usize], Node::Object(_))).collect();
        let alts = if objects.len() > 1 {
            let tagged = self.tagged(&objects, path)?;
            let mut rest: Vec<u16> = alts.into_iter().filter(|a| !objects.contains(a)).collect();
            if rest.is_empty() {
                return Ok(tagged);
            }
            rest.push(tagged);
            rest
        } else {
            alts
        };
        let mut seen = [false; 256];
        for &a in &alts {
            for (b, f) in first_bytes(&self.nodes, a).into_iter().enumerate() {
                if f && std::mem::replace(&mut seen[b], true) {
                    return Err(format!(
                        "`{path}`: the alternatives of a union must start differently (here two can start with `{}`)",
                        char::from(b as u8).escape_default()
                    ));
                }
            }
        }
        self.add(Node::Union(alts), path)
    }

    /// The discriminated union of the object nodes `objects`: the first property (in the
    /// first object's order) that every one of them requires with `const` / `enum` values,
    /// no value twice and none a prefix of another.
    fn tagged(&mut self, objects: &[u16], path: &str) -> Result<u16, String> {
        let props = |n: u16| match &self.nodes[n as usize] {
            Node::Object(p) => &p[..],
            _ => &[],
        };
        let keys: Vec<Vec<u8>> = props(objects[0]).iter().filter(|p| p.required).map(|p| p.key.clone()).collect();
        for key in keys {
            let (mut tags, mut branches) = (Vec::new(), Vec::new());
            let all = objects.iter().all(|&o| {
                let Some(j) = props(o).iter().position(|p| p.key == key && p.required) else { return false };
                let Node::Literals(lits) = &self.nodes[props(o)[j].node as usize] else { return false };
                for l in lits {
                    tags.push(l.clone());
                    branches.push((o, j as u16));
                }
                true
            });
            let clash = |i: usize, a: &Vec<u8>| tags.iter().enumerate().any(|(k, b)| k != i && b.starts_with(a));
            if all && tags.len() <= MAX_ALTS && !tags.iter().enumerate().any(|(i, a)| clash(i, a)) {
                return self.add(Node::Tagged { key, tags, branches }, path);
            }
        }
        Err(format!(
            "`{path}`: alternatives that are objects must be told apart by a property each of them requires with \
             distinct `const` / `enum` values (a discriminator)"
        ))
    }

    /// The object node of `o` (its `properties`, `required`, `additionalProperties`).
    fn object(&mut self, o: &serde_json::Map<String, Value>, path: &str, depth: usize) -> Result<Node, String> {
        match o.get("additionalProperties") {
            None | Some(Value::Bool(_)) => {}
            Some(_) => return Err(format!("`{path}.additionalProperties`: only true or false")),
        }
        let Some(props) = o.get("properties") else {
            // No properties: any object, or (`additionalProperties: false`) only `{}`.
            return Ok(if o.get("additionalProperties") == Some(&Value::Bool(false)) {
                Node::Object(Vec::new())
            } else {
                Node::Any { object: true }
            });
        };
        let props = props.as_object().ok_or_else(|| format!("`{path}.properties`: an object"))?;
        if props.len() > MAX_ALTS {
            return Err(format!("`{path}.properties`: at most {MAX_ALTS} properties"));
        }
        let required: Vec<&str> = match o.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|x| x.as_str().ok_or_else(|| format!("`{path}.required`: a list of property names")))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(format!("`{path}.required`: a list of property names")),
        };
        if let Some(r) = required.iter().find(|r| !props.contains_key(**r)) {
            return Err(format!("`{path}.required`: `{r}` is not a property"));
        }
        let mut out = Vec::with_capacity(props.len());
        for (name, p) in props {
            let node = self.node(p, &format!("{path}.properties.{name}"), depth + 1)?;
            let key = serde_json::to_vec(name).map_err(|e| format!("`{path}.properties`: {e}"))?;
            out.push(Prop { key, node, required: required.contains(&name.as_str()) });
        }
        Ok(Node::Object(out))
    }
}

/// One value being read: its node and where in it the input is (the meaning of `phase`, `a`,
/// `c` and `b` depends on the node; see [`SchemaState::step`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Frame {
    node: u16,
    phase: u8,
    a: u16,
    c: u16,
    b: u64,
    e: u64,
    num: Option<Num>,
    /// A string's place in a UTF-8 character.
    utf: Utf8,
}

/// What a frame does with a byte.
enum Out {
    /// Stays open (the byte taken).
    Stay(Frame),
    /// The value ended with this byte.
    Pop,
    /// The value ended before this byte: the byte belongs to the enclosing value.
    PopBefore,
    /// A nested value starts (`again`: with this byte, else after it).
    Push { frame: Frame, node: u16, again: bool },
    /// The frame becomes `node` (a union's alternative), which reads this byte.
    Become(u16),
}

/// A prefix of a text the schema accepts (see the module docs). Read with
/// [`SchemaState::step`] under the [`Schema`] it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SchemaState {
    frames: [Frame; MAX_FRAMES],
    depth: u8,
    /// The recogniser of the innermost frame when it is an [`Node::Any`].
    any: JsonState,
}

impl SchemaState {
    /// Whether a whole text has been read (only whitespace may follow).
    pub fn complete(&self) -> bool {
        self.depth == 0
    }

    /// Whether the output may end here: complete, or (`guided_choice`) one choice read whole
    /// while a longer one could still follow.
    pub fn may_end(&self, schema: &Schema) -> bool {
        let f = self.frames[0];
        self.depth == 0
            || (self.depth == 1
                && f.phase == 1
                && matches!(&schema.nodes[f.node as usize], Node::Choice(l) if whole(l, f.b, f.c as usize)))
    }

    /// The state after `bytes`, or `None`.
    pub fn feed(self, schema: &Schema, bytes: &[u8]) -> Option<Self> {
        bytes.iter().try_fold(self, |s, &b| s.step(schema, b))
    }

    fn push(&mut self, schema: &Schema, node: u16) -> bool {
        if self.depth as usize >= MAX_FRAMES {
            return false;
        }
        self.frames[self.depth as usize] = Frame { node, ..Frame::default() };
        self.depth += 1;
        if let Node::Any { object } = schema.nodes[node as usize] {
            self.any = if object { JsonState::new() } else { JsonState::any_value() };
        }
        true
    }

    /// Closes the innermost value and tells its parent.
    fn pop(&mut self, schema: &Schema) {
        self.depth -= 1;
        self.frames[self.depth as usize] = Frame::default();
        self.any = JsonState::new();
        if let Some(p) = self.depth.checked_sub(1) {
            let f = &mut self.frames[p as usize];
            match schema.nodes[f.node as usize] {
                Node::Object(_) => f.phase = 5,
                Node::Array { .. } => {
                    f.phase = 3;
                    f.c = f.c.saturating_add(1);
                }
                _ => {}
            }
        }
    }

    /// One byte.
    pub fn step(mut self, schema: &Schema, b: u8) -> Option<Self> {
        loop {
            if self.depth == 0 {
                // After the root only whitespace, and nothing at all after a choice.
                let choice = matches!(schema.nodes[schema.root as usize], Node::Choice(_));
                return (is_ws(b) && !choice).then_some(self);
            }
            let i = self.depth as usize - 1;
            match self.frame_step(schema, self.frames[i], b)? {
                Out::Stay(f) => {
                    self.frames[i] = f;
                    return Some(self);
                }
                Out::Pop => {
                    self.pop(schema);
                    return Some(self);
                }
                Out::PopBefore => self.pop(schema),
                Out::Push { frame, node, again } => {
                    self.frames[i] = frame;
                    if !self.push(schema, node) {
                        return None;
                    }
                    if !again {
                        return Some(self);
                    }
                }
                Out::Become(node) => {
                    self.depth -= 1;
                    if !self.push(schema, node) {
                        return None;
                    }
                }
            }
        }
    }

    /// Byte `x` in frame `f`.
    fn frame_step(&mut self, schema: &Schema, mut f: Frame, x: u8) -> Option<Out> {
        let ws = is_ws(x);
        match &schema.nodes[f.node as usize] {
            Node::Any { .. } => match self.any.step(x) {
                Some(s) if s.complete() => Some(Out::Pop),
                Some(s) => {
                    self.any = s;
                    Some(Out::Stay(f))
                }
                None if self.any.may_end_number() => Some(Out::PopBefore),
                None => None,
            },
            Node::Union(alts) => {
                if ws {
                    return Some(Out::Stay(f));
                }
                alts.iter().find(|&&a| first_bytes(&schema.nodes, a)[x as usize]).map(|&a| Out::Become(a))
            }
            // Phases: 0 before `{`; 1 after `{` (a key or `}`); 2 in a key (`c` bytes matched,
            // `b` the candidates); 3 before `:`; 4 in the value; 5 after it (`,` or `}`); 6
            // after `,` (a key). `e`: the properties written so far; `a`: the current one.
            Node::Object(props) => {
                // Any property not written yet may come next (JSON objects are unordered);
                // `}` once every required one is there.
                let all = if props.len() == 64 { u64::MAX } else { (1u64 << props.len()) - 1 };
                let required = props.iter().enumerate().filter(|p| p.1.required).fold(0u64, |m, (j, _)| m | 1 << j);
                let cands = all & !f.e;
                match (f.phase, x) {
                    (0 | 1 | 3 | 5 | 6, _) if ws => Some(Out::Stay(f)),
                    (0, b'{') => Some(Out::Stay(Frame { phase: 1, ..f })),
                    (1 | 5, b'}') if required & !f.e == 0 => Some(Out::Pop),
                    (1 | 6, b'"') if cands != 0 => Some(Out::Stay(Frame { phase: 2, c: 1, b: cands, ..f })),
                    (2, _) => {
                        let c = f.c as usize;
                        let next = narrow(props.iter().map(|p| &p.key[..]), f.b, c, x);
                        if next == 0 {
                            return None;
                        }
                        // Keys end with `"` (a quote inside is escaped), so a whole key is the
                        // only candidate left.
                        let j = next.trailing_zeros() as usize;
                        if props[j].key.len() == c + 1 {
                            return Some(Out::Stay(Frame { phase: 3, a: j as u16, c: 0, b: 0, e: f.e | 1 << j, ..f }));
                        }
                        Some(Out::Stay(Frame { c: f.c + 1, b: next, ..f }))
                    }
                    (3, b':') => {
                        let node = props[f.a as usize].node;
                        Some(Out::Push { frame: Frame { phase: 4, ..f }, node, again: false })
                    }
                    (5, b',') if cands != 0 => Some(Out::Stay(Frame { phase: 6, ..f })),
                    _ => None,
                }
            }
            // Phases: 0 before `{`; 1 after it; 2 in the key (`c` bytes matched); 3 before `:`;
            // 4 before the tag; 5 in it (`c` bytes matched, `b` the candidates). The last byte
            // of a tag turns the frame into its branch's object, after the key's value.
            Node::Tagged { key, tags, branches } => match (f.phase, x) {
                (0 | 1 | 3 | 4, _) if ws => Some(Out::Stay(f)),
                (0, b'{') => Some(Out::Stay(Frame { phase: 1, ..f })),
                (1, b'"') => Some(Out::Stay(Frame { phase: 2, c: 1, ..f })),
                (2, _) if key.get(f.c as usize) == Some(&x) => {
                    let done = f.c as usize + 1 == key.len();
                    Some(Out::Stay(if done { Frame { phase: 3, c: 0, ..f } } else { Frame { c: f.c + 1, ..f } }))
                }
                (3, b':') => Some(Out::Stay(Frame { phase: 4, ..f })),
                (4 | 5, _) => {
                    let (c, cands) = if f.phase == 4 { (0, u64::MAX) } else { (f.c as usize, f.b) };
                    let next = narrow(tags.iter().map(Vec::as_slice), cands, c, x);
                    if next == 0 {
                        return None;
                    }
                    let j = next.trailing_zeros() as usize;
                    if next.count_ones() == 1 && tags[j].len() == c + 1 {
                        let (node, p) = branches[j];
                        return Some(Out::Stay(Frame { node, phase: 5, e: 1 << p, ..Frame::default() }));
                    }
                    Some(Out::Stay(Frame { phase: 5, c: c as u16 + 1, b: next, ..f }))
                }
                _ => None,
            },
            // Phases: 0 before `[`; 1 after `[` (an item or `]`); 2 in an item; 3 after it
            // (`,` or `]`); 4 after `,` (an item). `c`: the items read.
            &Node::Array { item, min, max } => match (f.phase, x) {
                (0 | 1 | 3 | 4, _) if ws => Some(Out::Stay(f)),
                (0, b'[') => Some(Out::Stay(Frame { phase: 1, ..f })),
                (1 | 3, b']') if f.c >= min => Some(Out::Pop),
                (1 | 4, _) if f.c < max => Some(Out::Push { frame: Frame { phase: 2, ..f }, node: item, again: true }),
                (3, b',') if f.c < max => Some(Out::Stay(Frame { phase: 4, ..f })),
                _ => None,
            },
            // Phases: 0 before `"`; 1 in the string; 2 after `\`; 3 in `\uXXXX` (`c` digits
            // left); 4 inside a multi-byte UTF-8 character (`utf`). `a`: the characters read
            // (an escape is one, a UTF-8 character one, at its first byte).
            &Node::String { min, max } => match (f.phase, x) {
                (0, _) if ws => Some(Out::Stay(f)),
                (0, b'"') => Some(Out::Stay(Frame { phase: 1, ..f })),
                (1, b'"') => (f.a >= min).then_some(Out::Pop),
                (1, 0..=0x1f) => None,
                (1, _) if f.a >= max => None,
                (1 | 4, 0x80..) => {
                    let (utf, starts) = f.utf.next(x)?;
                    let phase = if utf.between() { 1 } else { 4 };
                    Some(Out::Stay(Frame { phase, utf, a: f.a + u16::from(starts), ..f }))
                }
                (1, b'\\') => Some(Out::Stay(Frame { phase: 2, a: f.a + 1, ..f })),
                (1, _) => Some(Out::Stay(Frame { a: f.a + 1, ..f })),
                (2, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Some(Out::Stay(Frame { phase: 1, ..f })),
                (2, b'u') => Some(Out::Stay(Frame { phase: 3, c: 4, ..f })),
                (3, h) if h.is_ascii_hexdigit() => {
                    Some(Out::Stay(if f.c == 1 { Frame { phase: 1, c: 0, ..f } } else { Frame { c: f.c - 1, ..f } }))
                }
                _ => None,
            },
            // `num`: where in the number (`None` before it); json.rs's grammar.
            &Node::Number { integer } => match f.num {
                None if ws => Some(Out::Stay(f)),
                None => Num::start(x).map(|n| Out::Stay(Frame { num: Some(n), ..f })),
                Some(n) => match n.next(x, integer) {
                    Some(n) => Some(Out::Stay(Frame { num: Some(n), ..f })),
                    None if n.complete() => Some(Out::PopBefore),
                    None => None,
                },
            },
            // Phase 0 before the value; 1 in it (`c` bytes matched, `b` the candidates).
            Node::Literals(lits) | Node::Choice(lits) => {
                let raw = matches!(schema.nodes[f.node as usize], Node::Choice(_));
                if f.phase == 0 && ws && !raw {
                    return Some(Out::Stay(f));
                }
                let (c, cands) = if f.phase == 0 { (0, u64::MAX) } else { (f.c as usize, f.b) };
                let next = narrow(lits.iter().map(Vec::as_slice), cands, c, x);
                if next == 0 {
                    // A whole literal ends before this byte (numbers have no end of their own).
                    return (f.phase == 1 && whole(lits, cands, c)).then_some(Out::PopBefore);
                }
                if next.count_ones() == 1 && lits[next.trailing_zeros() as usize].len() == c + 1 {
                    return Some(Out::Pop);
                }
                f.phase = 1;
                f.c = c as u16 + 1;
                f.b = next;
                Some(Out::Stay(f))
            }
        }
    }
}

#[cfg(test)]
mod tests;
