"""The GPU battery (run it as bench/gpu.sh): every CUDA path of ringtrain once, checked, then the
speed figures against PyTorch, in one run that writes one log (battery.log) and one JSON file
(battery.json) into --out. Correctness first, then speed; each check is recorded as it ends, so a
run stopped by its time budget still leaves everything it measured.

  bench/gpu.sh [--bin RINGTRAIN] [--data DIR] [--out DIR] [--only NAME,...] [--budget S] [--dry-run]

--bin      ringtrain: a bundle's launcher (scripts/bundle.sh) or a binary [default: the bundle
           this script is in, else the build's release binary]
--data     an ImageFolder set with train/ and test/ (or val/), e.g. the JPEG copy of plant
           seedlings that bench/jpeg_copy.py writes [default: the demo's generated images]
--only     checks by name, or all of a kind: correctness (about 5 minutes on an H200), speed (about 12,
           and about 6 more for the profiles and --fused-norm rows on an H100); the others are
           recorded in battery.json as skipped
--dry-run  the same sequence on the CPU with tiny sizes (fp16 becomes bf16, which the CPU has):
           checks the battery itself, its command lines and its readers, not CUDA. The whole
           sequence takes about 13 minutes on 2 cores: run it before a GPU session (the test
           suite runs one check of each kind, tests/bundle.rs).
Exit status: 0 when every correctness check passed.
"""
import argparse
import csv
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent

# The CPU test's bounds (tests/dist.rs), relative to the update one process made.
LENET_SAME = 5e-6  # 2 ranks x 8 against 1 x 16, no BatchNorm
SYNC_BN_SAME = 5e-2  # 2-rank SyncBatchNorm against one process with BatchNorm
PER_RANK_BN_DIFFERENT = 0.2  # per-rank BatchNorm must differ by more than this
AGREEMENT = 0.99  # eval/predict on CUDA against the CPU: same top-1 class
OVERFLOW_SCALE = 2.0**30  # an initial fp16 loss scale that overflows the first gradients


class Failed(Exception):
    """A check that ran and found something wrong; `details` are recorded with it."""

    def __init__(self, message, **details):
        super().__init__(message)
        self.details = details


# nvidia-smi's clock event reasons (clocks_event_reasons.active), the ones that slow a busy GPU.
SLOWDOWNS = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "heat (software)", 0x40: "heat (hardware)",
             0x80: "power brake"}
CLOCK_FIELDS = "utilization.gpu,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,clocks_event_reasons.active"
BUSY = 50  # % utilisation from which a sample counts as the GPU at work
SLOW_CLOCK = 0.9  # a busy median SM clock below this share of the maximum: slowed


class GpuClocks:
    """nvidia-smi sampling the GPU every 500 ms while a speed check runs: a GPU that slows down for
    heat or power mid-check makes its figures, and any ratio between two commands, say nothing
    about the code (one H100 of 2026-11-27 halved its clock after minutes of work)."""

    def __init__(self):
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "-i", "0", f"--query-gpu={CLOCK_FIELDS}",
                                          "--format=csv,noheader,nounits", "-lms", "500"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def stop(self):
        """What the samples say (clock_summary), or None without nvidia-smi."""
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return clock_summary(out.splitlines())


def clock_summary(lines):
    """The busy samples' SM clock (median, lowest, the GPU's maximum), hottest temperature and the
    slowdown reasons seen; `slowed` names why the figures are not comparable, or is None."""
    busy = []
    for line in lines:
        f = [x.strip() for x in line.split(",")]
        try:
            util, sm, sm_max, temp = (float(x) for x in f[:4])
            reasons = int(f[5], 16)
        except (ValueError, IndexError):
            continue  # a header, "[N/A]" or a line cut by the stop
        if util >= BUSY:
            busy.append((sm, sm_max, temp, reasons))
    if not busy:
        return {"busy_samples": 0, "slowed": None}
    clocks = sorted(b[0] for b in busy)
    median, top = clocks[len(clocks) // 2], max(b[1] for b in busy)
    seen = sorted({why for b in busy for bit, why in SLOWDOWNS.items() if b[3] & bit})
    # A power cap alone is a full GPU's normal state: it counts only through the clock it costs.
    slowing = [why for why in seen if why != SLOWDOWNS[0x4]]
    slow = [f"slowed by {', '.join(slowing)}"] if slowing else []
    if median < SLOW_CLOCK * top:
        slow.append(f"median SM clock {median:.0f} of {top:.0f} MHz")
    return {"busy_samples": len(busy), "sm_clock_median_mhz": median, "sm_clock_min_mhz": clocks[0],
            "sm_clock_max_mhz": top, "temperature_max_c": max(b[2] for b in busy), "reasons": seen,
            "slowed": "; ".join(slow) or None}


class Battery:
    def __init__(self, args):
        self.dry = args.dry_run
        self.device = "cpu" if self.dry else "cuda"
        self.bin = args.bin
        self.out = args.out
        self.python = os.environ.get("RINGTRAIN_PYTHON", sys.executable)
        self.deadline = time.monotonic() + args.budget
        self.only = set(args.only.split(",")) if args.only else None
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "battery.log", "w", buffering=1)
        self.report = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "dry_run": self.dry,
            "ringtrain": str(self.bin),
            "environment": {},
            "checks": [],
        }

    # ---- running commands ------------------------------------------------------------------
    def say(self, text):
        print(text, flush=True)
        self.log.write(text + "\n")

    def left(self):
        return self.deadline - time.monotonic()

    def run(self, argv, env=None, expect_fail=False):
        """Runs a command within the time left, logs it and its output; its output, or Failed
        when it exits non-zero (with expect_fail: when it exits zero)."""
        argv = [str(a) for a in argv]
        limit = max(1.0, self.left())
        self.say("+ " + " ".join(argv))
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=limit)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            self.log.write(out)
            raise Failed(f"timed out after {limit:.0f} s: {' '.join(argv[:3])} ...")
        self.log.write(p.stdout)
        self.say(f"  (exit {p.returncode}, {time.monotonic() - t0:.1f} s)")
        if expect_fail:
            if p.returncode == 0:
                raise Failed(f"expected a refusal, but it succeeded: {' '.join(argv[:3])} ...")
            return p.stdout
        if p.returncode != 0:
            last = [l for l in p.stdout.strip().splitlines() if l.strip()][-1:] or [""]
            raise Failed(f"exit {p.returncode}: {last[0][:300]}")
        return p.stdout

    def ringtrain(self, *args, **kw):
        return self.run([self.bin, *args], **kw)

    def check(self, name, kind, fn):
        """Runs one check and records it: passed, seconds, what it measured, or why it failed."""
        entry = {"name": name, "kind": kind}
        if self.only and not {name, kind} & self.only:
            # Recorded, so that battery.json names the whole sequence and what was left out.
            entry.update(passed=None, skipped="not named by --only")
        elif self.left() < 5:
            entry.update(passed=None, error="not run: the time budget was spent")
        else:
            self.say(f"\n=== {name}")
            t0 = time.monotonic()
            clocks = GpuClocks() if kind == "speed" and not self.dry else None
            try:
                entry.update(passed=True, details=fn() or {})
            except Failed as e:
                entry.update(passed=False, error=str(e), details=e.details)
            except Exception as e:  # a bug of the battery or an unreadable output: recorded, not fatal
                entry.update(passed=False, error=f"{type(e).__name__}: {e}")
            entry["seconds"] = round(time.monotonic() - t0, 1)
            if clocks is not None and (gpu := clocks.stop()) is not None:
                entry["gpu_clocks"] = gpu
                if gpu["slowed"]:
                    self.say(f"=== {name}: the GPU {gpu['slowed']}: its figures compare with no other")
            self.say(f"=== {name}: {'passed' if entry['passed'] else 'FAILED'} {json.dumps(entry.get('details', {}))}"
                     + (f" {entry['error']}" if entry.get("error") else ""))
        self.report["checks"].append(entry)
        self.save()

    def save(self):
        tmp = self.out / "battery.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=2) + "\n")
        with open(tmp) as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.out / "battery.json")


