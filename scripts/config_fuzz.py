#!/usr/bin/env python3
"""Config fuzzer: porter vs transformers on random *legal* small configs.

For each architecture it draws random small configs (seeded), keeps only those that
transformers itself accepts (config class + model build + a finite forward), writes a hub-layout
bf16 checkpoint (random weights, as tests/gen_fixtures.py draws them), computes transformers'
float32 eager full-sequence logits on random ids, runs

    porter logits --model DIR --ids ... --out F --dtype f32 --device cpu [--incremental]

and compares: a case passes iff max|porter - HF| <= TOL * std(HF logits) for both the one-shot
prefill and the token-by-token (--incremental) run.  Failures are classified as

    rejected  porter refused the config (non-zero exit, an error message, no panic)
    crash     porter panicked / was killed by a signal / timed out
    mismatch  porter ran but its logits differ (confirmed with a second weight seed)

and, with --bisect, reduced to a minimal set of keys changed from the architecture's base config
(which passes).  Results go to WORKDIR/results.jsonl, reproducers to WORKDIR/repro/.

Usage (run with the reference venv):
    target/ref-venv/bin/python scripts/config_fuzz.py                       # all archs, 40 cases each
    target/ref-venv/bin/python scripts/config_fuzz.py --only qwen3_next --cases 60 --bisect
    target/ref-venv/bin/python scripts/config_fuzz.py --only llama --case-seeds 7,12   # re-run cases
    target/ref-venv/bin/python scripts/config_fuzz.py --config my_config.json      # one explicit config
    target/ref-venv/bin/python scripts/config_fuzz.py --list-keys                   # keys sampled per arch
    target/ref-venv/bin/python scripts/config_fuzz.py --avoid all --bisect        # skip already-found triggers
    target/ref-venv/bin/python scripts/config_fuzz.py --absent-sweep              # each optional key left out
    target/ref-venv/bin/python scripts/config_fuzz.py --tokens 80 --avoid all     # longer prompts

Archs: llama, mistral, qwen3, qwen3_moe, qwen3_next.

A rejected case is re-run with the key porter's error names put back to the base value (up to 3
times), so that the rest of the config is still tested (`repaired` in the results).  --avoid
re-draws configs that contain failure triggers found earlier (see known_features()), so that a run
looks past them.  The optional kernel packages (fla, causal_conv1d, kernels) are hidden from
transformers in this process so that it takes its pure-torch paths, as tests/gen_fixtures.py requires.
"""

import argparse
import contextlib
import copy
import importlib.machinery
import importlib.util
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# HF must take its pure-torch paths (as tests/gen_fixtures.py requires): hide the optional
# kernel packages from transformers' availability checks and from `import`.
BLOCKED = {"fla", "causal_conv1d", "kernels"}
_orig_find_spec = importlib.util.find_spec


def _find_spec(name, package=None):
    if name.split(".")[0] in BLOCKED:
        return None
    return _orig_find_spec(name, package)


importlib.util.find_spec = _find_spec


class _Block:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} hidden by config_fuzz.py (pure-torch reference)")
        return None


sys.meta_path.insert(0, _Block)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, "tests", "fixtures", "tokenizer.json")

# tests/gen_fixtures.py: hub names/shapes from an HF model, the random-weight rules, the writer.
_spec = importlib.util.spec_from_file_location("gen_fixtures", os.path.join(REPO, "tests", "gen_fixtures.py"))
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)
torch.set_num_threads(1)

TOL = 1e-3          # pass iff max|delta| <= TOL * std(ref)
T_DEFAULT = 16

transformers.logging.set_verbosity_error()


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from config_fuzz_space import *  # noqa: E402,F401,F403  (bases, samplers, VOCAB, DELETE, apply, ...)


# ------------------------------------------------------------------------------------------
# Running one config
# ------------------------------------------------------------------------------------------
def draw_ids(seed, T):
    rng = np.random.Generator(np.random.PCG64([seed, 11]))
    return torch.from_numpy(rng.integers(3, VOCAB, size=T).astype(np.int64))


class HfIllegal(Exception):
    pass


