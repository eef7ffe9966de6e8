use super::*;

#[test]
fn disk_cache_round_trip_and_header_check() {
    let dir = std::env::temp_dir().join(format!("porter-ptx-test-{}", std::process::id()));
    let path = dir.join("x-sm_90-0123.ptx");
    let ptx = Ptx::from_src(".version 8.0\n// body\n".to_string());
    write_cached(&path, "// h1\n", &ptx);
    assert_eq!(read_cached(&path, "// h1\n").map(|p| p.to_src()), Some(ptx.to_src()));
    assert!(read_cached(&path, "// h2\n").is_none(), "a header mismatch must not be used");
    let _ = std::fs::remove_dir_all(&dir);
    assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]), "part boundaries are hashed");
}

/// Every `__global__` function of every source waits for its predecessor first thing
/// (`porter_pdl_enter`, common.cuh): under programmatic dependent launch a kernel that
/// does not may run beside the grid before it, and so may every kernel after it.
#[test]
fn every_kernel_enters_through_the_pdl_wait() {
    let mut kernels = 0;
    for src in sources() {
        let text = src.full_text();
        for (at, _) in text.match_indices("__global__") {
            let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            if text[line_start..at].contains("//") {
                continue; // in a comment
            }
            let after = &text[at + "__global__".len()..];
            // The body starts at the first `{` outside parentheses; a `;` first is a
            // declaration.
            let (mut depth, mut body) = (0i32, None);
            for (i, c) in after.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    ';' if depth == 0 => break,
                    '{' if depth == 0 => {
                        body = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            let Some(b) = body else { continue };
            let first = after[b + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
            let head: String = after[..b].chars().take(120).collect();
            // Or with a call of a device function named `*_pdl` that issues loads of
            // weights only (data no earlier kernel writes) before its own
            // porter_pdl_enter() (fp8_gemvt.cu: the weight stream overlaps the previous
            // kernel's tail).
            let pdl_fn = first.split(['(', '<']).next().filter(|f| f.ends_with("_pdl") && !f.contains(' '));
            let ok = first.starts_with("porter_pdl_enter();")
                || pdl_fn.is_some_and(|f| {
                    let def = text.find(&format!("void {f}(")).map(|d| &text[d..]);
                    def.and_then(|d| d.find("\n}\n").map(|e| &d[..e]))
                        .is_some_and(|b| b.contains("porter_pdl_enter();"))
                });
            assert!(ok, "{}: a kernel does not start with porter_pdl_enter(): {head}", src.name);
            kernels += 1;
        }
    }
    assert!(kernels >= 100, "found only {kernels} kernels");
}

#[test]
fn cubin_cache_round_trip_and_header_check() {
    let dir = std::env::temp_dir().join(format!("porter-cubin-test-{}", std::process::id()));
    let ptx_path = dir.join("x-sm_90-0123.ptx");
    let cubin = b"\x7fELF\x02\x01\x01\0binary\0with\nnewlines".to_vec();
    write_cached_cubin(&ptx_path, "// h1\n", &cubin);
    assert!(dir.join("x-sm_90-0123.cubin").is_file(), "the cubin sits beside the PTX file");
    assert_eq!(read_cached_cubin(&ptx_path, "// h1\n"), Some(cubin));
    assert!(read_cached_cubin(&ptx_path, "// h2\n").is_none(), "a header mismatch must not be used");
    let _ = std::fs::remove_dir_all(&dir);
}

/// NVRTC builds a cubin for a real architecture, and [`module_image`] hands it out (an
/// ELF image) while [`compile_with`] still gives the PTX text.
#[test]
#[ignore = "needs NVRTC (bash .ci/run installs it)"]
fn nvrtc_module_image_is_a_cubin() {
    static TINY: KernelSource = KernelSource {
        name: "tiny_cubin_test.cu",
        code: "extern \"C\" __global__ void tiny(float* x) { porter_pdl_enter(); x[threadIdx.x] *= 2.0f; }\n",
    };
    if let Err(e) = nvrtc_available() {
        panic!("NVRTC not available: {e}");
    }
    let (_, len) = image(&TINY, "sm_90", false).unwrap_or_else(|e| panic!("{e}"));
    let slot = slot_of(&TINY.full_text(), "sm_90", false);
    let built = slot.lock().unwrap();
    let cubin = built.cubin.as_ref().expect("a cubin for sm_90");
    assert_eq!(cubin.len(), len);
    assert!(cubin.starts_with(b"\x7fELF"), "a cubin is an ELF image");
    drop(built);
    let ptx = compile_with(&TINY, "sm_90", false).unwrap_or_else(|e| panic!("{e}")).to_src();
    assert!(ptx.contains(".entry tiny("), "compile_with gives the PTX text");
    assert!(ptx.contains("griddepcontrol.wait"), "sm_90 kernels wait for their predecessor");
}

#[test]
fn arch_names() {
    for (given, want) in [("sm_90", "sm_90"), ("90", "sm_90"), ("9.0", "sm_90"), ("SM_86", "sm_86"), ("12.1", "sm_121")]
    {
        assert_eq!(arch_named(given), Some(want), "{given}");
    }
    for bad in ["sm_91", "", "9", "9.00", "sm_"] {
        assert_eq!(arch_named(bad), None, "{bad}");
    }
    // Every (major, minor) arch_for knows round-trips through its name.
    for a in ARCHS {
        let (major, minor) = (a[3..a.len() - 1].parse::<i32>().unwrap(), a[a.len() - 1..].parse::<i32>().unwrap());
        assert_eq!(arch_for(major, minor).unwrap(), a);
    }
}

#[test]
fn include_dir_error_is_clear() {
    let e = include_dir_from(Some("/nonexistent/porter-cuda-include".into())).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("/nonexistent/porter-cuda-include/cuda_bf16.h not found"), "{msg}");
    assert!(msg.contains(INCLUDE_ENV), "{msg}");
}
