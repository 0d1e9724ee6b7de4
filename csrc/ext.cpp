// metile._ext: the C++ layer between metile's Python runtime and MLX.
//
// Built with NB_DOMAIN mlx so nanobind shares MLX's type registry: functions
// here take and return mx.array / mx.Stream / mx.Dtype directly.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string_view>
#include <unordered_map>

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "cubin_check.h"
#include "input_layout.h"
#include "no_vjp.h"
#include "op_node.h"
#include "mlx/device.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"
#ifdef METILE_HAVE_MLX_CUDA
#include "cuda_launch.h"
#endif
#ifdef METILE_HAVE_MSL_CPU
#include "msl_cpu/primitive.h"
#else
#include "metile_msl/abi.h"
#endif

namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

using Dim3 = std::tuple<int, int, int>;

std::array<std::uint32_t, 3> to_dims(const Dim3& d, const char* what) {
  auto [x, y, z] = d;
  if (x < 0 || y < 0 || z < 0) {
    throw std::invalid_argument(std::string("[metal_kernel] ") + what + " dimensions must be non-negative");
  }
  return {std::uint32_t(x), std::uint32_t(y), std::uint32_t(z)};
}

std::vector<mx::Shape> to_shapes(const std::vector<std::vector<int>>& shapes) {
  std::vector<mx::Shape> out;
  for (auto& s : shapes) out.emplace_back(s.begin(), s.end());
  return out;
}

#ifdef METILE_HAVE_MSL_CPU
using namespace metile::msl_cpu;

LaunchSpec cpu_spec(const std::string& name, const std::vector<std::tuple<bool, bool, bool>>& shape_infos,
                    Dim3 grid, Dim3 threadgroup, std::optional<float> init_value,
                    const std::string& lane_order, bool race_check,
                    const std::vector<std::tuple<bool, double, double>>& race_compare,
                    bool bounds_check, const std::vector<std::string>& buffer_names,
                    const std::string& no_vjp) {
  LaunchSpec spec;
  spec.name = name;
  spec.shape_infos = shape_infos;
  spec.dispatch.grid = to_dims(grid, "grid");
  spec.dispatch.threadgroup = to_dims(threadgroup, "threadgroup");
  spec.dispatch.order = parse_lane_order(lane_order);
  spec.dispatch.kernel = name;
  spec.init_value = init_value;
  spec.race_check = race_check;
  for (auto [compare, rtol, atol] : race_compare) spec.race_compare.push_back({compare, rtol, atol});
  spec.bounds_check = bounds_check;
  spec.buffer_names = buffer_names;
  spec.no_vjp = no_vjp;
  return spec;
}

std::vector<mx::array> launch_cpu(std::shared_ptr<KernelLibrary> library, const std::string& name,
                                  const std::vector<mx::array>& inputs,
                                  const std::vector<std::tuple<bool, bool, bool>>& shape_infos,
                                  const std::vector<std::vector<int>>& output_shapes,
                                  const std::vector<mx::Dtype>& output_dtypes, Dim3 grid,
                                  Dim3 threadgroup, std::optional<float> init_value,
                                  const std::string& lane_order, bool race_check,
                                  const std::vector<std::tuple<bool, double, double>>& race_compare,
                                  bool bounds_check, const std::vector<std::string>& buffer_names,
                                  mx::Stream stream, const std::string& no_vjp) {
  LaunchSpec spec = cpu_spec(name, shape_infos, grid, threadgroup, init_value, lane_order,
                             race_check, race_compare, bounds_check, buffer_names, no_vjp);
  spec.output_shapes = to_shapes(output_shapes);
  spec.output_dtypes = output_dtypes;
  return launch(std::move(library), std::make_shared<const LaunchSpec>(std::move(spec)), inputs,
                stream);
}

// A CPU-runtime launch with everything but its arrays converted once (MetalKernel.bind):
// a relaunch pays for no argument conversion, nor for a Python call per input to make it
// contiguous.  Called without a stream it takes the default device's, and answers None
// when that is not the CPU (the caller routes the launch again).
class CpuLaunch {
 public:
  CpuLaunch(std::shared_ptr<KernelLibrary> library, LaunchSpec spec, std::vector<mx::Shape> shapes,
            std::vector<mx::Dtype> dtypes, bool contiguous)
      : library_(std::move(library)), contiguous_(contiguous) {
    spec.require_row_contiguous = contiguous;
    spec.output_shapes = std::move(shapes);
    spec.output_dtypes = std::move(dtypes);
    // shared by every launch and the evaluations they queue: a launch copies no strings
    spec_ = std::make_shared<const LaunchSpec>(std::move(spec));
  }

  std::optional<std::vector<mx::array>> operator()(std::vector<mx::array> inputs,
                                                   std::optional<mx::Stream> stream) const {
    mx::Stream s = stream ? *stream : mx::default_stream(mx::default_device());
    if (s.device.type != mx::Device::cpu) return std::nullopt;
    if (contiguous_) {
      // as MetalKernel's launch does, but not for an input known to be row-contiguous, for
      // which contiguous() would only add a node sharing its buffer (input_layout.h)
      for (auto& x : inputs) {
        if (x.ndim() > 0 && !metile::row_contiguous_when_evaluated(x)) {
          x = mx::contiguous(x, false, s);
        }
      }
    }
    return launch(library_, spec_, inputs, s);
  }

 private:
  std::shared_ptr<KernelLibrary> library_;
  std::shared_ptr<const LaunchSpec> spec_;
  bool contiguous_;
};

#endif

// Metal devices: hand the kernel to MLX's own metal_kernel, built from C++.
std::vector<mx::array> launch_metal(
    const std::string& name, const std::vector<std::string>& input_names,
    const std::vector<std::string>& output_names, const std::string& source,
    const std::string& header, bool ensure_row_contiguous, bool atomic_outputs, int math_mode,
    const std::vector<mx::array>& inputs, const std::vector<std::vector<int>>& output_shapes,
    const std::vector<mx::Dtype>& output_dtypes, Dim3 grid, Dim3 threadgroup,
    const std::vector<std::pair<std::string, mx::fast::TemplateArg>>& template_args,
    std::optional<float> init_value, bool verbose, mx::Stream stream) {
  mx::CompileOptions options;
  options.math_mode = static_cast<mx::MathMode>(math_mode);
  auto kernel = mx::fast::metal_kernel(name, input_names, output_names, source, header,
                                       ensure_row_contiguous, atomic_outputs, options);
  return kernel(inputs, to_shapes(output_shapes), output_dtypes, grid, threadgroup, template_args,
                init_value, verbose, stream);
}

using Launch = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

// `launch(inputs)`; with a `no_vjp` message, under a custom vjp that raises it
// (metile::NoVjp, Python's LaunchError): a launch through MLX's own primitive refuses a
// gradient as metile's primitives do, without a Python mx.custom_function around every
// launch (runtime/dispatch.py, Dispatch._launch).  The same MLX node either way.
std::vector<mx::array> refusing_vjp(Launch launch, const std::vector<mx::array>& inputs,
                                    const std::string& no_vjp) {
  if (no_vjp.empty()) return launch(inputs);
  auto refuse = [no_vjp](const std::vector<mx::array>&, const std::vector<mx::array>&,
                         const std::vector<mx::array>&) -> std::vector<mx::array> {
    throw metile::NoVjp(no_vjp);
  };
  return mx::custom_vjp(std::move(launch), std::move(refuse))(inputs);
}

// NVIDIA devices: CUDA C++ through mlx::core::fast::cuda_kernel (MLX's
// CUDA backend compiles it with NVRTC and caches it).
std::vector<mx::array> launch_cuda(
    const std::string& name, const std::vector<std::string>& input_names,
    const std::vector<std::string>& output_names, const std::string& source,
    const std::string& header, bool ensure_row_contiguous, int shared_memory,
    const std::vector<mx::array>& inputs, const std::vector<std::vector<int>>& output_shapes,
    const std::vector<mx::Dtype>& output_dtypes, Dim3 grid, Dim3 threadgroup,
    const std::vector<std::pair<std::string, mx::fast::TemplateArg>>& template_args,
    std::optional<float> init_value, bool verbose, mx::Stream stream, const std::string& no_vjp) {
  auto kernel = mx::fast::cuda_kernel(name, input_names, output_names, source, header,
                                      ensure_row_contiguous, shared_memory);
  auto shapes = to_shapes(output_shapes);
  return refusing_vjp(
      [&](const std::vector<mx::array>& in) {
        return kernel(in, shapes, output_dtypes, grid, threadgroup, template_args, init_value,
                      verbose, stream);
      },
      inputs, no_vjp);
}

// launch_cuda with everything but the arrays fixed and converted once, MLX's kernel
// function made once (CudaKernel.bind, for a relaunch of the same signature).  Called
// without a stream it takes the default device's, and answers None when that is not a
// GPU (the caller routes the launch again).
class CudaSourceLaunch {
 public:
  CudaSourceLaunch(const std::string& name, const std::vector<std::string>& input_names,
                   const std::vector<std::string>& output_names, const std::string& source,
                   const std::string& header, bool ensure_row_contiguous, int shared_memory,
                   const std::vector<std::vector<int>>& output_shapes,
                   std::vector<mx::Dtype> output_dtypes, Dim3 grid, Dim3 threadgroup,
                   std::vector<std::pair<std::string, mx::fast::TemplateArg>> template_args,
                   std::optional<float> init_value, std::string no_vjp)
      : name_(name), input_names_(input_names), output_names_(output_names), source_(source),
        header_(header), contiguous_(ensure_row_contiguous), shared_memory_(shared_memory),
        shapes_(to_shapes(output_shapes)), dtypes_(std::move(output_dtypes)), grid_(grid),
        threadgroup_(threadgroup), template_args_(std::move(template_args)),
        init_value_(init_value), no_vjp_(std::move(no_vjp)) {}

  std::optional<std::vector<mx::array>> operator()(const std::vector<mx::array>& arrays,
                                                   std::optional<mx::Stream> stream) const {
    mx::Stream s = stream ? *stream : mx::default_stream(mx::default_device());
    if (s.device.type != mx::Device::gpu) return std::nullopt;
    // made at the first launch on a GPU: without MLX's CUDA backend making it raises, and a
    // binding made there (stand-in tests) only ever answers None
    if (!kernel_) {
      kernel_ = mx::fast::cuda_kernel(name_, input_names_, output_names_, source_, header_,
                                      contiguous_, shared_memory_);
    }
    return refusing_vjp(
        [&](const std::vector<mx::array>& in) {
          return (*kernel_)(in, shapes_, dtypes_, grid_, threadgroup_, template_args_, init_value_,
                         false, s);
        },
        arrays, no_vjp_);
  }

