// TorchScript by tracing, as torch.jit.trace does for an nn.Module: the weights become the traced
// module's parameters and buffers under their state_dict names (nested submodules, so that
// state_dict(), .to() and .half() work on the loaded file), the forward pass is recorded by
// libtorch's tracer while ringtrain's own Rust forward runs, and the file is saved with its
// metadata as extra files. The same trace, described as text (one line per weight, constant,
// node), is what the ONNX writer (src/export/onnx) translates.
#include "shim.h"
#include "error.h"

#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/fixup_trace_scope_blocks.h>
#include <torch/csrc/jit/passes/normalize_ops.h>
#include <torch/script.h>

#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>
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

namespace jit = torch::jit;

// The words of a constant's line: its kind, then its value(s).
std::string describe_constant(const c10::IValue& v) {
  std::ostringstream o;
  o << std::setprecision(17);
  if (v.isNone()) {
    o << "none";
  } else if (v.isBool()) {
    o << "bool " << v.toBool();
  } else if (v.isInt()) {
    o << "int " << v.toInt();
  } else if (v.isDouble()) {
    o << "float " << v.toDouble();
  } else if (v.isString()) {
    const std::string& text = v.toStringRef();
    if (text.empty() || text.find_first_of(" \t\n") != std::string::npos)
      throw std::runtime_error("a string constant with spaces: " + text);
    o << "str " << text;
  } else if (v.isIntList()) {
    o << "ints";
    for (auto i : v.toIntVector()) o << " " << i;
  } else if (v.isDoubleList()) {
    o << "floats";
    for (auto d : v.toDoubleVector()) o << " " << d;
  } else if (v.isDevice()) {
    o << "device " << v.toDevice().str();
  } else if (v.isTensor()) {
    throw std::runtime_error("a tensor recorded as a constant of the traced graph");
  } else {
    throw std::runtime_error("a constant of type " + v.tagKind() + " in the traced graph");
  }
  return o.str();
}

// The traced graph as text, a line per item, values named by number:
//   input ID DTYPE SIZES... | weight ID NAME | const ID KIND VALUES... |
//   node KIND in ID... out ID... | value ID DTYPE SIZES... | output ID
// (sizes as traced; the submodules' prim::GetAttr reads are left out).
std::string describe(const std::shared_ptr<jit::Graph>& graph, const std::map<jit::Value*, std::string>& weights,
                     jit::Value* input, const at::Tensor& x) {
  std::ostringstream o;
  auto tensor_line = [&](const char* what, jit::Value* v, at::ScalarType dtype, at::IntArrayRef sizes) {
    o << what << " " << v->unique() << " " << c10::toString(dtype);
    for (auto d : sizes) o << " " << d;
    o << "\n";
  };
  tensor_line("input", input, x.scalar_type(), x.sizes());
  for (jit::Node* node : graph->nodes()) {
    if (node->kind() == c10::prim::GetAttr) {
      auto w = weights.find(node->output());
      if (w != weights.end()) o << "weight " << node->output()->unique() << " " << w->second << "\n";
      continue;
    }
    if (node->kind() == c10::prim::Constant) {
      o << "const " << node->output()->unique() << " " << describe_constant(*jit::toIValue(node->output())) << "\n";
      continue;
    }
    if (!node->blocks().empty())
      throw std::runtime_error(std::string("a traced node with blocks: ") + node->kind().toQualString());
    o << "node " << node->kind().toQualString() << " in";
    for (jit::Value* v : node->inputs()) o << " " << v->unique();
    o << " out";
    for (jit::Value* v : node->outputs()) o << " " << v->unique();
    o << "\n";
    for (jit::Value* v : node->outputs()) {
      auto t = v->type()->cast<c10::TensorType>();
      if (!t) continue;
      auto sizes = t->sizes().concrete_sizes();
      auto dtype = t->scalarType();
      if (!sizes || !dtype)
        throw std::runtime_error(std::string("a traced tensor without its sizes: ") + node->kind().toQualString());
      tensor_line("value", v, *dtype, *sizes);
    }
  }
  for (jit::Value* v : graph->outputs()) o << "output " << v->unique() << "\n";
  return o.str();
}
}  // namespace

extern "C" {

int rt_jit_trace_save(const char** names, rt_tensor** tensors, const int* is_buffer, int n, rt_tensor* input,
                      rt_forward_fn forward, void* ctx, const char* path, const char** extra_names,
                      const char** extra_contents, const size_t* extra_lengths, int n_extra, char** description) {
  return rt_guard<int>(
      [&] {
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
          std::map<jit::Value*, std::string> weight_names;
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
            jit::Value* read = graph->insertGetAttr(parent.second, atoms.back());
            weight_names[read] = names[i];
            state->setValue(t, read);
          }
          jit::Value* x = graph->addInput("x");
          x->setType(c10::TensorType::get());
          state->setValue(*input, x);
          rt_tensor* out = forward(ctx, input);
          if (!out) throw std::runtime_error("the forward pass failed while tracing");
          graph->registerOutput(state->getOutput(*out, 0));
          if (description) {
            std::string text = describe(graph, weight_names, x, *input);
            *description = static_cast<char*>(std::malloc(text.size() + 1));
            if (!*description) throw std::bad_alloc();
            std::memcpy(*description, text.c_str(), text.size() + 1);
          }
          if (!path) {
            jit::tracer::abandon();
            return 0;
          }
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

void rt_free_description(char* description) { std::free(description); }

}  // extern "C"
