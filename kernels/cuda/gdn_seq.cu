// gdn_seq kernels (see kernels/src/cuda/gdn_seq.rs).