@torch.no_grad()
def hf_reference(folder, cfg, weight_seed, ids):
    """Writes config + weights into folder, returns HF float32 eager logits [T, V]."""
    os.makedirs(folder, exist_ok=True)
    for f in os.listdir(folder):
        os.remove(os.path.join(folder, f))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shutil.copy(TOKENIZER, os.path.join(folder, "tokenizer.json"))
    tied = bool(cfg.get("tie_word_embeddings", False))
    is_next = cfg["model_type"] == "qwen3_next"
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            hf_cfg = transformers.AutoConfig.from_pretrained(folder)
            skel = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
            tied = skel.config.tie_word_embeddings
            shapes = gen.hub_shapes_from_model(skel, tied)
            del skel
    except Exception as e:  # noqa: BLE001
        raise HfIllegal(f"{type(e).__name__}: {e}")
    if sum(math.prod(s) for s in shapes.values()) > 60_000_000:
        raise HfIllegal("too big")
    weights = gen.draw_weights(shapes, {"hidden_size": cfg["hidden_size"], "tie_word_embeddings": tied},
                               weight_seed, zero_centred_norms=is_next, out_gain=gen.OUT_GAIN)
    gen.write_weights(folder, weights, 1)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            model, info = AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
                output_loading_info=True)
            model.eval()
            bad = info["missing_keys"] or info["unexpected_keys"] or info.get("mismatched_keys")
            if bad:
                raise RuntimeError(f"harness: HF loading info {info}")
            logits = model(input_ids=ids[None, :], use_cache=False).logits[0].float()
    except RuntimeError as e:
        if str(e).startswith("harness:"):
            raise
        raise HfIllegal(f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001
        raise HfIllegal(f"{type(e).__name__}: {e}")
    if not torch.isfinite(logits).all():
        raise HfIllegal("non-finite HF logits")
    if float(logits.std()) < 1e-6:
        raise HfIllegal("degenerate HF logits")
    # what HF made of the config (for the record)
    hc = model.config
    facts = {
        "head_dim": getattr(hc, "head_dim", None),
        "num_key_value_heads": getattr(hc, "num_key_value_heads", None),
        "rope_parameters": getattr(hc, "rope_parameters", None),
        "layer_types": getattr(hc, "layer_types", None),
        "sliding_window": getattr(hc, "sliding_window", None),
        "tie": hc.tie_word_embeddings,
    }
    return logits, facts


def porter_logits(porter, folder, ids, incremental, timeout):
    out = os.path.join(folder, "porter_inc.safetensors" if incremental else "porter.safetensors")
    if os.path.exists(out):
        os.remove(out)
    cmd = [porter, "logits", "--model", folder, "--ids", ",".join(str(int(i)) for i in ids), "--out", out,
           "--dtype", "f32", "--device", "cpu"]
    if incremental:
        cmd.append("--incremental")
    env = dict(os.environ, RUST_BACKTRACE="0", NO_COLOR="1")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "crash", "error": f"timeout after {timeout}s"}
    err = p.stderr.strip()
    if p.returncode != 0:
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("loading ") and "\r" not in ln]
        if "panicked" in err or p.returncode < 0 or p.returncode == 101:
            status = "crash"
            msg = next((ln for ln in lines if "panicked" in ln), lines[-1] if lines else f"rc={p.returncode}")
            # the panic message is on the line after "panicked at file:line:col:"
            i = lines.index(msg) if msg in lines else -1
            if i >= 0 and i + 1 < len(lines):
                msg = msg + " " + lines[i + 1]
        else:
            status = "rejected"
            msg = " | ".join(lines[-4:]) if lines else f"rc={p.returncode}"
            msg = re.sub(r"^error: loading model from \S+: ", "", msg)
            msg = re.sub(r"invalid (\w+) config in \S+: ", r"\1: ", msg)
        return {"status": status, "error": msg, "rc": p.returncode}
    with safe_open(out, "pt") as f:
        t = f.get_tensor("logits")
    return {"status": "ok", "logits": t}


def compare(ref, got):
    if got.shape != ref.shape:
        return {"status": "mismatch", "ratio": float("inf"), "note": f"shape {tuple(got.shape)} vs {tuple(ref.shape)}"}
    d = (got - ref).abs()
    std = float(ref.std())
    ratio = float(d.max()) / std
    if not math.isfinite(ratio):
        return {"status": "mismatch", "ratio": float("inf"), "note": "non-finite porter logits"}
    row_ratio = (d.max(dim=1).values / std).tolist()
    first_bad = next((i for i, x in enumerate(row_ratio) if x > TOL), None)
    res = {"status": "pass" if ratio <= TOL else "mismatch", "ratio": ratio}
    if first_bad is not None:
        res["first_bad_pos"] = first_bad
        res["row_ratio"] = [round(x, 5) for x in row_ratio]
    return res


