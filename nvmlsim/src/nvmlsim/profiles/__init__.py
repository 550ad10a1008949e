"""Built-in scenario profiles (YAML) of the simulated NVML driver."""
