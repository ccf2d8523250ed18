// The step kernels' view of a variant: a few orthogonal fields derived from the variant table
// (rnn_ablations/variants.py, Variant.kernel_spec), packed into one int64 that every entry point
// receives instead of a variant id.  decode_kernel_spec is the one place that reads it: every
// code is checked, and a combination the kernels do not implement is refused with a message that
// says what to do.  Host code only (TORCH_CHECK); the struct itself is plain data and is passed by
// value to the CUDA kernels.
//
// Layout of the code (keep in step with Variant._derive_kernel_spec in rnn_ablations/variants.py;
// the test tests/test_variant_table.py compares both sides for every variant):
//   bits 0-2  output rule   0 h_t = c~_t (no memory: the S-RNN), 1 o_t*tanh(c_t), 2 tanh(c_t),
//                           3 c_t; 4-7 free for new rules (a new rule is a new value here)
//   bit  3    content source   0: a recurrent block (reads h_{t-1}: the LSTM's g), 1: an
//                           input-only block without bias (the ablations' c~_t = W_cx x_t)
//   bit  4    content activation tanh (else identity)
//   bit  5    memory: input and forget gates i, f and c_t = i*c~ + f*c_{t-1}
//   bit  6    the gates read h_{t-1} (false: no step kernel; the element-wise scan runs it,
//             decode_scan_spec)
//   bits 8-15 the tag 0xA5 (so that a stray small integer, e.g. an old variant id, is refused)
//   every other bit zero.
// Block order the kernels index (derived, not passed): recurrent blocks i, f, [content if
// recurrent], [o if the output rule is o*tanh(c)], [r with highway]; input-only blocks
// [content if input-only], [hw with highway].  Without memory: recurrent [content], [r].
// A cell whose gates read no h_{t-1} (decode_scan_spec): input-only blocks only, those with a
// bias first: i, f, [o if the output rule is o*tanh(c)], [r with highway], then content, [hw].
//
// The output rules are numbered here only (OutputRule, output_rule_name), with what each reads
// (output_has_gate, output_reads_tanh); their maths is common/elementwise.h's (cell_output,
// cell_grad, out_gate_grad), and with_output_rule below is the one switch that turns a rule into
// a compile-time constant for the kernels' loops.
//
// Two parts: the plain data and the constants (enums, KernelSpec, ScanSpec, output_has_gate,
// output_reads_tanh) are header-free and compile under NVRTC (__CUDACC_RTC__: the CUDA device
// sources in cuda/*.cuh, compiled at run time, include this file after cuda/device_types.cuh);
// the decoders and their checks (TORCH_CHECK, std::string, std::vector) are host code, compiled
// by the C++ compiler only.  The CUDA launcher (rnn_ablations/kernels/cuda/structs.py) fills the same
// structs from Python; tests/kernels/test_nvrtc_kernels.py compares its decoder with this one and its
// struct layouts with these.
#pragma once

#if !defined(__CUDACC_RTC__)
#include <c10/util/Exception.h>  // TORCH_CHECK (light: the vector-path files include this)

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>
#endif

