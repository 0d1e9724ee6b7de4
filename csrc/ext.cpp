// metile._ext: the C++ layer between metile's Python runtime and MLX.
//
// Built with NB_DOMAIN mlx so nanobind shares MLX's type registry: functions
// here take and return mx.array / mx.Stream / mx.Dtype directly.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "cubin_check.h"
#include "no_vjp.h"
#include "mlx/fast.h"
#include "mlx/primitives.h"
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
  return launch(std::move(library), std::move(spec), inputs, to_shapes(output_shapes), output_dtypes,
                stream);
}

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

// NVIDIA devices: CUDA C++ through mlx::core::fast::cuda_kernel (MLX's
// CUDA backend compiles it with NVRTC and caches it).
std::vector<mx::array> launch_cuda(
    const std::string& name, const std::vector<std::string>& input_names,
    const std::vector<std::string>& output_names, const std::string& source,
    const std::string& header, bool ensure_row_contiguous, int shared_memory,
    const std::vector<mx::array>& inputs, const std::vector<std::vector<int>>& output_shapes,
    const std::vector<mx::Dtype>& output_dtypes, Dim3 grid, Dim3 threadgroup,
    const std::vector<std::pair<std::string, mx::fast::TemplateArg>>& template_args,
    std::optional<float> init_value, bool verbose, mx::Stream stream) {
  auto kernel = mx::fast::cuda_kernel(name, input_names, output_names, source, header,
                                      ensure_row_contiguous, shared_memory);
  return kernel(inputs, to_shapes(output_shapes), output_dtypes, grid, threadgroup, template_args,
                init_value, verbose, stream);
}

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
    bool ensure_row_contiguous, mx::Stream stream, const std::vector<nb::object>& scalars) {
  return mx::fast::precompiled_cuda_kernel(name, image_of(compiled), inputs, to_shapes(output_shapes),
                                           output_dtypes, to_scalars(scalars), grid, threadgroup,
                                           shared_memory, init_value, ensure_row_contiguous, stream);
}

#ifdef METILE_HAVE_MLX_CUDA

std::vector<mx::array> launch_cuda_function(
    std::shared_ptr<metile::cuda::CudaFunction> fn, std::vector<mx::array> inputs,
    const std::vector<std::vector<int>>& output_shapes, const std::vector<mx::Dtype>& output_dtypes,
    Dim3 grid, Dim3 threadgroup, const std::vector<nb::object>& scalars, bool ensure_row_contiguous,
    mx::Stream stream, const std::string& no_vjp) {
  auto [gx, gy, gz] = grid;
  auto [tx, ty, tz] = threadgroup;
  return metile::cuda::launch(std::move(fn), std::move(inputs), to_shapes(output_shapes),
                              output_dtypes, {gx, gy, gz}, {tx, ty, tz}, to_scalars(scalars),
                              ensure_row_contiguous, stream, no_vjp);
}
#endif

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "metile's C++ layer: MLX primitives and the MSL CPU runtime";
  m.attr("abi_version") = METILE_MSL_ABI_VERSION;

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
        nb::arg("stream"), "Launch through mlx::core::fast::cuda_kernel (NVIDIA devices).");
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
  m.def("primitive_name", [](const mx::array& a) -> std::optional<std::string> {
          if (!a.has_primitive()) return std::nullopt;
          return std::string(a.primitive().name());
        }, nb::arg("array"),
        "The name of the primitive that computes an unevaluated array; None for an evaluated one "
        "(MLX detaches the graph) or a leaf.");
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
#else
  m.attr("has_cuda_launch") = false;
#endif
  m.def("launch_precompiled_cuda", &launch_precompiled_cuda, nb::arg("name"), nb::arg("compiled"),
        nb::arg("inputs"), nb::arg("output_shapes"), nb::arg("output_dtypes"), nb::arg("grid"),
        nb::arg("threadgroup"), nb::arg("shared_memory"), nb::arg("init_value").none(),
        nb::arg("ensure_row_contiguous"), nb::arg("stream"), nb::arg("scalars") = std::vector<nb::object>{},
        "Launch a cubin through mlx::core::fast::precompiled_cuda_kernel (NVIDIA devices).");
}