 private:
  std::string name_;
  std::vector<std::string> input_names_, output_names_;
  std::string source_, header_;
  bool contiguous_;
  int shared_memory_;
  mutable std::optional<mx::fast::CustomKernelFunction> kernel_;  // (calls hold the GIL)
  std::vector<mx::Shape> shapes_;
  std::vector<mx::Dtype> dtypes_;
  Dim3 grid_, threadgroup_;
  std::vector<std::pair<std::string, mx::fast::TemplateArg>> template_args_;
  std::optional<float> init_value_;
  std::string no_vjp_;
};

// A cubin holds NUL bytes: the size must be explicit, never strlen.
std::string image_of(const nb::bytes& image) {
  return std::string(static_cast<const char*>(image.data()), image.size());
}

// Scalars a cubin takes by value (bool, int or float: a kernel's runtime scalars under
// METILE_CUDA_SCALARS=value; otherwise they travel as 0-d inputs).
std::vector<mx::fast::ScalarArg> to_scalars(const std::vector<nb::object>& scalars) {
  std::vector<mx::fast::ScalarArg> values;
  for (const auto& v : scalars) {
    // bool before int: a Python bool is an int
    if (nb::isinstance<nb::bool_>(v)) {
      values.emplace_back(nb::cast<bool>(v));
    } else if (nb::isinstance<nb::int_>(v)) {
      values.emplace_back(nb::cast<int>(v));
    } else if (nb::isinstance<nb::float_>(v)) {
      values.emplace_back(nb::cast<float>(v));
    } else {
      throw std::invalid_argument("[metile] a scalar passed by value must be a bool, int or float");
    }
  }
  return values;
}

// NVIDIA devices, a cubin metile compiled itself (runtime/nvrtc.py) for an
// architecture MLX's NVRTC does not target (sm_90a for wgmma), through MLX's
// precompiled_cuda_kernel (METILE_CUDA_LAUNCH=mlx, or where the C++ layer has no CUDA
// launch of its own: launch_cuda_function).  MLX 0.32.4 keys its module cache by the
// name and a hash of the image it computes at every evaluation.  Arguments are each
// input's pointer, then each output's, then `scalars` by value.
std::vector<mx::array> launch_precompiled_cuda(
    const std::string& name, const nb::bytes& compiled, const std::vector<mx::array>& inputs,
    const std::vector<std::vector<int>>& output_shapes, const std::vector<mx::Dtype>& output_dtypes,
    Dim3 grid, Dim3 threadgroup, int shared_memory, std::optional<float> init_value,
    bool ensure_row_contiguous, mx::Stream stream, const std::vector<nb::object>& scalars,
    const std::string& no_vjp) {
  auto image = image_of(compiled);
  auto shapes = to_shapes(output_shapes);
  auto values = to_scalars(scalars);
  return refusing_vjp(
      [&](const std::vector<mx::array>& in) {
        return mx::fast::precompiled_cuda_kernel(name, image, in, shapes, output_dtypes, values,
                                                 grid, threadgroup, shared_memory, init_value,
                                                 ensure_row_contiguous, stream);
      },
      inputs, no_vjp);
}

#ifdef METILE_HAVE_MLX_CUDA

std::vector<mx::array> launch_cuda_function(
    std::shared_ptr<metile::cuda::CudaFunction> fn, std::vector<mx::array> inputs,
    const std::vector<std::vector<int>>& output_shapes, const std::vector<mx::Dtype>& output_dtypes,
    Dim3 grid, Dim3 threadgroup, const std::vector<nb::object>& scalars, bool ensure_row_contiguous,
    mx::Stream stream, const std::string& no_vjp) {
  auto [gx, gy, gz] = grid;
  auto [tx, ty, tz] = threadgroup;
  return metile::cuda::launch(
      metile::cuda::configure(std::move(fn), to_shapes(output_shapes), output_dtypes,
                              {gx, gy, gz}, {tx, ty, tz}, to_scalars(scalars),
                              ensure_row_contiguous, no_vjp),
      std::move(inputs), stream);
}

// launch_cuda_function with everything but the arrays converted once (CudaKernel.bind):
// `kept` picks the kernel's pointer inputs from the arrays it is called with (the others
// travel by value, in `scalars`).  Called without a stream it takes the default device's,
// and answers None when that is not a GPU (the caller routes the launch again).
class CudaLaunch {
 public:
  CudaLaunch(std::shared_ptr<metile::cuda::CudaFunction> fn, std::vector<int> kept,
             const std::vector<std::vector<int>>& output_shapes, std::vector<mx::Dtype> output_dtypes,
             Dim3 grid, Dim3 threadgroup, const std::vector<nb::object>& scalars,
             bool ensure_row_contiguous, std::string no_vjp)
      : kept_(std::move(kept)) {
    auto [gx, gy, gz] = grid;
    auto [tx, ty, tz] = threadgroup;
    config_ = metile::cuda::configure(std::move(fn), to_shapes(output_shapes),
                                      std::move(output_dtypes), {gx, gy, gz}, {tx, ty, tz},
                                      to_scalars(scalars), ensure_row_contiguous,
                                      std::move(no_vjp));
  }

  std::optional<std::vector<mx::array>> operator()(const std::vector<mx::array>& arrays,
                                                   std::optional<mx::Stream> stream) const {
    mx::Stream s = stream ? *stream : mx::default_stream(mx::default_device());
    if (s.device.type != mx::Device::gpu) return std::nullopt;
    return metile::cuda::launch(config_, kept_inputs(arrays), s);
  }

  // The kernel's pointer inputs among the arrays the launch is called with.
  std::vector<mx::array> kept_inputs(const std::vector<mx::array>& arrays) const {
    std::vector<mx::array> inputs;
    inputs.reserve(kept_.size());
    for (int i : kept_) inputs.push_back(arrays.at(i));
    return inputs;
  }

  // Host nanoseconds a call of each part of this launch takes, over `n` calls each: where
  // a bound launch's time goes on a GPU host, which no sampling profiler there can see
  // (tools/probes/launch_parts.py).  The launches' outputs are dropped unevaluated.
  std::map<std::string, double> time_parts(const std::vector<mx::array>& arrays, int n) const {
    using clock = std::chrono::steady_clock;
    auto per = [n](auto&& f) {
      auto t = clock::now();
      for (int i = 0; i < n; ++i) f();
      return std::chrono::duration<double, std::nano>(clock::now() - t).count() / n;
    };
    volatile int sink = 0;
    std::map<std::string, double> out;
    out["default device's stream"] = per([&] {
      sink = mx::default_stream(mx::default_device()).index;
    });
    mx::Stream s = mx::default_stream(mx::default_device());
    out["inputs vector"] = per([&] { sink = int(kept_inputs(arrays).size()); });
    out["loaded function lookup"] = per([&] { config_->fn->function(s.device.index); });
    out["launch on a given stream"] = per([&] { sink = int((*this)(arrays, s)->size()); });
    out["launch on the default stream"] = per([&] {
      sink = int((*this)(arrays, std::nullopt)->size());
    });
    return out;
  }

 private:
  std::vector<int> kept_;
  std::shared_ptr<const metile::cuda::LaunchConfig> config_;
};
#endif

// Type first, then value: True == 1 and 1.0 == 1 must not pass for one another (the
// launch key holds each value with its type, runtime/dispatch.py).
bool same_value(PyObject* a, PyObject* b) {
  if (a == b) return true;
  if (Py_TYPE(a) != Py_TYPE(b)) return false;
  if (PyFloat_CheckExact(a)) {
    // -0.0 == 0.0, but a kernel dividing by one gives -inf where the other gives +inf
    const double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
    return x == y && std::signbit(x) == std::signbit(y);
  }
  int equal = PyObject_RichCompareBool(a, b, Py_EQ);
  if (equal < 0) {
    PyErr_Clear();
    return false;
  }
  return equal == 1;
}

// A grid as the launch key compares it: a tuple or list by its items (each with its
// type), anything else as a value.
bool same_grid(PyObject* a, PyObject* b) {
  bool a_seq = PyTuple_Check(a) || PyList_Check(a), b_seq = PyTuple_Check(b) || PyList_Check(b);
  if (!a_seq || !b_seq) return !a_seq && !b_seq && same_value(a, b);
  nb::tuple x = nb::steal<nb::tuple>(PySequence_Tuple(a)), y = nb::steal<nb::tuple>(PySequence_Tuple(b));
  Py_ssize_t n = PyTuple_GET_SIZE(x.ptr());
  if (n != PyTuple_GET_SIZE(y.ptr())) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!same_value(PyTuple_GET_ITEM(x.ptr(), i), PyTuple_GET_ITEM(y.ptr(), i))) return false;
  }
  return true;
}

// A number that changes whenever a watched dict (os.environ's) is modified, or 0 where
// none can be had: a check that passed at one epoch passes while it holds, with no
// lookup.  Python 3.12 deprecated the dicts' version tags (PEP 509) for dict watchers,
// so those count modifications there; before 3.12 the dict's own version tag is it.
// (A check reads a dozen settings, each a dict lookup of ~25 ns, on every repeated
// launch and op call.)
#if PY_VERSION_HEX >= 0x030C0000
std::uint64_t g_environ_epoch = 1;
int g_environ_watcher = -2;   // -2: not registered yet, -1: none to be had

int on_environ_change(PyDict_WatchEvent, PyObject*, PyObject*, PyObject*) {
  ++g_environ_epoch;
  return 0;
}

bool watch_environ(PyObject* dict) {
  if (g_environ_watcher == -2) {
    g_environ_watcher = PyDict_AddWatcher(on_environ_change);
    if (g_environ_watcher < 0) {
      PyErr_Clear();
      g_environ_watcher = -1;
    }
  }
  if (g_environ_watcher < 0) return false;
  if (PyDict_Watch(g_environ_watcher, dict) < 0) {
    PyErr_Clear();
    return false;
  }
  return true;
}

std::uint64_t environ_epoch(PyObject*) { return g_environ_epoch; }
#else
bool watch_environ(PyObject*) { return true; }

std::uint64_t environ_epoch(PyObject* dict) {
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
}
#endif

// The raw values some METILE_* settings had when a launch was resolved (settings.raw_source:
// os.environ's dict and the encoded names), compared by identity first, then by value -
// once per change of the dict (environ_epoch): a check that passed is not repeated until
// the dict is modified.
class EnvCheck {
 public:
  // With `counted` (names, or a name's start ending in '*'), the number of variables
  // those match is part of the check too: a replay reads every METILE_* variable set when
  // it was recorded, so one set since - even where another was removed and the count of
  // all variables is unchanged - fails it.
  EnvCheck(nb::dict environ, nb::tuple keys, nb::tuple values,
           std::vector<std::string> counted = {})
      : environ_(std::move(environ)), watched_(watch_environ(environ_.ptr())),
        counted_(std::move(counted)) {
    if (keys.size() != values.size()) {
      throw std::invalid_argument("[metile] one environment value per key");
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      nb::object v = nb::borrow(values[i]);
      env_.emplace_back(nb::borrow(keys[i]), v.is_none() ? nb::object() : v);
    }
    if (!counted_.empty()) matching_ = count_matching();
  }

