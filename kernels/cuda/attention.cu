// attention kernels (see kernels/src/cuda/attention.rs).
