"""PyTorch reference on a CPU machine: ImageFolder + DataLoader throughput (no training).
Usage: torch_loader_cpu.py DIR SIZE WORKERS   (bench/loader.sh runs it beside ringtrain's loader)"""
import sys, time, torch, torchvision
from torchvision import transforms as T

root, size, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
ds = torchvision.datasets.ImageFolder(root, tf)
dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers, drop_last=True,
                                 persistent_workers=workers > 0)
n, t0 = 0, None
for ep in range(2):
    for x, y in dl:
        if t0 is None:
            t0 = time.perf_counter(); continue
        n += x.shape[0]
dt = time.perf_counter() - t0
print(f"torchvision DataLoader size={size} workers={workers}: {n/dt:.1f} img/s")
