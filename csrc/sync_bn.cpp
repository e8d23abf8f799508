// SyncBatchNorm: BatchNorm whose training statistics are those of the global batch across all
// ranks, as torch.nn.SyncBatchNorm computes them, written as a C++ autograd Function so the
// backward pass can all-reduce too.
//
// PyTorch's own SyncBatchNorm calls fused kernels (batch_norm_stats, ..._gather_stats_with_counts,
// batch_norm_elemt, batch_norm_backward_reduce/_elemt) that libtorch provides for CUDA only. This
// follows the same math with ordinary tensor ops, so it runs on CPU (Gloo) and CUDA alike:
//   forward:  all-reduce [Σx, Σx², n] per channel → global mean and biased var →
//             y = (x - mean) · invstd · w + b; running stats get mean and the unbiased var.
//   backward: all-reduce [Σdy, Σdy·(x-mean)] → dx = (dy - mean(dy) - (x-mean)·invstd²·mean(dy·(x-mean)))
//             · invstd · w, with the means over the global batch; dw and db stay local (DDP
//             averages them with the other gradients).
// Sums are accumulated in float64 so E[x²] - E[x]² does not lose the variance to cancellation.
#include "shim.h"
#include "pg.h"
#include "error.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <string>



namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void all_reduce_sum(rt_pg* pg, at::Tensor& t) {
  std::vector<at::Tensor> ts{t};
  pg->backend->allreduce(ts)->wait();
}

// [N, C, *] → shape to broadcast a per-channel vector against the input.
std::vector<int64_t> channel_shape(const at::Tensor& x) {
  std::vector<int64_t> s(x.dim(), 1);
  s[1] = x.size(1);
  return s;
}

std::vector<int64_t> reduce_dims(const at::Tensor& x) {
  std::vector<int64_t> d{0};
  for (int64_t i = 2; i < x.dim(); ++i) d.push_back(i);
  return d;
}

struct SyncBatchNorm : public torch::autograd::Function<SyncBatchNorm> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::Tensor weight, at::Tensor bias,
                            at::Tensor running_mean, at::Tensor running_var, double momentum,
                            double eps, int64_t pg_ptr) {
    auto* pg = reinterpret_cast<rt_pg*>(pg_ptr);
    const auto dims = reduce_dims(x);
    const int64_t c = x.size(1);
    auto xd = x.to(at::kDouble);
    auto n_local = static_cast<double>(x.numel() / c);
    auto stats = at::cat({xd.sum(dims), (xd * xd).sum(dims), at::full({1}, n_local, xd.options())});
    all_reduce_sum(pg, stats);
    auto sum = stats.narrow(0, 0, c), sqsum = stats.narrow(0, c, c);
    const double count = stats[2 * c].item<double>();
    TORCH_CHECK(count > 1, "SyncBatchNorm needs more than one value per channel across all ranks");
    auto mean = sum / count;
    auto var = (sqsum / count - mean * mean).clamp_min(0);
    auto invstd = (var + eps).rsqrt();
    {
      at::NoGradGuard no_grad;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (count / (count - 1))).to(running_var.scalar_type()), momentum);
    }
    auto m = mean.to(x.scalar_type()).view(channel_shape(x));
    auto is = invstd.to(x.scalar_type()).view(channel_shape(x));
    ctx->save_for_backward({x, weight, m, is});
    ctx->saved_data["pg"] = pg_ptr;
    ctx->saved_data["count"] = count;
    return (x - m) * is * weight.view(channel_shape(x)) + bias.view(channel_shape(x));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto x = saved[0], weight = saved[1], mean = saved[2], invstd = saved[3];
    auto* pg = reinterpret_cast<rt_pg*>(ctx->saved_data["pg"].toInt());
    const double count = ctx->saved_data["count"].toDouble();
    auto dy = grad_outputs[0];
    const auto dims = reduce_dims(x);
    const int64_t c = x.size(1);
    auto xmu = x - mean;
    auto sum_dy = dy.sum(dims);
    auto sum_dy_xmu = (dy * xmu).sum(dims);
    auto grad_weight = sum_dy_xmu * invstd.view({c});
    auto grad_bias = sum_dy;
    auto global = at::cat({sum_dy, sum_dy_xmu}).to(at::kDouble);
    all_reduce_sum(pg, global);
    auto mean_dy = (global.narrow(0, 0, c) / count).to(x.scalar_type()).view(channel_shape(x));
    auto mean_dy_xmu = (global.narrow(0, c, c) / count).to(x.scalar_type()).view(channel_shape(x));
    auto grad_x = (dy - mean_dy - xmu * invstd * invstd * mean_dy_xmu) * invstd * weight.view(channel_shape(x));
    return {grad_x, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
}  // namespace

extern "C" at::Tensor* rt_sync_batch_norm(rt_pg* pg, at::Tensor* x, at::Tensor* weight, at::Tensor* bias,
                                          at::Tensor* running_mean, at::Tensor* running_var,
                                          double momentum, double eps) {
  return rt_guard<at::Tensor*>([&] {
    return new at::Tensor(SyncBatchNorm::apply(*x, *weight, *bias, *running_mean, *running_var, momentum,
                                               eps, reinterpret_cast<int64_t>(pg)));
  }, nullptr);
}
