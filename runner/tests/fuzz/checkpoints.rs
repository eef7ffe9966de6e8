//! Damaged checkpoints: truncated or corrupt safetensors, rewritten headers (dtype, shape,
//! offsets), missing / extra / renamed tensors, broken shard indexes.

use super::{clone_fixture, gen_args, materialise, Case, Oracle, Rng};
use serde_json::{json, Value};
use std::path::Path;

/// Header and data of a safetensors file.
fn read_st(path: &Path) -> (Value, Vec<u8>) {
    let bytes = std::fs::read(path).expect("read safetensors");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header JSON");
    (header, bytes[8 + n..].to_vec())
}

fn write_st(path: &Path, header: &Value, data: &[u8]) {
    let mut h = serde_json::to_vec(header).expect("header");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    std::fs::write(path, out).expect("write safetensors");
}

/// A case on `fixture` whose `file` is edited by `edit` (header, data).
fn header_case(
    fixture: &'static str,
    file: &'static str,
    label: &str,
    oracle: Oracle,
    edit: impl Fn(&mut Value, &mut Vec<u8>) + Send + Sync + 'static,
) -> Case {
    let setup = move |dir: &Path| {
        clone_fixture(fixture, dir);
        let p = materialise(dir, file);
        let (mut h, mut d) = read_st(&p);
        edit(&mut h, &mut d);
        write_st(&p, &h, &d);
    };
    Case::new(format!("{fixture}/{file}: {label}"), Some(Box::new(setup)), &gen_args(), oracle)
}

/// A case on `fixture` whose `file` is replaced by `bytes(original)`.
fn bytes_case(
    fixture: &'static str,
    file: &'static str,
    label: &str,
    oracle: Oracle,
    bytes: impl Fn(Vec<u8>) -> Vec<u8> + Send + Sync + 'static,
) -> Case {
    let setup = move |dir: &Path| {
        clone_fixture(fixture, dir);
        let p = materialise(dir, file);
        let b = std::fs::read(&p).expect("read");
        std::fs::write(&p, bytes(b)).expect("write");
    };
    Case::new(format!("{fixture}/{file}: {label}"), Some(Box::new(setup)), &gen_args(), oracle)
}

const Q: &str = "qwen3";
const ST: &str = "model.safetensors";
const SHARDED: &str = "qwen3_moe_sparse2";
const SHARD1: &str = "model-00001-of-00002.safetensors";
const INDEX: &str = "model.safetensors.index.json";
const EMBED: &str = "model.embed_tokens.weight";
const QPROJ: &str = "model.layers.0.self_attn.q_proj.weight";

