"""torchvision's reference train.py, distributed on CPUs, without changing the script.

train.py takes its RASampler (--ra-sampler) only when it runs distributed, and its distributed
mode is written for GPUs: `utils.init_distributed_mode` calls torch.cuda.set_device and asks for
NCCL, `reduce_across_processes` puts its tensor on "cuda", and train.py wraps the model with
`DistributedDataParallel(model, device_ids=[args.gpu])`. Python imports this module at start-up
when its folder is on PYTHONPATH (bench/parity/torchvision.sh does that when NPROC > 1); it
changes those four calls, in torch, so that the same script runs on Gloo with CPU tensors:
  - init_process_group(backend="nccl") asks for "gloo";
  - torch.cuda.set_device does nothing;
  - torch.tensor(..., device="cuda") makes a CPU tensor;
  - DistributedDataParallel ignores device_ids (a CPU module takes none).
Everything else, the sampler, the all-reduce of the gradients and of the metrics, is torch's.
"""
import torch
import torch.distributed
import torch.nn.parallel

_init_process_group = torch.distributed.init_process_group


def _init_on_gloo(*args, backend=None, **kwargs):
    return _init_process_group(*args, backend="gloo" if backend == "nccl" else backend, **kwargs)


_tensor = torch.tensor


def _tensor_on_cpu(*args, device=None, **kwargs):
    return _tensor(*args, device="cpu" if device == "cuda" else device, **kwargs)


class _CpuDistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        super().__init__(module, **kwargs)


if not torch.cuda.is_available():
    torch.distributed.init_process_group = _init_on_gloo
    torch.cuda.set_device = lambda device: None
    torch.tensor = _tensor_on_cpu
    torch.nn.parallel.DistributedDataParallel = _CpuDistributedDataParallel