  // Whether every setting still has its value (false too where the dict cannot be read).
  bool same() const {
    if (!watched_) return compare();
    std::uint64_t now = environ_epoch(environ_.ptr());
    if (has_passed_ && now == passed_) return true;
    if (!compare()) return false;
    passed_ = now;
    has_passed_ = true;
    return true;
  }

  Py_ssize_t size() const { return PyDict_GET_SIZE(environ_.ptr()); }

 private:
  // How many of the dict's keys (bytes on POSIX, str elsewhere) `counted_` matches; -1
  // where a key cannot be read.
  Py_ssize_t count_matching() const {
    Py_ssize_t found = 0, pos = 0;
    PyObject *key = nullptr, *value = nullptr;
    while (PyDict_Next(environ_.ptr(), &pos, &key, &value)) {
      const char* text = nullptr;
      Py_ssize_t n = 0;
      if (PyBytes_Check(key)) {
        text = PyBytes_AS_STRING(key);
        n = PyBytes_GET_SIZE(key);
      } else if (PyUnicode_Check(key)) {
        text = PyUnicode_AsUTF8AndSize(key, &n);
        if (!text) {
          PyErr_Clear();
          return -1;
        }
      } else {
        continue;
      }
      std::string_view name(text, std::size_t(n));
      for (const auto& c : counted_) {
        bool prefix = !c.empty() && c.back() == '*';
        std::string_view want(c.data(), c.size() - (prefix ? 1 : 0));
        if (prefix ? name.substr(0, want.size()) == want : name == want) {
          ++found;
          break;
        }
      }
    }
    return found;
  }

  bool compare() const {
    PyObject* env = environ_.ptr();
    if (!counted_.empty() && count_matching() != matching_) return false;
    for (auto& [key, value] : env_) {
      PyObject* now = PyDict_GetItemWithError(env, key.ptr());
      if (now == nullptr && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      if (now != value.ptr() && (now == nullptr || !value.is_valid() || !same_value(now, value.ptr()))) {
        return false;
      }
    }
    return true;
  }

  nb::dict environ_;
  bool watched_;
  mutable bool has_passed_ = false;
  mutable std::uint64_t passed_ = 0;   // the epoch of the last comparison that passed
  std::vector<std::pair<nb::object, nb::object>> env_;  // (encoded name, raw value; unset: none)
  std::vector<std::string> counted_;
  Py_ssize_t matching_ = 0;   // how many variables counted_ matched when recorded
};

// (the arrays by value: a caller done with its vector moves it in, and a launch that keeps
// them all - the CPU runtime's - takes them without copying each again)
using Bound = std::function<std::optional<std::vector<mx::array>>(std::vector<mx::array>)>;

// A launch bound by a launcher (CudaLaunch, CudaSourceLaunch, CpuLaunch: the default
// device's stream at each call) as a C++ call; any other callable through Python.
// `launch` called natively when it is an L (its default-device call), else nothing.
template <typename L>
std::optional<Bound> native_launch(const std::shared_ptr<nb::object>& launch) {
  if (!nb::isinstance<L>(*launch)) return std::nullopt;
  auto* l = nb::inst_ptr<L>(*launch);
  return Bound([launch, l](std::vector<mx::array> in) {
    return (*l)(std::move(in), std::nullopt);
  });
}

// `launch` called natively when it is one of the launchers' bound launches, else nothing.
std::optional<Bound> native_bound(const std::shared_ptr<nb::object>& launch) {
#ifdef METILE_HAVE_MSL_CPU
  if (auto bound = native_launch<CpuLaunch>(launch)) return bound;
#endif
#ifdef METILE_HAVE_MLX_CUDA
  if (auto bound = native_launch<CudaLaunch>(launch)) return bound;
#endif
  return native_launch<CudaSourceLaunch>(launch);
}

Bound bound_launch(std::shared_ptr<nb::object> launch) {
  if (auto bound = native_bound(launch)) return *bound;
  return [launch](std::vector<mx::array> in) -> std::optional<std::vector<mx::array>> {
    nb::gil_scoped_acquire gil;
    nb::object outs = (*launch)(in);
    if (outs.is_none()) return std::nullopt;
    return nb::cast<std::vector<mx::array>>(outs);
  };
}

// The signature of the call a Dispatch was resolved for (runtime/dispatch.py): its grid,
// each positional argument (an array's dtype and shape, a scalar's type and value), the
// keyword options, the launch environment's raw values and the default device's type.
// Called with a new call's (grid, args, kwargs) it answers, in one call instead of
// building and hashing the launch key, None when any of these differ or when an argument
// is one of the outputs (the caller's slow path re-resolves, or raises naming them), else
// the kernel's inputs: per input either the argument at its position or the array the
// Dispatch keeps (a scalar's 0-d array, the tensor-map templates).
class LaunchGuard {
 public:
  LaunchGuard(nb::object grid, nb::tuple args, nb::dict kwargs, nb::dict environ, nb::tuple env_keys,
              nb::tuple env_values, mx::Device::DeviceType device, nb::list plan,
              std::vector<int> outputs)
      : grid_(std::move(grid)), env_(std::move(environ), env_keys, env_values), device_(device),
        outputs_(std::move(outputs)) {
    array_type_ = nb::type<mx::array>().ptr();
    if (array_type_ == nullptr) throw std::runtime_error("[metile] mx.array is not registered");
    for (nb::handle a : args) {
      Arg arg;
      arg.type = Py_TYPE(a.ptr());
      if (arg.type == reinterpret_cast<PyTypeObject*>(array_type_)) {
        auto& x = nb::cast<mx::array&>(a);
        arg.dtype = x.dtype();
        arg.shape = x.shape();
      } else {
        arg.value = nb::borrow(a);
      }
      args_.push_back(std::move(arg));
    }
    for (auto [k, v] : kwargs) options_.emplace_back(nb::borrow(k), nb::borrow(v));
    for (nb::handle p : plan) {
      if (PyLong_Check(p.ptr())) {
        plan_.emplace_back(nb::cast<int>(p), nb::object());
      } else {
        plan_.emplace_back(-1, nb::borrow(p));
      }
    }
    std::vector<bool> is_output(args_.size(), false);
    for (int o : outputs_) {
      if (o < 0 || o >= int(args_.size())) throw std::invalid_argument("[metile] output position");
      is_output[o] = true;
    }
    for (int i = 0; i < int(args_.size()); ++i) {
      if (!is_output[i]) others_.push_back(i);
    }
    for (auto& [i, fixed] : plan_) {
      if (i >= int(args_.size())) throw std::invalid_argument("[metile] input position");
    }
  }

  // Whether a call matches the resolved signature (and its outputs alias nothing).
  bool matches(nb::handle grid, nb::handle args, nb::handle kwargs) const {
    if (mx::default_device().type != device_ || !env_.same()) return false;
    if (!PyTuple_Check(args.ptr()) || !PyDict_Check(kwargs.ptr())) return false;
    PyObject* a = args.ptr();
    if (PyTuple_GET_SIZE(a) != Py_ssize_t(args_.size())) return false;
    for (std::size_t i = 0; i < args_.size(); ++i) {
      PyObject* x = PyTuple_GET_ITEM(a, i);
      const Arg& arg = args_[i];
      if (Py_TYPE(x) != arg.type) return false;
      if (arg.value.is_valid()) {
        if (!same_value(x, arg.value.ptr())) return false;
      } else {
        auto* array = nb::inst_ptr<mx::array>(x);
        if (array->dtype() != arg.dtype || array->shape() != arg.shape) return false;
      }
    }
    PyObject* kw = kwargs.ptr();
    if (PyDict_GET_SIZE(kw) != Py_ssize_t(options_.size())) return false;
    for (auto& [key, value] : options_) {
      PyObject* now = PyDict_GetItemWithError(kw, key.ptr());
      if (now == nullptr) {
        PyErr_Clear();
        return false;
      }
      if (!same_value(now, value.ptr())) return false;
    }
    if (grid.ptr() != grid_.ptr() && !same_grid(grid.ptr(), grid_.ptr())) return false;
    for (std::size_t j = 0; j < outputs_.size(); ++j) {
      PyObject* out = PyTuple_GET_ITEM(a, outputs_[j]);
      for (int i : others_) {
        if (PyTuple_GET_ITEM(a, i) == out) return false;
      }
      for (std::size_t k = 0; k < j; ++k) {
        if (PyTuple_GET_ITEM(a, outputs_[k]) == out) return false;
      }
    }
    return true;
  }

  nb::object operator()(nb::handle grid, nb::handle args, nb::handle kwargs) const {
    if (!matches(grid, args, kwargs)) return nb::none();
    PyObject* a = args.ptr();
    PyObject* inputs = PyList_New(Py_ssize_t(plan_.size()));
    if (inputs == nullptr) throw nb::python_error();
    for (std::size_t i = 0; i < plan_.size(); ++i) {
      auto& [at, fixed] = plan_[i];
      PyObject* x = at >= 0 ? PyTuple_GET_ITEM(a, at) : fixed.ptr();
      Py_INCREF(x);
      PyList_SET_ITEM(inputs, Py_ssize_t(i), x);
    }
    return nb::steal(inputs);
  }

  // The launch the Dispatch bound (its plain outputs: one array, or a tuple of `results`),
  // which `launch` then runs itself: one C++ call for a repeated kernel[grid](...).
  // Only a native launch (any other callable is the Dispatch's own to call): whether bound.
  bool set_launch(nb::object launch, int results) {
    auto bound = native_bound(std::make_shared<nb::object>(std::move(launch)));
    if (!bound) return false;
    bound_ = std::move(*bound);
    results_ = results;
    return true;
  }

  // The outputs of a call of the resolved signature launched through the bound launch;
  // None when the call does not match, nothing is bound yet, or the launch declines (off
  // its device): the caller's slower path decides.
  nb::object launch(nb::handle grid, nb::handle args, nb::handle kwargs) const {
    if (!bound_ || !matches(grid, args, kwargs)) return nb::none();
    PyObject* a = args.ptr();
    std::vector<mx::array> inputs;
    inputs.reserve(plan_.size());
    for (auto& [at, fixed] : plan_) {
      inputs.push_back(nb::cast<mx::array>(at >= 0 ? nb::handle(PyTuple_GET_ITEM(a, at))
                                                   : nb::handle(fixed)));
    }
    auto outs = bound_(std::move(inputs));
    if (!outs) return nb::none();
    if (results_ == 1) return nb::cast(outs->front());
    nb::list kept;
    for (int i = 0; i < results_; ++i) kept.append(nb::cast((*outs)[i]));
    return nb::tuple(kept);
  }

