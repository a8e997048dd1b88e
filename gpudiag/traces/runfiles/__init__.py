"""Readers of what ``gpudiag run`` writes: telemetry, samples, alerts, dumps."""
