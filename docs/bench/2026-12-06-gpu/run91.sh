#!/usr/bin/env bash
# Session 24, GPU call 2 (H100): cuda_moe_route (the fused router inside the direct gate+up
# kernels, opt-in PORTER_MOE_ROUTER=fused) failed 3 / 4 in call 1 on the "Special" logits
# with the DirectLegacy form (ids and weights equal, y not): the same test built from session
# 23's tree (cuda_moe_route_old) beside this tree's, to tell whether the router change did it.
# Carry .dev/k2.tgz, .dev/ptx.tgz.
set -uo pipefail
tar xzf .dev/k2.tgz -C .dev
source <(sed -n '/^# --- NVRTC/,/^say "== gpu-check/p' scripts/gpu-check.sh | grep -v '^say')
L=$OUT/logs; mkdir -p $L; exec > >(tee $OUT/summary.txt) 2>&1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
T="--include-ignored --nocapture --test-threads=1"
for t in cuda_moe_route_old cuda_moe_route; do
    for i in 1 2; do
        timeout 100 .dev/k2/$t $T > $L/$t.$i.log 2>&1; echo "[$SECONDS s] $t #$i rc=$? $(grep -E '^test result' $L/$t.$i.log)"
        grep -E "differ" $L/$t.$i.log | cut -c1-300
    done
done
