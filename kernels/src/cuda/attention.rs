//! Launch wrappers of kernels/cuda/attention.cu.
