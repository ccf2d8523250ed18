// Python bindings of the CPU extension rnn_ablations._C: the step kernels' entry points
// (cpu/entry_points.h), the element-wise scan (cpu/scan.cpp), the kernel-spec decoder the table
// test reads (common/kernel_spec.h), and the choice of vector path (cpu/vec_kernels.h).  The CUDA
// kernels (cuda/*.cuh) are compiled at run time by NVRTC and launched from Python
// (rnn_ablations/kernels/cuda/host.py): they have no bindings here.
//
// Every entry point that computes releases the GIL for the whole call (py::call_guard): the
// kernels never run Python, and their worker threads inherit only grad and inference mode
// (cpu/thread_modes.h), so no Python-level mode or hook a caller installs can block them.

// The tensor class and torch's pybind11 glue (the at::Tensor caster) only: <torch/extension.h>
// would add the whole C++ frontend (torch/all.h), which doubled this file's compile time, the
// longest of the kernel's build (one compiler runs it while the others share the rest), and
// <ATen/ATen.h> every operator's declarations (the build defines TORCH_ASSERT_ONLY_METHOD_OPERATORS,
// which makes that include an error: see rnn_ablations/kernels/build.py).
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include "cpu/layer_tensors.h"
#include "cpu/entry_points.h"
#include "common/kernel_spec.h"
#include "cpu/library_gemm.h"
#include "cpu/vec_kernels.h"

namespace rnn_ablations {
namespace {

// The decoded spec as the table test reads it (tests/test_variant_table.py).
py::dict describe_kernel_spec(int64_t spec, bool highway) {
  const KernelSpec ks = decode_kernel_spec(spec, highway, "describe_kernel_spec");
  const auto blocks = kernel_spec_blocks(ks);
  py::dict d;
  d["output"] = output_rule_name(ks.output);
  d["memory"] = ks.memory;
  d["content_recurrent"] = ks.content_recurrent;
  d["content_activation"] = ks.content_tanh ? "tanh" : "identity";
  d["recurrent"] = blocks[0];
  d["input_only"] = blocks[1];
  return d;
}

// The element-wise scan's view of a spec (a cell whose gates read no h_{t-1}), as the table test
// reads it: the same keys as describe_kernel_spec.
py::dict describe_scan_spec(int64_t spec, bool highway) {
  const ScanSpec ss = decode_scan_spec(spec, highway, "describe_scan_spec");
  py::dict d;
  d["output"] = output_rule_name(ss.output);
  d["memory"] = true;
  d["content_recurrent"] = false;
  d["content_activation"] = "identity";
  d["recurrent"] = std::vector<std::string>();
  d["input_only"] = scan_spec_blocks(ss);
  return d;
}


// C (M x N) [+]= A (M x K) * B through the packed step GEMM of the path in use, for the tests
// (tests/kernels/test_cpu_kernel.py: every path against a float64 product at the panel and row-block tails).
// B = w^T for w (N, K) when `transposed` (the forward step), else w (K, N) (the backward step);
// a and c may have a row stride larger than their width (as the step's views of proj do).
at::Tensor packed_matmul(const at::Tensor& a, const at::Tensor& w, bool transposed, at::Tensor c,
                         bool accumulate, bool parallel) {
  const char* who = "packed_matmul";
  TORCH_CHECK(packed_gemm_available(), who, ": the kernel ISA '", isa_name(),
              "' has no packed GEMM");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&a, &w, &c}) {
    TORCH_CHECK(t->dim() == 2 && t->scalar_type() == at::kFloat && t->device().is_cpu() &&
                    t->stride(1) == 1,
                who, ": a, w and c must be 2-d float32 CPU tensors with unit column stride");
  }
  TORCH_CHECK(w.is_contiguous(), who, ": w must be contiguous");
  const int64_t K = transposed ? w.size(1) : w.size(0), N = transposed ? w.size(0) : w.size(1);
  TORCH_CHECK(a.size(1) == K && c.size(0) == a.size(0) && c.size(1) == N, who,
              ": shapes do not agree: a ", a.sizes(), ", w ", w.sizes(), " (transposed=",
              transposed, "), c ", c.sizes());
  const PackedB pb = pack_b(w, transposed);
  gemm_packed(accumulate, a.size(0), a.data_ptr<float>(), a.stride(0), pb, c.data_ptr<float>(),
              c.stride(0), parallel);
  return c;
}

}  // namespace
}  // namespace rnn_ablations


