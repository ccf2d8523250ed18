// Python bindings of the CPU extension rnn_ablations._C: the step kernels' entry points
// (cpu_entry_points.h), the element-wise scan (scan.cpp), the kernel-spec decoder the table test
// reads, and the choice of vector path (vec_kernels.h).

#include <torch/extension.h>

#include "common.h"
#include "cpu_entry_points.h"
#include "kernel_spec.h"
#include "vec_kernels.h"

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


}  // namespace
}  // namespace rnn_ablations

void register_scan(pybind11::module_& m);  // scan.cpp: the element-wise scan (no step GEMM)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace rnn_ablations;
  m.doc() = "rnn_ablations fused CPU recurrence (forward and hand-written backward)";
#ifdef RNN_ABLATIONS_TORCH_VERSION
  m.attr("torch_version") = RNN_ABLATIONS_TORCH_VERSION;  // the torch this module was built for
#endif
  register_scan(m);
  m.def("forward", &rnn_forward,
        "one layer, one direction: forward from the input projections; with in_place=True the "
        "recurrent blocks of proj become the returned gates (proj must be a scratch tensor)",
        py::arg("spec"), py::arg("highway"), py::arg("proj"), py::arg("w_hh"), py::arg("h0"),
        py::arg("c0"), py::arg("batch_sizes"), py::arg("rec_mask"), py::arg("keep_hin"),
        py::arg("in_place") = false);
  m.def("backward", &rnn_backward, "one layer, one direction: backward to the input projections");
  m.def("forward_directions", &rnn_forward_directions,
        "the directions of a bidirectional layer at once (one per thread): `forward` on the d-th "
        "entry of each list; returns one result list per direction",
        py::arg("spec"), py::arg("highway"), py::arg("proj"), py::arg("w_hh"), py::arg("h0"),
        py::arg("c0"), py::arg("batch_sizes"), py::arg("rec_mask"), py::arg("keep_hin"),
        py::arg("in_place") = false);
  m.def("backward_directions", &rnn_backward_directions,
        "the directions of a bidirectional layer at once (one per thread): `backward` on the "
        "d-th entry of each list; returns one result list per direction");
  m.def("fused_forward_directions", &fused_forward_directions,
        "the directions of a bidirectional layer at once (one per thread): `fused_forward` on "
        "the d-th entry of each list; returns one result list per direction");
  m.def("fused_backward_directions", &fused_backward_directions,
        "the directions of a bidirectional layer at once (one per thread): `fused_backward` on "
        "the d-th entry of each list; returns one result list per direction");
  m.def("fused_forward", &fused_forward,
        "one layer, one direction: pipelined input projection + recurrence");
  m.def("fused_backward", &fused_backward,
        "one layer, one direction: pipelined recurrence backward + input/weight gradients");
  m.def("packed_gemm", &packed_gemm_available,
        "whether the vector path in use has the packed step GEMM (float32; AVX2 + FMA)");
  m.def("kernel_isa", &isa_name,
        "the vector path in use: 'avx2' or 'portable' (RNN_ABLATIONS_ISA, else the best the "
        "CPU supports)");
  m.def("set_kernel_isa", &set_isa, "switch the vector path: 'avx2', 'portable' or 'auto'",
        py::arg("name"));
  m.def("supported_isas", &supported_isas,
        "the vector paths this CPU and build can run, best first");
  m.def("describe_kernel_spec", &describe_kernel_spec,
        "the step kernels' view of a kernel spec (Variant.kernel_spec): a dict with the output "
        "rule, memory, content form and the recurrent / input-only block roles they index; "
        "raises for a spec they refuse", py::arg("spec"), py::arg("highway"));
  m.def("weight_grad", &weight_grad, "g^T in for g (rows, M), in (rows, K): a weight gradient");
}
