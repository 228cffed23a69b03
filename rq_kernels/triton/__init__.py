"""Device code of the ResidualQuant kernels: ``@triton.jit`` functions only (no host logic)."""