pub fn cases(rng: &mut Rng) -> Vec<Case> {
    let corrupt = || Oracle::names("truncated or corrupt").or("not a valid safetensors file");
    let mut out = Vec::new();
    // Truncations at fixed and random lengths.
    let mut cuts: Vec<usize> = vec![0, 1, 7, 8, 9, 16, 100, 3000, 3727, 3728, 3729, 200_000, 430_991];
    for _ in 0..6 {
        cuts.push((rng.next_u64() % 430_992) as usize);
    }
    for n in cuts {
        out.push(bytes_case(Q, ST, &format!("truncated to {n} bytes"), corrupt(), move |b| {
            b[..n.min(b.len())].to_vec()
        }));
    }
    out.push(bytes_case(SHARDED, SHARD1, "shard truncated", corrupt(), |b| b[..b.len() / 3].to_vec()));
    // Header length fields that lie.
    for len in [u64::MAX, 1 << 40, 430_992, 3_721, 0] {
        out.push(bytes_case(Q, ST, &format!("header length {len}"), corrupt(), move |mut b| {
            b[..8].copy_from_slice(&len.to_le_bytes());
            b
        }));
    }
    // JSON damage inside the header: a brace dropped, trailing garbage, invalid UTF-8.
    for (k, label) in ["last brace dropped", "trailing garbage", "invalid UTF-8", "duplicate key"].iter().enumerate() {
        out.push(bytes_case(Q, ST, label, corrupt(), move |mut b| {
            let n = u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as usize;
            let header = &mut b[8..8 + n];
            let end = header.iter().rposition(|&c| c == b'}').unwrap_or(0);
            match k {
                0 => header[end] = b' ',
                1 => {
                    header[end..].fill(b' ');
                    header[end] = b'}';
                    if end + 2 < n {
                        header[end + 1] = b',';
                    }
                }
                2 => header[2] = 0xff,
                _ => {
                    // The first tensor's name repeated as the second's.
                    let s = String::from_utf8_lossy(header).into_owned();
                    let s = s.replacen("\"model.embed_tokens.weight\"", "\"lm_head.weight\"           ", 1);
                    header.copy_from_slice(s.as_bytes());
                }
            }
            b
        }));
    }
    // Garbage files.
    out.push(bytes_case(Q, ST, "not safetensors", corrupt(), |_| {
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}".to_vec()
    }));
    out.push(bytes_case(Q, ST, "header is a JSON list", corrupt(), |_| {
        b"\x08\x00\x00\x00\x00\x00\x00\x00[1,2,3] ".to_vec()
    }));

    // dtype rewrites (same size: loads or names the dtype; other size: the byte count is wrong).
    for (dt, oracle) in [
        ("F16", Oracle::Legal),
        ("I16", Oracle::names_all(&[EMBED, "dtype"])),
        ("U16", Oracle::names_all(&[EMBED, "dtype"])),
        ("F32", corrupt().or(EMBED)),
        ("F64", corrupt().or(EMBED)),
        ("U8", corrupt().or(EMBED)),
        ("BOOL", corrupt().or(EMBED)),
        ("F8_E4M3", corrupt().or(EMBED)),
        ("XYZ", corrupt()),
    ] {
        out.push(header_case(Q, ST, &format!("{EMBED} dtype {dt}"), oracle, move |h, _| h[EMBED]["dtype"] = json!(dt)));
    }
    // Shapes: same element count (the weight map names the tensor), other counts, absurd ones.
    for (shape, oracle) in [
        (json!([64, 128]), Oracle::names_all(&[QPROJ, "expected [128, 64], found [64, 128]"])),
        (json!([8192]), Oracle::names_all(&[QPROJ, "expected"])),
        (json!([128, 64, 1]), Oracle::names_all(&[QPROJ, "expected"])),
        (json!([128, 65]), corrupt().or(QPROJ)),
        (json!([]), corrupt().or(QPROJ)),
        (json!([0, 64]), corrupt().or(QPROJ)),
        (json!([1u64 << 62, 1u64 << 62]), corrupt().or(QPROJ)),
        (json!([u64::MAX, 2]), corrupt().or(QPROJ)),
        (json!([-1, 64]), corrupt()),
        (json!("128x64"), corrupt()),
    ] {
        out.push(header_case(Q, ST, &format!("{QPROJ} shape {shape}"), oracle, move |h, _| {
            h[QPROJ]["shape"] = shape.clone()
        }));
    }
    // Offsets: past the end, reversed, overlapping, negative.
    for (offs, label) in [
        (json!([0, 1u64 << 40]), "past the end"),
        (json!([65536, 0]), "reversed"),
        (json!([0, 16384]), "overlapping"),
        (json!([-1, 16383]), "negative"),
        (json!([0]), "one offset"),
    ] {
        out.push(header_case(Q, ST, &format!("{QPROJ} offsets {label}"), corrupt().or(QPROJ), move |h, _| {
            h[QPROJ]["data_offsets"] = offs.clone()
        }));
    }
    // Tensor renamed: one missing, one unexpected (both named).
    out.push(header_case(
        Q,
        ST,
        "tensor renamed",
        Oracle::names_all(&["missing tensors", QPROJ, "unexpected tensors", "model.layers.0.self_attn.q_proj.weigth"]),
        |h, _| {
            if let Some(o) = h.as_object_mut() {
                if let Some(v) = o.remove(QPROJ) {
                    o.insert("model.layers.0.self_attn.q_proj.weigth".into(), v);
                }
            }
        },
    ));
    // An extra tensor appended to the data.
    out.push(header_case(Q, ST, "extra tensor", Oracle::names_all(&["unexpected tensors", "extra.bias"]), |h, d| {
        let start = d.len() as u64;
        d.extend_from_slice(&[0u8; 8]);
        h["extra.bias"] = json!({"dtype": "BF16", "shape": [4], "data_offsets": [start, start + 8]});
    }));
    // Shard index damage.
    let index_case = |label: &str, oracle: Oracle, text: String| {
        let setup = move |dir: &Path| {
            clone_fixture(SHARDED, dir);
            std::fs::write(dir.join(INDEX), &text).expect("write index");
        };
        Case::new(format!("{SHARDED}/{INDEX}: {label}"), Some(Box::new(setup)), &gen_args(), oracle)
    };
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(super::fixture(SHARDED).join(INDEX)).expect("index"))
            .expect("json");
    out.push(index_case("not JSON", Oracle::names(INDEX), "{\"weight_map\": ".into()));
    out.push(index_case("no weight_map", Oracle::names("weight_map"), "{\"metadata\": {}}".into()));
    out.push(index_case("empty weight_map", Oracle::names(INDEX), "{\"weight_map\": {}}".into()));
    out.push(index_case("weight_map is a list", Oracle::names("weight_map"), "{\"weight_map\": [1]}".into()));
    let mut missing_shard = index.clone();
    missing_shard["weight_map"][EMBED] = json!("model-00009-of-00009.safetensors");
    out.push(index_case(
        "missing shard file",
        Oracle::names("model-00009-of-00009.safetensors"),
        missing_shard.to_string(),
    ));
    let mut escape = index.clone();
    escape["weight_map"][EMBED] = json!("../../../../etc/passwd");
    out.push(index_case("shard outside the folder", Oracle::names("passwd"), escape.to_string()));
    out
}
