"""The Diagnosis model: its dataclasses, finding metrics, enums and words."""