 private:
  Bound bound_;
  int results_ = 1;
  struct Arg {
    PyTypeObject* type = nullptr;
    nb::object value;  // a scalar's; unset for an array
    mx::Dtype dtype = mx::float32;
    mx::Shape shape;
  };
  nb::object grid_;
  EnvCheck env_;
  mx::Device::DeviceType device_;
  std::vector<int> outputs_, others_;
  PyObject* array_type_ = nullptr;
  std::vector<Arg> args_;
  std::vector<std::pair<nb::object, nb::object>> options_;
  std::vector<std::pair<int, nb::object>> plan_;        // (argument position, or -1 and the array)
};

// A Python object held by a closure MLX keeps (a custom vjp's, in its graph): MLX may
// drop the closure on a thread without the GIL, so the reference is released under it,
// and left alone once the interpreter is shutting down.
std::shared_ptr<nb::object> kept(nb::object o) {
  return std::shared_ptr<nb::object>(new nb::object(std::move(o)), [](nb::object* p) {
    if (Py_IsInitialized()) {
      nb::gil_scoped_acquire gil;
      delete p;
    } else {
      p->release();
      delete p;
    }
  });
}

// An op's rules (op_node.h) calling Python (python/metile/runtime/op_function.py):
// `vjp(primals, cotangents, outputs)` -> a list of gradients, one a primal; `jvp(primals,
// tangents)` with a tangent (None where absent) a primal -> a list, one an output
// (forward_tangents); `vmap(inputs, axes)` with None for an unbatched input -> (output,
// axis) or (outputs, axes) (vmap_rule).  jvp and vmap may be None.
std::shared_ptr<metile::OpRules> op_rules(nb::object vjp_fn, nb::object jvp_fn,
                                          nb::object vmap_fn, std::string name) {
  auto rules = std::make_shared<metile::OpRules>();
  rules->name = std::move(name);
  rules->vjp = [vjp = kept(std::move(vjp_fn))](const std::vector<mx::array>& primals,
                                               const std::vector<mx::array>& cotangents,
                                               const std::vector<mx::array>& outputs) {
    nb::gil_scoped_acquire gil;
    return nb::cast<std::vector<mx::array>>((*vjp)(primals, cotangents, outputs));
  };
  if (!vmap_fn.is_none()) {
    rules->vmap = [vmap = kept(std::move(vmap_fn))](const std::vector<mx::array>& inputs,
                                                    const std::vector<int>& axes) {
      nb::gil_scoped_acquire gil;
      nb::list in_axes;
      for (int a : axes) {
        if (a < 0) {
          in_axes.append(nb::none());
        } else {
          in_axes.append(nb::int_(a));
        }
      }
      nb::tuple got = nb::cast<nb::tuple>((*vmap)(inputs, in_axes));
      std::pair<std::vector<mx::array>, std::vector<int>> out;
      if (nb::isinstance<mx::array>(got[0])) {
        out.first.push_back(nb::cast<mx::array>(got[0]));
        out.second.push_back(nb::cast<int>(got[1]));
      } else {
        out.first = nb::cast<std::vector<mx::array>>(got[0]);
        out.second = nb::cast<std::vector<int>>(got[1]);
      }
      return out;
    };
  }
  if (!jvp_fn.is_none()) {
    rules->jvp = [jvp = kept(std::move(jvp_fn))](const std::vector<mx::array>& primals,
                                                 const std::vector<mx::array>& tangents,
                                                 const std::vector<int>& argnums) {
      nb::gil_scoped_acquire gil;
      nb::list aligned;
      for (std::size_t i = 0; i < primals.size(); ++i) aligned.append(nb::none());
      for (std::size_t j = 0; j < argnums.size(); ++j) aligned[argnums[j]] = nb::cast(tangents[j]);
      return nb::cast<std::vector<mx::array>>((*jvp)(primals, aligned));
    };
  }
  return rules;
}

// `outputs`, computed from `primals` by an op's forward, given the op's rules: one OpNode
// (op_node.h) where the forward's nodes allow it, else mx.custom_function's two nodes an
// output around them.
std::vector<mx::array> op_node(const std::vector<mx::array>& primals,
                               const std::vector<mx::array>& outputs,
                               std::shared_ptr<metile::OpRules> rules,
                               const std::vector<std::optional<mx::Shape>>& to) {
  if (auto fused = metile::fuse_op(primals, outputs, rules, to)) return std::move(*fused);
  std::optional<std::function<std::vector<mx::array>(
      const std::vector<mx::array>&, const std::vector<mx::array>&, const std::vector<int>&)>>
      tangent;
  if (rules->jvp) tangent = rules->jvp;
  std::optional<std::function<std::pair<std::vector<mx::array>, std::vector<int>>(
      const std::vector<mx::array>&, const std::vector<int>&)>>
      batched;
  if (rules->vmap) batched = rules->vmap;
  // (the forward already ran: the function hands back its outputs)
  auto made = mx::custom_function([outputs](const std::vector<mx::array>&) { return outputs; },
                                  rules->vjp, tangent, batched)(primals);
  for (std::size_t j = 0; j < to.size() && j < made.size(); ++j) {
    if (to[j]) made[j] = mx::reshape(made[j], *to[j]);
  }
  return made;
}

// The default device and the settings a decision was made under (EnvCheck's, and how
// many environment variables there were: one added since is a setting routing may read),
// for what a later call reuses without deciding again (python/metile/op_replay.py).
class SettingsCheck {
 public:
  SettingsCheck(nb::dict environ, nb::tuple keys, nb::tuple values, Py_ssize_t environ_size,
                mx::Device::DeviceType device, std::vector<std::string> counted = {})
      : env_(std::move(environ), keys, values, std::move(counted)), environ_size_(environ_size),
        device_(device) {}

  bool operator()() const {
    return mx::default_device().type == device_ && env_.size() == environ_size_ && env_.same();
  }

 private:
  EnvCheck env_;
  Py_ssize_t environ_size_;
  mx::Device::DeviceType device_;
};

// Appends the dtypes and shapes of `arrays` to `key` (an absent one, None: a byte of its
// own); false when an argument is neither an array nor None.  The array part of a replay
// key (replay_key), which Python built from .shape and .dtype at ~100 ns each and hashed
// and compared through mx.Dtype's Python methods.
// `sink(bytes, size)` takes each piece in turn and answers whether to go on: appending
// them writes a key, comparing them reads one back (same_array_signature).
template <typename Sink>
bool array_signature_pieces(PyObject* const* arrays, std::size_t n, Sink&& sink) {
  static PyTypeObject* array_type = reinterpret_cast<PyTypeObject*>(nb::type<mx::array>().ptr());
  for (std::size_t i = 0; i < n; ++i) {
    PyObject* h = arrays[i];
    if (h == Py_None) {
      const char absent = '\xff';
      if (!sink(&absent, 1)) return false;
      continue;
    }
    if (Py_TYPE(h) != array_type) return false;
    auto* a = nb::inst_ptr<mx::array>(h);
    const char head[2] = {static_cast<char>(a->dtype().val()), static_cast<char>(a->ndim())};
    if (!sink(head, 2)) return false;
    for (auto d : a->shape()) {
      if (!sink(&d, sizeof(d))) return false;
    }
  }
  return true;
}

bool append_array_signature(std::string& key, PyObject* const* arrays, std::size_t n) {
  return array_signature_pieces(arrays, n, [&key](const void* p, std::size_t size) {
    key.append(static_cast<const char*>(p), size);
    return true;
  });
}

// A tuple's items as the vector calls take them.
PyObject* const* items(const nb::tuple& t) { return PySequence_Fast_ITEMS(t.ptr()); }

bool append_array_signature(std::string& key, const nb::args& arrays) {
  return append_array_signature(key, items(arrays), arrays.size());
}

// Whether `arrays` have the signature append_array_signature wrote as `signature`,
// compared in place (no key built).
bool same_array_signature(const std::string& signature, PyObject* const* arrays, std::size_t n) {
  std::size_t at = 0;
  bool same = array_signature_pieces(arrays, n, [&](const void* p, std::size_t size) {
    if (signature.size() - at < size || std::memcmp(signature.data() + at, p, size) != 0) {
      return false;
    }
    at += size;
    return true;
  });
  return same && at == signature.size();
}

// append_array_signature as one bytes object, or None (probes: a C++ call's floor).
nb::object array_signature(nb::args arrays) {
  std::string key;
  if (!append_array_signature(key, arrays)) return nb::none();
  return nb::bytes(key.data(), key.size());
}

// One metile op call signature's kernel launches, replayed (python/metile/op_replay.py):
// called with the op's arrays (its custom vjp's primals), it answers None when the
// default device or a setting the call depended on has changed (the op's full path
// decides again), else runs its stages in order, each through the launch its Dispatch
// bound (`launch(inputs)`: `inputs` with input i replaced, where sources[i] is p >= 0, by
// primal p, and where it is -2 - j by the previous stage's output j - a split reduction
// and its merge), under a custom vjp that calls the op's backward
// `vjp(primals, cotangents, outputs)`.  The last stage's first output is the op's.  A
// primal with a shape in `reshapes` is reshaped to it first (an op's rows view), the
// result to `out_shape` when one is given.
constexpr std::size_t ReplayTable_kMaxArrays = 16;   // (an op's arrays: at most its parameters)

class Replay {
  // one launch and its fixed inputs
  struct Stage {
    Bound bound;
    std::vector<mx::array> inputs;
    std::vector<int> sources;
  };
  // the stages, shared with the forwards MLX keeps
  struct Launch {
    std::vector<Stage> stages;

    std::vector<mx::array> run(const std::vector<mx::array>& xs) const {
      return {output([&xs](int p) -> const mx::array& { return xs[p]; })};
    }

    // The last stage's first output, with primal p's array primal(p).
    template <typename Primal>
    mx::array output(Primal&& primal) const {
      std::vector<mx::array> previous;
      for (const Stage& stage : stages) {
        std::vector<mx::array> in;
        in.reserve(stage.inputs.size());
        for (std::size_t i = 0; i < stage.sources.size(); ++i) {
          int source = stage.sources[i];
          if (source >= 0) {
            in.push_back(primal(source));
          } else if (source == -1) {
            in.push_back(stage.inputs[i]);
          } else {
            in.push_back(previous.at(std::size_t(-2 - source)));
          }
        }
        auto outs = stage.bound(std::move(in));
        if (!outs || outs->empty()) {
          throw std::runtime_error("[metile] a replayed launch left its device");
        }
        previous = std::move(*outs);
      }
      return std::move(previous.front());
    }
  };

 public:
  using StageArgs = std::tuple<nb::object, std::vector<mx::array>, std::vector<int>>;

  // A primal the recorded launches read through its slice's source (a KV cache's buffer
  // for the cache's prefix, attention_ops._cache_view): the slice's start, end and steps
  // and the source's shape, which a later call's slice must repeat.
  using SliceSpec = std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>,
                               std::vector<int64_t>>;

