#!/usr/bin/env bash
# Session 32, GPU call 5 (H100, run inline on call 4's warm machine): the 24-layer prefill at
# 4k and 8k with tc6 (clusters of 2) and tc5, twice each, alternating. Carry .dev/porter, .dev/ptx.tgz.
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say'); gunzip -c .dev/porter/porter.gz > /tmp/p && chmod +x /tmp/p; B="--device cuda --dtype bf16 --config qwen3-next-80b-a3b --layers 24 --prefill 4096,8192 --batch 1 --context 128 --steps 8"; for r in 1 2; do for f in tc6 tc5; do PORTER_GDN_TC6_CLUSTER=2 PORTER_GDN_CHUNK=$f timeout 100 /tmp/p bench $B > $OUT/b_${f}_$r.log 2>&1; echo "$f run $r rc=$? $(grep -E '^prefill' $OUT/b_${f}_$r.log | tr '\n' ' ')"; done; done
