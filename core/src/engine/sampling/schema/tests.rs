//! Unit tests of the schema compiler and recogniser.

use super::*;
use serde_json::json;

fn accepts(s: &Schema, text: &str) -> Option<bool> {
    s.start().feed(s, text.as_bytes()).map(|st| st.complete())
}

fn person() -> Schema {
    Schema::compile(&json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "nick": {"type": ["string", "null"]},
            "tags": {"type": "array", "items": {"enum": ["a", "bc", 1, 10, true]}},
            "pos": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"const": -1.5}},
                    "required": ["x"], "additionalProperties": false},
            "any": {"description": "free"}
        },
        "required": ["name", "age", "tags"]
    }))
    .unwrap()
}

#[test]
fn a_schema_accepts_its_texts_and_their_prefixes() {
    let s = person();
    for good in [
        r#"{"name": "Al", "age": 30, "tags": []}"#,
        r#" { "name":"A\"l\u00e9","age":-0,"nick":null,"tags":["a",10,1,true, "bc"],"pos":{"x":1.5e3,"y":-1.5},"any":[{"k":[1,"x"]},2]} "#,
        r#"{"name": "", "age": 7, "nick": "n", "tags": [1], "any": 12}"#,
        "{\"name\":\"x\",\"age\":1,\"tags\":[],\"pos\":{\"x\":0}}",
        r#"{"tags": [true], "pos": {"y": -1.5, "x": 2}, "age": 30, "name": "Al"}"#,
    ] {
        assert_eq!(accepts(&s, good), Some(true), "{good}");
        let b = good.as_bytes();
        let end = good.rfind('}').unwrap_or(0);
        for i in 0..end {
            let st = s.start().feed(&s, &b[..i]);
            assert!(st.is_some_and(|st| !st.complete()), "prefix {:?}", String::from_utf8_lossy(&b[..i]));
        }
    }
}

#[test]
fn a_schema_refuses_what_it_does_not_describe() {
    let s = person();
    for bad in [
        r#"{"name": "Al", "age": 30, "tags": [], "age": 31}"#, // a key twice
        r#"{"name": "Al", "tags": []}"#,                       // a required key left out
        r#"{"name": "Al", "age": 30.5, "tags": []}"#,          // an integer with a fraction
        r#"{"name": 3"#,
        r#"{"name": "Al", "age": 30, "tags": [2]}"#,        // not in the enum
        r#"{"name": "Al", "age": 30, "tags": ["b"]}"#,      // a prefix of "bc" only
        r#"{"name": "Al", "age": 30, "tags": [], "x": 1}"#, // an unknown key
        r#"{"name": "Al", "age": 30, "tags": [], "pos": {"y": -1.5}}"#, // x required
        r#"{"name": "Al", "age": 30, "tags": [], "nick": true}"#,
        r#"{"name": "Al", "age": 30, "tags": [],}"#,
        r#"{"name": "Al", "age": 30, "tags": []} x"#,
        "[1]",
    ] {
        assert_ne!(accepts(&s, bad), Some(true), "{bad} accepted");
    }
    // Enum numbers end where the next byte says: `1` before `,`, `10` after its 0.
    let n =
        Schema::compile(&json!({"type": "object", "properties": {"v": {"enum": [1, 10]}}, "required": ["v"]})).unwrap();
    assert_eq!(accepts(&n, r#"{"v":1}"#), Some(true));
    assert_eq!(accepts(&n, r#"{"v":10 }"#), Some(true));
    assert_eq!(accepts(&n, r#"{"v":100}"#), None);
    // json_object: any object.
    let o = Schema::any_object();
    assert_eq!(accepts(&o, r#"{"a": [1, {"b": null}]}"#), Some(true));
    assert_eq!(accepts(&o, "[]"), None);
}

#[test]
fn unsupported_schemas_are_errors_naming_the_keyword() {
    for (schema, want) in [
        (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}), "$.properties.a.pattern"),
        (json!({"type": "string"}), "root"),
        (
            json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"enum": ["x"]}]}}}),
            "start differently",
        ),
        (json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}], "type": "string"}}}), "beside"),
        (json!({"type": "object", "properties": {"a": {"$ref": "#/x"}}}), "$ref"),
        (json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}), "Missing"),
        (
            json!({"type": "object", "$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}}},
                "properties": {"a": {"$ref": "#/$defs/N"}}}),
            "refers to itself",
        ),
        (json!({"type": "object", "properties": {"a": {"type": "string", "minItems": 1}}}), "only for"),
        (json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 2}}}), "below"),
        (json!({"type": "object", "properties": {"a": {"type": ["string", "string"]}}}), "union"),
        (
            json!({"type": "object", "properties": {"a": {"type": "array", "items": {}, "uniqueItems": true}}}),
            "uniqueItems",
        ),
        (json!({"type": "object", "required": ["b"], "properties": {"a": {}}}), "`b` is not a property"),
        (
            json!({"type": "object", "properties": {"a": {"type": "object", "additionalProperties": {"type": "string"}}}}),
            "additionalProperties",
        ),
        (json!({"type": "object", "properties": {"a": {"type": "date"}}}), "unknown type"),
        (json!({"type": "object", "properties": {"a": {"enum": [{"x": 1}]}}}), "enum"),
    ] {
        let e = Schema::compile(&schema).err().unwrap_or_default();
        assert!(e.contains(want), "{schema}: {e}");
    }
    let mut deep = json!({"type": "string"});
    for _ in 0..MAX_FRAMES {
        deep = json!({"type": "object", "properties": {"a": deep}});
    }
    assert!(Schema::compile(&deep).err().is_some_and(|e| e.contains("deeper")));
    // Unions nested in unions count toward the depth too (no unbounded recursion).
    let mut unions = json!({"type": "string"});
    for _ in 0..100 {
        unions = json!({"anyOf": [unions]});
    }
    let unions = json!({"type": "object", "properties": {"a": unions}});
    assert!(Schema::compile(&unions).err().is_some_and(|e| e.contains("deeper")));
}

