"""The scenario file format: pydantic models, value patterns and cross-field checks."""
