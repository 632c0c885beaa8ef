"""Adasum: the adaptive summation operator and its compiled kernels."""
