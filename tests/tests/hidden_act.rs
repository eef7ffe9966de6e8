//! `hidden_act` other than SiLU on a GPU: the CUDA kernels fuse SiLU (gated MLPs, MoE
//! experts, the Gated DeltaNet conv), so such a model is refused **at load**, with an error
//! that names the key and says to use `--device cpu`, never later inside a forward. (The
//! CPU parity of these models is in `parity.rs`.)
//!
//! `refused_for_cuda_before_any_weight_is_placed` runs anywhere: it drives the registry's
//! build with the weights aimed at `cuda:0` and checks that the refusal comes before any
//! tensor is taken (so before any device is touched). `gpu.rs`'s
//! `cuda_refuses_non_silu_hidden_act_at_load` does the same through `registry::load` on a
//! real GPU (`#[ignore]`d without one; `scripts/gpu-check.sh` runs it).

use porter_core::registry::{self, DraftLoadContext, LoadContext};
use porter_core::{config, DType, Device};
use tests::*;

/// The hidden_act fixtures and their activation (also in `gpu.rs`).
const FIXTURES: [(&str, &str); 3] =
    [("qwen3_gelu_tanh", "gelu_pytorch_tanh"), ("qwen3_moe_gelu", "gelu"), ("qwen3_next_relu2", "relu2")];

fn refusal(act: &str) -> String {
    format!(
        "config key `hidden_act` = \"{act}\": runs on the CPU backend only (the CUDA kernels fuse silu); use --device cpu"
    )
}

/// A copy of draft folder `draft` under the temp dir with `hidden_act` set in its config.
fn draft_with_act(draft: &str, act: &str) -> std::path::PathBuf {
    tests::variant(draft, &format!("hidden-act-{draft}-{act}"), |c| c["hidden_act"] = serde_json::json!(act))
}

#[test]
fn refused_for_cuda_before_any_weight_is_placed() {
    let cuda = Device::Cuda(0);
    for (name, act) in FIXTURES {
        let dir = fixture(name);
        let p = registry::prepare(&dir).unwrap();
        let mut w = p.map.load(p.checkpoint.clone(), DType::BF16).unwrap();
        w.set_device(cuda);
        let lc = LoadContext { dir: &dir, config: &p.config, dtype: DType::BF16, device: cuda };
        let e = (p.entry.build)(&lc, &mut w).err().map(|e| format!("{e:#}")).expect("built for CUDA");
        assert_eq!(e, refusal(act), "{name}");
        assert_eq!(w.stats().bytes_taken, 0, "{name}: weights were placed before the refusal");
        // The same model builds on the CPU.
        assert!(load(name, DType::BF16).is_ok(), "{name} on the CPU");
    }
    // A SiLU main model with a gelu FFN-only draft head: the draft is refused the same way.
    let main = load("mistral", DType::F32).unwrap();
    let main_cfg = config::read_config(&fixture("mistral")).unwrap();
    let dir = draft_with_act("mistral_mtp_draft", "gelu");
    let p = registry::prepare_draft(&dir, &main_cfg, &main.info, DType::F32).unwrap();
    let mut w = p.map.load(p.checkpoint.clone(), DType::F32).unwrap();
    w.set_device(cuda);
    let lc = DraftLoadContext {
        dir: &dir,
        config: &p.config,
        main_config: &main_cfg,
        main: &main.info,
        checkpoint: &p.checkpoint,
        dtype: DType::F32,
    };
    let e = (p.entry.build)(&lc, &mut w).err().map(|e| format!("{e:#}")).expect("draft built for CUDA");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(e, refusal("gelu"));
    assert_eq!(w.stats().bytes_taken, 0, "draft weights were placed before the refusal");
}
