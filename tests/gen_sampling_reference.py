#!/usr/bin/env python3
"""Write porter's sampling reference fixtures: tests/fixtures/sampling_ref/cases.json.

Usage:
    target/sampling-venv/bin/python tests/gen_sampling_reference.py    # needs numpy only

Each case is one logits row (vocab 64..3000) with a request's parameters and token history, and
what an independent implementation of the logits processors says about it:

  * ``probs``: the final filtered, renormalised distribution (float64);
  * ``greedy``: the argmax after penalties and the min_tokens mask (first index on ties);
  * ``greedy_logprob`` and ``top``: log-softmax of the penalised + masked logits (float64), the
    greedy token's value and the ``logprobs`` best (id, logprob) pairs.

The processors are line-by-line numpy ports of Hugging Face transformers' (v4.5x)
``RepetitionPenaltyLogitsProcessor``, ``MinNewTokensLengthLogitsProcessor``,
``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper`` (ascending sort +
cumulative sum, ``cumprob <= 1 - top_p`` removed) and ``MinPLogitsWarper``, applied in HF's order;
presence / frequency penalties follow the OpenAI formula
``logit -= presence * (count > 0) + frequency * count`` over output tokens. Like HF, penalties and
temperature run on float32 scores; softmax and cumulative sums run in float64 here (HF uses
float32), and a case is redrawn when its top-p cut lies within 1e-4 of a cumulative mass, or
its top-k / min-p cut within 1e-4 (relative) of a kept value, so a float32 ulp cannot move it.

Deterministic: numpy PCG64 with fixed seeds; two runs write byte-identical files.
"""

import json
import os
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "sampling_ref")
F32 = np.float32


def repetition(scores, ids, penalty):
    """HF RepetitionPenaltyLogitsProcessor (gather, where(score < 0, * p, / p), scatter)."""
    if penalty == 1.0 or len(ids) == 0:
        return scores
    ids = np.asarray(ids, dtype=np.int64)
    score = scores[ids]
    score = np.where(score < 0, score * F32(penalty), score / F32(penalty)).astype(F32)
    out = scores.copy()
    out[ids] = score
    return out


def presence_frequency(scores, output, presence, frequency):
    """OpenAI: logit -= presence * [count > 0] + frequency * count, over output tokens."""
    if presence == 0.0 and frequency == 0.0:
        return scores
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=len(scores))[: len(scores)]
    out = scores.copy()
    seen = counts > 0
    out[seen] = (out[seen] - (F32(frequency) * counts[seen].astype(F32) + F32(presence))).astype(F32)
    return out


def min_tokens_mask(scores, out_len, min_tokens, stop_ids):
    """HF MinNewTokensLengthLogitsProcessor: stop ids to -inf while out_len < min_tokens."""
    if out_len >= min_tokens or not stop_ids:
        return scores
    out = scores.copy()
    out[np.asarray(stop_ids, dtype=np.int64)] = -np.inf
    return out


def softmax64(s):
    s = s.astype(np.float64)
    m = np.max(s)
    e = np.exp(s - m)
    return e / e.sum()


def top_k_warp(scores, k):
    """HF TopKLogitsWarper: remove scores < the k-th largest."""
    k = min(k, len(scores))
    kth = np.sort(scores)[::-1][k - 1]
    return np.where(scores < kth, -np.inf, scores).astype(F32)


def top_p_warp(scores, top_p):
    """HF TopPLogitsWarper: ascending sort, cumsum of softmax, remove cumprob <= 1 - top_p,
    always keep the last (largest) one."""
    order = np.argsort(scores, kind="stable")
    sorted_logits = scores[order]
    cum = np.cumsum(softmax64(sorted_logits))
    remove = cum <= (1.0 - top_p)
    remove[-1:] = False
    out = scores.copy()
    out[order[remove]] = -np.inf
    return out, cum


def min_p_warp(scores, min_p):
    """HF MinPLogitsWarper: remove probs < min_p * max prob (keep at least the top one)."""
    probs = softmax64(scores)
    remove = probs < min_p * probs.max()
    remove[np.argmax(scores)] = False
    return np.where(remove, -np.inf, scores).astype(F32), probs


def process(logits, case):
    """The penalised + masked logits (float32), and the final distribution (float64)."""
    p = case["params"]
    s = logits.astype(F32)
    s = repetition(s, case["prompt"] + case["output"], p["repetition_penalty"])
    s = presence_frequency(s, case["output"], p["presence_penalty"], p["frequency_penalty"])
    stop_ids = list(p["stop_token_ids"]) + ([] if p["ignore_eos"] else list(case["eos"]))
    s = min_tokens_mask(s, len(case["output"]), p["min_tokens"], stop_ids)
    penalised = s
    margin_ok = True
    t = p["temperature"]
    s = (s / F32(t)).astype(F32)
    if p["top_k"] is not None and p["top_k"] < len(s):
        srt = np.sort(s)[::-1]
        k = p["top_k"]
        # The k-th and (k+1)-th values must differ clearly (no ties at the cut).
        margin_ok &= abs(float(srt[k - 1]) - float(srt[k])) > 1e-4 * max(1.0, abs(float(srt[k - 1])))
        s = top_k_warp(s, k)
    if p["top_p"] is not None and p["top_p"] < 1.0:
        s, cum = top_p_warp(s, p["top_p"])
        margin_ok &= bool(np.all(np.abs(cum - (1.0 - p["top_p"])) > 1e-4))
    if p["min_p"] is not None and p["min_p"] > 0.0:
        probs = softmax64(s)
        ratio = probs / probs.max()
        live = np.isfinite(s)
        margin_ok &= bool(np.all(np.abs(ratio[live] - p["min_p"]) > 1e-4 * p["min_p"]))
        s, _ = min_p_warp(s, p["min_p"])
    probs = softmax64(s)
    return penalised, probs, margin_ok


