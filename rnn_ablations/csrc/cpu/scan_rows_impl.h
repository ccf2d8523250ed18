// The element-wise scan's row loops (see scan.cpp for the scan and scan_rows.h for ScanArgs),
// written once on a value type of N lanes given by a lane policy L:
//
//   L::S                   the scalar type (float or double)
//   L::V                   N lanes of S as one value: +, -, * and construction from an S (the T
//                          of common/elementwise.h's templates)
//   L::Act                 sigmoid(V), tanh(V): the activations of common/elementwise.h
//   L::N                   lanes per value
//   L::Mask, L::mask(rem)  what selects the first `rem` lanes (a row's last H mod N units);
//            L::all()      every lane
//   L::ld<Tail>(p, m), L::st<Tail>(p, m, v)
//                          load / store N lanes at p, or only the lanes of m when Tail
//
// The includers: scan.cpp (the portable rows: GCC vector extensions of the build's baseline
// instruction set, float32 and float64) and scan_rows_avx2.cpp (8 float32 lanes under AVX2 +
// FMA).  No include guard on purpose: each includes this file inside its own anonymous
// namespace, after its lane policy and common/elementwise.h, so that each copy is compiled for
// its instruction set (the scheme of vec_impl.h).  The per-element maths is elementwise.h's
// (scan_forward_element, scan_backward_element); nothing here names an output rule.
//
// Explicit lanes, not a loop left to the compiler's vectoriser: the vectoriser's code for the
// composed templates depended on how the maths was spelled (the same formula written through
// cell_output ran twice as long per unit as written inline).

// Units [j, j + N) (the first `rem` of them, mask m, when Tail) of one (row, step).  p: the
// direction's G*H columns of proj's row, bias: its bias (or zeros).
template <typename L, int Out, bool HW, bool SAVE, bool Tail>
inline void forward_units(const ScanSpec& sp, int64_t H, const typename L::S* p,
                          const typename L::S* bias, typename L::S* c, typename L::S* h,
                          typename L::S* saved, int64_t j, typename L::Mask m) {
  using V = typename L::V;
  const auto pre = [&](int role) {
    const int64_t at = sp.block[role] * H + j;
    return V(L::template ld<Tail>(p + at, m)) + V(L::template ld<Tail>(bias + at, m));
  };
  V cn = L::template ld<Tail>(c + j, m);
  const V hv = scan_forward_element<Out, HW, typename L::Act>(pre, cn);
  L::template st<Tail>(c + j, m, cn);
  if (SAVE) L::template st<Tail>(saved + j, m, cn);
  L::template st<Tail>(h + j, m, hv);
}

template <typename L, int Out, bool HW, bool SAVE>
void forward_rows_t(const ScanArgs<typename L::S>& a, int64_t k0, int64_t k1) {
  using S = typename L::S;
  const int64_t H = a.H, GH = a.G * H, full = H / L::N * L::N;
  const ScanSpec sp = a.spec;
  const typename L::Mask m = L::mask(H - full), all = L::all();
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t d = k / a.nB, b = k % a.nB;
    const S* bias = a.bias ? a.bias + d * GH : a.zeros;
    S* c = a.c_n + k * H;  // the running c, L1-resident
    std::memcpy(c, a.c0 + k * H, sizeof(S) * H);
    const int64_t steps = a.len[b];
    const S* last = a.h0 + k * H;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t t = d == 0 ? s : steps - 1 - s;
      const S* p = a.proj + t * a.p_st + b * a.p_sb + d * GH;
      const int64_t o = t * a.o_st + b * a.o_sb + d * H;
      S* h = a.out + o;
      S* saved = SAVE ? a.cs + o : nullptr;
      for (int64_t j = 0; j < full; j += L::N)
        forward_units<L, Out, HW, SAVE, false>(sp, H, p, bias, c, h, saved, j, all);
      if (full < H) forward_units<L, Out, HW, SAVE, true>(sp, H, p, bias, c, h, saved, full, m);
      last = h;
    }
    std::memcpy(a.h_n + k * H, last, sizeof(S) * H);
  }
}

