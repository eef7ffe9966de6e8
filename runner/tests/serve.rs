//! `porter serve` end to end: tests/python/test_serve.py, test_serve_models.py and
//! test_serve_tools.py drive the server with the official openai client (installed by
//! scripts/test-setup.sh into target/smollm2-venv) on the bundled checkpoint and on the real
//! SmolLM2 (target/smollm2).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn openai_client_against_porter_serve() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let py = root.join("target/smollm2-venv/bin/python");
    assert!(py.is_file(), "{} is missing: run scripts/test-setup.sh (installs the openai client)", py.display());
    for script in ["test_serve.py", "test_serve_models.py", "test_serve_tools.py"] {
        let out = Command::new(&py)
            .arg(root.join("tests/python").join(script))
            .arg(env!("CARGO_BIN_EXE_porter"))
            .current_dir(&root)
            .output()
            .unwrap_or_else(|e| panic!("running tests/python/{script}: {e}"));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        println!("{text}");
        assert!(out.status.success(), "tests/python/{script} failed:\n{text}");
    }
}
