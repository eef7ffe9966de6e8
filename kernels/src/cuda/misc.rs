//! Launch wrappers of kernels/cuda/misc.cu.