def case_row(rng, name, vocab, scale, params, n_prompt=0, n_output=0, eos=(), boost=()):
    """Draws a case; redraws until its cuts are well away from float32 rounding."""
    base = dict(
        temperature=1.0, top_k=None, top_p=None, min_p=None, repetition_penalty=1.0, presence_penalty=0.0,
        frequency_penalty=0.0, logprobs=5, min_tokens=0, ignore_eos=False, stop_token_ids=[],
    )
    base.update(params)
    for _ in range(1000):
        logits = (rng.standard_normal(vocab) * scale).astype(F32)
        for i in boost:  # make these ids likely (e.g. eos, so the min_tokens mask matters)
            logits[i] = F32(np.max(logits) + 1.5)
        prompt = [int(x) for x in rng.integers(0, vocab, n_prompt)]
        # Output tokens repeat (so frequency counts exceed 1) and include likely ones.
        likely = [int(x) for x in np.argsort(-logits, kind="stable")[:8]]
        output = [int(rng.choice(likely)) if rng.random() < 0.6 else int(rng.integers(0, vocab)) for _ in range(n_output)]
        case = dict(name=name, vocab=vocab, params=base, prompt=prompt, output=output, eos=list(eos))
        penalised, probs, ok = process(logits, case)
        if not ok:
            continue
        n = base["logprobs"] or 0
        lse = np.logaddexp.reduce(penalised.astype(np.float64))
        lp = penalised.astype(np.float64) - lse
        order = sorted(range(vocab), key=lambda i: (-float(penalised[i]), i))
        greedy = order[0]
        case.update(
            logits=[float(x) for x in logits],
            probs=[float(x) for x in probs],
            greedy=int(greedy),
            greedy_logprob=float(lp[greedy]),
            top=[[int(i), float(lp[i])] for i in order[:n]],
        )
        return case
    sys.exit(f"{name}: no well-conditioned draw in 1000 tries")


def main():
    rng = np.random.Generator(np.random.PCG64(20260501))
    cases = [
        case_row(rng, "temperature_only", 64, 2.0, dict(temperature=0.8)),
        case_row(rng, "top_k", 128, 2.0, dict(top_k=10, logprobs=20)),
        case_row(rng, "top_p_large_vocab", 1000, 3.0, dict(temperature=0.7, top_p=0.9)),
        case_row(rng, "top_p_flat_fallback", 1000, 0.3, dict(top_p=0.9, logprobs=0)),
        case_row(rng, "top_k_top_p", 500, 2.5, dict(top_k=50, top_p=0.8)),
        case_row(rng, "min_p", 256, 2.0, dict(min_p=0.05)),
        case_row(rng, "top_k_top_p_min_p", 300, 2.0, dict(temperature=1.3, top_k=40, top_p=0.95, min_p=0.1)),
        case_row(rng, "top_k_large", 3000, 2.0, dict(top_k=1500, temperature=0.9)),
        case_row(rng, "repetition", 200, 2.0, dict(repetition_penalty=1.3, top_p=0.9), n_prompt=30, n_output=12),
        case_row(rng, "presence_frequency", 128, 2.0, dict(temperature=0.9, presence_penalty=0.5,
                                                           frequency_penalty=0.8), n_prompt=10, n_output=20),
        case_row(rng, "all_penalties", 256, 2.0, dict(repetition_penalty=1.2, presence_penalty=-0.5,
                                                      frequency_penalty=1.5, top_k=20, min_p=0.02, logprobs=20),
                 n_prompt=40, n_output=25),
        case_row(rng, "min_tokens_mask", 96, 2.0, dict(min_tokens=5, stop_token_ids=[11]),
                 n_output=2, eos=[3, 7], boost=[3, 11]),
        case_row(rng, "min_tokens_ignore_eos", 96, 2.0, dict(min_tokens=5, ignore_eos=True, stop_token_ids=[11],
                                                             top_p=0.9), n_output=2, eos=[3], boost=[3, 11]),
        case_row(rng, "min_tokens_reached", 96, 2.0, dict(min_tokens=2, stop_token_ids=[11]),
                 n_output=2, eos=[3], boost=[3]),
    ]
    os.makedirs(OUT, exist_ok=True)
    meta = dict(generator="tests/gen_sampling_reference.py", numpy=np.__version__, cases=cases)
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(meta, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}/cases.json")


if __name__ == "__main__":
    main()
