"""Background samplers beside the job: NVML and the host's run conditions."""
