"""Scheduled attention: the autograd function over the Triton kernels (``forward``, ``backward``) and the float64
reference (``reference``) that defines what it computes. Triton is imported on the first kernel call, not here."""

from .reference import dense_masked_attention
from .scheduled import forward_kernel, scheduled_attention

__all__ = ["dense_masked_attention", "forward_kernel", "scheduled_attention"]
