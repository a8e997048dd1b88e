"""The Python API: paths → Diagnosis (the loading), saved diagnoses read back, pandas frames."""
