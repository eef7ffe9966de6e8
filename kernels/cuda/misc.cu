// misc kernels (see kernels/src/cuda/misc.rs).