  Replay(std::vector<StageArgs> stages, std::vector<std::optional<std::vector<int>>> reshapes,
         std::optional<std::vector<int>> out_shape, nb::object vjp, const SettingsCheck& settings,
         nb::object vmap, nb::object jvp, std::vector<std::optional<SliceSpec>> slices,
         std::string name)
      : rules_(op_rules(std::move(vjp), std::move(jvp), std::move(vmap), std::move(name))),
        settings_(settings), slices_(std::move(slices)) {
    if (!slices_.empty() && slices_.size() != reshapes.size()) {
      throw std::invalid_argument("[metile] one slice (or None) per primal");
    }
    sliced_ = std::any_of(slices_.begin(), slices_.end(),
                          [](const auto& s) { return s.has_value(); });
    if (stages.empty()) throw std::invalid_argument("[metile] a replay launches something");
    Launch launch;
    for (auto& [bound, inputs, sources] : stages) {
      if (sources.size() != inputs.size()) {
        throw std::invalid_argument("[metile] one source (a primal, -1, or -2 - an output of "
                                    "the previous stage) per input");
      }
      for (int p : sources) {
        if (p >= int(reshapes.size())) throw std::invalid_argument("[metile] no such primal");
        if (p < -1 && launch.stages.empty()) {
          throw std::invalid_argument("[metile] the first stage has no previous outputs");
        }
      }
      launch.stages.push_back(
          Stage{bound_launch(kept(std::move(bound))), std::move(inputs), std::move(sources)});
    }
    launch_ = std::make_shared<const Launch>(std::move(launch));
    for (auto& r : reshapes) {
      reshapes_.push_back(r ? std::optional<mx::Shape>(mx::Shape(r->begin(), r->end()))
                            : std::nullopt);
    }
    if (out_shape) out_shape_ = mx::Shape(out_shape->begin(), out_shape->end());
    reshaped_ = std::any_of(reshapes_.begin(), reshapes_.end(),
                            [](const auto& r) { return r.has_value(); });
  }

  nb::object operator()(nb::args arrays) const { return call(items(arrays), arrays.size()); }

  nb::object call(PyObject* const* arrays, std::size_t n) const {
    if (!settings_()) return nb::none();
    if (n != reshapes_.size() || n > ReplayTable_kMaxArrays) {
      throw std::invalid_argument("[metile] a replay takes its op's arrays");
    }
    // A gradient reaches these outputs only through a primal a transform traces (mx.grad,
    // vjp, jvp, vmap and compile mark their inputs, and what is computed from them, as
    // tracers while they trace); with none the launch needs no custom vjp, about a
    // microsecond less host time an eager call, and takes the arrays as they are.
    mx::array* given[ReplayTable_kMaxArrays];
    bool traced = false;
    for (std::size_t i = 0; i < n; ++i) {
      given[i] = &nb::cast<mx::array&>(nb::handle(arrays[i]));
      traced = traced || given[i]->is_tracer();
    }
    // a sliced primal's buffer, where this call's slice is the recorded one (else the op's
    // Python path decides: another slice, or an array that is none)
    std::optional<mx::array> buffers[ReplayTable_kMaxArrays];
    if (sliced_) {
      for (std::size_t i = 0; i < n; ++i) {
        if (!slices_[i]) continue;
        buffers[i] = slice_buffer(*given[i], *slices_[i]);
        if (!buffers[i]) return nb::none();
      }
    }
    if (!traced) {
      if (auto out = as_one_node(given, buffers, n)) return nb::cast(std::move(*out));
      mx::array out = sliced_
          ? launch_->output([&](int p) { return buffers[p] ? *buffers[p] : primal(*given[p], p); })
          : reshaped_
          ? launch_->output([&](int p) { return primal(*given[p], p); })
          : launch_->output([&](int p) -> const mx::array& { return *given[p]; });
      return nb::cast(out_shape_ ? mx::reshape(out, *out_shape_) : std::move(out));
    }
    std::vector<mx::array> primals;
    primals.reserve(n);
    for (std::size_t i = 0; i < n; ++i) primals.push_back(primal(*given[i], int(i)));
    // (by value: MLX may keep the forward in its graph, beyond this replay's life)
    auto forward = [launch = launch_, slices = slices_](const std::vector<mx::array>& xs) {
      if (slices.empty()) return launch->run(xs);
      std::vector<mx::array> read(xs);
      for (std::size_t i = 0; i < slices.size(); ++i) {
        if (!slices[i]) continue;
        auto buffer = slice_buffer(xs[i], *slices[i]);
        if (!buffer) throw std::runtime_error("[metile] a replayed launch lost its slice's source");
        read[i] = *buffer;
      }
      return launch->run(read);
    };
    std::vector<std::optional<mx::Shape>> shapes;
    if (out_shape_) shapes.push_back(*out_shape_);
    return nb::cast(op_node(primals, forward(primals), rules_, shapes)[0]);
  }

 private:
  // Primal p as the launch takes it: the op's array, or its reshaped view.
  mx::array primal(const mx::array& a, int p) const {
    return reshapes_[p] ? mx::reshape(a, *reshapes_[p]) : a;
  }

  // An eager call as one node: the MetileOp (op_node.h) the recorded launches make, built
  // once from stand-ins of the op's arrays whose layout is unknown (so every contiguous()
  // the launches may need is one of its steps, sharing the buffer of an array that is
  // row-contiguous), then made again on each call's arrays - where the launches, their
  // reshapes and copies were each a node MLX's evaluation visits.
  struct OneNode {
    std::shared_ptr<mx::Primitive> node;
    std::vector<int> source;          // per node input: the op's array p, or -1: fixed[i]
    // the arrays read that the op was not given (none where source >= 0: a stand-in kept
    // would keep the first call's arrays alive)
    std::vector<std::optional<mx::array>> fixed;
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    mx::Stream stream;
  };
  mutable std::optional<OneNode> one_node_;   // (calls hold the GIL)
  mutable bool no_one_node_ = false;

  // (`buffers[p]`: the source of the op's array p where the launches read a slice's source
  // in its place - a KV cache's buffer - and then the node's input; the slice itself is
  // checked by the caller against the recorded one)
  std::optional<mx::array> as_one_node(mx::array* const* given,
                                       const std::optional<mx::array>* buffers,
                                       std::size_t n) const {
    if (no_one_node_ || !metile::fusing_ops()) return std::nullopt;
    mx::Stream stream = mx::default_stream(mx::default_device());
    auto read = [&](std::size_t p) -> const mx::array& {
      return buffers[p] ? *buffers[p] : *given[p];
    };
    if (!one_node_) {
      std::vector<mx::array> stand_ins, primals;
      for (std::size_t p = 0; p < n; ++p) {
        stand_ins.push_back(mx::copy(read(p), stream));
        primals.push_back(buffers[p] ? stand_ins.back() : primal(stand_ins.back(), int(p)));
      }
      std::vector<std::optional<mx::Shape>> shapes;
      if (out_shape_) shapes.push_back(*out_shape_);
      auto made = metile::fuse_op(primals, launch_->run(primals), rules_, shapes);
      if (!made) {
        no_one_node_ = true;
        return std::nullopt;
      }
      const mx::array& out = made->front();
      OneNode one{out.primitive_ptr(), {}, {}, {}, {}, out.primitive().stream()};
      for (const auto& in : out.inputs()) {
        int from = -1;
        for (std::size_t p = 0; p < n && from < 0; ++p) {
          if (in.id() == stand_ins[p].id()) from = int(p);
        }
        one.source.push_back(from);
        one.fixed.push_back(from < 0 ? std::optional<mx::array>(in) : std::nullopt);
      }
      for (const auto& o : out.outputs()) {
        one.shapes.push_back(o.shape());
        one.dtypes.push_back(o.dtype());
      }
      one_node_ = std::move(one);
    }
    const OneNode& one = *one_node_;
    if (!(one.stream == stream)) return std::nullopt;
    std::vector<mx::array> inputs;
    inputs.reserve(one.source.size());
    for (std::size_t i = 0; i < one.source.size(); ++i) {
      inputs.push_back(one.source[i] >= 0 ? read(one.source[i]) : *one.fixed[i]);
    }
    return std::move(mx::array::make_arrays(one.shapes, one.dtypes, one.node, std::move(inputs))
                         .front());
  }

  std::shared_ptr<const Launch> launch_;
  std::vector<std::optional<mx::Shape>> reshapes_;
  bool reshaped_ = false;   // whether any primal is reshaped (else the arrays go as given)
  std::optional<mx::Shape> out_shape_;
  std::shared_ptr<metile::OpRules> rules_;
  SettingsCheck settings_;
  std::vector<std::optional<SliceSpec>> slices_;
  bool sliced_ = false;

  // x's source, where x is an unevaluated slice with the recorded start, end and steps of
  // a source of the recorded shape that is row-contiguous once evaluated.
  static std::optional<mx::array> slice_buffer(const mx::array& x, const SliceSpec& spec) {
    auto slice = metile::lazy_slice(x);
    if (!slice) return std::nullopt;
    const auto& [start0, end0, steps0, shape0] = spec;
    auto same = [](const mx::Shape& a, const std::vector<int64_t>& b) {
      return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
    };
    if (!same(slice->start, start0) || !same(slice->end, end0) || !same(slice->steps, steps0) ||
        !same(slice->source.shape(), shape0) ||
        !metile::row_contiguous_when_evaluated(slice->source)) {
      return std::nullopt;
    }
    return slice->source;
  }
};

// Appends one option of a replay key (None, bool, int, float, str, or a tuple of ints, each
// with its type: 1, 1.0 and True differ); false for any other value.
bool append_option(std::string& key, PyObject* o) {
  auto put = [&key](const void* p, std::size_t n) { key.append(static_cast<const char*>(p), n); };
  auto integer = [&](PyObject* v) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    put(&x, sizeof(x));
    return true;
  };
  if (o == Py_None) {
    key.push_back('N');
  } else if (PyBool_Check(o)) {
    key.push_back(o == Py_True ? 'T' : 'F');
  } else if (PyLong_CheckExact(o)) {
    key.push_back('i');
    return integer(o);
  } else if (PyFloat_CheckExact(o)) {
    key.push_back('f');
    double v = PyFloat_AS_DOUBLE(o);
    put(&v, sizeof(v));
  } else if (PyUnicode_CheckExact(o)) {
    Py_ssize_t n = 0;
    const char* text = PyUnicode_AsUTF8AndSize(o, &n);
    if (!text) {
      PyErr_Clear();
      return false;
    }
    key.push_back('s');
    put(&n, sizeof(n));
    put(text, std::size_t(n));
  } else if (PyTuple_CheckExact(o)) {
    Py_ssize_t n = PyTuple_GET_SIZE(o);
    key.push_back('t');
    put(&n, sizeof(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* e = PyTuple_GET_ITEM(o, i);
      if (!PyLong_CheckExact(e) || !integer(e)) return false;
    }
  } else {
    return false;
  }
  return true;
}

// An op call's replay key (python/metile/op_replay.py): the op's name, each option
// (append_option) and each array's dtype and shape (an absent one, None, a byte of its
// own); nothing when an option is of another type or an argument is neither an array nor
// None (such a call takes the op's full path, which names what it does not take).
std::optional<std::string> replay_key(const std::string& op, nb::handle options,
                                      const nb::args& arrays) {
  if (!PyTuple_Check(options.ptr())) return std::nullopt;
  std::string key = op;
  key.push_back('\0');
  for (nb::handle h : nb::borrow<nb::tuple>(options)) {
    if (!append_option(key, h.ptr())) return std::nullopt;
  }
  key.push_back('|');
  if (!append_array_signature(key, arrays)) return std::nullopt;
  return key;
}

// How many routing.tuning_scope blocks this thread is inside (runtime/routing.py keeps it
// with its own record): read by a replay table without calling into Python.
thread_local int g_tuning_scopes = 0;

// The replays of op call signatures (python/metile/op_replay.py), looked up and run in one
// C++ call: an eager op call that repeats a recorded signature pays for its key, one hash
// lookup and its launch, where building the key and finding the replay in Python cost
// about as much as the launch itself.  An entry is an _ext.Replay (run natively) or any
// Python callable (an op routed to MLX's composite), each called with the call's arrays
// that are not None; a provisional entry declines while this thread is inside a
// routing.tuning_scope (a call there may measure).  `observer` (None unless a test sets
// it) is called with the op's name, and whether the entry is a kernel's replay, on each
// call an entry answers.
class ReplayTable {
 public:
  struct Entry {
    nb::object replay;
    const Replay* native;
    bool provisional;
    std::string op;
  };