namespace rnn_ablations {

enum OutputRule : int { kOutContent = 0, kOutGatedTanh = 1, kOutTanh = 2, kOutCell = 3 };

#if defined(__CUDACC__)
#define RNN_ABLATIONS_SPEC_HD __host__ __device__
#else
#define RNN_ABLATIONS_SPEC_HD
#endif

// What a memory cell's output rule reads besides c_t: an output gate o (a block of its own), and
// tanh(c_t).  The decoders place the o block by the first; the kernels (common/elementwise.h and
// its callers) compute only what the rule reads.  Host and device.
RNN_ABLATIONS_SPEC_HD constexpr bool output_has_gate(int out) { return out == kOutGatedTanh; }
RNN_ABLATIONS_SPEC_HD constexpr bool output_reads_tanh(int out) {
  return out == kOutGatedTanh || out == kOutTanh;
}

constexpr int64_t kSpecOutputMask = 0x7;
constexpr int64_t kSpecContentInputOnly = 1 << 3;
constexpr int64_t kSpecContentTanh = 1 << 4;
constexpr int64_t kSpecMemory = 1 << 5;
constexpr int64_t kSpecReadsHidden = 1 << 6;
constexpr int64_t kSpecTag = int64_t{0xA5} << 8;
constexpr int64_t kSpecTagMask = int64_t{0xFF} << 8;
constexpr int64_t kSpecKnownBits = kSpecOutputMask | kSpecContentInputOnly | kSpecContentTanh |
                                   kSpecMemory | kSpecReadsHidden | kSpecTagMask;

struct KernelSpec {
  int output;              // OutputRule
  bool memory;             // i, f gates and the cell c_t (false: h_t = c~_t, and c_t = h_t)
  bool content_recurrent;  // c~ is a recurrent block (else an input-only block)
  bool content_tanh;       // c~ = tanh(pre-activation) (else the pre-activation itself)
  bool highway;            // AugmentedLstm's highway: gate r (last recurrent block) and
                           // projection hw (last input-only block)
  int64_t R, X;            // recurrent / input-only blocks of H rows
  int64_t content_block;   // index of c~ among the recurrent or the input-only blocks
  int64_t out_gate_block;  // index of o among the recurrent blocks, -1 without one
  // i is recurrent block 0 and f block 1 when there is a memory.
};

#if !defined(__CUDACC_RTC__)  // host code: the decoders and their checks

inline const char* output_rule_name(int output) {
  switch (output) {
    case kOutContent: return "content";
    case kOutGatedTanh: return "o_tanh";
    case kOutTanh: return "tanh";
    case kOutCell: return "identity";
    default: return nullptr;  // not a rule: check_spec_tag refuses the code
  }
}

// f(std::integral_constant<int, rule>()) for the output rule of a memory cell (o_tanh, tanh,
// identity): the kernels' loops get the rule as a template argument, so that they have no
// branch on it.  Host code (it picks the template a loop or a launch runs).
template <typename F>
inline void with_output_rule(int output, F&& f) {
  switch (output) {
    case kOutGatedTanh: f(std::integral_constant<int, kOutGatedTanh>()); break;
    case kOutTanh: f(std::integral_constant<int, kOutTanh>()); break;
    case kOutCell: f(std::integral_constant<int, kOutCell>()); break;
    default: TORCH_CHECK(false, "with_output_rule: output rule ", output, " has no case");
  }
}

inline void check_spec_tag(int64_t code, const char* who) {
  TORCH_CHECK((code & kSpecTagMask) == kSpecTag && (code & ~kSpecKnownBits) == 0, who,
              ": unknown kernel spec ", code,
              " (pass Variant.kernel_spec from rnn_ablations/variants.py, not a variant id or "
              "Variant.code)");
  TORCH_CHECK(output_rule_name(static_cast<int>(code & kSpecOutputMask)) != nullptr, who,
              ": kernel spec ", code, ": output rule ", code & kSpecOutputMask,
              " is not one of kernel_spec.h's (OutputRule); a new rule is numbered there "
              "(CONTRIBUTING.md, 'Adding an element-wise rule')");
}

// Decode and check `code` (Variant.kernel_spec) for a cell with or without highway; refuses a
// code that is not a kernel spec, a combination the step kernels do not implement, and a cell
// that reads no h_{t-1}.
inline KernelSpec decode_kernel_spec(int64_t code, bool highway, const char* who) {
  check_spec_tag(code, who);
  KernelSpec s;
  s.output = static_cast<int>(code & kSpecOutputMask);
  s.memory = (code & kSpecMemory) != 0;
  s.content_recurrent = (code & kSpecContentInputOnly) == 0;
  s.content_tanh = (code & kSpecContentTanh) != 0;
  s.highway = highway;
  TORCH_CHECK((code & kSpecReadsHidden) != 0, who, ": kernel spec ", code,
              " is a cell whose gates read no h_{t-1} (such as lstm_minus_srnn_minus_hidden); it "
              "has no step kernel and runs through scan_forward / scan_backward "
              "(rnn_ablations/kernels/scan.py)");
  TORCH_CHECK(s.memory == (s.output != kOutContent), who, ": kernel spec ", code, ": output rule '",
              output_rule_name(s.output), "' ",
              s.memory ? "needs a cell without memory (h_t = c~_t is the S-RNN's rule); give the "
                         "variant an output rule o_tanh, tanh or identity"
                       : "needs a memory cell; a cell without memory outputs its content (output "
                         "rule 'srnn')");
  TORCH_CHECK(s.memory || s.content_recurrent, who, ": kernel spec ", code,
              ": a cell without memory whose content reads x_t only has no recurrence at all; "
              "it has no step kernel (run it on the generic path)");
  TORCH_CHECK(s.content_recurrent || !s.content_tanh, who, ": kernel spec ", code,
              ": an input-only content with tanh is not implemented by the step kernels (they "
              "read the input-only blocks as they are); add that element-wise rule to each "
              "kernel family (see CONTRIBUTING.md) or use content_activation='identity'");
  const int64_t hw = highway ? 1 : 0;
  if (s.memory) {
    s.content_block = s.content_recurrent ? 2 : 0;
    const int64_t gates = 2 + (s.content_recurrent ? 1 : 0);
    s.out_gate_block = output_has_gate(s.output) ? gates : -1;
    s.R = gates + (output_has_gate(s.output) ? 1 : 0) + hw;
  } else {
    s.content_block = 0;
    s.out_gate_block = -1;
    s.R = 1 + hw;
  }
  s.X = (s.content_recurrent ? 0 : 1) + hw;
  return s;
}

// decode_kernel_spec, then check the tensors' block layout: R recurrent blocks (rows of w_hh) and
// X input-only blocks of H rows.  A layout that does not match would leave gradient rows
// unwritten or index past a row.
inline KernelSpec check_kernel_spec(int64_t code, bool highway, int64_t R, int64_t X,
                                    const char* who) {
  const KernelSpec s = decode_kernel_spec(code, highway, who);
  TORCH_CHECK(R == s.R && X == s.X, who, ": kernel spec ", code, highway ? " with highway" : "",
              " needs ", s.R, " recurrent and ", s.X, " input-only blocks of H rows, got ", R,
              " and ", X);
  return s;
}

// The block roles the kernels read, in weight order: {recurrent, input-only} names ("i", "f",
// "content", "o", "r"; "content", "hw"), for the table test (Variant.kernel_spec must agree).
inline std::vector<std::vector<std::string>> kernel_spec_blocks(const KernelSpec& s) {
  std::vector<std::string> rec, inp;
  if (s.memory) { rec.push_back("i"); rec.push_back("f"); }
  if (s.content_recurrent) rec.push_back("content"); else inp.push_back("content");
  if (s.out_gate_block >= 0) rec.push_back("o");
  if (s.highway) { rec.push_back("r"); inp.push_back("hw"); }
  return {rec, inp};
}

#endif  // !__CUDACC_RTC__

// The element-wise scan's view of a cell whose gates read no h_{t-1} (Variant.reads_hidden
// False, e.g. lstm_minus_srnn_minus_hidden): every block reads x_t only, so a layer is one input
// projection proj (G blocks of H columns per direction) and an element-wise recurrence in c.
// Plain data: passed by value to the CUDA scan kernels.
enum ScanBlock : int {
  kScanI = 0,    // input gate (sigmoid)
  kScanF,        // forget gate (sigmoid)
  kScanO,        // output gate (sigmoid), with the output rule o*tanh(c) only
  kScanR,        // highway gate (sigmoid), with highway only
  kScanContent,  // c~_t, used as it is
  kScanHw,       // highway projection, with highway only
  kScanBlocks
};

struct ScanSpec {
  int output;    // OutputRule of a memory cell: kOutGatedTanh, kOutTanh or kOutCell
  bool highway;  // gate r and projection hw: h_t <- r*h_t + (1 - r)*hw
  int64_t G;     // blocks per direction in proj
  // block[role] (ScanBlock): the block's offset in units of H within a direction's G*H columns,
  // -1 when the cell has no such block; the bias of every block is added inside the scan
  int64_t block[kScanBlocks];
};

#if !defined(__CUDACC_RTC__)  // host code

// Decode and check `code` (Variant.kernel_spec) for the element-wise scan, with or without
// highway.  The block offsets follow from the spec in the table's weight order
// (Variant.blocks(highway): the biased input-only blocks i, f, [o], [r], then content, [hw]).
// Refuses a cell the scan does not run, saying what runs it instead.
inline ScanSpec decode_scan_spec(int64_t code, bool highway, const char* who) {
  check_spec_tag(code, who);
  TORCH_CHECK((code & kSpecReadsHidden) == 0, who, ": kernel spec ", code,
              " is a cell whose gates read h_{t-1}; it runs on the step kernels (forward / "
              "backward, rnn_ablations/dispatch.py), not on the element-wise scan");
  const int output = static_cast<int>(code & kSpecOutputMask);
  TORCH_CHECK((code & kSpecMemory) != 0 && output != kOutContent, who, ": kernel spec ", code,
              ": a cell without memory whose content reads x_t only has no recurrence; the "
              "element-wise scan runs a memory c_t = i*c~ + f*c_{t-1} (run this cell on the "
              "generic path)");
  TORCH_CHECK((code & kSpecContentInputOnly) != 0, who, ": kernel spec ", code,
              ": a recurrent content reads h_{t-1}; give the spec the bit 'reads h_{t-1}' "
              "(Variant.kernel_spec sets it) and run the step kernels");
  TORCH_CHECK((code & kSpecContentTanh) == 0, who, ": kernel spec ", code,
              ": a tanh of the content is not implemented by the element-wise scan (it reads "
              "c~_t = W_cx x_t as it is); add that element-wise rule (CONTRIBUTING.md, 'Adding an "
              "element-wise rule') or use content_activation='identity' (rnn_ablations.kernels.scan."
              "scan_applies is False for such a cell: it runs on the generic path)");
  ScanSpec s;
  s.output = output;
  s.highway = highway;
  int64_t k = 0;
  s.block[kScanI] = k++;
  s.block[kScanF] = k++;
  s.block[kScanO] = output_has_gate(output) ? k++ : -1;
  s.block[kScanR] = highway ? k++ : -1;
  s.block[kScanContent] = k++;
  s.block[kScanHw] = highway ? k++ : -1;
  s.G = k;
  return s;
}

// decode_scan_spec, then check that proj has the spec's G blocks of H columns per direction
// (D directions side by side), as check_kernel_spec does for the step kernels.
inline ScanSpec check_scan_spec(int64_t code, bool highway, int64_t G, int64_t H, int64_t D,
                                const char* who) {
  const ScanSpec s = decode_scan_spec(code, highway, who);
  TORCH_CHECK(G == s.G, who, ": kernel spec ", code, highway ? " with highway" : "", " reads ",
              s.G, " blocks of H = ", H, " columns per direction (", s.G * H * D,
              " columns for D = ", D, "), proj has ", G * H * D);
  return s;
}

// The block roles the scan reads, in weight order (all input-only: "i", "f", "o", "r",
// "content", "hw"), for the table test (Variant.blocks(highway) must agree).
inline std::vector<std::string> scan_spec_blocks(const ScanSpec& s) {
  static const char* const names[kScanBlocks] = {"i", "f", "o", "r", "content", "hw"};
  std::vector<std::string> order(static_cast<size_t>(s.G));
  for (int role = 0; role < kScanBlocks; ++role)
    if (s.block[role] >= 0) order[static_cast<size_t>(s.block[role])] = names[role];
  return order;
}

#endif  // !__CUDACC_RTC__

}  // namespace rnn_ablations
