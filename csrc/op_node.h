// One MLX node for a metile op under a transform (mx.compile, grad, vjp, jvp, vmap).
//
// An op's forward is a few nodes - its kernel launches, and the reshapes and contiguous()
// copies feeding them - and its derivatives and batching come from MLX (the op's vjp, its
// MLX composite's jvp and vmap).  mx.custom_function gives it those with two more nodes an
// output (StopGradient, CustomTransforms); each node an MLX graph holds costs host time at
// every evaluation of a compiled call (s126, H100: a one-kernel op 8.0 us a node in a
// compiled chain against MLX's own 4.7), and eagerly too.  OpNode is the whole forward as
// one primitive: its inputs are the op's arrays (then any array the forward reads that does
// not depend on them), its eval runs the forward's nodes in order by calling their own
// eval_cpu/eval_gpu, and it carries the op's rules.  The forward's intermediate arrays are
// temporaries the eval hands to the stream's encoder, which holds them until what reads
// them has run (as MLX holds its own primitives' scratch arrays).
//
// Only nodes whose evaluation needs nothing from MLX's evaluation loop beyond
// eval_cpu/eval_gpu are taken in (metile's launches and MLX's layout primitives); a
// forward with anything else keeps mx.custom_function (fuse_op answers nullopt).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "lazy_slice.h"
#include "no_vjp.h"

namespace metile {

namespace mx = mlx::core;

// The op's rules, over its own arrays (the node's first inputs) and visible outputs.
struct OpRules {
  // (primals, cotangents, outputs) -> one cotangent a primal
  std::function<std::vector<mx::array>(const std::vector<mx::array>&,
                                       const std::vector<mx::array>&,
                                       const std::vector<mx::array>&)>
      vjp;
  // (primals, tangents, argnums: the primals the tangents are of) -> one tangent an output
  std::function<std::vector<mx::array>(const std::vector<mx::array>&,
                                       const std::vector<mx::array>&, const std::vector<int>&)>
      jvp;
  // (inputs, axes: -1 where unbatched) -> (outputs, their axes)
  std::function<std::pair<std::vector<mx::array>, std::vector<int>>(
      const std::vector<mx::array>&, const std::vector<int>&)>
      vmap;
  // the op's name, for refusals: "kernel 'k'" style (a kernel's symbol or name: no_vjp.h's
  // kernel_name) where the op has no jvp or vmap rule
  std::string name;
};

// How an OpNode on a GPU stream keeps its temporaries until the GPU has run the kernels
// reading them: set by the GPU backend's launch (cuda_launch.cpp); without one, fuse_op
// makes no OpNode with temporaries on a GPU stream.
using KeepAlive = void (*)(mx::Stream, std::vector<mx::array>);
inline KeepAlive& gpu_keep_alive() {
  static KeepAlive keep = nullptr;
  return keep;
}

// METILE_DEBUG=op_nodes: fuse_op says which node kept an op from being one MetileOp
// (read once, at the first op).
inline bool debug_op_nodes() {
  static const bool on = [] {
    const char* v = std::getenv("METILE_DEBUG");
    return v != nullptr && std::strstr(v, "op_nodes") != nullptr;
  }();
  return on;
}

// metile's own launch primitives (csrc/cuda_launch.cpp, csrc/msl_cpu/primitive.h): their
// eval allocates every output, row-contiguous.
inline bool metile_launch(const char* name) {
  return std::strcmp(name, "MetileCudaKernel") == 0 || std::strcmp(name, "MetileMslCpuKernel") == 0;
}

// Primitives an OpNode runs itself: metile's launches (eval allocates and encodes), an
// op's own OpNode (an op built from ops) and MLX's primitives that only share, view or
// copy a buffer.
inline bool fusable_primitive(const char* name) {
  // MLX's own custom kernel (metile's launches through cuda_kernel: an output that starts
  // from a value, METILE_CUDA_LAUNCH=mlx) where the CUDA launch is built: its eval is
  // self-contained as metile's own; on Metal not run inside a node (not tested there)
  if (std::strcmp(name, "CustomKernel") == 0) return gpu_keep_alive() != nullptr;
  if (metile_launch(name)) return true;
  // Select: the merge of a launch's output with its initial value where the output is not
  // proven whole (attention at ragged lengths on CUDA; METILE_DEBUG=op_nodes named it, H100)
  for (const char* known : {"MetileOp", "Reshape", "Contiguous", "Copy", "AsType", "Broadcast",
                            "ExpandDims", "Squeeze", "Transpose", "Slice", "View", "Flatten",
                            "Unflatten", "Select"}) {
    if (std::strcmp(name, known) == 0) return true;
  }
  return false;
}

// The shapes and dtypes of arrays an OpNode makes (its outputs, or its temporaries).
struct ArraysOf {
  std::vector<mx::Shape> shapes;
  std::vector<mx::Dtype> dtypes;
};

class OpNode : public mx::Primitive {
 public:
  // One of the forward's nodes: its primitive, where each input comes from (>= 0: the
  // OpNode's input; < 0: slot -1 - i, written by an earlier step) and which slots it
  // writes (the OpNode's outputs first, then its temporaries).
  struct Step {
    std::shared_ptr<mx::Primitive> primitive;
    std::vector<int> in;
    std::vector<int> out;
  };

