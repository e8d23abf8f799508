// Fused optimizer steps: torch.optim's `fused=True` kernels (one kernel per parameter list on
// CUDA, a vectorised loop on the CPU), which tch does not bind. See shim.h for the contract.
#include "shim.h"
#include "error.h"

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace {
std::vector<at::Tensor> list(rt_tensor** ts, int n) {
  std::vector<at::Tensor> v;
  v.reserve(n);
  for (int i = 0; i < n; ++i) v.push_back(*ts[i]);
  return v;
}

std::optional<at::Tensor> maybe(rt_tensor* t) {
  return t ? std::optional<at::Tensor>(*t) : std::nullopt;
}

// The fused kernels walk a parameter, its gradient and its state as flat memory: all of them
// must have the same strides (a channels_last weight with a contiguous gradient would be
// updated with scrambled values on the CPU, and refused by CUDA's fast path).
// (Strides of size-1 dimensions do not move through memory, so they may differ.)
bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

void check_same_layout(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& other,
                       const char* what) {
  for (size_t i = 0; i < other.size(); ++i) {
    TORCH_CHECK(same_layout(params[i], other[i]), "fused optimizer: parameter ", i, " of shape ", params[i].sizes(),
                " has strides ", params[i].strides(), " but its ", what, " has ", other[i].strides());
  }
}
}  // namespace

extern "C" {

int rt_fused_sgd(rt_tensor** params, rt_tensor** grads, rt_tensor** bufs, int n, double weight_decay,
                 double momentum, double lr, rt_tensor* lr_tensor, double dampening, int nesterov, int first_step,
                 rt_tensor* grad_scale, rt_tensor* found_inf) {
  return rt_guard<int>(
      [&] {
        // Without momentum torch passes an empty buffer list.
        auto p = list(params, n), g = list(grads, n);
        auto b = bufs ? list(bufs, n) : std::vector<at::Tensor>{};
        check_same_layout(p, g, "gradient");
        check_same_layout(p, b, "momentum buffer");
        if (lr_tensor)
          at::_fused_sgd_(p, g, b, weight_decay, momentum, *lr_tensor, dampening, nesterov != 0,
                          /*maximize=*/false, first_step != 0, maybe(grad_scale), maybe(found_inf));
        else
          at::_fused_sgd_(p, g, b, weight_decay, momentum, lr, dampening, nesterov != 0,
                          /*maximize=*/false, first_step != 0, maybe(grad_scale), maybe(found_inf));
        return 0;
      },
      -1);
}

int rt_fused_adam(rt_tensor** params, rt_tensor** grads, rt_tensor** exp_avgs, rt_tensor** exp_avg_sqs,
                  rt_tensor** steps, int n, double lr, rt_tensor* lr_tensor, double beta1, double beta2,
                  double weight_decay, double eps, int decoupled, rt_tensor* grad_scale, rt_tensor* found_inf) {
  return rt_guard<int>(
      [&] {
        auto p = list(params, n), g = list(grads, n), m = list(exp_avgs, n), v = list(exp_avg_sqs, n),
             s = list(steps, n);
        check_same_layout(p, g, "gradient");
        check_same_layout(p, m, "exp_avg");
        check_same_layout(p, v, "exp_avg_sq");
        // torch.optim increments the step counters before the kernel and takes the increment
        // back when the step was skipped for an inf/NaN gradient.
        at::_foreach_add_(s, 1);
        const auto gs = maybe(grad_scale), fi = maybe(found_inf);
        if (decoupled && lr_tensor)
          at::_fused_adamw_(p, g, m, v, {}, s, *lr_tensor, beta1, beta2, weight_decay, eps, false, false, gs, fi);
        else if (decoupled)
          at::_fused_adamw_(p, g, m, v, {}, s, lr, beta1, beta2, weight_decay, eps, false, false, gs, fi);
        else if (lr_tensor)
          at::_fused_adam_(p, g, m, v, {}, s, *lr_tensor, beta1, beta2, weight_decay, eps, false, false, gs, fi);
        else
          at::_fused_adam_(p, g, m, v, {}, s, lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                           /*maximize=*/false, gs, fi);
        // found_inf is 0-dim as torch.amp.GradScaler's; a [1]-shaped one is taken as that scalar
        // (the step counters are 0-dim, and an in-place op cannot broadcast them to [1]).
        if (found_inf) at::_foreach_sub_(s, std::vector<at::Tensor>(s.size(), found_inf->reshape({})));
        return 0;
      },
      -1);
}

}  // extern "C"
