# Baseline for bench-interpreter.mjs: the same `1+1` cell sent straight to
# an ipykernel on the host with jupyter_client, no sandbox, no HTTP, no
# SDK. Prints the round-trip times (to the kernel's idle) in ms as JSON.
import json
import sys
import time

from jupyter_client.manager import start_new_kernel

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
km, kc = start_new_kernel(kernel_name="python3")
try:
    for _ in range(10):
        kc.execute_interactive("1+1", output_hook=lambda m: None)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        kc.execute_interactive("1+1", output_hook=lambda m: None)
        times.append((time.perf_counter() - t) * 1000)
    print(json.dumps(times))
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
