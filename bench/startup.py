"""Time to the first training step on a large ImageFolder tree: ringtrain against torchvision's
ImageFolder + DataLoader, same tree, same machine, in one run. Both train the same small ResNet
(one basic block per stage, widths 16-128, 3x3 stem) at 16 px, batch 256, 2 workers, SGD; the
clock starts when the process is started and stops when its first optimizer step is done. Also
reported: ImageFolder's scan alone, and each side's peak resident memory at that moment.

  python bench/startup.py TREE [--cold] [--ringtrain PATH]

--cold drops the page cache before each measurement (needs root). Prints one JSON object.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

TORCH_SIDE = r'''
import sys, time
t0 = float(sys.argv[2])
import torch, torchvision
from torch import nn
from torchvision import transforms as T
from torchvision.models.resnet import BasicBlock, conv1x1
torch.set_num_threads(2)
def stage(cin, cout, stride):
    down = None if stride == 1 and cin == cout else nn.Sequential(conv1x1(cin, cout, stride), nn.BatchNorm2d(cout))
    return BasicBlock(cin, cout, stride, down)
tf = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
ts = time.time()
ds = torchvision.datasets.ImageFolder(sys.argv[1], tf)
scan = time.time() - ts
m = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                  stage(16, 16, 1), stage(16, 32, 2), stage(32, 64, 2), stage(64, 128, 2),
                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, len(ds.classes)))
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
dl = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=2, drop_last=True,
                                 persistent_workers=True)
for x, y in dl:
    loss = nn.functional.cross_entropy(m(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    break
first = time.time() - t0
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(f"STEP {first} {scan} {int(hwm) * 1024}", flush=True)
import os; os._exit(0)
'''


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def ringtrain_first_step(exe, tree, out):
    t0 = time.time()
    p = subprocess.Popen([exe, "train", "--data", tree, "--model", "resnet10-tiny", "--img-size", "16",
                          "--batch-size", "256", "--workers", "2", "--epochs", "1", "--log-every", "1",
                          "--out", out, "--overwrite"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        if " step 1/" in line:
            first = time.time() - t0
            hwm = [l for l in open(f"/proc/{p.pid}/status") if l.startswith("VmHWM")][0].split()[1]
            p.kill()
            p.wait()
            return first, int(hwm) * 1024
    p.wait()
    sys.exit(f"ringtrain ended before its first step (exit {p.returncode})")


def torch_first_step(tree):
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", TORCH_SIDE, tree, str(t0)], capture_output=True, text=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("STEP ")]
    if not line:
        sys.exit(f"the PyTorch side failed:\n{out.stderr}")
    first, scan, hwm = line[0].split()[1:]
    return float(first), float(scan), int(hwm)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--ringtrain", default=os.path.join(os.path.dirname(__file__), "..", "scripts", "ringtrain"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        if not a.cold:  # warm: one untimed pass of each side reads the tree into the page cache
            ringtrain_first_step(a.ringtrain, a.tree, os.path.join(d, "run"))
            torch_first_step(a.tree)
        if a.cold:
            drop_caches()
        r_first, r_mem = ringtrain_first_step(a.ringtrain, a.tree, os.path.join(d, "run"))
        if a.cold:
            drop_caches()
        t_first, t_scan, t_mem = torch_first_step(a.tree)
    print(json.dumps({
        "tree": a.tree, "cold": a.cold,
        "ringtrain_first_step_s": round(r_first, 2), "ringtrain_peak_rss_mb": round(r_mem / 1e6),
        "pytorch_first_step_s": round(t_first, 2), "pytorch_imagefolder_scan_s": round(t_scan, 2),
        "pytorch_peak_rss_mb": round(t_mem / 1e6),
        "ratio_ringtrain_to_pytorch": round(r_first / t_first, 3),
    }))


if __name__ == "__main__":
    main()
