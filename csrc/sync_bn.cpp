// SyncBatchNorm: BatchNorm whose training statistics are those of the global batch across all
// ranks, as torch.nn.SyncBatchNorm computes them, written as a C++ autograd Function so the
// backward pass can all-reduce too. Two paths, one contract (output in the input's dtype,
// running statistics updated with the global mean and unbiased variance, dw and db local: DDP
// averages them with the other gradients):
//
// CUDA: PyTorch's own SyncBatchNorm, step for step (torch/nn/modules/_functions.py), on its
//   fused kernels: batch_norm_stats → all-gather [mean, invstd, count] per rank →
//   batch_norm_gather_stats_with_counts → batch_norm_elemt; backward batch_norm_backward_reduce →
//   all-reduce [Σdy, Σdy·(x-mean)] → batch_norm_backward_elemt. The counts stay on the device:
//   no host synchronisation, no fp64 copy of the input, and an fp16 input gives an fp16 output.
//   (PyTorch drops ranks with empty inputs by a boolean mask, a host sync; every rank here has
//   a full batch, so there is none to drop.)
// CPU (those kernels exist for CUDA only): the same math with ordinary tensor ops:
//   forward:  all-reduce [Σx, Σx², n] per channel, in float64 so E[x²] - E[x]² does not lose
//             the variance to cancellation → global mean and biased var →
//             y = (x - mean) · invstd · w + b.
//   backward: all-reduce [Σdy, Σdy·(x-mean)] → dx = (dy - mean(dy) - (x-mean)·invstd²·mean(dy·(x-mean)))
//             · invstd · w, with the means over the global batch.
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

// channels_last inputs stay as they are (the kernels handle them); anything else contiguous.
at::Tensor dense(const at::Tensor& t) {
  return t.is_contiguous(at::MemoryFormat::ChannelsLast) ? t : t.contiguous();
}

// ---- CUDA: PyTorch's kernels.
at::Tensor forward_cuda(AutogradContext* ctx, rt_pg* pg, at::Tensor x, const at::Tensor& weight,
                        const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                        double momentum, double eps) {
  x = dense(x);
  const int64_t c = x.size(1);
  auto [local_mean, local_invstd] = at::batch_norm_stats(x, eps);
  auto count = at::full({1}, static_cast<double>(x.numel() / c), local_mean.options());
  auto combined = at::cat({local_mean, local_invstd, count}, 0);  // [2C + 1]
  const int64_t world = pg->backend->getSize();
  auto gathered = at::empty({world, combined.size(0)}, combined.options());
  {
    std::vector<std::vector<at::Tensor>> outs{gathered.unbind(0)};
    std::vector<at::Tensor> ins{combined};
    pg->backend->allgather(outs, ins)->wait();
  }
  auto mean_all = gathered.narrow(1, 0, c), invstd_all = gathered.narrow(1, c, c);
  auto counts = gathered.narrow(1, 2 * c, 1).reshape({-1}).to(running_mean.scalar_type());
  auto [mean, invstd] = at::batch_norm_gather_stats_with_counts(x, mean_all, invstd_all, running_mean, running_var,
                                                                momentum, eps, counts);
  ctx->save_for_backward({x, weight, mean, invstd, counts.to(at::kInt)});
  return at::batch_norm_elemt(x, weight, bias, mean, invstd, eps);
}

