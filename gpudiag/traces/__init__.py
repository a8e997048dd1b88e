"""Trace loaders: every input format becomes one interval model (:mod:`gpudiag.traces.schema`)."""
