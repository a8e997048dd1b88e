"""One rank's analysis: steps, classification, evidence, host causes, kernels."""