def run_config(args, cfg, folder, weight_seed, ids):
    """-> dict(verdict, hf=..., prefill=..., incremental=...). verdict: pass/mismatch/rejected/crash/hf_illegal."""
    try:
        ref, facts = hf_reference(folder, cfg, weight_seed, ids)
    except HfIllegal as e:
        return {"verdict": "hf_illegal", "hf_error": str(e)[:400]}
    res = {"hf_facts": facts, "std": float(ref.std())}
    kinds = []
    for mode, inc in (("prefill", False), ("incremental", True)):
        p = porter_logits(args.porter, folder, ids, inc, args.timeout)
        if p["status"] == "ok":
            c = compare(ref, p["logits"])
            res[mode] = c
            kinds.append(c["status"])
        else:
            res[mode] = {"status": p["status"], "error": p["error"]}
            kinds.append(p["status"])
    for k in ("crash", "mismatch", "rejected"):
        if k in kinds:
            res["verdict"] = k
            break
    else:
        res["verdict"] = "pass"
    return res


def signature(res):
    """What a failure looks like, for dedup and for bisection (same signature = same failure)."""
    v = res["verdict"]
    if v in ("rejected", "crash"):
        for mode in ("prefill", "incremental"):
            e = res.get(mode, {})
            if e.get("status") == v:
                msg = e["error"]
                m = re.search(r"config key `([^`]+)`", msg)
                if m:
                    return f"{v}:key:{m.group(1)}"
                msg = re.sub(r"/tmp/\S+", "DIR", msg)
                msg = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", msg)
                return f"{v}:{msg[-160:]}"
    if v == "mismatch":
        modes = [m for m in ("prefill", "incremental") if res.get(m, {}).get("status") == "mismatch"]
        return "mismatch:" + "+".join(modes)
    return v


def brief(res):
    v = res["verdict"]
    if v == "hf_illegal":
        return f"hf_illegal ({res['hf_error'][:120]})"
    parts = []
    for mode in ("prefill", "incremental"):
        e = res.get(mode, {})
        if "ratio" in e:
            parts.append(f"{mode} {e['ratio']:.2e}")
        elif "error" in e:
            parts.append(f"{mode} {e['status']}: {e['error'][:200]}")
    return f"{v}: " + "; ".join(parts)


# ------------------------------------------------------------------------------------------
# Bisection
# ------------------------------------------------------------------------------------------
def bisect(args, arch, overrides, sig, weight_seed, ids, folder, log):
    """Greedy minimisation: revert one override (then one sub-key of a dict override) at a time
    to the base; keep the reversion when transformers still accepts the config and the failure
    has the same signature."""
    base = BASES[arch]
    cur = diff_of(base, overrides)
    tries = 0

    def still_fails(ov):
        nonlocal tries
        tries += 1
        cfg = apply(base, ov)
        r = run_config(args, cfg, folder, weight_seed, ids)
        ok = r["verdict"] != "hf_illegal" and signature(r) == sig
        log(f"      bisect try {tries}: {sorted(ov)} -> {r['verdict']}{' (same)' if ok else ''}")
        return ok, r

    last = None
    changed = True
    while changed and tries < args.max_bisect_tries:
        changed = False
        for k in list(cur):
            if tries >= args.max_bisect_tries:
                break
            trial = {kk: vv for kk, vv in cur.items() if kk != k}
            ok, r = still_fails(trial)
            if ok:
                cur, last, changed = trial, r, True
    # sub-keys of dict-valued overrides (rope blocks)
    for k in list(cur):
        v = cur[k]
        if not isinstance(v, dict):
            continue
        for sk in list(v):
            if tries >= args.max_bisect_tries:
                break
            if sk in ("rope_type", "type"):
                continue
            trial = dict(cur)
            trial[k] = {kk: vv for kk, vv in v.items() if kk != sk}
            ok, r = still_fails(trial)
            if ok:
                cur, last, v = trial, r, trial[k]
    if last is None:
        cfg = apply(base, cur)
        last = run_config(args, cfg, folder, weight_seed, ids)
    return cur, last, tries


