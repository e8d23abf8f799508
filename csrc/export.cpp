// TorchScript by tracing, as torch.jit.trace does for an nn.Module: the weights become the traced
// module's parameters and buffers under their state_dict names (nested submodules, so that
// state_dict(), .to() and .half() work on the loaded file), the forward pass is recorded by
// libtorch's tracer while ringtrain's own Rust forward runs, and the file is saved with its
// metadata as extra files.
#include "shim.h"
#include "error.h"

#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/fixup_trace_scope_blocks.h>
#include <torch/csrc/jit/passes/normalize_ops.h>
#include <torch/script.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {
std::vector<std::string> split(const std::string& name) {
  std::vector<std::string> atoms;
  size_t start = 0;
  for (size_t dot; (dot = name.find('.', start)) != std::string::npos; start = dot + 1)
    atoms.push_back(name.substr(start, dot - start));
  atoms.push_back(name.substr(start));
  return atoms;
}
}  // namespace

extern "C" {

int rt_jit_trace_save(const char** names, rt_tensor** tensors, const int* is_buffer, int n, rt_tensor* input,
                      rt_forward_fn forward, void* ctx, const char* path, const char** extra_names,
                      const char** extra_contents, const size_t* extra_lengths, int n_extra) {
  return rt_guard<int>(
      [&] {
        namespace jit = torch::jit;
        if (jit::tracer::isTracing()) throw std::runtime_error("cannot nest tracing");
        auto cu = std::make_shared<jit::CompilationUnit>();
        int classes = 0;
        // Every module has `training`, as nn.Module's do: the loaded file's .eval() sets it.
        auto new_module = [&] {
          jit::Module m(c10::QualifiedName("__torch__.ringtrain.Module" + std::to_string(classes++)), cu, true);
          m.register_attribute("training", c10::BoolType::get(), false);
          return m;
        };
        jit::Module root = new_module();
        auto state = std::make_shared<jit::tracer::TracingState>();
        jit::tracer::setTracingState(state);
        try {
          auto& graph = state->graph;
          jit::Value* self = graph->insertInput(0, "self")->setType(root._ivalue()->type());
          // The module tree of the names ("layer1.0.conv1.weight" is layer1 → 0 → conv1, then
          // "weight"), each submodule read once (prim::GetAttr); each weight is read from its
          // module, not recorded as a constant.
          std::map<std::string, std::pair<jit::Module, jit::Value*>> modules{{"", {root, self}}};
          for (int i = 0; i < n; ++i) {
            auto atoms = split(names[i]);
            std::string prefix;
            auto parent = modules.at("");
            for (size_t a = 0; a + 1 < atoms.size(); ++a) {
              prefix = prefix.empty() ? atoms[a] : prefix + "." + atoms[a];
              auto found = modules.find(prefix);
              if (found == modules.end()) {
                jit::Module child = new_module();
                parent.first.register_module(atoms[a], child);
                jit::Value* read = graph->insertGetAttr(parent.second, atoms[a]);
                found = modules.emplace(prefix, std::make_pair(child, read)).first;
              }
              parent = found->second;
            }
            const at::Tensor& t = *tensors[i];
            if (is_buffer[i])
              parent.first.register_buffer(atoms.back(), t);
            else
              parent.first.register_parameter(atoms.back(), t, false);
            state->setValue(t, graph->insertGetAttr(parent.second, atoms.back()));
          }
          jit::Value* x = graph->addInput("x");
          x->setType(c10::TensorType::get());
          state->setValue(*input, x);
          rt_tensor* out = forward(ctx, input);
          if (!out) throw std::runtime_error("the forward pass failed while tracing");
          graph->registerOutput(state->getOutput(*out, 0));
          jit::FixupTraceScopeBlocks(graph, &root);
          jit::NormalizeOps(graph);
        } catch (...) {
          jit::tracer::abandon();
          throw;
        }
        jit::tracer::setTracingState(nullptr);
        auto fn = cu->create_function(c10::QualifiedName(*root.type()->name(), "forward"), state->graph);
        root.type()->addMethod(fn);
        jit::ExtraFilesMap extra;
        for (int i = 0; i < n_extra; ++i) extra[extra_names[i]] = std::string(extra_contents[i], extra_lengths[i]);
        root.save(path, extra);
        return 0;
      },
      -1);
}

}  // extern "C"
