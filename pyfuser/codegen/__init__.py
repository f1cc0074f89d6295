"""Lowering of scheduled Fusion IR to kernel IR, CUDA C, and the CPU interpreter of kernel IR."""