# ------------------------------------------------------------------------------------------
# Main loop
# ------------------------------------------------------------------------------------------
def show_diff(d):
    return json.dumps({k: ("<absent>" if v == DELETE else v) for k, v in d.items()}, sort_keys=True)


def offending_key(res):
    """The config key porter's rejection names (None if it names none)."""
    for mode in ("prefill", "incremental"):
        e = res.get(mode, {})
        if e.get("status") != "rejected":
            continue
        m = re.search(r"config key `([^`]+)`", e["error"])
        if m:
            return m.group(1)
        if "max_position_embeddings" in e["error"]:
            return "max_position_embeddings"
    return None


def revert_key(overrides, key):
    """Overrides with `key` (possibly `block.sub`) back at the base value; None if nothing changes."""
    ov = copy.deepcopy(overrides)
    top = key.split(".")[0]
    changed = False
    if key == "partial_rotary_factor" or key.endswith(".partial_rotary_factor"):
        for b in ("rope_scaling", "rope_parameters"):
            if isinstance(ov.get(b), dict) and "partial_rotary_factor" in ov[b]:
                ov[b].pop("partial_rotary_factor")
                changed = True
    if top in ov:
        del ov[top]
        changed = True
        if top in ("rope_scaling", "rope_parameters"):
            ov.pop("original_max_position_embeddings", None)
    return ov if changed else None


