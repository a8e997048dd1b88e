"""Capture side: launches or attaches to a training job and writes a run directory.

Only this package may import torch, pynvml or nvtx, and ``hook``/``bootstrap`` are
imported inside the training processes only, never by the CLI process.
"""
