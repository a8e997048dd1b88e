"""One rank's analysis: classification, evidence, host causes, kernels (steps: reading/)."""
