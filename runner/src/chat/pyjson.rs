//! The `tojson` filter of transformers' chat-template environment:
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, byte for
//! byte (Python's separators, float repr and string escapes; minijinja's own `tojson` escapes
//! HTML characters and prints floats differently).

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// How [`dumps`] lays out its output (the keyword arguments of `json.dumps`).
#[derive(Debug, Clone)]
pub struct Style {
    /// `\uXXXX` for every non-ASCII character (and DEL), surrogate pairs above U+FFFF.
    pub ensure_ascii: bool,
    /// The string repeated per nesting level after each newline; `None` prints one line.
    pub indent: Option<String>,
    /// Between items, and between a key and its value.
    pub separators: (String, String),
    /// Object keys in code-point order instead of insertion order.
    pub sort_keys: bool,
}

impl Default for Style {
    fn default() -> Self {
        Self { ensure_ascii: false, indent: None, separators: (", ".into(), ": ".into()), sort_keys: false }
    }
}

/// The filter: `x | tojson(ensure_ascii=false, indent=none, separators=none, sort_keys=false)`,
/// positional or keyword, as transformers defines it.
pub fn tojson_filter(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let mut opts: [Option<Value>; 4] = Default::default();
    for (slot, v) in opts.iter_mut().zip(args.iter()) {
        *slot = Some(v.clone());
    }
    for (i, name) in NAMES.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            if opts[i].is_some() {
                return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson got `{name}` twice")));
            }
            opts[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let set = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_none() && !v.is_undefined()).cloned();
    let indent = match set(&opts[1]) {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        // Python: `' ' * indent` (a bool is an int; a negative count gives "").
        Some(v) if v.kind() == ValueKind::Bool => Some(if v.is_true() { " ".into() } else { String::new() }),
        Some(v) => {
            let n = i64::try_from(v).map_err(|_| Error::new(ErrorKind::InvalidOperation, "tojson: bad indent"))?;
            Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
        }
    };
    let separators = match set(&opts[2]) {
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap_or_default().to_owned(), b.as_str().unwrap_or_default().to_owned())
                }
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
            }
        }
    };
    let style = Style {
        ensure_ascii: set(&opts[0]).is_some_and(|v| v.is_true()),
        indent,
        separators,
        sort_keys: set(&opts[3]).is_some_and(|v| v.is_true()),
    };
    Ok(Value::from(dumps(value, &style)?))
}

/// `json.dumps(value, ...)` of a template value.
pub fn dumps(value: &Value, style: &Style) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, style, 0)?;
    Ok(out)
}

fn newline(out: &mut String, style: &Style, level: usize) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_value(out: &mut String, value: &Value, style: &Style, level: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => {
            let f = f64::try_from(value.clone())?;
            out.push_str(&float_repr(f));
        }
        ValueKind::String => write_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.separators.0);
                }
                newline(out, style, level + 1);
                write_value(out, item, style, level + 1)?;
            }
            newline(out, style, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.separators.0);
                }
                newline(out, style, level + 1);
                write_str(out, k, style.ensure_ascii);
                out.push_str(&style.separators.1);
                write_value(out, v, style, level + 1)?;
            }
            newline(out, style, level);
            out.push('}');
        }
        kind => {
            return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: a value of type {kind} is not JSON")))
        }
    }
    Ok(())
}

/// A dict key as `json.dumps` writes it: strings as they are, numbers, booleans and null spelled
/// out.
fn key_string(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => float_repr(f64::try_from(key.clone())?),
        kind => return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: keys must be str, not {kind}"))),
    })
}

/// A JSON string literal with Python's escapes (`ensure_ascii` adds `\uXXXX` for non-ASCII).
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` (what `json.dumps` prints): the shortest round-trip digits, fixed
/// notation for decimal exponents -4..16, else `d.ddde±XX`; `NaN`, `Infinity`, `-Infinity`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    // Rust's `{:e}` is the shortest round-trip form, e.g. "1.5e16", "-1e-5", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let body = if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                format!("{digits}{}.0", "0".repeat(int_len - digits.len()))
            } else {
                format!("{}.{}", &digits[..int_len], &digits[int_len..])
            }
        };
        format!("{sign}{body}")
    } else {
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{esign}{:02}", exp.unsigned_abs())
    }
}
