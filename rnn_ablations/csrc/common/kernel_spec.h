// The step kernels' view of a variant: a few orthogonal fields derived from the variant table
// (rnn_ablations/variants.py, Variant.kernel_spec), packed into one int64 that every entry point
// receives instead of a variant id.  decode_kernel_spec is the one place that reads it: every
// code is checked, and a combination the kernels do not implement is refused with a message that
// says what to do.  Host code only (TORCH_CHECK); the struct itself is plain data and is passed by
// value to the CUDA kernels.
//
// Layout of the code (keep in step with Variant._derive_kernel_spec in rnn_ablations/variants.py;
// the test tests/test_variant_table.py compares both sides for every variant):
//   bits 0-1  output rule   0 h_t = c~_t (no memory: the S-RNN), 1 o_t*tanh(c_t), 2 tanh(c_t),
//                           3 c_t
//   bit  2    content source   0: a recurrent block (reads h_{t-1}: the LSTM's g), 1: an
//                           input-only block without bias (the ablations' c~_t = W_cx x_t)
//   bit  3    content activation tanh (else identity)
//   bit  4    memory: input and forget gates i, f and c_t = i*c~ + f*c_{t-1}
//   bit  5    the gates read h_{t-1} (false: no step kernel; the element-wise scan runs it)
//   bits 8-15 the tag 0xA5 (so that a stray small integer, e.g. an old variant id, is refused)
//   every other bit zero.
// Block order the kernels index (derived, not passed): recurrent blocks i, f, [content if
// recurrent], [o if the output rule is o*tanh(c)], [r with highway]; input-only blocks
// [content if input-only], [hw with highway].  Without memory: recurrent [content], [r].
#pragma once

#include <c10/util/Exception.h>  // TORCH_CHECK (light: the vector-path files include this)

#include <cstdint>
#include <string>
#include <vector>

namespace rnn_ablations {

enum OutputRule : int { kOutContent = 0, kOutGatedTanh = 1, kOutTanh = 2, kOutCell = 3 };

constexpr int64_t kSpecOutputMask = 0x3;
constexpr int64_t kSpecContentInputOnly = 1 << 2;
constexpr int64_t kSpecContentTanh = 1 << 3;
constexpr int64_t kSpecMemory = 1 << 4;
constexpr int64_t kSpecReadsHidden = 1 << 5;
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

inline const char* output_rule_name(int output) {
  switch (output) {
    case kOutContent: return "content";
    case kOutGatedTanh: return "o_tanh";
    case kOutTanh: return "tanh";
    default: return "identity";
  }
}

// Decode and check `code` (Variant.kernel_spec) for a cell with or without highway; refuses a
// code that is not a kernel spec, a combination the step kernels do not implement, and a cell
// that reads no h_{t-1}.
inline KernelSpec decode_kernel_spec(int64_t code, bool highway, const char* who) {
  TORCH_CHECK((code & kSpecTagMask) == kSpecTag && (code & ~kSpecKnownBits) == 0, who,
              ": unknown kernel spec ", code,
              " (pass Variant.kernel_spec from rnn_ablations/variants.py, not a variant id or "
              "Variant.code)");
  KernelSpec s;
  s.output = static_cast<int>(code & kSpecOutputMask);
  s.memory = (code & kSpecMemory) != 0;
  s.content_recurrent = (code & kSpecContentInputOnly) == 0;
  s.content_tanh = (code & kSpecContentTanh) != 0;
  s.highway = highway;
  TORCH_CHECK((code & kSpecReadsHidden) != 0, who, ": kernel spec ", code,
              " is a cell whose gates read no h_{t-1} (such as lstm_minus_srnn_minus_hidden); it "
              "has no step kernel and runs through scan_forward / scan_backward "
              "(rnn_ablations/scan.py)");
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
    s.out_gate_block = s.output == kOutGatedTanh ? gates : -1;
    s.R = gates + (s.output == kOutGatedTanh ? 1 : 0) + hw;
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

}  // namespace rnn_ablations
