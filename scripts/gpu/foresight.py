"""One workload of the foresight validation, instrumented with gpumem.

    python3 scripts/gpu/foresight.py KIND OUTDIR

KIND is one of:
  leak95     a training loop that keeps each step's output with its graph,
             a step a second, about 94 MiB a step, under a 9 GiB limit
  leak7m     the same at about 29 MiB a step under an 11.9 GiB limit
  steady     5 minutes of training whose memory is the same step after step
  eval       a minute of training, then an evaluation batch without
             torch.no_grad() that does not fit under a 6 GiB limit
  too_large  a request larger than the GPU

Each writes OUTDIR/KIND.json: when it started, when the daemon's first
warning came (through gpumem.on_oom_risk, whose function also saves a
checkpoint to OUTDIR/KIND.ckpt), and when the OOM was raised. Its stderr
holds what the client printed: the warning and the verdict.
"""

import json
import os
import sys
import time

import torch
import torch.nn as nn

import gpumem

KIND, OUT = sys.argv[1], sys.argv[2]
GiB = 1 << 30
record = {"kind": KIND, "pid": os.getpid(), "start": time.time(), "warnings": []}


def dump():
    with open(os.path.join(OUT, KIND + ".json"), "w") as f:
        json.dump(record, f)


model = None


def save_checkpoint(risk):
    record["warnings"].append({"t": time.time(), "eta_seconds": risk.eta_seconds, "cause": risk.cause})
    if model is not None and not os.path.exists(os.path.join(OUT, KIND + ".ckpt")):
        torch.save(model.state_dict(), os.path.join(OUT, KIND + ".ckpt"))
        record["checkpoint"] = time.time()
    dump()


gpumem.on_oom_risk(save_checkpoint)
gpumem.start()


def limit(nbytes):
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(nbytes / total, 0)


def mlp(width=4096, depth=2):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers).cuda()


def leak(batch, ceiling):
    # Each step keeps its output, and with it the graph's saved tensors.
    global model
    limit(ceiling)
    model = mlp()
    outs = []
    while True:
        t = time.time()
        outs.append(model(torch.randn(batch, 4096, device="cuda")))
        torch.cuda.synchronize()
        time.sleep(max(0.0, 1.0 - (time.time() - t)))


def steady(seconds):
    global model
    limit(8 * GiB)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    end = time.time() + seconds
    while time.time() < end:
        loss = model(torch.randn(2048, 4096, device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        time.sleep(0.2)


def evaluation():
    global model
    limit(6 * GiB)
    model = mlp(depth=4)
    steady_end = time.time() + 60
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    while time.time() < steady_end:
        loss = model(torch.randn(1024, 4096, device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        time.sleep(0.2)
    # The evaluation batch, without torch.no_grad(): every layer's
    # activations are kept for a backward pass that never comes.
    model(torch.randn(128 * 1024, 4096, device="cuda")).sum().item()


try:
    if KIND == "leak95":
        leak(2000, 9 * GiB)
    elif KIND == "leak7m":
        leak(620, int(11.9 * GiB))
    elif KIND == "steady":
        steady(300)
    elif KIND == "eval":
        evaluation()
    elif KIND == "too_large":
        torch.empty(200 * GiB, dtype=torch.uint8, device="cuda")
    else:
        sys.exit("unknown kind " + KIND)
except torch.OutOfMemoryError:
    record["oom"] = time.time()
    dump()
    raise
dump()