  explicit ReplayTable(std::size_t capacity) : capacity_(capacity) {}

  nb::object call(const std::string& op, nb::handle options, const nb::args& arrays) const {
    auto key = replay_key(op, options, arrays);
    if (!key) return nb::none();
    return answer(*key, items(arrays), arrays.size());
  }

  // The result of the replay recorded under `key` for the call's arrays (those not None:
  // the replay's primals), or None (none recorded, or it declines).
  nb::object answer(const std::string& key, PyObject* const* arrays, std::size_t n) const {
    const Entry* e = find(key);
    return e ? run(*e, arrays, n) : nb::none();
  }

  const Entry* find(const std::string& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
  }

  // Entry `e`'s replay on the call's arrays, or None (it declines).  `values` (an op's
  // per-call numbers, such as rope's offset: not part of the key) follow the arrays, for a
  // Python replay only.
  nb::object run(const Entry& e, PyObject* const* arrays, std::size_t n,
                 PyObject* const* values = nullptr, std::size_t nv = 0) const {
    if (e.provisional && g_tuning_scopes > 0) return nb::none();
    if (e.native && nv) return nb::none();
    PyObject* given[kMaxArrays];
    std::size_t m = 0;
    for (std::size_t i = 0; i < n && m < kMaxArrays; ++i) {
      if (arrays[i] != Py_None) given[m++] = arrays[i];
    }
    for (std::size_t i = 0; i < nv && m < kMaxArrays; ++i) given[m++] = values[i];
    nb::object out;
    if (e.native) {
      out = e.native->call(given, m);
    } else {
      out = nb::steal(PyObject_Vectorcall(e.replay.ptr(), given, m, nullptr));
      if (!out.is_valid()) throw nb::python_error();
    }
    if (!out.is_none() && !observer_.is_none()) observer_(e.op, e.native != nullptr);
    return out;
  }

  // Changes whenever an entry is added, replaced or dropped (what a cached Entry pointer
  // is checked against).
  std::uint64_t generation() const { return generation_; }

  void put(nb::bytes key, nb::object replay, bool provisional) {
    ++generation_;
    if (entries_.size() >= capacity_) entries_.clear();
    std::string k(key.c_str(), key.size());
    const Replay* native = nb::isinstance<Replay>(replay) ? nb::inst_ptr<Replay>(replay) : nullptr;
    entries_[k] = Entry{std::move(replay), native, provisional, k.substr(0, k.find('\0'))};
  }

  // (replay, provisional) recorded under `key`, or None.
  nb::object get(nb::bytes key) const {
    auto it = entries_.find(std::string(key.c_str(), key.size()));
    if (it == entries_.end()) return nb::none();
    return nb::make_tuple(it->second.replay, it->second.provisional);
  }

  // The replays recorded for op `op` (probes).
  std::vector<nb::object> replays(const std::string& op) const {
    std::vector<nb::object> out;
    for (auto& [k, e] : entries_) {
      if (e.op == op) out.push_back(e.replay);
    }
    return out;
  }

  void clear() {
    ++generation_;
    entries_.clear();
  }
  std::size_t size() const { return entries_.size(); }
  nb::object observer_ = nb::none();
  static constexpr std::size_t kMaxArrays = ReplayTable_kMaxArrays;

 private:
  std::size_t capacity_;
  std::uint64_t generation_ = 1;
  std::unordered_map<std::string, Entry> entries_;
};


// An op's eager entry: `metile.ops.<op>` itself (python/metile/op_replay.py: entry), a C
// function the interpreter calls with its vector of arguments.  It binds them to the op's
// parameters as the op's Python signature would, builds the call's replay key from them and
// answers from the replay table; a call it cannot answer (nothing recorded, a replay that
// declines, arguments it cannot bind: too many, an unknown or repeated keyword, a missing
// one) goes on to the op's Python function with its arguments as given, which decides,
// records, or raises naming what is wrong.  A repeated eager call then costs no Python frame:
// the frame, its tuple of options and the table's argument parsing were ~0.4 us of a ~1.4 us
// call on this CPU where MLX's own matmul costs 0.35.
class OpEntry {
 public:
  static constexpr std::size_t kMaxParams = 16;

  OpEntry(nb::object table, nb::object full, const std::string& op, nb::tuple names,
          Py_ssize_t positional, nb::tuple defaults, std::vector<int> arrays,
          std::vector<int> options, std::string doc, nb::object module, std::vector<int> values)
      : table_ref_(std::move(table)), full_(std::move(full)), name_(op), doc_(std::move(doc)),
        module_(std::move(module)), positional_(positional), arrays_(std::move(arrays)),
        options_(std::move(options)), values_(std::move(values)) {
    if (!nb::isinstance<ReplayTable>(table_ref_)) {
      throw std::invalid_argument("[metile] an op entry answers from a ReplayTable");
    }
    table_ = nb::inst_ptr<ReplayTable>(table_ref_);
    if (names.size() != defaults.size() || names.size() > kMaxParams ||
        positional < 0 || std::size_t(positional) > names.size()) {
      throw std::invalid_argument("[metile] an op entry's parameters");
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      PyObject* name = names[i].ptr();
      if (!PyUnicode_CheckExact(name)) throw std::invalid_argument("[metile] a parameter name");
      Py_INCREF(name);
      PyUnicode_InternInPlace(&name);   // (keywords arrive interned: compared by identity)
      names_.push_back(nb::steal(name));
      defaults_.push_back(nb::borrow(defaults[i]));
    }
    for (int i : arrays_) check_index(i);
    for (int i : options_) check_index(i);
    for (int i : values_) check_index(i);
    if (arrays_.size() + values_.size() > ReplayTable_kMaxArrays) {
      throw std::invalid_argument("[metile] an op entry's arrays and values");
    }
    prefix_ = op;
    prefix_.push_back('\0');
    def_ = PyMethodDef{name_.c_str(), reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&entry_call)),
                       METH_FASTCALL | METH_KEYWORDS, doc_.c_str()};
  }

  // The op's Python-visible function, bound to `self` (this entry's Python object, which
  // holds the PyMethodDef it points to).
  static nb::object function(nb::handle self) {
    if (!nb::isinstance<OpEntry>(self) || !nb::inst_ready(self)) {
      throw nb::type_error("[metile] an OpEntry made without its arguments has no function");
    }
    auto* e = nb::inst_ptr<OpEntry>(self);
    PyObject* f = PyCFunction_NewEx(&e->def_, self.ptr(), e->module_.ptr());
    if (f == nullptr) throw nb::python_error();
    return nb::steal(f);
  }

  const std::string& name() const { return name_; }
  const nb::object& module() const { return module_; }

  // The default of a parameter that has none (a required one); never released (a static
  // reference would be dropped after the interpreter finalizes).
  static nb::object required() {
    static PyObject* marker = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
    return nb::borrow(marker);
  }

 private:
  void check_index(int i) const {
    if (i < 0 || std::size_t(i) >= names_.size()) {
      throw std::invalid_argument("[metile] an op entry's parameter index");
    }
  }

  int parameter(PyObject* name) const {
    for (std::size_t k = 0; k < names_.size(); ++k) {
      if (names_[k].ptr() == name) return int(k);
    }
    for (std::size_t k = 0; k < names_.size(); ++k) {   // (a keyword built at run time)
      if (PyUnicode_Compare(names_[k].ptr(), name) == 0) return int(k);
    }
    PyErr_Clear();
    return -1;
  }

  // The replayed result (a new reference), or nullptr: not answered here.
  PyObject* replayed(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) const {
    PyObject* slots[kMaxParams] = {};
    if (nargs > positional_) return nullptr;
    for (Py_ssize_t i = 0; i < nargs; ++i) slots[i] = args[i];
    Py_ssize_t keywords = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < keywords; ++j) {
      int k = parameter(PyTuple_GET_ITEM(kwnames, j));
      if (k < 0 || slots[k]) return nullptr;
      slots[k] = args[nargs + j];
    }
    PyObject* absent = required().ptr();
    for (std::size_t k = 0; k < names_.size(); ++k) {
      if (slots[k]) continue;
      if (defaults_[k].ptr() == absent) return nullptr;
      slots[k] = defaults_[k].ptr();
    }
    PyObject* arrays[kMaxParams];
    for (std::size_t i = 0; i < arrays_.size(); ++i) arrays[i] = slots[arrays_[i]];
    // a value is keyed by its kind only: a plain int (anything else takes the full path)
    PyObject* values[kMaxParams];
    for (std::size_t i = 0; i < values_.size(); ++i) {
      values[i] = slots[values_[i]];
      if (!PyLong_CheckExact(values[i])) return nullptr;
    }
    const ReplayTable::Entry* e = recorded(slots, arrays);
    if (e == nullptr) return nullptr;
    nb::object out = table_->run(*e, arrays, arrays_.size(), values, values_.size());
    return out.is_none() ? nullptr : out.release().ptr();
  }

  // The table's entry for the call: one of the recent hits, else found by its key (and
  // kept among the hits); nullptr where none is recorded or the call cannot key one.
  const ReplayTable::Entry* recorded(PyObject* const* slots, PyObject* const* arrays) const {
    std::uint64_t generation = table_->generation();
    for (const Hit& h : hits_) {
      if (h.generation == generation && h.matches(slots, options_, arrays, arrays_.size())) {
        return h.entry;
      }
    }
    std::string key = prefix_;
    for (int k : options_) {
      if (!append_option(key, slots[k])) return nullptr;
    }
    key.push_back('|');
    std::size_t split = key.size();
    if (!append_array_signature(key, arrays, arrays_.size())) return nullptr;
    const ReplayTable::Entry* e = table_->find(key);
    if (e == nullptr) return nullptr;
    Hit& h = hits_[next_hit_];
    next_hit_ = (next_hit_ + 1) % kHits;
    h.generation = generation;
    h.options.clear();
    for (int k : options_) h.options.push_back(nb::borrow(slots[k]));
    h.arrays = key.substr(split);
    h.entry = e;
    return e;
  }

  static PyObject* entry_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                              PyObject* kwnames) {
    auto* e = nb::inst_ptr<OpEntry>(self);
    try {
      if (PyObject* out = e->replayed(args, nargs, kwnames)) return out;
    } catch (nb::python_error& err) {
      err.restore();
      return nullptr;
    } catch (const std::invalid_argument& err) {
      PyErr_SetString(PyExc_ValueError, err.what());
      return nullptr;
    } catch (const std::exception& err) {
      PyErr_SetString(PyExc_RuntimeError, err.what());
      return nullptr;
    }
    return PyObject_Vectorcall(e->full_.ptr(), args, std::size_t(nargs), kwnames);
  }

  nb::object table_ref_;
  ReplayTable* table_ = nullptr;
  nb::object full_;
  std::string name_, doc_, prefix_;
  nb::object module_;
  Py_ssize_t positional_;
  std::vector<nb::object> names_, defaults_;
  std::vector<int> arrays_, options_, values_;
  PyMethodDef def_{};

  // The last few keys this op found in the table: the same option objects (by identity:
  // a call site passes its constants, the same objects each time) and arrays of the same
  // signature find their entry without building and hashing the key again, while the
  // table has not changed since (its generation).
  struct Hit {
    std::uint64_t generation = 0;   // (0: empty; a table's generations start at 1)
    std::vector<nb::object> options;
    std::string arrays;             // the key's array part (append_array_signature)
    const ReplayTable::Entry* entry = nullptr;

    bool matches(PyObject* const* slots, const std::vector<int>& at, PyObject* const* given,
                 std::size_t n) const {
      for (std::size_t i = 0; i < at.size(); ++i) {
        if (slots[at[i]] != options[i].ptr()) return false;
      }
      return same_array_signature(arrays, given, n);
    }
  };
  static constexpr std::size_t kHits = 4;
  mutable std::array<Hit, kHits> hits_;
  mutable std::size_t next_hit_ = 0;
};

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "metile's C++ layer: MLX primitives and the MSL CPU runtime";
  m.attr("abi_version") = METILE_MSL_ABI_VERSION;
  m.def("array_signature", &array_signature,
        "The dtypes and shapes of arrays (None for an absent one) as bytes; None if an "
        "argument is neither an array nor None.");