variable_list backward_cuda(const variable_list& saved, rt_pg* pg, at::Tensor dy) {
  auto x = saved[0], weight = saved[1], mean = saved[2], invstd = saved[3], counts = saved[4];
  dy = dense(dy);
  auto [sum_dy, sum_dy_xmu, grad_weight, grad_bias] =
      at::batch_norm_backward_reduce(dy, x, mean, invstd, weight, /*input_g=*/true, /*weight_g=*/true, /*bias_g=*/true);
  const int64_t c = sum_dy.size(0);
  auto combined = at::cat({sum_dy, sum_dy_xmu}, 0);
  all_reduce_sum(pg, combined);
  auto w = weight.scalar_type() == mean.scalar_type() ? weight : weight.to(mean.scalar_type());
  auto grad_x = at::batch_norm_backward_elemt(dy, x, mean, invstd, w, combined.narrow(0, 0, c),
                                              combined.narrow(0, c, c), counts);
  return {grad_x, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
}

// ---- CPU: the same math with ordinary ops. Elementwise work in the input's dtype, or float
// for half types (as the CUDA kernels accumulate); the output in the input's dtype.
at::ScalarType compute_type(const at::Tensor& x) {
  return at::isReducedFloatingType(x.scalar_type()) ? at::kFloat : x.scalar_type();
}

at::Tensor forward_generic(AutogradContext* ctx, rt_pg* pg, const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                           double momentum, double eps) {
  const auto dims = reduce_dims(x);
  const int64_t c = x.size(1);
  auto xd = x.to(at::kDouble);
  auto n_local = static_cast<double>(x.numel() / c);
  auto stats = at::cat({xd.sum(dims), (xd * xd).sum(dims), at::full({1}, n_local, xd.options())});
  all_reduce_sum(pg, stats);
  auto sum = stats.narrow(0, 0, c), sqsum = stats.narrow(0, c, c);
  const double count = stats[2 * c].item<double>();  // a host tensor: no device to wait for
  TORCH_CHECK(count > 1, "SyncBatchNorm needs more than one value per channel across all ranks");
  auto mean = sum / count;
  auto var = (sqsum / count - mean * mean).clamp_min(0);
  auto invstd = (var + eps).rsqrt();
  {
    at::NoGradGuard no_grad;
    running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
    running_var.mul_(1 - momentum).add_((var * (count / (count - 1))).to(running_var.scalar_type()), momentum);
  }
  const auto ct = compute_type(x);
  auto m = mean.to(ct).view(channel_shape(x));
  auto is = invstd.to(ct).view(channel_shape(x));
  ctx->save_for_backward({x, weight, m, is});
  ctx->saved_data["count"] = count;
  auto w = weight.to(ct).view(channel_shape(x)), b = bias.to(ct).view(channel_shape(x));
  return ((x.to(ct) - m) * is * w + b).to(x.scalar_type());
}

variable_list backward_generic(AutogradContext* ctx, const variable_list& saved, rt_pg* pg,
                               const at::Tensor& dy_in) {
  auto x = saved[0], weight = saved[1], mean = saved[2], invstd = saved[3];
  const double count = ctx->saved_data["count"].toDouble();
  const auto ct = mean.scalar_type();
  auto dy = dy_in.to(ct);
  const auto dims = reduce_dims(x);
  const int64_t c = x.size(1);
  auto xmu = x.to(ct) - mean;
  auto sum_dy = dy.sum(dims);
  auto sum_dy_xmu = (dy * xmu).sum(dims);
  auto grad_weight = (sum_dy_xmu * invstd.view({c})).to(weight.scalar_type());
  auto grad_bias = sum_dy.to(weight.scalar_type());
  auto global = at::cat({sum_dy, sum_dy_xmu}).to(at::kDouble);
  all_reduce_sum(pg, global);
  auto mean_dy = (global.narrow(0, 0, c) / count).to(ct).view(channel_shape(x));
  auto mean_dy_xmu = (global.narrow(0, c, c) / count).to(ct).view(channel_shape(x));
  auto w = weight.to(ct).view(channel_shape(x));
  auto grad_x = ((dy - mean_dy - xmu * invstd * invstd * mean_dy_xmu) * invstd * w).to(x.scalar_type());
  return {grad_x, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
}

struct SyncBatchNorm : public torch::autograd::Function<SyncBatchNorm> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::Tensor weight, at::Tensor bias,
                            at::Tensor running_mean, at::Tensor running_var, double momentum,
                            double eps, int64_t pg_ptr) {
    auto* pg = reinterpret_cast<rt_pg*>(pg_ptr);
    ctx->saved_data["pg"] = pg_ptr;
    if (x.is_cuda()) return forward_cuda(ctx, pg, x, weight, bias, running_mean, running_var, momentum, eps);
    return forward_generic(ctx, pg, x, weight, bias, running_mean, running_var, momentum, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* pg = reinterpret_cast<rt_pg*>(ctx->saved_data["pg"].toInt());
    auto saved = ctx->get_saved_variables();  // saved[0] is the input: its device picks the path
    if (saved[0].is_cuda()) return backward_cuda(saved, pg, grad_outputs[0]);
    return backward_generic(ctx, saved, pg, grad_outputs[0]);
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
