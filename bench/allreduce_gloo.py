"""Time c10d's Gloo all-reduce of fp32 buckets between 2 ranks (the engine ringtrain's DDP runs
on), one rank per call: python allreduce_gloo.py RANK MASTER_ADDR PORT MB [MB ...].
Prints one line per bucket size: the median of 20 all-reduces after 3 warm-up ones."""
import statistics, sys, time
from datetime import timedelta

import torch
import torch.distributed as dist

rank, master, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
store = dist.TCPStore(master, port, 2, rank == 0, timeout=timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
for mb in map(float, sys.argv[4:]):
    t = torch.ones(int(mb * 1e6 / 4))
    times = []
    for i in range(23):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"gloo_allreduce_ms {mb} {1e3 * statistics.median(times):.2f}")
dist.destroy_process_group()
