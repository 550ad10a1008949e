"""The simulated node alone: the memory both exporters of ``peer_bench`` carry for the simulator.

Run under the simulator's launcher (``python -m benchmarks.simexec ... -- benchmarks.sim_idle``)
on the same scenario as the exporters: it initialises NVML through nvidia-ml-py, reads each
device's handle and name once, then waits for SIGTERM making no further call. Its RSS is the
interpreter, nvidia-ml-py, the simulator and the simulated node's state (every device, process
and sample generator of the scenario), which both exporters hold as well, whatever they add.
"""

from __future__ import annotations

import signal
import threading

import pynvml


def main() -> int:
    """Initialise NVML, touch every device once, wait for SIGTERM or SIGINT."""
    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    signal.signal(signal.SIGINT, lambda _s, _f: stop.set())
    while not stop.wait(3600):
        pass
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
