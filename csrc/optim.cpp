// Fused optimizer steps: torch.optim's `fused=True` kernels (one kernel per parameter list on
// CUDA, a vectorised loop on the CPU), which tch does not bind. See shim.h for the contract.
#include "shim.h"
#include "error.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <initializer_list>
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

// ---- LARS and LAMB: timm's multi-tensor implementations (timm.optim.Lars, timm.optim.Lamb), op
// for op on ATen's _foreach_ kernels; no fused kernel exists for them.
namespace {
// A step skipped for an fp16 overflow is taken back on the device: what the step changes is
// copied before it and chosen back after it where found_inf holds 1 (the step's arithmetic on
// inf/NaN gradients is thrown away). Costs a copy of the changed tensors, under fp16 only.
class Undo {
 public:
  Undo(rt_tensor* found_inf, std::initializer_list<const std::vector<at::Tensor>*> lists) {
    if (!found_inf) return;
    skip_ = found_inf->reshape({}) > 0;
    for (const auto* l : lists) {
      for (const auto& t : *l) {
        changed_.push_back(t);
        before_.push_back(t.clone());
      }
    }
  }
  void finish() {
    for (size_t i = 0; i < changed_.size(); ++i) changed_[i].copy_(at::where(skip_, before_[i], changed_[i]));
  }

 private:
  at::Tensor skip_;
  std::vector<at::Tensor> changed_, before_;
};

// params -= lr * updates, lr a number or a 0-dim tensor on the device.
void apply_lr(std::vector<at::Tensor>& p, const std::vector<at::Tensor>& updates, double lr, rt_tensor* lr_tensor) {
  if (lr_tensor)
    at::_foreach_add_(p, at::_foreach_mul(updates, at::neg(*lr_tensor)));
  else
    at::_foreach_add_(p, updates, -lr);
}
}  // namespace

