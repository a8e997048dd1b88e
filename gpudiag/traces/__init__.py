"""Trace loaders: every input format becomes the same interval model (:mod:`gpudiag.traces.schema`)."""