  // The inputs: the primals, then `sources` arrays some primals are slices of (read in
  // their place), then arrays read that no transform traces.  `rule_in`: the shape the
  // rules see each primal in (the op's rows, where the node takes the array the op reshaped
  // to them); `rule_out`: the shape of each output the rules compute (before the op's
  // reshape of it, which the node runs); `outputs` (those `contiguous_out` says a launch
  // writes row-contiguous) and `temps` (slots after the outputs).
  OpNode(mx::Stream stream, std::vector<Step> steps, std::vector<mx::Shape> rule_in,
         std::vector<mx::Shape> rule_out, ArraysOf outputs, std::vector<bool> contiguous_out,
         ArraysOf temps, std::shared_ptr<const OpRules> rules, int sources)
      : mx::Primitive(stream), steps_(std::move(steps)), outputs_(std::move(outputs)),
        temps_(std::move(temps)), sources_(sources), primals_(int(rule_in.size())),
        visible_(int(rule_out.size())), rule_in_(std::move(rule_in)),
        rule_out_(std::move(rule_out)), contiguous_out_(std::move(contiguous_out)),
        rules_(std::move(rules)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    run(inputs, outputs, false);
  }
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    run(inputs, outputs, true);
  }

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override {
    auto ps = rule_primals(primals);
    std::vector<mx::array> cots, outs;
    for (int j = 0; j < visible_; ++j) {
      cots.push_back(shaped(cotangents[j], rule_out_[j]));
      outs.push_back(shaped(outputs[j], rule_out_[j]));
    }
    auto grads = rules_->vjp(ps, cots, outs);
    if (grads.size() != std::size_t(primals_)) {
      throw std::runtime_error("[metile] " + rules_->name + "'s vjp gave " +
                               std::to_string(grads.size()) + " gradients for " +
                               std::to_string(primals_) + " arrays");
    }
    std::vector<mx::array> out;
    for (int a : argnums) {
      // (a slice's source: its gradient comes through the slice primal's; the other inputs
      // depend on no traced array, fuse_op checked)
      out.push_back(a < primals_ ? shaped(grads[a], primals[a].shape())
                                 : mx::zeros_like(primals[a]));
    }
    return out;
  }

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override {
    if (!rules_->jvp) {
      // (tangents whose evaluation raises, naming the op or kernel, as a bare launch's do)
      return metile::refused_jvp(stream(), rules_->name, primals, outputs_.shapes,
                                 outputs_.dtypes);
    }
    std::vector<mx::array> ts;
    std::vector<int> at;
    for (std::size_t j = 0; j < argnums.size(); ++j) {
      if (argnums[j] < primals_) {
        ts.push_back(shaped(tangents[j], rule_in_[argnums[j]]));
        at.push_back(argnums[j]);
      }
    }
    auto got = rules_->jvp(rule_primals(primals), ts, at);
    for (std::size_t j = 0; j < got.size() && j < outputs_.shapes.size(); ++j) {
      got[j] = shaped(got[j], outputs_.shapes[j]);
    }
    return got;
  }

  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override {
    if (!rules_->vmap) {
      return metile::refused_vmap(stream(), rules_->name, inputs, axes, outputs_.shapes,
                                  outputs_.dtypes);
    }
    // (a slice's source batched: the slice primal is, and the rule reads that)
    for (std::size_t i = primals_ + sources_; i < axes.size(); ++i) {
      if (axes[i] >= 0) {
        throw std::invalid_argument("[metile] " + rules_->name + ": mx.vmap batched an array "
                                    "the op reads but was not given");
      }
    }
    // each primal in the rules' shape, batched along axis 0
    std::vector<mx::array> xs;
    std::vector<int> in_axes;
    for (int i = 0; i < primals_; ++i) {
      xs.push_back(batched(inputs[i], axes[i], rule_in_[i]));
      in_axes.push_back(axes[i] < 0 ? -1 : 0);
    }
    auto [outs, out_axes] = rules_->vmap(xs, in_axes);
    for (std::size_t j = 0; j < outs.size() && j < outputs_.shapes.size(); ++j) {
      outs[j] = batched(outs[j], out_axes[j], outputs_.shapes[j]);
      out_axes[j] = out_axes[j] < 0 ? -1 : 0;
    }
    return {outs, out_axes};
  }

