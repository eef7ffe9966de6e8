// moe kernels (see kernels/src/cuda/moe.rs).
