"""Pure analysis: RunTimeline + Thresholds → Diagnosis, with no I/O."""
