"""Tar shards in an object store and on a web server against the same local files, and against
PyTorch reading them over HTTP with the webdataset package: one epoch, the whole command timed
(opening the set included), and ringtrain's resident memory over the epoch.

  python bench/remote_data.py FOLDER OUT_DIR [--size 32] [--batch 256] [--workers 2] [--repeat 2]

Writes OUT_DIR/train-NNNNNN.tar as bench/shards.py does (unless they are there), starts
tests/py/object_server.py (moto's S3 server behind a proxy, and an HTTP server of OUT_DIR with
Range support, on loopback) and uploads the shards with boto3. ringtrain runs `bench-data`
(RandomResizedCrop + flip, uint8 batches) on the local shards; on `s3://` with a fresh temporary
cache (every shard fetched); on `s3://` with a `--cache-dir` filled by an untimed run before; and
on `http://`. PyTorch runs WebDataset(...).shuffle(1000).decode("pil") on the `http://` URLs (its
gopen fetches each shard with curl) with the same transform, workers and batch. The memory is
VmRSS read every 50 ms while the local run and the cold `s3://` run go.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shards import PYTORCH, RINGTRAIN, arguments, make_shards  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "..", "tests", "py", "object_server.py")


def timed(cmd, env, rss=None):
    """Seconds the command took; with `rss`, its resident memory (MB) every 50 ms appended."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if rss is not None:
        def watch():
            while p.poll() is None:
                try:
                    with open(f"/proc/{p.pid}/status") as f:
                        kb = next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))
                    rss.append((time.perf_counter() - t0, kb / 1024))
                except (OSError, StopIteration):
                    pass
                time.sleep(0.05)
        threading.Thread(target=watch, daemon=True).start()
    _, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"{cmd[:3]} failed: {err.decode()}")
    return time.perf_counter() - t0


def main():
    a = arguments().parse_args()
    if not glob.glob(os.path.join(a.shards, "train-*.tar")):
        make_shards(a.folder, a.shards)
    n = len(glob.glob(os.path.join(a.shards, "train-*.tar")))
    braces = "train-{%06d..%06d}.tar" % (0, n - 1)

    server = subprocess.Popen([sys.executable, SERVER, a.shards], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    urls = json.loads(server.stdout.readline())
    env = dict(os.environ, AWS_ENDPOINT_URL=urls["s3"], AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
               AWS_REGION="us-east-1")
    import boto3
    s3 = boto3.client("s3", endpoint_url=urls["s3"], aws_access_key_id="bench", aws_secret_access_key="bench",
                      region_name="us-east-1")
    s3.create_bucket(Bucket="bench")
    size = 0
    for i in range(n):
        name = "train-%06d.tar" % i
        s3.upload_file(os.path.join(a.shards, name), "bench", name)
        size += os.path.getsize(os.path.join(a.shards, name))
    print(f"{n} shards, {size / 1e6:.0f} MB, uploaded to the S3 server")

    common = ["bench-data", "--img-size", str(a.size), "--batch-size", str(a.batch), "--workers",
              str(a.workers), "--epochs", "1", "--device", "cpu", "--cache", "off"]
    cache = tempfile.mkdtemp(prefix="remote-bench-cache-")
    runs = {
        "ringtrain, local shards": [RINGTRAIN] + common + ["--data", os.path.join(a.shards, braces)],
        "ringtrain, s3:// (temporary cache)": [RINGTRAIN] + common + ["--data", f"s3://bench/{braces}"],
        "ringtrain, s3:// (--cache-dir, filled)": [RINGTRAIN] + common + ["--data", f"s3://bench/{braces}",
                                                                           "--cache-dir", cache],
        "ringtrain, http://": [RINGTRAIN] + common + ["--data", f"{urls['http']}/{braces}"],
        "pytorch webdataset, http://": [sys.executable, "-c", PYTORCH, f"{urls['http']}/{braces}", str(a.size),
                                        str(a.batch), str(a.workers)],
    }
    timed(runs["ringtrain, local shards"], env)  # warms the page cache; not counted
    timed(runs["ringtrain, s3:// (--cache-dir, filled)"], env)  # fills the cache; not counted
    watched = ["ringtrain, local shards", "ringtrain, s3:// (temporary cache)"]
    rss = {name: [] for name in watched}
    for name, cmd in runs.items():
        times = [timed(cmd, env, rss.get(name) if k == 0 else None) for k in range(a.repeat)]
        print(f"{name:40s} " + ", ".join(f"{t:.2f} s" for t in times))
    for name in watched:
        after = [m for t, m in rss[name] if t > 1.0]
        if after:
            print(f"{name}: resident memory after the first second {min(after):.0f}-{max(after):.0f} MB over "
                  f"{len(after)} readings (peak {max(m for _, m in rss[name]):.0f} MB)")
    server.stdin.close()
    server.wait()
    shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