  const char* name() const override { return "MetileOp"; }
  bool is_equivalent(const mx::Primitive& other) const override { return this == &other; }
  // Refused as the first launch refuses (by its kernel's name): a kernel is built for the
  // shapes it was traced with.
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    for (const Step& step : steps_) {
      const char* n = step.primitive->name();
      if (metile_launch(n) || std::strcmp(n, "MetileOp") == 0) {
        return step.primitive->output_shapes(inputs);
      }
    }
    metile::refuse_shapeless(rules_->name);
  }

  // Whether output i is written by a launch that allocates it row-contiguous.
  bool row_contiguous_output(std::size_t i) const {
    return i < contiguous_out_.size() && contiguous_out_[i];
  }

 private:
  // The forward's nodes in order; the arrays they write that the op does not return are
  // temporaries made here, kept alive until the stream has run what reads them (MLX's
  // encoders' temporaries: what MLX does for its own primitives' scratch arrays).
  void run(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs, bool gpu) {
    // (each made by the step that writes it, with its primitive: an eval may ask its output
    // for its primitive's stream, as MLX's reshape does when it copies)
    std::vector<std::optional<mx::array>> temps(temps_.shapes.size());
    auto slot = [&](int s) -> const mx::array& {
      return s < visible_ ? outputs[s] : *temps[s - visible_];
    };
    for (const Step& step : steps_) {
      std::vector<mx::array> in;
      in.reserve(step.in.size());
      for (int r : step.in) in.push_back(r >= 0 ? inputs[r] : slot(-1 - r));
      // (copies of the handles: the step's eval sets the data of the arrays they share)
      std::vector<mx::array> out;
      out.reserve(step.out.size());
      for (int o : step.out) {
        if (o >= visible_) {
          temps[o - visible_].emplace(temps_.shapes[o - visible_], temps_.dtypes[o - visible_],
                                      step.primitive, std::vector<mx::array>{});
        }
        out.push_back(slot(o));
      }
      if (gpu) {
        step.primitive->eval_gpu(in, out);
      } else {
        step.primitive->eval_cpu(in, out);
      }
    }
    if (temps.empty()) return;
    std::vector<mx::array> kept;
    kept.reserve(temps.size());
    for (auto& t : temps) kept.push_back(std::move(*t));
    if (gpu) {
      gpu_keep_alive()(stream(), std::move(kept));
    } else {
      mx::cpu::get_command_encoder(stream()).add_temporaries(std::move(kept));
    }
  }

  static mx::array shaped(const mx::array& a, const mx::Shape& shape) {
    return a.shape() == shape ? a : mx::reshape(a, shape);
  }

  // `a` batched along `axis` (-1: not batched) as (batch, *shape) (or `shape`)
  static mx::array batched(const mx::array& a, int axis, const mx::Shape& shape) {
    if (axis < 0) return shaped(a, shape);
    mx::array front = axis == 0 ? a : mx::moveaxis(a, axis, 0);
    mx::Shape full{front.shape(0)};
    full.insert(full.end(), shape.begin(), shape.end());
    return shaped(front, full);
  }

  std::vector<mx::array> rule_primals(const std::vector<mx::array>& inputs) const {
    std::vector<mx::array> ps;
    for (int i = 0; i < primals_; ++i) ps.push_back(shaped(inputs[i], rule_in_[i]));
    return ps;
  }

  std::vector<Step> steps_;
  ArraysOf outputs_, temps_;   // (the temporaries: slots visible_ and on)
  int sources_;
  int primals_, visible_;
  std::vector<mx::Shape> rule_in_, rule_out_;
  std::vector<bool> contiguous_out_;
  std::shared_ptr<const OpRules> rules_;
};