# ---- reading what ringtrain wrote ----------------------------------------------------------
def metrics(run):
    with open(run / "metrics.csv") as f:
        return [{k: float(v) if v else None for k, v in row.items()} for row in csv.DictReader(f)]


def state(checkpoint):
    return json.loads((checkpoint / "state.json").read_text())


DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    """A safetensors file's tensors in their own dtypes, read without the safetensors package (a
    GPU machine may have torch alone): 8-byte header size, JSON header, data."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    data = memoryview(raw)[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        dtype = DTYPES[v["dtype"]]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=dtype) if b > a else torch.empty(0, dtype=dtype)
        out[k] = t.reshape(v["shape"])
    return out


def weights(run):
    """last/model.safetensors as float64 tensors."""
    return {k: v.double() for k, v in read_safetensors(run / "last" / "model.safetensors").items()}


# The fused kernels' bounds (tests/py/fused_bn_act.py and fused_layer_norm.py hold the interpreted
# kernels to the same): in fp32 within FUSED_FP32 of fp64, relative to the tensor's largest magnitude; in
# fp16/bf16 at most twice as far from fp64 as PyTorch's unfused ops in that dtype, plus a quarter
# of its unit roundoff; the fp32 statistics within FUSED_STATS.
FUSED_FP32 = 2e-5
FUSED_STATS = 1e-5
# A --fused-norm training step against the unfused one (fp32, no TF32), tensor by tensor relative
# to its update, at least (fused_training below scales it by the two layouts' own difference).
FUSED_TRAINING = 1e-3
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def fused_bound(dtype, pytorch_error):
    """How far from fp64 a fused kernel's output may be, given PyTorch's own error in `dtype`."""
    return FUSED_FP32 if dtype == torch.float32 else 2 * pytorch_error + UNIT_ROUNDOFF[dtype] / 4


def unfused_bn_relu(x, res, w, b, rm, rv, dy, momentum=0.1, eps=1e-5):
    """PyTorch's BatchNorm (training), add and ReLU: (y, dx, dw, db, dres); rm, rv updated."""
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    res = res.detach().requires_grad_() if res is not None else None
    y = torch.nn.functional.batch_norm(x, rm, rv, w, b, training=True, momentum=momentum, eps=eps)
    y = torch.relu(y + res if res is not None else y)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad, res.grad if res is not None else None


