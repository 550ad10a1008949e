"""Tests of the simulated NVML driver beneath nvidia-ml-py."""