// dq: the direction's G*H columns of d_proj's row; db: its bias-gradient sums (when DB).
template <typename L, int Out, bool HW, bool DB, bool Tail>
inline void backward_units(const ScanSpec& sp, int64_t H, const typename L::S* p,
                           const typename L::S* bias, typename L::S* dq,
                           const typename L::S* go, const typename L::S* gh,
                           const typename L::S* ct, const typename L::S* cp, typename L::S* dc,
                           typename L::S* db, int64_t j, typename L::Mask m) {
  using V = typename L::V;
  const auto pre = [&](int role) {
    const int64_t at = sp.block[role] * H + j;
    return V(L::template ld<Tail>(p + at, m)) + V(L::template ld<Tail>(bias + at, m));
  };
  const auto put = [&](int role, V v) {
    const int64_t at = sp.block[role] * H + j;
    L::template st<Tail>(dq + at, m, v);
    if (DB) L::template st<Tail>(db + at, m, V(L::template ld<Tail>(db + at, m)) + v);
  };
  const V dh = V(L::template ld<Tail>(go + j, m)) + V(L::template ld<Tail>(gh + j, m));
  const V dc_prev = scan_backward_element<Out, HW, typename L::Act>(
      pre, put, dh, V(L::template ld<Tail>(ct + j, m)), V(L::template ld<Tail>(cp + j, m)),
      V(L::template ld<Tail>(dc + j, m)));
  L::template st<Tail>(dc + j, m, dc_prev);
}

template <typename L, int Out, bool HW, bool DB>
void backward_rows_t(const ScanArgs<typename L::S>& a, int64_t k0, int64_t k1) {
  using S = typename L::S;
  const int64_t H = a.H, GH = a.G * H, full = H / L::N * L::N;
  const ScanSpec sp = a.spec;
  const typename L::Mask m = L::mask(H - full), all = L::all();
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t d = k / a.nB, b = k % a.nB;
    const S* bias = a.bias ? a.bias + d * GH : a.zeros;
    S* dc = a.dc + k * H;  // dL/dc, carried backwards; ends as dL/dc_0
    S* db = DB ? a.dbias_rows + k * GH : nullptr;  // per-(direction, row) bias-gradient sums
    const int64_t steps = a.len[b];
    for (int64_t s = steps - 1; s >= 0; --s) {
      const int64_t t = d == 0 ? s : steps - 1 - s;
      const int64_t po = t * a.p_st + b * a.p_sb + d * GH;
      const S* p = a.proj + po;
      S* dq = a.dproj + po;
      const int64_t o = t * a.o_st + b * a.o_sb + d * H;
      const S* go = a.g_out + t * a.g_st + b * a.g_sb + d * H;
      const S* gh = s == steps - 1 ? a.g_hn + k * H : a.zeros;
      const S* ct = a.cs_in + o;
      const int64_t tp = d == 0 ? s - 1 : steps - s;  // the previous step's position
      const S* cp = s > 0 ? a.cs_in + tp * a.o_st + b * a.o_sb + d * H : a.c0 + k * H;
      for (int64_t j = 0; j < full; j += L::N)
        backward_units<L, Out, HW, DB, false>(sp, H, p, bias, dq, go, gh, ct, cp, dc, db, j,
                                              all);
      if (full < H)
        backward_units<L, Out, HW, DB, true>(sp, H, p, bias, dq, go, gh, ct, cp, dc, db, full,
                                             m);
    }
  }
}

// Tasks k in [k0, k1) (direction k / B, row k % B) for the spec's output rule (kernel_spec.h
// with_output_rule) and highway; the memories are saved when a.cs is given, the bias gradient
// summed when a.dbias_rows is.
template <typename L>
void run_forward_rows(const ScanArgs<typename L::S>& a, int64_t k0, int64_t k1) {
  with_output_rule(a.spec.output, [&](auto out) {
    constexpr int OUT = decltype(out)::value;
    const bool save = a.cs != nullptr;
    if (a.spec.highway) {
      if (save) forward_rows_t<L, OUT, true, true>(a, k0, k1);
      else forward_rows_t<L, OUT, true, false>(a, k0, k1);
    } else {
      if (save) forward_rows_t<L, OUT, false, true>(a, k0, k1);
      else forward_rows_t<L, OUT, false, false>(a, k0, k1);
    }
  });
}

template <typename L>
void run_backward_rows(const ScanArgs<typename L::S>& a, int64_t k0, int64_t k1) {
  with_output_rule(a.spec.output, [&](auto out) {
    constexpr int OUT = decltype(out)::value;
    const bool db = a.dbias_rows != nullptr;
    if (a.spec.highway) {
      if (db) backward_rows_t<L, OUT, true, true>(a, k0, k1);
      else backward_rows_t<L, OUT, true, false>(a, k0, k1);
    } else {
      if (db) backward_rows_t<L, OUT, false, true>(a, k0, k1);
      else backward_rows_t<L, OUT, false, false>(a, k0, k1);
    }
  });
}
