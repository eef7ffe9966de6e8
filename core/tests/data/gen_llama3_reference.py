"""Writes llama3_reference.json: inv_freq of transformers' `ROPE_INIT_FUNCTIONS["llama3"]`.

Run with torch + transformers (no network): `python3 core/tests/data/gen_llama3_reference.py`.
Each case is [params, head_dim, inv_freq (float32 values as floats), transformers version].
The committed file was made from these cases with transformers 5.17.0 and torch 2.11.0+cu130
(on the CPU of the project's GPU machine, the one with transformers installed).
"""

import json
import sys

import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

CASES = [
    # Llama 3.1 8B / 70B / 405B.
    (dict(rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
          original_max_position_embeddings=8192), 128, 131072),
    # Llama 3.2 1B / 3B.
    (dict(rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
          original_max_position_embeddings=8192), 64, 131072),
    # Small context, wide ramp: many medium frequencies.
    (dict(rope_theta=10000.0, factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0,
          original_max_position_embeddings=1024), 64, 4096),
]

out = []
for params, head_dim, max_pos in CASES:
    rope = dict(params, rope_type="llama3")
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                      max_position_embeddings=max_pos, rope_parameters=rope)
    inv_freq, scale = ROPE_INIT_FUNCTIONS["llama3"](cfg, torch.device("cpu"))
    assert inv_freq.dtype == torch.float32 and scale == 1.0
    out.append([rope, head_dim, [float(x) for x in inv_freq.tolist()], transformers.__version__])

path = sys.argv[1] if len(sys.argv) > 1 else "core/tests/data/llama3_reference.json"
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", path, "with transformers", transformers.__version__, "torch", torch.__version__)
