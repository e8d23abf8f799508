"""torch.profiler's own per-operator self times, the independent reference for
`ringtrain trace-table`: profiles STEPS training steps of torchvision's ResNet-18 (batch 8, 32 px,
SGD) on the CPU, each in a "ProfilerStep#N" scope, writes the Chrome trace to OUT, and prints
one JSON object: {"steps": N, "measured_ms": ..., "self_ms": {op name: self CPU ms per step}}
from `key_averages()` (its self_cpu_time_total, the step scopes left out).

Usage: profile_reference.py OUT.json STEPS
"""
import json
import sys
import time

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile, record_function


def main(out, steps):
    steps = int(steps)
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    def step():
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            with record_function(f"ProfilerStep#{i + 1}"):
                step()
        measured_ms = (time.perf_counter() - t0) * 1000 / steps
    prof.export_chrome_trace(out)
    self_ms = {e.key: e.self_cpu_time_total / 1000 / steps for e in prof.key_averages()
               if not e.key.startswith("ProfilerStep")}
    print(json.dumps({"steps": steps, "measured_ms": measured_ms, "self_ms": self_ms}))


if __name__ == "__main__":
    main(*sys.argv[1:])
