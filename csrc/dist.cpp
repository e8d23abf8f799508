// c10d from Rust: PyTorch's own rendezvous (TCPStore) and process groups (Gloo for CPU tensors,
// NCCL for CUDA tensors). No collective is implemented here; each function forwards to c10d.
//
// Bootstrap, as torch.distributed.init_process_group(init_method="env://") does it:
//  - rank 0 runs the TCPStore server on master_addr:port and waits for world_size clients; the
//    others connect to it, retrying until the timeout (a dead or unreachable master is an error
//    after `timeout_ms`, not a hang). Under torchrun the agent already serves the store on that
//    port (TORCHELASTIC_USE_AGENT_STORE=True): then every rank is a client, as in PyTorch.
//  - Keys live under a "ringtrain/" prefix, apart from the agent's own.
//  - The store's server listens on master_addr only: c10d alone binds every interface (a
//    wildcard address), so the shim binds the socket itself and hands c10d the descriptor
//    (TCPStoreOptions::masterListenFd, as torchrun's agent can). The store has no
//    authentication; the docs say to keep it on a private network.
//  - Gloo needs a network device to bind: GLOO_SOCKET_IFNAME if set (as in PyTorch), otherwise
//    `local_addr`, the address on the route to the master (dist/network.rs). PyTorch binds the
//    address the host's name resolves to, often a loopback one: peers on other nodes then
//    cannot reach this rank.
//  - NCCL: the group is bound to the rank's CUDA device (the current one, set by the caller;
//    setBoundDeviceId + an eager connect, as init_process_group(device_id=...) does), so
//    barriers and the communicator use that device, not one guessed from the rank.
//    TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (TearDown) unless the user set it: when a collective
//    fails or outlasts the timeout (a dead or hung peer), NCCL's watchdog aborts the
//    communicators and then the process (SIGABRT), instead of leaving it hanging; the launcher
//    names that end. wait() on NCCL work does not block the host: it makes the current CUDA
//    stream wait for the collective.
#include "shim.h"
#include "pg.h"
#include "error.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef RT_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>



struct rt_work {
  c10::intrusive_ptr<c10d::Work> work;
};

struct rt_store {
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {
// A listening TCP socket on host:port (the first of the host's addresses that binds).
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) {
    throw std::runtime_error("cannot resolve the master address " + host);
  }
  int fd = -1, err = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 2048) == 0) break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    const std::string hint = err == EADDRINUSE ? " (choose another --master-port or MASTER_PORT)" : "";
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + std::strerror(err) + hint);
  }
  return fd;
}

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 1: return c10d::ReduceOp::MAX;
    case 2: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;
  }
}
}  // namespace

extern "C" {

int rt_nccl_available(void) {
#ifdef RT_WITH_NCCL
  return 1;
#else
  return 0;
#endif
}

rt_pg* rt_pg_new(const char* backend, const char* master_addr, const char* local_addr, int port, int rank,
                 int world, int64_t timeout_ms, int cuda_device) {
  return rt_guard<rt_pg*>([&]() -> rt_pg* {
    const auto timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(port);
    const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    const bool agent = agent_store && std::string(agent_store) == "True";
    so.isServer = rank == 0 && !agent;
    so.numWorkers = world;
    so.waitWorkers = true;
    so.timeout = timeout;
    if (so.isServer) so.masterListenFd = listen_on(master_addr, port);
    auto pg = std::make_unique<rt_pg>();
    auto tcp = c10::make_intrusive<c10d::TCPStore>(master_addr, so);
    pg->store = c10::make_intrusive<c10d::PrefixStore>("ringtrain", tcp);
    const std::string name(backend);
    if (name == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      if (ifname && *ifname) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      } else {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local_addr));
      }
      pg->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(pg->store, rank, world, opts);
    } else if (name == "nccl") {
#ifdef RT_WITH_NCCL
      TORCH_CHECK(cuda_device >= 0, "the NCCL backend needs the rank's CUDA device");
      // Already the current device (dist::worker_device, for Gloo over CUDA as well).
      const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device));
      setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", /*overwrite=*/0);
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(pg->store, rank, world, opts);
      nccl->setBoundDeviceId(device);
      nccl->eagerConnectSingleDevice(device);
      pg->backend = nccl;
#else
      throw std::runtime_error("this build of ringtrain has no NCCL support");
#endif
    } else {
      throw std::runtime_error("unknown backend " + name);
    }
    return pg.release();
  }, nullptr);
}

void rt_pg_free(rt_pg* pg) {
  if (!pg) return;
  try {
    pg->backend->shutdown();
  } catch (...) {
  }
  delete pg;
}

rt_work* rt_pg_allreduce(rt_pg* pg, at::Tensor* t, int op) {
  return rt_guard<rt_work*>([&]() -> rt_work* {
    std::vector<at::Tensor> ts{*t};
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(op);
    return new rt_work{pg->backend->allreduce(ts, o)};
  }, nullptr);
}

rt_work* rt_pg_broadcast(rt_pg* pg, at::Tensor* t, int root) {
  return rt_guard<rt_work*>([&]() -> rt_work* {
    std::vector<at::Tensor> ts{*t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return new rt_work{pg->backend->broadcast(ts, o)};
  }, nullptr);
}

rt_work* rt_pg_allgather(rt_pg* pg, at::Tensor* out, at::Tensor* in) {
  return rt_guard<rt_work*>([&]() -> rt_work* {
    // out is [world, *in.shape]; its slices are the per-rank outputs.
    std::vector<std::vector<at::Tensor>> outs{out->unbind(0)};
    std::vector<at::Tensor> ins{*in};
    return new rt_work{pg->backend->allgather(outs, ins)};
  }, nullptr);
}

rt_work* rt_pg_barrier(rt_pg* pg) {
  return rt_guard<rt_work*>([&]() -> rt_work* { return new rt_work{pg->backend->barrier()}; }, nullptr);
}

// The watchdog's own connection to the job's store (a c10d store client is one socket, and the
// training thread's is busy in the rendezvous), with its own timeout: a stopped master then
// fails the watchdog's call after `timeout_ms` instead of holding it.
rt_store* rt_store_clone(rt_pg* pg, int64_t timeout_ms) {
  return rt_guard<rt_store*>([&]() -> rt_store* {
    auto s = std::make_unique<rt_store>();
    s->store = pg->store->clone();
    s->store->setTimeout(std::chrono::milliseconds(timeout_ms));
    return s.release();
  }, nullptr);
}

// Adds `delta` to the counter `key` and returns its new value (delta 0 reads it); -1 on failure.
int64_t rt_store_add(rt_store* s, const char* key, int64_t delta) {
  return rt_guard<int64_t>([&]() -> int64_t { return s->store->add(key, delta); }, -1);
}

void rt_store_free(rt_store* s) { delete s; }

int rt_work_wait(rt_work* w) {
  int rc = rt_guard<int>([&]() -> int { return w->work->wait() ? 0 : -1; }, -1);
  delete w;
  return rc;
}

}  // extern "C"
