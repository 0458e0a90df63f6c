"""Tests of kernels/: each Pallas kernel (interpret mode) against its pure-JAX reference."""