def eager_layer_norm(x, w, b, dy, eps=1e-6):
    """F.layer_norm over the last dimension as eager PyTorch runs it for x of any dtype: in fp32
    (fp64 for an fp64 x), rounded to x's dtype on the way out, as autocast's casts do around it.
    Returns (y, dx, dw, db)."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    x, w, b = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    y = torch.nn.functional.layer_norm(x.to(compute), (x.shape[-1],), w, b, eps).to(x.dtype)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad


def eager_scale_add(z, stream, gamma, keep, dout):
    """The end of ConvNeXt's block as eager PyTorch runs it: z [N, H, W, C] back to NCHW, times
    the layer scale gamma [C, 1, 1], times stochastic depth's per-sample factor keep [N], plus the
    block's input stream (type promotion as eager's). Returns (out, dz, dgamma, dstream)."""
    z, stream, gamma = (t.detach().clone().requires_grad_(True) for t in (z, stream, gamma))
    out = (gamma * z.permute(0, 3, 1, 2)) * keep.view(-1, 1, 1, 1) + stream
    out.backward(dout)
    return out.detach(), z.grad, gamma.grad, stream.grad


def fused_cases(path, device):
    """Every case `ringtrain fused-check` wrote, recomputed by PyTorch on `device`: returns each
    case's worst relative errors; Failed naming the first tensor past its bound. BatchNorm + ReLU
    cases are numbered ("0.x"), LayerNorm ones "ln0.x", ConvNeXt's scale-add ones "sa0.z"."""
    t = read_safetensors(path)
    found, bad = {}, []
    def rel(a, r):
        if a.shape != r.shape:
            raise Failed(f"{path}: a tensor of shape {list(a.shape)} where PyTorch's is {list(r.shape)}")
        return ((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()

    for i in sorted({k.split(".")[0] for k in t if k.startswith("ln")}, key=lambda s: int(s[2:])):
        g = lambda n: t[f"{i}.{n}"].to(device)  # noqa: E731
        x, dy, w, b = g("x"), g("dy"), g("w"), g("b")
        ref = eager_layer_norm(x.double(), w.double(), b.double(), dy.double())
        twin = eager_layer_norm(x, w, b, dy)
        case = {"shape": list(x.shape), "dtype": str(x.dtype).split(".")[-1]}
        for name, r, tw in zip(("y", "dx", "dw", "db"), ref, twin):
            ef, et = rel(g(name), r), rel(tw, r)
            bound = fused_bound(x.dtype, et)
            case[name] = {"fused": ef, "pytorch": et, "bound": bound}
            if ef > bound or g(name).dtype != tw.dtype:
                bad.append(f"case {i} {case['shape']} {case['dtype']}: {name} {ef:.3g} > {bound:.3g}")
        found[i] = case
    for i in sorted({k.split(".")[0] for k in t if k.startswith("sa")}, key=lambda s: int(s[2:])):
        g = lambda n: t[f"{i}.{n}"].to(device)  # noqa: E731
        z, dout, gamma, keep = g("z"), g("dout"), g("gamma"), g("keep")
        stream = g("stream").contiguous(memory_format=torch.channels_last)
        ref = eager_scale_add(z.double(), stream.double(), gamma.double(), keep.double(), dout.double())
        twin = eager_scale_add(z, stream, gamma, keep, dout)
        case = {"shape": list(z.shape), "dtype": str(z.dtype).split(".")[-1],
                "stream": str(stream.dtype).split(".")[-1]}
        for name, r, tw in zip(("out", "dz", "dgamma"), ref, twin):
            ef, et = rel(g(name), r), rel(tw, r)
            bound = fused_bound(tw.dtype if name == "out" else z.dtype, et)
            case[name] = {"fused": ef, "pytorch": et, "bound": bound}
            if ef > bound or g(name).dtype != tw.dtype:
                bad.append(f"case {i} {case['shape']} {case['dtype']}: {name} {ef:.3g} > {bound:.3g}")
        found[i] = case
    for i in sorted({k.split(".")[0] for k in t if not k.startswith(("ln", "sa"))}, key=int):
        g = lambda n: t[f"{i}.{n}"].to(device) if f"{i}.{n}" in t else None
        cl = lambda v: v.contiguous(memory_format=torch.channels_last) if v is not None else None
        x, res, dy = cl(g("x")), cl(g("res")), cl(g("dy"))
        dtype = x.dtype
        rm64, rv64 = g("rm0").double(), g("rv0").double()
        ref = unfused_bn_relu(x.double(), res.double() if res is not None else None, g("w").double(), g("b").double(),
                              rm64, rv64, dy.double())
        twin = unfused_bn_relu(x, res, g("w"), g("b"), g("rm0").clone(), g("rv0").clone(), dy)
        case = {"shape": list(x.shape), "dtype": str(dtype).split(".")[-1]}
        for name, r, tw in zip(("y", "dx", "dw", "db", "dres"), ref, twin):
            if r is None:
                continue
            ef, et = rel(g(name), r), rel(tw, r)
            bound = fused_bound(dtype, et)
            case[name] = {"fused": ef, "pytorch": et, "bound": bound}
            if ef > bound:
                bad.append(f"case {i} {case['shape']} {case['dtype']}: {name} {ef:.3g} > {bound:.3g}")
        for name, r in (("rm", rm64), ("rv", rv64)):
            e = rel(g(name), r)
            case[name] = {"fused": e, "bound": FUSED_STATS}
            if e > FUSED_STATS:
                bad.append(f"case {i}: running statistic {name} {e:.3g} > {FUSED_STATS}")
        found[i] = case
    if not found:
        raise Failed(f"{path} holds no cases")
    if bad:
        raise Failed("; ".join(bad), **found)
    return found


def rel_diff(a, b, reference, init):
    """Largest difference between two runs' weights, relative to the largest change the
    reference run made to a parameter (tests/common's rel_diff)."""
    is_param = lambda k: "running_" not in k and not k.endswith("num_batches_tracked")
    update = max((reference[k] - init[k]).abs().max().item() for k in reference if is_param(k))
    diff = max((a[k] - b[k]).abs().max().item() for k in a if not k.endswith("num_batches_tracked"))
    return diff / update


def per_tensor(a, b, reference, init):
    """Run a against run b tensor by tensor (tests/common's rel_diff_per_tensor): each parameter
    relative to the change the reference run made to it, each running statistic relative to its
    own size. Parameters whose update is below 1e-3 of the largest (a zero gradient in exact
    arithmetic, such as a bias before a BatchNorm) are set apart and compared with the largest
    update. Returns the worst ratio, its tensor, and the set-apart tensors' worst."""
    is_stat = lambda k: "running_" in k
    updates = {k: (reference[k] - init[k]).abs().max().item() for k in reference
               if not is_stat(k) and not k.endswith("num_batches_tracked")}
    largest = max(updates.values())
    found = {"worst": 0.0, "tensor": None, "zero_grad_worst": 0.0}
    for k in reference:
        if k.endswith("num_batches_tracked"):
            continue
        d = (a[k] - b[k]).abs().max().item()
        if is_stat(k):
            r = d / max(reference[k].abs().max().item(), 1e-30)
        elif updates[k] < 1e-3 * largest:
            found["zero_grad_worst"] = max(found["zero_grad_worst"], d / largest)
            continue
        else:
            r = d / updates[k]
        if r >= found["worst"]:
            found.update(worst=r, tensor=k)
    return found


def subset(src, dst, classes, per_class):
    """The first `per_class` images of the first `classes` classes of an ImageFolder tree."""
    if dst.exists():
        shutil.rmtree(dst)
    for c in sorted(p for p in src.iterdir() if p.is_dir())[:classes]:
        (dst / c.name).mkdir(parents=True)
        for f in sorted(c.iterdir())[:per_class]:
            shutil.copy(f, dst / c.name / f.name)
    return dst


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rate(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def bench_figures(text, vs_pytorch, memory):
    """The figures `ringtrain bench`/`bench-data` print: images/s, peak memory (on CUDA), the
    ratio; Failed when one that should be there is not."""
    mem = lambda who: rate(who + r":\s+[\d.]+ img/s, peak memory ([\d.]+) GiB", text)
    found = {"ringtrain_images_per_s": rate(r"ringtrain:\s+([\d.]+) img/s", text),
             "pytorch_images_per_s": rate(r"pytorch:\s+([\d.]+) img/s", text),
             "ratio": rate(r"ratio ringtrain / pytorch: ([\d.]+)", text),
             "ringtrain_again_images_per_s": rate(r"ringtrain again:\s+([\d.]+) img/s", text),
             "ringtrain_peak_gib": mem("ringtrain"), "pytorch_peak_gib": mem("pytorch")}
    expected = ["ringtrain_images_per_s"] + (["pytorch_images_per_s", "ratio"] if vs_pytorch else [])
    expected += [k.replace("images_per_s", "peak_gib") for k in expected[:2]] if memory else []
    missing = [k for k in expected if found[k] is None]
    if missing:
        raise Failed(f"no {', '.join(missing)} in the output", **found)
    return found


# ---- the checks ------------------------------------------------------------------------------
def main():
    args = parse_args()
    b = Battery(args)
    dry, dev = b.dry, b.device
    # The CPU has no fp16 autocast: a dry run runs bf16 where the checks say fp16.
    amp_of = lambda name: "bf16" if dry and name == "fp16" else name
    out = b.out

    def environment():
        version = b.ringtrain("--version")
        env = {"ringtrain_version": version.strip().splitlines(),
               "torch": torch.__version__, "torch_cuda": torch.version.cuda,
               "cuda_available": torch.cuda.is_available()}
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpus"] = torch.cuda.device_count()
        try:
            import torchvision
            env["torchvision"] = torchvision.__version__
        except ImportError:
            env["torchvision"] = None
        b.report["environment"] = env
        if not dry and ("CUDA not available" in version or "device(s) visible" not in version):
            raise Failed("ringtrain finds no CUDA device", **env)
        return env

    b.check("environment", "correctness", environment)

    def doctor():
        # ringtrain doctor's CUDA lines against torch's own answers (on the CPU: recorded only).
        text = b.ringtrain("doctor", "--out", out)
        lines = text.strip().splitlines()
        found = {"lines": lines}
        if dry or not torch.cuda.is_available():
            return found
        want = [f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"]
        cudnn = torch.backends.cudnn.version()  # 91900 for 9.19.0
        want.append(f"cuDNN {cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}")
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            want.append(f"GPU {i}: {torch.cuda.get_device_name(i)}, ")
            want.append(f"compute capability {major}.{minor}")
        n = torch.cuda.device_count()
        no_peer = [f"{a}-{b}" for a in range(n) for b in range(a + 1, n)
                   if not (torch.cuda.can_device_access_peer(a, b) and torch.cuda.can_device_access_peer(b, a))]
        if n > 1:
            want.append(f"no peer access between GPUs {', '.join(no_peer)}" if no_peer
                        else f"peer access between all {n} GPUs")
        missing = [w for w in want if w not in text]
        if missing:
            raise Failed(f"ringtrain doctor lacks {missing}", lines=lines)
        return found

    b.check("doctor", "correctness", doctor)

    demo = out / "demo"

    def demo_run():
        b.ringtrain("demo", "--out", demo, "--device", dev, *(["--epochs", "1"] if dry else []))
        best = max(r["val_top1"] for r in metrics(demo))
        if not dry and best < 0.9:
            raise Failed(f"demo reached {best:.3f} validation top-1 (the CPU reaches about 0.92)", val_top1=best)
        return {"val_top1": best, "epochs": len(metrics(demo))}

    b.check("demo", "correctness", demo_run)

    # Small sets cut from the demo's images (the shapes of the CPU tests: 36 px), made when a
    # check first needs them; a run of --only some checks reuses the demo data of an earlier run.
    def shapes(name, classes, n, split="train"):
        if not (out / "sets" / name).is_dir():
            if not (demo / "data" / split).is_dir():
                raise Failed(f"no demo data in {demo / 'data'}: the demo check makes it")
            subset(demo / "data" / split, out / "sets" / name, classes, n)
        return out / "sets" / name

    def data():
        """The (train, test) folders of the one-epoch runs, eval/predict and the input pipeline."""
        if dry:
            return shapes("tiny-train", 3, 8), shapes("tiny-val", 3, 4, "val")
        root = args.data or demo / "data"
        test = next((root / s for s in ("test", "val") if (root / s).is_dir()), None)
        if not (root / "train").is_dir() or test is None:
            raise Failed(f"{root} has no train/ with test/ or val/ beside it")
        return root / "train", test

    def seedlings(name):
        run, amp = out / f"one-epoch-{name}", amp_of(name)
        (train, test), (size, batch) = data(), ((32, 8) if dry else (128, 64))
        b.ringtrain("train", "--data", train, "--val", test, "--out", run, "--overwrite",
                    "--model", "resnet18", "--img-size", size, "--epochs", 1, "--batch-size", batch,
                    "--amp", amp, "--channels-last", "--device", dev, "--seed", 1, "--log-every", 0)
        m = metrics(run)[-1]
        if not math.isfinite(m["train_loss"]):
            raise Failed("the training loss is not finite", **m)
        return {k: m[k] for k in ("train_loss", "val_top1", "images_per_s", "skipped_steps")}

    b.check("one_epoch_fp16", "correctness", lambda: seedlings("fp16"))
    b.check("one_epoch_bf16", "correctness", lambda: seedlings("bf16"))

    def eval_predict():
        ckpt, (_, data_test), found = out / "one-epoch-bf16" / "last", data(), {}
        for d in (dev, "cpu"):
            b.ringtrain("eval", "--checkpoint", ckpt, "--data", data_test, "--device", d, "--out", out / f"eval-{d}")
            report = json.loads((out / f"eval-{d}" / "metrics.json").read_text())["classification_report"]
            found[f"eval_top1_{d}"] = report["accuracy"]
            b.ringtrain("predict", "--checkpoint", ckpt, "--device", d, "--out", out / f"predict-{d}.csv", data_test)
        rows = {d: {r["path"]: r for r in csv.DictReader(open(out / f"predict-{d}.csv"))} for d in (dev, "cpu")}
        paths = rows["cpu"].keys()
        same = sum(rows[dev][p]["predicted"] == rows["cpu"][p]["predicted"] for p in paths) / len(paths)
        prob = max(abs(float(rows[dev][p]["probability"]) - float(rows["cpu"][p]["probability"])) for p in paths)
        found.update(images=len(paths), same_top1=same, max_probability_difference=prob)
        if same < AGREEMENT:
            raise Failed(f"{dev} and CPU agree on the top-1 class of {same:.2%} of the images", **found)
        return found

    b.check("eval_predict_vs_cpu", "correctness", eval_predict)

    # The CPU test's set (3 classes x 16: the dist bounds hold for it), and a longer one (8 x 64).
    short_set, long_set = (3, 16), (8, 64)
    long_steps = long_set[0] * long_set[1] // 32  # an epoch of the longer set at batch 32

    def small(run, model, *extra, epochs=2, batch=16, lr="0.05", long=False, log_every=0):
        classes, n = long_set if long else short_set
        train, val = shapes(f"train-{classes}x{n}", classes, n), shapes(f"val-{classes}x4", classes, 4, "val")
        return ["train", "--data", train, "--val", val, "--out", run, "--overwrite", "--model", model,
                "--img-size", 32, "--epochs", epochs, "--batch-size", batch, "--lr", lr, "--sched", "constant",
                "--device", dev, "--seed", 1, "--workers", 1, "--log-every", log_every, *extra]

    world_of_one = lambda: {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}

    def nccl_world_1():
        # What the built-in launcher gives each worker: the rendezvous, the NCCL group, SyncBN.
        text = b.ringtrain(*small(out / "world1", "resnet10-tiny", "--sync-bn", epochs=1), env=world_of_one())
        backend = "Gloo" if dry else "Nccl"
        if not ("distributed: 1 ranks" in text and backend in text and "SyncBatchNorm" in text):
            raise Failed(f"no {backend} group of 1 rank with SyncBatchNorm in the banner")
        return {"backend": backend, "val_top1": metrics(out / "world1")[-1]["val_top1"]}

    b.check("nccl_world_size_1", "correctness", nccl_world_1)

    two_ranks = ["--nproc-per-node", 2, "--devices", "0,0", "--dist-backend", "gloo"]

    # Each precision's own noise: a different split of the same 16 images (1 x 8, two
    # micro-batches accumulated) against 1 x 16. Two ranks x 8 must stay within a few times of
    # it; a DDP fault (a bucket not averaged, a rank's gradient lost) is orders of magnitude past.
    TWIN_FACTOR = 3.0
    # fp32 with TF32 off in cuDNN and cuBLAS (libtorch lets cuDNN use TF32 by default, whose
    # 10-bit products differ with the batch's split as fp16's do); a no-op on the CPU.
    fp32 = {"NVIDIA_TF32_OVERRIDE": "0"}

    def lenet_two_ranks():
        found = {}
        for precision, amp, env in (("fp32", "off", fp32), ("fp16", amp_of("fp16"), {})):
            run = lambda name, *extra, **kw: b.ringtrain(*small(out / f"lenet-{precision}-{name}", "lenet5", "--amp", amp,
                                                                 "--deterministic", "true", *extra, **kw), env=env)
            run("init", "--momentum", 0, epochs=1, batch=48, lr="1e-30")
            run("single")
            run("accum", "--accum-steps", 2, batch=8)
            text = run("dual", *two_ranks)
            w = {n: weights(out / f"lenet-{precision}-{n}") for n in ("init", "single", "accum", "dual")}
            rel = lambda a: rel_diff(w[a], w["single"], w["single"], w["init"])
            banner = next((l for l in text.splitlines() if "ringtrain: lenet5" in l), "")
            bound = max(LENET_SAME, TWIN_FACTOR * rel("accum"))
            found[precision] = {"dual_vs_single": rel("dual"), "accum_vs_single": rel("accum"), "bound": bound,
                                "banner": banner.split(" on ", 1)[-1]}
        bad = [p for p, f in found.items() if f["dual_vs_single"] > f["bound"]]
        if bad:
            raise Failed(f"2 ranks x 8 and 1 x 16 differ by more than {TWIN_FACTOR:g}x the difference of "
                         f"1 x 8 x 2 accumulated and 1 x 16 ({', '.join(bad)})", **found)
        return found

    b.check("two_ranks_one_gpu_gloo", "correctness", lenet_two_ranks)

    def sync_bn_two_ranks():
        # One step on 48 images (2 x 24 against 1 x 48), no momentum, large lr: the SyncBN
        # gradient itself; channels_last as on CUDA by default.
        # fp32 without TF32, as the CPU test (fp16's own noise is larger than this bound).
        one = lambda name, *extra, lr="0.5": small(out / f"bn-{name}", "resnet10-tiny", "--momentum", 0, "--amp", "off",
                                                    "--channels-last", *extra, epochs=1, batch=48, lr=lr)
        b.ringtrain(*one("init", lr="1e-30"), env=fp32)
        b.ringtrain(*one("single"), env=fp32)
        text = b.ringtrain(*one("sync", *two_ranks, "--sync-bn"), env=fp32)
        b.ringtrain(*one("nosync", *two_ranks), env=fp32)
        if "SyncBatchNorm" not in text:
            raise Failed("the 2-rank run did not say SyncBatchNorm")
        w = {n: weights(out / f"bn-{n}") for n in ("init", "single", "sync", "nosync")}
        rel = lambda other: rel_diff(w["sync"], other, w["single"], w["init"])
        found = {"sync_vs_single": rel(w["single"]), "bound": SYNC_BN_SAME,
                 "per_rank_bn_vs_sync": rel(w["nosync"]), "must_exceed": PER_RANK_BN_DIFFERENT}
        if found["sync_vs_single"] > SYNC_BN_SAME or found["per_rank_bn_vs_sync"] < PER_RANK_BN_DIFFERENT:
            raise Failed("SyncBatchNorm over 2 ranks is not one process's BatchNorm", **found)
        return found

    b.check("two_ranks_one_gpu_sync_bn", "correctness", sync_bn_two_ranks)

    def fp16_overflow():
        run = out / "overflow"
        b.ringtrain(*small(run, "resnet10-tiny", "--amp", amp_of("fp16"), "--init-loss-scale", OVERFLOW_SCALE,
                           epochs=1, batch=32, lr="0.01", long=True))
        m = metrics(run)[-1]
        scaler = state(run / "last").get("scaler") or {}
        steps = long_steps
        found = {"skipped_steps": m["skipped_steps"], "steps": steps, "scale_after": scaler.get("scale"),
                 "initial_scale": OVERFLOW_SCALE, "train_loss": m["train_loss"]}
        if dry:
            return found  # bf16 has no scaler: the command line and the readers are what is checked
        if not (1 <= m["skipped_steps"] < steps and scaler.get("scale", OVERFLOW_SCALE) < OVERFLOW_SCALE
                and math.isfinite(m["train_loss"])):
            raise Failed("an overflowing fp16 scale was not skipped and backed off", **found)
        return found

    b.check("fp16_overflow_backs_off", "correctness", fp16_overflow)

    def sigterm_resume():
        found = {}
        for deterministic in (True, False):
            tag = "deterministic" if deterministic else "default"
            cmd = lambda run: [str(b.bin), *map(str, small(run, "resnet10-tiny", "--deterministic", str(deterministic).lower(),
                                                      long=True, log_every=1))]
            straight, term = out / f"resume-{tag}-straight", out / f"resume-{tag}-term"
            b.run(cmd(straight))
            b.say("+ " + " ".join(cmd(term)) + "   (SIGTERM at epoch 2, step 3)")
            p = subprocess.Popen(cmd(term), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            sent = False
            for line in p.stdout:
                b.log.write(line)
                if not sent and "epoch 2/2 step 3/" in line:
                    p.send_signal(signal.SIGTERM)
                    sent = True
            rc = p.wait()
            if rc != 143:
                raise Failed(f"SIGTERM mid-epoch: exit {rc}, expected 143 (sent: {sent})")
            mid = state(term / "last").get("mid_epoch")
            b.run(cmd(term) + ["--resume", "auto"])
            same = {f: (straight / "last" / f).read_bytes() == (term / "last" / f).read_bytes()
                    for f in ("model.safetensors", "optimizer.safetensors")}
            found[tag] = {"saved_at_step_of_epoch_2": (mid or {}).get("steps"), "bit_identical": all(same.values())}
            if not all(same.values()):
                a, s = weights(term), weights(straight)
                found[tag]["max_abs_difference"] = max((a[k] - s[k]).abs().max().item() for k in a)
        return found

    b.check("sigterm_then_resume", "correctness", sigterm_resume)

    def train_cuda_graphs(fused=False):
        # A training run whose steps after the 3 eager ones replay one captured CUDA graph,
        # against the same run eager: fp32 without TF32, deterministic kernels, so both run the
        # same kernels on the same data (the CPU test of the captured step finds them bit-identical).
        # With `fused`, both sides run the fused BatchNorm kernels (channels_last), which the graph
        # must then capture: they may not fall back. A dry run checks the refusal on the CPU.
        extra = ["--channels-last", "--fused-norm"] if fused else []
        tag = "-fused" if fused else ""
        run = lambda name, *more, **kw: small(out / f"graphs{tag}-{name}", "resnet10-tiny", "--amp", "off",
                                              "--deterministic", "true", *extra, *more, epochs=1, batch=32, long=True,
                                              **kw)
        if dry:
            text = b.ringtrain(*run("graphed", "--cuda-graphs"), expect_fail=True)
            if "--cuda-graphs needs a CUDA device" not in text:
                raise Failed(f"--cuda-graphs on the CPU: {text.strip()[-200:]}")
            return {"refused_on_cpu": True}
        b.ringtrain(*run("init", "--momentum", 0, lr="1e-30"), env=fp32)
        texts = [b.ringtrain(*run("eager"), env=fp32), b.ringtrain(*run("graphed", "--cuda-graphs"), env=fp32)]
        w = {n: weights(out / f"graphs{tag}-{n}") for n in ("init", "eager", "graphed")}
        found = {"graphed_vs_eager": rel_diff(w["graphed"], w["eager"], w["eager"], w["init"]), "bound": LENET_SAME,
                 "bit_identical": all(torch.equal(w["graphed"][k], w["eager"][k]) for k in w["eager"]),
                 "steps": long_steps,
                 "fell_back": [l for t in texts for l in t.splitlines() if l.startswith("--fused-norm:")]}
        if found["graphed_vs_eager"] > LENET_SAME or found["fell_back"]:
            raise Failed("the CUDA-graph run is not the eager run, or the fused kernels fell back", **found)
        return found

    b.check("train_cuda_graphs", "correctness", train_cuda_graphs)
    b.check("train_cuda_graphs_fused_norm", "correctness", lambda: train_cuda_graphs(fused=True))

    def fused_numerics():
        # The compiled fused BatchNorm (+ add) + ReLU kernels on this GPU, forward and backward,
        # against PyTorch on the same GPU (fp64, and its own unfused ops in the same dtype), to
        # the bounds the interpreter test holds the same kernels to on the CPU. A dry run checks
        # the refusal on the CPU.
        path = out / "fused-check.safetensors"
        if dry:
            text = b.ringtrain("fused-check", "--out", path, "--device", dev, expect_fail=True)
            if "run on CUDA GPUs" not in text:
                raise Failed(f"fused-check on the CPU: {text.strip()[-200:]}")
            return {"refused_on_cpu": True}
        b.ringtrain("fused-check", "--out", path, "--device", dev)
        return fused_cases(path, dev)

    b.check("fused_norm_numerics", "correctness", fused_numerics)

    def fused_training(model):
        # One training step with --fused-norm against the same step without: 48 images, no
        # momentum, a large lr (the SyncBN check's step, whose update is the gradient itself), fp32
        # without TF32, deterministic kernels, channels_last. The fused kernels must run (no
        # "--fused-norm:" line saying they fell back) and step as the unfused ops do up to
        # rounding, which the fused arithmetic orders otherwise. Tensor by tensor (per_tensor);
        # the scale of rounding: the unfused step in the NCHW layout (other kernels, the same
        # math) against channels_last. The fused step may differ by 3x that, or by FUSED_TRAINING,
        # whichever is larger; a wrong gradient is orders of magnitude past both. (A 16-step run,
        # the first on an H100, measured the chaos of training more than the kernels: its largest
        # differences were running variances, 0.5 of the largest update between the layouts alone.)
        # A dry run checks the fallback's line and that it changes nothing. ConvNeXt without
        # stochastic depth, so that the step's only randomness is the data's.
        no_drop = ["--drop-path", 0] if model.startswith("convnext") else []
        def one(name, *extra, lr="0.5"):
            return small(out / f"fused-{model}-{name}", model, "--momentum", 0, "--amp", "off", "--deterministic",
                         "true", *no_drop, *extra, epochs=1, batch=48, lr=lr)
        b.ringtrain(*one("init", "--channels-last", lr="1e-30"), env=fp32)
        b.ringtrain(*one("unfused", "--channels-last", "--fused-norm", "false"), env=fp32)
        b.ringtrain(*one("unfused-nchw", "--channels-last", "false", "--fused-norm", "false"), env=fp32)
        text = b.ringtrain(*one("fused", "--channels-last", "--fused-norm"), env=fp32)
        fell_back = [l for l in text.splitlines() if l.startswith("--fused-norm:")]
        w = {n: weights(out / f"fused-{model}-{n}") for n in ("init", "unfused", "unfused-nchw", "fused")}
        fused, nchw = (per_tensor(w[n], w["unfused"], w["unfused"], w["init"]) for n in ("fused", "unfused-nchw"))
        found = {"fused_vs_unfused": fused["worst"], "nchw_vs_channels_last": nchw["worst"],
                 "bound": max(FUSED_TRAINING, TWIN_FACTOR * nchw["worst"]), "fell_back": fell_back,
                 "fused": fused, "nchw": nchw}
        zero_grad_bound = max(FUSED_TRAINING, TWIN_FACTOR * nchw["zero_grad_worst"])
        if dry:
            if not fell_back or fused["worst"] != 0 or fused["zero_grad_worst"] != 0:
                raise Failed("--fused-norm on the CPU did not fall back to the very same run", **found)
            return found
        if fell_back or fused["worst"] > found["bound"] or fused["zero_grad_worst"] > zero_grad_bound:
            raise Failed("--fused-norm did not run its kernels, or stepped otherwise", **found)
        return found

    b.check("fused_norm_training", "correctness", lambda: fused_training("resnet10-tiny"))
    b.check("fused_norm_training_convnext", "correctness", lambda: fused_training("convnext_tiny"))

    def host_syncs():
        # RINGTRAIN_CUDA_SYNC_DEBUG=warn: libtorch warns of each host synchronisation inside the
        # training loop's body from epoch 2 on, and in bench's timed steps. The goal is none in a
        # step (fp16: the loss scaler decides on the device). --log-every 1 reads the loss every
        # step: the control that the warnings appear at all.
        env = {"RINGTRAIN_CUDA_SYNC_DEBUG": "warn"}
        count = lambda text: text.count("called a synchronizing CUDA operation")
        run = lambda name, every: b.ringtrain(*small(out / f"syncs-{name}", "resnet10-tiny", "--amp", amp_of("fp16"),
                                                     batch=32, long=True, log_every=every), env=env)
        found = {"train_steps": long_steps, "train_syncs": count(run("quiet", 0)),
                 "control_syncs_with_log_every_1": count(run("control", 1))}
        steps = 2 if dry else 20
        text = b.ringtrain("bench", "--model", "resnet18-cifar", "--batch-size", 8 if dry else 512, "--img-size", 32,
                           "--device", dev, "--steps", steps, "--warmup", 1 if dry else 10, "--amp", amp_of("fp16"),
                           env=env)
        found.update(bench_steps=steps, bench_syncs=count(text))
        if not dry and found["control_syncs_with_log_every_1"] < long_steps:
            raise Failed("no warning for the loss read every step: the counts mean nothing", **found)
        return found

    b.check("host_syncs_per_step", "speed", host_syncs)

    # ---- speed ----------------------------------------------------------------------------------
    steps = [("resnet50", 256, 224, 50, 15), ("resnet18-cifar", 512, 32, 200, 30)]
    if dry:
        steps = [("resnet50", 2, 32, 2, 1), ("resnet18-cifar", 4, 32, 2, 1)]
    for model, batch, img, n, warm in steps:
        common = ["bench", "--model", model, "--batch-size", batch, "--img-size", img, "--device", dev,
                  "--steps", n, "--warmup", warm]
        for amp in ("bf16", "fp16"):
            b.check(f"step_{model}_{amp}", "speed", lambda amp=amp, common=common: bench_figures(b.ringtrain(
                *common, "--amp", amp_of(amp), "--channels-last", "true", "--fused-norm", "false", "--vs-pytorch",
                "--python", b.python),
                vs_pytorch=True, memory=not dry))
        b.check(f"step_{model}_ringtrain_defaults", "speed",
                lambda common=common: bench_figures(b.ringtrain(*common), vs_pytorch=False, memory=not dry))
        for amp in ("bf16", "fp16") if model == "resnet50" else ("bf16",):
            def compiled(model=model, batch=batch, img=img, amp=amp, n=n, warm=warm):
                # torch.compile of the same step; in a dry run compile is disabled (no inductor
                # build on the CPU), which still runs the script's path.
                env = {"TORCH_STEP_COMPILE": "1", **({"TORCH_COMPILE_DISABLE": "1"} if dry else {})}
                text = b.run([b.python, HERE / "torch_step.py", model, batch, img, amp_of(amp), 1, dev, n, warm,
                              min(10, n)], env=env)
                return json.loads(text.strip().splitlines()[-1])
            b.check(f"step_{model}_{amp}_torch_compile", "speed", compiled)
        if model == "resnet18-cifar":
            # The step as one CUDA graph against eager PyTorch (same run) and torch.compile's
            # CUDA-graph mode. A dry run on the CPU checks the flag is refused there, clearly.
            def graphed(common=common, fused="false"):
                args = [*common, "--amp", "bf16", "--channels-last", "true", "--cuda-graphs", "--fused-norm", fused]
                if dry:
                    text = b.run([str(b.bin), *map(str, args)], expect_fail=True)
                    if "--cuda-graphs needs a CUDA device" not in text:
                        raise Failed(f"--cuda-graphs on the CPU: {text.strip()[-200:]}")
                    return {"refused_on_cpu": True}
                return bench_figures(b.ringtrain(*args, "--vs-pytorch", "--python", b.python),
                                     vs_pytorch=True, memory=True)
            b.check(f"step_{model}_bf16_cuda_graphs", "speed", graphed)
            b.check(f"step_{model}_bf16_cuda_graphs_fused_norm", "speed", lambda: graphed(fused="true"))

            def reduce_overhead(model=model, batch=batch, img=img, n=n, warm=warm):
                env = {"TORCH_STEP_COMPILE": "1", "TORCH_STEP_COMPILE_MODE": "reduce-overhead",
                       **({"TORCH_COMPILE_DISABLE": "1"} if dry else {})}
                text = b.run([b.python, HERE / "torch_step.py", model, batch, img, "bf16", 1, dev, n, warm,
                              min(10, n)], env=env)
                return json.loads(text.strip().splitlines()[-1])
            b.check(f"step_{model}_bf16_torch_compile_reduce_overhead", "speed", reduce_overhead)

    def end_to_end():
        batch, img = (8, 32) if dry else (256, 224)
        text = b.ringtrain("bench-data", "--data", data()[0], "--model", "resnet18" if dry else "resnet50",
                           "--amp", "bf16", "--device", dev, "--batch-size", batch, "--img-size", img,
                           *(["--workers", 1, "--epochs", 1] if dry else []), "--vs-pytorch", "--python", b.python)
        return bench_figures(text, vs_pytorch=True, memory=False)

    b.check("end_to_end_resnet50_bf16", "speed", end_to_end)

    # Decode once (ringtrain pack, --data-on-device): the same end to end from a raw pack, and
    # with the whole set on the GPU, beside PyTorch's DataLoader on the pack's folder.
    def packed(store):
        out = b.out / f"train-{store}.pack"
        if not out.exists():
            b.ringtrain("pack", "--data", data()[0], "--out", out, "--store", store)
        return out

    for model, img, batch in [("resnet50", 224, 256), ("resnet18-cifar", 32, 512)]:
        for how, flags in [("raw_pack", []), ("on_device", ["--data-on-device"])]:
            def decode_once(model=model, img=img, batch=batch, flags=flags):
                b_, i_ = (8, 32) if dry else (batch, img)
                text = b.ringtrain("bench-data", "--data", packed("raw"), "--model", "resnet18" if dry else model,
                                   "--amp", "bf16", "--device", dev, "--batch-size", b_, "--img-size", i_, *flags,
                                   *(["--workers", 1, "--epochs", 1] if dry else []), "--vs-pytorch", "--python", b.python)
                return bench_figures(text, vs_pytorch=True, memory=False)
            b.check(f"end_to_end_{model}_bf16_{how}", "speed", decode_once)

    # The newer families: ConvNeXt-T and ViT-B/16 at 224 px, bf16, channels_last, unfused,
    # against eager PyTorch in the same run (dry: 32 px, batch 2).
    for model in ("convnext_tiny", "vit_b_16"):
        batch, img, n, warm = (2, 32, 2, 1) if dry else (128, 224, 40, 10)
        args = ["bench", "--model", model, "--batch-size", batch, "--img-size", img, "--device", dev,
                "--steps", n, "--warmup", warm, "--amp", amp_of("bf16"), "--channels-last", "true",
                "--fused-norm", "false"]
        b.check(f"step_{model}_bf16", "speed", lambda args=args: bench_figures(
            b.ringtrain(*args, "--vs-pytorch", "--python", b.python), vs_pytorch=True, memory=not dry))

    # --fused-norm's step against eager PyTorch (same run): ResNet-50 and ConvNeXt-T (its
    # LayerNorm and block ends) in both precisions.
    def fused_step(amp, model="resnet50", size=(256, 224, 50, 15)):
        batch, img, n, warm = (2, 32, 2, 1) if dry else size
        text = b.ringtrain("bench", "--model", model, "--batch-size", batch, "--img-size", img, "--device", dev,
                           "--steps", n, "--warmup", warm, "--amp", amp_of(amp), "--channels-last", "true",
                           "--fused-norm", "--vs-pytorch", "--python", b.python)
        found = bench_figures(text, vs_pytorch=True, memory=not dry)
        found["fell_back"] = [l for l in text.splitlines() if l.startswith("--fused-norm:")]
        if found["fell_back"] and not dry:
            raise Failed("--fused-norm fell back to the unfused ops", **found)
        return found

    for amp in ("bf16", "fp16"):
        b.check(f"step_resnet50_{amp}_fused_norm", "speed", lambda amp=amp: fused_step(amp))
    for amp in ("bf16", "fp16"):
        b.check(f"step_convnext_tiny_{amp}_fused_norm", "speed",
                lambda amp=amp: fused_step(amp, "convnext_tiny", (128, 224, 40, 10)))

    # Where the time goes: ringtrain, eager PyTorch and torch.compile profiled over the same
    # steps (5 after the timed ones), the three traces in one table by kernel class.
    def profiled(model, batch, img, extra=(), tag="", compiled=True):
        d = out / f"profile-{model}-bf16{tag}"
        # Dry: ResNet-18-cifar for every profile (ConvNeXt's depthwise convolutions in bf16 make
        # the CPU's trace some 380,000 operators a step, mostly narrow and slice: one per group).
        (model, batch, img, n, warm), k = (("resnet18-cifar", 2, 32, 2, 1), 2) if dry else ((model, batch, img, 20, 10), 5)
        text = b.ringtrain("bench", "--model", model, "--batch-size", batch, "--img-size", img, "--device", dev,
                           "--steps", n, "--warmup", warm, "--amp", "bf16", "--channels-last", "true", *extra,
                           "--profile", d, "--profile-steps", k, "--vs-pytorch", "--python", b.python)
        traces, labels = [d / "trace.json", d / "pytorch" / "trace.json"], ["ringtrain", "eager"]
        if compiled:
            env = {"TORCH_STEP_COMPILE": "1", "TORCH_STEP_PROFILE": str(d / "compile"),
                   "TORCH_STEP_PROFILE_STEPS": str(k), **({"TORCH_COMPILE_DISABLE": "1"} if dry else {})}
            b.run([b.python, HERE / "torch_step.py", model, batch, img, "bf16", 1, dev, n, warm, min(10, n)], env=env)
            traces.append(d / "compile" / "trace.json")
            labels.append("compile")
        table = b.ringtrain("trace-table", *traces, "--labels", ",".join(labels), "--csv", d / "table.csv")
        return {**bench_figures(text, vs_pytorch=True, memory=not dry), "table": table.strip().splitlines()}

    b.check("profile_resnet50_bf16", "speed", lambda: profiled("resnet50", 256, 224, ["--fused-norm", "false"]))
    b.check("profile_resnet50_bf16_fused_norm", "speed",
            lambda: profiled("resnet50", 256, 224, ["--fused-norm"], "-fused", compiled=False))
    b.check("profile_convnext_tiny_bf16", "speed",
            lambda: profiled("convnext_tiny", 128, 224, ["--fused-norm", "false"]))
    b.check("profile_convnext_tiny_bf16_fused_norm", "speed",
            lambda: profiled("convnext_tiny", 128, 224, ["--fused-norm"], "-fused", compiled=False))

    def fused_tiles():
        # The fused BatchNorm kernels' tiles timed at ResNet-50's shapes (bench/fused_tiles.py):
        # per kernel, ms per step in the build's tile and in the best tile tried. Dry: the same
        # path under Triton's interpreter, untimed.
        text = b.run([b.python, HERE / "fused_tiles.py", *(["--dry"] if dry else []),
                      "--out", out / "fused-tiles.json"])
        return json.loads(text.strip().splitlines()[-1])

    b.check("fused_tiles", "speed", fused_tiles)

    shared = HERE / "shared" / "bench_loader.py"
    if shared.is_file() and not dry:
        def shared_loader():
            text = b.run([b.python, shared, data()[0], 16])
            return {m.group(1) + ("_train" if m.group(2) == "True" else "_alone"): float(m.group(3))
                    for m in re.finditer(r"workers=(\d+) train=(\w+): ([\d.]+) img/s", text)}
        b.check("shared_bench_loader", "speed", shared_loader)
    return finish(b)


def finish(b):
    failed = [c["name"] for c in b.report["checks"]
              if c["kind"] == "correctness" and c["passed"] is not True and not c.get("skipped")]
    run = sum(1 for c in b.report["checks"] if not c.get("skipped"))
    slowed = [c["name"] for c in b.report["checks"] if (c.get("gpu_clocks") or {}).get("slowed")]
    b.report["correctness_failed"] = failed
    b.report["speed_on_a_slowed_gpu"] = slowed
    b.report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    b.save()
    b.say(f"\n{run} of {len(b.report['checks'])} checks run; "
          f"correctness failed: {', '.join(failed) or 'none'}; "
          + (f"speed measured on a slowed GPU: {', '.join(slowed)}; " if slowed else "")
          + f"{b.out / 'battery.json'}")
    return 1 if failed else 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", type=Path, default=default_binary())
    p.add_argument("--data", type=Path)
    p.add_argument("--out", type=Path, default=Path("runs/gpu-battery"))
    p.add_argument("--only", help="run only these checks (comma-separated names as in battery.json, or "
                                  "'correctness' or 'speed')")
    p.add_argument("--budget", type=float, default=570, help="seconds for the whole battery")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    if a.data is not None and not a.data.is_dir():
        p.error(f"--data {a.data}: no such folder")
    a.bin = a.bin.resolve()
    a.out = a.out.resolve()
    return a


def default_binary():
    bundled = HERE.parent / "ringtrain"  # bench/ inside a bundle, beside its launcher
    if (HERE.parent / "BUILD").is_file():
        return bundled
    # bench/ inside the installed wheel's package (PREFIX/lib/pythonX.Y/site-packages/ringtrain):
    # the command pip installed with it, in PREFIX/bin.
    if (HERE.parent / "__main__.py").is_file():
        command = HERE.parent.parents[3] / "bin" / "ringtrain"
        return command if command.is_file() else Path(shutil.which("ringtrain") or "ringtrain")
    target = Path(os.environ.get("CARGO_TARGET_DIR", HERE.parent / "target"))
    return target / "release" / "ringtrain"


if __name__ == "__main__":
    sys.exit(main())
