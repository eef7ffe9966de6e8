//! The chat page of `porter serve` (`GET /`) in a real headless Chromium:
//! tests/python/test_chat_page.py drives it over the DevTools protocol (websocket-client, installed
//! by scripts/test-setup.sh into target/smollm2-venv) on the real SmolLM2 (target/smollm2).
//!
//! `#[ignore]`d because Chromium is not part of the README's test command; `.ci/run` installs
//! Debian's `chromium` and runs this with `--include-ignored`. Run by hand, it fails (does not
//! skip) when `chromium` is not on PATH.

use std::path::PathBuf;
use std::process::Command;

#[test]
#[ignore = "needs Debian's chromium; .ci/run installs it and runs this with --include-ignored"]
fn chat_page_in_headless_chromium() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let py = root.join("target/smollm2-venv/bin/python");
    assert!(py.is_file(), "{} is missing: run scripts/test-setup.sh (installs websocket-client)", py.display());
    let out = Command::new(&py)
        .arg(root.join("tests/python/test_chat_page.py"))
        .arg(env!("CARGO_BIN_EXE_porter"))
        .current_dir(&root)
        .output()
        .expect("running tests/python/test_chat_page.py");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "tests/python/test_chat_page.py failed:\n{text}");
}
