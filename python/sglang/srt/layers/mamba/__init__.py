"""Mamba2 state ops: plain-torch references (`torch_ops`, the CPU path) and Triton kernels (`ops`)."""