// Whether fuse_op makes OpNodes (else every op keeps mx.custom_function's nodes): off only
// to measure what the OpNode saves (_ext.fuse_ops, tools/probes/decode_fixed_cost.py).
inline bool& fusing_ops() {
  static bool on = true;
  return on;
}

// A reshape the op ran on an array before its forward (its rows), which the node can take
// in: an unevaluated Reshape or Flatten of one array.
inline bool absorbable_reshape(const mx::array& a) {
  if (a.is_available() || !a.has_primitive() || a.inputs().size() != 1 || a.siblings().size()) {
    return false;
  }
  const char* n = a.primitive().name();
  return std::strcmp(n, "Reshape") == 0 || std::strcmp(n, "Flatten") == 0;
}

// `outputs` (computed lazily from `primals` by an op's forward) as the visible outputs of
// one OpNode carrying `rules`; nullopt where the forward cannot be one (a node OpNode does
// not run, nodes on more than one stream, an output that is a primal or computed from
// none, an array read that a transform traces but is not a primal).  The node's inputs are
// the primals - or, for a primal that is a reshape of another array (the op's rows), that
// array, the reshape run inside - then what else the forward reads; with `shapes`, output
// j is reshaped to shapes[j] inside the node too.  The rules see the primals and outputs
// as the forward does.
inline std::optional<std::vector<mx::array>> fuse_op(
    const std::vector<mx::array>& primals, std::vector<mx::array> outputs,
    std::shared_ptr<const OpRules> rules,
    const std::vector<std::optional<mx::Shape>>& shapes = {}) {
  if (outputs.empty() || !fusing_ops()) return std::nullopt;
  if (!shapes.empty() && shapes.size() != outputs.size()) return std::nullopt;
  std::vector<mx::Shape> rule_in, rule_out;
  std::unordered_map<std::uintptr_t, int> input_of;  // array id -> OpNode input
  std::vector<mx::array> inputs;
  for (const auto& p : primals) {
    rule_in.push_back(p.shape());
    mx::array taken = absorbable_reshape(p) && !input_of.count(p.inputs()[0].id())
        ? p.inputs()[0] : p;
    if (input_of.count(taken.id())) taken = p;   // (one array given twice: as given)
    input_of.emplace(taken.id(), int(inputs.size()));
    inputs.push_back(taken);
  }
  const int n_primals = int(inputs.size());
  // the arrays primals are basic slices of: a forward may read such a source in place of
  // its slice (a KV cache's buffer for the cache's prefix, attention_ops._cache_view).  They
  // are inputs after the primals, and what the forward computes from them is the node's:
  // their derivatives (zero here) and batching reach the op through the slice primals
  for (const auto& p : primals) {
    auto slice = lazy_slice(p);
    if (slice && !input_of.count(slice->source.id())) {
      input_of.emplace(slice->source.id(), int(inputs.size()));
      inputs.push_back(slice->source);
    }
  }
  const int n_read = int(inputs.size());
  for (std::size_t j = 0; j < outputs.size(); ++j) {
    rule_out.push_back(outputs[j].shape());
    if (!shapes.empty() && shapes[j] && *shapes[j] != outputs[j].shape()) {
      outputs[j] = mx::reshape(outputs[j], *shapes[j]);
    }
  }
  // depends[id]: whether the array is computed from a node input that is a primal
  std::unordered_map<std::uintptr_t, bool> depends;
  std::function<bool(const mx::array&)> reaches = [&](const mx::array& a) -> bool {
    if (auto it = input_of.find(a.id()); it != input_of.end()) return it->second < n_read;
    if (auto it = depends.find(a.id()); it != depends.end()) return it->second;
    bool found = false;
    if (a.has_primitive() && !a.is_available()) {
      for (const auto& in : a.inputs()) found = reaches(in) || found;
    }
    depends[a.id()] = found;
    return found;
  };
  // the forward's nodes in evaluation order (producers first), each once
  std::vector<mx::array> order;
  std::unordered_map<const mx::Primitive*, bool> seen;
  bool ok = true;
  std::function<void(const mx::array&)> visit = [&](const mx::array& a) {
    if (!ok || input_of.count(a.id()) || !reaches(a)) return;
    const mx::Primitive* p = &a.primitive();
    if (seen.count(p)) return;
    seen[p] = true;
    if (!fusable_primitive(p->name()) ||
        !(a.primitive().stream() == outputs[0].primitive().stream())) {
      if (debug_op_nodes()) {
        // (why an op keeps mx.custom_function's nodes: a GPU run can say it in one call)
        std::fprintf(stderr, "metile: an op is not one MetileOp: its forward has %s%s\n",
                     p->name(), fusable_primitive(p->name()) ? " on another stream" : "");
      }
      ok = false;
      return;
    }
    for (const auto& in : a.inputs()) visit(in);
    order.push_back(a);
  };
  for (const auto& o : outputs) {
    if (!o.has_primitive() || o.is_available() || input_of.count(o.id()) || !reaches(o)) {
      return std::nullopt;
    }
    visit(o);
  }
  if (!ok) return std::nullopt;

  // slots: the op's outputs first, then every other array the nodes write (temporaries)
  std::unordered_map<std::uintptr_t, int> slot_of;
  ArraysOf made, temps;
  std::vector<bool> contiguous;
  // written row-contiguous: by a launch (its eval allocates), or a reshape of such
  std::function<bool(const mx::array&)> fresh = [&](const mx::array& a) -> bool {
    if (metile_launch(a.primitive().name())) return true;
    return absorbable_reshape(a) && a.inputs()[0].has_primitive() &&
           !a.inputs()[0].is_available() && fresh(a.inputs()[0]);
  };
  for (const auto& o : outputs) {
    if (slot_of.count(o.id())) return std::nullopt;   // (one array returned twice)
    slot_of.emplace(o.id(), int(made.shapes.size()));
    made.shapes.push_back(o.shape());
    made.dtypes.push_back(o.dtype());
    contiguous.push_back(fresh(o));
  }
  for (const auto& a : order) {
    for (const auto& s : a.outputs()) {
      if (slot_of.count(s.id())) continue;
      slot_of.emplace(s.id(), int(outputs.size() + temps.shapes.size()));
      temps.shapes.push_back(s.shape());
      temps.dtypes.push_back(s.dtype());
    }
  }
  std::vector<OpNode::Step> steps;
  for (const auto& a : order) {
    OpNode::Step step{a.primitive_ptr(), {}, {}};
    for (const auto& in : a.inputs()) {
      if (auto it = slot_of.find(in.id()); it != slot_of.end()) {
        step.in.push_back(-1 - it->second);
        continue;
      }
      auto it = input_of.find(in.id());
      if (it == input_of.end()) {
        // read, not computed from a primal: an OpNode input of its own, which no transform
        // may be tracing (its derivative would be lost)
        if (in.is_tracer()) return std::nullopt;
        it = input_of.emplace(in.id(), int(inputs.size())).first;
        inputs.push_back(in);
      }
      step.in.push_back(it->second);
    }
    for (const auto& s : a.outputs()) step.out.push_back(slot_of.at(s.id()));
    steps.push_back(std::move(step));
  }
  mx::Stream stream = outputs[0].primitive().stream();
  if (!temps.shapes.empty() && stream.device.type == mx::Device::gpu && !gpu_keep_alive()) {
    return std::nullopt;
  }
  auto node = std::make_shared<OpNode>(stream, std::move(steps), std::move(rule_in),
                                       std::move(rule_out), made, std::move(contiguous),
                                       std::move(temps), std::move(rules), n_read - n_primals);
  return mx::array::make_arrays(std::move(made.shapes), std::move(made.dtypes), node,
                                std::move(inputs));
}

}  // namespace metile
