//! The core's modules form a layered, acyclic graph: each top-level module uses only the
//! modules below it (`error < tensor < batch < backend < comm < state < layer < nn < model < load <
//! engine`). This test reads every `crate::…` path in `core/src` (outside comments) and fails
//! on any edge that points up or sideways, naming the file and the line.

use std::path::Path;

const ORDER: &[&str] =
    &["error", "tensor", "batch", "backend", "comm", "state", "layer", "nn", "model", "load", "engine"];

/// Crate-root macros and where they are defined.
const MACROS: &[(&str, &str)] = &[("bail", "error"), ("err", "error"), ("ensure", "error"), ("by_dtype", "tensor")];

fn rank(m: &str) -> Option<usize> {
    ORDER.iter().position(|o| *o == m).or_else(|| MACROS.iter().find(|(n, _)| *n == m).and_then(|(_, d)| rank(d)))
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("core/src is readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn core_modules_are_layered_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut bad = Vec::new();
    let mut seen = 0;
    for f in &all {
        let rel = f.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("non-empty").as_os_str().to_string_lossy().to_string();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let Some(own) = rank(&module) else {
            bad.push(format!("{}: module `{module}` is not in the layer order {ORDER:?}", rel.display()));
            continue;
        };
        let text = std::fs::read_to_string(f).expect("readable source");
        for (ln, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + 7..];
                if let Some(group) = rest.strip_prefix('{') {
                    // `crate::{a, b}` imports: each name must be a known module or macro.
                    let names: String = group.chars().take_while(|&c| c != '}').collect();
                    for n in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                        check(n, own, &module, rel, ln, &mut bad);
                    }
                    continue;
                }
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                check(&name, own, &module, rel, ln, &mut bad);
                seen += 1;
            }
        }
    }
    assert!(seen > 100, "the scan found only {seen} crate paths: the test is not reading the sources");
    assert!(bad.is_empty(), "core layering violations:\n{}", bad.join("\n"));
}

fn check(name: &str, own: usize, module: &str, rel: &Path, ln: usize, bad: &mut Vec<String>) {
    match rank(name) {
        Some(r) if r <= own => {}
        Some(_) => {
            bad.push(format!("{}:{}: `{module}` uses `crate::{name}`, which is above it", rel.display(), ln + 1))
        }
        None => bad.push(format!(
            "{}:{}: `crate::{name}` is a root re-export; inside the core, use the defining module's path",
            rel.display(),
            ln + 1
        )),
    }
}