/// What pydantic writes (`model_json_schema()` of a model with a nested model, an
/// `Optional[str]`, a `conlist` and a `constr`): `$defs` / `$ref`, `anyOf` with null,
/// `minItems` / `maxItems`, `minLength` / `maxLength`, titles.
#[test]
fn pydantic_style_schemas() {
    let s = Schema::compile(&json!({
        "$defs": {"Pet": {"properties": {"kind": {"enum": ["cat", "dog"], "title": "Kind", "type": "string"}},
                          "required": ["kind"], "title": "Pet", "type": "object"}},
        "properties": {
            "name": {"maxLength": 3, "minLength": 2, "title": "Name", "type": "string", "format": "hostname"},
            "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Nick"},
            "pets": {"items": {"$ref": "#/$defs/Pet"}, "maxItems": 2, "minItems": 1, "title": "Pets", "type": "array"}
        },
        "required": ["name", "pets"], "title": "Person", "type": "object", "additionalProperties": false
    }))
    .unwrap();
    for (text, want) in [
        (r#"{"name": "Al", "pets": [{"kind": "cat"}]}"#, Some(true)),
        (r#"{"name": "Alé", "nick": null, "pets": [{"kind": "dog"}, {"kind": "cat"}]}"#, Some(true)),
        (r#"{"name": "A\n", "nick": "x", "pets": [{"kind": "cat"}]}"#, Some(true)),
        (r#"{"name": "A", "pets": [{"kind": "cat"}]}"#, None), // minLength
        (r#"{"name": "Alic"#, None),                           // maxLength
        (r#"{"name": "Al", "pets": []}"#, None),               // minItems
        (r#"{"name": "Al", "pets": [{"kind": "cat"}, {"kind": "cat"}, "#, None), // maxItems
        (r#"{"name": "Al", "pets": [{"kind": "cow"}]}"#, None),
        (r#"{"name": "Al", "nick": 3, "pets": [{"kind": "cat"}]}"#, None),
    ] {
        assert_eq!(accepts(&s, text), want, "{text}");
    }
}

/// A union of objects told apart by a property (pydantic's `oneOf` + `discriminator` of tagged
/// models, and a plain `anyOf` of models with `Literal` fields): read with the tag first, then
/// as the tagged model; beside other types by their first byte.
#[test]
fn discriminated_unions_read_their_tag_first() {
    let s = Schema::compile(&json!({
        "$defs": {
            "Cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                    "required": ["kind", "lives"]},
            "Dog": {"type": "object", "properties": {"good": {"type": "boolean"}, "kind": {"enum": ["dog", "puppy"]}},
                    "required": ["kind"], "additionalProperties": false}
        },
        "type": "object",
        "properties": {
            "pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                    "discriminator": {"propertyName": "kind", "mapping": {"cat": "#/$defs/Cat"}}},
            "maybe": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"type": "null"}, {"$ref": "#/$defs/Dog"}]}
        },
        "required": ["pet"]
    }))
    .unwrap();
    for (text, want) in [
        (r#"{"pet": {"kind": "cat", "lives": 9}}"#, Some(true)),
        (r#"{"pet":{ "kind" : "puppy" }, "maybe": null}"#, Some(true)),
        (r#"{"pet": {"kind": "dog", "good": true}, "maybe": {"kind": "cat", "lives": 1}}"#, Some(true)),
        (r#"{"pet": {"lives": 9, "kind": "cat"}}"#, None), // the tag comes first
        (r#"{"pet": {"kind": "cat"}}"#, None),             // lives is required
        (r#"{"pet": {"kind": "cat", "lives": 9, "kind": "cat"}}"#, None),
        (r#"{"pet": {"kind": "cat", "good": true}}"#, None), // not a Cat property
        (r#"{"pet": {"kind": "cow"}}"#, None),
        (r#"{"pet": {}}"#, None),
    ] {
        assert_eq!(accepts(&s, text), want, "{text}");
        if want == Some(true) {
            let b = text.as_bytes();
            for i in 0..text.rfind('}').unwrap_or(0) {
                assert!(s.start().feed(&s, &b[..i]).is_some_and(|st| !st.complete()), "prefix of {text} at {i}");
            }
        }
    }
    // Tool calls by name (`tool_choice: "required"`): an array root.
    let calls = Schema::compile_value(&json!({"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": "f"}, "parameters": {"type": "object",
            "properties": {"a": {"type": "integer"}}, "required": ["a"]}}, "required": ["name", "parameters"]},
        {"type": "object", "properties": {"name": {"const": "g"}, "parameters": {"type": "object"}},
            "required": ["name", "parameters"]}]}}))
    .unwrap();
    assert_eq!(accepts(&calls, r#"[{"name": "f", "parameters": {"a": 1}}, {"name":"g","parameters":{}}]"#), Some(true));
    assert_eq!(accepts(&calls, r#"[{"name": "f", "parameters": {}}]"#), None);
    assert_eq!(accepts(&calls, "[]"), None);
    // No property tells the objects apart, or one tag is a prefix of another: refused.
    let obj = |p: Value| json!({"type": "object", "properties": p, "required": ["t"]});
    for (alts, want) in [
        (vec![obj(json!({"t": {"type": "string"}})), obj(json!({"t": {"const": "b"}}))], "discriminator"),
        (vec![obj(json!({"t": {"const": 1}})), obj(json!({"t": {"const": 10}}))], "discriminator"),
        (vec![obj(json!({"t": {"const": "a"}})), obj(json!({"t": {"enum": ["b", "a"]}}))], "discriminator"),
    ] {
        let e =
            Schema::compile(&json!({"type": "object", "properties": {"u": {"anyOf": alts}}})).err().unwrap_or_default();
        assert!(e.contains(want), "{e}");
    }
}

/// Random walks through each schema's allowed bytes: no panic, and every text the state
/// calls complete parses as JSON (with the object's keys among the schema's).
#[test]
fn random_walks_end_in_valid_json() {
    let schemas = [
        json!({"type": "object"}),
        json!({"type": "object", "properties": {}, "additionalProperties": false}),
        json!({"type": "object", "properties": {"a": true, "b": {"type": ["integer", "null", "string"]},
               "c": {"type": "array", "items": {"enum": [1, 12, "x", null, false]}, "maxItems": 3},
               "d": {"anyOf": [{"type": "object", "properties": {"e": {"const": "é\"q"}}}, {"type": "number"}]},
               "f": {"type": "string", "maxLength": 2}}, "required": ["a"]}),
        json!({"type": "object", "properties": {"u": {"type": "array", "items": {"anyOf": [
               {"type": "object", "properties": {"t": {"const": "a"}, "x": {"type": "integer"}}, "required": ["t"]},
               {"type": "object", "properties": {"t": {"enum": ["b", null]}, "p": {}}, "required": ["t", "p"]},
               {"type": "string", "maxLength": 1}]}}}, "required": ["u"]}),
        json!({"$defs": {"P": {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}},
               "type": "object", "properties": {"p": {"type": "array", "items": {"$ref": "#/$defs/P"}, "minItems": 1}},
               "required": ["p"]}),
    ];
    let alphabet: Vec<u8> = b"{}[]\":, \n-0123456789.eE+tfrulsanxbcdpqP\\/\xc3\xa9".to_vec();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut completed = 0;
    for v in &schemas {
        let s = Schema::compile(v).unwrap();
        for _ in 0..300 {
            let (mut st, mut text) = (s.start(), Vec::new());
            for _ in 0..200 {
                let ok: Vec<u8> = alphabet.iter().copied().filter(|&b| st.step(&s, b).is_some()).collect();
                if ok.is_empty() || st.complete() {
                    break;
                }
                let b = ok[rnd(ok.len())];
                st = st.step(&s, b).unwrap();
                text.push(b);
            }
            if st.complete() {
                completed += 1;
                // Bytes >= 0x80 are not re-validated as UTF-8: the server's text is the
                // lossy decode (a stray byte becomes U+FFFD), which must be JSON.
                let lossy = String::from_utf8_lossy(&text);
                let parsed: Value = match serde_json::from_str(&lossy) {
                    Ok(p) => p,
                    // JSON numbers have no range; serde_json's f64 does (`1e999`).
                    Err(e) if e.to_string().contains("number out of range") => continue,
                    Err(e) => panic!("{v}: {lossy:?} is not JSON: {e}"),
                };
                assert!(parsed.is_object(), "{parsed}");
                if let Some(props) = v.get("properties").and_then(Value::as_object) {
                    if v.get("additionalProperties") == Some(&Value::Bool(false)) || !props.is_empty() {
                        assert!(parsed.as_object().unwrap().keys().all(|k| props.contains_key(k)), "{parsed}");
                    }
                }
            }
        }
    }
    assert!(completed > 100, "only {completed} walks completed");
}

#[test]
fn choices_are_exact_texts() {
    let s = Schema::choice(&["yes".into(), "yes sir".into(), "no".into(), "no".into()]).unwrap();
    let at = |t: &str| s.start().feed(&s, t.as_bytes());
    let yes = at("yes").unwrap();
    assert!(yes.may_end(&s) && !yes.complete(), "`yes` may end, `yes sir` may follow");
    assert!(at("yes sir").is_some_and(|x| x.complete() && x.may_end(&s)));
    assert!(at("no").is_some_and(|x| x.complete()));
    assert!(at("ye").is_some_and(|x| !x.may_end(&s)));
    for bad in ["yes\n", " yes", "nope", "yes si!", "n o"] {
        assert!(at(bad).is_none(), "{bad:?}");
    }
    assert!(Schema::choice(&[]).is_err() && Schema::choice(&["".into()]).is_err());
}

#[test]
fn allowed_tokens_follow_the_schema() {
    let words = [
        "{", "}", "\"name\"", "\"age\"", ":", " ", "\"", "Al", "30", "3", "0", ",", "[", "]", "\"tags\"", "\"n",
        "ame\":",
    ];
    let toks: Vec<Option<Vec<u8>>> = words.iter().map(|w| Some(w.as_bytes().to_vec())).collect();
    let v = JsonVocab::new(&toks);
    let s = person();
    for prefix in ["", "{", "{\"name\"", "{\"name\":\"Al\"", "{\"name\":\"Al\",", "{\"name\":\"Al\",\"age\":3"] {
        let st = s.start().feed(&s, prefix.as_bytes()).expect(prefix);
        let bits = s.allowed_set(&v, st);
        let got: Vec<&str> =
            (0..words.len()).filter(|&i| bits[i / 64] >> (i % 64) & 1 == 1).map(|i| words[i]).collect();
        let want: Vec<&str> = words.iter().copied().filter(|w| st.feed(&s, w.as_bytes()).is_some()).collect();
        assert_eq!(got, want, "after {prefix:?}");
    }
    let st = s.start().feed(&s, b"{").unwrap();
    let bits = s.allowed_set(&v, st);
    let got: Vec<&str> = (0..words.len()).filter(|&i| bits[i / 64] >> (i % 64) & 1 == 1).map(|i| words[i]).collect();
    assert_eq!(got, vec!["\"name\"", "\"age\"", " ", "\"", "\"tags\"", "\"n"]);
}

/// A string's characters are well-formed UTF-8 and count once each (at their first byte):
/// `maxLength` bounds them, and no byte may follow a full string but its closing quote.
#[test]
fn string_lengths_count_utf8_characters() {
    let s = Schema::compile(&json!({"type": "object", "properties": {"s": {"type": "string", "maxLength": 2}},
        "required": ["s"]}))
    .unwrap();
    let at = |b: &[u8]| s.start().feed(&s, &[&b"{\"s\":\""[..], b].concat());
    assert!(at("é😀\"}".as_bytes()).is_some_and(|st| st.complete()));
    assert!(at("é😀".as_bytes()).is_some_and(|st| st.step(&s, 0x80).is_none()), "a stray continuation byte");
    assert!(at("é😀".as_bytes()).is_some_and(|st| st.step(&s, 0xc3).is_none()), "a third character");
    assert!(at(b"\xf0\x9f").is_some_and(|st| st.step(&s, b'"').is_none()), "a cut character");
    assert!(at(b"\xed\xa0").is_none(), "a surrogate");
}

/// Random schemas built from the supported keywords (and a few others): compiling never
/// panics, and a compiled one's random walks never do either.
#[test]
fn random_schemas_compile_or_are_refused() {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut rnd = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    fn schema(rnd: &mut dyn FnMut(usize) -> usize, depth: usize) -> Value {
        let types = ["object", "array", "string", "integer", "number", "boolean", "null"];
        match rnd(if depth == 0 { 4 } else { 9 }) {
            0 => {
                let t = types[rnd(types.len())];
                json!({"type": t})
            }
            1 => {
                let lists = [json!(["a", "b"]), json!([1, 10]), json!([true, null])];
                json!({"enum": lists[rnd(3)].clone()})
            }
            2 => {
                let k = ["k", "v"][rnd(2)];
                json!({"const": k})
            }
            3 => {
                let (max, min) = (rnd(4), rnd(3));
                json!({"type": "string", "maxLength": max, "minLength": min})
            }
            4 | 5 => {
                let mut props = serde_json::Map::new();
                let mut req = Vec::new();
                for i in 0..rnd(4) {
                    let k = ["t", "a", "b", "c"][i];
                    props.insert(k.into(), schema(rnd, depth - 1));
                    if rnd(2) == 0 {
                        req.push(k);
                    }
                }
                json!({"type": "object", "properties": props, "required": req})
            }
            6 => {
                let (items, max) = (schema(rnd, depth - 1), rnd(3));
                json!({"type": "array", "items": items, "maxItems": max})
            }
            7 => {
                let alts: Vec<Value> = (0..1 + rnd(3)).map(|_| schema(rnd, depth - 1)).collect();
                let mut m = serde_json::Map::new();
                m.insert(["anyOf", "oneOf"][rnd(2)].into(), Value::Array(alts));
                Value::Object(m)
            }
            _ => {
                let lists = [json!(["string", "null"]), json!(["integer", "number"]), json!(["object", "array"])];
                json!({"type": lists[rnd(3)].clone()})
            }
        }
    }
    let (mut compiled, alphabet) = (0, b"{}[]\":, tabkv0123456789-.en\"ul".to_vec());
    for _ in 0..2000 {
        let root = json!({"type": "object", "properties": {"u": schema(&mut rnd, 4)}});
        let Ok(s) = Schema::compile(&root) else { continue };
        compiled += 1;
        let mut st = s.start();
        for _ in 0..60 {
            let ok: Vec<u8> = alphabet.iter().copied().filter(|&b| st.step(&s, b).is_some()).collect();
            if ok.is_empty() || st.complete() {
                break;
            }
            st = st.step(&s, ok[rnd(ok.len())]).unwrap_or(st);
        }
    }
    assert!(compiled > 500, "only {compiled} schemas compiled");
}
