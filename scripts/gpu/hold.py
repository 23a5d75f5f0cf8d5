"""Hold N MiB on GPU 0 (instrumented with gpumem) until killed."""
import sys
import time

import gpumem
import torch

gpumem.start()
x = torch.empty(int(sys.argv[1]) * (1 << 20), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", sys.argv[1], "MiB", flush=True)
while True:
    time.sleep(1)