// The element-wise scan (cpu/scan.cpp), for the cells that read no h_{t-1}.
static void register_scan(pybind11::module_& m) {
  using namespace rnn_ablations;
  m.def("scan_forward", &scan_forward, py::call_guard<py::gil_scoped_release>(),
        "element-wise scan of a gated memory whose gates read x_t only (forward), D = h0.size(0) "
        "directions (direction 1 runs each row backwards within its length); spec: "
        "Variant.kernel_spec, whose output rule and block offsets (G blocks of H columns per "
        "direction, the table's weight order) common/kernel_spec.h decode_scan_spec derives",
        py::arg("spec"), py::arg("highway"), py::arg("proj"), py::arg("h0"), py::arg("c0"),
        py::arg("batch_sizes"), py::arg("save"), py::arg("bias") = py::none());
  m.def("scan_backward", &scan_backward, py::call_guard<py::gil_scoped_release>(),
        "backward of scan_forward: (d_proj, d_c0, d_bias); d_bias (the sum of d_proj over steps "
        "and rows, D*G*H) is computed when bias_grad, else empty",
        py::arg("spec"), py::arg("highway"), py::arg("g_out"), py::arg("g_hn"), py::arg("g_cn"),
        py::arg("proj"), py::arg("c0"), py::arg("cs"), py::arg("batch_sizes"),
        py::arg("bias") = py::none(), py::arg("bias_grad") = false);
  // 2: bias inside the scan, batch-major layouts, (d_proj, d_c0, d_bias) from the backward;
  // 3: the variant as (spec, highway), decoded by kernel_spec.h
  m.attr("scan_abi") = 3;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace rnn_ablations;
  m.doc() = "rnn_ablations fused CPU recurrence (forward and hand-written backward)";
#ifdef RNN_ABLATIONS_TORCH_VERSION
  m.attr("torch_version") = RNN_ABLATIONS_TORCH_VERSION;  // the torch this module was built for
#endif
#ifdef RNN_ABLATIONS_SOURCES_DIGEST
  // rnn_ablations/kernels/build.py sources_digest() of the sources this module was compiled from
  m.attr("sources_digest") = RNN_ABLATIONS_SOURCES_DIGEST;
#endif
  register_scan(m);
  m.def("plain_forward", &plain_forward, py::call_guard<py::gil_scoped_release>(),
        "one layer, one direction: forward from the input projections; with in_place=True the "
        "recurrent blocks of proj become the returned gates (proj must be a scratch tensor)",
        py::arg("spec"), py::arg("highway"), py::arg("proj"), py::arg("w_hh"), py::arg("h0"),
        py::arg("c0"), py::arg("batch_sizes"), py::arg("rec_mask"), py::arg("keep_hin"),
        py::arg("in_place") = false);
  m.def("plain_backward", &plain_backward, py::call_guard<py::gil_scoped_release>(), "one layer, one direction: backward to the input projections");
  m.def("plain_directions_forward", &plain_directions_forward, py::call_guard<py::gil_scoped_release>(),
        "the directions of a bidirectional layer at once (one per thread): `plain_forward` on the d-th "
        "entry of each list; returns one result list per direction",
        py::arg("spec"), py::arg("highway"), py::arg("proj"), py::arg("w_hh"), py::arg("h0"),
        py::arg("c0"), py::arg("batch_sizes"), py::arg("rec_mask"), py::arg("keep_hin"),
        py::arg("in_place") = false);
  m.def("plain_directions_backward", &plain_directions_backward, py::call_guard<py::gil_scoped_release>(),
        "the directions of a bidirectional layer at once (one per thread): `plain_backward` on the "
        "d-th entry of each list; returns one result list per direction");
  m.def("pipelined_directions_forward", &pipelined_directions_forward, py::call_guard<py::gil_scoped_release>(),
        "the directions of a bidirectional layer at once (one per thread): `pipelined_forward` on "
        "the d-th entry of each list; returns one result list per direction");
  m.def("pipelined_directions_backward", &pipelined_directions_backward, py::call_guard<py::gil_scoped_release>(),
        "the directions of a bidirectional layer at once (one per thread): `pipelined_backward` on "
        "the d-th entry of each list; returns one result list per direction");
  m.def("pipelined_forward", &pipelined_forward, py::call_guard<py::gil_scoped_release>(),
        "one layer, one direction: pipelined input projection + recurrence");
  m.def("pipelined_backward", &pipelined_backward, py::call_guard<py::gil_scoped_release>(),
        "one layer, one direction: pipelined recurrence backward + input/weight gradients");
  m.def("packed_gemm", &packed_gemm_available,
        "whether the vector path in use has the packed step GEMM (float32; AVX2 + FMA or AVX-512)");
  m.def("packed_matmul", &packed_matmul, py::call_guard<py::gil_scoped_release>(),
        "tests only: c (+)= a @ B with the packed step GEMM of the path in use (B = w.T when "
        "transposed, else w); returns c", py::arg("a"), py::arg("w"), py::arg("transposed"),
        py::arg("c"), py::arg("accumulate"), py::arg("parallel"));
  m.def("library_gemm", &cpu::library_gemm_available,
        "whether MKL's packed GEMM (cblas_sgemm_pack / cblas_sgemm_compute) is linked in, for the "
        "step GEMM's library path");
  m.def("set_library_step_gemm", &cpu::set_library_step_gemm,
        "the step GEMM through MKL's packed GEMM from this many multiply-adds per step "
        "(B x N x K; float32), for training calls and for no-gradient forwards; -1 = never (the "
        "kernel's own packed GEMM)", py::arg("train_min_macs"), py::arg("inference_min_macs"));
  m.def("library_step_gemm", &cpu::library_step_gemm,
        "[training, inference]: the multiply-adds per step from which the step GEMM goes through "
        "MKL; -1 = never");
  m.def("unit_split_steps", &unit_split_steps,
        "tests only: how many forward steps of the plain kernel ran split by hidden units over "
        "the threads (w_hh packed per gate block) since the module was loaded");
  m.def("kernel_isa", &isa_name,
        "the vector path in use: 'avx512', 'avx2' or 'portable' (RNN_ABLATIONS_ISA, else the best the "
        "CPU supports)");
  m.def("set_kernel_isa", &set_isa, "switch the vector path: 'avx512', 'avx2', 'portable', 'auto' or the test path 'emulated_avx512'",
        py::arg("name"));
  m.def("supported_isas", &supported_isas,
        "the vector paths this CPU and build can run, best first");
  m.def("describe_kernel_spec", &describe_kernel_spec,
        "the step kernels' view of a kernel spec (Variant.kernel_spec): a dict with the output "
        "rule, memory, content form and the recurrent / input-only block roles they index; "
        "raises for a spec they refuse", py::arg("spec"), py::arg("highway"));
  m.def("describe_scan_spec", &describe_scan_spec,
        "the element-wise scan's view of a kernel spec (a cell whose gates read no h_{t-1}): "
        "the keys of describe_kernel_spec, the blocks all input-only in weight order; raises "
        "for a spec the scan refuses", py::arg("spec"), py::arg("highway"));
  m.def("weight_grad", &weight_grad, py::call_guard<py::gil_scoped_release>(), "g^T in for g (rows, M), in (rows, K): a weight gradient");
}
