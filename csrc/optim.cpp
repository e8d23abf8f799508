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
}  // namespace

extern "C" {

int rt_fused_sgd(rt_tensor** params, rt_tensor** grads, rt_tensor** bufs, int n, double weight_decay,
                 double momentum, double lr, double dampening, int nesterov, int first_step,
                 rt_tensor* grad_scale, rt_tensor* found_inf) {
  return rt_guard<int>(
      [&] {
        // Without momentum torch passes an empty buffer list.
        auto b = bufs ? list(bufs, n) : std::vector<at::Tensor>{};
        at::_fused_sgd_(list(params, n), list(grads, n), b, weight_decay, momentum, lr, dampening,
                        nesterov != 0, /*maximize=*/false, first_step != 0, maybe(grad_scale),
                        maybe(found_inf));
        return 0;
      },
      -1);
}

int rt_fused_adam(rt_tensor** params, rt_tensor** grads, rt_tensor** exp_avgs, rt_tensor** exp_avg_sqs,
                  rt_tensor** steps, int n, double lr, double beta1, double beta2, double weight_decay,
                  double eps, int decoupled, rt_tensor* grad_scale, rt_tensor* found_inf) {
  return rt_guard<int>(
      [&] {
        auto p = list(params, n), g = list(grads, n), m = list(exp_avgs, n), v = list(exp_avg_sqs, n),
             s = list(steps, n);
        // torch.optim increments the step counters before the kernel and takes the increment
        // back when the step was skipped for an inf/NaN gradient.
        at::_foreach_add_(s, 1);
        if (decoupled)
          at::_fused_adamw_(p, g, m, v, {}, s, lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                            /*maximize=*/false, maybe(grad_scale), maybe(found_inf));
        else
          at::_fused_adam_(p, g, m, v, {}, s, lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                           /*maximize=*/false, maybe(grad_scale), maybe(found_inf));
        if (found_inf) at::_foreach_sub_(s, std::vector<at::Tensor>(s.size(), *found_inf));
        return 0;
      },
      -1);
}

}  // extern "C"
