"""Embedded demo training job: a tiny DDP model on CPU (gloo) or GPU (NCCL)."""
