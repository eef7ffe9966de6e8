//! Launch wrappers of kernels/cuda/moe.cu.
