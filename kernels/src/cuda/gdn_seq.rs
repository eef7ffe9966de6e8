//! Launch wrappers of kernels/cuda/gdn_seq.cu.
