"""Field-case scenarios (YAML): one per NVML failure seen on real drivers (F01-F26)."""