#ifdef METILE_HAVE_MSL_CPU
  m.attr("has_msl_cpu") = true;
  // A dispatch stopped by Ctrl-C reaches Python through MLX's stored error, a
  // plain runtime_error, from mx.eval.  Translators are shared by the mlx
  // domain, so this one sees it there and lets Python's SIGINT handler raise
  // (KeyboardInterrupt by default).
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::runtime_error& e) {
      if (!is_interrupt(e.what())) throw;
      if (PyErr_CheckSignals() == 0) PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
    }
  });
  nb::class_<KernelLibrary>(m, "KernelLibrary")
      .def(nb::new_([](const std::string& path) { return std::make_shared<KernelLibrary>(path); }),
           nb::arg("path"))
      .def_prop_ro("path", &KernelLibrary::path);

  m.def("launch_cpu", &launch_cpu, nb::arg("library"), nb::arg("name"), nb::arg("inputs"),
        nb::arg("shape_infos"), nb::arg("output_shapes"), nb::arg("output_dtypes"), nb::arg("grid"),
        nb::arg("threadgroup"), nb::arg("init_value").none(), nb::arg("lane_order"),
        nb::arg("race_check"), nb::arg("race_compare"), nb::arg("bounds_check"), nb::arg("buffer_names"), nb::arg("stream"),
        nb::arg("no_vjp") = "",
        "Build lazy outputs of an MSL kernel library run by the CPU runtime.");
  nb::class_<CpuLaunch>(m, "CpuLaunch")
      .def(nb::new_([](std::shared_ptr<KernelLibrary> library, const std::string& name,
                       const std::vector<std::tuple<bool, bool, bool>>& shape_infos,
                       const std::vector<std::vector<int>>& output_shapes,
                       std::vector<mx::Dtype> output_dtypes, Dim3 grid, Dim3 threadgroup,
                       std::optional<float> init_value, const std::string& lane_order,
                       bool race_check,
                       const std::vector<std::tuple<bool, double, double>>& race_compare,
                       bool bounds_check, const std::vector<std::string>& buffer_names,
                       const std::string& no_vjp, bool ensure_row_contiguous) {
             return std::make_shared<CpuLaunch>(
                 std::move(library),
                 cpu_spec(name, shape_infos, grid, threadgroup, init_value, lane_order, race_check,
                          race_compare, bounds_check, buffer_names, no_vjp),
                 to_shapes(output_shapes), std::move(output_dtypes), ensure_row_contiguous);
           }),
           nb::arg("library"), nb::arg("name"), nb::arg("shape_infos"), nb::arg("output_shapes"),
           nb::arg("output_dtypes"), nb::arg("grid"), nb::arg("threadgroup"),
           nb::arg("init_value").none(), nb::arg("lane_order"), nb::arg("race_check"),
           nb::arg("race_compare"), nb::arg("bounds_check"), nb::arg("buffer_names"),
           nb::arg("no_vjp"), nb::arg("ensure_row_contiguous"))
      .def("__call__", &CpuLaunch::operator(), nb::arg("inputs"), nb::arg("stream").none() = nb::none(),
           "launch_cpu's lazy outputs for `inputs`; None when the stream (default: the default "
           "device's) is not the CPU's.");
#else
  m.attr("has_msl_cpu") = false;
#endif
  m.def("launch_metal", &launch_metal, nb::arg("name"), nb::arg("input_names"),
        nb::arg("output_names"), nb::arg("source"), nb::arg("header"),
        nb::arg("ensure_row_contiguous"), nb::arg("atomic_outputs"), nb::arg("math_mode"),
        nb::arg("inputs"),
        nb::arg("output_shapes"), nb::arg("output_dtypes"), nb::arg("grid"), nb::arg("threadgroup"),
        nb::arg("template_args"), nb::arg("init_value").none(), nb::arg("verbose"),
        nb::arg("stream"), "Launch through mlx::core::fast::metal_kernel (Metal devices).");
  m.def("launch_cuda", &launch_cuda, nb::arg("name"), nb::arg("input_names"),
        nb::arg("output_names"), nb::arg("source"), nb::arg("header"),
        nb::arg("ensure_row_contiguous"), nb::arg("shared_memory"), nb::arg("inputs"),
        nb::arg("output_shapes"), nb::arg("output_dtypes"), nb::arg("grid"), nb::arg("threadgroup"),
        nb::arg("template_args"), nb::arg("init_value").none(), nb::arg("verbose"),
        nb::arg("stream"), nb::arg("no_vjp") = "",
        "Launch through mlx::core::fast::cuda_kernel (NVIDIA devices); with `no_vjp`, a "
        "gradient reaching the launch raises it as a LaunchError.");
  nb::class_<CudaSourceLaunch>(m, "CudaSourceLaunch")
      .def(nb::init<const std::string&, const std::vector<std::string>&,
                    const std::vector<std::string>&, const std::string&, const std::string&, bool,
                    int, const std::vector<std::vector<int>>&, std::vector<mx::Dtype>, Dim3, Dim3,
                    std::vector<std::pair<std::string, mx::fast::TemplateArg>>,
                    std::optional<float>, std::string>(),
           nb::arg("name"), nb::arg("input_names"), nb::arg("output_names"), nb::arg("source"),
           nb::arg("header"), nb::arg("ensure_row_contiguous"), nb::arg("shared_memory"),
           nb::arg("output_shapes"), nb::arg("output_dtypes"), nb::arg("grid"),
           nb::arg("threadgroup"), nb::arg("template_args"), nb::arg("init_value").none(),
           nb::arg("no_vjp"))
      .def("__call__", &CudaSourceLaunch::operator(), nb::arg("arrays"),
           nb::arg("stream").none() = nb::none(),
           "launch_cuda's lazy outputs for `arrays`; None when the stream (default: the default "
           "device's) is not a GPU's.");
  // A kernel's own primitive refuses a gradient with metile::NoVjp (no_vjp.h): Python sees
  // metile.errors.LaunchError, as from the launch's mx.custom_function guard it replaces.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const metile::NoVjp& e) {
      nb::object error = nb::module_::import_("metile.errors").attr("LaunchError");
      PyErr_SetString(error.ptr(), e.what());
    }
  });
  m.def("refused_array",
        [](std::vector<int> shape, mx::Dtype dtype, std::string message) {
          auto stream = mx::default_stream(mx::default_device());
          return mx::array(mx::Shape(shape.begin(), shape.end()), dtype,
                           std::make_shared<metile::RefusedTransform>(stream, std::move(message)),
                           {});
        },
        nb::arg("shape"), nb::arg("dtype"), nb::arg("message"),
        "An array whose evaluation raises LaunchError(message): a gradient an op cannot give "
        "(its custom vjp cannot tell which primals were asked for), refused only where used.");
  m.def("primitive_name", [](const mx::array& a) -> std::optional<std::string> {
          if (!a.has_primitive()) return std::nullopt;
          return std::string(a.primitive().name());
        }, nb::arg("array"),
        "The name of the primitive that computes an unevaluated array; None for an evaluated one "
        "(MLX detaches the graph) or a leaf.");
  m.def("slice_source", [](const mx::array& a) -> nb::object {
          auto slice = metile::lazy_slice(a);
          if (!slice) return nb::none();
          auto ints = [](const mx::Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); };
          return nb::make_tuple(slice->source, ints(slice->start), ints(slice->end),
                                ints(slice->steps));
        }, nb::arg("array"),
        "(source, start, end, strides) of an unevaluated basic slice: an op that can index "
        "the source reads it in place of the slice's copy (attention over a cache's prefix); "
        "None for anything else.");
  m.def("row_contiguity", [](const mx::array& a) -> std::optional<bool> {
          if (a.is_available()) return a.flags().row_contiguous;
          if (metile::row_contiguous_when_evaluated(a)) return true;
          return std::nullopt;
        }, nb::arg("array"),
        "True or False where the array's layout is known (evaluated, or from a primitive that "
        "writes row-contiguous outputs), None where it is known only once evaluated.");
  m.def("same_array", [](const mx::array& a, const mx::array& b) { return a.id() == b.id(); },
        nb::arg("a"), nb::arg("b"), "Whether two mx.array objects hold one array.");
  m.def("check_cubin", [](const std::string& name, const nb::bytes& image) {
          metile::cuda::check_image(name, image_of(image));
        }, nb::arg("name"), nb::arg("image"),
        "Raise ValueError unless `image` is a 64-bit ELF whose tables lie inside it.");
