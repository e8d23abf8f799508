#!/usr/bin/env bash
# Two "nodes" on this machine: two network namespaces joined by a veth pair (made here, removed
# on exit; needs root). Measures, across the link:
#  1. its bandwidth (one TCP stream, 1 GiB): the B of the ring model;
#  2. c10d's Gloo all-reduce of fp32 buckets of ringtrain's resnet18 sizes, against the ring
#     model's 2(N-1)/N · S / B = S / B at N = 2;
#  3. ringtrain itself, resnet18 32 px, global batch 8, 2 nodes of 1 rank with the all-reduce
#     after backward (--no-grad-overlap): its per-step all-reduce time from the epoch's exposed
#     share (epochs 2 and 3, so start-up is left out), and with the all-reduce overlapped.
#      bench/two_nodes.sh [DATA_DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${1:-$here/../../shared/data/plant-seedlings/test}"
source "$here/../scripts/build.sh"
py="${RINGTRAIN_PYTHON:-python3}"
id="rtb$$"; a="${id}a"; b="${id}b"; out="$(mktemp -d)"
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; rm -rf "$out"; }
trap cleanup EXIT
ip netns add "$a"; ip netns add "$b"
ip link add "${id}x" type veth peer name "${id}y"
ip link set "${id}x" netns "$a"; ip link set "${id}y" netns "$b"
ip -n "$a" addr add 10.78.0.1/24 dev "${id}x"; ip -n "$b" addr add 10.78.0.2/24 dev "${id}y"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "${id}x" up; ip -n "$b" link set "${id}y" up

ip netns exec "$a" "$py" - <<'PY' &
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("10.78.0.1", 5999)); s.listen(1)
c, _ = s.accept(); got, t = 0, time.time()
while True:
    d = c.recv(1 << 20)
    if not d: break
    got += len(d)
print(f"link_GBps {got / 1e9 / (time.time() - t):.2f}")
PY
sleep 1
ip netns exec "$b" "$py" -c '
import socket
c = socket.create_connection(("10.78.0.1", 5999)); buf = b"x" * (1 << 20)
for _ in range(1024): c.sendall(buf)
c.close()'
wait

# ringtrain's three buckets for resnet18 with 12 classes (its rule: the parameters in name order,
# reversed, a bucket closed at 1 MiB first, then at 25 MB), and all 44.7 MB in one.
sizes="9.44 26.5 8.8 44.73"
# PyTorch's Gloo binds the address the host name resolves to (loopback in a namespace): it needs
# the interface named, which is what ringtrain finds by itself.
ip netns exec "$a" env GLOO_SOCKET_IFNAME="${id}x" "$py" "$here/allreduce_gloo.py" 0 10.78.0.1 29610 $sizes &
ip netns exec "$b" env GLOO_SOCKET_IFNAME="${id}y" "$py" "$here/allreduce_gloo.py" 1 10.78.0.1 29610 $sizes > /dev/null
wait

for mode in after during; do
  flag=""; [ "$mode" = after ] && flag="--no-grad-overlap"
  common=(train --data "$data" --model resnet18 --img-size 32 --epochs 3 --batch-size 8 --device cpu --workers 1
          --log-every 0 --seed 1 --nnodes 2 --nproc-per-node 1 --master-addr 10.78.0.1 --master-port 29611 $flag)
  ip netns exec "$a" "$bin" "${common[@]}" --node-rank 0 --out "$out/$mode" > "$out/$mode.log" 2>&1 &
  ip netns exec "$b" "$bin" "${common[@]}" --node-rank 1 --out "$out/${mode}1" > /dev/null 2>&1
  wait
  steps=$(grep -o '[0-9]* steps per epoch' "$out/$mode.log" | grep -o '^[0-9]*')
  for e in 2 3; do
    secs=$(sed -n "$((e + 1))p" "$out/$mode/metrics.csv" | cut -d, -f8)
    share=$(grep "epoch $e/3" "$out/$mode.log" | grep -o 'all-reduce [0-9.]*%' | grep -o '[0-9.]*')
    echo "ringtrain_allreduce_${mode}_backward epoch $e: $steps steps in $secs s, exposed $share% = $(awk "BEGIN { printf \"%.1f\", $secs * $share / 100 / $steps * 1e3 }") ms/step"
  done
done