extern "C" {

int rt_lars(rt_tensor** params, rt_tensor** grads, rt_tensor** bufs, int n, double lr, rt_tensor* lr_tensor,
            double momentum, double weight_decay, int nesterov, double trust_coeff, double eps, int adapt,
            rt_tensor* found_inf) {
  return rt_guard<int>(
      [&] {
        at::NoGradGuard no_grad;  // parameters are leaves that require grad
        auto p = list(params, n), g = list(grads, n);
        auto b = bufs ? list(bufs, n) : std::vector<at::Tensor>{};
        if (n == 0) return 0;
        Undo undo(found_inf, {&p, &b});
        // The gradient with weight decay, scaled by the trust ratio computed from the norms
        // before the decay is added; new tensors, p.grad is left as it is (timm's _lars_trust_ratio).
        std::vector<at::Tensor> d = g;
        if (adapt) {
          auto w = at::stack(at::_foreach_norm(p)), gn = at::stack(at::_foreach_norm(g));
          auto trust = trust_coeff * w / (gn + w * weight_decay + eps);
          trust = at::where(w > 0, at::where(gn > 0, trust, 1.0), 1.0);
          d = at::_foreach_add(g, p, weight_decay);
          at::_foreach_mul_(d, trust.unbind(0));
        } else if (weight_decay != 0) {
          d = at::_foreach_add(g, p, weight_decay);
        }
        // SGD's momentum without dampening; the buffers start at zero, which makes the first
        // step's buffer the gradient, as torch's copy does.
        std::vector<at::Tensor> u = d;
        if (momentum != 0) {
          at::_foreach_mul_(b, momentum);
          at::_foreach_add_(b, d, 1.0);
          u = nesterov ? at::_foreach_add(d, b, momentum) : b;
        }
        apply_lr(p, u, lr, lr_tensor);
        undo.finish();
        return 0;
      },
      -1);
}

int rt_rmsprop(rt_tensor** params, rt_tensor** grads, rt_tensor** square_avgs, rt_tensor** bufs, rt_tensor** steps,
               int n, double lr, rt_tensor* lr_tensor, double alpha, double eps, double weight_decay, double momentum,
               rt_tensor* found_inf) {
  return rt_guard<int>(
      [&] {
        at::NoGradGuard no_grad;
        auto p = list(params, n), g = list(grads, n), v = list(square_avgs, n), s = list(steps, n);
        auto b = bufs ? list(bufs, n) : std::vector<at::Tensor>{};
        if (n == 0) return 0;
        Undo undo(found_inf, {&p, &v, &b, &s});
        // torch.optim.RMSprop's foreach step (not centered), op for op.
        at::_foreach_add_(s, 1);
        std::vector<at::Tensor> d = weight_decay != 0 ? at::_foreach_add(g, p, weight_decay) : g;
        at::_foreach_mul_(v, alpha);
        at::_foreach_addcmul_(v, d, d, 1 - alpha);
        auto avg = at::_foreach_sqrt(v);
        at::_foreach_add_(avg, eps);
        if (momentum > 0) {
          at::_foreach_mul_(b, momentum);
          at::_foreach_addcdiv_(b, d, avg);
          apply_lr(p, b, lr, lr_tensor);
        } else if (lr_tensor) {
          at::_foreach_div_(avg, at::neg(*lr_tensor));
          at::_foreach_addcdiv_(p, d, avg);
        } else {
          at::_foreach_addcdiv_(p, d, avg, -lr);
        }
        undo.finish();
        return 0;
      },
      -1);
}

rt_tensor* rt_lamb_clip(rt_tensor** grads, int n, double max_grad_norm) {
  return rt_guard<rt_tensor*>(
      [&] {
        at::NoGradGuard no_grad;
        auto g = list(grads, n);
        auto total = at::linalg_vector_norm(at::stack(at::_foreach_norm(g)));
        return new at::Tensor((total / max_grad_norm).clamp_(1.0));
      },
      nullptr);
}

int rt_lamb(rt_tensor** params, rt_tensor** grads, rt_tensor** exp_avgs, rt_tensor** exp_avg_sqs, int n,
            rt_tensor* step, rt_tensor* clip, double lr, rt_tensor* lr_tensor, double beta1, double beta2, double eps,
            double weight_decay, int adapt, rt_tensor* found_inf) {
  return rt_guard<int>(
      [&] {
        at::NoGradGuard no_grad;
        auto p = list(params, n), g = list(grads, n), m = list(exp_avgs, n), v = list(exp_avg_sqs, n);
        std::vector<at::Tensor> s{*step};
        Undo undo(found_inf, {&p, &m, &v, &s});
        // timm counts the group's step even when none of its parameters has a gradient.
        step->add_(1);
        if (n == 0) {
          undo.finish();
          return 0;
        }
        // Bias corrections from the step on the device (timm's host numbers: computed in double,
        // rounded to the parameters' type where a kernel takes them).
        const auto kind = p[0].scalar_type();
        auto t = step->to(at::kDouble);
        auto bc1 = at::rsub(at::pow(beta1, t), 1).to(kind);
        auto bc2_sqrt = at::sqrt(at::rsub(at::pow(beta2, t), 1)).to(kind);
        auto gc = clip ? at::_foreach_div(g, *clip) : g;
        at::_foreach_lerp_(m, gc, 1 - beta1);
        at::_foreach_mul_(v, beta2);
        at::_foreach_addcmul_(v, gc, gc, 1 - beta2);
        // timm's form with tensor bias corrections: m / bc1 / (sqrt(v) / sqrt(bc2) + eps).
        auto denom = at::_foreach_sqrt(v);
        at::_foreach_div_(denom, bc2_sqrt);
        at::_foreach_add_(denom, eps);
        auto u = at::_foreach_div(m, bc1);
        at::_foreach_div_(u, denom);
        if (weight_decay != 0) at::_foreach_add_(u, p, weight_decay);
        if (adapt) {
          // The trust ratio ||p|| / ||update|| joins the step size: one addcmul per tensor.
          auto w = at::stack(at::_foreach_norm(p)), un = at::stack(at::_foreach_norm(u));
          auto ratio = at::where(w > 0, at::where(un > 0, w / un, 1.0), 1.0);
          auto sizes = lr_tensor ? ratio * at::neg(*lr_tensor) : ratio * -lr;
          at::_foreach_addcmul_(p, u, sizes.unbind(0));
        } else {
          apply_lr(p, u, lr, lr_tensor);
        }
        undo.finish();
        return 0;
      },
      -1);
}

}  // extern "C"