#ifdef METILE_HAVE_MLX_CUDA
  m.attr("has_cuda_launch") = true;
  nb::class_<metile::cuda::CudaFunction>(m, "CudaFunction")
      .def(nb::new_([](const std::string& name, const nb::bytes& image, int shared_memory) {
             return std::make_shared<metile::cuda::CudaFunction>(name, image_of(image), shared_memory);
           }),
           nb::arg("name"), nb::arg("image"), nb::arg("shared_memory"))
      .def_prop_ro("name", &metile::cuda::CudaFunction::name)
      .def_prop_ro("shared_memory", &metile::cuda::CudaFunction::shared_memory)
      .def_prop_ro("image_bytes", &metile::cuda::CudaFunction::image_bytes);
  m.def("launch_cuda_function", &launch_cuda_function, nb::arg("function"), nb::arg("inputs"),
        nb::arg("output_shapes"), nb::arg("output_dtypes"), nb::arg("grid"), nb::arg("threadgroup"),
        nb::arg("scalars"), nb::arg("ensure_row_contiguous"), nb::arg("stream"),
        nb::arg("no_vjp") = "",
        "Launch a loaded cubin's kernel as metile's own MLX primitive (loaded once per device).");
  nb::class_<CudaLaunch>(m, "CudaLaunch")
      .def(nb::init<std::shared_ptr<metile::cuda::CudaFunction>, std::vector<int>,
                    const std::vector<std::vector<int>>&, std::vector<mx::Dtype>, Dim3, Dim3,
                    const std::vector<nb::object>&, bool, std::string>(),
           nb::arg("function"), nb::arg("kept"), nb::arg("output_shapes"), nb::arg("output_dtypes"),
           nb::arg("grid"), nb::arg("threadgroup"), nb::arg("scalars"),
           nb::arg("ensure_row_contiguous"), nb::arg("no_vjp"))
      .def("__call__", &CudaLaunch::operator(), nb::arg("arrays"), nb::arg("stream").none() = nb::none(),
           "launch_cuda_function's lazy outputs for `arrays`; None when the stream (default: "
           "the default device's) is not a GPU's.")
      .def("time_parts", &CudaLaunch::time_parts, nb::arg("arrays"), nb::arg("n"),
           "Host ns per call of each part of this launch, over n calls (a probe).");
#else
  m.attr("has_cuda_launch") = false;
#endif
  nb::class_<LaunchGuard>(m, "LaunchGuard")
      .def(nb::init<nb::object, nb::tuple, nb::dict, nb::dict, nb::tuple, nb::tuple,
                    mx::Device::DeviceType, nb::list, std::vector<int>>(),
           nb::arg("grid"), nb::arg("args"), nb::arg("kwargs"), nb::arg("environ"),
           nb::arg("env_keys"), nb::arg("env_values"), nb::arg("device"), nb::arg("plan"),
           nb::arg("outputs"))
      .def("__call__", &LaunchGuard::operator(), nb::arg("grid").none(), nb::arg("args"),
           nb::arg("kwargs"),
           "The kernel's inputs for a call of the resolved signature, else None.")
      .def("set_launch", &LaunchGuard::set_launch, nb::arg("launch"), nb::arg("results"),
           "Bind the Dispatch's native launch (plain outputs) for `launch`; whether bound.")
      .def("launch", &LaunchGuard::launch, nb::arg("grid").none(), nb::arg("args"),
           nb::arg("kwargs"),
           "The bound launch's outputs for a call of the resolved signature, else None.");
  m.def("environ_epoch",
        [](nb::dict environ) -> std::optional<std::uint64_t> {
          if (!watch_environ(environ.ptr())) return std::nullopt;
          return environ_epoch(environ.ptr());
        },
        nb::arg("environ"),
        "A number that changes whenever `environ` (os.environ's dict) is modified, or None "
        "where none can be had.");
  nb::class_<SettingsCheck>(m, "SettingsCheck")
      .def(nb::init<nb::dict, nb::tuple, nb::tuple, Py_ssize_t, mx::Device::DeviceType,
                    std::vector<std::string>>(),
           nb::arg("environ"), nb::arg("env_keys"), nb::arg("env_values"),
           nb::arg("environ_size"), nb::arg("device"),
           nb::arg("counted") = std::vector<std::string>{})
      .def("__call__", &SettingsCheck::operator(),
           "Whether the default device and the settings are still as recorded.");
  m.def("replay_key",
        [](const std::string& op, nb::handle options, nb::args arrays) -> nb::object {
          auto key = replay_key(op, options, arrays);
          if (!key) return nb::none();
          return nb::bytes(key->data(), key->size());
        },
        "An op call's replay key as bytes (its name, options and arrays' dtypes and shapes), "
        "or None where an option or argument cannot key one.");
  m.def("tuning_scopes", [](int change) { return g_tuning_scopes += change; }, nb::arg("change"),
        "Add `change` to this thread's count of routing.tuning_scope blocks; the count.");
  nb::class_<ReplayTable>(m, "ReplayTable")
      .def(nb::init<std::size_t>(), nb::arg("capacity"))
      .def("__call__", &ReplayTable::call,
           "The recorded replay's result for this op call, or None (none recorded, or it "
           "declines).")
      .def("put", &ReplayTable::put, nb::arg("key"), nb::arg("replay"), nb::arg("provisional"))
      .def("get", &ReplayTable::get, nb::arg("key"))
      .def("replays", &ReplayTable::replays, nb::arg("op"))
      .def("clear", &ReplayTable::clear)
      .def("__len__", &ReplayTable::size)
      .def_prop_rw(
          "observer", [](const ReplayTable& t) { return t.observer_; },
          [](ReplayTable& t, nb::object v) { t.observer_ = std::move(v); },
          nb::for_setter(nb::arg("value").none()));
  nb::class_<OpEntry>(m, "OpEntry")
      .def(nb::init<nb::object, nb::object, const std::string&, nb::tuple, Py_ssize_t, nb::tuple,
                    std::vector<int>, std::vector<int>, std::string, nb::object,
                    std::vector<int>>(),
           nb::arg("table"), nb::arg("full"), nb::arg("op"), nb::arg("names"),
           nb::arg("positional"), nb::arg("defaults"), nb::arg("arrays"), nb::arg("options"),
           nb::arg("doc"), nb::arg("module"), nb::arg("values") = std::vector<int>{})
      .def("function", [](nb::handle self) { return OpEntry::function(self); },
           "The op as a function: replays a recorded call, else calls `full`.")
      // Pickling the op (a builtin method of this entry: getattr(entry, name)) pickles
      // the entry by the op's module and name and finds the function on it again.
      .def("__reduce__",
           [](const OpEntry& e) {
             return nb::make_tuple(nb::module_::import_("metile.op_replay").attr("entry_of"),
                                   nb::make_tuple(e.module(), e.name()));
           })
      .def("__getattr__", [](nb::handle self, const std::string& name) {
        if (!nb::inst_ready(self) || name != nb::inst_ptr<OpEntry>(self)->name()) {
          throw nb::attribute_error(name.c_str());
        }
        return OpEntry::function(self);
      });
  m.attr("REQUIRED") = OpEntry::required();
  nb::class_<metile::OpRules>(m, "OpRules",
                              "An op's vjp, jvp and vmap rules for op_node (jvp and vmap may "
                              "be None).");
  m.def("op_rules", &op_rules, nb::arg("vjp"), nb::arg("jvp").none(), nb::arg("vmap").none(),
        nb::arg("name"));
  m.def("op_node",
        [](const std::vector<mx::array>& primals, const std::vector<mx::array>& outputs,
           std::shared_ptr<metile::OpRules> rules,
           const std::vector<std::optional<std::vector<int>>>& shapes) {
          std::vector<std::optional<mx::Shape>> to;
          for (const auto& s : shapes) {
            to.push_back(s ? std::optional<mx::Shape>(mx::Shape(s->begin(), s->end()))
                           : std::nullopt);
          }
          return op_node(primals, outputs, std::move(rules), to);
        },
        nb::arg("primals"), nb::arg("outputs"), nb::arg("rules"),
        nb::arg("shapes") = std::vector<std::optional<std::vector<int>>>{},
        "outputs (an op's forward of primals) as one node carrying the op's rules, or under "
        "mx.custom_function's nodes where the forward cannot be one node; with `shapes`, "
        "each output reshaped to its shape (None: as it is).");
  m.def("fuse_ops", [](bool on) {
    bool was = metile::fusing_ops();
    metile::fusing_ops() = on;
    return was;
  }, nb::arg("on"), "Whether ops under a transform become one node from now on (True, the "
     "default) or keep mx.custom_function's nodes (to measure the difference); the previous "
     "setting.");
  m.def("any_tracer", [](const nb::args& arrays) {
    for (nb::handle h : arrays) {
      if (nb::isinstance<mx::array>(h) && nb::cast<const mx::array&>(h).is_tracer()) return true;
    }
    return false;
  }, "Whether a transform traces any of the arrays (None and other values are skipped).");
  nb::class_<Replay>(m, "Replay")
      .def(nb::init<std::vector<Replay::StageArgs>,
                    std::vector<std::optional<std::vector<int>>>, std::optional<std::vector<int>>,
                    nb::object, const SettingsCheck&, nb::object, nb::object,
                    std::vector<std::optional<Replay::SliceSpec>>, std::string>(),
           nb::arg("stages"), nb::arg("reshapes"),
           nb::arg("out_shape").none(), nb::arg("vjp"), nb::arg("settings"),
           nb::arg("vmap").none() = nb::none(), nb::arg("jvp").none() = nb::none(),
           nb::arg("slices") = std::vector<std::optional<Replay::SliceSpec>>{},
           nb::arg("name") = "a metile op")
      .def("__call__", &Replay::operator(),
           "The op's result for these arrays, or None when the device or a setting changed.");
  m.def("launch_precompiled_cuda", &launch_precompiled_cuda, nb::arg("name"), nb::arg("compiled"),
        nb::arg("inputs"), nb::arg("output_shapes"), nb::arg("output_dtypes"), nb::arg("grid"),
        nb::arg("threadgroup"), nb::arg("shared_memory"), nb::arg("init_value").none(),
        nb::arg("ensure_row_contiguous"), nb::arg("stream"), nb::arg("scalars") = std::vector<nb::object>{},
        nb::arg("no_vjp") = "",
        "Launch a cubin through mlx::core::fast::precompiled_cuda_kernel (NVIDIA devices); with "
        "`no_vjp`, a gradient reaching the launch raises it as a LaunchError.");
}