def run_case(args, arch, seed, log):
    T = args.tokens
    folder = os.path.join(args.workdir, "cases", f"{arch}_{seed}")
    ids = draw_ids(seed, T)
    weight_seed = 1000 + seed
    for attempt in range(args.max_resample):
        case_seed = seed if attempt == 0 else f"{seed}.{attempt}"
        overrides = sample(arch, case_seed, T)
        cfg = apply(BASES[arch], overrides)
        hit = known_features(arch, cfg, T) & args.avoid
        if hit:
            log(f"   [{arch} {case_seed}] contains avoided trigger(s) {sorted(hit)} -> resample")
            continue
        t0 = time.time()
        res = run_config(args, cfg, folder, weight_seed, ids)
        if res["verdict"] != "hf_illegal":
            break
        log(f"   [{arch} {case_seed}] transformers rejects: {res['hf_error'][:150]} -> resample")
    else:
        return {"arch": arch, "seed": seed, "verdict": "hf_illegal", "hf_error": "no legal draw"}
    rec = {"arch": arch, "seed": seed, "case_seed": str(case_seed), "T": T, "weight_seed": weight_seed,
           "diff": diff_of(BASES[arch], overrides), "config": cfg, **res, "secs": round(time.time() - t0, 2)}
    if res["verdict"] == "mismatch":
        # confirm with another weight draw (a MoE routing tie could flip one token's experts)
        r2 = run_config(args, cfg, folder, weight_seed + 500_000, ids)
        rec["confirm"] = {"verdict": r2["verdict"], "brief": brief(r2)}
        if r2["verdict"] == "pass":
            rec["verdict"] = "flaky"
    log(f"   [{arch} {case_seed}] {brief(rec) if rec['verdict'] != 'flaky' else 'FLAKY ' + brief(res)}  "
        f"({rec['secs']}s)  diff={show_diff(rec['diff'])[:600]}")
    # a rejection hides what the rest of the config does: put the named key back to the base
    # value and run again (up to 3 times); the outcome is recorded as `repaired`.
    ov, r = overrides, res
    rec["repairs"] = []
    while r["verdict"] == "rejected" and len(rec["repairs"]) < 3:
        key = offending_key(r)
        ov2 = revert_key(ov, key) if key else None
        if ov2 is None:
            break
        r = run_config(args, apply(BASES[arch], ov2), folder, weight_seed, ids)
        if r["verdict"] == "hf_illegal":
            rec["repairs"].append({"reverted": key, "verdict": "hf_illegal"})
            break
        ov = ov2
        rec["repairs"].append({"reverted": key, "verdict": r["verdict"], "brief": brief(r)})
        log(f"      repaired `{key}` -> {brief(r)[:300]}")
    if rec["repairs"] and rec["repairs"][-1]["verdict"] not in ("hf_illegal",):
        rec["repaired"] = {"verdict": r["verdict"], "diff": diff_of(BASES[arch], ov), "result": r}
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="comma-separated archs (llama,mistral,qwen3,qwen3_moe,qwen3_next)")
    ap.add_argument("--cases", type=int, default=40, help="cases per arch")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--case-seeds", default=None, help="comma-separated case seeds to (re-)run instead of a range")
    ap.add_argument("--tokens", type=int, default=T_DEFAULT, help="prompt length")
    ap.add_argument("--workdir", default="/tmp/fuzz")
    ap.add_argument("--porter", default=os.path.join(REPO, "target", "release", "porter"))
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--max-resample", type=int, default=25)
    ap.add_argument("--bisect", action="store_true", help="minimise failures (one per signature, mismatches: each)")
    ap.add_argument("--max-bisect", type=int, default=30, help="at most this many bisections in the run")
    ap.add_argument("--max-bisect-tries", type=int, default=60)
    ap.add_argument("--time-budget", type=float, default=0, help="stop starting new cases after this many seconds")
    ap.add_argument("--config", default=None, help="run one explicit config.json (arch from `architectures`)")
    ap.add_argument("--weight-seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="results file (default WORKDIR/results.jsonl)")
    ap.add_argument("--list-keys", action="store_true")
    ap.add_argument("--absent-sweep", action="store_true", help="leave each optional key out of the base config")
    ap.add_argument("--avoid", default="",
                    help="re-draw configs containing these already-found triggers (comma list, or `all`): "
                         "acts, rope_kinds, small_maxpos, omax_top, mistral_layer_types, factor_lt1, llama3_edge, "
                         "yarn_absent_maxpos, odd_rotary, mlp_oob")
    args = ap.parse_args()
    ALL = {"acts", "rope_kinds", "small_maxpos", "omax_top", "mistral_layer_types", "factor_lt1", "llama3_edge",
           "yarn_absent_maxpos", "odd_rotary", "mlp_oob"}
    args.avoid = ALL if args.avoid == "all" else set(filter(None, args.avoid.split(",")))
    if args.avoid - ALL:
        sys.exit(f"unknown --avoid names {sorted(args.avoid - ALL)}")

    os.makedirs(args.workdir, exist_ok=True)
    logf = open(os.path.join(args.workdir, "fuzz.log"), "a")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    if args.list_keys:
        for arch in BASES:
            keys = set()
            for s in range(200):
                keys |= set(sample(arch, s, args.tokens))
            print(arch, sorted(keys))
        return

    if not os.path.exists(args.porter):
        sys.exit(f"porter binary not found: {args.porter} (cargo build --release -p runner)")

    if args.config:
        with open(args.config) as f:
            cfg = json.load(f)
        arch = next(a for a, c in ARCH_CLASS.items() if c == cfg["architectures"][0])
        ids = draw_ids(args.weight_seed, args.tokens)
        folder = os.path.join(args.workdir, "single")
        res = run_config(args, cfg, folder, 1000 + args.weight_seed, ids)
        print(json.dumps({k: v for k, v in res.items()}, indent=1, default=str)[:6000])
        print(brief(res))
        return

    archs = args.only.split(",") if args.only else list(BASES)
    for a in archs:
        if a not in BASES:
            sys.exit(f"unknown arch {a}; known: {', '.join(BASES)}")
    if args.absent_sweep:
        # each optional key of the base config left out on its own: transformers' class default applies
        ids = draw_ids(0, args.tokens)
        for arch in archs:
            for key in ABSENT[arch] + ["rope_theta", "rope_scaling"]:
                if key not in BASES[arch]:
                    continue
                cfg = apply(BASES[arch], {key: DELETE})
                r = run_config(args, cfg, os.path.join(args.workdir, "cases", f"{arch}_absent_{key}"), 1000, ids)
                log(f"   [{arch} without `{key}`] {brief(r)[:400]}")
        return
    out_path = args.out or os.path.join(args.workdir, "results.jsonl")
    outf = open(out_path, "a")
    log(f"== config_fuzz: transformers {transformers.__version__}, torch {torch.__version__}, porter {args.porter}, "
        f"T={args.tokens}, tol={TOL}, archs={archs}, avoid={sorted(args.avoid)}, started {time.strftime('%H:%M:%S')}")
    t_start = time.time()
    summary = {}
    bisected_sigs = set()
    n_bisect = 0
    for arch in archs:
        # the base config must pass
        ids0 = draw_ids(0, args.tokens)
        r0 = run_config(args, BASES[arch], os.path.join(args.workdir, "cases", f"{arch}_base"), 1000, ids0)
        log(f"-- {arch}: base config {brief(r0)}")
        seeds = ([int(s) for s in args.case_seeds.split(",")] if args.case_seeds else
                 list(range(args.first_seed, args.first_seed + args.cases)))
        st = summary.setdefault(arch, {"run": 0, "pass": 0, "mismatch": 0, "rejected": 0, "crash": 0,
                                       "flaky": 0, "hf_illegal": 0})
        for seed in seeds:
            if args.time_budget and time.time() - t_start > args.time_budget:
                log(f"   time budget reached; stopping {arch} at seed {seed}")
                break
            rec = run_case(args, arch, seed, log)
            st["run"] += 1
            st[rec["verdict"]] = st.get(rec["verdict"], 0) + 1
            if rec["verdict"] in ("mismatch", "rejected", "crash"):
                sig = signature(rec)
                rec["signature"] = sig
                want = args.bisect and n_bisect < args.max_bisect and (
                    (arch, sig) not in bisected_sigs or rec["verdict"] == "mismatch")
                if want:
                    n_bisect += 1
                    bisected_sigs.add((arch, sig))
                    folder = os.path.join(args.workdir, "cases", f"{arch}_{seed}_bisect")
                    ov = {k: v for k, v in rec["diff"].items()}
                    mini, last, tries = bisect(args, arch, ov, sig, rec["weight_seed"],
                                               draw_ids(seed, args.tokens), folder, log)
                    rec["minimal_diff"] = mini
                    rec["minimal_result"] = {"verdict": last["verdict"], "brief": brief(last)}
                    rec["bisect_tries"] = tries
                    rdir = os.path.join(args.workdir, "repro", f"{arch}_{seed}")
                    os.makedirs(rdir, exist_ok=True)
                    with open(os.path.join(rdir, "config.json"), "w") as f:
                        json.dump(apply(BASES[arch], mini), f, indent=2)
                    log(f"   [{arch} {seed}] MINIMAL ({tries} tries): {show_diff(mini)} -> {brief(last)}")
            rep = rec.get("repaired")
            if rep and rep["verdict"] in ("mismatch", "crash"):
                sig = signature(rep["result"])
                st["repaired_" + rep["verdict"]] = st.get("repaired_" + rep["verdict"], 0) + 1
                if args.bisect and n_bisect < args.max_bisect:
                    n_bisect += 1
                    folder = os.path.join(args.workdir, "cases", f"{arch}_{seed}_bisect")
                    mini, last, tries = bisect(args, arch, dict(rep["diff"]), sig, rec["weight_seed"],
                                               draw_ids(seed, args.tokens), folder, log)
                    rep["minimal_diff"] = mini
                    rep["minimal_result"] = {"verdict": last["verdict"], "brief": brief(last)}
                    rdir = os.path.join(args.workdir, "repro", f"{arch}_{seed}_repaired")
                    os.makedirs(rdir, exist_ok=True)
                    with open(os.path.join(rdir, "config.json"), "w") as f:
                        json.dump(apply(BASES[arch], mini), f, indent=2)
                    log(f"   [{arch} {seed}] MINIMAL after repair ({tries} tries): {show_diff(mini)} -> {brief(last)}")
            elif rep and rep["verdict"] == "pass":
                st["repaired_pass"] = st.get("repaired_pass", 0) + 1
            if rep:
                rep.pop("result", None)
            rec.pop("config", None) if rec["verdict"] == "pass" else None
            outf.write(json.dumps(rec, default=str) + "\n")
            outf.flush()
    log("\n== summary (cases run / pass / mismatch / rejected / crash / flaky)")
    for arch, st in summary.items():
        log(f"   {arch:<11} {st['run']:>4} {st['pass']:>5} {st['mismatch']:>9} {st['rejected']:>9} {st['crash']:>6}"
            f" {st['flaky']:>6}   (hf-illegal after resampling: {st['hf_illegal']}; rejected cases after reverting "
            f"the named key: pass {st.get('repaired_pass', 0)}, mismatch {st.get('repaired_mismatch', 0)}, "
            f"crash {st.get('repaired_crash', 0)})")
    log(f"   total time {time.time() - t_start:.0f}s; results in {out_path}")


if __name__ == "__main__":
    main()
