"""toolkit.kernels: the op registry (runtime.py), torch reference ops and Triton kernels."""
